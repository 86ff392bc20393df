"""Run a table's train → embed → evaluate chains concurrently on one machine, without Snakemake.

A lent GPU machine has PyTorch but not Snakemake (nor a registry to install it from); this runs the
same three CLI commands that the workflow's rules run, for every (method, seed) of a table, with
``--jobs`` chains at once (they share the GPU; each claims nothing else), then ``dmlbench report``.
Outputs land where the rules put them (``results/runs/<dataset>/<method>/seed<S>/``), so the table,
its captions and its significance marks are the workflow's own. Each chain's output goes to
``results/logs/gpu/<dataset>.<method>.seed<S>.log``; a chain that fails is named at the end and the
others go on. A chain whose ``metrics.json`` exists is skipped (rerun after a cut-off call).

    python benchmarks/run_table_runs.py --config params.yaml --config workflow/overlays/cub_lite.yaml \\
        --table table1 --seeds 0 1 2 --jobs 12
"""

from __future__ import annotations

import argparse
import subprocess
import sys
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

from dmlbench.config import load_config, section


def chain_commands(configs: list[str], dataset: str, method: str, seed: int, threads: int) -> list[list[str]]:
    """The train, embed and evaluate commands of one run, as the workflow's rules give them."""
    config_args = [arg for path in configs for arg in ("--config", path)]
    run_dir = Path("results/runs") / dataset / method / f"seed{seed}"
    cli = [sys.executable, "-m", "dmlbench"]
    common = [*config_args, "--threads", str(threads)]
    return [
        [*cli, "train", "--dataset", dataset, "--method", method, "--seed", str(seed), "--no-progress", *common],
        [*cli, "embed", str(run_dir), "--out", str(run_dir / "embeddings.npz"), "--threads", str(threads)],
        [*cli, "evaluate", str(run_dir / "embeddings.npz"), "--out", str(run_dir / "metrics.json"),
         "--per-query", str(run_dir / "per_query.npz"), "--dataset", dataset, *common],
    ]


def run_chain(commands: list[list[str]], log: Path) -> tuple[bool, float]:
    """Run the commands in order, appending their output to ``log``; stop at the first failure."""
    started = time.perf_counter()
    log.parent.mkdir(parents=True, exist_ok=True)
    with log.open("a") as out:
        for command in commands:
            out.write(f"$ {' '.join(command)}\n")
            out.flush()
            if subprocess.run(command, stdout=out, stderr=subprocess.STDOUT, check=False).returncode != 0:
                return False, time.perf_counter() - started
    return True, time.perf_counter() - started


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--config", action="append", help="params file(s); default params.yaml")
    parser.add_argument("--table", default="table1")
    parser.add_argument("--methods", nargs="+", default=None, help="default: the table's methods")
    parser.add_argument("--seeds", nargs="+", type=int, default=None, help="default: the table's seeds")
    parser.add_argument("--jobs", type=int, default=8, help="chains at once")
    parser.add_argument("--threads", type=int, default=1, help="CPU threads per command")
    args = parser.parse_args()
    configs = args.config or ["params.yaml"]
    config = load_config(configs)
    spec = config["tables"][args.table]
    methods = args.methods or spec["methods"]
    for method in methods:
        node = section(config, "methods", method)  # its own entry: checkpoint_of is never inherited
        if "ensemble_members" in node or "checkpoint_of" in node:
            raise SystemExit(f"{method} is built from other runs (an ensemble or a re-embedding): use Snakemake")
    chains = [(dataset, method, seed) for seed in (args.seeds or spec.get("seeds", [0]))
              for dataset in spec["datasets"] for method in methods
              if not (Path("results/runs") / dataset / method / f"seed{seed}" / "metrics.json").is_file()]
    print(f"{len(chains)} chains, {args.jobs} at once", flush=True)
    started = time.perf_counter()
    with ThreadPoolExecutor(args.jobs) as pool:
        futures = {chain: pool.submit(run_chain, chain_commands(configs, *chain, args.threads),
                                      Path("results/logs/gpu") / f"{chain[0]}.{chain[1]}.seed{chain[2]}.log")
                   for chain in chains}
        failed = []
        for chain, future in futures.items():
            ok, seconds = future.result()
            print(f"{'done' if ok else 'FAILED'} {'/'.join(map(str, chain))} in {seconds:.0f} s", flush=True)
            if not ok:
                failed.append(chain)
    print(f"all chains in {time.perf_counter() - started:.0f} s; failed: {failed or 'none'}", flush=True)
    config_args = [arg for path in configs for arg in ("--config", path)]
    subprocess.run([sys.executable, "-m", "dmlbench", "report", args.table, *config_args], check=False)


if __name__ == "__main__":
    main()
