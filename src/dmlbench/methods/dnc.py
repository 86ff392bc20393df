"""Divide and Conquer the embedding space (``recipe: dnc``; Sanakoyeu et al., CVPR 2019, Algorithm 1).

Model: the backbone + :class:`~dmlbench.models.dnc.SplitLinearEmbedding`, i.e. the
d-dimensional embedding layer cut into K learners of d/K dimensions, each
L2-normalised; the test embedding is their concatenation (per-learner metrics
``learner{k}/R@K`` come from ``learner_slices``).

Training, per epoch (1-based) e:

1. *Divide* (e < ``finetune_epoch``): every T = ``recluster_every`` epochs (e = 1,
   1 + T, ...) the training set is embedded (test transform, no gradient) and
   clustered by faiss K-means into K clusters; the new cluster ids are matched to the
   previous ones by the Hungarian algorithm on the clusters' IoU (appendix A), so
   learner k keeps "its" data. Rows whose class has a single image in their cluster
   are left out for the period (the authors' code). Each batch is P × K images of *one*
   cluster, drawn uniformly over the clusters (§3.3, "we uniformly sample a cluster"; the
   authors' code alternates the clusters, which gives the same expected share);
   the loss of that cluster's learner, on its slice only, updates the shared backbone and
   that learner (the other learners get no gradient at all).
2. *Merge and fine-tune* (e ≥ ``finetune_epoch``): all data in one group, the loss on
   the full embedding (the concatenation re-normalised to unit length) trains the
   backbone and every learner.

Every switch point is explicit. The released code hides one: from epoch
``finetune_epoch × 8/19`` on it already applies the loss to the full embedding while
still drawing batches per cluster; ``full_embedding_loss_epoch`` reproduces that
(default: off, the paper's Algorithm 1).

Losses. Each learner has its own copy of ``methods.<name>.loss`` built for its slice
width (Proxy-NCA: d/K-dimensional proxies; margin: its own β), as the authors' code
keeps one criterion per cluster; the full-embedding phases use one more copy built
for d dimensions (the authors' code reuses cluster 0's criterion there, which only
works for dimension-free losses). With K = 1 there is a single copy and the recipe is
bit-identical to ``recipe: baseline`` with the same loss (tested).

Clustering space. Paper §3.2: the full embedding (``cluster_space: embedding``,
default). The released code clusters the L2-normalised pooled backbone features
instead (``cluster_space: backbone``) with ``nredo = 5``.

Data grouping ablations (paper Table 6, option ``grouping``): ``kmeans`` (the method);
``kmeans_no_split`` (batches from K-means clusters, but one unsplit embedding trained
on the full loss); ``random`` (a fixed uniformly random partition of the training rows,
drawn once from the run seed); ``class_families`` (a fixed partition by ground-truth
class groups: for ``synthetic`` the generator's families, otherwise the CSV named by
``class_groups_file``; groups are packed into the K clusters, largest first onto the
smallest cluster, so G ≥ K groups are needed).

Log columns: ``cluster_min`` / ``cluster_max`` (rows in the smallest / largest cluster
this epoch, dropped rows excluded), ``cluster_dropped`` (rows left out),
``clustering_seconds`` (embedding + K-means + matching this epoch). Summary
(metrics.json): ``clustering_seconds``, ``training_seconds`` (each epoch from its
start, clustering included, until its last batch was trained; validation excluded)
and ``clustering_share`` = their ratio (paper §4.4: ≈ 25 % for T = 2, 6 % for T = 8).
With ``training.num_workers`` > 0 the DataLoader prefetches indices, so an epoch's end
is seen up to ``2 × num_workers`` batches early.

Options (``methods.<name>.options``): see :class:`DivideAndConquerOptions`.
"""

from __future__ import annotations

import time
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from typing import Any, Literal

import numpy as np
import torch
import torch.nn.functional as F
from torch import nn

