"""DeML recipe (``recipe: deml``): hybrid-attention decoupled metric learning (Chen & Deng, CVPR 2019).

Model: :class:`dmlbench.models.deml.DeMLNetwork` — I object-attention scales (each scale
crops and zooms the random-walk OAM region of the previous scale's input) × J parallel
channel-attention modules per scale sharing the rest of the scale's network, one CA
learner of ⌊d / (I·J)⌋ dimensions each. Test feature: the concatenation of the
L2-normalised learner outputs; every CA learner is a learner slice (per-learner metrics and
their mean cosine similarity, the 'sim' of Table 4) and every scale a named view
``scale<i>`` (its OA root learner, Table 2's "O" columns) when I ≥ 2.

Loss: :class:`dmlbench.losses.deml_loss.DeMLLoss` — the metric loss of
``methods.<name>.loss`` (binomial deviance: ``{name: binomial, alpha: 2, beta: 0.5,
neg_weight: 35}``) on each learner, averaged; the adversary term (Eq. 4); activation decay
λ1 and the non-trivial-solution term λ2 (Eq. 6).

The paper's baselines are options of the same recipe (our reading of §4): "U<d>" is the
unattended network with one d-dimensional learner, ``num_scales: 1, num_cams: 0`` with
``training.embedding_dim: d``; "U<d> + L_act" adds the activation decay (λ1, λ2 > 0);
plain "U<d>" has ``activation_decay: 0, ntri_weight: 0``. DeML(I=1, J=1) differs from
U512 + L_act only by its single CAM, as the paper says. Table 4's row "U64 + L_adv" has
exactly the numbers of Table 1's "U64 + L_act" (50.9 / 67.1 R@1) and an adversary between
learners is undefined for a single learner, so we read it as U64 + L_act.

``epoch_log`` adds the epoch means of the loss terms (``loss_metric``, ``loss_adversary``,
``loss_decay``, ``loss_ntri``) and ``learner_cosine``, the mean cosine similarity between
two CA learners of the same training image (within a scale; NaN with one learner per scale).
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any, Literal

import torch
import torch.nn.functional as F
from torch import nn

from dmlbench.losses import build_loss
from dmlbench.losses.deml_loss import DeMLLoss
from dmlbench.methods.base import Recipe, TrainContext
from dmlbench.models.backbones import build_backbone
from dmlbench.models.deml import DeMLNetwork

#: λ0 used when ``adversary_weight`` is not given: the paper's 1 (grl) or the code's 0.2 per pair (contrastive).
DEFAULT_ADVERSARY_WEIGHT = {"grl": 1.0, "contrastive": 0.2, "none": 0.0}


@dataclass(frozen=True)
class DeMLOptions:
    """``methods.<name>.options`` of ``recipe: deml``.

    Attributes:
        num_scales: I ≥ 1, object-attention scales (OA root learners).
        num_cams: J ≥ 0, CAMs (CA learners) per scale; 0 = no CAM and one learner per scale
            (with ``num_scales: 1`` the paper's unattended baseline U<d>).
        cam_after: backbone stage whose map the CAMs re-weight; FNet = the stages up to it,
            GNet = the rest (GoogLeNet: pool3, §4; the authors' code: inception4b).
        cam_hidden: width of the CAM bottleneck (64, §3.2).
        cam_pooled: True: one weight per channel from the spatially averaged map (§3.2);
            False: per-position weights from 1×1 convolutions without pooling (authors' code).
        share_learners: the J CA learners of a scale share one linear layer (authors' code; the
            CAMs alone differentiate them, as the paper's remark on Eq. 4 and Table 4's 'sim'
            presuppose) instead of one ω_ij each (Eq. 6 as written); see :mod:`dmlbench.models.deml`.
        oam_layers: backbone stages whose maps the OAM random walk reads (GoogLeNet:
            inception4e and inception5b, §4; the authors' code: inception5b only).
        oam_iterations: random-walk steps T ≥ 1 (10, §3.1).
        oam_variant: 'paper' (edge weights ‖u_a − u_b‖, average of all maps and CAM branches)
            or 'code' (the authors' ProposalCrop: edge weights × a Gaussian of the spatial
            distance, σ = 0.15 × side, first CAM branch only). Both crop the code's box (largest
            above-mean region, squared; the paper gives no rule); see
            :mod:`dmlbench.models.deml_attention`.
        adversary: 'grl' (Eq. 4: adversary network behind a gradient reversal layer),
            'contrastive' (authors' code: contrastive hinge, margin ``adversary_margin``,
            between the normalised learners of the same image) or 'none'.
        adversary_weight: λ0 ≥ 0 of the adversary term; None = 1.0 for 'grl' (§4), 0.2 per
            learner pair for 'contrastive' (the code's loss_weight).
        adversary_hidden: hidden and output width of each adversary network ('grl'); the
            paper does not state it.
        adversary_margin: margin on the Euclidean distance of unit vectors ('contrastive'; 2 in the code).
        activation_decay: λ1 ≥ 0 of the activation decay (0.014, §4; 0 = without L_act).
        ntri_weight: λ2 ≥ 0 of the non-trivial-solution term (0.25, §4; only meaningful with λ1 > 0).

    The defaults are DeML(I=3, J=3) with the paper's weights and cut points for the embedded
    ``small_cnn`` at 56 px: CAMs on stage2 (7×7), OAM on stage2 (7×7) and stage3 (4×4) —
    stage4 is 2×2 there, too coarse to locate anything.
    """

    num_scales: int = 3
    num_cams: int = 3
    cam_after: str = "stage2"
    cam_hidden: int = 64
    cam_pooled: bool = True
    share_learners: bool = True
    oam_layers: tuple[str, ...] = ("stage2", "stage3")
    oam_iterations: int = 10
    oam_variant: Literal["paper", "code"] = "paper"
    adversary: Literal["grl", "contrastive", "none"] = "grl"
    adversary_weight: float | None = None
    adversary_hidden: int = 128
    adversary_margin: float = 2.0
    activation_decay: float = 0.014
    ntri_weight: float = 0.25

    def __post_init__(self) -> None:
        checks = [
            (self.num_scales >= 1, "num_scales must be ≥ 1"),
            (self.num_cams >= 0, "num_cams must be ≥ 0 (0 = no CAM)"),
            (self.cam_hidden >= 1, "cam_hidden must be ≥ 1"),
            (len(self.oam_layers) >= 1, "oam_layers must name at least one stage"),
            (self.oam_iterations >= 1, "oam_iterations must be ≥ 1"),
            (self.adversary_weight is None or self.adversary_weight >= 0, "adversary_weight must be ≥ 0"),
            (self.adversary_hidden >= 1, "adversary_hidden must be ≥ 1"),
            (self.adversary_margin > 0, "adversary_margin must be > 0"),
            (self.activation_decay >= 0, "activation_decay must be ≥ 0"),
            (self.ntri_weight >= 0, "ntri_weight must be ≥ 0"),
        ]
        for ok, message in checks:
            if not ok:
                raise ValueError(message)

    @property
    def lambda0(self) -> float:
        """The adversary weight in effect."""
        return DEFAULT_ADVERSARY_WEIGHT[self.adversary] if self.adversary_weight is None else self.adversary_weight


_TERMS = ("metric", "adversary", "decay", "ntri")


class DeMLRecipe(Recipe):
    """DeML: multi-scale (OAM crops) × multi-CAM learners, binomial deviance + adversary + activation decay."""

    options_class = DeMLOptions
    options: DeMLOptions

    def __init__(self, run: Mapping[str, Any]):
        super().__init__(run)
        self._sums: dict[str, torch.Tensor] = {}
        self._batches = 0

    def _where(self, key: str) -> str:
        return f"methods.{self.run.get('method', '?')}.options.{key}"

    # --- model and loss -------------------------------------------------------------------
    def build_model(self) -> DeMLNetwork:
        """I backbones of ``training.backbone`` (independently initialised / loaded) + CAMs + learners.

        Raises:
            ValueError: a cut point that is not a spatial stage of the backbone, or fewer
                embedding dimensions than learners (the message names the option).
        """
        o = self.options
        config = self.training["backbone"]
        backbones = [build_backbone(config) for _ in range(o.num_scales)]
        try:
            return DeMLNetwork(backbones, self.training["embedding_dim"], o.num_cams, o.cam_after, o.cam_hidden,
                               o.cam_pooled, o.oam_layers, o.oam_iterations, o.oam_variant,
                               share_learners=o.share_learners, freeze_bn=config.get("freeze_bn", False))
        except KeyError as err:
            raise ValueError(f"{self._where('cam_after / oam_layers')}: {err.args[0]}") from err
        except ValueError as err:
            raise ValueError(f"{self._where('num_scales / num_cams')} with training.embedding_dim: {err}") from err

    def _learner_dim(self) -> int:
        o = self.options
        return self.training["embedding_dim"] // (o.num_scales * max(o.num_cams, 1))

    def build_loss(self, num_classes: int) -> DeMLLoss:
        """:class:`DeMLLoss` around the metric loss of ``methods.<name>.loss`` (built for one learner)."""
        o = self.options
        width = self._learner_dim()
        metric = build_loss(self.method["loss"], num_classes=num_classes, embedding_dim=width)
        return DeMLLoss(metric, num_scales=o.num_scales, learners_per_scale=max(o.num_cams, 1), learner_dim=width,
                        adversary=o.adversary, adversary_weight=o.lambda0, adversary_hidden=o.adversary_hidden,
                        adversary_margin=o.adversary_margin, decay_weight=o.activation_decay,
                        ntri_weight=o.ntri_weight)

    # --- training -------------------------------------------------------------------------
    def training_loss(self, model: nn.Module, loss: nn.Module, images: torch.Tensor, labels: torch.Tensor,
                      indices: torch.Tensor) -> torch.Tensor:
        """Eq. 4 + 5 + 6 on the raw learner outputs of every scale; the terms are accumulated for the log."""
        outputs = model.learner_outputs(images)
        terms = loss(outputs, labels, model.learner_weights())
        with torch.no_grad():
            values = {name: getattr(terms, name).detach().float() for name in _TERMS}
            values["cosine"] = _mean_learner_cosine(outputs)
            for name, value in values.items():
                self._sums[name] = self._sums.get(name, torch.zeros_like(value)) + value
        self._batches += 1
        return terms.total

    def on_epoch_start(self, epoch: int, model: nn.Module, context: TrainContext) -> None:
        """Reset the per-epoch means of the loss terms."""
        self._sums, self._batches = {}, 0

    def epoch_log(self) -> dict[str, float]:
        """Epoch means of the weighted loss terms and of the training learner cosine."""
        def mean(name: str) -> float:
            return float(self._sums[name]) / self._batches if self._batches and name in self._sums else math.nan

        return {**{f"loss_{name}": mean(name) for name in _TERMS}, "learner_cosine": mean("cosine")}

    # --- test time ------------------------------------------------------------------------
    def embedding_views(self, model: nn.Module) -> dict[str, tuple[int, int]]:
        """``scale<i>`` → the columns of scale i's learners (its OA root learner), for I ≥ 2."""
        slices = model.scale_slices()
        return {f"scale{i}": s for i, s in enumerate(slices)} if len(slices) > 1 else {}

    def attention_maps(self, model: nn.Module, images: torch.Tensor) -> dict[str, torch.Tensor]:
        """``oam_scale<i>`` (OAM saliency of scale i's input), ``crop_scale<i>`` (the box it crops)
        and ``cam<j>`` (scale 0's CAM-attended maps), each (B, h, w) in [0, 1]; see
        :meth:`DeMLNetwork.attention`."""
        return model.attention(images)


def _mean_learner_cosine(outputs: list[torch.Tensor]) -> torch.Tensor:
    """Mean cosine similarity between two learners of the same scale for the same image; NaN for J = 1."""
    sims = []
    for embeddings in outputs:  # (J, B, w)
        unit = F.normalize(embeddings.float(), dim=-1)
        j = unit.shape[0]
        if j < 2:
            continue
        total = unit.sum(0)
        pair_sum = total.pow(2).sum(-1) - unit.pow(2).sum((0, 2))  # Σ_{j≠j'} <e_j, e_j'> per image
        sims.append((pair_sum / (j * (j - 1))).mean())
    return torch.stack(sims).mean() if sims else torch.tensor(math.nan)
