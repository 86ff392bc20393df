"""Recall@K from the rank of each query's first relevant neighbour."""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np


def first_hit_rank(relevance: np.ndarray) -> np.ndarray:
    """0-based rank of the first relevant neighbour of each query; k where there is none.

    Args:
        relevance: (c, k) bool, ``relevance[q, i]`` is True when the (i+1)-th
            nearest neighbour of query q has the query's label.

    Returns:
        (c,) int64 in [0, k].

    >>> first_hit_rank(np.array([[True, False, True], [False, False, True], [False, False, False]]))
    array([0, 2, 3])
    """
    return np.where(relevance.any(axis=1), relevance.argmax(axis=1), relevance.shape[1]).astype(np.int64)


def recall_from_ranks(first_ranks: np.ndarray, ks: Sequence[int]) -> list[float]:
    """Recall@K for each K: the fraction of queries whose first relevant neighbour has rank < K (0-based).

    Args:
        first_ranks: (Q,) int, from :func:`first_hit_rank` (any value ≥ max(ks) means no hit).
        ks: the K values.

    Returns:
        One fraction in [0, 1] per K.

    >>> recall_from_ranks(np.array([0, 2, 3, 1]), [1, 2, 3])
    [0.25, 0.5, 0.75]
    """
    return [float(np.count_nonzero(first_ranks < k) / len(first_ranks)) for k in ks]
