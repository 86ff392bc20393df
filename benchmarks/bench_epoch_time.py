"""Benchmark: seconds per training epoch of every method of a table, from its finished runs.

Each run's ``log.csv`` records the wall time of every epoch (``seconds``: the training batches,
not the validation pass), its throughput (``images_per_s``) and the share of it the model waited for
the loader (``loader_wait_share``: on a GPU, what the data path costs); this script reads them for the
runs of ``tables.<TABLE>`` and prints, per method, the median over the run's epochs and the
mean ± std of that over seeds, then the whole table's training seconds — the critical numbers
for the embedded default's time budget. Methods that are not trained (ensembles, test-time
variants, reference rows with ``epochs: 0``) are listed with 0.

Usage (after the table's runs exist, e.g. ``snakemake --cores 8 results/tables/table1.tex``)::

    python benchmarks/bench_epoch_time.py                 # table1 of params.yaml
    python benchmarks/bench_epoch_time.py --table abe_table1 --config params.yaml --config my.yaml

The numbers are only as clean as the machine was idle during the runs: Snakemake runs several
jobs at once, so per-epoch seconds include contention when there are more jobs than cores.
"""

from __future__ import annotations

import argparse
import math
import statistics
from pathlib import Path

import pandas as pd

from dmlbench.layout import EMBEDDINGS_FILE, LOG_FILE, run_dir
from dmlbench.params import load_config


def epoch_seconds(log_csv: Path) -> tuple[float, float, int, float]:
    """(median seconds per epoch, median images/s, epochs, median share of an epoch spent waiting for the
    loader) of one run's log.csv; zeros for an empty log, NaN wait for a log written before it was recorded."""
    log = pd.read_csv(log_csv)
    if log.empty:
        return 0.0, 0.0, 0, 0.0
    wait = float(log["loader_wait_share"].median()) if "loader_wait_share" in log else math.nan
    return float(log["seconds"].median()), float(log["images_per_s"].median()), len(log), wait


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--table", default="table1")
    parser.add_argument("--config", action="append", help="params file(s); default params.yaml")
    args = parser.parse_args()
    config = load_config(args.config or ["params.yaml"])
    spec = config["tables"][args.table]
    total, missing = 0.0, []
    print(
        f"{'dataset':10s} {'method':22s} {'s/epoch':>14s} {'img/s':>8s} {'epochs':>6s} {'train s':>8s} {'wait %':>7s}"
    )
    for dataset in spec["datasets"]:
        for method in spec["methods"]:
            per_seed = []
            for seed in spec.get("seeds", config["seeds"]):
                log = run_dir(dataset, method, seed) / LOG_FILE
                if log.is_file():
                    per_seed.append(epoch_seconds(log))
                elif (log.parent / EMBEDDINGS_FILE).is_file():
                    per_seed.append((0.0, 0.0, 0, 0.0))  # not trained: an ensemble or a test-time variant
                else:
                    missing.append(str(log))
            if not per_seed:
                continue
            seconds = [s for s, _, _, _ in per_seed]
            train = sum(s * n for s, _, n, _ in per_seed)
            total += train
            spread = statistics.stdev(seconds) if len(seconds) > 1 else 0.0
            print(
                f"{dataset:10s} {method:22s} {statistics.mean(seconds):7.2f} ± {spread:4.2f} "
                f"{statistics.mean(i for _, i, _, _ in per_seed):8.0f} {per_seed[0][2]:6d} {train:8.0f} "
                f"{100 * statistics.mean(w for _, _, _, w in per_seed):7.1f}"
            )
    print(f"training seconds, all runs of {args.table}: {total:.0f} (≈ {total / 2 / 60:.1f} min on 2 cores)")
    if missing:
        print(f"{len(missing)} runs have no log yet, e.g. {missing[0]}: build the table first")


if __name__ == "__main__":
    main()
