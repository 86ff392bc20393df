"""DIABLO: dictionary-based attention block (Jacob, Picard, Histace & Klein, PRL 2020).

Notation of the paper (§3): a feature map F (c channels, h × w positions) is
taken from the backbone after a named stage; φ maps it to m channels; a learned
dictionary D turns φ(F) into N attention maps A (the selection block S); the
merge block M combines A with a feature map; each of the N resulting maps is
pooled, embedded by its own linear layer (d/N outputs) and L2-normalised, and
the N branch embeddings are concatenated (d outputs).

Selection (S):

- **feature-wise** (§3.3, Eq. 5–7): N entries d⁽ⁿ⁾ ∈ Rᵐ;
  ``A⁽ⁿ⁾_ij = softmax_n(α · cos(φ(f_ij), d⁽ⁿ⁾))``, the same weight for every
  channel k. As α → ∞ it becomes the one-hot arg max of Eq. 6.
- **dimension-wise** (§3.4, Eq. 10–11): N × c directions d⁽ⁿ⁾_k ∈ Rᵐ;
  ``A⁽ⁿ⁾_ijk = softmax_n(α · cos(φ(f_ij), d⁽ⁿ⁾_k))``, one distribution over the
  N entries per position and channel.

Merge (M): ``H⁽ⁿ⁾_ijk = s · A⁽ⁿ⁾_ijk · X_ijk`` — for feature-wise selection the
Kronecker product ``A_ij ⊗ x_ij`` (Eq. 8–9), for dimension-wise the Hadamard
product with X duplicated N times, ``(X ⊗ 1_N) ⊙ A`` (Eq. 12–13). Both are
one broadcast product here: feature-wise maps carry a channel axis of size 1.
The scale s (``merge_scale``):

- ``identity`` (default), s = N: *uniform* attention is the identity. Uniform
  means A⁽ⁿ⁾ = 1/N for every entry n at every position (i, j) — and, for
  dimension-wise selection, at every channel k too, i.e. each (i, j, k) spreads
  its weight evenly over the entries; then every branch receives X itself.
  For any attention the N merged maps average to X (the merge splits X among
  the branches instead of shrinking it).
- ``paper``, s = 1: Eq. 9 / Eq. 13 literally. The weights sum to 1 over the N
  entries, so each branch receives ≈ X / N. The paper's Caffe GoogLeNet has no
  BatchNorm and its ReLU stages are scale-equivariant; with frozen BatchNorm
  (a pretrained backbone with ``freeze_bn``) pre-attention feeds ψ maps N times
  smaller than its running statistics expect. Measured on CUB (``cub_lite``,
  N = 8, at initialisation): the branches' pooled features have cosine 0.13 to
  the backbone's, and their R@1 falls from 0.52 to 0.20 (docs/methods/diablo.md).

Placement:

- **pre-attention** (Fig. 1b, Eq. 3–4): X = F; the N merged maps go through
  ψ (shared by the N maps: they are stacked along the batch axis);
- **post-attention** (Fig. 1a, Eq. 1–2): X = ψ(F), then merge.

ψ is the backbone's own stages after the feature stage (the pretrained network
continues, as in ABE and DIABLO §4.1); φ is a *copy* of backbone stages made at
build time (DIABLO §4.1: "the five inception blocks from the fourth scale of
GoogleNet pre-trained on ImageNet", independent from ψ). When φ's output has
another spatial size than the map it is merged with (the small CNN downsamples
in every stage; GoogLeNet's cut points keep the sizes equal), the attention
maps are resized bilinearly; a bilinear resize is a convex combination of
neighbouring positions, so the weights still sum to 1 over the dictionary.
"""

from __future__ import annotations

import copy
from typing import Literal

import torch
import torch.nn.functional as F
from torch import Tensor, nn

from dmlbench.models.backbones import StagedBackbone, freeze_batchnorm

Selection = Literal["feature", "dimension"]
Placement = Literal["pre", "post"]
MergeScale = Literal["identity", "paper"]
MERGE_SCALES: tuple[str, ...] = ("identity", "paper")
DictionaryInit = Literal["unit", "normal"]
DICTIONARY_INITS: tuple[str, ...] = ("unit", "normal")

#: floor of the norms in the cosine similarity (an all-zero φ feature gets similarity 0 to every entry).
COSINE_EPS = 1e-8


