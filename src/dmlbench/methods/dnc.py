"""Divide and Conquer the embedding space (``recipe: dnc``; Sanakoyeu et al., CVPR 2019, Algorithm 1).

Model: the backbone + :class:`~dmlbench.models.dnc.SplitLinearEmbedding`, i.e. the
d-dimensional embedding layer cut into K learners of d/K dimensions, each
L2-normalised; the test embedding is their concatenation (per-learner metrics
``learner{k}/R@K`` come from ``learner_slices``).

Training, per epoch (1-based) e, with W = ``warmup_epochs``:

0. *Warm-up* (e ≤ W): all data in one group, the loss on the full embedding (the
   concatenation re-normalised to unit length) trains the backbone and every learner,
   as the baseline would. The paper starts from an ImageNet-pretrained network, so its
   first clustering already sees meaningful features; a network trained from scratch
   (the embedded default) clusters random features at epoch 1 (clusters of 103–772 rows,
   near-chance cluster–class agreement), so the first clustering waits until the
   embedding has learned something. W = 0 is the paper (and the released code).
1. *Divide* (W < e < ``finetune_epoch``): every T = ``recluster_every`` epochs (e = W + 1,
   W + 1 + T, ...) the training set is embedded (test transform, no gradient) and
   clustered by faiss K-means into K clusters; the new cluster ids are matched to the
   previous ones by the Hungarian algorithm on the clusters' IoU (appendix A), so
   learner k keeps "its" data. Rows whose class has a single image in their cluster
   are left out for the period (the authors' code). Each batch is P × K images of *one*
   cluster, drawn uniformly over the clusters (§3.3, "we uniformly sample a cluster"; the
   authors' code alternates the clusters, which gives the same expected share);
   the loss of that cluster's learner, on its slice only, updates the shared backbone and
   that learner (the other learners get no gradient at all).
2. *Merge and fine-tune* (e ≥ ``finetune_epoch``): as the warm-up, all data in one group,
   the loss on the full embedding trains the backbone and every learner.

Every switch point is explicit. The released code hides one: from epoch
``finetune_epoch × 8/19`` on it already applies the loss to the full embedding while
still drawing batches per cluster; ``full_embedding_loss_epoch`` reproduces that
(default: off, the paper's Algorithm 1).

Losses. Each learner has its own copy of ``methods.<name>.loss`` built for its slice
width (Proxy-NCA: d/K-dimensional proxies; margin: its own learnable β), as the authors'
code keeps one criterion per cluster. The full-embedding phases (warm-up, fine-tune)
use, by ``merged_beta``: ``cluster0`` (default, the authors' code) cluster 0's criterion
itself, parameters shared, so the fine-tune starts from cluster 0's learned β — only
possible for losses whose parameters do not depend on the embedding width (margin,
triplet; not Proxy-NCA); or ``own`` one more copy built for d dimensions, whose
parameters (margin: β) are trained only in those phases — the fine-tune continues from
the β the warm-up learned, or restarts at the initial β (1.2) without a warm-up.
With K = 1 there is a single copy and the recipe is bit-identical to
``recipe: baseline`` with the same loss (tested).

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
``clustering_seconds`` (embedding + K-means + matching this epoch), and the health of
the grouping in force (NaN in warm-up and fine-tune epochs, which have none; see
:func:`~dmlbench.methods.dnc_clustering.grouping_health`): ``health/cluster_balance``,
``health/cluster_min_share``, ``health/cluster_max_share``, ``health/cluster_class_nmi``,
``health/cluster_class_nmi_chance``. Summary (metrics.json): ``clustering_seconds``,
``training_seconds`` (each epoch from its start, clustering included, until its last
batch was trained; validation excluded) and ``clustering_share`` = their ratio (paper
§4.4: ≈ 25 % for T = 2, 6 % for T = 8); over the run's groupings, the worst
``health/cluster_balance`` and ``health/cluster_min_share``, the largest
``health/cluster_max_share``, the mean ``health/cluster_class_nmi`` and
``health/cluster_class_nmi_chance``, the first grouping's ``health/cluster_class_nmi_first``
and its excess over its chance level ``health/cluster_class_nmi_first_excess``, and
``health/groupings`` (their number). :meth:`DivideAndConquerRecipe.health_checks` bounds the
balance and the first clustering's NMI excess (K-means groupings with K ≥ 2 only).
With ``training.num_workers`` > 0 the DataLoader prefetches indices, so an epoch's end
is seen up to ``2 × num_workers`` batches early.

Options (``methods.<name>.options``): see :class:`DivideAndConquerOptions`.
"""

