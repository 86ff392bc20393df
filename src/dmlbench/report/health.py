"""Which table cells come from runs whose mechanism did not engage.

The checks are each recipe's :meth:`~dmlbench.methods.base.Recipe.health_checks`
(:mod:`dmlbench.methods.health`), applied to every seed's ``metrics.json``. A
(dataset, method) with at least one failing seed is *dead*: its cells carry a
dagger and the caption lists the failed bounds, so a number that a switched-off
mechanism produced cannot pass for the method's result.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence

import pandas as pd

from dmlbench.methods.health import HealthCheck, failed_checks

from .latex import escape_latex
from .spec import TableSpec

Cell = tuple[str, str]


def dead_cells(results: pd.DataFrame, checks: Mapping[Cell, Sequence[HealthCheck]]) -> dict[Cell, list[str]]:
    """Failed checks per (dataset, method), each as ``"seed <k>: <failure>"``.

    Args:
        results: long results (:func:`~dmlbench.report.collect.collect_runs`).
        checks: the health checks of each (dataset, method); cells without checks are never dead.

    Returns:
        Only the (dataset, method) pairs with at least one failing seed.

    >>> frame = pd.DataFrame({"dataset": ["s", "s"], "method": ["m", "m"], "seed": [0, 1],
    ...                       "metric": ["health/x", "health/x"], "value": [0.5, 0.01]})
    >>> dead_cells(frame, {("s", "m"): [HealthCheck("health/x", minimum=0.1, meaning="dead")]})
    {('s', 'm'): ['seed 1: health/x >= 0.1 (got 0.01): dead']}
    """
    dead: dict[Cell, list[str]] = {}
    for (dataset, method, seed), run in results.groupby(["dataset", "method", "seed"], sort=True):
        cell_checks = checks.get((dataset, method), ())
        metrics = dict(zip(run["metric"], run["value"], strict=True))
        for failure in failed_checks(cell_checks, metrics):
            dead.setdefault((dataset, method), []).append(f"seed {seed}: {failure}")
    return dead


def dead_caption(dead: Mapping[Cell, Sequence[str]], spec: TableSpec) -> str:
    """The caption sentence that explains the daggers (empty when no cell is dead).

    >>> spec = TableSpec(datasets=["s"], methods=["m"], metrics={"s": ["R@1"]})
    >>> print(dead_caption({("s", "m"): ["seed 1: health/x >= 0.1 (got 0.01): dead"]}, spec))
    $\\dag$: the method's mechanism did not engage (mechanism-health checks, docs/methods): m on s: seed 1: health/x \\textgreater{}= 0.1 (got 0.01): dead.
    """
    if not dead:
        return ""
    parts = [
        f"{escape_latex(spec.method_label(method))} on {escape_latex(spec.dataset_label(dataset))}: "
        + "; ".join(escape_latex(failure) for failure in dead[(dataset, method)])
        for dataset in spec.datasets
        for method in spec.methods
        if (dataset, method) in dead
    ]
    return (
        "$\\dag$: the method's mechanism did not engage (mechanism-health checks, docs/methods): "
        + "; ".join(parts)
        + "."
    )
