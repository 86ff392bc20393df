"""How a metrics.json key is shown in a table: header, scale, decimals, whether the best is bold."""

from __future__ import annotations

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
    >>> metric_format("num_parameters").text(6_123_456)
    '6.12'
    """
    if key in _SPECIAL:
        return _SPECIAL[key]
    if METRIC_KEY.match(key):
        prefix, _, name = key.rpartition("/")
        if prefix == "learners_mean":
            header = f"{name} (learners, mean)"
        elif prefix.startswith("learner") and prefix[7:].isdigit():
            header = f"{name} (learner {prefix[7:]})"
        else:
            header = f"{name} ({prefix})" if prefix else name
        return MetricFormat(header, 100.0, 1, True)
    return MetricFormat(key.replace("_", " "), 1.0, 3, False)
