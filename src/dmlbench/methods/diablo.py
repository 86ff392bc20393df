"""DIABLO recipe (``recipe: diablo``): dictionary-based attention block with N branch embeddings.

Model: :class:`dmlbench.models.diablo.DIABLO` (selection feature-/dimension-wise,
pre-/post-attention, N branches of d/N dimensions, each L2-normalised, concatenated).

Loss (DIABLO §3.5). The paper names the losses (contrastive β = 0.5, triplet
margin 0.1, binomial β = 0.5, C = 25) but not what they are applied to. Our
reading, the default ``loss_on: branches``: the loss of ``methods.<name>.loss``
on each branch embedding separately (its own copy per branch), averaged over the
N branches. Reasons: §4.1 says the architecture "directly follows ABE", and §4.4
says the dictionary's structural constraint "allows to simply remove the
divergence loss" of ABE, whose objective is the sum over learners of the metric
loss plus the divergence; removing the divergence leaves the per-learner metric
losses. We average instead of summing so that the loss scale (and the learning
rate) does not depend on N (Adam is nearly invariant to that scale anyway). On
the embedded default this reading also trained clearly better than the other.
``loss_on: concatenation`` is the other reading: one loss on the 512-d
concatenation (§4.1: "the output representation is the concatenation of these
N branches"), divided by √N so that the margins see the unit vector they are
meant for (each branch has norm 1, the concatenation √N; the division changes no
ranking, so test-time retrieval on the concatenation is unaffected).

Options (``methods.<name>.options``): see :class:`DIABLOOptions`.

Mechanism health (``health/...`` keys; per epoch in log.csv, the last epoch's in
metrics.json), from the attention A (B, N, 1 or c, h, w) of the training batches:

- ``health/attention_entropy_ratio``: mean over images, positions (and channels)
  of H(A) / ln N — 1 is uniform attention (every branch sees the same map: dead),
  0 a one-hot selection;
- ``health/dictionary_usage``: perplexity of the mean assignment over the epoch
  divided by N — 1/N when every position picks the same entry (collapsed
  dictionary: one live branch), 1 when the entries are used equally often.

:meth:`DIABLORecipe.health_checks` bounds them and evaluation's ``self_similarity``
(branches not identical); the thresholds are documented in docs/methods/diablo.md.

Movement since the first training step (logged, not checked; :class:`MovementTracker`): whether
the attention of fixed images changes at all, which a steady mean entropy does not show:

- ``diablo/dictionary_relative_change``: ‖D̂ − D̂⁰‖ / ‖D̂⁰‖ of the dictionary's unit directions;
- ``diablo/attention_change``: mean total-variation distance between the attention of
  :data:`PROBE_IMAGES` probe images now and before the first step.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any, Literal, Mapping, cast

import torch
import torch.nn.functional as F
from torch import nn

from dmlbench.losses import build_loss
from dmlbench.methods.base import Recipe, TrainContext
from dmlbench.methods.health import HealthCheck
from dmlbench.models.backbones import build_backbone
from dmlbench.models.diablo import DIABLO


@dataclass(frozen=True)
class DIABLOOptions:
    """``methods.<name>.options`` of ``recipe: diablo``.

    Attributes:
        selection: 'dimension' (§3.4, N × c directions, Hadamard merge) or 'feature' (§3.3,
            N entries, Kronecker merge).
        placement: 'pre' (Fig. 1b: merge F with the maps, then ψ shared by the N maps) or
            'post' (Fig. 1a: ψ(F), then merge).
        dictionary_size: N ≥ 1, number of dictionary entries = branches; must divide
            ``training.embedding_dim`` (each branch has embedding_dim / N dimensions).
        hardness: α > 0 (dimensionless) of the softmax over the cosine similarities to the
            dictionary; the paper does not state its value. Default 3: identity at
            initialisation. A random dictionary's cosines to any φ feature have std 1/√m, so its
            attention multiplies every element of a branch's map by N·A, a noise of std ≈ α/√m
            (CUB, ``cub_lite``, m = 112: 0.27 at α = 3, 0.88 at α = 10, the value before issue 23,
            which dropped validation R@1 at init from the linear head's 0.773 to 0.619; α = 3
            starts at 0.759, uniform attention at 0.762). Cosines lie in [-1, 1], so a learned
            dictionary can still give one entry e^6 ≈ 400 times the weight of another at α = 3.
        feature_stage: backbone stage whose output is F (GoogLeNet: pool3 for pre-, pool4 for
            post-attention, DIABLO §4.1).
        phi_until: φ = its own copy of the backbone stages after ``feature_stage`` up to this
            one, initialised from the backbone (GoogLeNet: inception4e for pre-, inception5b
            for post-attention).
        psi_until: ψ = the backbone's own stages after ``feature_stage`` up to this one,
            followed by the backbone's ``pool`` (GoogLeNet: inception5b).
        loss_on: 'branches' (the loss on each branch, averaged over the branches; ABE's
            objective without its divergence term) or 'concatenation' (one loss on the
            concatenated branches / √N); see the module docstring.
        merge_scale: 'identity' (default: attention × N in the merge, so uniform attention
            passes the feature map unchanged to every branch and the stages after the merge
            see features of the scale they were trained on) or 'paper' (Eq. 9 / 13
            literally: the weights sum to 1 over the N entries, every branch gets ≈ X / N,
            which frozen BatchNorm after a pre-attention merge does not expect); see
            :func:`dmlbench.models.diablo.merge`.
        dictionary_init: 'unit' (default: random directions of norm 1) or 'normal' (a standard
            normal, rows of norm ≈ √m: the code before issue 23). Same directions, so the same
            attention at initialisation; under Adam the unit directions turn √m times faster
            (:func:`dmlbench.models.diablo.initial_dictionary`).
        dictionary_lr_multiplier: > 0; the dictionary's lr is this multiple of the head's
            (optimiser group ``head/dictionary``). Default 1 (the head's lr; with the paper
            overlay's single lr, the paper's one lr); ``cub_lite`` sets 10, where the head's lr
            1e-4 turned the unit directions 6 times slower than the branch linears.

    The defaults are the paper's main variant (dimension-wise, pre-attention, N = 8) with cut
    points for the embedded ``small_cnn``: F after stage2, φ = a copy of stage3, ψ = stage3–4.
    """

    selection: Literal["feature", "dimension"] = "dimension"
    placement: Literal["pre", "post"] = "pre"
    dictionary_size: int = 8
    hardness: float = 3.0
    feature_stage: str = "stage2"
    phi_until: str = "stage3"
    psi_until: str = "stage4"
    loss_on: Literal["branches", "concatenation"] = "branches"
    merge_scale: Literal["identity", "paper"] = "identity"
    dictionary_init: Literal["unit", "normal"] = "unit"
    dictionary_lr_multiplier: float = 1.0

    def __post_init__(self) -> None:
        if self.dictionary_size < 1:
            raise ValueError(f"dictionary_size must be ≥ 1, got {self.dictionary_size}")
        if not self.hardness > 0:
            raise ValueError(f"hardness must be > 0, got {self.hardness}")
        if not self.dictionary_lr_multiplier > 0:
            raise ValueError(
                f"dictionary_lr_multiplier must be > 0, got {self.dictionary_lr_multiplier} (1 = the head's lr)"
            )


#: ``health/attention_entropy_ratio`` above this: the attention is (close to) uniform, so every branch
#: sees nearly the same map. Random dictionaries at α = 10 start well below (see the docs' measurements).
MAX_ENTROPY_RATIO = 0.95
#: ``health/dictionary_usage`` below this: the assignments concentrate on few entries (1/N = one entry).
MIN_DICTIONARY_USAGE = 0.5
#: ``self_similarity`` above this: the branches embed each image (nearly) the same way.
MAX_SELF_SIMILARITY = 0.9


def attention_entropy_ratio(attention: torch.Tensor) -> torch.Tensor:
    """Mean over images, positions (and channels) of H(A) / ln N, in [0, 1]; 1 = uniform attention.

    Args:
        attention: (B, N, 1 or c, h, w) weights summing to 1 over axis 1, N ≥ 2.

    Returns:
        0-d tensor on the attention's device (reading it waits for the device).
    """
    n = attention.shape[1]
    entropy = -torch.special.xlogy(attention, attention).sum(dim=1)  # (B, rows, h, w), in nats
    return entropy.mean() / math.log(n)


def assignment_usage(mean_assignment: torch.Tensor) -> float:
    """Perplexity of a distribution over the N entries divided by N, in [1/N, 1].

    Args:
        mean_assignment: (N,) non-negative weights summing to 1.
    """
    entropy = -torch.special.xlogy(mean_assignment, mean_assignment).sum()
    return float(entropy.exp() / mean_assignment.numel())


def dictionary_usage(attention: torch.Tensor) -> float:
    """:func:`assignment_usage` of the mean assignment of (B, N, 1 or c, h, w) weights; 1/N = one entry."""
    return assignment_usage(attention.double().mean(dim=(0, 2, 3, 4)))


class AttentionStatistics:
    """Running attention statistics over the batches of one epoch (for the health numbers), kept on the
    attention's device in float64 so that a training step never waits for the GPU; read by :meth:`health`."""

    def __init__(self) -> None:
        self.entropy_sum: torch.Tensor | float = 0.0
        self.assignment_sum: torch.Tensor | None = None
        self.batches = 0

    def add(self, attention: torch.Tensor) -> None:
        """Add one batch's (B, N, 1 or c, h, w) attention (equal-sized batches weigh equally)."""
        self.entropy_sum = self.entropy_sum + attention_entropy_ratio(attention).double()
        mean = attention.double().mean(dim=(0, 2, 3, 4))
        self.assignment_sum = mean if self.assignment_sum is None else self.assignment_sum + mean
        self.batches += 1

    def health(self) -> dict[str, float]:
        """``health/attention_entropy_ratio`` (mean over batches) and ``health/dictionary_usage`` (of
        the epoch's mean assignment); NaN for an epoch without batches."""
        if self.assignment_sum is None:
            return {"health/attention_entropy_ratio": math.nan, "health/dictionary_usage": math.nan}
        return {
            "health/attention_entropy_ratio": float(self.entropy_sum) / self.batches,
            "health/dictionary_usage": assignment_usage(self.assignment_sum / self.batches),
        }