def cosine_similarities(features: Tensor, directions: Tensor) -> Tensor:
    """Cosine similarity of every local feature to every direction (Eq. 5 / Eq. 10).

    Args:
        features: (B, m, h, w) transformed features φ(F).
        directions: (K, m) dictionary directions.

    Returns:
        (B, K, h, w) similarities in [-1, 1].
    """
    unit_features = F.normalize(features, dim=1, eps=COSINE_EPS)
    unit_directions = F.normalize(directions, dim=1, eps=COSINE_EPS)
    return torch.einsum("bmhw,km->bkhw", unit_features, unit_directions)


def select(similarities: Tensor, hardness: float) -> Tensor:
    """Soft assignment to the dictionary entries (Eq. 7 / Eq. 11): softmax of α·s over axis 1.

    Args:
        similarities: (B, N, ...) similarities, entries along axis 1.
        hardness: α > 0; α → ∞ gives the one-hot arg max of Eq. 6.

    Returns:
        Weights of the same shape, non-negative, summing to 1 over axis 1.
    """
    return torch.softmax(hardness * similarities, dim=1)


def merge(features: Tensor, attention: Tensor, *, scale: MergeScale) -> Tensor:
    """Merge block M: ``H⁽ⁿ⁾_ijk = s · A⁽ⁿ⁾_ijk · X_ijk`` (Eq. 8–9 and Eq. 12–13, see the module docstring).

    Args:
        features: (B, c, h, w) feature map X.
        attention: (B, N, 1, h, w) feature-wise maps (Kronecker product ``A_ij ⊗ x_ij``) or
            (B, N, c, h, w) dimension-wise maps (Hadamard product with X duplicated N times),
            summing to 1 over N.
        scale: 'identity' (s = N: uniform attention passes X unchanged to every branch) or
            'paper' (s = 1, the equations literally: every branch gets ≈ X / N).

    Returns:
        (B, N, c, h, w): the N attended feature maps.
    """
    if scale not in MERGE_SCALES:
        raise ValueError(f"merge scale must be 'identity' or 'paper', got {scale!r}")
    if (
        attention.dim() != 5
        or attention.shape[2] not in (1, features.shape[1])
        or attention.shape[-2:] != features.shape[-2:]
        or attention.shape[0] != features.shape[0]
    ):
        raise ValueError(
            f"attention of shape {tuple(attention.shape)} does not fit features of shape "
            f"{tuple(features.shape)}: expected (B, N, 1 or c, h, w)"
        )
    gain = attention.shape[1] if scale == "identity" else 1
    return (gain * attention) * features.unsqueeze(1)


def resize_attention(attention: Tensor, size: tuple[int, int]) -> Tensor:
    """Resize (B, N, c, h, w) maps to ``size`` = (h', w') bilinearly (a no-op when the size already matches)."""
    if tuple(attention.shape[-2:]) == tuple(size):
        return attention
    b, n, c, h, w = attention.shape
    resized = F.interpolate(attention.reshape(b, n * c, h, w), size=size, mode="bilinear", align_corners=False)
    return resized.reshape(b, n, c, *size)


def initial_dictionary(num_entries: int, rows: int, in_channels: int, init: DictionaryInit) -> Tensor:
    """A random dictionary (N, rows, m): directions uniform on the sphere, of length ``init``'s.

    Only the directions matter to the cosine (the forward pass is the same for both inits drawn
    from the same RNG state); the length sets how fast an optimiser turns them:

    - ``unit`` (default): rows of norm 1 (elements ≈ 1/√m). Adam moves every element by at most
      ≈ lr per step, so the directions turn like a layer whose weights are ≈ 1/√m;
    - ``normal``: a standard normal (elements ≈ 1, rows of norm ≈ √m), the code before issue 23:
      the same steps turn the directions up to √m times slower. Measured on CUB (``cub_lite``,
      m = 112, 20 steps at the head's lr): the unit directions turned by 0.53·10⁻³ (normal) vs
      5.7·10⁻³ (unit), the branch linears by 3.5·10⁻² (docs/methods/diablo.md).
    """
    if init not in DICTIONARY_INITS:
        raise ValueError(f"dictionary init must be one of {DICTIONARY_INITS}, got {init!r}")
    directions = torch.randn(num_entries, rows, in_channels)
    return F.normalize(directions, dim=-1) if init == "unit" else directions