from __future__ import annotations

import time
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from typing import Any, Literal, cast

import numpy as np
import torch
import torch.nn.functional as F
from torch import nn

from dmlbench.data.stored_dataset import ImageSet
from dmlbench.evaluation.clustering import KMeansSettings
from dmlbench.losses import build_loss
from dmlbench.methods.base import Recipe, TrainContext
from dmlbench.methods.dnc_clustering import (
    GROUPING_HEALTH_KEYS,
    ClusterBatchSampler,
    drop_singleton_classes,
    grouping_health,
    kmeans_clusters,
    match_clusters,
    pack_groups,
    random_partition,
    read_class_groups,
    synthetic_class_groups,
    training_class_groups,
)
from dmlbench.methods.health import HEALTH_PREFIX, HealthCheck
from dmlbench.models.backbones import build_backbone
from dmlbench.models.dnc import SplitLinearEmbedding, learner_slices
from dmlbench.models.embedder import Embedder
from dmlbench.models.embedding import compute_embeddings
from dmlbench.seeding import derive_seed

_FAISS_SEEDS = 2**31 - 1

#: Floor of ``health/cluster_balance`` (smallest / largest cluster, worst over the run's
#: groupings). Embedded default with warm-up: 0.37–0.51; K-means of the randomly initialised
#: network (no warm-up): 0.10–0.21 (e.g. 103 vs 772 rows); an empty cluster: 0.
MIN_CLUSTER_BALANCE = 0.25
#: Floor of ``health/cluster_class_nmi_first_excess``: NMI between the first clustering and the
#: classes minus the NMI of the same clustering against permuted labels (its chance level, which
#: grows with the number of classes per row: ≈ 0.015 for K = 4, 40 classes, 1,600 rows, ≈ 0.12 for
#: SOP with K = 8). Embedded default with warm-up: 0.10–0.18; without warm-up (random features):
#: 0.002–0.011; a class-pure grouping reaches 2 ln K / (ln K + ln C) − chance (≈ 0.53 there).
MIN_FIRST_NMI_EXCESS = 0.05


@dataclass(frozen=True)
class DivideAndConquerOptions:
    """``methods.<name>.options`` of ``recipe: dnc``.

    Attributes:
        num_clusters: K ≥ 1, number of clusters, and of learners when the embedding is split
            (every grouping but ``kmeans_no_split``); at most ``training.embedding_dim``. The
            paper: 4 (CUB, Cars), 8 (SOP, In-Shop, VehicleID). K = 1 is the baseline.
        recluster_every: T ≥ 1, epochs between two K-means clusterings (paper: 2).
        warmup_epochs: W ≥ 0, epochs that train the full embedding on all data before the
            first clustering (at epoch W + 1); W < ``training.epochs`` and, with a fine-tune
            phase, W + 1 < ``finetune_epoch`` (at least one divide epoch). 0: the paper and
            the released code, which start from an ImageNet-pretrained backbone. The default
            2 suits networks trained from scratch (the embedded 10-epoch schedule) and costs
            little with a pretrained one (the linear embedding starts random either way).
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
        merged_beta: the loss of the full-embedding phases (warm-up, fine-tune): ``cluster0``
            (default; the authors' code: cluster 0's criterion, parameters shared, so the
            fine-tune starts from cluster 0's learned β; only for losses whose parameters do
            not depend on the embedding width — an error otherwise) or ``own`` (a copy for d
            dimensions whose β is trained only in those phases; without warm-up the fine-tune
            starts at the initial β). Embedded default, 5 seeds: best validation R@1 0.584
            (cluster0) vs 0.540 (own), higher for cluster0 in 4 of 5 seeds.
    """

    num_clusters: int = 4
    recluster_every: int = 2
    warmup_epochs: int = 2
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
    merged_beta: Literal["own", "cluster0"] = "cluster0"

    def __post_init__(self) -> None:
        for name in ("num_clusters", "recluster_every", "kmeans_niter", "kmeans_nredo"):
            if getattr(self, name) < 1:
                raise ValueError(f"{name} must be ≥ 1, got {getattr(self, name)}")
        if self.warmup_epochs < 0:
            raise ValueError(f"warmup_epochs must be ≥ 0, got {self.warmup_epochs}")
        if self.finetune_epoch is not None and self.warmup_epochs + 1 >= self.finetune_epoch:
            raise ValueError(
                f"warmup_epochs ({self.warmup_epochs}) leaves no divide epoch before finetune_epoch "
                f"({self.finetune_epoch}): the first clustering is at epoch warmup_epochs + 1"
            )
        for name in ("finetune_epoch", "full_embedding_loss_epoch"):
            value = getattr(self, name)
            if value is not None and value < 1:
                raise ValueError(f"{name} must be ≥ 1 (an epoch, 1-based) or null, got {value}")
        if (
            self.full_embedding_loss_epoch is not None
            and self.finetune_epoch is not None
            and self.full_embedding_loss_epoch > self.finetune_epoch
        ):
            raise ValueError(
                f"full_embedding_loss_epoch ({self.full_embedding_loss_epoch}) must not come after "
                f"finetune_epoch ({self.finetune_epoch})"
            )

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
        return F.normalize(cast(Embedder, self.model).backbone(images), dim=1)


