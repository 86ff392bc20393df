"""Benchmark: the CPU seconds each ``dmlbench`` command spends before it does any work.

The README's main job (``snakemake --cores 2 results/tables/table1.tex``) runs one short ``dmlbench``
process per step of every run: prepare, pretrain, then train, embed and evaluate for each of table1's
42 runs, then report — about 130 processes, so a second of start-up (imports, reading and checking
the parameters) costs the job two minutes of CPU. This prints, per command the main job runs, the
CPU time (user + system, ``resource.getrusage`` of a fresh child process) of its start-up: the
command runs for real with inputs that do not exist, so it imports what it imports, loads and
validates the parameters, and stops at its first input file with exit status 2. It also prints the
heavy libraries each command imported, and the job's start-up CPU (processes × seconds) under
the parameters' plan.

Numbers, not a test: run it before and after a change to see a regression.

    python benchmarks/bench_startup.py                 # params.yaml, 3 repeats (the minimum is shown)
    python benchmarks/bench_startup.py --repeat 5 --config params.yaml --config workflow/overlays/cub_lite.yaml
"""

from __future__ import annotations

import argparse
import json
import statistics
import subprocess
import sys
import tempfile
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
#: the libraries that dominate start-up when imported; each command lists those it imported.
HEAVY = (
    "torch",
    "torchvision",
    "torch._dynamo",
    "pytorch_metric_learning",
    "faiss",
    "sklearn",
    "scipy",
    "pandas",
    "matplotlib",
    "jsonschema",
)

#: run in a fresh interpreter: one command through the CLI's ``main``, then its CPU time and modules as JSON.
CHILD = """
import json, resource, sys
{before}
status = {call}
usage = resource.getrusage(resource.RUSAGE_SELF)
heavy = [name for name in {heavy!r} if name in sys.modules]
print(json.dumps({{"cpu": usage.ru_utime + usage.ru_stime, "status": status, "heavy": heavy}}))
"""


def commands(work: Path, configs: list[str], dataset: str, method: str, table: str) -> dict[str, list[str]]:
    """Command name → argv: each starts up fully and stops at a missing input (exit status 2); ``list``
    (not in the job: the issue's example of a command that should start at once) runs to its end."""
    config = [arg for path in configs for arg in ("--config", path)]
    missing = work / "missing"
    occupied = work / "occupied"  # a folder prepare did not make: it refuses to replace it
    return {
        "prepare": ["prepare", dataset, "--out", str(occupied), *config],
        "pretrain": [
            "pretrain",
            "--dataset",
            dataset,
            "--prepared",
            str(missing),
            "--no-progress",
            "--threads",
            "1",
            *config,
        ],
        "train": [
            "train",
            "--dataset",
            dataset,
            "--method",
            method,
            "--seed",
            "0",
            "--manifest",
            str(missing / "manifest.csv"),
            "--out",
            str(work / "run"),
            "--threads",
            "1",
            "--no-progress",
            *config,
        ],
        "embed": [
            "embed",
            str(missing),
            "--manifest",
            str(missing / "manifest.csv"),
            "--out",
            str(work / "embeddings.npz"),
            "--threads",
            "1",
        ],
        "evaluate": [
            "evaluate",
            str(missing / "embeddings.npz"),
            "--out",
            str(work / "metrics.json"),
            "--per-query",
            str(work / "per_query.npz"),
            "--dataset",
            dataset,
            *config,
            "--threads",
            "1",
        ],
        "report": ["report", table, "--tables-dir", str(work / "tables"), "--plots-dir", str(work / "plots"), *config],
        "list methods": ["list", "methods", *config],
    }


def run_child(code: str, cwd: Path) -> dict:
    done = subprocess.run([sys.executable, "-c", code], cwd=cwd, capture_output=True, text=True, check=False)
    lines = done.stdout.strip().splitlines()
    if done.returncode != 0 or not lines:
        raise SystemExit(f"the child failed (status {done.returncode}):\n{done.stderr[-2000:]}")
    result = json.loads(lines[-1])
    result["stderr"] = done.stderr.strip().splitlines()[-1:] if done.stderr.strip() else []
    return result


def measure(code: str, cwd: Path, repeat: int) -> tuple[list[float], dict]:
    results = [run_child(code, cwd) for _ in range(repeat)]
    return [r["cpu"] for r in results], results[-1]