class DictionarySelection(nn.Module):
    """Selection block S with its dictionary: φ(F) (B, m, h, w) → attention maps.

    Args:
        selection: 'feature' (N entries in Rᵐ) or 'dimension' (N × c directions in Rᵐ).
        in_channels: m, channels of φ(F).
        num_entries: N, dictionary size.
        channels: c, channels of the feature map the maps are merged with (dimension-wise only).
        hardness: α > 0 of the softmax.
        init: length of the random directions, 'unit' or 'normal' (:func:`initial_dictionary`).

    ``forward`` returns (B, N, 1, h, w) for feature-wise and (B, N, c, h, w) for dimension-wise
    selection, non-negative and summing to 1 over axis 1. The directions are uniform on the
    sphere, so at initialisation the cosine of any φ feature to an entry has mean 0 and
    variance 1/m, and the softmax's logits α·s have standard deviation α/√m whatever φ(F) is:
    α/√m sets how far the random attention is from uniform (docs/methods/diablo.md).
    """

    def __init__(
        self,
        selection: Selection,
        in_channels: int,
        num_entries: int,
        channels: int,
        hardness: float,
        init: DictionaryInit = "unit",
    ):
        super().__init__()
        if selection not in ("feature", "dimension"):
            raise ValueError(f"selection must be 'feature' or 'dimension', got {selection!r}")
        if num_entries < 1 or hardness <= 0:
            raise ValueError(f"need num_entries ≥ 1 and hardness > 0, got {num_entries} and {hardness}")
        self.selection = selection
        self.num_entries = num_entries
        self.hardness = hardness
        rows = 1 if selection == "feature" else channels
        self.dictionary = nn.Parameter(initial_dictionary(num_entries, rows, in_channels, init))

    def forward(self, transformed: Tensor) -> Tensor:
        b, _, h, w = transformed.shape
        n, rows, m = self.dictionary.shape
        similarities = cosine_similarities(transformed, self.dictionary.reshape(n * rows, m))
        return select(similarities.reshape(b, n, rows, h, w), self.hardness)


class BranchEmbeddings(nn.Module):
    """One linear layer per branch, then L2 normalisation per branch: (B, N, C) → (B, N, d/N)."""

    def __init__(self, num_branches: int, in_features: int, branch_dim: int):
        super().__init__()
        self.linears = nn.ModuleList(nn.Linear(in_features, branch_dim) for _ in range(num_branches))

    def forward(self, pooled: Tensor) -> Tensor:
        return torch.stack([F.normalize(linear(pooled[:, n]), dim=1) for n, linear in enumerate(self.linears)], 1)


