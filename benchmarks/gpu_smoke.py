"""GPU smoke benchmark: the first thing to run on a GPU machine, in a few minutes.

For every trained method of a table (default: table1 under the overlays given, e.g. cub_lite), on
each training data path (``training.pipeline``: ``pil``, ``decoded_uint8``) and with
``training.deterministic`` on and off, this builds the run's own :class:`Trainer` on the real data
and trains a few dozen steps through the real loader, device augmentation and optimiser, after a
short warm-up (cuDNN's algorithm choice, loader start). It prints per configuration:

- ``img/s``: images per second of the timed steps (the epoch hook, e.g. D&C's clustering, excluded);
- ``of backbone``: that as a share of the *backbone-only* rate, the linear-head baseline's steps on
  batches already on the GPU, queued back to back (no loader, no augmentation: the ceiling for every
  method on this backbone; :func:`bench_train_step.train_images_per_s`);
- ``wait``: the share of the steps' time spent waiting for the loader (``loader_wait_share``);
- ``peak MiB``: peak GPU memory allocated; ``util``: mean GPU utilisation sampled every 0.1 s;
- ``nondet``: the operations that warned that they have no deterministic kernel (deterministic on).

First, with ``--paper-config``, the step rate of each method of that overlay's table at its own image
size and batch (224–256 px; random weights when the ImageNet files are absent), on random batches.

Usage on a GPU machine (``--manifest`` from ``dmlbench prepare``; the data may be a compact copy,
``benchmarks/compact_copy.py``)::

    python benchmarks/gpu_smoke.py --config params.yaml --config workflow/overlays/cub_lite.yaml \\
        --dataset cub200 --paper-config workflow/overlays/paper.yaml --json $OUT/gpu_smoke.json

A configuration that takes longer than ``--limit-s`` for its timed steps is reported as stalled and
the benchmark goes on: a slow path shows up as a number, not as a hang.
"""

from __future__ import annotations

import argparse
import copy
import json
import statistics
import tempfile
import threading
import time
from collections.abc import Iterator, Mapping
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import torch
from bench_train_step import train_images_per_s

from dmlbench.config import resolve_run
from dmlbench.layout import manifest_path
from dmlbench.params import load_config
from dmlbench.seeding import configure_determinism
from dmlbench.training.data import RunData, load_run_data
from dmlbench.training.trainer import Trainer

#: The linear-head baseline whose step on a ready GPU batch is the backbone-only ceiling.
BACKBONE_ONLY_METHOD = "binomial"
#: Seconds between GPU-utilisation samples.
UTILISATION_PERIOD_S = 0.1


@contextmanager
def utilisation_sampler(device: torch.device) -> Iterator[list[float]]:
    """Sample ``torch.cuda.utilization`` (%, via NVML) every 0.1 s while the block runs (none on a CPU)."""
    samples: list[float] = []
    if device.type != "cuda":
        yield samples
        return
    stop = threading.Event()

    def sample() -> None:
        while not stop.wait(UTILISATION_PERIOD_S):
            samples.append(float(torch.cuda.utilization(device)))

    thread = threading.Thread(target=sample, daemon=True)
    thread.start()
    try:
        yield samples
    finally:
        stop.set()
        thread.join()


def smoke_run(
    config: Mapping[str, Any],
    dataset: str,
    method: str,
    pipeline: str,
    deterministic: bool,
    num_workers: int,
    device: torch.device,
) -> dict[str, Any]:
    """``method``'s resolved run, set to train on ``device`` with this data path and determinism."""
    run = copy.deepcopy(resolve_run(config, dataset, method, 0))
    run["training"].update(pipeline=pipeline, deterministic=deterministic, device=str(device), num_workers=num_workers)
    return run


def synchronize(device: torch.device) -> None:
    """Wait for the GPU's queued work (nothing to wait for on a CPU)."""
    if device.type == "cuda":
        torch.cuda.synchronize(device)


