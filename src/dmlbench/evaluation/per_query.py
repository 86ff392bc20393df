"""Per-query retrieval results of a run (``per_query.npz`` beside ``metrics.json``).

The report's confidence intervals and significance tests resample test queries, so ``dmlbench
evaluate`` saves, for every query that the retrieval metrics average over (lone queries, with no
other item of their class in the database, are left out as in ``metrics.json``):

- ``row`` (Q,) int64: the query's row in ``embeddings.npz``;
- ``label`` (Q,) int64: its class label;
- ``num_relevant`` (Q,) int64: R, the database items of its class (itself excluded);
- ``first_hit_rank`` (Q,) int64: the 1-based rank of its first same-class neighbour among the
  database (the gallery, or all other items; the query itself excluded), exact at any depth;
- ``ap_at_r`` (Q,) float64 and ``r_precision`` (Q,) float64: its AP@R and R-precision;
- the last three again as ``<view>/first_hit_rank`` ... for each learner (``learner<m>/``) and named
  view (``<name>/``) that ``metrics.json`` reports.

So ``R@K`` = mean(first_hit_rank ≤ K), ``MAP@R`` = mean(ap_at_r) and ``RP`` = mean(r_precision),
with the same view prefixes; :func:`metric_values` gives those per-query values of a metrics key.
"""

from __future__ import annotations

import re
from collections.abc import Mapping

import numpy as np

from dmlbench.evaluation.retrieval import QueryResults, RetrievalTask

#: A metrics.json key with a per-query decomposition: optional view prefix, then R@K, MAP@R or RP.
#: ``learners_mean/`` is an average over learners of per-run numbers and has none, nor has ``test_selected/``
#: (the best per-epoch test R@1 of the training log: :func:`dmlbench.training.trainer.paper_protocol_selection`).
DECOMPOSABLE = re.compile(r"^(?!learners_mean/|test_selected/)((?:[a-z0-9_]+/)?)(R@(\d+)|MAP@R|RP)$")

_ARRAY_OF = {"MAP@R": "ap_at_r", "RP": "r_precision"}


def per_query_arrays(task: RetrievalTask, views: Mapping[str, QueryResults]) -> dict[str, np.ndarray]:
    """The arrays of a ``per_query.npz`` (module docstring) from a task and each view's results.

    Args:
        task: the queries evaluated.
        views: key prefix (``""`` for the full embedding, ``"learner0/"``, ...) → that view's results,
            computed with AP@R and R-precision.
    """
    arrays = {
        "row": task.query_rows.astype(np.int64),
        "label": task.query_labels.astype(np.int64),
        "num_relevant": task.relevant_counts.astype(np.int64),
    }
    for prefix, results in views.items():
        arrays[f"{prefix}first_hit_rank"] = results.first_hit_rank.astype(np.int64)
        arrays[f"{prefix}ap_at_r"] = np.asarray(results.ap_at_r, dtype=np.float64)
        arrays[f"{prefix}r_precision"] = np.asarray(results.r_precision, dtype=np.float64)
    return arrays


def metric_values(arrays: Mapping[str, np.ndarray], metric: str) -> np.ndarray | None:
    """Per-query values of a metrics.json key, whose mean over the queries is that key's value.

    Args:
        arrays: the arrays of a ``per_query.npz``.
        metric: e.g. ``R@4`` (→ first_hit_rank ≤ 4, as 0/1), ``learner1/MAP@R`` (→ learner1/ap_at_r).

    Returns:
        (Q,) float64, or None when the key has no per-query decomposition (NMI, ``learners_mean/``,
        model statistics).

    Raises:
        KeyError: the key is decomposable but ``arrays`` lacks its array (the missing array's name).

    >>> arrays = {"row": np.arange(3), "first_hit_rank": np.array([1, 3, 2])}
    >>> metric_values(arrays, "R@2"), metric_values(arrays, "NMI"), metric_values(arrays, "test_selected/R@1")
    (array([1., 0., 1.]), None, None)
    """
    match = DECOMPOSABLE.match(metric)
    if match is None:
        return None
    prefix, name, k = match.groups()
    values = arrays[prefix + ("first_hit_rank" if k else _ARRAY_OF[name])]
    return (values <= int(k)).astype(np.float64) if k else values.astype(np.float64)
