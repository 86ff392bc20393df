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

``--bound`` (issue 21, "evaluation at the bound") instead measures, in one process, our evaluation
against this machine's dense float32 GEMM rate and prints a table:

* GEMM rate: best time of (4096 × 512) @ (512 × 4096) with torch.matmul and with numpy, FLOP/s.
  The bound uses the faster of the two.
  It is measured again after the kNN runs: the machine may be shared, and if the two differ
  much the ratios below are unreliable (rerun).
* kNN bound: 2·N²·d / rate seconds, the all-vs-all distance GEMM alone.
* kNN part: ``query_results`` with MAP@R/RP (the retrieval part of ``evaluate_views``, without
  K-means or exact ranks) and its ratio to the bound; the issue's goal is ≤ 1.5. ``--backend``
  picks the search: "auto" (as the evaluation does), "faiss", or "torch" (on CUDA when torch
  sees a GPU, else on the CPU; :mod:`dmlbench.evaluation.knn_torch`).
* exact first-hit ranks: ``exhaustive_first_hit_rank`` on the queries with no hit within the
  search depth (what ``exact_ranks=True`` adds for ``per_query.npz``); its cost grows with
  their number, so use data with realistic recall (``--noise``: 3.7 gives R@1 ≈ 0.6).
* K-means: one faiss trajectory with the project's settings, stopped at 10, 20, 50 and 100
  iterations; NMI, objective and cumulative seconds at each. Faiss stops at a fixed point, so
  "done" may be below the checkpoint. The last row gives seconds per iteration and its ratio to
  the GEMM bound of one iteration (2·N·K·d FLOP).

The "SOP-scaled" column multiplies by (60502 / N)²·(512 / d) for the kNN rows and by
(60502 / N)·(11316 / K)·(512 / d) for K-means, for runs at a reduced size; with --classes in
the SOP proportion (N / K ≈ 5.35) the K-means iteration counts stay comparable.

Usage::

    python benchmarks/bench_evaluate.py                       # full SOP size
    python benchmarks/bench_evaluate.py --n 6000 --classes 1100
    python benchmarks/bench_evaluate.py --bound --n 30251 --classes 5658 --noise 3.7
    python benchmarks/bench_evaluate.py --bound --n 20000 --classes 3740 --noise 3.7 --backend torch
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
from collections.abc import Iterator
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


def synthetic_embeddings(
    num_items: int, dim: int, num_classes: int, seed: int, noise: float = 3.0, intrinsic_dim: int | None = None
) -> tuple[np.ndarray, np.ndarray]:
    """Clustered unit-norm embeddings (N, d) float32 and labels (N,) int64.

    Items are class centre + isotropic noise; class centres are super-class
    centre + offset, so classes of a super-class are near each other, as
    products of one category are in SOP. Generated in blocks to bound memory.
    With ``intrinsic_dim`` the points are generated in that many dimensions and
    mapped into d by a random isometry (learned embeddings have a low intrinsic
    dimension; in 512 isotropic dimensions K-means reaches a fixed point in a
    few iterations, which real embeddings do not).
    """
    rng = np.random.default_rng(seed)
    sizes = class_sizes(num_items, num_classes, rng)
    labels = np.repeat(np.arange(num_classes), sizes)
    low = intrinsic_dim or dim
    super_centres = rng.standard_normal((SUPER_CLASSES, low), dtype=np.float32)
    centres = super_centres[rng.integers(0, SUPER_CLASSES, num_classes)]
    centres += 1.2 * rng.standard_normal((num_classes, low), dtype=np.float32)
    isometry = None
    if intrinsic_dim:
        isometry = np.linalg.qr(rng.standard_normal((dim, low)))[0].T.astype(np.float32)  # (low, d), orthonormal rows
    embeddings = np.empty((num_items, dim), dtype=np.float32)
    for start in range(0, num_items, 8192):
        stop = min(start + 8192, num_items)
        block = centres[labels[start:stop]] + noise * rng.standard_normal((stop - start, low), dtype=np.float32)
        if isometry is not None:
            block = block @ isometry
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


# ---------------------------------------------------------------------------------------------
# --bound: the kNN part and K-means measured against this machine's dense GEMM rate
# ---------------------------------------------------------------------------------------------

KMEANS_CHECKPOINTS = (10, 20, 50, 100)


