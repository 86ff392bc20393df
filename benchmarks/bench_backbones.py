"""Benchmark: training and inference throughput of every backbone (images/s, peak GPU memory).

For each backbone of the registry (random initial weights: speed does not
depend on their values) and each image size, it times

* ``train``: forward + backward of ``backbone(x).sum()`` in train mode, with an
  optimiser-free ``zero_grad`` between steps (the backbone's share of a training step);
* ``embed``: forward only, eval mode, ``torch.no_grad`` (test-time embedding).

Each measurement is the median over ``--steps`` timed steps after ``--warmup``
untimed ones, synchronising the GPU around each step. ``--amp`` runs under
``torch.autocast`` (float16 on CUDA, the trainer's setting); ``--channels-last``
uses the NHWC memory format. On a GPU the peak allocated memory of the train
step is reported too. Output: one line per (backbone, size), and with ``--json``
the same numbers as a JSON list.

Usage::

    python benchmarks/bench_backbones.py --device cuda --batch 64 --sizes 224 --amp
    python benchmarks/bench_backbones.py --device cpu --batch 16 --sizes 128 224 --threads 1
"""

from __future__ import annotations

import argparse
import json
import statistics
import time
from collections.abc import Callable

import torch

from dmlbench.models.backbones import BACKBONES, build_backbone


def timed_median(step: Callable[[], None], device: torch.device, warmup: int, steps: int) -> float:
    """Median wall time of ``step()`` in seconds over ``steps`` runs after ``warmup`` untimed ones."""
    for _ in range(warmup):
        step()
    if device.type == "cuda":
        torch.cuda.synchronize(device)
    times = []
    for _ in range(steps):
        start = time.perf_counter()
        step()
        if device.type == "cuda":
            torch.cuda.synchronize(device)
        times.append(time.perf_counter() - start)
    return statistics.median(times)


def measure(name: str, size: int, args: argparse.Namespace, device: torch.device) -> dict[str, float | int | str]:
    """Train and embed images/s of backbone ``name`` at ``size`` px (and peak train memory on CUDA)."""
    backbone = build_backbone({"name": name}).to(device)
    memory_format = torch.channels_last if args.channels_last else torch.contiguous_format
    backbone = backbone.to(memory_format=memory_format)
    x = torch.rand(args.batch, 3, size, size, device=device).to(memory_format=memory_format)
    autocast = torch.autocast(device.type, enabled=args.amp)

    def train_step() -> None:
        backbone.zero_grad(set_to_none=True)
        with autocast:
            out = backbone(x)
        out.float().sum().backward()

    def embed_step() -> None:
        with torch.no_grad(), autocast:
            backbone(x)

    backbone.train()
    if device.type == "cuda":
        torch.cuda.reset_peak_memory_stats(device)
    train_seconds = timed_median(train_step, device, args.warmup, args.steps)
    peak_mib = torch.cuda.max_memory_allocated(device) / 2**20 if device.type == "cuda" else float("nan")
    backbone.eval()
    embed_seconds = timed_median(embed_step, device, args.warmup, args.steps)
    return {
        "backbone": name,
        "size": size,
        "batch": args.batch,
        "amp": args.amp,
        "train_img_s": args.batch / train_seconds,
        "embed_img_s": args.batch / embed_seconds,
        "train_peak_mib": peak_mib,
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--device", default="cuda" if torch.cuda.is_available() else "cpu")
    parser.add_argument("--backbones", nargs="+", default=sorted(BACKBONES), choices=sorted(BACKBONES))
    parser.add_argument("--sizes", nargs="+", type=int, default=[224], help="square input sizes in px")
    parser.add_argument("--batch", type=int, default=64)
    parser.add_argument("--amp", action="store_true", help="autocast (float16 on CUDA, bfloat16 on CPU)")
    parser.add_argument("--channels-last", action="store_true")
    parser.add_argument("--warmup", type=int, default=3)
    parser.add_argument("--steps", type=int, default=10)
    parser.add_argument("--threads", type=int, default=None, help="CPU threads (torch.set_num_threads)")
    parser.add_argument("--json", default=None, help="also write the results to this JSON file")
    args = parser.parse_args()
    if args.threads is not None:
        torch.set_num_threads(args.threads)
    device = torch.device(args.device)
    if device.type == "cuda":
        torch.backends.cudnn.benchmark = True
        print(f"# {torch.cuda.get_device_name(device)}, torch {torch.__version__}")
    else:
        print(f"# CPU, {torch.get_num_threads()} threads, torch {torch.__version__}")
    print(
        f"# batch {args.batch}, amp {args.amp}, channels_last {args.channels_last}, "
        f"median of {args.steps} steps after {args.warmup} warm-up"
    )
    print(f"{'backbone':<20}{'size':>6}{'train img/s':>14}{'embed img/s':>14}{'train peak MiB':>16}")
    results = []
    for name in args.backbones:
        for size in args.sizes:
            row = measure(name, size, args, device)
            results.append(row)
            print(
                f"{name:<20}{size:>6}{row['train_img_s']:>14.1f}{row['embed_img_s']:>14.1f}"
                f"{row['train_peak_mib']:>16.0f}",
                flush=True,
            )
    if args.json:
        with open(args.json, "w") as f:
            json.dump(results, f, indent=1)


if __name__ == "__main__":
    main()
