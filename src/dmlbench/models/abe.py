"""ABE-M and the M-heads ensemble (Kim et al., "Attention-based Ensemble for Deep Metric Learning",
ECCV 2018, Fig. 1, Eq. 7), built from the named stages of a :class:`StagedBackbone`.

Both split the backbone after stage ``branch_after``: S = the stages up to and including it
(the "spatial feature extractor", shared by all learners), the rest (``… pool``) is the global
feature embedding function G.

**ABE-M** (:class:`AttentionEnsemble`, Fig. 1b, Eq. 7 and §4):

    B_m(x) = L2( W · G(S(x) ∘ A_m(S(x))) ),   A_m(·) = σ(conv1×1_m(C(·)))

- C, the attention trunk, is a *copy* of the backbone stages (``branch_after``,
  ``attention_until``] (GoogLeNet: inception 4a–4e), initialised from the backbone's weights and
  shared by the M learners; its down-sampling is removed (strided convolutions run with stride
  1, strided pooling layers are dropped — the paper: "we remove all the pooling layers in our
  attention module") so that its output keeps S(x)'s spatial size. ``attention_until ==
  branch_after`` gives an empty trunk (the masks are computed from S(x) directly).
- A'_m: a per-learner 1×1 convolution from C's channels to S(x)'s channels (GoogLeNet 832 → 480)
  and a sigmoid: a mask of S(x)'s shape with values in (0, 1).
- G: the backbone's own stages after ``branch_after`` through ``pool``, one function for all
  learners, then the final linear layer to w = d/M dimensions:
  - ``shared_embedding=False`` (default): one final linear layer per learner, each initialised
    (Glorot, zero bias) as M-heads' are. With open masks the M learners are M independent random
    projections of (almost) the backbone's pooled features, so ABE-M at initialisation is as good
    as the linear-head baseline of d dimensions and its learners already differ (self-pair
    cosine ≈ 0). Real CUB, cub_lite, seed 0: validation R@1 at init 0.765 (binomial 0.773,
    8-heads 0.767), self-pair cosine 0.016 (docs/methods/abe.md, "Final layer at initialisation").
  - ``shared_embedding=True``: Eq. 7 read literally — G is a single function (h_i … h_1 of Eq. 6
    include the last layer, the embedding layer), so the attended features of all learners go
    through the same weights and the masks are the only thing that differs between learners;
    §3.2's argument ("union of metric spaces by multiple s_m is mapped by a single embedding
    function g", and why the divergence loss does nothing for M-heads) rests on that. With masks
    that keep the features (≈ 1) the M learners then start as copies of one learner (self-pair
    cosine 0.992): ABE-8 at initialisation is a 64-d model (validation R@1 0.662) and L_div starts
    at its maximum.
- The M attended maps are stacked along the batch and pass through G in one call.

**M-heads** (:class:`HeadsEnsemble`, Fig. 1a, the paper's baseline after Lee et al.): S shared,
then M separate copies G_m of the stages after ``branch_after`` through ``pool``, each with its
own linear layer to w dimensions. Head 0 uses the backbone's own stages, heads 1 … M − 1 copies
initialised from them.

Both return the concatenation of the M L2-normalised learner embeddings, (B, M·w), with
``learner_slices`` = [(0, w), (w, 2w), …]. New layers use Glorot (Xavier) uniform initialisation,
as §4 states; the linear layers with zero bias. The mask convolution starts *open* by default:
bias ``mask_bias`` = :data:`OPEN_MASK_BIAS` (σ(3) ≈ 0.95) on Glorot weights scaled by
``mask_weight_gain``, so every mask is near 1 and ABE at initialisation computes almost the
backbone's own function (the masks still differ a little between learners: their weights are
random; what makes the learners differ at init is the per-learner final layer — open masks cost
0.3 points of validation R@1 at init against masks of exactly 1 on CUB). The paper's
init (§4: Glorot weights, zero bias; ``mask_bias=0, mask_weight_gain=1``) starts every mask
around σ(0) = 0.5, which halves S(x) on a small network and, on a pretrained one whose trunk
features are large, saturates the sigmoid into nearly binary random masks that discard half of
the pretrained features (EfficientNet-Lite0 on CUB: mask std 0.44, R@1 at init 0.62 vs the
backbone's 0.83).
"""

from __future__ import annotations

import copy

import torch
import torch.nn.functional as F
from torch import Tensor, nn

from dmlbench.models.backbones import StagedBackbone, freeze_batchnorm

_POOLS = (nn.MaxPool2d, nn.AvgPool2d)

#: Default initial bias of the mask convolution: σ(3) ≈ 0.953, masks start near 1 (open).
OPEN_MASK_BIAS = 3.0
#: Default gain of the mask convolution's Glorot-uniform weights (1: plain Glorot, as §4).
MASK_WEIGHT_GAIN = 1.0


