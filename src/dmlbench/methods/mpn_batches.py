"""Test-time batches for running the MPN at inference (Seidenschwarz et al. 2021, appendix C).

The MPN refines a node only inside a batch, so using it at test time needs batches built without
labels, from the backbone embeddings. Three constructions of the paper (Table 8):

- ``kmeans`` (C.1): K-means over-clustering of the embeddings; each cluster is cut into chunks of
  ``chunk_size`` images and batches are ``chunks_per_batch`` random chunks, like the P × K training
  batches. Every image is refined once, in its chunk's batch.
- ``nearest_neighbours`` (C.2): one chunk per image = the image (the anchor) and its
  ``chunk_size − 1`` nearest neighbours; batches of ``chunks_per_batch`` chunks in random order;
  only the anchors' refined features are kept.
- ``reciprocal_knn`` (C.3, Eq. 7): for each query q, its k-reciprocal set, expanded by the
  ½k-reciprocal sets of its members that overlap it enough (Eq. 7), cut or filled with q's nearest
  neighbours to exactly ``size`` nodes; the batch refines q alone.

Neighbour lists come from exact faiss kNN (:mod:`dmlbench.evaluation.knn`), never from a dense
N × N matrix (the authors' sampler builds one, which does not scale to SOP). A batch plan is a list
of :class:`GraphBatch` (graphs of equal size stacked), consumed by :func:`refine_in_batches`.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Sequence
from dataclasses import dataclass

import numpy as np
import torch
import torch.nn.functional as F

from dmlbench.evaluation.knn import make_index, search

#: queries per faiss search call (peak memory: chunk × k neighbour ids).
KNN_CHUNK = 4096


@dataclass(frozen=True)
class GraphBatch:
    """G graphs of n nodes each, refined together.

    Attributes:
        nodes: (G, n) int64 rows of the embedding matrix forming each graph.
        outputs: (G, n) int64: the row whose test embedding node j of graph g gives, or -1 (discarded).
    """

    nodes: np.ndarray
    outputs: np.ndarray

    def __post_init__(self) -> None:
        if self.nodes.ndim != 2 or self.nodes.shape != self.outputs.shape:
            raise ValueError(
                f"GraphBatch: nodes {self.nodes.shape} and outputs {self.outputs.shape} must be equal (G, n) arrays"
            )


def group_by_size(graphs: Sequence[tuple[np.ndarray, np.ndarray]]) -> list[GraphBatch]:
    """Stack (nodes (n,), outputs (n,)) graphs of equal n into :class:`GraphBatch` es (in order of first n)."""
    by_size: dict[int, list[tuple[np.ndarray, np.ndarray]]] = {}
    for nodes, outputs in graphs:
        by_size.setdefault(len(nodes), []).append((nodes, outputs))
    return [
        GraphBatch(
            np.stack([nodes for nodes, _ in group]).astype(np.int64),
            np.stack([outputs for _, outputs in group]).astype(np.int64),
        )
        for group in by_size.values()
    ]


def knn_ranking(embeddings: np.ndarray, k: int) -> np.ndarray:
    """The k nearest other rows of every row, nearest first (exact Euclidean, faiss, chunked queries).

    Args:
        embeddings: (N, d) float32.
        k: 1 ≤ k ≤ N − 1.

    Returns:
        (N, k) int64.
    """
    points = np.ascontiguousarray(embeddings, dtype=np.float32)
    if not 1 <= k <= len(points) - 1:
        raise ValueError(f"cannot rank {k} neighbours among {len(points)} test images")
    index = make_index(points, k + 1)
    rows = np.arange(len(points))
    return np.concatenate(
        [search(index, points, rows[i : i + KNN_CHUNK], k, exclude_self=True) for i in range(0, len(points), KNN_CHUNK)]
    ).astype(np.int64)


def reciprocal_sets(ranking: np.ndarray, k: int) -> list[np.ndarray]:
    """R(q, k) = {g ∈ N(q, k) : q ∈ N(g, k)} for every q, where N(q, k) = {q} ∪ its k nearest others.

    q belongs to its own set (Zhong et al. 2017 rank the probe itself first). Members are in q's
    neighbour order, q first.

    Args:
        ranking: (N, K) nearest other rows, nearest first, K ≥ k.
        k: neighbourhood size.

    Returns:
        N int64 arrays.
    """
    if ranking.shape[1] < k:
        raise ValueError(f"the ranking holds {ranking.shape[1]} neighbours per row, fewer than k = {k}")
    rows = np.arange(len(ranking))
    neighbourhoods = np.concatenate([rows[:, None], ranking[:, :k]], axis=1)  # (N, k + 1)
    sets: list[np.ndarray] = []
    for start in range(0, len(rows), KNN_CHUNK):
        block = neighbourhoods[start : start + KNN_CHUNK]  # (c, k + 1)
        backward = neighbourhoods[block]  # (c, k + 1, k + 1): the neighbourhood of each member
        reciprocal = (backward == rows[start : start + len(block), None, None]).any(axis=2)
        sets.extend(members[keep] for members, keep in zip(block, reciprocal))
    return sets


def reciprocal_knn_sets(
    ranking: np.ndarray, k: int, alpha: float, size: int, distances_to: Callable[[int, np.ndarray], np.ndarray]
) -> np.ndarray:
    """The expanded k-reciprocal batch of every query (appendix C.3, Eq. 7).

    For query q: R = R(q, k) (:func:`reciprocal_sets`); for each g ∈ R, its ½k-reciprocal set
    R(g, ⌈k/2⌉) joins when |R ∩ R(g, ⌈k/2⌉)| ≥ α |R(g, ⌈k/2⌉)| (Eq. 7). The expanded set,
    q first and the rest by increasing distance to q, is cut to ``size`` nodes; if smaller, q's
    nearest neighbours not yet in it fill it up. The authors' sampler uses k = 30, α = 2/3 with a
    strict ">" and the training batch size as ``size``; this follows the paper's "≥".

    Args:
        ranking: (N, K) nearest other rows, nearest first, K ≥ max(k, size − 1).
        k: neighbourhood size of the reciprocal sets.
        alpha: α ∈ [0, 1] of Eq. 7.
        size: k_r, nodes per batch, 1 ≤ size ≤ N.
        distances_to: (q, rows (m,)) → (m,) distances of those rows to q (for the ordering).

    Returns:
        (N, size) int64; row q holds q first, then its batch mates.
    """
    num, depth = ranking.shape
    if not 0.0 <= alpha <= 1.0:
        raise ValueError(f"alpha must be in [0, 1], got {alpha}")
    if not 1 <= size <= num:
        raise ValueError(f"a batch of {size} nodes needs 1..{num} test images")
    if depth < max(k, size - 1):
        raise ValueError(f"the ranking holds {depth} neighbours per row; need max(k, size - 1) = {max(k, size - 1)}")
    full = reciprocal_sets(ranking, k)
    half = reciprocal_sets(ranking, math.ceil(k / 2))
    batches = np.empty((num, size), dtype=np.int64)
    for q in range(num):
        core = full[q]
        expanded = set(core.tolist())
        for g in core:
            candidate = half[g]
            if len(np.intersect1d(core, candidate)) >= alpha * len(candidate):
                expanded.update(candidate.tolist())
        expanded.discard(q)
        others = np.array(sorted(expanded), dtype=np.int64)
        others = others[np.argsort(distances_to(q, others), kind="stable")][: size - 1]
        members = [q, *others.tolist()]
        chosen = set(members)
        for neighbour in ranking[q]:
            if len(members) == size:
                break
            if neighbour not in chosen:
                members.append(int(neighbour))
                chosen.add(int(neighbour))
        batches[q] = members
    return batches


def reciprocal_knn_batches(embeddings: np.ndarray, k: int, alpha: float, size: int) -> list[GraphBatch]:
    """:func:`reciprocal_knn_sets` on the embeddings (squared Euclidean distances); one graph per query."""
    size = min(size, len(embeddings))
    ranking = knn_ranking(embeddings, min(max(k, size - 1), len(embeddings) - 1))
    k = min(k, ranking.shape[1])

    def distances_to(q: int, rows: np.ndarray) -> np.ndarray:
        return ((embeddings[rows] - embeddings[q]) ** 2).sum(axis=1)

    nodes = reciprocal_knn_sets(ranking, k, alpha, size, distances_to)
    outputs = np.full_like(nodes, -1)
    outputs[:, 0] = nodes[:, 0]
    return [GraphBatch(nodes, outputs)]


def _batches_of_chunks(chunks: list[np.ndarray], anchors_only: bool, chunks_per_batch: int) -> list[GraphBatch]:
    """Consecutive groups of ``chunks_per_batch`` chunks → graphs; outputs: each chunk's first node, or all."""
    graphs = []
    for start in range(0, len(chunks), chunks_per_batch):
        group = chunks[start : start + chunks_per_batch]
        nodes = np.concatenate(group)
        if anchors_only:
            outputs = np.concatenate([np.r_[chunk[0], np.full(len(chunk) - 1, -1)] for chunk in group])
        else:
            outputs = nodes
        graphs.append((nodes, outputs))
    return group_by_size(graphs)