from dmlbench.data.dataset import ImageDataset
from dmlbench.evaluation.clustering import KMeansSettings
from dmlbench.losses import build_loss
from dmlbench.methods.base import Recipe, TrainContext
from dmlbench.methods.dnc_clustering import (
    ClusterBatchSampler,
    drop_singleton_classes,
    kmeans_clusters,
    match_clusters,
    pack_groups,
    random_partition,
    read_class_groups,
    synthetic_class_groups,
    training_class_groups,
)
from dmlbench.models.backbones import build_backbone
from dmlbench.models.dnc import SplitLinearEmbedding, learner_slices
from dmlbench.models.embedder import Embedder
from dmlbench.training.embedding import compute_embeddings
from dmlbench.training.seeding import derive_seed

_FAISS_SEEDS = 2**31 - 1


@dataclass(frozen=True)
class DivideAndConquerOptions:
    """``methods.<name>.options`` of ``recipe: dnc``.

    Attributes:
        num_clusters: K ≥ 1, number of clusters, and of learners when the embedding is split
            (every grouping but ``kmeans_no_split``); at most ``training.embedding_dim``. The
            paper: 4 (CUB, Cars), 8 (SOP, In-Shop, VehicleID). K = 1 is the baseline.
        recluster_every: T ≥ 1, epochs between two K-means clusterings (paper: 2).
        finetune_epoch: first epoch (1-based) of the merge-and-fine-tune phase, ≤
            ``training.epochs``; None: no fine-tune phase. The paper gives no value; the
            authors' config fine-tunes the second half (epoch 100 of 200).
        full_embedding_loss_epoch: first epoch from which the loss uses the full embedding
            while batches still come from the clusters (the released code's hidden switch at
            ``finetune_epoch × 8/19``); None: not before ``finetune_epoch`` (the paper).
        grouping: ``kmeans`` | ``kmeans_no_split`` | ``random`` | ``class_families`` (module
            docstring).
        cluster_space: ``embedding`` (the paper: the full embedding) or ``backbone`` (the
            released code: L2-normalised pooled backbone features).
        cluster_sampling: probability of drawing a cluster for a batch: ``uniform`` (the
            paper) or ``proportional`` to its number of rows.
        drop_singleton_classes: leave out rows whose class has a single image in their cluster.
        kmeans_niter: Lloyd iterations of each K-means (the authors: 100).
        kmeans_nredo: K-means restarts, the best objective kept (the authors' code: 5).
        class_groups_file: CSV grouping the classes for ``grouping: class_families`` on a
            dataset other than ``synthetic``: columns ``label`` (manifest label), the group
            column and optionally ``split`` (then only ``train`` rows are read).
        class_groups_column: name of the group column in that file.
    """

    num_clusters: int = 4
    recluster_every: int = 2
    finetune_epoch: int | None = None
    full_embedding_loss_epoch: int | None = None
    grouping: Literal["kmeans", "kmeans_no_split", "random", "class_families"] = "kmeans"
    cluster_space: Literal["embedding", "backbone"] = "embedding"
    cluster_sampling: Literal["uniform", "proportional"] = "uniform"
    drop_singleton_classes: bool = True
    kmeans_niter: int = 100
    kmeans_nredo: int = 1
    class_groups_file: str | None = None
    class_groups_column: str = "group"

    def __post_init__(self) -> None:
        for name in ("num_clusters", "recluster_every", "kmeans_niter", "kmeans_nredo"):
            if getattr(self, name) < 1:
                raise ValueError(f"{name} must be ≥ 1, got {getattr(self, name)}")
        for name in ("finetune_epoch", "full_embedding_loss_epoch"):
            value = getattr(self, name)
            if value is not None and value < 1:
                raise ValueError(f"{name} must be ≥ 1 (an epoch, 1-based) or null, got {value}")
        if (self.full_embedding_loss_epoch is not None and self.finetune_epoch is not None
                and self.full_embedding_loss_epoch > self.finetune_epoch):
            raise ValueError(f"full_embedding_loss_epoch ({self.full_embedding_loss_epoch}) must not come after "
                             f"finetune_epoch ({self.finetune_epoch})")

    @property
    def split_embedding(self) -> bool:
        """Whether each cluster trains its own slice of the embedding."""
        return self.grouping != "kmeans_no_split"


