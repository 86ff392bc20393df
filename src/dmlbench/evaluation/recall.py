"""Recall@K from per-query relevance of the ranked neighbours."""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np


def recall_hits(relevance: np.ndarray, ks: Sequence[int]) -> np.ndarray:
    """Whether each query has a same-label item among its first K neighbours, for each K.

    Args:
        relevance: (c, k) bool, ``relevance[q, i]`` is True when the (i+1)-th
            nearest neighbour of query q has the query's label; k ≥ max(ks).
        ks: the K values.

    Returns:
        (c, len(ks)) bool.

    >>> relevance = np.array([[True, False, False], [False, False, True], [False, False, False]])
    >>> recall_hits(relevance, [1, 2, 3]).astype(int)
    array([[1, 1, 1],
           [0, 0, 1],
           [0, 0, 0]])
    """
    first_hit = np.where(relevance.any(axis=1), relevance.argmax(axis=1), relevance.shape[1])
    return first_hit[:, None] < np.asarray(ks)[None, :]
