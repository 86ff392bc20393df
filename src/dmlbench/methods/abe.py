"""ABE — attention-based ensemble (Kim, Goyal, Chawla, Hwang & Kwon, ECCV 2018) and its M-heads baseline.

One recipe (``recipe: abe``) for both architectures of the paper's Fig. 1
(:mod:`dmlbench.models.abe`): ``architecture: abe`` (ABE-M, Eq. 7) or ``heads`` (M-heads).
Training objective (Eq. 8–10, :mod:`dmlbench.losses.abe_divergence`): the metric loss of
``methods.<m>.loss`` (the paper: contrastive, margin m_c = 1) on each learner's embedding, summed
over learners, plus ``divergence_weight`` × the divergence loss between the learners' embeddings
of the same image (margin ``divergence_margin``), reduced over the self pairs by
``divergence_reduction``: ``per_learner`` (default; each learner's mean over the others, summed
over learners, so λ_div balances L_div against Σ_m L_metric,(m) the same way for every M) or
``sum`` (Eq. 9's literal double sum, which weighs (M − 1)× more and collapses ABE-8 at λ_div = 1).
``divergence_warmup_epochs`` W > 0 ramps λ_div linearly from 0 to ``divergence_weight`` over the first
W epochs (:func:`divergence_ramp`, per batch); 0 (default) applies it in full from the first step, as
the paper does.

Final layer (``embedding_layer``): ``per_learner`` (default) gives each learner its own final
linear layer, initialised as M-heads' are, so the learners differ from the start and ABE-M at
initialisation keeps the linear-head baseline's retrieval quality (real CUB, cub_lite: validation
R@1 at init 0.765 against binomial's 0.773; self-pair cosine 0.016, L_div 0); ``shared`` is Eq. 7
read literally (one final layer in G): with open masks the learners then start as copies of one
64-d learner (0.662, self-pair cosine 0.992) and L_div starts at its maximum (docs/methods/abe.md).

The masks start open (``mask_bias``: σ(3) ≈ 0.95) so that ABE at initialisation keeps the
backbone's features; ``mask_bias: 0`` with ``mask_weight_gain: 1`` is the paper's Glorot /
zero-bias init (:mod:`dmlbench.models.abe`).

Mechanism health (:meth:`ABERecipe.health_checks`, thresholds in docs/methods/abe.md): the learners
are not collapsed (``learners_mean/R@1``), L_div keeps them diverse (``self_similarity``), and
ABE's masks are neither uniform (``health/mask_std``) nor closed (``health/mask_mean``).

Batches (``batches``):

- ``pairs`` (the paper, §4, default): ``pair_anchors`` images drawn at random, then a positive
  partner (another image of the same class) for the first half of them and a negative partner
  (an image of another class) for the second half: 2 × ``pair_anchors`` images (64 in the
  paper). The metric loss sees only the designated (anchor, partner) pairs, as a siamese
  contrastive set-up does; the divergence loss sees every image.
- ``class_balanced``: P × K batches of ``training.sampler`` (what unofficial ports use); the metric
  loss sees every pair of the batch.

Both honour ``training.sampler.batches_per_epoch`` (default: as many images per epoch as the
training split holds).

Cut points are backbone stage names: ``branch_after`` (S ends there; GoogLeNet ``pool3``) and
``attention_until`` (the attention trunk C copies the stages after ``branch_after`` through it;
GoogLeNet ``inception4e``). Defaults fit the embedded ``small_cnn``.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from typing import Any, Literal, cast

import numpy as np
import torch
from torch import nn

from dmlbench.data.samplers import ClassBalancedBatchSampler, PairBatchSampler
from dmlbench.evaluation.evaluate import self_pair_similarity
from dmlbench.losses import build_loss
from dmlbench.losses.abe_divergence import ABELoss
from dmlbench.methods.base import Recipe, TrainContext
from dmlbench.methods.health import HEALTH_PREFIX, HealthCheck
from dmlbench.methods.term_sums import TermSums
from dmlbench.models.abe import MASK_WEIGHT_GAIN, OPEN_MASK_BIAS, AttentionEnsemble, HeadsEnsemble
from dmlbench.models.backbones import build_backbone

#: Floor of ``learners_mean/R@1``: below it the single learners are near chance (R@1 of a random
#: embedding is 1–2 % on the 50–100-class test sets here): the ensemble collapsed (synthetic,
#: 10 epochs: collapsed ABE-8 0.047, healthy ensembles 0.11–0.20).
LEARNERS_R1_FLOOR = 0.08
#: Floor of ``health/mask_std`` (std of all mask values): below it the masks are (nearly) one
#: constant and the attention selects nothing (healthy runs: 0.07–0.29).
MASK_STD_FLOOR = 0.03
#: Floor of ``health/mask_mean``: below it the masks have closed and switch S(x) off.
MASK_MEAN_FLOOR = 0.1


@dataclass(frozen=True)
class ABEOptions:
    """``methods.<m>.options`` of ``recipe: abe``.

    Attributes:
        architecture: ``abe`` (ABE-M: shared G, per-learner attention masks) or ``heads`` (M-heads:
            M separate copies of the stages after ``branch_after``).
        learners: M ≥ 1, number of learners; each gets ``training.embedding_dim`` / M dimensions.
        branch_after: backbone stage ending the shared spatial extractor S (GoogLeNet: ``pool3``).
        attention_until: last backbone stage copied into the attention trunk C (GoogLeNet:
            ``inception4e``, i.e. inception 4a–4e); equal to ``branch_after`` for no trunk (the masks
            come from S(x) directly). ``abe`` only.
        embedding_layer: ``per_learner`` (one final linear layer per learner, initialised as M-heads'
            are: the learners differ at init and ABE keeps the baseline's features) or ``shared``
            (Eq. 7 read literally: one final linear layer in G for all learners; identical learners at
            init). ``abe`` only; M-heads always have one per head.
        divergence_weight: λ_div ≥ 0 of Eq. 8 (0: no divergence loss).
        divergence_warmup_epochs: W ≥ 0: λ_div grows linearly from 0 to ``divergence_weight`` over the
            first W epochs, batch by batch (:func:`divergence_ramp`); 0: in full from the first step
            (the paper).
        divergence_margin: m_div > 0 of Eq. 9, on the squared Euclidean distance.
        divergence_reduction: ``per_learner`` (Σ_p mean_{q≠p}: L_div has M terms like Σ_m L_metric,(m))
            or ``sum`` (Σ_{p≠q}, Eq. 9 literally; (M − 1)× heavier).
        mask_bias: initial bias of the mask logits (``abe`` only): 3 starts the masks near 1
            (σ(3) ≈ 0.95); 0 is the paper's zero bias.
        mask_weight_gain: > 0, gain of the Glorot-uniform mask weights (``abe`` only); below 1 for a
            pretrained backbone whose large trunk features would saturate the sigmoid.
        batches: ``pairs`` (the paper's anchor + partner batches) or ``class_balanced``
            (``training.sampler``'s P × K).
        pair_anchors: anchors per pair batch (even, ≥ 2; batch size 2 × this; the paper: 32 → 64).
    """

    architecture: Literal["abe", "heads"] = "abe"
    learners: int = 8
    branch_after: str = "stage2"
    attention_until: str = "stage3"
    embedding_layer: Literal["shared", "per_learner"] = "per_learner"
    divergence_weight: float = 1.0
    divergence_warmup_epochs: float = 0.0
    divergence_margin: float = 1.0
    divergence_reduction: Literal["per_learner", "sum"] = "per_learner"
    mask_bias: float = OPEN_MASK_BIAS
    mask_weight_gain: float = MASK_WEIGHT_GAIN
    batches: Literal["pairs", "class_balanced"] = "pairs"
    pair_anchors: int = 32

    def __post_init__(self) -> None:
        if self.learners < 1:
            raise ValueError(f"learners must be ≥ 1, got {self.learners}")
        if self.divergence_weight < 0:
            raise ValueError(f"divergence_weight must be ≥ 0, got {self.divergence_weight}")
        if self.divergence_warmup_epochs < 0:
            raise ValueError(
                f"divergence_warmup_epochs must be ≥ 0 (0: no warm-up), got {self.divergence_warmup_epochs}"
            )
        if self.divergence_margin <= 0:
            raise ValueError(f"divergence_margin must be > 0, got {self.divergence_margin}")
        if self.mask_weight_gain <= 0:
            raise ValueError(f"mask_weight_gain must be > 0, got {self.mask_weight_gain}")
        if self.pair_anchors < 2 or self.pair_anchors % 2:
            raise ValueError(
                f"pair_anchors must be even and ≥ 2 (half positive, half negative), got {self.pair_anchors}"
            )


def self_similarity_ceiling(divergence_margin: float) -> float:
    """Highest healthy mean cosine of the self pairs with L_div on: 1 − m_div / 2, the cosine of unit
    vectors at squared distance m_div, above which L_div's hinge is still active (m_div = 1: 0.5).

    >>> self_similarity_ceiling(1.0)
    0.5
    """
    return 1.0 - divergence_margin / 2.0


def divergence_ramp(epoch: int, batch: int, batches_per_epoch: int, warmup_epochs: float) -> float:
    """Share of λ_div applied to batch ``batch`` (0-based) of epoch ``epoch`` (1-based).

    min(1, t / W) with t = epoch − 1 + batch / batches_per_epoch, the epochs trained before that
    batch, and W = ``warmup_epochs``; 1 when W = 0 (no warm-up). It depends on the step only, so a
    resumed run continues the ramp where it stopped.

    Two epochs of warm-up, 4 batches per epoch: the first batch gets 0, the middle of epoch 1 a
    quarter, epoch 2 starts at half, epoch 3 at the full weight:

    >>> [divergence_ramp(e, b, 4, 2.0) for e, b in [(1, 0), (1, 2), (2, 0), (2, 3), (3, 0)]]
    [0.0, 0.25, 0.5, 0.875, 1.0]
    """
    if warmup_epochs == 0:
        return 1.0
    return min(1.0, (epoch - 1 + batch / batches_per_epoch) / warmup_epochs)


class ABERecipe(Recipe):
    """ABE-M / M-heads with per-learner metric loss + divergence loss (see the module docstring)."""

    options_class = ABEOptions
    options: ABEOptions

    def __init__(self, run: Mapping[str, Any]):
        super().__init__(run)
        self.where = f"methods.{run.get('method', '?')}.options"
        dim, learners = self.settings.embedding_dim, self.options.learners
        if dim % learners:
            raise ValueError(
                f"training.embedding_dim = {dim} is not divisible by {self.where}.learners = {learners}: "
                f"each learner gets embedding_dim / learners dimensions"
            )
        warmup, epochs = self.options.divergence_warmup_epochs, self.settings.epochs
        if warmup > 0 and warmup >= epochs:
            raise ValueError(
                f"{self.where}.divergence_warmup_epochs = {warmup} is not below training.epochs = "
                f"{epochs}: λ_div would never reach divergence_weight = "
                f"{self.options.divergence_weight}; shorten the warm-up (0: none)"
            )
        self.learner_dim = dim // learners
        self._sums = TermSums()
        self._batches = 0
        self._epoch = 1
        self._batches_per_epoch: int | None = None
        self._last_health: dict[str, float] = {}

    # --- model, loss, batches -------------------------------------------------------------
    def build_model(self) -> nn.Module:
        """:class:`AttentionEnsemble` or :class:`HeadsEnsemble` over ``training.backbone``."""
        o = self.options
        backbone = build_backbone(self.settings.backbone.section)
        freeze_bn = self.settings.backbone.freeze_bn
        for key in ("branch_after", "attention_until"):
            if getattr(o, key) not in backbone.stage_names:
                raise ValueError(
                    f"{self.where}.{key} = {getattr(o, key)!r} is not a stage of "
                    f"{self.settings.backbone.name}: {list(backbone.stage_names)}"
                )
        try:
            if o.architecture == "heads":
                return HeadsEnsemble(backbone, o.learners, self.learner_dim, o.branch_after, freeze_bn)
            return AttentionEnsemble(
                backbone,
                o.learners,
                self.learner_dim,
                o.branch_after,
                o.attention_until,
                shared_embedding=o.embedding_layer == "shared",
                freeze_bn=freeze_bn,
                mask_bias=o.mask_bias,
                mask_weight_gain=o.mask_weight_gain,
            )
        except ValueError as err:
            raise ValueError(f"{self.where}: {err}") from err

    def build_loss(self, num_classes: int) -> ABELoss:
        """Per-learner ``methods.<m>.loss`` + λ_div × divergence (:class:`ABELoss`)."""
        o = self.options
        metric = build_loss(self.method["loss"], num_classes=num_classes, embedding_dim=self.learner_dim)
        slices = [(m * self.learner_dim, (m + 1) * self.learner_dim) for m in range(o.learners)]
        try:
            return ABELoss(
                metric,
                slices,
                divergence_weight=o.divergence_weight,
                divergence_margin=o.divergence_margin,
                divergence_reduction=o.divergence_reduction,
                pairs="partners" if o.batches == "pairs" else "all",
            )
        except ValueError as err:
            raise ValueError(f"methods.{self.run.get('method', '?')}: {err}") from err

    def build_sampler(self, labels: np.ndarray, generator: torch.Generator) -> Iterable[list[int]]:
        """The epoch's batches (``batches``); their number sets the step of the λ_div warm-up."""
        sampler: ClassBalancedBatchSampler | PairBatchSampler
        if self.options.batches == "class_balanced":
            sampler = self.class_balanced_sampler(labels, generator)
        else:
            sampler = PairBatchSampler(
                labels, self.options.pair_anchors, generator, num_batches=self.settings.sampler.batches_per_epoch
            )
        self._batches_per_epoch = len(sampler)
        return sampler

    def divergence_weight(self) -> float:
        """λ_div for the next batch: ``divergence_weight`` × :func:`divergence_ramp` of the current step."""
        o = self.options
        if o.divergence_warmup_epochs == 0:
            return o.divergence_weight
        if self._batches_per_epoch is None:
            raise RuntimeError("the λ_div warm-up needs the epoch's length: call build_sampler before training_loss")
        ramp = divergence_ramp(self._epoch, self._batches, self._batches_per_epoch, o.divergence_warmup_epochs)
        return o.divergence_weight * ramp

    def training_loss(
        self, model: nn.Module, loss: nn.Module, images: torch.Tensor, labels: torch.Tensor, indices: torch.Tensor
    ) -> torch.Tensor:
        model = cast(AttentionEnsemble | HeadsEnsemble, model)  # what build_model made
        loss = cast(ABELoss, loss)
        terms: dict[str, torch.Tensor | float] = {}
        if isinstance(model, AttentionEnsemble):
            features = model.spatial_features(images)
            masks = model.masks(features)
            embeddings = model.embed_attended(features, masks)
            detached = masks.detach().float()
            terms.update(mask_mean=detached.mean(), mask_std=detached.std())
        else:
            embeddings = model(images)
        loss.divergence_weight = self.divergence_weight()
        value = loss(embeddings, labels)
        terms.update(loss.last_terms, divergence_weight=loss.divergence_weight)
        for key, term in terms.items():
            self._sums.add(key, term)
        if self.options.learners > 1:
            slices = model.learner_slices
            self._sums.add_host(
                (embeddings.float(),), lambda batch: {"self_similarity": self_pair_similarity(batch.numpy(), slices)}
            )
        self._batches += 1
        return value

    # --- epoch hooks ----------------------------------------------------------------------
    def on_epoch_start(self, epoch: int, model: nn.Module, context: TrainContext) -> None:
        self._sums, self._batches, self._epoch = TermSums(), 0, epoch

    def epoch_log(self) -> dict[str, float]:
        """Means over the epoch's batches: ``metric_loss`` (Σ_m L_metric,(m)), ``divergence_loss``
        (L_div before weighting), ``divergence_weight`` (the λ_div applied; below the option's value
        during a warm-up) and the health numbers ``health/train_self_similarity`` (M ≥ 2: mean
        cosine of the self pairs), ``health/mask_mean`` and ``health/mask_std`` (ABE: mean and std of
        all mask values of a batch)."""
        names = {
            "metric": "metric_loss",
            "divergence": "divergence_loss",
            "divergence_weight": "divergence_weight",
            "self_similarity": f"{HEALTH_PREFIX}train_self_similarity",
            "mask_mean": f"{HEALTH_PREFIX}mask_mean",
            "mask_std": f"{HEALTH_PREFIX}mask_std",
        }
        row = {names[k]: v for k, v in self._sums.means(self._batches).items()}
        self._last_health = {k: v for k, v in row.items() if k.startswith(HEALTH_PREFIX)}
        return row

    def summary(self) -> dict[str, float]:
        """The last epoch's ``health/`` numbers (see :meth:`epoch_log`)."""
        return dict(self._last_health)

    def health_checks(self) -> list[HealthCheck]:
        """Learners not collapsed (M ≥ 2), learners diverse (M ≥ 2 with L_div), masks neither uniform
        nor closed (ABE); thresholds: the module constants, argued in docs/methods/abe.md."""
        o = self.options
        checks = []
        if o.learners > 1:
            checks.append(
                HealthCheck(
                    "learners_mean/R@1",
                    minimum=LEARNERS_R1_FLOOR,
                    meaning="the single learners are near chance: the ensemble collapsed",
                )
            )
            if o.divergence_weight > 0:
                checks.append(
                    HealthCheck(
                        "self_similarity",
                        maximum=self_similarity_ceiling(o.divergence_margin),
                        meaning="the learners embed an image alike: L_div did not diversify them",
                    )
                )
        if o.architecture == "abe":
            checks += [
                HealthCheck(
                    f"{HEALTH_PREFIX}mask_std",
                    minimum=MASK_STD_FLOOR,
                    meaning="every mask is uniform: the attention selects nothing",
                ),
                HealthCheck(
                    f"{HEALTH_PREFIX}mask_mean",
                    minimum=MASK_MEAN_FLOOR,
                    meaning="the masks have closed: S(x) is switched off",
                ),
            ]
        return checks

    def state_dict(self) -> dict[str, Any]:
        """The last epoch's health numbers, so that a resumed run still reports them."""
        return {"last_health": dict(self._last_health)}

    def load_state_dict(self, state: Mapping[str, Any]) -> None:
        self._last_health = dict(state.get("last_health", {}))

    # --- test time ------------------------------------------------------------------------
    def attention_maps(self, model: nn.Module, images: torch.Tensor) -> dict[str, torch.Tensor]:
        """``learner{m}`` → (B, H, W): learner m's mask averaged over channels, resized to the image."""
        if not isinstance(model, AttentionEnsemble):
            return super().attention_maps(model, images)
        device = next(model.parameters()).device
        maps = model.attention_maps(images.to(device)).cpu()
        return {f"learner{m}": maps[m] for m in range(len(maps))}