#: images of the first training batch whose attention is re-measured after every epoch (``diablo/attention_change``).
PROBE_IMAGES = 8


def relative_change(current: torch.Tensor, initial: torch.Tensor) -> float:
    """‖current − initial‖ / ‖initial‖ (Frobenius norms): 0 when unchanged, 1 for a change as long as
    ``initial`` itself. ``initial`` must not be all zero."""
    return float((current.double() - initial.double()).norm() / initial.double().norm())


def attention_change(current: torch.Tensor, initial: torch.Tensor) -> float:
    """Mean over images, positions (and channels) of the total-variation distance ½·Σₙ |Aₙ − A⁰ₙ| between
    two attentions of the same images, in [0, 1]: 0 unchanged, 1 every position moved all its weight to
    entries it gave none before.

    Args:
        current, initial: (B, N, 1 or c, h, w) weights summing to 1 over axis 1.
    """
    return float(0.5 * (current.double() - initial.double()).abs().sum(dim=1).mean())


class MovementTracker:
    """How far the dictionary and the attention of fixed images moved since the first training step.

    :meth:`start` keeps, before the first optimiser step, a copy of the dictionary D⁰ and of the first
    :data:`PROBE_IMAGES` images of the first training batch with their attention A⁰ (eval mode, at
    φ's resolution, full precision); :meth:`measure` compares the current dictionary and these
    images' current attention with them. The attention moves when the dictionary or φ do; a mean
    entropy that stays put does not show whether it moved.
    """

    def __init__(self) -> None:
        self.dictionary: torch.Tensor | None = None
        self.images: torch.Tensor | None = None
        self.attention: torch.Tensor | None = None

    @staticmethod
    def probe_attention(model: DIABLO, images: torch.Tensor) -> torch.Tensor:
        """(B, N, 1 or c, h, w) attention of ``images`` in eval mode, without autocast; restores the mode."""
        was_training = model.training
        model.eval()
        with torch.no_grad(), torch.autocast(images.device.type, enabled=False):
            attention = model.selection_maps(images)
        model.train(was_training)
        return attention

    def start(self, model: DIABLO, images: torch.Tensor) -> None:
        """Keep D⁰ and the probe images' A⁰ unless already kept (the first call of the run counts)."""
        if self.dictionary is not None:
            return
        self.dictionary = model.selection.dictionary.detach().clone()
        self.images = images[:PROBE_IMAGES].detach().clone()
        self.attention = self.probe_attention(model, self.images)

    def measure(self, model: DIABLO) -> dict[str, float]:
        """Since :meth:`start` (NaN before it):

        - ``diablo/dictionary_relative_change``: :func:`relative_change` of the dictionary's *unit*
          directions, i.e. the root mean square over the directions of the chord ‖d̂ − d̂⁰‖ (≈ the
          angle turned, in radians, for small turns). Only directions enter the cosine: weight decay
          shrinking the directions' lengths changes no attention and does not count;
        - ``diablo/attention_change``: :func:`attention_change` of the probe images.
        """
        if self.dictionary is None or self.images is None or self.attention is None:  # kept together by start
            return {"diablo/dictionary_relative_change": math.nan, "diablo/attention_change": math.nan}
        dictionary = model.selection.dictionary.detach()
        device = dictionary.device
        return {
            "diablo/dictionary_relative_change": relative_change(
                F.normalize(dictionary, dim=-1), F.normalize(self.dictionary.to(device), dim=-1)
            ),
            "diablo/attention_change": attention_change(
                self.probe_attention(model, self.images.to(device)), self.attention.to(device)
            ),
        }

    def state_dict(self) -> dict[str, torch.Tensor | None]:
        return {"dictionary": self.dictionary, "images": self.images, "attention": self.attention}

    def load_state_dict(self, state: Mapping[str, torch.Tensor | None]) -> None:
        self.dictionary, self.images, self.attention = state["dictionary"], state["images"], state["attention"]


