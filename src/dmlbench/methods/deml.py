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

Mechanism health (:func:`oam_health`, :meth:`DeMLRecipe.health_checks`, thresholds in
docs/methods/deml.md): after every epoch, on up to :data:`HEALTH_IMAGES` validation images
with an object box (the manifest's ``bbox``, via ``RunData.val_boxes``), the share whose
scale-0 saliency is higher inside the object box than outside (``health/saliency_in_object``),
the share whose crop covers ≥ :data:`CROP_COVER_FRACTION` of the object box
(``health/crop_contains_object``) and the crops' mean area (``health/crop_area``); NaN on a
dataset without boxes, where the OAM checks are not made.
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any, Literal, cast

import numpy as np
import torch
import torch.nn.functional as F
from PIL import Image, ImageDraw
from torch import nn

from dmlbench.data.manifest import ManifestError
from dmlbench.data.stored_dataset import ImageSet, model_inputs
from dmlbench.losses import build_loss
from dmlbench.losses.deml_loss import CODE_NTRI_WEIGHT, PAPER_NTRI_WEIGHT, DeMLLoss
from dmlbench.methods.base import Recipe, TrainContext
from dmlbench.methods.health import HealthCheck
from dmlbench.models.backbones import build_backbone
from dmlbench.models.deml import DeMLNetwork
from dmlbench.models.deml_attention import box_coverage, saliency_contrast

#: λ0 used when ``adversary_weight`` is not given: the paper's 1 (grl) or the code's 0.2 per pair (contrastive).
DEFAULT_ADVERSARY_WEIGHT = {"grl": 1.0, "contrastive": 0.2, "none": 0.0}
#: λ2 used when ``ntri_weight`` is not given, per ``ntri_variant``.
DEFAULT_NTRI_WEIGHT = {"code": CODE_NTRI_WEIGHT, "paper": PAPER_NTRI_WEIGHT}
#: A crop *contains the object* when it covers at least this share of the object box's area. The
#: crop is the code's square of side (w + h) / 2, which clips an elongated object even when it is
#: centred on it exactly (a 3:2 box keeps 0.83 of its area; 0.79–0.92 on the synthetic objects).
CROP_COVER_FRACTION = 0.75
#: At most this many images with a box (evenly spaced over the validation rows, or over the
#: training rows without a validation split) are measured for the health numbers each epoch.
HEALTH_IMAGES = 256
#: Dataset kinds whose prepared manifest carries object boxes (``bbox``), unless ``cropped``.
BOXED_KINDS = frozenset({"synthetic", "cub200", "cars196"})
#: The recipe's health numbers (``log.csv`` every epoch, ``metrics.json`` from the last epoch).
HEALTH_KEYS = ("health/saliency_in_object", "health/crop_contains_object", "health/crop_area")
#: Health bounds; measured values and reasons in docs/methods/deml.md, "Mechanism health".
#: Share of images with more saliency on the object than off it (working OAM: 1.0, dead: 0.34–0.75).
MIN_SALIENCY_IN_OBJECT = 0.9
#: Share of scale-0 crops that contain the object (working OAM: 0.97, dead: 0.66).
MIN_CROP_CONTAINS_OBJECT = 0.8
#: Mean cosine between two learners of an image (adversary on: −0.04; off: 0.996; paper: 0.92–0.95 off).
MAX_SELF_SIMILARITY = 0.5
#: A single CA learner's R@1 above chance (synthetic chance: 39 / 1999 ≈ 0.02; CUB ≈ 0.01).
MIN_LEARNER_RECALL1 = 0.03


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
        cam_init: 'identity' (default: gate 2σ(z) with the last CAM layer zero, every gate exactly
            1 at initialisation, so the CAMs leave the pretrained features unchanged) or 'paper'
            (the paper's gate σ(z) at PyTorch's default init: gates ≈ 0.5 in front of frozen
            BatchNorm; DeML(3, 3)'s validation R@1 at init on cub_lite 0.515 against 0.764 with
            the same learners); see :class:`dmlbench.models.deml_attention.ChannelAttention`
            and docs/methods/deml.md, Reading 12.
        share_learners: False (default): one ω_ij per CA learner (Eq. 6 as written); True: the J
            CA learners of a scale share one linear layer (authors' code; the CAMs alone
            differentiate them, as the paper's remark on Eq. 4 and Table 4's 'sim' presuppose).
            Shared learners are identical at init, so the adversary's hinge starts maximal and pulls
            them apart through the CAM gates: on cub_lite DeML(3, 3)'s validation R@1 fell from
            0.747 to 0.676 in the first epoch, against 0.785 → 0.804 unshared (docs/results.md);
            see :mod:`dmlbench.models.deml`.
        oam_layers: backbone stages whose maps the OAM random walk reads (GoogLeNet:
            inception4e and inception5b, §4; the authors' code: inception5b only).
        oam_iterations: random-walk steps T ≥ 1 (10, §3.1).
        oam_variant: 'code' (default; the authors' ProposalCrop: edge weights × a Gaussian of
            the spatial distance, σ = 0.15 × side, first CAM branch only) or 'paper' (edge weights
            ‖u_a − u_b‖, average of all CAM branches). Without the spatial term the walk's mass
            goes to the *rarest* features, the background as soon as the object fills half the
            map (embedded default after training: saliency higher inside the object on 34 % of
            the images against 100 % with it). Both give each layer one vote and crop the code's
            box (largest above-mean region, squared; the paper gives no rule); see
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
        ntri_variant: the scale of L_ntri: 'code' (the released code: λ2 × the mean over each
            distinct matrix's rows, summed over matrices) or 'paper' (summed over the I·J
            learners and their rows); see :mod:`dmlbench.losses.deml_loss`.
        ntri_weight: λ2 ≥ 0 of the non-trivial-solution term; None = 0.5 for 'code' (the code's
            ``lamda``), 0.25 for 'paper' (§4); only meaningful with λ1 > 0.

    The defaults are DeML(I=3, J=3) with the paper's weights and cut points for the embedded
    ``small_cnn`` at 56 px: CAMs on stage2 (7×7), OAM on stage2 (7×7) and stage3 (4×4) —
    stage4 is 2×2 there, too coarse to locate anything.
    """

    num_scales: int = 3
    num_cams: int = 3
    cam_after: str = "stage2"
    cam_hidden: int = 64
    cam_pooled: bool = True
    cam_init: Literal["identity", "paper"] = "identity"
    share_learners: bool = False
    oam_layers: tuple[str, ...] = ("stage2", "stage3")
    oam_iterations: int = 10
    oam_variant: Literal["code", "paper"] = "code"
    adversary: Literal["grl", "contrastive", "none"] = "grl"
    adversary_weight: float | None = None
    adversary_hidden: int = 128
    adversary_margin: float = 2.0
    activation_decay: float = 0.014
    ntri_variant: Literal["code", "paper"] = "code"
    ntri_weight: float | None = None

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
            (self.ntri_weight is None or self.ntri_weight >= 0, "ntri_weight must be ≥ 0"),
        ]
        for ok, message in checks:
            if not ok:
                raise ValueError(message)

    @property
    def lambda0(self) -> float:
        """The adversary weight in effect."""
        return DEFAULT_ADVERSARY_WEIGHT[self.adversary] if self.adversary_weight is None else self.adversary_weight

    @property
    def lambda2(self) -> float:
        """The L_ntri weight in effect."""
        return DEFAULT_NTRI_WEIGHT[self.ntri_variant] if self.ntri_weight is None else self.ntri_weight


_TERMS = ("metric", "adversary", "decay", "ntri")


class DeMLRecipe(Recipe):
    """DeML: multi-scale (OAM crops) × multi-CAM learners, binomial deviance + adversary + activation decay."""

    options_class = DeMLOptions
    options: DeMLOptions

    def __init__(self, run: Mapping[str, Any]):
        super().__init__(run)
        self._sums: dict[str, torch.Tensor] = {}
        self._batches = 0
        self._model: DeMLNetwork | None = None
        self._context: TrainContext | None = None
        self._health: dict[str, float] = dict.fromkeys(HEALTH_KEYS, math.nan)

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
        backbone = self.settings.backbone
        backbones = [build_backbone(backbone.section) for _ in range(o.num_scales)]
        try:
            return DeMLNetwork(
                backbones,
                self.settings.embedding_dim,
                o.num_cams,
                o.cam_after,
                o.cam_hidden,
                o.cam_pooled,
                o.oam_layers,
                o.oam_iterations,
                o.oam_variant,
                share_learners=o.share_learners,
                freeze_bn=backbone.freeze_bn,
                cam_init=o.cam_init,
            )
        except KeyError as err:
            raise ValueError(f"{self._where('cam_after / oam_layers')}: {err.args[0]}") from err
        except ValueError as err:
            raise ValueError(f"{self._where('num_scales / num_cams')} with training.embedding_dim: {err}") from err

    def _learner_dim(self) -> int:
        o = self.options
        return self.settings.embedding_dim // (o.num_scales * max(o.num_cams, 1))

    def build_loss(self, num_classes: int) -> DeMLLoss:
        """:class:`DeMLLoss` around the metric loss of ``methods.<name>.loss`` (built for one learner)."""
        o = self.options
        width = self._learner_dim()
        metric = build_loss(self.method["loss"], num_classes=num_classes, embedding_dim=width)
        return DeMLLoss(
            metric,
            num_scales=o.num_scales,
            learners_per_scale=max(o.num_cams, 1),
            learner_dim=width,
            adversary=o.adversary,
            adversary_weight=o.lambda0,
            adversary_hidden=o.adversary_hidden,
            adversary_margin=o.adversary_margin,
            decay_weight=o.activation_decay,
            ntri_weight=o.lambda2,
            ntri_variant=o.ntri_variant,
        )

    # --- training -------------------------------------------------------------------------
    def training_loss(
        self, model: nn.Module, loss: nn.Module, images: torch.Tensor, labels: torch.Tensor, indices: torch.Tensor
    ) -> torch.Tensor:
        """Eq. 4 + 5 + 6 on the raw learner outputs of every scale; the terms are accumulated for the log."""
        model = cast(DeMLNetwork, model)  # what build_model made
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
        """Reset the per-epoch means of the loss terms; keep the model and data for the health numbers."""
        self._sums, self._batches = {}, 0
        self._model, self._context = cast(DeMLNetwork, model), context

    def epoch_log(self) -> dict[str, float]:
        """Epoch means of the weighted loss terms and of the training learner cosine, and the OAM
        health numbers of the model after the epoch (:func:`oam_health`; NaN without boxes)."""

        def mean(name: str) -> float:
            return float(self._sums[name]) / self._batches if self._batches and name in self._sums else math.nan

        if self._model is not None and self._context is not None:
            self._health = oam_health(self._model, self._context)
        return {**{f"loss_{name}": mean(name) for name in _TERMS}, "learner_cosine": mean("cosine"), **self._health}

    def summary(self) -> dict[str, float]:
        """The last epoch's OAM health numbers (only the finite ones: none on a dataset without boxes)."""
        return {key: value for key, value in self._health.items() if math.isfinite(value)}

    def state_dict(self) -> dict[str, Any]:
        """The last epoch's health numbers (for :meth:`summary` after a resume)."""
        return {"health": dict(self._health)}

    def load_state_dict(self, state: Mapping[str, Any]) -> None:
        self._health = {**dict.fromkeys(HEALTH_KEYS, math.nan), **state.get("health", {})}

    def health_checks(self) -> list[HealthCheck]:
        """The OAM checks when a scale crops (I ≥ 2) on a dataset with boxes; the diversity check
        when an adversary separates J ≥ 2 CA learners; the learners' own R@1 when there are ≥ 2.
        Thresholds and their reasons: docs/methods/deml.md, "Mechanism health"."""
        o = self.options
        checks = []
        if o.num_scales >= 2 and dataset_has_boxes(self.run["dataset_config"]):
            checks += [
                HealthCheck(
                    "health/saliency_in_object",
                    minimum=MIN_SALIENCY_IN_OBJECT,
                    meaning="the OAM saliency is not higher on the object than off it",
                ),
                HealthCheck(
                    "health/crop_contains_object",
                    minimum=MIN_CROP_CONTAINS_OBJECT,
                    meaning="the OAM crops cut the object instead of zooming onto it",
                ),
            ]
        if o.num_cams >= 2 and o.adversary != "none" and o.lambda0 > 0:
            checks.append(
                HealthCheck(
                    "self_similarity",
                    maximum=MAX_SELF_SIMILARITY,
                    meaning="the adversary did not decorrelate the CA learners",
                )
            )
        if o.num_scales * max(o.num_cams, 1) >= 2:
            checks.append(
                HealthCheck(
                    "learners_mean/R@1",
                    minimum=MIN_LEARNER_RECALL1,
                    meaning="a single CA learner retrieves at chance level",
                )
            )
        return checks

    # --- test time ------------------------------------------------------------------------
    def embedding_views(self, model: nn.Module) -> dict[str, tuple[int, int]]:
        """``scale<i>`` → the columns of scale i's learners (its OA root learner), for I ≥ 2."""
        slices = cast(DeMLNetwork, model).scale_slices()
        return {f"scale{i}": s for i, s in enumerate(slices)} if len(slices) > 1 else {}

    def attention_maps(self, model: nn.Module, images: torch.Tensor) -> dict[str, torch.Tensor]:
        """``oam_scale<i>`` (OAM saliency of scale i's input), ``crop_scale<i>`` (the box it crops)
        and ``cam<j>`` (scale 0's CAM-attended maps), each (B, h, w) in [0, 1]; see
        :meth:`DeMLNetwork.attention`."""
        return cast(DeMLNetwork, model).attention(images)


def dataset_has_boxes(dataset_config: Mapping[str, Any]) -> bool:
    """Whether the dataset's prepared manifest carries object boxes (:data:`BOXED_KINDS`, not cropped)."""
    return dataset_config.get("kind") in BOXED_KINDS and not dataset_config.get("cropped", False)


def _health_rows(context: TrainContext) -> tuple[ImageSet, np.ndarray, np.ndarray] | None:
    """The images measured for the health numbers: (dataset with the test transform, row indices,
    their (N, 4) (x, y, w, h) file-pixel boxes); validation rows, else training rows; None without boxes."""
    data = context.data
    if data.val is not None and data.val_boxes is not None:
        dataset, boxes = data.val, data.val_boxes
    elif data.train_boxes is not None:
        dataset, boxes = data.train.evaluation_view(data.test), data.train_boxes
    else:
        return None
    usable = np.flatnonzero(np.isfinite(boxes).all(1) & (boxes[:, 2] > 0) & (boxes[:, 3] > 0))
    if not len(usable):
        return None
    rows = usable[np.unique(np.linspace(0, len(usable) - 1, min(HEALTH_IMAGES, len(usable))).round().astype(int))]
    return dataset, rows, boxes[rows]


def transformed_box(dataset: ImageSet, row: int, box: np.ndarray) -> torch.Tensor:
    """An (x, y, w, h) box of row ``row``'s image file, carried through the dataset's (deterministic)
    transform as a mask image: (x0, y0, x1, y1) pixels of the transformed image, end exclusive
    (all zero when the box leaves the crop). A box partly outside the image is clipped to it (real
    boxes overrun the border by a pixel); one wholly outside is a :class:`ManifestError`."""
    with Image.open(dataset.paths[row]) as image:
        size = image.size
    x, y, w, h = (float(v) for v in box)
    if x >= size[0] or y >= size[1] or x + w <= 0 or y + h <= 0:
        raise ManifestError(
            f"{dataset.paths[row]}: its bbox ({x:g} {y:g} {w:g} {h:g}) lies outside the "
            f"{size[0]}×{size[1]} image; the manifest's bbox must be in the pixels of the image "
            f"file: correct it, or re-run `dmlbench prepare <dataset>`"
        )
    mask = Image.new("L", size, 0)
    ImageDraw.Draw(mask).rectangle([x, y, x + w - 1, y + h - 1], fill=255)
    inside = dataset.transform(mask.convert("RGB"))[0] >= 0.5  # (H, W)
    rows, cols = inside.any(1).nonzero().flatten(), inside.any(0).nonzero().flatten()
    if not len(rows):
        return torch.zeros(4)
    return torch.tensor([cols[0], rows[0], cols[-1] + 1, rows[-1] + 1], dtype=torch.float32)


@torch.no_grad()
def oam_health(model: DeMLNetwork, context: TrainContext) -> dict[str, float]:
    """Whether scale 0's OAM finds the object, on up to :data:`HEALTH_IMAGES` images with a box.

    Returns:
        ``health/saliency_in_object``: share of the images whose mean saliency inside the object
        box exceeds the mean outside it; ``health/crop_contains_object``: share whose crop (the
        next scale's input) covers ≥ :data:`CROP_COVER_FRACTION` of the object box's area;
        ``health/crop_area``: the crops' mean area as a share of the image. All NaN when no
        image has a box.
    """
    subset = _health_rows(context)
    if subset is None:
        return dict.fromkeys(HEALTH_KEYS, math.nan)
    dataset, rows, boxes = subset
    was_training = model.training
    model.eval()
    contrasts, coverages, areas = [], [], []
    for start in range(0, len(rows), context.eval_batch_size):
        chunk = range(start, min(start + context.eval_batch_size, len(rows)))
        images = model_inputs(dataset, [int(rows[i]) for i in chunk], context.device)
        objects = torch.stack([transformed_box(dataset, int(rows[i]), boxes[i]) for i in chunk]).to(context.device)
        saliency, crops = model.first_proposal(images)
        height, width = images.shape[-2:]
        contrasts.append(saliency_contrast(saliency, objects).cpu())
        coverages.append(box_coverage(crops, objects).cpu())
        areas.append(((crops[:, 2] - crops[:, 0]) * (crops[:, 3] - crops[:, 1]) / (height * width)).cpu())
    model.train(was_training)
    contrast, coverage = torch.cat(contrasts), torch.cat(coverages)
    contrast, coverage = contrast[contrast.isfinite()], coverage[coverage.isfinite()]
    return {
        "health/saliency_in_object": float((contrast > 0).float().mean()) if len(contrast) else math.nan,
        "health/crop_contains_object": (
            float((coverage >= CROP_COVER_FRACTION).float().mean()) if len(coverage) else math.nan
        ),
        "health/crop_area": float(torch.cat(areas).mean()),
    }


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
