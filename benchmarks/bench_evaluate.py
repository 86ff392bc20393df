"""Benchmark: dmlbench.evaluation vs pytorch-metric-learning's AccuracyCalculator on SOP-sized embeddings.

Synthetic data shaped like Stanford Online Products' test set (60,502 × 512 float32 by default,
11,316 classes of 2 to ~16 images, 12 super-classes), L2-normalised, with a fixed seed.

Default mode, each tool at the defaults a user meets, as whole processes (interpreter start-up and
imports included; wall time, CPU time and peak RSS from ``wait4`` of that process alone), one after
the other and ``--repeat`` times interleaved:

* ours: ``dmlbench evaluate EMBEDDINGS.npz --out metrics.json --recall-ks 1,10,100,1000`` (SOP's
  K, as ``--dataset sop`` would read them; every other setting at its default: K-means seed 0,
  niter 100, nredo 1; exact first-hit ranks; ``per_query.npz`` and ``metrics.json`` written);
* pml: ``AccuracyCalculator(k=1000)`` with its default kNN (faiss ``IndexFlatL2``), K-means
  (faiss, 20 iterations, seed 1234) and device, computing precision_at_1 (= R@1), R@10/100/1000
  (added as PML's documentation adds a metric), MAP@R, R-precision and NMI. Its default k (None)
  ranks every reference (N − 1 neighbours per query: 43 GB of indices at SOP size), so k is the
  smallest that gives R@1000.

It prints our time by phase (:mod:`dmlbench.evaluation.timing`: the evaluation marks its phases;
"start-up, imports, other" is the rest of the process), the metric values of both, and the ratio of
their median wall times (the goal of issue 29: ≥ 2). The machine may be shared: the CPU times and
their ratio are printed too.

``--same-kmeans`` is the earlier comparison: both tools in-process, with the same faiss K-means
settings for PML (``--niter``, seed, no subsampling; ``--pml-default-kmeans``: PML's own) and
``k="max_bin_count"`` (R@1, MAP@R, RP, NMI only); ``--no-nmi`` times the retrieval metrics alone.

``--bound`` (issue 21, "evaluation at the bound") instead measures, in one process, our evaluation
against this machine's dense float32 GEMM rate and prints a table:

* GEMM rate: best time of (4096 × 512) @ (512 × 4096) with torch.matmul and with numpy, FLOP/s.
  The bound uses the faster of the two.
  It is measured again after the kNN runs: the machine may be shared, and if the two differ
  much the ratios below are unreliable (rerun).
* kNN bound: 2·N²·d / rate seconds, the all-vs-all distance GEMM alone.
* kNN part: ``query_results`` with MAP@R/RP (the retrieval part of ``evaluate_views``, without
  K-means or exact ranks) and its ratio to the bound; the issue's goal is ≤ 1.5. ``--backend``
  picks the search: "auto" (as the evaluation does: at this size the all-pairs search of
  :mod:`dmlbench.evaluation.allpairs`, one GEMM per pair of row blocks, so below the bound),
  "faiss", or "torch" (on CUDA when torch sees a GPU, else on the CPU;
  :mod:`dmlbench.evaluation.knn_torch`).
* exact first-hit ranks: ``exhaustive_first_hit_rank`` on the queries with no hit within the
  search depth (what ``exact_ranks=True`` adds for ``per_query.npz``); its cost grows with
  their number, so use data with realistic recall (``--noise``: 3.7 gives R@1 ≈ 0.6).
* K-means: one faiss trajectory with the project's settings, stopped at 10, 20, 50 and 100
  iterations; NMI, objective and cumulative seconds at each. Faiss stops at a fixed point, so
  "done" may be below the checkpoint. The last row gives seconds per iteration and its ratio to
  the GEMM bound of one iteration (2·N·K·d FLOP). (The evaluation itself runs
  :mod:`dmlbench.evaluation.kmeans` at this size: faiss's algorithm computing only what changes.)

The "SOP-scaled" column multiplies by (60502 / N)²·(512 / d) for the kNN rows and by
(60502 / N)·(11316 / K)·(512 / d) for K-means, for runs at a reduced size; with --classes in
the SOP proportion (N / K ≈ 5.35) the K-means iteration counts stay comparable.

Usage::

    python benchmarks/bench_evaluate.py                       # full SOP size, both tools at their defaults
    python benchmarks/bench_evaluate.py --n 12000 --classes 2240 --repeat 3
    python benchmarks/bench_evaluate.py --n 73298 --classes 11316   # the size of issue 29's measurement
    python benchmarks/bench_evaluate.py --same-kmeans --n 6000 --classes 1100
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
DEFAULTS_TOOLS = ("ours-cli", "pml-defaults")
WORKERS = TOOLS + DEFAULTS_TOOLS
SOP_RECALL_KS = (1, 10, 100, 1000)
PML_K = 1000
"""PML's k in the side by side at defaults: its default (None) ranks every reference (N - 1 neighbours per
query, 43 GB of indices at SOP size), so the smallest k that gives R@1000; it exceeds max_bin_count, so
MAP@R and RP are exact."""


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


# ---------------------------------------------------------------------------------------------
# default mode: each tool at its defaults, as a user meets them, in whole processes
# ---------------------------------------------------------------------------------------------


def recall_ks(num_items: int) -> list[int]:
    """SOP's Recall@K set (params.yaml ``datasets.sop.recall_ks``), less the K values above the database."""
    return [k for k in SOP_RECALL_KS if k < num_items]


