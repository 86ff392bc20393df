"""Run a table's train → embed → evaluate chains concurrently on one machine, without Snakemake.

A lent GPU machine has PyTorch but not Snakemake (nor a registry to install it from); this runs the
same CLI commands that the workflow's rules run, for every (method, seed) of a table (and, with
``--claims``, of the claims table), with ``--jobs`` chains at once (they share the GPU; each claims
nothing else), then ``dmlbench report`` (and ``dmlbench claims``). A method that re-embeds another's
checkpoints (``checkpoint_of``) runs embed → evaluate after every trained chain has finished;
ensembles are left to Snakemake.
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

from dmlbench.layout import EMBEDDINGS_FILE, METRICS_FILE, PER_QUERY_FILE, RUNS_DIR, run_dir
from dmlbench.config import section
from dmlbench.params import load_config
from dmlbench.report.claims import claim_runs

CLI = [sys.executable, "-m", "dmlbench"]


def chain_commands(
    configs: list[str], dataset: str, method: str, seed: int, threads: int, checkpoint_of: str | None = None
) -> list[list[str]]:
    """The train, embed and evaluate commands of one run, as the workflow's rules give them; for a
    method that re-embeds ``checkpoint_of``'s checkpoint, its embed (``--method``) and evaluate."""
    config_args = [arg for path in configs for arg in ("--config", path)]
    out = run_dir(dataset, method, seed)
    common = [*config_args, "--threads", str(threads)]
    evaluate = [
        *CLI,
        "evaluate",
        str(out / EMBEDDINGS_FILE),
        "--out",
        str(out / METRICS_FILE),
        "--per-query",
        str(out / PER_QUERY_FILE),
        "--dataset",
        dataset,
        *common,
    ]
    if checkpoint_of is not None:
        source = run_dir(dataset, checkpoint_of, seed)
        return [
            [*CLI, "embed", str(source), "--method", method, "--out", str(out / EMBEDDINGS_FILE), *common],
            evaluate,
        ]
    return [
        [*CLI, "train", "--dataset", dataset, "--method", method, "--seed", str(seed), "--no-progress", *common],
        [*CLI, "embed", str(out), "--out", str(out / EMBEDDINGS_FILE), "--threads", str(threads)],
        evaluate,
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


def run_chains(
    chains: list[tuple[str, str, int]], configs: list[str], config: dict, jobs: int, threads: int
) -> list[tuple[str, str, int]]:
    """Run the chains, ``jobs`` at once; return the ones that failed."""
    failed = []
    with ThreadPoolExecutor(jobs) as pool:
        futures = {}
        for dataset, method, seed in chains:
            commands = chain_commands(
                configs, dataset, method, seed, threads, section(config, "methods", method).get("checkpoint_of")
            )
            log = Path("results/logs/gpu") / f"{dataset}.{method}.seed{seed}.log"
            futures[(dataset, method, seed)] = pool.submit(run_chain, commands, log)
        for chain, future in futures.items():
            ok, seconds = future.result()
            print(f"{'done' if ok else 'FAILED'} {'/'.join(map(str, chain))} in {seconds:.0f} s", flush=True)
            if not ok:
                failed.append(chain)
    return failed


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--config", action="append", help="params file(s); default params.yaml")
    parser.add_argument("--table", default="table1")
    parser.add_argument("--methods", nargs="+", default=None, help="default: the table's methods")
    parser.add_argument("--seeds", nargs="+", type=int, default=None, help="default: the table's seeds")
    parser.add_argument("--claims", action="store_true", help="also the runs of the claims table")
    parser.add_argument("--jobs", type=int, default=8, help="chains at once")
    parser.add_argument("--threads", type=int, default=1, help="CPU threads per command")
    args = parser.parse_args()
    configs = args.config or ["params.yaml"]
    config = load_config(configs)
    spec = config["tables"][args.table]
    wanted = [
        (dataset, method, seed)
        for seed in (args.seeds or spec.get("seeds", [0]))
        for dataset in spec["datasets"]
        for method in (args.methods or spec["methods"])
    ]
    if args.claims:
        wanted += [
            (run.dataset, run.method, run.seed)
            for run in sorted(claim_runs(config, RUNS_DIR), key=lambda run: (run.seed, run.method))
        ]
    wanted = [
        chain
        for chain in dict.fromkeys(wanted)
        if "ensemble_members" not in section(config, "methods", chain[1])
        and not (run_dir(*chain) / METRICS_FILE).is_file()
    ]
    trained = [chain for chain in wanted if "checkpoint_of" not in section(config, "methods", chain[1])]
    reembedded = [chain for chain in wanted if chain not in trained]
    print(f"{len(trained)} trained and {len(reembedded)} re-embedded chains, {args.jobs} at once", flush=True)
    started = time.perf_counter()
    failed = run_chains(trained, configs, config, args.jobs, args.threads)
    failed += run_chains(reembedded, configs, config, args.jobs, args.threads)
    print(f"all chains in {time.perf_counter() - started:.0f} s; failed: {failed or 'none'}", flush=True)
    config_args = [arg for path in configs for arg in ("--config", path)]
    subprocess.run([*CLI, "report", args.table, *config_args], check=False)
    if args.claims:
        subprocess.run([*CLI, "claims", *config_args], check=False)


if __name__ == "__main__":
    main()