def remove_downsampling(module: nn.Module) -> nn.Module:
    """In place: strided convolutions get stride 1, strided pooling layers become identities.

    Used on the attention trunk (a copy), so that its output keeps its input's spatial size.
    Returns ``module`` (or an ``Identity`` when ``module`` itself is a strided pooling layer).
    """
    if isinstance(module, _POOLS) and _strided(module.stride):
        return nn.Identity()
    if isinstance(module, nn.Conv2d) and _strided(module.stride):
        module.stride = (1, 1)
    for name, child in module.named_children():
        setattr(module, name, remove_downsampling(child))
    return module


def _strided(stride: int | tuple[int, ...]) -> bool:
    return any(s > 1 for s in ((stride,) if isinstance(stride, int) else stride))


def _glorot(layer: nn.Linear) -> None:
    nn.init.xavier_uniform_(layer.weight)
    nn.init.zeros_(layer.bias)


class _Ensemble(nn.Module):
    """What both ensembles share: the backbone, the learner layout and BatchNorm freezing.

    Args:
        backbone: the staged backbone (S, and G or G_0).
        num_learners: M ≥ 1.
        learner_dim: w, embedding size of one learner; the ensemble has M·w.
        branch_after: last stage of S; must come before ``pool``.
        freeze_bn: keep every BatchNorm (backbone and copies) in eval mode with frozen affine parameters.
    """

    def __init__(
        self, backbone: StagedBackbone, num_learners: int, learner_dim: int, branch_after: str, freeze_bn: bool
    ):
        super().__init__()
        if num_learners < 1 or learner_dim < 1:
            raise ValueError(f"need ≥ 1 learner of ≥ 1 dimension, got {num_learners} × {learner_dim}")
        if backbone.index(branch_after) >= backbone.index("pool"):
            raise ValueError(f"branch_after = {branch_after!r} must be a stage before 'pool' (a feature map)")
        self.backbone = backbone
        self.num_learners = num_learners
        self.learner_dim = learner_dim
        self.branch_after = branch_after
        self.freeze_bn = freeze_bn
        self.learner_slices = [(m * learner_dim, (m + 1) * learner_dim) for m in range(num_learners)]

    def _finish_init(self) -> None:
        if self.freeze_bn:
            freeze_batchnorm(self)

    def train(self, mode: bool = True) -> "_Ensemble":
        super().train(mode)
        if mode and self.freeze_bn:
            freeze_batchnorm(self)
        return self