class DivideAndConquerRecipe(Recipe):
    """``recipe: dnc`` — see the module docstring."""

    options_class = DivideAndConquerOptions
    options: DivideAndConquerOptions

    def __init__(self, run: Mapping[str, Any]):
        super().__init__(run)
        where = f"methods.{run.get('method', '?')}.options"
        o, epochs, dim = self.options, self.settings.epochs, self.settings.embedding_dim
        if o.finetune_epoch is not None and o.finetune_epoch > epochs:
            raise ValueError(
                f"{where}.finetune_epoch = {o.finetune_epoch} is after the last epoch "
                f"(training.epochs = {epochs}); lower it or set null for no fine-tune phase"
            )
        if o.warmup_epochs >= epochs:
            raise ValueError(
                f"{where}.warmup_epochs = {o.warmup_epochs} leaves no epoch to divide (training.epochs = {epochs})"
            )
        if o.full_embedding_loss_epoch is not None and o.full_embedding_loss_epoch > epochs:
            raise ValueError(
                f"{where}.full_embedding_loss_epoch = {o.full_embedding_loss_epoch} is after the "
                f"last epoch (training.epochs = {epochs})"
            )
        if o.split_embedding and o.num_clusters > dim:
            raise ValueError(
                f"{where}.num_clusters = {o.num_clusters} exceeds training.embedding_dim = {dim}: "
                "each learner needs at least one dimension"
            )
        if (
            o.grouping == "class_families"
            and o.class_groups_file is None
            and run["dataset_config"].get("kind") != "synthetic"
        ):
            raise ValueError(
                f"{where}.class_groups_file is required for grouping 'class_families' on dataset "
                f"{run.get('dataset')!r} (only 'synthetic' has built-in class families)"
            )
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
        # (G, len(GROUPING_HEALTH_KEYS)) health of each grouping so far (grouping_health).
        self.grouping_health = np.empty((0, len(GROUPING_HEALTH_KEYS)))
        self.divide_epoch = False  # this epoch belongs to the divide phase

    # --- model, loss ----------------------------------------------------------------------
    def build_model(self) -> nn.Module:
        """Backbone + :class:`SplitLinearEmbedding` with K learners (one for ``kmeans_no_split``)."""
        backbone = build_backbone(self.settings.backbone.section)
        head = SplitLinearEmbedding(backbone.out_channels["pool"], self.settings.embedding_dim, self.num_learners)
        return Embedder(
            backbone,
            head,
            learner_slices=head.slices if self.num_learners > 1 else None,
            freeze_bn=self.settings.backbone.freeze_bn,
        )

    def build_loss(self, num_classes: int) -> nn.Module:
        """One copy of ``methods.<name>.loss`` per learner slice, plus one for d dims when K > 1."""
        dim = self.settings.embedding_dim
        slices = learner_slices(dim, self.num_learners)

        def make(width: int) -> nn.Module:
            return build_loss(self.method["loss"], num_classes=num_classes, embedding_dim=width)

        learners = [make(stop - start) for start, stop in slices]
        if self.num_learners == 1:
            return DivideAndConquerLoss(learners, None)
        full = make(dim)
        if self.options.merged_beta == "cluster0":
            self._check_width_free(learners[0], full)
            return DivideAndConquerLoss(learners, None)
        return DivideAndConquerLoss(learners, full)

    def _check_width_free(self, learner: nn.Module, full: nn.Module) -> None:
        """Raise unless ``learner`` (a slice's loss) has parameters of the same shapes as ``full`` (d dims)."""
        for (name, a), b in zip(learner.state_dict().items(), full.state_dict().values(), strict=True):
            if a.shape != b.shape:
                raise ValueError(
                    f"{self.where}.merged_beta = 'cluster0' applies cluster 0's loss to the full "
                    f"embedding, but loss {self.method['loss'].get('name')!r} sizes its parameter "
                    f"{name!r} by the embedding width ({tuple(a.shape)} vs {tuple(b.shape)}); "
                    "use merged_beta: own"
                )

    # --- phases ---------------------------------------------------------------------------
    def in_warmup(self, epoch: int) -> bool:
        """Whether ``epoch`` belongs to the warm-up (before the first clustering)."""
        return epoch <= self.options.warmup_epochs

    def in_finetune(self, epoch: int) -> bool:
        """Whether ``epoch`` belongs to the merge-and-fine-tune phase."""
        return self.options.finetune_epoch is not None and epoch >= self.options.finetune_epoch

    def _uses_learner_loss(self, epoch: int) -> bool:
        o = self.options
        late = o.full_embedding_loss_epoch is not None and epoch >= o.full_embedding_loss_epoch
        return o.split_embedding and not late and self.divide_epoch

    def _needs_grouping(self, epoch: int) -> bool:
        """Whether a divide epoch groups the rows: the first one, then every T for K-means."""
        if self.clusters is None:
            return True
        kmeans = self.options.grouping in ("kmeans", "kmeans_no_split") and self.options.num_clusters > 1
        return kmeans and (epoch - 1 - self.options.warmup_epochs) % self.options.recluster_every == 0

    def _training_embeddings(self, model: nn.Module, context: TrainContext) -> np.ndarray:
        """(N, d) embeddings of the training rows (test transform) in the clustering space."""
        dataset: ImageSet = context.data.train.evaluation_view(context.data.test)
        module = model if self.options.cluster_space == "embedding" else _PooledFeatures(model)
        # The DataLoader draws a seed from torch's global RNG: keep the training stream untouched.
        with torch.random.fork_rng(devices=[]):
            return compute_embeddings(module, dataset, context.eval_batch_size, context.device, context.num_workers)

    def _group(self, epoch: int, model: nn.Module, context: TrainContext) -> np.ndarray:
        """New (N,) cluster ids of the training rows for ``grouping``."""
        o, labels = self.options, context.data.train.labels
        if o.num_clusters == 1:
            return np.zeros(len(labels), dtype=np.int64)
        if o.grouping == "random":
            rng = np.random.default_rng(derive_seed(self.run["seed"], "dnc", "random_partition"))
            return random_partition(len(labels), o.num_clusters, rng)
        if o.grouping == "class_families":
            table = (
                synthetic_class_groups(self.run["dataset_config"])
                if o.class_groups_file is None
                else read_class_groups(o.class_groups_file, o.class_groups_column)
            )
            groups = training_class_groups(table, context.data.train_classes)
            if len(np.unique(groups)) < o.num_clusters:
                raise ValueError(
                    f"{self.where}.num_clusters = {o.num_clusters} but the training classes form only "
                    f"{len(np.unique(groups))} groups; lower num_clusters"
                )
            return pack_groups(groups[labels], o.num_clusters)
        settings = KMeansSettings(
            seed=derive_seed(self.run["seed"], "dnc", "kmeans", epoch) % _FAISS_SEEDS,
            niter=o.kmeans_niter,
            nredo=o.kmeans_nredo,
        )
        clusters = kmeans_clusters(self._training_embeddings(model, context), o.num_clusters, settings)
        return clusters if self.clusters is None else match_clusters(self.clusters, clusters, o.num_clusters)

    # --- hooks ----------------------------------------------------------------------------
    def on_epoch_start(self, epoch: int, model: nn.Module, context: TrainContext) -> None:
        """Re-group the training rows when due (timed) and choose this epoch's loss."""
        self.epoch_started = time.perf_counter()
        self.epoch_clustering = 0.0
        labels = context.data.train.labels
        self.divide_epoch = not (self.in_warmup(epoch) or self.in_finetune(epoch))
        if not self.divide_epoch:
            self.active = np.zeros(len(labels), dtype=np.int64)
        else:
            if self._needs_grouping(epoch):
                self.clusters = self._group(epoch, model, context)
                self.epoch_clustering = time.perf_counter() - self.epoch_started
                self.clustering_seconds += self.epoch_clustering
                self._record_health(epoch, labels)
            clusters = self.clusters
            assert clusters is not None  # _needs_grouping holds until the first grouping
            self.active = (
                drop_singleton_classes(clusters, labels)
                if self.options.drop_singleton_classes and self.options.num_clusters > 1
                else clusters
            )
        self.learner_loss = self._uses_learner_loss(epoch)

    def _record_health(self, epoch: int, labels: np.ndarray) -> None:
        """Append the health of the grouping just made (:func:`grouping_health`)."""
        assert self.clusters is not None  # called right after a grouping
        rng = np.random.default_rng(derive_seed(self.run["seed"], "dnc", "nmi_chance", epoch))
        health = grouping_health(self.clusters, labels, self.options.num_clusters, rng)
        row = np.array([[health[k] for k in GROUPING_HEALTH_KEYS]])
        self.grouping_health = np.concatenate([self.grouping_health, row])

    def build_sampler(self, labels: np.ndarray, generator: torch.Generator) -> Iterable[list[int]]:
        """P × K batches, each from one cluster of this epoch (:class:`ClusterBatchSampler`)."""
        active = self._active_clusters()
        if len(active) != len(labels):
            raise RuntimeError("recipe dnc: build_sampler before on_epoch_start grouped the training rows")
        sampler = self.settings.sampler
        self.sampler = ClusterBatchSampler(
            labels,
            active,
            sampler.classes_per_batch,
            sampler.images_per_class,
            generator,
            num_batches=sampler.batches_per_epoch,
            weighting=self.options.cluster_sampling,
        )
        return self.sampler

    def _active_clusters(self) -> np.ndarray:
        """This epoch's (N,) clusters of the training rows (dropped rows = -1)."""
        if self.active is None:
            raise RuntimeError("recipe dnc: build_sampler before on_epoch_start grouped the training rows")
        return self.active

    def batch_cluster(self, indices: torch.Tensor) -> int:
        """The cluster of a batch from its training-row indices (all rows share it)."""
        clusters = np.unique(self._active_clusters()[indices.cpu().numpy()])
        if len(clusters) != 1 or clusters[0] < 0:
            raise RuntimeError(
                f"recipe dnc: a batch spans clusters {clusters.tolist()}; batches must come from build_sampler"
            )
        return int(clusters[0])

    def training_loss(
        self, model: nn.Module, loss: nn.Module, images: torch.Tensor, labels: torch.Tensor, indices: torch.Tensor
    ) -> torch.Tensor:
        """Learner k's loss on its slice for a batch of cluster k, else the full loss on the merged embedding."""
        model, loss = cast(Embedder, model), cast(DivideAndConquerLoss, loss)  # what build_model/build_loss made
        head = cast(SplitLinearEmbedding, model.head)
        features = model.backbone(images)
        if self.learner_loss:
            k = self.batch_cluster(indices)
            return loss.learners[k](head.learner(features, k), labels)
        return loss.full(head.merged(features), labels)

    def epoch_log(self) -> dict[str, float]:
        """``cluster_min``, ``cluster_max``, ``cluster_dropped``, ``clustering_seconds`` of this epoch."""
        finished = self.sampler.finished_at if self.sampler and self.sampler.finished_at else time.perf_counter()
        self.training_seconds += finished - self.epoch_started
        active = self._active_clusters()
        kept = active[active >= 0]
        sizes = np.bincount(kept, minlength=int(active.max()) + 1)
        current = self.grouping_health[-1] if self.divide_epoch else np.full(len(GROUPING_HEALTH_KEYS), np.nan)
        health = {HEALTH_PREFIX + k: float(v) for k, v in zip(GROUPING_HEALTH_KEYS, current, strict=True)}
        return {
            "cluster_min": float(sizes.min()),
            "cluster_max": float(sizes.max()),
            "cluster_dropped": float(np.sum(active < 0)),
            "clustering_seconds": self.epoch_clustering,
            **health,
        }

    def summary(self) -> dict[str, float]:
        """Timings (``clustering_seconds``, ``training_seconds``, ``clustering_share``) and the health of
        the run's groupings: worst balance and smallest share, largest share, mean NMI and chance NMI,
        the first grouping's NMI and the number of groupings (module docstring)."""
        share = self.clustering_seconds / self.training_seconds if self.training_seconds > 0 else 0.0
        timings = {
            "clustering_seconds": self.clustering_seconds,
            "training_seconds": self.training_seconds,
            "clustering_share": share,
        }
        if not len(self.grouping_health):
            return timings
        column = dict(zip(GROUPING_HEALTH_KEYS, self.grouping_health.T, strict=True))
        first_nmi, first_chance = column["cluster_class_nmi"][0], column["cluster_class_nmi_chance"][0]
        health = {
            "cluster_balance": column["cluster_balance"].min(),
            "cluster_min_share": column["cluster_min_share"].min(),
            "cluster_max_share": column["cluster_max_share"].max(),
            "cluster_class_nmi": column["cluster_class_nmi"].mean(),
            "cluster_class_nmi_chance": column["cluster_class_nmi_chance"].mean(),
            "cluster_class_nmi_first": first_nmi,
            "cluster_class_nmi_first_excess": first_nmi - first_chance,
            "groupings": len(self.grouping_health),
        }
        return {**timings, **{HEALTH_PREFIX + k: float(v) for k, v in health.items()}}

    def health_checks(self) -> list[HealthCheck]:
        """Cluster balance and the first clustering's cluster–class NMI, for K-means groupings with K ≥ 2
        (fixed random or class-family partitions are not the method's clustering)."""
        o = self.options
        if o.grouping not in ("kmeans", "kmeans_no_split") or o.num_clusters < 2:
            return []
        return [
            HealthCheck(
                f"{HEALTH_PREFIX}cluster_balance",
                minimum=MIN_CLUSTER_BALANCE,
                meaning="a K-means cluster is degenerate (the smallest holds a small fraction of the "
                "largest): its learner hardly trains",
            ),
            HealthCheck(
                f"{HEALTH_PREFIX}cluster_class_nmi_first_excess",
                minimum=MIN_FIRST_NMI_EXCESS,
                meaning="the first clustering ignores the classes (its NMI is near that of permuted "
                "labels): it grouped untrained features, so the learners split the data at random",
            ),
        ]

    def state_dict(self) -> dict[str, Any]:
        """The last grouping (so a resumed run matches new clusters to it), the timings and the
        groupings' health."""
        clusters = torch.empty(0, dtype=torch.int64) if self.clusters is None else torch.from_numpy(self.clusters)
        return {
            "clusters": clusters.clone(),
            "clustering_seconds": self.clustering_seconds,
            "training_seconds": self.training_seconds,
            "grouping_health": torch.from_numpy(self.grouping_health.copy()),
        }

    def load_state_dict(self, state: Mapping[str, Any]) -> None:
        clusters = state["clusters"]
        self.clusters = clusters.numpy().astype(np.int64) if clusters.numel() else None
        self.clustering_seconds = float(state["clustering_seconds"])
        self.training_seconds = float(state["training_seconds"])
        self.grouping_health = state["grouping_health"].numpy().astype(np.float64)
