"""``similarity_histogram``: cosine similarity of positive, negative and self pairs (ABE Fig. 5).

Spec: ``methods`` (keys); the first of the figure's ``seeds`` is used. One panel per method
with three normalised histograms over [−1, 1], from the test embeddings:

- positive pairs: two images of the same class, one learner's embeddings;
- negative pairs: two images of different classes, one learner's embeddings;
- self pairs: two different learners' embeddings of the same image (multi-learner models only).

Positive and negative pairs are a seeded random sample (:data:`PAIRS_PER_KIND` of each), not
all N² pairs; for a multi-learner model they are drawn per learner and pooled.
"""

from __future__ import annotations

from collections.abc import Mapping
from pathlib import Path
from typing import Any, cast

import numpy as np

from dmlbench.evaluation.evaluate import l2_normalise
from dmlbench.evaluation.files import load_embeddings_npz
from dmlbench.layout import EMBEDDINGS_FILE, run_file
from dmlbench.report.plots import _plain, _save, _style_context

from .common import check_methods, figure_seeds, method_label, panel_grid, require, title_of

PAIRS_PER_KIND = 20_000
BINS = np.linspace(-1.0, 1.0, 81)
PAIR_KINDS = ("positive", "negative", "self")
_COLORS = {"positive": "#2ca02c", "negative": "#d62728", "self": "#1f77b4"}


def check(config: Mapping[str, Any], spec: Mapping[str, Any], where: str) -> None:
    require(spec, ("methods",), where)
    check_methods(config, spec["methods"], f"{where}.methods")


def inputs(config: Mapping[str, Any], spec: Mapping[str, Any]) -> list[str]:
    seed = figure_seeds(config, spec)[0]
    return [run_file(spec["dataset"], m, seed, EMBEDDINGS_FILE) for m in spec["methods"]]


def sample_pairs(
    labels: np.ndarray, positive: bool, count: int, rng: np.random.Generator
) -> tuple[np.ndarray, np.ndarray]:
    """``count`` random index pairs (i ≠ j) of the same class (``positive``) or of different classes.

    Args:
        labels: (N,) int labels; some class needs ≥ 2 items for positives, ≥ 2 classes for negatives.

    Returns:
        Two (count,) int arrays.

    >>> i, j = sample_pairs(np.array([0, 0, 1, 1, 1]), True, 50, np.random.default_rng(0))
    >>> bool(np.all(i != j)) and bool(np.all(np.array([0, 0, 1, 1, 1])[i] == np.array([0, 0, 1, 1, 1])[j]))
    True
    """
    order = np.argsort(labels, kind="stable")
    sorted_labels = labels[order]
    starts = np.searchsorted(sorted_labels, sorted_labels, side="left")
    sizes = np.searchsorted(sorted_labels, sorted_labels, side="right") - starts
    if positive:
        eligible = np.flatnonzero(sizes >= 2)
        if len(eligible) == 0:
            raise ValueError("no class has two items: no positive pairs")
        a = eligible[rng.integers(len(eligible), size=count)]
        offset = rng.integers(1, sizes[a])  # another member of the class, never itself
        b = starts[a] + (a - starts[a] + offset) % sizes[a]
        return order[a], order[b]
    if len(np.unique(labels)) < 2:
        raise ValueError("a single class: no negative pairs")
    a = rng.integers(len(labels), size=count)
    outside = len(labels) - sizes[a]
    pick = rng.integers(0, outside)  # the pick-th item outside a's class block
    b = np.where(pick < starts[a], pick, pick + sizes[a])
    return order[a], order[b]


def pair_similarities(arrays: Mapping[str, np.ndarray], rng: np.random.Generator) -> dict[str, np.ndarray]:
    """Cosine similarities of sampled positive/negative pairs and of all self pairs of one run."""
    x = np.asarray(arrays["embeddings"], dtype=np.float32)
    labels = np.asarray(arrays["labels"])
    slices = [tuple(s) for s in arrays["learner_slices"]] if "learner_slices" in arrays else [(0, x.shape[1])]
    views = [l2_normalise(x[:, a:b]) for a, b in slices]
    result: dict[str, list[np.ndarray]] = {kind: [] for kind in PAIR_KINDS}
    per_view = max(1, PAIRS_PER_KIND // len(views))
    for view in views:
        for kind, positive in (("positive", True), ("negative", False)):
            i, j = sample_pairs(labels, positive, per_view, rng)
            result[kind].append(np.einsum("nd,nd->n", view[i], view[j]))
    if len({b - a for a, b in slices}) == 1:
        for m in range(len(views)):
            for n in range(m + 1, len(views)):
                result["self"].append(np.einsum("nd,nd->n", views[m], views[n]))
    return {kind: np.concatenate(values) if values else np.empty(0) for kind, values in result.items()}


def render(config: Mapping[str, Any], spec: Mapping[str, Any], out_png: Path) -> None:
    methods = list(spec["methods"])
    files = inputs(config, spec)
    handles: dict[str, Any] = {}
    with _style_context():
        fig, axes = panel_grid(len(methods))
        for ax, method, path in zip(axes, methods, files, strict=False):
            similarities = pair_similarities(load_embeddings_npz(path), np.random.default_rng(0))
            for kind in PAIR_KINDS:
                if len(similarities[kind]):
                    _, _, patches = ax.hist(
                        similarities[kind],
                        bins=BINS.tolist(),
                        density=True,
                        histtype="stepfilled",
                        alpha=0.45,
                        color=_COLORS[kind],
                        label=kind,
                    )
                    handles[kind] = cast(list, patches)[0]  # "stepfilled", one data set: [Polygon]
                    ax.axvline(float(similarities[kind].mean()), color=_COLORS[kind], linewidth=1.0, linestyle="--")
            ax.set(
                title=_plain(method_label(config, method)), xlabel="cosine similarity", ylabel="density", xlim=(-1, 1)
            )
        fig.suptitle(_plain(title_of(config, spec)), wrap=True)
        kinds = [k for k in PAIR_KINDS if k in handles]
        _save(fig, [handles[k] for k in kinds], [f"{k} pairs" for k in kinds], out_png)
