"""MAP@R and R-precision (Musgrave et al., "A Metric Learning Reality Check", 2020).

For a query with R relevant database items (same label, the query itself
excluded), look at its first R neighbours:

* R-precision = (number of relevant items among them) / R;
* AP@R = (1/R) Σ_{i ≤ R} P(i) · rel(i), with P(i) the precision of the first i
  neighbours and rel(i) whether the i-th neighbour is relevant.

These are the definitions of pytorch-metric-learning's ``AccuracyCalculator``
(``r_precision``, ``mean_average_precision_at_r``).
"""

from __future__ import annotations

import numpy as np


def _hits_within_r(relevance: np.ndarray, r: np.ndarray) -> np.ndarray:
    """(c, k) bool: relevant neighbours at ranks ≤ R of their query."""
    ranks = np.arange(1, relevance.shape[1] + 1)
    return relevance & (ranks[None, :] <= r[:, None])


def average_precision_at_r(relevance: np.ndarray, r: np.ndarray) -> np.ndarray:
    """AP@R of each query.

    Args:
        relevance: (c, k) bool, True where the neighbour at that rank has the
            query's label; k ≥ max(r).
        r: (c,) int ≥ 1, number of relevant items in the database per query.

    Returns:
        (c,) float64 in [0, 1].

    Query with R = 3 whose ranking is (hit, miss, hit): (1/1 + 2/3) / 3 = 5/9.

    >>> average_precision_at_r(np.array([[True, False, True, True]]), np.array([3]))
    array([0.55555556])
    """
    hits = _hits_within_r(relevance, r)
    precision = np.cumsum(hits, axis=1) / np.arange(1, hits.shape[1] + 1)
    return (precision * hits).sum(axis=1) / r


def r_precision(relevance: np.ndarray, r: np.ndarray) -> np.ndarray:
    """R-precision of each query: share of relevant items among its first R neighbours.

    Args:
        relevance: (c, k) bool as in :func:`average_precision_at_r`.
        r: (c,) int ≥ 1.

    Returns:
        (c,) float64 in [0, 1].

    >>> r_precision(np.array([[True, False, True, True], [False, True, False, False]]), np.array([3, 1]))
    array([0.66666667, 0.        ])
    """
    return _hits_within_r(relevance, r).sum(axis=1) / r
