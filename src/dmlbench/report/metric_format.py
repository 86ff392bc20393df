"""How a metrics.json key is shown in a table: header, scale, decimals, whether the best is bold."""

from __future__ import annotations

import math
from dataclasses import dataclass

from .collect import METRIC_KEY


@dataclass(frozen=True)
class MetricFormat:
    """Display of one metric column.

    Attributes:
        header: the column header (plain text; escaped by the renderer).
        scale: stored value × scale = displayed value (100 for fractions shown in percent).
        decimals: decimals shown.
        bold_best: whether the highest displayed mean of the column is bold (only for
            higher-is-better evaluation metrics).
    """

    header: str
    scale: float
    decimals: int
    bold_best: bool

    def text(self, value: float) -> str:
        """``value`` scaled and rounded as displayed."""
        return f"{self.scale * value:.{self.decimals}f}"

    def estimate(self, mean: float, low: float, high: float, plus_minus: str = "±") -> str:
        """An estimate as every table shows it: ``mean ± half-width`` of its interval [``low``, ``high``] (stored
        units), or the mean alone when ``low`` is NaN (no interval: one seed of a per-run number, a fixed value).

        >>> metric_format("R@1").estimate(0.613, 0.609, 0.617), metric_format("R@1").estimate(0.5, math.nan, math.nan)
        ('61.3 ± 0.4', '50.0')
        """
        text = self.text(mean)
        return text if math.isnan(low) else f"{text} {plus_minus} {self.text((high - low) / 2)}"

    def interval(self, low: float, high: float) -> str:
        """The bounds of an interval (stored units) as displayed.

        >>> metric_format("R@1").interval(-0.0123, 0.0456)
        '[-1.2, 4.6]'
        """
        return f"[{self.text(low)}, {self.text(high)}]"


#: Non-metric keys with a fixed display; any other key is shown as stored with 3 decimals.
_SPECIAL = {
    "num_parameters": MetricFormat("Params (M)", 1e-6, 2, False),
    "gflops": MetricFormat("GFLOPs", 1.0, 2, False),
    "self_similarity": MetricFormat("Self-pair sim.", 1.0, 3, False),
    "clustering_share": MetricFormat("Clustering (% time)", 100.0, 1, False),
}


def metric_format(key: str) -> MetricFormat:
    """The display of a metrics.json key.

    >>> metric_format("R@1")
    MetricFormat(header='R@1', scale=100.0, decimals=1, bold_best=True)
    >>> metric_format("learners_mean/R@1").header, metric_format("learner3/NMI").header
    ('R@1 (learners, mean)', 'NMI (learner 3)')
    >>> metric_format("test_selected/R@1").header
    'R@1 (test-selected epoch)'
    >>> metric_format("num_parameters").text(6_123_456)
    '6.12'
    """
    if key in _SPECIAL:
        return _SPECIAL[key]
    if METRIC_KEY.match(key):
        prefix, _, name = key.rpartition("/")
        if prefix == "learners_mean":
            header = f"{name} (learners, mean)"
        elif prefix == "test_selected":
            header = f"{name} (test-selected epoch)"
        elif prefix.startswith("learner") and prefix[7:].isdigit():
            header = f"{name} (learner {prefix[7:]})"
        else:
            header = f"{name} ({prefix})" if prefix else name
        return MetricFormat(header, 100.0, 1, True)
    return MetricFormat(key.replace("_", " "), 1.0, 3, False)


#: What each evaluation metric is (captions define the columns a table shows; keys: the name after any view
#: prefix, R@K for every K).
DEFINITIONS = {
    "R@K": "R@K: share of the test queries with an item of their class among their K nearest neighbours",
    "NMI": "NMI: normalised mutual information of the classes and a K-means clustering of the test embeddings "
    "(K = the number of classes)",
    "MAP@R": "MAP@R: mean over the queries of the average precision of their R nearest neighbours "
    "(Musgrave et al., 2020)",
    "RP": "RP: R-precision, the share of a query's R nearest neighbours that are of its class",
}
#: Appended to the definitions when MAP@R or RP is among them.
R_DEFINITION = "R: the number of items of the query's class in the searched set (the other test images, or the gallery)"

#: Appended when a column is a ``test_selected/`` metric
#: (:func:`dmlbench.training.trainer.paper_protocol_selection`).
TEST_SELECTED_DEFINITION = (
    "test-selected epoch: the best of the per-epoch test R@1 (the papers' protocol: "
    "the epoch picked on the test set); every other column is of the epoch picked on the "
    "validation classes"
)


def metric_definitions(keys: list[str]) -> str:
    """A plain-text sentence defining the evaluation metrics among ``keys`` (in :data:`DEFINITIONS`' order;
    view prefixes dropped); empty when there are none.

    >>> print(metric_definitions(["R@1", "R@2", "learner0/RP", "num_parameters"]))  # doctest: +ELLIPSIS
    Columns: R@K: share of ... neighbours; RP: R-precision, ... of its class; R: the number ... the gallery).
    """
    names = set()
    for key in keys:
        match = METRIC_KEY.match(key)
        if match:
            names.add("R@K" if match.group(2).startswith("R@") else match.group(2))
    shown = [text for name, text in DEFINITIONS.items() if name in names]
    if names & {"MAP@R", "RP"}:
        shown.append(R_DEFINITION)
    if any(key.startswith("test_selected/") for key in keys):
        shown.append(TEST_SELECTED_DEFINITION)
    return f"Columns: {'; '.join(shown)}." if shown else ""
