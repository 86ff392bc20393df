"""What a comparison table (and its plots) shows: datasets, methods, metrics, labels."""

from __future__ import annotations

from dataclasses import dataclass, field

from .styles import Style, Styles

#: The files of one table (a comparison table, the claims table), same name, these suffixes.
TABLE_SUFFIXES = (".tex", ".csv", ".md", ".html")


@dataclass(frozen=True)
class TableSpec:
    """Layout of one comparison table.

    Attributes:
        datasets: column groups, in order (dataset keys, e.g. ``cub200``).
        methods: rows, in order (method keys, e.g. ``margin``).
        metrics: per dataset, the metric keys shown (e.g. ``["R@1", "R@2", "NMI"]``).
        dataset_labels: display names (e.g. ``cub200`` -> ``CUB-200-2011``); the key when absent.
        method_labels: display names of the methods; the key when absent.
        references: the methods that are reference rows (``recipe: reference``: nothing trained); the plots
            draw them apart (dashed, grey) and fit their axes to the trained methods.
        method_styles: the project's style of each method (:meth:`~.styles.Styles.from_config`), so that a
            method looks the same in every plot of the project; methods without one get styles distinct from
            these (in table order).
    """

    datasets: list[str]
    methods: list[str]
    metrics: dict[str, list[str]]
    dataset_labels: dict[str, str] = field(default_factory=dict)
    method_labels: dict[str, str] = field(default_factory=dict)
    references: list[str] = field(default_factory=list)
    method_styles: dict[str, Style] = field(default_factory=dict)

    def __post_init__(self) -> None:
        if not self.datasets or not self.methods:
            raise ValueError("TableSpec needs at least one dataset and one method")
        for name, values in (("datasets", self.datasets), ("methods", self.methods)):
            duplicates = sorted({v for v in values if values.count(v) > 1})
            if duplicates:
                raise ValueError(f"TableSpec.{name} lists {duplicates} more than once")
        outside = sorted(set(self.references) - set(self.methods))
        if outside:
            raise ValueError(f"TableSpec.references names {outside}, which are not among its methods")
        for dataset in self.datasets:
            metrics = self.metrics.get(dataset)
            if not metrics:
                raise ValueError(f"TableSpec.metrics has no metric list for dataset '{dataset}'")
            if len(set(metrics)) != len(metrics):
                raise ValueError(f"TableSpec.metrics['{dataset}'] repeats a metric: {metrics}")

    def dataset_label(self, dataset: str) -> str:
        """Display name of a dataset."""
        return self.dataset_labels.get(dataset, dataset)

    def method_label(self, method: str) -> str:
        """Display name of a method."""
        return self.method_labels.get(method, method)

    def styles(self) -> Styles:
        """Colour, marker and line style of each method (:mod:`.styles`)."""
        return Styles(references=self.references, fixed=self.method_styles).including(self.methods)

    def is_reference(self, method: str) -> bool:
        """Whether ``method`` is a reference row."""
        return method in self.references