class AttentionEnsemble(_Ensemble):
    """ABE-M: shared S, shared attention trunk C, M mask convolutions, shared G (Eq. 7).

    Args:
        backbone, num_learners, learner_dim, branch_after, freeze_bn: see :class:`_Ensemble`.
        attention_until: last backbone stage copied into the attention trunk C (== ``branch_after``:
            no trunk); must lie between ``branch_after`` and ``pool`` (excluded).
        shared_embedding: one final linear layer for all learners (Eq. 7 read literally: identical
            learners at init when the masks are open) or, by default, one per learner (as M-heads).
        mask_bias: initial bias of every mask logit (0: the paper's zero bias; the default
            :data:`OPEN_MASK_BIAS` starts the masks near 1).
        mask_weight_gain: > 0, gain of the Glorot-uniform mask weights (1: plain Glorot). Below 1 on
            a pretrained backbone whose trunk features are large, so that the mask logits spread
            O(1) around ``mask_bias`` instead of saturating the sigmoid.

    ``forward(images (B, 3, H, W) in [0, 1])`` → (B, M·w), each learner's w columns unit-norm.
    """

    def __init__(
        self,
        backbone: StagedBackbone,
        num_learners: int,
        learner_dim: int,
        branch_after: str,
        attention_until: str,
        shared_embedding: bool = False,
        freeze_bn: bool = False,
        mask_bias: float = OPEN_MASK_BIAS,
        mask_weight_gain: float = MASK_WEIGHT_GAIN,
    ):
        super().__init__(backbone, num_learners, learner_dim, branch_after, freeze_bn)
        if not mask_weight_gain > 0:
            raise ValueError(f"mask_weight_gain must be > 0, got {mask_weight_gain}")
        start, stop = backbone.index(branch_after), backbone.index(attention_until)
        if not start <= stop < backbone.index("pool"):
            raise ValueError(
                f"attention_until = {attention_until!r} must be {branch_after!r} (no trunk) or a later stage "
                f"before 'pool'; stages are {list(backbone.stage_names)}"
            )
        self.attention_until = attention_until
        self.attention_trunk = (
            remove_downsampling(copy.deepcopy(backbone.stages(branch_after, attention_until)))
            if stop > start
            else nn.Identity()
        )
        self.feature_channels = backbone.out_channels[branch_after]
        trunk_channels = backbone.out_channels[attention_until]
        # The M 1×1 convolutions A'_m as one convolution with M blocks of output channels.
        self.mask_conv = nn.Conv2d(trunk_channels, num_learners * self.feature_channels, kernel_size=1)
        with torch.no_grad():
            for block in self.mask_conv.weight.split(self.feature_channels):
                nn.init.xavier_uniform_(block, gain=mask_weight_gain)
            assert self.mask_conv.bias is not None  # Conv2d's default bias=True
            nn.init.constant_(self.mask_conv.bias, mask_bias)
        pooled = backbone.out_channels["pool"]
        count = 1 if shared_embedding else num_learners
        layers = [nn.Linear(pooled, learner_dim) for _ in range(count)]
        for layer in layers:
            _glorot(layer)
        self.embedding = nn.ModuleList(layers)
        self._finish_init()

    def backbone_copies(self) -> list[nn.Module]:
        """The attention trunk C, a copy of backbone stages: trained at the backbone's learning rate."""
        return [self.attention_trunk]

    def spatial_features(self, images: Tensor) -> Tensor:
        """S(x): (B, C, h, w), the output of stage ``branch_after``."""
        return self.backbone(images, until=self.branch_after)

    def masks(self, features: Tensor) -> Tensor:
        """A_m(S(x)) for every learner: (M, B, C, h, w) in (0, 1), from S(x) of shape (B, C, h, w)."""
        trunk = self.attention_trunk(features)
        if trunk.shape[-2:] != features.shape[-2:]:
            raise ValueError(
                f"the attention trunk (stages after {self.branch_after!r} through {self.attention_until!r}) gives "
                f"{tuple(trunk.shape[-2:])} maps for S(x) of {tuple(features.shape[-2:])}: choose an "
                f"attention_until whose stages keep the spatial size once their strides are removed"
            )
        logits = self.mask_conv(trunk)  # (B, M·C, h, w)
        b, _, h, w = logits.shape
        return torch.sigmoid(logits).view(b, self.num_learners, self.feature_channels, h, w).transpose(0, 1)

    def forward(self, images: Tensor) -> Tensor:
        features = self.spatial_features(images)
        return self.embed_attended(features, self.masks(features))

    def embed_attended(self, features: Tensor, masks: Tensor) -> Tensor:
        """B_m = L2(W · G(S(x) ∘ A_m)) of every learner, concatenated: (B, M·w).

        Args:
            features: S(x), (B, C, h, w).
            masks: (M, B, C, h, w), from :meth:`masks`.
        """
        attended = (features.unsqueeze(0) * masks).flatten(0, 1)  # (M·B, C, h, w)
        pooled = self.backbone.stages(self.branch_after, "pool")(attended)
        pooled = pooled.view(self.num_learners, features.shape[0], -1)
        layers = [self.embedding[0]] * self.num_learners if len(self.embedding) == 1 else list(self.embedding)
        return torch.cat([F.normalize(layer(p), dim=1) for layer, p in zip(layers, pooled)], dim=1)

    @torch.no_grad()
    def attention_maps(self, images: Tensor) -> Tensor:
        """Each learner's mask averaged over channels and resized (bilinear) to the image.

        Returns:
            (M, B, H, W) in [0, 1] for images (B, 3, H, W).
        """
        masks = self.masks(self.spatial_features(images)).mean(dim=2)  # (M, B, h, w)
        resized = F.interpolate(masks, size=images.shape[-2:], mode="bilinear", align_corners=False)
        return resized.clamp(0.0, 1.0)


class HeadsEnsemble(_Ensemble):
    """M-heads: shared S, M separate global embedders G_m (stages after ``branch_after`` + linear).

    ``forward(images (B, 3, H, W) in [0, 1])`` → (B, M·w), each learner's w columns unit-norm.
    """

    def __init__(
        self, backbone: StagedBackbone, num_learners: int, learner_dim: int, branch_after: str, freeze_bn: bool = False
    ):
        super().__init__(backbone, num_learners, learner_dim, branch_after, freeze_bn)
        self.extra_heads = nn.ModuleList(
            copy.deepcopy(backbone.stages(branch_after, "pool")) for _ in range(num_learners - 1)
        )
        pooled = backbone.out_channels["pool"]
        layers = [nn.Linear(pooled, learner_dim) for _ in range(num_learners)]
        for layer in layers:
            _glorot(layer)
        self.embedding = nn.ModuleList(layers)
        self._finish_init()

    def backbone_copies(self) -> list[nn.Module]:
        """The heads G_1 … G_(M−1), copies of backbone stages: trained at the backbone's learning rate."""
        return list(self.extra_heads)

    def forward(self, images: Tensor) -> Tensor:
        features = self.backbone(images, until=self.branch_after)
        pooled = [self.backbone.stages(self.branch_after, "pool")(features)]
        pooled += [head(features) for head in self.extra_heads]
        return torch.cat([F.normalize(layer(p), dim=1) for layer, p in zip(self.embedding, pooled)], dim=1)