def time_steps(
    run: dict[str, Any], data: RunData, steps: int, warmup: int, limit_s: float, device: torch.device
) -> dict[str, Any]:
    """Train ``warmup`` then ``steps`` batches of ``run`` with its own Trainer; measure the second pass."""
    with tempfile.TemporaryDirectory() as scratch:
        trainer = Trainer(run, data, Path(scratch) / "out", Path(scratch), device, progress=False)
        trainer.set_batches_per_epoch(warmup)
        with trainer.kernel_warnings.watch("warm-up"):
            warm = trainer.train_epoch(1)
        if warm.step_seconds > limit_s:  # a stalled path: do not wait for the timed steps too
            return {
                "images_per_s": warm.images / warm.step_seconds,
                "loader_wait_share": warm.loader_wait_seconds / warm.step_seconds,
                "peak_MiB": float("nan"),
                "gpu_utilisation": float("nan"),
                "nondeterministic_ops": trainer.kernel_warnings.nondeterministic_ops(),
                "stalled": True,
            }
        trainer.set_batches_per_epoch(steps)
        synchronize(device)
        if device.type == "cuda":
            torch.cuda.reset_peak_memory_stats(device)
        with utilisation_sampler(device) as samples, trainer.kernel_warnings.watch("timed steps"):
            stats = trainer.train_epoch(1)
        synchronize(device)
    return {
        "images_per_s": stats.images / stats.step_seconds,
        "loader_wait_share": stats.loader_wait_seconds / stats.step_seconds,
        "peak_MiB": torch.cuda.max_memory_allocated(device) / 2**20 if device.type == "cuda" else float("nan"),
        "gpu_utilisation": statistics.fmean(samples) if samples else float("nan"),
        "nondeterministic_ops": trainer.kernel_warnings.nondeterministic_ops(),
        "stalled": stats.step_seconds > limit_s,
    }