def gemm_rate(size: int = 4096, dim: int = 512, seconds: float = 3.0) -> dict[str, float]:
    """Dense float32 GEMM rate, FLOP/s: (size × dim) @ (dim × size), repeated for about ``seconds``.

    Measured with torch.matmul and with numpy (the BLAS faiss-cpu's wheel links may be another one);
    the best of the repeats, as a bound should be.
    """
    import torch

    rates = {}
    a_np = np.random.default_rng(0).standard_normal((size, dim), dtype=np.float32)
    b_np = np.ascontiguousarray(a_np.T)
    a, b = torch.from_numpy(a_np), torch.from_numpy(b_np)
    for name, matmul in (("torch", lambda: torch.matmul(a, b)), ("numpy", lambda: a_np @ b_np)):
        matmul()  # warm-up
        best, deadline = math.inf, time.perf_counter() + seconds
        while time.perf_counter() < deadline:
            start = time.perf_counter()
            matmul()
            best = min(best, time.perf_counter() - start)
        rates[name] = 2.0 * size * size * dim / best
    return rates


def flat_search(embeddings: np.ndarray, k: int, chunk_size: int, backend: str) -> None:
    """All-vs-all exact search for k neighbours with ``backend``, in chunks, results discarded: GEMM + top-k only."""
    from dmlbench.evaluation.knn import make_index

    index = make_index(embeddings, k, backend)
    for start in range(0, len(embeddings), chunk_size):
        index.search(embeddings[start:start + chunk_size], k)


def timed(function, *args, **kwargs):
    """(result, wall seconds) of one call."""
    start = time.perf_counter()
    result = function(*args, **kwargs)
    return result, time.perf_counter() - start


def kmeans_by_iterations(embeddings: np.ndarray, labels: np.ndarray, seed: int) -> Iterator[dict[str, float]]:
    """Yields NMI, objective and cumulative wall time after each of :data:`KMEANS_CHECKPOINTS` Lloyd iterations.

    One trajectory: the run to the next checkpoint starts from the centroids of the previous one,
    with the project's faiss settings (:func:`dmlbench.evaluation.clustering.kmeans_assignments`),
    so the total cost is that of one run of max(checkpoints) iterations. Faiss stops a run early at a
    fixed point (objective unchanged), so ``iterations`` counts the iterations actually done.
    """
    import faiss
    from sklearn.metrics import normalized_mutual_info_score

    num_points, dim = embeddings.shape
    num_clusters = len(np.unique(labels))
    centroids, done, elapsed = None, 0, 0.0
    for checkpoint in KMEANS_CHECKPOINTS:
        kmeans = faiss.Kmeans(
            dim, num_clusters, niter=checkpoint - done, nredo=1, seed=seed,
            max_points_per_centroid=math.ceil(num_points / num_clusters) + 1, min_points_per_centroid=1,
            verbose=False, gpu=False,
        )  # fmt: skip
        _, seconds = timed(kmeans.train, embeddings, init_centroids=centroids)
        centroids = kmeans.centroids
        segment = len(kmeans.iteration_stats)  # iterations done in this run (faiss may stop at a fixed point)
        converged = segment < checkpoint - done
        done += segment
        _, assignment = kmeans.index.search(embeddings, 1)
        nmi = normalized_mutual_info_score(labels, assignment[:, 0], average_method="arithmetic")
        elapsed += seconds
        yield {"checkpoint": checkpoint, "iterations": done, "objective": float(kmeans.obj[-1]),
               "nmi": float(nmi), "seconds": elapsed}  # fmt: skip
        if converged:
            break  # a fixed point: further checkpoints would not move