def run_ours_cli(data_dir: Path) -> dict:
    """``dmlbench evaluate`` at its defaults (only ``--recall-ks`` set, to SOP's), with the phases timed.

    It runs the CLI's own ``main`` in this process, which is what the ``dmlbench`` console script does;
    :func:`dmlbench.evaluation.timing.record_phases` only reads the clock around the phases.
    """
    from dmlbench.cli import main
    from dmlbench.evaluation.timing import record_phases

    with np.load(data_dir / "embeddings.npz") as data:
        num_items = len(data["labels"])
    out = data_dir / "ours" / "metrics.json"
    argv = ["evaluate", str(data_dir / "embeddings.npz"), "--out", str(out),
            "--recall-ks", ",".join(map(str, recall_ks(num_items)))]  # fmt: skip
    with record_phases() as phases:
        status = main(argv)
    if status:
        raise SystemExit(f"dmlbench {' '.join(argv)} exited with {status}")
    metrics = json.loads(out.read_text())
    return {"metrics": metrics, "phases": phases, "per_query_bytes": (out.parent / "per_query.npz").stat().st_size}


def run_pml_defaults(data_dir: Path) -> dict:
    """pytorch-metric-learning's AccuracyCalculator at its defaults (knn_func, kmeans_func, device) with
    k = :data:`PML_K`, computing precision_at_1 (= R@1), R@10/100/1000 (from its knn_labels, as PML's
    documentation adds a metric: a subclass with ``calculate_<name>``), MAP@R, RP and NMI."""
    import torch
    from pytorch_metric_learning.utils.accuracy_calculator import AccuracyCalculator, try_getting_not_lone_labels

    with np.load(data_dir / "embeddings.npz") as data:
        embeddings, labels = data["embeddings"], data["labels"]
    ks = [k for k in recall_ks(len(labels)) if k > 1]

    class WithRecall(AccuracyCalculator):
        """AccuracyCalculator with ``recall_at_K``: the share of non-lone queries with a same-label item
        among their K nearest references."""

        def requires_knn(self) -> list[str]:
            return super().requires_knn() + [f"recall_at_{k}" for k in ks]

    def recall(k: int):
        def calculate(self, knn_labels, query_labels, not_lone_query_mask, **kwargs) -> float:
            knn_labels, query_labels = try_getting_not_lone_labels(knn_labels, query_labels, not_lone_query_mask)
            return (knn_labels[:, :k] == query_labels[:, None]).any(dim=1).double().mean().item()

        return calculate

    for k in ks:
        setattr(WithRecall, f"calculate_recall_at_{k}", recall(k))
    include = ("precision_at_1", *(f"recall_at_{k}" for k in ks), "mean_average_precision_at_r", "r_precision",
               "NMI")  # fmt: skip
    calculator = WithRecall(include=include, k=min(PML_K, len(labels) - 1))
    metrics = calculator.get_accuracy(torch.from_numpy(embeddings), torch.from_numpy(labels))
    return {"metrics": metrics}


#: (our key, PML's key) of the same metric, for the side-by-side table.
SAME_METRICS = (
    ("R@1", "precision_at_1"),
    *((f"R@{k}", f"recall_at_{k}") for k in SOP_RECALL_KS[1:]),
    ("MAP@R", "mean_average_precision_at_r"),
    ("RP", "r_precision"),
    ("NMI", "NMI"),
)

#: Our phases in the order they run (:mod:`dmlbench.evaluation.timing`); "start-up, other" is the rest.
PHASES = (
    "read embeddings",
    "checks",
    "kNN search",
    "deeper search",
    "exact first-hit ranks",
    "MAP@R/RP",
    "K-means",
    "NMI score",
    "per-query arrays",
    "per-query file",
    "metrics file",
)