def paper_rates(
    paper_config: Mapping[str, Any], dataset: str, table: str, device: torch.device, steps: int
) -> list[dict[str, Any]]:
    """Step rate of each trained method of the paper overlay's table on random batches (random weights)."""
    rows = []
    for method in paper_config["tables"][table].get("methods") or paper_config["tables"]["table1"]["methods"]:
        run = copy.deepcopy(resolve_run(paper_config, dataset, method, 0))
        training = run["training"]
        if training["epochs"] == 0:
            continue
        training["backbone"]["pretrained"] = None
        started = time.perf_counter()
        rate = train_images_per_s(run, steps, 2, device)
        rows.append(
            {
                "method": method,
                "backbone": training["backbone"]["name"],
                "crop": training["image"]["train_crop"],
                "batch": training["sampler"]["classes_per_batch"] * training["sampler"]["images_per_class"],
                "images_per_s": rate,
                "seconds": time.perf_counter() - started,
            }
        )
        print(
            f"  {method:22s} {rows[-1]['backbone']:12s} {rows[-1]['crop']:4d} px  batch {rows[-1]['batch']:4d}  "
            f"{rate:8.0f} img/s",
            flush=True,
        )
    return rows


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--config", action="append", help="params file(s); default params.yaml")
    parser.add_argument("--dataset", required=True)
    parser.add_argument("--manifest", default=None, help="default data/prepared/DATASET/manifest.csv")
    parser.add_argument("--table", default="table1")
    parser.add_argument("--methods", nargs="+", default=None, help="default: the table's trained methods")
    parser.add_argument("--pipelines", nargs="+", default=["decoded_uint8", "pil"])
    parser.add_argument("--deterministic", nargs="+", default=["on", "off"], choices=["on", "off"])
    parser.add_argument("--steps", type=int, default=30, help="timed steps per configuration")
    parser.add_argument("--warmup", type=int, default=4, help="untimed steps first")
    parser.add_argument("--num-workers", type=int, default=6, help="training.num_workers")
    parser.add_argument(
        "--threads",
        type=int,
        default=1,
        help="CPU threads of the training process (torch.set_num_threads), as the workflow's jobs and "
        "run_table_runs.py give each run; torch's default, one per core, makes the step's small "
        "CPU operations (the crop draws) wait milliseconds for a pool shared with the loader",
    )
    parser.add_argument(
        "--limit-s",
        type=float,
        default=30.0,
        help="warm-up or timed steps slower than this (s): 'stalled' (a stalled warm-up is not timed)",
    )
    parser.add_argument("--paper-config", default=None, help="overlay whose table's backbones are timed too")
    parser.add_argument("--paper-steps", type=int, default=5)
    parser.add_argument("--json", default=None, help="also write every number here")
    parser.add_argument("--device", default="cuda", help="cuda (cpu only to try the script itself)")
    args = parser.parse_args()
    device = torch.device(args.device)
    torch.set_num_threads(args.threads)
    if device.type == "cuda" and not torch.cuda.is_available():
        raise SystemExit("gpu_smoke.py needs a CUDA GPU (bench_train_step.py times the CPU)")
    config = load_config(args.config or ["params.yaml"])
    manifest = args.manifest or manifest_path(args.dataset)
    methods = [
        m
        for m in (args.methods or config["tables"][args.table]["methods"])
        if resolve_run(config, args.dataset, m, 0)["training"]["epochs"] > 0
    ]
    name = torch.cuda.get_device_name(device) if device.type == "cuda" else "CPU"
    print(
        f"# {name}, torch {torch.__version__}, {args.dataset}, "
        f"{args.steps} timed steps after {args.warmup}, {args.num_workers} loader workers, {args.threads} CPU threads"
    )
    ceiling_run = smoke_run(config, args.dataset, BACKBONE_ONLY_METHOD, "pil", True, args.num_workers, device)
    ceilings = {}
    for deterministic in args.deterministic:
        configure_determinism(deterministic == "on", device)
        ceilings[deterministic] = train_images_per_s(ceiling_run, args.steps, args.warmup, device)
        print(f"backbone only (deterministic {deterministic}): {ceilings[deterministic]:.0f} img/s", flush=True)
    results: list[dict[str, Any]] = []
    paper: list[dict[str, Any]] = []

    def save() -> None:  # after every row: a benchmark cut short by a time limit keeps what it measured
        if args.json:
            Path(args.json).write_text(
                json.dumps({"device": name, "backbone_only": ceilings, "runs": results, "paper": paper}, indent=1)
            )

    if args.paper_config:
        print("# paper overlay, random weights, random batches on the GPU (step rate only)")
        paper.extend(
            paper_rates(
                load_config(["params.yaml", args.paper_config]), args.dataset, args.table, device, args.paper_steps
            )
        )
        save()
    print(
        f"{'pipeline':14s} {'det':4s} {'method':14s} {'img/s':>8s} {'of backbone':>11s} {'wait':>6s} "
        f"{'peak MiB':>9s} {'util':>5s}  nondet"
    )
    for pipeline in args.pipelines:
        data: RunData | None = None
        for deterministic in args.deterministic:
            for method in methods:
                run = smoke_run(config, args.dataset, method, pipeline, deterministic == "on", args.num_workers, device)
                data = data or load_run_data(run, manifest)
                row = {
                    "pipeline": pipeline,
                    "deterministic": deterministic,
                    "method": method,
                    **time_steps(run, data, args.steps, args.warmup, args.limit_s, device),
                }
                row["share_of_backbone"] = row["images_per_s"] / ceilings[deterministic]
                results.append(row)
                save()
                print(
                    f"{pipeline:14s} {deterministic:4s} {method:14s} {row['images_per_s']:8.0f} "
                    f"{row['share_of_backbone']:11.0%} {row['loader_wait_share']:6.0%} {row['peak_MiB']:9.0f} "
                    f"{row['gpu_utilisation']:5.0f}  {','.join(row['nondeterministic_ops']) or '-'}"
                    f"{'  STALLED' if row['stalled'] else ''}",
                    flush=True,
                )


if __name__ == "__main__":
    main()
