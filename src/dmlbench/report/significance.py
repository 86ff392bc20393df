"""Confidence intervals and the "not significantly worse than the best" test of the tables.

**Confidence interval: a two-level (hierarchical) percentile bootstrap.** A table cell averages a
metric over S seeds (training randomness) and, within each seed, over the Q test queries (test-set
sampling). One bootstrap replicate draws S seeds with replacement and then, independently for each
drawn seed, Q queries with replacement, and takes the mean of the per-query values (0/1 hits for
R@K, AP@R, R-precision) over everything drawn. The cell shows the mean ± half the width of the
central 95 % interval of :data:`BOOTSTRAP_SAMPLES` replicates (the bounds themselves go to the CSV).
With one seed the interval is over queries only. A number with no per-query decomposition (NMI,
``learners_mean/…``, model statistics) has Q = 1: the bootstrap then resamples seeds only (with one
seed there is no interval; with few seeds the seed bootstrap understates the spread).

**Test: one-sided paired bootstrap.** A row is significantly worse than the column's best row when
fewer than a share α = :data:`ALPHA` of the replicates of the difference (best − row) are ≤ 0, i.e.
when 0 lies below the one-sided 95 % percentile interval of the difference. The replicates of both
rows use the *same* draws (:func:`bootstrap_means` depends only on the shape and the RNG seed):
the same seed slots, matched by seed index (the i-th seed of one method with the i-th seed of the
other), and the same test queries. Why this test rather than a sign or permutation test of pooled
per-query R@1 hits: pairing on queries removes the large share of variance that comes from a
query being easy or hard for every method; resampling seeds on top keeps training randomness in the
test, which pooling the hits of all seeds as if they were independent queries would ignore (and
so call a lucky seed significant); and it is the same resampling as the interval, so it covers every
column (R@K, MAP@R, RP, and NMI through the seed level) with one procedure.

Everything is deterministic: the RNG seed is :data:`BOOTSTRAP_SEED`.
"""

from __future__ import annotations

import numpy as np

#: Bootstrap replicates per cell.
BOOTSTRAP_SAMPLES = 1000
#: Seed of the bootstrap's random draws (tables are deterministic).
BOOTSTRAP_SEED = 0
#: Confidence level of the intervals.
CONFIDENCE = 0.95
#: One-sided level of the paired test for "significantly worse than the best".
ALPHA = 0.05
#: Most drawn (replicate, seed, query) indices held at once; bounds memory, not the result.
DRAW_BUDGET = 1 << 20