def run_process(worker_name: str, data_dir: Path, argv: list[str], timeout: float | None) -> dict:
    """Run :func:`worker` in a fresh interpreter and measure the whole process: wall seconds from the
    start to the exit, CPU seconds and peak RSS (``wait4``'s rusage of that child alone)."""
    import os
    import signal

    command = [sys.executable, __file__, *argv, "--worker", worker_name, "--data-dir", str(data_dir)]
    start = time.perf_counter()
    with tempfile.TemporaryFile("w+") as out, tempfile.TemporaryFile("w+") as err:
        child = subprocess.Popen(command, stdout=out, stderr=err, text=True)
        deadline = None if timeout is None else start + timeout
        while True:
            pid, status, usage = os.wait4(child.pid, os.WNOHANG)
            if pid:
                break
            if deadline is not None and time.perf_counter() > deadline:
                child.send_signal(signal.SIGKILL)
                os.wait4(child.pid, 0)
                return {"tool": worker_name, "timed_out_after_s": time.perf_counter() - start}
            time.sleep(0.05)
        seconds = time.perf_counter() - start
        child.returncode = os.waitstatus_to_exitcode(status)
        out.seek(0)
        err.seek(0)
        if child.returncode:
            raise SystemExit(f"{worker_name} failed ({child.returncode}):\n{err.read()}")
        result = json.loads(out.read().strip().splitlines()[-1])
    return {
        **result,
        "tool": worker_name,
        "seconds": seconds,
        "cpu_seconds": usage.ru_utime + usage.ru_stime,
        "peak_rss_mib": usage.ru_maxrss / 1024,
    }


def side_by_side(args: argparse.Namespace, argv: list[str]) -> None:
    """The default mode: both tools at their defaults, whole processes, interleaved; ours broken down."""
    embeddings, labels = synthetic_embeddings(args.n, args.d, args.classes, args.seed, args.noise, args.intrinsic_dim)
    sizes = np.bincount(labels)
    print(f"data: {args.n} x {args.d} float32, {args.classes} classes ({sizes.min()}-{sizes.max()} items per "
          f"class), noise {args.noise}, intrinsic dim {args.intrinsic_dim}, seed {args.seed}; "
          f"R@K for K in {recall_ks(args.n)}")  # fmt: skip
    print(f"ours: dmlbench evaluate (defaults; --recall-ks as datasets.sop), metrics.json + per_query.npz; "
          f"pml: AccuracyCalculator(k={min(PML_K, args.n - 1)}), its default kNN, K-means (faiss, 20 iterations) "
          f"and device", flush=True)  # fmt: skip
    tools = [tool for tool in DEFAULTS_TOOLS if tool.split("-")[0] in args.tools.split(",")]
    results: dict[str, list[dict]] = {tool: [] for tool in tools}
    with tempfile.TemporaryDirectory(prefix="bench_evaluate_") as tmp:
        np.savez(Path(tmp) / "embeddings.npz", embeddings=embeddings, labels=labels)
        del embeddings
        for _ in range(args.repeat):
            for tool in tools:
                result = run_process(tool, Path(tmp), argv, args.timeout)
                results[tool].append(result)
                if "seconds" in result:
                    print(
                        f"{tool:>12}: {result['seconds']:7.1f} s wall, {result['cpu_seconds']:7.1f} s CPU, "
                        f"peak RSS {result['peak_rss_mib']:6.0f} MiB",
                        flush=True,
                    )
                else:
                    print(f"{tool:>12}: stopped after {result['timed_out_after_s']:.0f} s (timeout)", flush=True)
    print_side_by_side(results)


