"""Benchmark: dmlbench.evaluation vs pytorch-metric-learning's AccuracyCalculator on SOP-sized embeddings.

Synthetic data shaped like Stanford Online Products' test set (60,502 × 512
float32, 11,316 classes of 2 to ~16 images, 12 super-classes), L2-normalised,
with a fixed seed. Each tool runs in its own subprocess, so imports and
allocations of one cannot affect the other's numbers; each reports its wall
time and its peak-RSS increase over the RSS it had after loading the data and
importing its libraries.

* ours: ``evaluate_embeddings`` with R@1, 10, 100, 1000, NMI, MAP@R, RP.
* pml: ``AccuracyCalculator(k="max_bin_count")`` with precision_at_1,
  r_precision, mean_average_precision_at_r, NMI.

Both tools use the same faiss K-means settings (``--niter``, seed, no
subsampling), so the NMI work is identical and the comparison is about the
rest; ``--pml-default-kmeans`` gives PML its own default (faiss, 20 iterations)
instead. ``--no-nmi`` times the retrieval metrics alone.

Usage::

    python benchmarks/bench_evaluate.py                       # full SOP size
    python benchmarks/bench_evaluate.py --n 6000 --classes 1100
"""

from __future__ import annotations

import argparse
import json
import math
import resource
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import numpy as np

SUPER_CLASSES = 12
TOOLS = ("ours", "pml")


def class_sizes(num_items: int, num_classes: int, rng: np.random.Generator) -> np.ndarray:
    """(C,) class sizes ≥ 2 summing to ``num_items``: 2 each plus a uniform multinomial share of the rest."""
    extra = num_items - 2 * num_classes
    if extra < 0:
        raise SystemExit(f"--n {num_items} is too small for {num_classes} classes of at least 2 items")
    return 2 + rng.multinomial(extra, np.full(num_classes, 1.0 / num_classes))


def synthetic_embeddings(num_items: int, dim: int, num_classes: int, seed: int) -> tuple[np.ndarray, np.ndarray]:
    """Clustered unit-norm embeddings (N, d) float32 and labels (N,) int64.

    Items are class centre + isotropic noise; class centres are super-class
    centre + offset, so classes of a super-class are near each other, as
    products of one category are in SOP. Generated in blocks to bound memory.
    """
    rng = np.random.default_rng(seed)
    sizes = class_sizes(num_items, num_classes, rng)
    labels = np.repeat(np.arange(num_classes), sizes)
    super_centres = rng.standard_normal((SUPER_CLASSES, dim), dtype=np.float32)
    centres = super_centres[rng.integers(0, SUPER_CLASSES, num_classes)]
    centres += 1.2 * rng.standard_normal((num_classes, dim), dtype=np.float32)
    embeddings = np.empty((num_items, dim), dtype=np.float32)
    for start in range(0, num_items, 8192):
        stop = min(start + 8192, num_items)
        block = centres[labels[start:stop]] + 3.0 * rng.standard_normal((stop - start, dim), dtype=np.float32)
        embeddings[start:stop] = block / np.linalg.norm(block, axis=1, keepdims=True)
    return embeddings, labels


def cpu_seconds() -> float:
    """User + system CPU time of this process and its threads so far, seconds."""
    usage = resource.getrusage(resource.RUSAGE_SELF)
    return usage.ru_utime + usage.ru_stime


def peak_rss_mib() -> float:
    """Peak resident set size of this process so far, MiB (Linux reports KiB)."""
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024


def run_ours(embeddings: np.ndarray, labels: np.ndarray, args: argparse.Namespace) -> dict:
    """Time our metric set; returns the metrics and measurements."""
    from dmlbench.evaluation import KMeansSettings, evaluate_embeddings
    from dmlbench.evaluation.retrieval import build_task, retrieval_metrics

    ks = [k for k in (1, 10, 100, 1000) if k < len(labels)]
    rss_before, cpu_before, start = peak_rss_mib(), cpu_seconds(), time.perf_counter()
    if args.no_nmi:
        metrics = retrieval_metrics(embeddings, build_task(labels, None), ks, args.chunk_size)
    else:
        metrics = evaluate_embeddings(
            embeddings, labels, ks, kmeans=KMeansSettings(seed=args.seed, niter=args.niter), chunk_size=args.chunk_size
        )
    return measurements(metrics, start, cpu_before, rss_before)


def run_pml(embeddings: np.ndarray, labels: np.ndarray, args: argparse.Namespace) -> dict:
    """Time pytorch-metric-learning's AccuracyCalculator; returns the metrics and measurements."""
    import torch
    from pytorch_metric_learning.utils.accuracy_calculator import AccuracyCalculator
    from pytorch_metric_learning.utils.inference import FaissKMeans

    num_clusters = len(np.unique(labels))
    kmeans_func = (
        None
        if args.pml_default_kmeans
        else FaissKMeans(
            niter=args.niter,
            nredo=1,
            seed=args.seed,
            max_points_per_centroid=math.ceil(len(labels) / num_clusters) + 1,
            min_points_per_centroid=1,
        )
    )
    include = ("precision_at_1", "r_precision", "mean_average_precision_at_r") + (() if args.no_nmi else ("NMI",))
    rss_before, cpu_before, start = peak_rss_mib(), cpu_seconds(), time.perf_counter()
    calculator = AccuracyCalculator(
        include=include, k="max_bin_count", device=torch.device("cpu"), kmeans_func=kmeans_func
    )
    metrics = calculator.get_accuracy(torch.from_numpy(embeddings), torch.from_numpy(labels))
    return measurements(metrics, start, cpu_before, rss_before)