class DIABLO(nn.Module):
    """Backbone + dictionary-based attention block + N branch embeddings.

    Args:
        backbone: staged backbone; F = its output after ``feature_stage``.
        selection: 'feature' or 'dimension'.
        placement: 'pre' (merge, then ψ on each of the N maps) or 'post' (ψ, then merge).
        num_entries: N, dictionary size = number of branches.
        hardness: α of the softmax over the dictionary.
        feature_stage: the stage whose output is F.
        phi_until: φ = a copy of the backbone stages after ``feature_stage`` up to this one.
        psi_until: ψ = the backbone's own stages after ``feature_stage`` up to this one; the
            backbone's ``pool`` stage then pools each branch.
        embedding_dim: d, divisible by N; each branch has d/N dimensions.
        freeze_bn: keep the BatchNorms of the backbone and of φ in eval mode, frozen.
        merge_scale: 'identity' (attention × N, uniform attention = identity) or 'paper'
            (Eq. 9 / 13 literally); see :func:`merge`.
        dictionary_init: 'unit' or 'normal' length of the random directions (:func:`initial_dictionary`).
        dictionary_lr_multiplier: > 0 (checked by the optimiser); the dictionary forms the optimiser
            group ``head/dictionary`` at this multiple of the head's lr (:meth:`parameter_group_multipliers`).

    ``forward`` maps (B, 3, H, W) RGB in [0, 1] to (B, d): the concatenation of the N unit-norm
    branch embeddings (norm √N); ``learner_slices`` are the branches' column ranges.
    """

    def __init__(
        self,
        backbone: StagedBackbone,
        *,
        selection: Selection,
        placement: Placement,
        num_entries: int,
        hardness: float,
        feature_stage: str,
        phi_until: str,
        psi_until: str,
        embedding_dim: int,
        freeze_bn: bool = False,
        merge_scale: MergeScale = "identity",
        dictionary_init: DictionaryInit = "unit",
        dictionary_lr_multiplier: float = 1.0,
    ):
        super().__init__()
        if placement not in ("pre", "post"):
            raise ValueError(f"placement must be 'pre' or 'post', got {placement!r}")
        if merge_scale not in MERGE_SCALES:
            raise ValueError(f"merge_scale must be 'identity' or 'paper', got {merge_scale!r}")
        for until in (phi_until, psi_until):
            if until == "pool" or backbone.index(until) <= backbone.index(feature_stage):
                raise ValueError(
                    f"stage {until!r} must come after the feature stage {feature_stage!r} and before "
                    f"'pool'; stages are {list(backbone.stage_names)}"
                )
        if embedding_dim % num_entries:
            raise ValueError(f"embedding_dim {embedding_dim} is not divisible by the dictionary size {num_entries}")
        self.backbone = backbone
        self.placement = placement
        self.merge_scale = merge_scale
        self.feature_stage, self.psi_until = feature_stage, psi_until
        self.phi = copy.deepcopy(backbone.stages(feature_stage, phi_until))
        merged_channels = backbone.out_channels[feature_stage if placement == "pre" else psi_until]
        self.selection = DictionarySelection(
            selection, backbone.out_channels[phi_until], num_entries, merged_channels, hardness, init=dictionary_init
        )
        self.dictionary_lr_multiplier = dictionary_lr_multiplier
        branch_dim = embedding_dim // num_entries
        self.embeddings = BranchEmbeddings(num_entries, backbone.out_channels[psi_until], branch_dim)
        self.learner_slices = [(n * branch_dim, (n + 1) * branch_dim) for n in range(num_entries)]
        self.freeze_bn = freeze_bn
        if freeze_bn:
            freeze_batchnorm(self.backbone)
            freeze_batchnorm(self.phi)

    def train(self, mode: bool = True) -> "DIABLO":
        super().train(mode)
        if mode and self.freeze_bn:
            freeze_batchnorm(self.backbone)
            freeze_batchnorm(self.phi)
        return self

    def backbone_copies(self) -> list[nn.Module]:
        """φ, a copy of backbone stages: trained at the backbone's learning rate."""
        return [self.phi]

    def parameter_group_multipliers(self) -> dict[str, tuple[nn.Module, float]]:
        """The optimiser hook (:func:`dmlbench.training.optim.parameter_groups`): the dictionary forms
        the group ``head/dictionary`` at ``dictionary_lr_multiplier`` × the head's lr."""
        return {"dictionary": (self.selection, self.dictionary_lr_multiplier)}

    def _psi(self, x: Tensor) -> Tensor:
        return self.backbone.stages(self.feature_stage, self.psi_until)(x)

    def _pool(self, maps: Tensor) -> Tensor:
        """(B, N, C, h, w) → (B, N, C) with the backbone's global pooling."""
        b, n = maps.shape[:2]
        return self.backbone.body["pool"](maps.flatten(0, 1)).reshape(b, n, -1)

    def _select(self, features: Tensor) -> Tensor:
        """F (B, c, h, w) → the selection's maps A = S(φ(F); D) at φ's resolution."""
        return self.selection(self.phi(features))

    def selection_maps(self, images: Tensor) -> Tensor:
        """(B, 3, H, W) → A (B, N, 1 or c, h_φ, w_φ) at φ's resolution (before any resize to the
        merge resolution), summing to 1 over N; skips the merge and ψ."""
        return self._select(self.backbone(images, until=self.feature_stage))

    def attend(self, images: Tensor) -> tuple[Tensor, Tensor]:
        """Attention maps and attended feature maps of a batch.

        Returns:
            ``(A, H)``: A (B, N, 1 or c, h, w) at the merge resolution, summing to 1 over N;
            H (B, N, C', h', w') the N maps that are pooled (after ψ for pre-attention).
        """
        features = self.backbone(images, until=self.feature_stage)
        attention = self._select(features)
        if self.placement == "post":
            features = self._psi(features)
        attention = resize_attention(attention, tuple(features.shape[-2:]))
        attended = merge(features, attention, scale=self.merge_scale)
        if self.placement == "pre":
            b, n = attended.shape[:2]
            refined = self._psi(attended.flatten(0, 1))
            attended = refined.reshape(b, n, *refined.shape[1:])
        return attention, attended

    def embed_attended(self, attended: Tensor) -> Tensor:
        """Attended maps (B, N, C', h', w') of :meth:`attend` → (B, N, d/N), each branch L2-normalised."""
        return self.embeddings(self._pool(attended))

    def branch_embeddings(self, images: Tensor) -> Tensor:
        """(B, 3, H, W) → (B, N, d/N), each branch L2-normalised."""
        return self.embed_attended(self.attend(images)[1])

    def forward(self, images: Tensor) -> Tensor:
        return self.branch_embeddings(images).flatten(1)