class DivideAndConquerLoss(nn.Module):
    """One loss per learner (for its slice width) and one for the full embedding.

    Args:
        learners: K losses, learner k's for its d_k-dimensional slice.
        full: the loss of the full d-dimensional embedding; None with a single learner,
            whose loss then serves both (the same parameters).
    """

    def __init__(self, learners: list[nn.Module], full: nn.Module | None):
        super().__init__()
        self.learners = nn.ModuleList(learners)
        self.merged = full

    @property
    def full(self) -> nn.Module:
        """The loss applied to the full (merged, unit-norm) embedding."""
        return self.learners[0] if self.merged is None else self.merged

    def forward(self, embeddings: torch.Tensor, labels: torch.Tensor) -> torch.Tensor:
        """Loss of the full embedding: embeddings (B, d) unit-norm, labels (B,) → scalar."""
        return self.full(embeddings, labels)


class _PooledFeatures(nn.Module):
    """The L2-normalised pooled backbone features of a model (the released code's clustering space)."""

    def __init__(self, model: nn.Module):
        super().__init__()
        self.model = model
        self.train(model.training)

    def forward(self, images: torch.Tensor) -> torch.Tensor:
        return F.normalize(self.model.backbone(images), dim=1)


class DivideAndConquerRecipe(Recipe):
    """``recipe: dnc`` — see the module docstring."""

    options_class = DivideAndConquerOptions
    options: DivideAndConquerOptions

    def __init__(self, run: Mapping[str, Any]):
        super().__init__(run)
        where = f"methods.{run.get('method', '?')}.options"
        o, epochs, dim = self.options, self.training["epochs"], self.training["embedding_dim"]
        if o.finetune_epoch is not None and o.finetune_epoch > epochs:
            raise ValueError(f"{where}.finetune_epoch = {o.finetune_epoch} is after the last epoch "
                             f"(training.epochs = {epochs}); lower it or set null for no fine-tune phase")
        if o.full_embedding_loss_epoch is not None and o.full_embedding_loss_epoch > epochs:
            raise ValueError(f"{where}.full_embedding_loss_epoch = {o.full_embedding_loss_epoch} is after the "
                             f"last epoch (training.epochs = {epochs})")
        if o.split_embedding and o.num_clusters > dim:
            raise ValueError(f"{where}.num_clusters = {o.num_clusters} exceeds training.embedding_dim = {dim}: "
                             "each learner needs at least one dimension")
        if o.grouping == "class_families" and o.class_groups_file is None \
                and run["dataset_config"].get("kind") != "synthetic":
            raise ValueError(f"{where}.class_groups_file is required for grouping 'class_families' on dataset "
                             f"{run.get('dataset')!r} (only 'synthetic' has built-in class families)")
        self.where = where
        self.num_learners = o.num_clusters if o.split_embedding else 1
        # (N,) int64 cluster of each training row from the last grouping (matched, before dropping).
        self.clusters: np.ndarray | None = None
        self.active: np.ndarray | None = None  # this epoch's clusters, dropped rows = -1
        self.learner_loss = True  # this epoch: loss on the batch's learner slice (else the full embedding)
        self.sampler: ClusterBatchSampler | None = None
        self.epoch_started = 0.0
        self.epoch_clustering = 0.0
        self.clustering_seconds = 0.0
        self.training_seconds = 0.0

    # --- model, loss ----------------------------------------------------------------------
    def build_model(self) -> nn.Module:
        """Backbone + :class:`SplitLinearEmbedding` with K learners (one for ``kmeans_no_split``)."""
        backbone = build_backbone(self.training["backbone"])
        head = SplitLinearEmbedding(backbone.out_channels["pool"], self.training["embedding_dim"], self.num_learners)
        return Embedder(backbone, head, learner_slices=head.slices if self.num_learners > 1 else None,
                        freeze_bn=self.training["backbone"].get("freeze_bn", False))

    def build_loss(self, num_classes: int) -> nn.Module:
        """One copy of ``methods.<name>.loss`` per learner slice, plus one for d dims when K > 1."""
        dim = self.training["embedding_dim"]
        slices = learner_slices(dim, self.num_learners)

        def make(width: int) -> nn.Module:
            return build_loss(self.method["loss"], num_classes=num_classes, embedding_dim=width)

        learners = [make(stop - start) for start, stop in slices]
        return DivideAndConquerLoss(learners, make(dim) if self.num_learners > 1 else None)

    # --- phases ---------------------------------------------------------------------------
    def in_finetune(self, epoch: int) -> bool:
        """Whether ``epoch`` belongs to the merge-and-fine-tune phase."""
        return self.options.finetune_epoch is not None and epoch >= self.options.finetune_epoch

    def _uses_learner_loss(self, epoch: int) -> bool:
        o = self.options
        late = o.full_embedding_loss_epoch is not None and epoch >= o.full_embedding_loss_epoch
        return o.split_embedding and not late and not self.in_finetune(epoch)

    def _needs_grouping(self, epoch: int) -> bool:
        if self.clusters is None:
            return True
        kmeans = self.options.grouping in ("kmeans", "kmeans_no_split") and self.options.num_clusters > 1
        return kmeans and (epoch - 1) % self.options.recluster_every == 0

    def _training_embeddings(self, model: nn.Module, context: TrainContext) -> np.ndarray:
        """(N, d) embeddings of the training rows (test transform) in the clustering space."""
        dataset: ImageDataset = context.data.train.with_transform(context.data.test.transform)
        module = model if self.options.cluster_space == "embedding" else _PooledFeatures(model)
        # The DataLoader draws a seed from torch's global RNG: keep the training stream untouched.
        with torch.random.fork_rng(devices=[]):
            return compute_embeddings(module, dataset, context.eval_batch_size, context.device)

    def _group(self, epoch: int, model: nn.Module, context: TrainContext) -> np.ndarray:
        """New (N,) cluster ids of the training rows for ``grouping``."""
        o, labels = self.options, context.data.train.labels
        if o.num_clusters == 1:
            return np.zeros(len(labels), dtype=np.int64)
        if o.grouping == "random":
            rng = np.random.default_rng(derive_seed(self.run["seed"], "dnc", "random_partition"))
            return random_partition(len(labels), o.num_clusters, rng)
        if o.grouping == "class_families":
            table = (synthetic_class_groups(self.run["dataset_config"]) if o.class_groups_file is None
                     else read_class_groups(o.class_groups_file, o.class_groups_column))
            groups = training_class_groups(table, context.data.train_classes)
            if len(np.unique(groups)) < o.num_clusters:
                raise ValueError(f"{self.where}.num_clusters = {o.num_clusters} but the training classes form only "
                                 f"{len(np.unique(groups))} groups; lower num_clusters")
            return pack_groups(groups[labels], o.num_clusters)
        settings = KMeansSettings(seed=derive_seed(self.run["seed"], "dnc", "kmeans", epoch) % _FAISS_SEEDS,
                                  niter=o.kmeans_niter, nredo=o.kmeans_nredo)
        clusters = kmeans_clusters(self._training_embeddings(model, context), o.num_clusters, settings)
        return clusters if self.clusters is None else match_clusters(self.clusters, clusters, o.num_clusters)

    # --- hooks ----------------------------------------------------------------------------
    def on_epoch_start(self, epoch: int, model: nn.Module, context: TrainContext) -> None:
        """Re-group the training rows when due (timed) and choose this epoch's loss."""
        self.epoch_started = time.perf_counter()
        self.epoch_clustering = 0.0
        labels = context.data.train.labels
        if self.in_finetune(epoch):
            self.active = np.zeros(len(labels), dtype=np.int64)
        else:
            if self._needs_grouping(epoch):
                self.clusters = self._group(epoch, model, context)
                self.epoch_clustering = time.perf_counter() - self.epoch_started
                self.clustering_seconds += self.epoch_clustering
            self.active = (drop_singleton_classes(self.clusters, labels)
                           if self.options.drop_singleton_classes and self.options.num_clusters > 1
                           else self.clusters)
        self.learner_loss = self._uses_learner_loss(epoch)

    def build_sampler(self, labels: np.ndarray, generator: torch.Generator) -> Iterable[list[int]]:
        """P × K batches, each from one cluster of this epoch (:class:`ClusterBatchSampler`)."""
        if self.active is None or len(self.active) != len(labels):
            raise RuntimeError("recipe dnc: build_sampler before on_epoch_start grouped the training rows")
        sampler = self.training["sampler"]
        self.sampler = ClusterBatchSampler(
            labels, self.active, sampler["classes_per_batch"], sampler["images_per_class"], generator,
            num_batches=sampler.get("batches_per_epoch"), weighting=self.options.cluster_sampling,
        )
        return self.sampler

    def batch_cluster(self, indices: torch.Tensor) -> int:
        """The cluster of a batch from its training-row indices (all rows share it)."""
        clusters = np.unique(self.active[indices.cpu().numpy()])
        if len(clusters) != 1 or clusters[0] < 0:
            raise RuntimeError(f"recipe dnc: a batch spans clusters {clusters.tolist()}; batches must come "
                               "from build_sampler")
        return int(clusters[0])

    def training_loss(self, model: nn.Module, loss: nn.Module, images: torch.Tensor, labels: torch.Tensor,
                      indices: torch.Tensor) -> torch.Tensor:
        """Learner k's loss on its slice for a batch of cluster k, else the full loss on the merged embedding."""
        features = model.backbone(images)
        if self.learner_loss:
            k = self.batch_cluster(indices)
            return loss.learners[k](model.head.learner(features, k), labels)
        return loss.full(model.head.merged(features), labels)

    def epoch_log(self) -> dict[str, float]:
        """``cluster_min``, ``cluster_max``, ``cluster_dropped``, ``clustering_seconds`` of this epoch."""
        finished = self.sampler.finished_at if self.sampler and self.sampler.finished_at else time.perf_counter()
        self.training_seconds += finished - self.epoch_started
        kept = self.active[self.active >= 0]
        sizes = np.bincount(kept, minlength=int(self.active.max()) + 1)
        return {"cluster_min": float(sizes.min()), "cluster_max": float(sizes.max()),
                "cluster_dropped": float(np.sum(self.active < 0)), "clustering_seconds": self.epoch_clustering}

    def summary(self) -> dict[str, float]:
        """``clustering_seconds``, ``training_seconds`` and ``clustering_share`` over the whole training."""
        share = self.clustering_seconds / self.training_seconds if self.training_seconds > 0 else 0.0
        return {"clustering_seconds": self.clustering_seconds, "training_seconds": self.training_seconds,
                "clustering_share": share}

    def state_dict(self) -> dict[str, Any]:
        """The last grouping (so a resumed run matches new clusters to it) and the timings."""
        clusters = torch.empty(0, dtype=torch.int64) if self.clusters is None else torch.from_numpy(self.clusters)
        return {"clusters": clusters.clone(), "clustering_seconds": self.clustering_seconds,
                "training_seconds": self.training_seconds}

    def load_state_dict(self, state: Mapping[str, Any]) -> None:
        clusters = state["clusters"]
        self.clusters = clusters.numpy().astype(np.int64) if clusters.numel() else None
        self.clustering_seconds = float(state["clustering_seconds"])
        self.training_seconds = float(state["training_seconds"])