def bootstrap_means(values: np.ndarray, samples: int = BOOTSTRAP_SAMPLES, seed: int = BOOTSTRAP_SEED) -> np.ndarray:
    """Two-level bootstrap replicates of the mean: seeds with replacement, then queries within each.

    The draws depend only on (S, Q, ``samples``, ``seed``), never on the values, so two calls with
    arrays of the same shape resample the same seed slots and queries (what the paired test needs).

    Args:
        values: (S, Q, M) float: M metrics' per-query values of Q queries (the same queries, in the same
            order, for every seed) in S seeds (in seed order); Q = 1 for per-run numbers.
        samples: replicates B.
        seed: RNG seed.

    Returns:
        (B, M) float64 replicate means.

    Two seeds whose queries all score 0.2 and 0.8: a replicate draws seeds (a, a), (a, b), (b, a) or
    (b, b), so its mean is 0.2, 0.5 or 0.8:

    >>> values = np.array([[0.2, 0.2], [0.8, 0.8]])[:, :, None]
    >>> sorted(set(np.round(bootstrap_means(values, samples=200)[:, 0], 6).tolist()))
    [0.2, 0.5, 0.8]
    """
    num_seeds, num_queries, _ = values.shape
    rng = np.random.default_rng(seed)
    batch = max(1, DRAW_BUDGET // (num_seeds * num_queries))
    means = []
    for start in range(0, samples, batch):
        size = min(batch, samples - start)
        slots = rng.integers(0, num_seeds, size=(size, num_seeds))
        queries = rng.integers(0, num_queries, size=(size, num_seeds, num_queries))
        means.append(values[slots[:, :, None], queries].mean(axis=(1, 2)))  # (size, M)
    return np.concatenate(means)


def percentile_interval(replicates: np.ndarray, confidence: float = CONFIDENCE) -> tuple[np.ndarray, np.ndarray]:
    """Central percentile interval of bootstrap replicates.

    Args:
        replicates: (B, M) from :func:`bootstrap_means`.
        confidence: coverage in (0, 1).

    Returns:
        (M,) lower and (M,) upper bounds.

    >>> percentile_interval(np.arange(101.0)[:, None], 0.9)
    (array([5.]), array([95.]))
    """
    tail = (1.0 - confidence) / 2.0
    low, high = np.quantile(replicates, [tail, 1.0 - tail], axis=0)
    return low, high


def worse_p_value(best: np.ndarray, other: np.ndarray) -> float:
    """One-sided paired bootstrap p-value of "``other`` is worse than ``best``".

    Args:
        best, other: (B,) replicates of one metric from :func:`bootstrap_means` with the same draws.

    Returns:
        The share of replicates in which ``best − other ≤ 0``, in [0, 1]; 1.0 for identical rows.
        The row is significantly worse when this is below :data:`ALPHA`.

    >>> worse_p_value(np.array([0.5, 0.6, 0.7]), np.array([0.5, 0.6, 0.7]))
    1.0
    >>> worse_p_value(np.array([0.5, 0.6, 0.7]), np.array([0.4, 0.5, 0.71]))
    0.3333333333333333
    """
    if best.shape != other.shape:
        raise ValueError(f"paired replicates must have the same shape, got {best.shape} and {other.shape}")
    return float(np.mean(best - other <= 0.0))


def interval_text(seed_counts: set[int], subject: str = "Cells") -> str:
    """The plain-text sentence stating what ``subject`` (the cells, a claim's sides) show: mean ± half-width of the
    bootstrap interval, and how the seeds count.

    Args:
        seed_counts: the numbers of seeds of the table's cells (or claims).
        subject: what the sentence opens with.

    >>> print(interval_text({3}, "Ours"))  # doctest: +NORMALIZE_WHITESPACE
    Ours: mean ± half-width of the 95 % confidence interval (percentile bootstrap, 1000 replicates, RNG seed 0:
    3 seeds resampled, then test queries within each seed; NMI and other per-run numbers: seeds only), in percent
    for evaluation metrics.
    """
    if seed_counts == {1}:
        how = "1 seed, so over test queries only; NMI and other per-run numbers: no interval with 1 seed"
    else:
        seeds = " or ".join(str(n) for n in sorted(seed_counts))
        how = (
            f"{seeds} seeds resampled, then test queries within each seed; NMI and other per-run numbers: "
            "seeds only" + ("; cells with 1 seed: queries only" if 1 in seed_counts else "")
        )
    return (
        f"{subject}: mean ± half-width of the {100 * CONFIDENCE:.0f} % confidence interval (percentile bootstrap, "
        f"{BOOTSTRAP_SAMPLES} replicates, RNG seed {BOOTSTRAP_SEED}: {how}), in percent for evaluation metrics."
    )


def method_text(seed_counts: set[int], bold_name: str = "Bold") -> str:
    """Plain-text sentences stating the interval (:func:`interval_text`), the test, α and how the seeds count
    (captions and notes of the comparison tables).

    Args:
        seed_counts: the numbers of seeds of the table's cells.
        bold_name: what marks the cells that pass the test (``*`` on a console).

    >>> print(method_text({1}))  # doctest: +NORMALIZE_WHITESPACE
    Cells: mean ± half-width of the 95 % confidence interval (percentile bootstrap, 1000 replicates, RNG seed 0:
    1 seed, so over test queries only; NMI and other per-run numbers: no interval with 1 seed), in percent
    for evaluation metrics. Bold: not significantly worse than the column's best mean (one-sided paired
    bootstrap test on the same resampled seeds, matched by seed index, and queries, α = 0.05).
    """
    return (
        f"{interval_text(seed_counts)} "
        f"{bold_name}: not significantly worse than the column's best mean (one-sided paired bootstrap test on the "
        f"same resampled seeds, matched by seed index, and queries, α = {ALPHA})."
    )