def planned_processes(configs: list[str], table: str) -> dict[str, int]:
    """How many processes of each command ``snakemake results/tables/<table>.tex`` runs from scratch:
    one prepare per dataset, one pretrain per pretraining stage of those datasets, train, embed and
    evaluate per run (ensembles and re-embedded methods: no train; ensembles: no embed), one report."""
    from dmlbench.config import checkpoint_source, ensemble_spec
    from dmlbench.params import load_config

    config = load_config(configs)
    spec = config["tables"][table]
    seeds = len(spec.get("seeds", config["seeds"]))
    methods = spec["methods"]
    trained = [m for m in methods if not ensemble_spec(config, m) and not checkpoint_source(config, m)]
    embedded = [m for m in methods if not ensemble_spec(config, m)]
    datasets = spec["datasets"]
    runs = len(datasets) * seeds
    return {
        "prepare": len(datasets),
        "pretrain": len([d for d in datasets if d in config.get("pretraining", {})]),
        "train": runs * len(trained),
        "embed": runs * len(embedded),
        "evaluate": runs * len(methods),
        "report": 1,
    }


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--config", action="append", help="params file; repeat for overlays (default params.yaml)")
    parser.add_argument("--table", default="table1", help="the table whose job is estimated (default table1)")
    parser.add_argument("--method", default="binomial", help="the method `train` starts (default binomial)")
    parser.add_argument("--repeat", type=int, default=3, help="runs per command; the minimum is shown (default 3)")
    parser.add_argument("--verbose", action="store_true", help="also print the line each command stopped with")
    args = parser.parse_args(argv)
    configs = [str((ROOT / path).resolve()) for path in (args.config or ["params.yaml"])]

    from dmlbench.params import load_config

    spec = load_config(configs)["tables"][args.table]
    dataset = spec["datasets"][0]
    plan = planned_processes(configs, args.table)
    with tempfile.TemporaryDirectory(prefix="bench_startup_") as tmp:
        work = Path(tmp)
        (work / "occupied").mkdir()
        (work / "occupied" / "keep").touch()
        print(f"start-up CPU seconds per process (user + system, min of {args.repeat}; {sys.executable})")
        print(f"{'what':<22} {'min':>6} {'median':>7}  heavy libraries imported")
        baseline = {
            "python": "status = 0",
            "import dmlbench.cli": "import dmlbench.cli",
            "import dmlbench.config": "import dmlbench.config",
            "load_config": f"from dmlbench.params import load_config; load_config({configs!r})",
            # what train and embed import after their start-up (embed stops at the checkpoint before it)
            "a recipe (baseline)": "from dmlbench.methods import recipe_class; recipe_class('baseline')",
            # what evaluate imports for its NMI, after its start-up
            "sklearn.metrics": "import sklearn.metrics",
        }
        for name, body in baseline.items():
            code = CHILD.format(before=body if name != "python" else "", call="0", heavy=HEAVY)
            times, last = measure(code, work, args.repeat)
            print(f"{name:<22} {min(times):6.2f} {statistics.median(times):7.2f}  {' '.join(last['heavy']) or '-'}")
        total = 0.0
        for name, command in commands(work, configs, dataset, args.method, args.table).items():
            code = CHILD.format(before="from dmlbench.cli import main", call=f"main({command!r})", heavy=HEAVY)
            times, last = measure(code, work, args.repeat)
            expected = 0 if name.startswith("list") else 2
            if last["status"] != expected:
                raise SystemExit(
                    f"dmlbench {name}: exit status {last['status']}, expected {expected} "
                    f"(its missing input): {' '.join(last['stderr'])}"
                )
            count = plan.get(name, 0)
            total += count * min(times)
            jobs = f"  × {count} in {args.table}" if count else ""
            print(
                f"dmlbench {name:<13} {min(times):6.2f} {statistics.median(times):7.2f}  "
                f"{' '.join(last['heavy']) or '-'}{jobs}"
            )
            if args.verbose:
                print(f"    {' '.join(last['stderr'])}")
    print(f"start-up CPU of the {args.table} job's {sum(plan.values())} dmlbench processes: {total:.0f} s")


if __name__ == "__main__":
    main()
