"""``cluster_distances``: distances of negative pairs within vs across clusters (D&C Fig. 7/8).

Spec: ``methods`` (keys), ``clusters`` (K ≥ 2, e.g. the D&C run's ``num_clusters``); the first
of the figure's ``seeds`` is used. One panel per method, from its test embeddings
(``embeddings.npz``): the full embedding is L2-normalised, clustered by faiss K-means
into K clusters (seed 0, 100 iterations), and a seeded random sample of pairs of
different classes is split into *intra-cluster* (same cluster) and *inter-cluster*
pairs; the panel shows the two normalised histograms of their Euclidean distances
(in [0, 2]) with their means dashed. The paper draws the training data of its
clustering; only the test embeddings are a workflow output, so the test set is
clustered here (the question — are negatives inside a cluster harder? — is the same).
"""

from __future__ import annotations

from collections.abc import Mapping
from pathlib import Path
from typing import Any, cast

import numpy as np

from dmlbench.config import ConfigError
from dmlbench.evaluation.clustering import KMeansSettings, kmeans_assignments
from dmlbench.evaluation.evaluate import l2_normalise
from dmlbench.evaluation.files import load_embeddings_npz
from dmlbench.layout import EMBEDDINGS_FILE, run_file
from dmlbench.report.plots import _plain, _save, _style_context

from .common import check_methods, figure_seeds, method_label, panel_grid, require, title_of

#: random pairs drawn per method (the negatives among them are kept).
PAIR_DRAWS = 200_000
BINS = np.linspace(0.0, 2.0, 81)
KINDS = ("intra", "inter")
_LABELS = {"intra": "negatives, same cluster", "inter": "negatives, different clusters"}
_COLORS = {"intra": "#d62728", "inter": "#2ca02c"}
KMEANS = KMeansSettings(seed=0, niter=100, nredo=1)


def check(config: Mapping[str, Any], spec: Mapping[str, Any], where: str) -> None:
    require(spec, ("methods", "clusters"), where)
    check_methods(config, spec["methods"], f"{where}.methods")
    clusters = spec["clusters"]
    if isinstance(clusters, bool) or not isinstance(clusters, int) or clusters < 2:
        raise ConfigError(f"{where}.clusters must be an integer ≥ 2, got {clusters!r}")


def inputs(config: Mapping[str, Any], spec: Mapping[str, Any]) -> list[str]:
    seed = figure_seeds(config, spec)[0]
    return [run_file(spec["dataset"], m, seed, EMBEDDINGS_FILE) for m in spec["methods"]]


def negative_pair_distances(
    embeddings: np.ndarray, labels: np.ndarray, clusters: np.ndarray, draws: int, rng: np.random.Generator
) -> dict[str, np.ndarray]:
    """Euclidean distances of sampled negative pairs, split by whether both ends share a cluster.

    Args:
        embeddings: (N, d) float32 rows.
        labels: (N,) class labels; clusters: (N,) cluster ids.
        draws: pairs (i ≠ j, uniform) drawn; only those of different classes are kept.

    Returns:
        ``{"intra": (n1,), "inter": (n2,)}`` float32 distances.

    >>> x = np.array([[0.0], [0.1], [5.0], [5.2]], dtype=np.float32)
    >>> d = negative_pair_distances(x, np.arange(4), np.array([0, 0, 1, 1]), 400, np.random.default_rng(0))
    >>> bool(d["intra"].max() < 0.25 < 4.8 < d["inter"].min())
    True
    """
    n = len(labels)
    i = rng.integers(n, size=draws)
    j = (i + rng.integers(1, n, size=draws)) % n
    negative = labels[i] != labels[j]
    i, j = i[negative], j[negative]
    distances = np.linalg.norm(embeddings[i] - embeddings[j], axis=1)
    same = clusters[i] == clusters[j]
    return {"intra": distances[same], "inter": distances[~same]}


def render(config: Mapping[str, Any], spec: Mapping[str, Any], out_png: Path) -> None:
    methods = list(spec["methods"])
    handles: dict[str, Any] = {}
    with _style_context():
        fig, axes = panel_grid(len(methods))
        for ax, method, path in zip(axes, methods, inputs(config, spec), strict=False):
            arrays = load_embeddings_npz(path)
            x = np.ascontiguousarray(l2_normalise(np.asarray(arrays["embeddings"], dtype=np.float32)))
            clusters = kmeans_assignments(x, int(spec["clusters"]), KMEANS)
            distances = negative_pair_distances(
                x, np.asarray(arrays["labels"]), clusters, PAIR_DRAWS, np.random.default_rng(0)
            )
            for kind in KINDS:
                if len(distances[kind]):
                    _, _, patches = ax.hist(
                        distances[kind],
                        bins=BINS.tolist(),
                        density=True,
                        histtype="stepfilled",
                        alpha=0.45,
                        color=_COLORS[kind],
                    )
                    handles[kind] = cast(list, patches)[0]  # "stepfilled", one data set: [Polygon]
                    ax.axvline(float(distances[kind].mean()), color=_COLORS[kind], linewidth=1.0, linestyle="--")
            ax.set(
                title=_plain(method_label(config, method)),
                xlabel="Euclidean distance (unit-norm embedding)",
                ylabel="density",
                xlim=(0, 2),
            )
        fig.suptitle(_plain(f"{title_of(config, spec)} (K = {spec['clusters']} clusters)"), wrap=True)
        kinds = [k for k in KINDS if k in handles]
        _save(fig, [handles[k] for k in kinds], [_LABELS[k] for k in kinds], out_png)