def measurements(metrics: dict, start: float, cpu_before: float, rss_before: float) -> dict:
    """The metrics with wall seconds, CPU seconds and peak-RSS figures since the given starting values."""
    return {
        "metrics": metrics,
        "seconds": time.perf_counter() - start,
        "cpu_seconds": cpu_seconds() - cpu_before,
        "peak_rss_increase_mib": peak_rss_mib() - rss_before,
        "peak_rss_mib": peak_rss_mib(),
    }


def worker(tool: str, data_dir: Path, args: argparse.Namespace) -> None:
    """Load the data, run one tool and print one JSON line with its numbers."""
    embeddings = np.load(data_dir / "embeddings.npy")
    labels = np.load(data_dir / "labels.npy")
    result = (run_ours if tool == "ours" else run_pml)(embeddings, labels, args)
    print(json.dumps({"tool": tool, **result}))


def measure(tool: str, data_dir: Path, argv: list[str], timeout: float | None) -> dict:
    """Run :func:`worker` for ``tool`` in a fresh interpreter; a timeout is reported, not raised."""
    command = [sys.executable, __file__, *argv, "--worker", tool, "--data-dir", str(data_dir)]
    start = time.perf_counter()
    try:
        completed = subprocess.run(command, capture_output=True, text=True, timeout=timeout, check=True)
    except subprocess.TimeoutExpired:
        return {"tool": tool, "timed_out_after_s": time.perf_counter() - start}
    except subprocess.CalledProcessError as err:
        raise SystemExit(f"{tool} failed:\n{err.stderr}") from err
    return json.loads(completed.stdout.strip().splitlines()[-1])


def report(result: dict) -> str:
    """One human-readable line (plus the metric values) for one run of one tool."""
    if "timed_out_after_s" in result:
        return f"{result['tool']:>5}: stopped after {result['timed_out_after_s']:.0f} s (timeout)"
    metrics = ", ".join(f"{k}={v:.4f}" for k, v in result["metrics"].items() if not k.startswith(("num_", "kmeans_")))
    return (
        f"{result['tool']:>5}: {result['seconds']:8.1f} s wall, {result['cpu_seconds']:8.1f} s CPU, "
        f"peak RSS +{result['peak_rss_increase_mib']:7.0f} MiB "
        f"(peak {result['peak_rss_mib']:.0f} MiB)\n       {metrics}"
    )


def summary(results: list[dict]) -> str:
    """Median wall and CPU time and largest peak-RSS increase of one tool over its completed runs."""
    done = [r for r in results if "seconds" in r]
    if not done:
        return f"{results[0]['tool']:>5}: no completed run"
    seconds = sorted(r["seconds"] for r in done)
    cpu = float(np.median([r["cpu_seconds"] for r in done]))
    rss = max(r["peak_rss_increase_mib"] for r in done)
    return (
        f"{done[0]['tool']:>5}: median {float(np.median(seconds)):.1f} s wall over {len(done)} run(s) "
        f"(min {seconds[0]:.1f}, max {seconds[-1]:.1f}), median {cpu:.1f} s CPU, peak RSS +{rss:.0f} MiB"
    )


def parse_args(argv: list[str]) -> argparse.Namespace:
    """Command-line options; ``--worker``/``--data-dir`` are internal (subprocess mode)."""
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--n", type=int, default=60_502, help="number of embeddings (SOP test: 60502)")
    parser.add_argument("--d", type=int, default=512, help="embedding dimension")
    parser.add_argument("--classes", type=int, default=11_316, help="number of classes (SOP test: 11316)")
    parser.add_argument("--seed", type=int, default=0, help="data and K-means seed")
    parser.add_argument("--niter", type=int, default=100, help="K-means iterations, both tools")
    parser.add_argument("--chunk-size", type=int, default=4096, help="our kNN query chunk")
    parser.add_argument("--tools", default=",".join(TOOLS), help="comma-separated subset of: ours,pml")
    parser.add_argument("--timeout", type=float, default=None, help="seconds before a tool is stopped")
    parser.add_argument("--repeat", type=int, default=1, help="runs per tool, interleaved (the machine may be shared)")
    parser.add_argument("--no-nmi", action="store_true", help="retrieval metrics only (no K-means)")
    parser.add_argument("--pml-default-kmeans", action="store_true", help="PML's own K-means (20 iterations)")
    parser.add_argument("--worker", choices=TOOLS, help=argparse.SUPPRESS)
    parser.add_argument("--data-dir", type=Path, help=argparse.SUPPRESS)
    return parser.parse_args(argv)


def main(argv: list[str]) -> None:
    """Generate the data once, then measure each tool in its own subprocess."""
    args = parse_args(argv)
    if args.worker:
        worker(args.worker, args.data_dir, args)
        return
    embeddings, labels = synthetic_embeddings(args.n, args.d, args.classes, args.seed)
    print(f"data: {args.n} x {args.d} float32, {args.classes} classes "
          f"({np.bincount(labels).min()}-{np.bincount(labels).max()} items per class), seed {args.seed}")  # fmt: skip
    with tempfile.TemporaryDirectory(prefix="bench_evaluate_") as tmp:
        np.save(Path(tmp) / "embeddings.npy", embeddings)
        np.save(Path(tmp) / "labels.npy", labels)
        del embeddings
        tools = args.tools.split(",")
        results: dict[str, list[dict]] = {tool: [] for tool in tools}
        for _ in range(args.repeat):
            for tool in tools:
                results[tool].append(measure(tool, Path(tmp), argv, args.timeout))
                print(report(results[tool][-1]), flush=True)
    print("summary:")
    for tool in tools:
        print(summary(results[tool]))


if __name__ == "__main__":
    main(sys.argv[1:])