class DIABLORecipe(Recipe):
    """DIABLO: backbone + dictionary attention + N L2-normalised branches, one standard loss."""

    options_class = DIABLOOptions
    options: DIABLOOptions

    def __init__(self, run: Mapping[str, Any]):
        """Raises ValueError when ``training.embedding_dim`` is not divisible by the dictionary size."""
        super().__init__(run)
        dim, entries = self.settings.embedding_dim, self.options.dictionary_size
        if dim % entries:
            raise ValueError(
                f"training.embedding_dim = {dim} is not divisible by {self._where('dictionary_size')}"
                f" = {entries}; choose N dividing it (each branch has d/N dimensions)"
            )
        self._health = AttentionStatistics()
        self._movement = MovementTracker()
        self._model: DIABLO | None = None
        self._last_log: dict[str, float] = {}

    def _where(self, key: str) -> str:
        return f"methods.{self.run.get('method', '?')}.options.{key}"

    def build_model(self) -> DIABLO:
        """The DIABLO model of the options on ``training.backbone``.

        Raises:
            ValueError: a cut point that is unknown or out of order (the message names the option).
        """
        o = self.options
        dim = self.settings.embedding_dim
        backbone = build_backbone(self.settings.backbone.section)
        try:
            return DIABLO(
                backbone,
                selection=o.selection,
                placement=o.placement,
                num_entries=o.dictionary_size,
                hardness=o.hardness,
                feature_stage=o.feature_stage,
                phi_until=o.phi_until,
                psi_until=o.psi_until,
                embedding_dim=dim,
                freeze_bn=self.settings.backbone.freeze_bn,
                merge_scale=o.merge_scale,
                dictionary_init=o.dictionary_init,
                dictionary_lr_multiplier=o.dictionary_lr_multiplier,
            )
        except (KeyError, ValueError) as err:
            raise ValueError(f"{self._where('feature_stage / phi_until / psi_until')}: {err}") from err

    def build_loss(self, num_classes: int) -> nn.Module:
        """A ModuleList of N per-branch copies of the loss (``loss_on: branches``), or one loss on the
        concatenation (``loss_on: concatenation``)."""
        o = self.options
        dim = self.settings.embedding_dim
        if o.loss_on == "concatenation":
            return build_loss(self.method["loss"], num_classes=num_classes, embedding_dim=dim)
        branch_dim = dim // o.dictionary_size
        return nn.ModuleList(
            build_loss(self.method["loss"], num_classes=num_classes, embedding_dim=branch_dim)
            for _ in range(o.dictionary_size)
        )

    def training_loss(
        self, model: nn.Module, loss: nn.Module, images: torch.Tensor, labels: torch.Tensor, indices: torch.Tensor
    ) -> torch.Tensor:
        """The mean of the per-branch losses, or the loss of the concatenation / √N (see module docstring);
        accumulates the batch's attention statistics for :meth:`epoch_log` (the run's first batch also
        starts the :class:`MovementTracker`)."""
        model = cast(DIABLO, model)  # what build_model made
        self._movement.start(model, images)
        attention, attended = model.attend(images)
        self._health.add(attention.detach())
        branches = model.embed_attended(attended)  # (B, N, d/N), unit-norm rows per branch
        if isinstance(loss, nn.ModuleList):
            return torch.stack([branch_loss(branches[:, n], labels) for n, branch_loss in enumerate(loss)]).mean()
        return loss(branches.flatten(1) / math.sqrt(branches.shape[1]), labels)

    # --- mechanism health -------------------------------------------------------------------
    def on_epoch_start(self, epoch: int, model: nn.Module, context: TrainContext) -> None:
        """A fresh epoch of attention statistics; ``model`` is the one :meth:`epoch_log` measures."""
        self._health = AttentionStatistics()
        self._model = cast(DIABLO, model)

    def epoch_log(self) -> dict[str, float]:
        """``health/attention_entropy_ratio`` and ``health/dictionary_usage`` of the epoch's training
        batches, and the movement since the first step (:meth:`MovementTracker.measure`) of the model
        given to :meth:`on_epoch_start`; none for N = 1 (one entry has nothing to select)."""
        if self.options.dictionary_size == 1:
            return {}
        if self._model is None:
            raise RuntimeError("recipe diablo: epoch_log before on_epoch_start gave it the model to measure")
        self._last_log = {**self._health.health(), **self._movement.measure(self._model)}
        return dict(self._last_log)

    def summary(self) -> dict[str, float]:
        """The last epoch's :meth:`epoch_log` (copied into metrics.json)."""
        return dict(self._last_log)

    def state_dict(self) -> dict[str, Any]:
        return {"last_log": dict(self._last_log), "movement": self._movement.state_dict()}

    def load_state_dict(self, state: Mapping[str, Any]) -> None:
        self._last_log = dict(state.get("last_log", {}))
        if "movement" in state:
            self._movement.load_state_dict(state["movement"])

    def health_checks(self) -> list[HealthCheck]:
        """Attention not uniform, dictionary not collapsed onto one entry, branches not identical
        (none for N = 1). Thresholds: the module constants, justified in docs/methods/diablo.md."""
        if self.options.dictionary_size == 1:
            return []
        return [
            HealthCheck(
                "health/attention_entropy_ratio",
                maximum=MAX_ENTROPY_RATIO,
                meaning="the attention is (nearly) uniform over the dictionary: every branch sees the same map",
            ),
            HealthCheck(
                "health/dictionary_usage",
                minimum=MIN_DICTIONARY_USAGE,
                meaning="the assignments collapsed onto few dictionary entries",
            ),
            HealthCheck(
                "self_similarity", maximum=MAX_SELF_SIMILARITY, meaning="the branches embed every image the same way"
            ),
        ]

    def attention_maps(self, model: nn.Module, images: torch.Tensor) -> dict[str, torch.Tensor]:
        """``entry<n>`` → (B, h, w) in [0, 1]: where dictionary entry n is selected, at the merge resolution.

        Feature-wise: the attention map A⁽ⁿ⁾ itself (the maps sum to 1 over the entries).
        Dimension-wise: A⁽ⁿ⁾ averaged over the feature dimensions (the mean selection weight of
        entry n), min–max scaled per image and entry. The mean over hundreds of dimensions
        stays close to 1/N everywhere, so unscaled maps would all look the same; the scaled
        ones show where each entry takes more of the dimensions (a constant map becomes 0).
        """
        attention, _ = cast(DIABLO, model).attend(images)
        maps = attention.mean(dim=2)  # (B, N, h, w)
        if attention.shape[2] > 1:
            low = maps.amin(dim=(2, 3), keepdim=True)
            span = maps.amax(dim=(2, 3), keepdim=True) - low
            maps = torch.where(span > 0, (maps - low) / span.clamp_min(torch.finfo(maps.dtype).tiny), 0.0)
        return {f"entry{n}": maps[:, n] for n in range(maps.shape[1])}