def nearest_neighbour_batches(
    embeddings: np.ndarray, chunk_size: int, chunks_per_batch: int, rng: np.random.Generator
) -> list[GraphBatch]:
    """Appendix C.2: chunk = anchor + its ``chunk_size − 1`` nearest neighbours, one per image, in random
    order, ``chunks_per_batch`` chunks per batch; each batch refines its anchors."""
    chunk_size = min(chunk_size, len(embeddings))
    ranking = knn_ranking(embeddings, chunk_size - 1) if chunk_size > 1 else np.empty((len(embeddings), 0), np.int64)
    chunks = [np.r_[a, ranking[a]] for a in rng.permutation(len(embeddings))]
    return _batches_of_chunks(chunks, anchors_only=True, chunks_per_batch=chunks_per_batch)


def cluster_batches(
    assignment: np.ndarray, chunk_size: int, chunks_per_batch: int, rng: np.random.Generator
) -> list[GraphBatch]:
    """Appendix C.1: cut each cluster (shuffled) into chunks of ≤ ``chunk_size`` images, shuffle the chunks,
    ``chunks_per_batch`` chunks per batch; every image is refined once, in its own batch.

    Args:
        assignment: (N,) cluster id of every image (e.g. K-means).
    """
    chunks: list[np.ndarray] = []
    for cluster in np.unique(assignment):
        members = rng.permutation(np.flatnonzero(assignment == cluster))
        chunks.extend(members[i : i + chunk_size] for i in range(0, len(members), chunk_size))
    order = rng.permutation(len(chunks))
    return _batches_of_chunks([chunks[i] for i in order], anchors_only=False, chunks_per_batch=chunks_per_batch)