def bound(args: argparse.Namespace) -> None:
    """Measure and print the --bound table (in this process; nothing else runs meanwhile)."""
    from dmlbench.evaluation.retrieval import build_task, exhaustive_first_hit_rank, query_results

    if args.embeddings:  # a run's embeddings.npz (real embeddings); sizes come from the file
        with np.load(args.embeddings) as data:
            embeddings, labels = np.ascontiguousarray(data["embeddings"], dtype=np.float32), data["labels"]
        args.n, args.d, args.classes = *embeddings.shape, len(np.unique(labels))
    else:
        embeddings, labels = synthetic_embeddings(
            args.n, args.d, args.classes, args.seed, args.noise, args.intrinsic_dim
        )
    n, d = args.n, args.d
    rates = gemm_rate()
    rate = max(rates.values())
    knn_flop = 2.0 * n * n * d
    knn_bound = knn_flop / rate

    task = build_task(labels, None)
    ks = [k for k in (1, 10, 100, 1000) if k < n]
    # the kNN part of evaluate_views: query_results with MAP@R/RP; exact ranks timed separately below
    results, knn_seconds = timed(query_results, embeddings, task, ks, args.chunk_size, backend=args.backend)
    metrics = results.metrics(ks)
    depth = max(max(ks), int(task.relevant_counts.max()))
    beyond = np.flatnonzero(results.first_hit_rank > depth)
    flat_seconds = {k: timed(flat_search, embeddings, k, args.chunk_size, args.backend)[1] for k in (1, 65)}
    exact_seconds = 0.0
    if len(beyond):  # as query_results(exact_ranks=True) does after the search
        _, exact_seconds = timed(exhaustive_first_hit_rank, embeddings, embeddings, task, beyond, depth + 1)
    exact_flop = 2.0 * len(beyond) * n * d
    rates_after = gemm_rate()  # the machine is shared: a rate that moved means the ratios are unreliable

    kmeans_flop_per_iteration = 2.0 * n * args.classes * d
    scale = (60_502 / n) ** 2 * (512 / d)  # kNN work ∝ N²·d
    kscale = (60_502 / n) * (11_316 / args.classes) * (512 / d)  # K-means work ∝ N·K·d per iteration

    source = args.embeddings or f"synthetic, noise {args.noise}, intrinsic dim {args.intrinsic_dim}"
    print(f"data ({source}): {n} x {d} float32, {args.classes} classes, seed {args.seed}, "
          f"{np.bincount(labels).max()} max items per class; SOP extrapolation factor N²d x{scale:.2f}, "
          f"NKd x{kscale:.2f}; kNN backend {args.backend}")  # fmt: skip
    print("metrics: " + ", ".join(f"{k}={v:.4f}" for k, v in metrics.items()))
    lines = [
        ("GEMM rate torch / numpy (GFLOP/s)", f"{rates['torch'] / 1e9:.1f} / {rates['numpy'] / 1e9:.1f}", ""),
        ("  again after the kNN runs (GFLOP/s)",
         f"{rates_after['torch'] / 1e9:.1f} / {rates_after['numpy'] / 1e9:.1f}", ""),
        ("kNN bound 2·N²·d / rate (s)", f"{knn_bound:.2f}", f"{knn_bound * scale:.1f}"),
        ("kNN part: query_results, depth " + str(depth) + " (s)", f"{knn_seconds:.2f}",
         f"{knn_seconds * scale:.1f}"),
        ("  ratio to bound (goal ≤ 1.5)", f"{knn_seconds / knn_bound:.2f}", ""),
        *((f"  for comparison: bare {args.backend} search, k={k}, all queries (s)", f"{sec:.2f}",
           f"{sec * scale:.1f}")
          for k, sec in flat_seconds.items()),
        (f"exact first-hit ranks: {len(beyond)} queries beyond {depth} (s)", f"{exact_seconds:.2f}",
         f"{exact_seconds * scale:.1f}"),
        ("  its rate (GFLOP/s)", f"{exact_flop / max(exact_seconds, 1e-9) / 1e9:.1f}", ""),
        ("K-means FLOP per iteration 2·N·K·d (TFLOP)", f"{kmeans_flop_per_iteration / 1e12:.3f}",
         f"{kmeans_flop_per_iteration * kscale / 1e12:.3f}"),
    ]  # fmt: skip
    width = 64

    def show(name: str, value: str, scaled: str) -> None:
        print(f"{name:<{width}}  {value:>14}  {scaled:>10}", flush=True)

    show("quantity", "measured", "SOP-scaled")
    for line in lines:
        show(*line)
    for row in kmeans_by_iterations(embeddings, labels, args.seed):
        show(f"K-means to {row['checkpoint']:>3} (done {row['iterations']:>3}): NMI {row['nmi']:.4f}, "
             f"obj {row['objective']:.1f} (s)", f"{row['seconds']:.1f}", f"{row['seconds'] * kscale:.0f}")
    per_iteration = row["seconds"] / row["iterations"]
    show("  K-means s/iteration; ratio to GEMM bound", f"{per_iteration:.2f}; "
         f"{per_iteration / (kmeans_flop_per_iteration / rate):.2f}", f"{per_iteration * kscale:.2f}")


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
    parser.add_argument("--noise", type=float, default=3.0, help="per-item noise scale of the synthetic data")
    parser.add_argument("--intrinsic-dim", type=int, default=None, help="generate in this many dimensions (--bound)")
    parser.add_argument("--embeddings", type=Path, help="--bound on a run's embeddings.npz instead of synthetic data")
    parser.add_argument("--bound", action="store_true", help="kNN and K-means against the GEMM bound (see above)")
    parser.add_argument("--backend", choices=("auto", "faiss", "torch"), default="auto",
                        help="kNN search of --bound: as the evaluation chooses, faiss, or torch")
    parser.add_argument("--worker", choices=TOOLS, help=argparse.SUPPRESS)
    parser.add_argument("--data-dir", type=Path, help=argparse.SUPPRESS)
    return parser.parse_args(argv)


def main(argv: list[str]) -> None:
    """Generate the data once, then measure each tool in its own subprocess."""
    args = parse_args(argv)
    if args.worker:
        worker(args.worker, args.data_dir, args)
        return
    if args.bound:
        bound(args)
        return
    embeddings, labels = synthetic_embeddings(args.n, args.d, args.classes, args.seed, args.noise)
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