def print_side_by_side(results: dict[str, list[dict]]) -> None:
    """Our breakdown (median run), the metric values of both tools and the ratio of their median wall times."""
    done = {tool: [r for r in runs if "seconds" in r] for tool, runs in results.items()}
    median = {tool: sorted(runs, key=lambda r: r["seconds"])[(len(runs) - 1) // 2]
              for tool, runs in done.items() if runs}  # fmt: skip
    ours, pml = median.get("ours-cli"), median.get("pml-defaults")
    if ours:
        print(f"\nours, by phase (run of median wall time; per_query.npz {ours['per_query_bytes'] / 2**20:.1f} MiB):")
        print(f"  {'phase':<26} {'wall s':>8} {'share':>6} {'CPU s':>8}")
        phases = ours["phases"]
        for name in [*PHASES, *sorted(set(phases) - set(PHASES))]:
            if name in phases:
                wall, cpu = phases[name]["wall"], phases[name]["cpu"]
                print(f"  {name:<26} {wall:8.2f} {100 * wall / ours['seconds']:5.1f}% {cpu:8.2f}")
        rest = ours["seconds"] - sum(times["wall"] for times in phases.values())
        rest_cpu = ours["cpu_seconds"] - sum(times["cpu"] for times in phases.values())
        print(f"  {'start-up, imports, other':<26} {rest:8.2f} {100 * rest / ours['seconds']:5.1f}% {rest_cpu:8.2f}")
        print(f"  {'total (whole process)':<26} {ours['seconds']:8.2f} {100.0:5.1f}% {ours['cpu_seconds']:8.2f}")
        print(
            f"  K-means iterations: {ours['metrics']['kmeans_iterations']:g} (ceiling "
            f"{ours['metrics']['kmeans_niter']:g})"
        )
    if ours and pml:
        print("\nmetric       ours     pml")
        for our_key, pml_key in SAME_METRICS:
            if our_key in ours["metrics"] and pml_key in pml["metrics"]:
                print(f"  {our_key:<8} {ours['metrics'][our_key]:.4f}  {pml['metrics'][pml_key]:.4f}")
    print("\nside by side (median of the runs):")
    for tool, run in median.items():
        print(
            f"  {tool:>12}: {run['seconds']:7.1f} s wall, {run['cpu_seconds']:7.1f} s CPU, peak RSS "
            f"{run['peak_rss_mib']:6.0f} MiB over {len(done[tool])} run(s)"
        )
    if ours and pml:
        print(
            f"  speed ratio pml / ours (wall): {pml['seconds'] / ours['seconds']:.2f}x (goal >= 2); CPU: "
            f"{pml['cpu_seconds'] / ours['cpu_seconds']:.2f}x; memory pml / ours: "
            f"{pml['peak_rss_mib'] / ours['peak_rss_mib']:.1f}x"
        )


def worker(tool: str, data_dir: Path, args: argparse.Namespace) -> None:
    """Load the data, run one tool and print one JSON line with its numbers."""
    if tool in DEFAULTS_TOOLS:
        result = (run_ours_cli if tool == "ours-cli" else run_pml_defaults)(data_dir)
        print(json.dumps({"tool": tool, **result}))
        return
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
        index.search(embeddings[start : start + chunk_size], k)


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
        show(
            f"K-means to {row['checkpoint']:>3} (done {row['iterations']:>3}): NMI {row['nmi']:.4f}, "
            f"obj {row['objective']:.1f} (s)",
            f"{row['seconds']:.1f}",
            f"{row['seconds'] * kscale:.0f}",
        )
    per_iteration = row["seconds"] / row["iterations"]
    show(
        "  K-means s/iteration; ratio to GEMM bound",
        f"{per_iteration:.2f}; {per_iteration / (kmeans_flop_per_iteration / rate):.2f}",
        f"{per_iteration * kscale:.2f}",
    )


def parse_args(argv: list[str]) -> argparse.Namespace:
    """Command-line options; ``--worker``/``--data-dir`` are internal (subprocess mode)."""
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--n", type=int, default=60_502, help="number of embeddings (SOP test: 60502)")
    parser.add_argument("--d", type=int, default=512, help="embedding dimension")
    parser.add_argument("--classes", type=int, default=11_316, help="number of classes (SOP test: 11316)")
    parser.add_argument("--seed", type=int, default=0, help="data and K-means seed")
    parser.add_argument("--niter", type=int, default=100, help="K-means iterations, both tools (--same-kmeans)")
    parser.add_argument("--chunk-size", type=int, default=4096, help="our kNN query chunk (--same-kmeans, --bound)")
    parser.add_argument("--tools", default=",".join(TOOLS), help="comma-separated subset of: ours,pml")
    parser.add_argument("--timeout", type=float, default=None, help="seconds before a tool is stopped")
    parser.add_argument("--repeat", type=int, default=1, help="runs per tool, interleaved (the machine may be shared)")
    parser.add_argument("--no-nmi", action="store_true", help="retrieval metrics only, no K-means (--same-kmeans)")
    parser.add_argument(
        "--pml-default-kmeans", action="store_true", help="PML's own K-means, 20 iterations (--same-kmeans)"
    )
    parser.add_argument("--noise", type=float, default=3.0, help="per-item noise scale of the synthetic data")
    parser.add_argument(
        "--intrinsic-dim", type=int, default=None, help="generate the data in this many dimensions, mapped into d"
    )
    parser.add_argument("--embeddings", type=Path, help="--bound on a run's embeddings.npz instead of synthetic data")
    parser.add_argument("--bound", action="store_true", help="kNN and K-means against the GEMM bound (see above)")
    parser.add_argument(
        "--backend",
        choices=("auto", "faiss", "torch"),
        default="auto",
        help="kNN search of --bound: as the evaluation chooses, faiss, or torch",
    )
    parser.add_argument(
        "--same-kmeans",
        action="store_true",
        help="the earlier comparison: both tools in-process with the same K-means settings",
    )
    parser.add_argument("--worker", choices=WORKERS, help=argparse.SUPPRESS)
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
    if not args.same_kmeans:
        side_by_side(args, argv)
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
