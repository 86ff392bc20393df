"""Intra-batch message passing (``recipe: mpn``; Seidenschwarz, Elezi, Leal-Taixé, ICML 2021).

Training: backbone → Linear C → d = the node features of a fully connected graph over the P × K
mini-batch; L message-passing steps refine them (:mod:`dmlbench.models.mpn`); a classifier on the
refined features is trained with label-smoothed, temperature-scaled cross-entropy, plus the same
auxiliary loss on the backbone embedding (:mod:`dmlbench.losses.mpn_cross_entropy`). The authors
train with RAdam (``training.optimizer.name: radam``).

Test time: the L2-normalised backbone embedding (default, the paper's main protocol; the MPN adds
no cost), or with ``options.test_embedding: mpn`` the MPN-refined embedding over test batches built
from the backbone embeddings (:mod:`dmlbench.methods.mpn_batches`: reciprocal kNN, nearest
neighbours or K-means, appendix C). Model selection on the validation split uses the same
test-time embedding.

``methods.<name>.loss``: ``{name: mpn_cross_entropy, temperature, label_smoothing, mpn_weight,
aux_weight, classifier_batchnorm}`` (:class:`~dmlbench.losses.mpn_cross_entropy.MPNLossConfig`).
Table 3 of the paper is: CE only (``mpn_weight: 0``), MPN loss only (``aux_weight: 0``), both,
both with ``test_embedding: mpn``.

Where the paper and the authors' code differ, the paper is the default and the code an option:
``attention_scale``, ``output_projection``, ``input_projection`` (here), ``classifier_batchnorm``
(loss). One default departs from both so that the attention can learn at all: ``node_scale:
sqrt_dim`` feeds the MPN the unit-norm embeddings × √d (``unit``: as they are, paper and code; see
:mod:`dmlbench.models.mpn`). The authors' RAdam decays the weights directly; here that is
``training.optimizer.decoupled_weight_decay: true`` (set on the ``mpn`` entry).

Mechanism health (when the MPN is trained, ``mpn_weight > 0``): per epoch and for the run, the
attention's same-class mass (self excluded) against its uniform value and its entropy against the
uniform entropy ln B (:func:`attention_health`); :meth:`MPNRecipe.health_checks` bounds both. The classifiers live in the loss module because a recipe builds its model before the
number of training classes is known; they get ``lr × loss_lr_multiplier`` and are saved with the
loss state.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any, Literal, cast

import math

import numpy as np
import torch
import torch.nn.functional as F
from torch import nn

from dmlbench.data.stored_dataset import ImageSet
from dmlbench.evaluation.clustering import KMeansSettings, kmeans_assignments
from dmlbench.losses.mpn_cross_entropy import MPNCrossEntropyLoss, MPNLossConfig
from dmlbench.methods import RECIPE_TEST_TIME_OPTIONS
from dmlbench.methods.base import Recipe, TrainContext
from dmlbench.methods.health import HEALTH_PREFIX, HealthCheck
from dmlbench.methods.mpn_batches import (
    GraphBatch,
    cluster_batches,
    nearest_neighbour_batches,
    reciprocal_knn_batches,
    refine_in_batches,
)
from dmlbench.methods.options import OptionsError, parse_options
from dmlbench.methods.term_sums import TermSums
from dmlbench.models.backbones import build_backbone
from dmlbench.models.mpn import MessagePassingNetwork, MPNEmbedder
from dmlbench.models.embedding import compute_embeddings
from dmlbench.models.model_stats import count_parameters

LOSS_NAME = "mpn_cross_entropy"

#: Lowest healthy ``health/same_class_attention_ratio``: the attention puts at least this multiple of
#: the uniform share (K − 1)/(B − 1) on the other images of the node's class. Uniform attention is 1;
#: an untrained one drifts by ±0.03 from batch to batch (docs/methods/mpn.md, Mechanism health).
MIN_SAME_CLASS_RATIO = 1.2
#: Highest healthy ``health/attention_entropy_ratio`` = H(α_i) / ln B. Uniform attention is 1; a
#: random, untrained one at ``node_scale: sqrt_dim`` ≈ 0.99.
MAX_ENTROPY_RATIO = 0.97


def attention_health(scores: torch.Tensor, labels: torch.Tensor) -> dict[str, float]:
    """Health numbers of the attention over one graph of B nodes, averaged over nodes and heads/steps.

    Args:
        scores: (..., B, B) scaled attention scores (softmax over the last axis = α; row = receiver),
            any number of leading heads/steps; self loops included.
        labels: (B,) class labels of the nodes.

    Returns:
        ``same_class_attention``: mean over rows of Σ_{j≠i, y_j=y_i} α_ij / Σ_{j≠i} α_ij, the share of
        the attention on *other* nodes that goes to the node's class (self excluded, so attending to
        oneself does not count); ``same_class_attention_ratio``: that mean / the uniform value, the
        mean over nodes of (K_i − 1)/(B − 1) (K_i: nodes of i's class); ``attention_entropy_ratio``:
        mean over rows of H(α_i) / ln B (1 = uniform); ``self_attention``: mean α_ii, the weight a node
        keeps on itself (1/B uniform; near 1 = attention collapsed onto the node itself, no message);
        ``attention_score_std``: mean over rows of the scores' standard deviation (0 = uniform).

    Raises:
        ValueError: fewer than 2 nodes, or no node has another node of its class.
    """
    n = labels.shape[0]
    if n < 2:
        raise ValueError(f"attention health needs a graph of at least 2 nodes, got {n}")
    scores = scores.detach().float().reshape(-1, n, n)
    alpha = torch.softmax(scores, dim=-1)
    others = ~torch.eye(n, dtype=torch.bool, device=scores.device)
    same_others = (labels[:, None] == labels[None, :]) & others
    uniform = same_others.sum(-1).float().mean() / (n - 1)
    if uniform == 0:
        raise ValueError("attention health: no node of the graph has another node of its class")
    to_others = (alpha * others).sum(-1).clamp_min(torch.finfo(alpha.dtype).tiny)
    same = ((alpha * same_others).sum(-1) / to_others).mean()
    entropy = -(alpha * torch.log_softmax(scores, dim=-1)).sum(-1).mean() / math.log(n)
    return {
        "same_class_attention": float(same),
        "same_class_attention_ratio": float(same / uniform),
        "attention_entropy_ratio": float(entropy),
        "self_attention": float(alpha.diagonal(dim1=-2, dim2=-1).mean()),
        "attention_score_std": float(scores.std(dim=-1).mean()),
    }


def _health_terms(scores: torch.Tensor, labels: torch.Tensor) -> dict[str, float]:
    """:func:`attention_health` with the ``health/`` prefix: the MPN recipe's per-batch log terms."""
    return {HEALTH_PREFIX + name: value for name, value in attention_health(scores, labels).items()}


@dataclass(frozen=True)
class MPNOptions:
    """``methods.<name>.options`` of the ``mpn`` recipe.

    Attributes:
        steps: L, message-passing steps (code: CUB 1, Cars 2, In-Shop 1).
        heads: M, attention heads per step; must divide ``training.embedding_dim`` (code: CUB 2, Cars 8).
        attention_dropout: dropout probability on the attention weights (code: 0.1).
        dropout: dropout on both residual branches and inside the feed-forward network (code: 0.1).
        ff_multiplier: hidden width of the feed-forward network in units of d (code: 4).
        attention_scale: ``embedding``: scores / √d (paper, Eq. 3); ``head``: / √(d/M) (code).
        output_projection: a Linear d → d after concatenating the heads (code); the paper has none.
        input_projection: a Linear d → d on the embeddings before the first step (code); paper: none.
        node_scale: ``sqrt_dim``: the MPN's nodes are the unit-norm embeddings × √d (unit RMS per
            coordinate, so the scores spread at initialisation and the attention can learn; default);
            ``unit``: as they are (paper, code: scores spread ≈ 0.004 at d = 64, attention stays uniform).
        test_embedding: ``backbone``: the L2-normalised backbone embedding (paper default);
            ``mpn``: the MPN-refined embedding over test batches built by ``test_batches``.
        test_batches: ``reciprocal_knn`` (appendix C.3), ``nearest_neighbours`` (C.2), ``kmeans`` (C.1).
        rknn_k: k of the reciprocal sets (code: 30).
        rknn_alpha: α of Eq. 7, in [0, 1] (paper and code: 2/3).
        test_batch_size: k_r, nodes per reciprocal-kNN batch; null: the training batch size P × K (code).
        test_chunk_size: images per chunk (nearest neighbours, K-means); null: the training K.
        test_chunks_per_batch: chunks per batch (nearest neighbours, K-means); null: the training P.
        kmeans_images_per_cluster: over-clustering for ``kmeans``: N / this many clusters (the paper
            uses 900 clusters for CUB's 5,924 test images, ≈ 6.6).
        test_seed: seed of the random chunk orders and of K-means at test time.
    """

    steps: int = 1
    heads: int = 2
    attention_dropout: float = 0.1
    dropout: float = 0.1
    ff_multiplier: int = 4
    attention_scale: Literal["embedding", "head"] = "embedding"
    output_projection: bool = False
    input_projection: bool = False
    node_scale: Literal["sqrt_dim", "unit"] = "sqrt_dim"
    mpn_lr_multiplier: float = 1.0
    test_embedding: Literal["backbone", "mpn"] = "backbone"
    test_batches: Literal["reciprocal_knn", "nearest_neighbours", "kmeans"] = "reciprocal_knn"
    rknn_k: int = 30
    rknn_alpha: float = 2 / 3
    test_batch_size: int | None = None
    test_chunk_size: int | None = None
    test_chunks_per_batch: int | None = None
    kmeans_images_per_cluster: float = 6.6
    test_seed: int = 0

    def __post_init__(self) -> None:
        positive = (
            "steps",
            "heads",
            "ff_multiplier",
            "rknn_k",
            "test_batch_size",
            "test_chunk_size",
            "test_chunks_per_batch",
        )
        for name in positive:
            value = getattr(self, name)
            if value is not None and value < 1:
                raise ValueError(f"{name} must be ≥ 1, got {value}")
        for name in ("attention_dropout", "dropout"):
            if not 0.0 <= getattr(self, name) < 1.0:
                raise ValueError(f"{name} must be in [0, 1), got {getattr(self, name)}")
        if self.mpn_lr_multiplier <= 0:
            raise ValueError(f"mpn_lr_multiplier must be > 0, got {self.mpn_lr_multiplier}")
        if self.node_scale not in ("sqrt_dim", "unit"):
            raise ValueError(f"node_scale must be 'sqrt_dim' or 'unit', got {self.node_scale!r}")
        if not 0.0 <= self.rknn_alpha <= 1.0:
            raise ValueError(f"rknn_alpha must be in [0, 1], got {self.rknn_alpha}")
        if self.kmeans_images_per_cluster < 1.0:
            raise ValueError(f"kmeans_images_per_cluster must be ≥ 1, got {self.kmeans_images_per_cluster}")
        if self.test_seed < 0:
            raise ValueError(f"test_seed must be ≥ 0, got {self.test_seed}")


class MPNRecipe(Recipe):
    """Backbone + MPN trained with cross-entropy on refined features (+ auxiliary CE); see the module doc."""

    options_class = MPNOptions
    options: MPNOptions
    TEST_TIME_OPTIONS = RECIPE_TEST_TIME_OPTIONS["mpn"]

    def __init__(self, run: dict[str, Any]):
        super().__init__(run)
        where = f"methods.{run.get('method', '?')}"
        loss = dict(self.method["loss"])
        if loss.pop("name", None) != LOSS_NAME:
            raise OptionsError(
                f"{where}.loss.name must be {LOSS_NAME!r} for recipe 'mpn', got {self.method['loss'].get('name')!r}"
            )
        self.loss_config: MPNLossConfig = parse_options(MPNLossConfig, loss, f"{where}.loss")
        if self.options.test_embedding == "mpn" and self.loss_config.mpn_weight == 0:
            raise OptionsError(
                f"{where}: options.test_embedding is 'mpn' but loss.mpn_weight is 0, so the MPN "
                "would never be trained; set loss.mpn_weight > 0 or test_embedding: backbone"
            )
        dim = self.settings.embedding_dim
        if self.uses_mpn and dim % self.options.heads:
            raise OptionsError(
                f"{where}.options.heads = {self.options.heads} must divide training.embedding_dim = {dim}"
            )
        self._terms = TermSums()
        self._batches = 0
        self._last_epoch: dict[str, float] = {}
        self._mpn_parameters = 0

    @property
    def uses_mpn(self) -> bool:
        """Whether the model needs an MPN (an MPN loss or the MPN at test time)."""
        return self.loss_config.mpn_weight > 0 or self.options.test_embedding == "mpn"

    # --- model, loss ----------------------------------------------------------------------
    def build_model(self) -> nn.Module:
        backbone = build_backbone(self.settings.backbone.section)
        dim = self.settings.embedding_dim
        opts = self.options
        mpn = (
            MessagePassingNetwork(
                dim,
                opts.steps,
                opts.heads,
                opts.attention_dropout,
                opts.dropout,
                opts.ff_multiplier,
                opts.attention_scale,
                opts.output_projection,
                opts.input_projection,
                opts.node_scale,
            )
            if self.uses_mpn
            else None
        )
        self._mpn_parameters = count_parameters(mpn) if mpn is not None else 0
        return MPNEmbedder(
            backbone, dim, mpn, freeze_bn=self.settings.backbone.freeze_bn, mpn_lr_multiplier=opts.mpn_lr_multiplier
        )

    def build_loss(self, num_classes: int) -> nn.Module:
        return MPNCrossEntropyLoss(num_classes, self.settings.embedding_dim, self.loss_config)

    def training_loss(
        self, model: nn.Module, loss: nn.Module, images: torch.Tensor, labels: torch.Tensor, indices: torch.Tensor
    ) -> torch.Tensor:
        """The batch is one graph: MPN over all B nodes, CE on the refined nodes + auxiliary CE."""
        model, loss = cast(MPNEmbedder, model), cast(MPNCrossEntropyLoss, loss)  # what build_model/build_loss made
        features = model.features(images)
        refined = model.refine(F.normalize(features, dim=-1).unsqueeze(0)).squeeze(0) if loss.uses_mpn else None
        value = loss(features, refined, labels)
        for name, term in loss.last_terms.items():
            self._terms.add(name, term)
        if loss.uses_mpn:
            scores = cast(MessagePassingNetwork, model.mpn).last_attention_scores()
            self._terms.add_host((scores, labels), _health_terms)
        self._batches += 1
        return value

    # --- epoch hooks ----------------------------------------------------------------------
    def on_epoch_start(self, epoch: int, model: nn.Module, context: TrainContext) -> None:
        self._terms, self._batches = TermSums(), 0

    def epoch_log(self) -> dict[str, float]:
        """Epoch means over the batches: the unweighted cross-entropies ``mpn_ce`` and/or ``aux_ce`` and,
        when the MPN is trained, the ``health/`` numbers of :func:`attention_health` (all steps and heads)."""
        self._last_epoch = self._terms.means(self._batches)
        return dict(self._last_epoch)

    def summary(self) -> dict[str, float]:
        """``mpn_parameters``: parameters of the MPN (in the model's ``num_parameters`` even when unused at
        test); with an MPN loss, the last epoch's ``health/`` numbers."""
        health = {k: v for k, v in self._last_epoch.items() if k.startswith(HEALTH_PREFIX)}
        return {"mpn_parameters": float(self._mpn_parameters), **health}

    def health_checks(self) -> list[HealthCheck]:
        """With an MPN loss (``mpn_weight > 0``): the attention relates images of one class
        (same-class share ≥ :data:`MIN_SAME_CLASS_RATIO` × uniform) and left uniform (entropy ≤
        :data:`MAX_ENTROPY_RATIO` × ln B). None without: there is no trained attention to check."""
        if self.loss_config.mpn_weight == 0:
            return []
        return [
            HealthCheck(
                HEALTH_PREFIX + "same_class_attention_ratio",
                minimum=MIN_SAME_CLASS_RATIO,
                meaning="the MPN's attention does not prefer images of the node's own class "
                "(no relation between images learned)",
            ),
            HealthCheck(
                HEALTH_PREFIX + "attention_entropy_ratio",
                maximum=MAX_ENTROPY_RATIO,
                meaning="the MPN's attention stayed (near) uniform over the batch",
            ),
        ]

    def state_dict(self) -> dict[str, Any]:
        """The last epoch's means, so that a run resumed after its last epoch still has its summary."""
        return {"last_epoch": dict(self._last_epoch)}

    def load_state_dict(self, state: Mapping[str, Any]) -> None:
        self._last_epoch = dict(state.get("last_epoch", {}))

    # --- test time ------------------------------------------------------------------------
    def test_batches(self, embeddings: np.ndarray) -> list[GraphBatch]:
        """The test-time batch plan of ``options.test_batches`` over backbone embeddings (N, d)."""
        opts, sampler = self.options, self.settings.sampler
        rng = np.random.default_rng(opts.test_seed)
        chunk = opts.test_chunk_size or sampler.images_per_class
        per_batch = opts.test_chunks_per_batch or sampler.classes_per_batch
        if opts.test_batches == "reciprocal_knn":
            size = opts.test_batch_size or sampler.classes_per_batch * sampler.images_per_class
            return reciprocal_knn_batches(embeddings, opts.rknn_k, opts.rknn_alpha, size)
        if opts.test_batches == "nearest_neighbours":
            return nearest_neighbour_batches(embeddings, chunk, per_batch, rng)
        clusters = min(len(embeddings), max(1, round(len(embeddings) / opts.kmeans_images_per_cluster)))
        assignment = kmeans_assignments(
            np.ascontiguousarray(embeddings, dtype=np.float32), clusters, KMeansSettings(seed=opts.test_seed)
        )
        return cluster_batches(assignment, chunk, per_batch, rng)

    def embed(
        self, model: nn.Module, dataset: ImageSet, batch_size: int, device: torch.device, num_workers: int = 0
    ) -> np.ndarray:
        """Backbone embeddings, or (``test_embedding: mpn``) their MPN refinement over test-time batches."""
        embeddings = compute_embeddings(model, dataset, batch_size, device, num_workers)
        if self.options.test_embedding == "backbone":
            return embeddings
        was_training = model.training
        model.eval()

        @torch.no_grad()
        def refine(nodes: torch.Tensor) -> torch.Tensor:
            with torch.autocast(device.type, enabled=device.type == "cuda"):
                return cast(MPNEmbedder, model).refine(nodes)

        try:
            return refine_in_batches(refine, embeddings, self.test_batches(embeddings), device)
        finally:
            model.train(was_training)


__all__ = ["MAX_ENTROPY_RATIO", "MIN_SAME_CLASS_RATIO", "MPNOptions", "MPNRecipe", "attention_health"]