def refine_in_batches(
    refine: Callable[[torch.Tensor], torch.Tensor],
    embeddings: np.ndarray,
    batches: Sequence[GraphBatch],
    device: torch.device,
    max_nodes: int = 16384,
) -> np.ndarray:
    """Run ``refine`` over every graph of the plan and collect the kept outputs, L2-normalised.

    Args:
        refine: (G, n, d) node features → (G, n, d) refined features (no gradient needed).
        embeddings: (N, d) float32 backbone embeddings (the node features).
        batches: the plan; every row 0..N-1 must be an output exactly once.
        device: where ``refine`` runs.
        max_nodes: graphs per call are limited to ``max_nodes`` nodes in all (memory bound).

    Returns:
        (N, d) float32 unit-norm rows.

    Raises:
        ValueError: the plan leaves a row out or outputs one twice.
    """
    num, dim = embeddings.shape
    result = np.zeros((num, dim), dtype=np.float32)
    count = np.zeros(num, dtype=np.int64)
    source = torch.from_numpy(np.ascontiguousarray(embeddings, dtype=np.float32))
    for batch in batches:
        per_call = max(1, max_nodes // batch.nodes.shape[1])
        for start in range(0, len(batch.nodes), per_call):
            nodes = batch.nodes[start : start + per_call]
            outputs = batch.outputs[start : start + per_call]
            refined = F.normalize(refine(source[torch.from_numpy(nodes)].to(device)).float(), dim=-1).cpu().numpy()
            keep = outputs >= 0
            result[outputs[keep]] = refined[keep]
            np.add.at(count, outputs[keep], 1)
    if (count != 1).any():
        bad = np.flatnonzero(count != 1)
        raise ValueError(
            f"the test-time batch plan refines row {bad[0]} {count[bad[0]]} times ({len(bad)} rows not exactly once)"
        )
    return result
