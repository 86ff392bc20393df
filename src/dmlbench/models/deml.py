"""The DeML network (Chen & Deng, CVPR 2019, §3, Fig. 2): I scales × J channel-attention learners.

Scale i has its own backbone (FNet^i + GNet^i; the authors' code gives every scale its
own weights). Its input x^i is the image (i = 0) or the OAM crop of the previous scale's
input, zoomed to the same size. FNet^i = the backbone stages up to ``cam_after``; its map
U feeds J parallel CAMs (:class:`~dmlbench.models.deml_attention.ChannelAttention`); the J
re-weighted maps are stacked along the batch and share the rest of the backbone GNet^i
(up to ``pool``); learner (i, j) is a bias-free linear layer of the pooled features to
w = ⌊d / (I·J)⌋ dimensions (the code's ``bias_term: false``). With ``share_learners`` the J
learners of a scale share that layer (the authors' code: every ``fc_embedding_att<j>`` of a
scale uses the parameter "w"), so the CAMs are the only thing that differs between them —
which the paper's remark on Eq. 4 ("the only differentiating parts are CAMs") and the
learner similarities of its Table 4 (0.92–0.95 without L_adv) presuppose; separate layers,
one ω_ij per learner as Eq. 6 is written, are ``share_learners = False``. With ``num_cams = 0`` a
scale has no CAM and a single learner: the unattended network "U<d>" of the paper's
Table 1 is ``num_scales = 1, num_cams = 0``.

Test-time embedding (§4): the concatenation of the L2-normalised learner outputs, scale by
scale, learner by learner — I·J·w ≤ d dimensions.

The OAM of scale i reads the maps of ``oam_layers`` produced while embedding x^i: a layer
up to ``cam_after`` gives one map, a later layer one map per CAM branch (all branches are
averaged in the 'paper' variant; the 'code' variant, the default, uses the first, like the
authors' ``slice_att1``); each layer has one vote. It runs without gradient.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import cast

import torch
import torch.nn.functional as F
from torch import Tensor, nn

from dmlbench.models.backbones import StagedBackbone, freeze_batchnorm
from dmlbench.models.deml_attention import (
    ChannelAttention,
    attention_box,
    box_mask,
    compose_boxes,
    crop_and_zoom,
    minmax_scale,
    oam_saliency,
    paste_into_image,
    spatial_size,
)


@dataclass
class ScalePass:
    """One scale's forward pass.

    Attributes:
        embeddings: (J, B, w) raw learner outputs.
        oam_maps: per OAM layer, (K, B, C, h, w) maps (K = 1 before the CAMs, J after).
        cam_maps: (J, B, C, h, w) the CAM-attended maps U ⊙ a_j (None without CAMs).
    """

    embeddings: Tensor
    oam_maps: list[Tensor]
    cam_maps: Tensor | None


class DeMLNetwork(nn.Module):
    """DeML(I, J) over I copies of a staged backbone.

    Args:
        backbones: I staged backbones (one per scale, same architecture).
        embedding_dim: d; each learner gets ⌊d / (I·J)⌋ dimensions.
        num_cams: J ≥ 0 CAMs per scale (0: no CAM, one learner per scale).
        cam_after: stage whose output the CAMs re-weight (GoogLeNet: pool3).
        cam_hidden: CAM bottleneck width (64).
        cam_pooled: CAM weights per channel (paper) or per position (authors' code).
        cam_init: 'identity' (every CAM gate 1 at init: the scale embeds its input as the bare
            backbone does) or 'paper' (σ gates at PyTorch's init, ≈ 0.5);
            :class:`~dmlbench.models.deml_attention.ChannelAttention`.
        oam_layers: stages whose maps the OAM reads (GoogLeNet: inception4e, inception5b).
        oam_iterations: random-walk steps T (10).
        oam_variant: 'code' or 'paper' (:func:`~dmlbench.models.deml_attention.oam_saliency`).
        share_learners: the J learners of a scale share one linear layer.
        freeze_bn: keep every backbone BatchNorm in eval mode with frozen affine parameters.

    ``backbone`` is an ``nn.ModuleList`` of the I backbones, so the optimiser's backbone
    group holds all of them. ``forward``: (B, 3, H, W) RGB in [0, 1] → (B, I·J·w)
    concatenation of the unit-norm learner embeddings.
    """

    def __init__(
        self,
        backbones: Sequence[StagedBackbone],
        embedding_dim: int,
        num_cams: int,
        cam_after: str,
        cam_hidden: int,
        cam_pooled: bool,
        oam_layers: Sequence[str],
        oam_iterations: int,
        oam_variant: str,
        share_learners: bool = False,
        freeze_bn: bool = False,
        cam_init: str = "identity",
    ):
        super().__init__()
        if not backbones:
            raise ValueError("DeML needs at least one scale")
        first = backbones[0]
        spatial = first.stage_names[:-1]
        for name in (cam_after, *oam_layers):
            if name not in spatial:
                raise KeyError(f"stage {name!r} is not a spatial stage of the backbone; choose from {list(spatial)}")
        if not oam_layers:
            raise ValueError("the OAM needs at least one layer")
        branches = max(num_cams, 1)
        self.learner_dim = embedding_dim // (len(backbones) * branches)
        if self.learner_dim < 1:
            raise ValueError(f"embedding_dim {embedding_dim} is smaller than the {len(backbones) * branches} learners")
        self.num_scales = len(backbones)
        self.num_cams = num_cams
        self.cam_after = cam_after
        self.oam_layers = tuple(oam_layers)
        self.oam_iterations = oam_iterations
        self.oam_variant = oam_variant
        self.freeze_bn = freeze_bn
        self.backbone = nn.ModuleList(backbones)
        channels, pooled_channels = first.out_channels[cam_after], first.out_channels["pool"]
        self.cams = nn.ModuleList(
            nn.ModuleList(ChannelAttention(channels, cam_hidden, cam_pooled, cam_init) for _ in range(num_cams))
            for _ in backbones
        )
        self.share_learners = share_learners
        self.learners = nn.ModuleList(
            nn.ModuleList(
                nn.Linear(pooled_channels, self.learner_dim, bias=False)
                for _ in range(1 if share_learners else branches)
            )
            for _ in backbones
        )
        count = self.num_scales * branches
        self.learner_slices: list[tuple[int, int]] | None = (
            [(m * self.learner_dim, (m + 1) * self.learner_dim) for m in range(count)] if count > 1 else None
        )
        if freeze_bn:
            freeze_batchnorm(self.backbone)

    # --- structure ------------------------------------------------------------------------
    @property
    def learners_per_scale(self) -> int:
        """J: learners of one scale (1 without CAMs)."""
        return max(self.num_cams, 1)

    def scale_slices(self) -> list[tuple[int, int]]:
        """[start, stop) columns of each scale's learners in the test embedding."""
        width = self.learners_per_scale * self.learner_dim
        return [(i * width, (i + 1) * width) for i in range(self.num_scales)]

    def learner(self, scale: int, branch: int) -> nn.Linear:
        """The linear layer of CA learner ``branch`` of ``scale`` (one per scale when shared)."""
        return cast(nn.Linear, cast(nn.ModuleList, self.learners[scale])[0 if self.share_learners else branch])

    def learner_weights(self) -> list[Tensor]:
        """The (w, d1) weight matrix ω_ij of every learner (i, j), scale-major (a shared matrix
        appears once per learner that uses it)."""
        return [self.learner(i, j).weight for i in range(self.num_scales) for j in range(self.learners_per_scale)]

    def train(self, mode: bool = True) -> "DeMLNetwork":
        super().train(mode)
        if mode and self.freeze_bn:
            freeze_batchnorm(self.backbone)
        return self

    # --- forward --------------------------------------------------------------------------
    def _scale_pass(self, scale: int, images: Tensor) -> ScalePass:
        backbone = cast(StagedBackbone, self.backbone[scale])
        batch = images.shape[0]
        oam_maps: list[Tensor] = []
        x = backbone.normalize(images)
        for name, stage in backbone.stages(None, self.cam_after).named_children():
            x = stage(x)
            if name in self.oam_layers:
                oam_maps.append(x.unsqueeze(0))
        cam_maps = None
        if self.num_cams:
            cam_maps = torch.stack([cam(x) for cam in cast(nn.ModuleList, self.cams[scale])])  # (J, B, C, h, w)
            x = cam_maps.flatten(0, 1)
        branches = self.learners_per_scale
        for name, stage in backbone.stages(self.cam_after, "pool").named_children():
            x = stage(x)
            if name in self.oam_layers:
                oam_maps.append(x.view(branches, batch, *x.shape[1:]))
        pooled = x.view(branches, batch, -1)
        embeddings = torch.stack([self.learner(scale, j)(pooled[j]) for j in range(branches)])
        return ScalePass(embeddings, oam_maps, cam_maps)

    @torch.no_grad()
    def saliency(self, oam_maps: Sequence[Tensor], size: tuple[int, int]) -> Tensor:
        """The OAM proposal (B, H, W) in [0, 1] from a scale's maps (no gradient)."""
        return oam_saliency(oam_maps, size, self.oam_iterations, self.oam_variant)

    @torch.no_grad()
    def first_proposal(self, images: Tensor) -> tuple[Tensor, Tensor]:
        """Scale 0's OAM on ``images`` (B, 3, H, W): the saliency (B, H, W) in [0, 1] and the box
        (B, 4) (x0, y0, x1, y1) pixels it crops as scale 1's input (the mechanism-health numbers)."""
        saliency = self.saliency(self._scale_pass(0, images).oam_maps, spatial_size(images))
        return saliency, attention_box(saliency)

    def _passes(
        self, images: Tensor, last_saliency: bool = False
    ) -> tuple[list[ScalePass], list[Tensor], list[Tensor]]:
        """Embed every scale; return the passes, the saliency map of each scale that was
        computed (all but the last unless ``last_saliency``) and the boxes (B, 4) each scale
        crops from its own input."""
        size = spatial_size(images)
        x = images
        passes, saliencies, boxes = [], [], []
        for scale in range(self.num_scales):
            result = self._scale_pass(scale, x)
            passes.append(result)
            if scale + 1 < self.num_scales or last_saliency:
                saliency = self.saliency(result.oam_maps, size)
                saliencies.append(saliency)
                boxes.append(attention_box(saliency))
                if scale + 1 < self.num_scales:
                    x = crop_and_zoom(x, boxes[-1])
        return passes, saliencies, boxes

    def learner_outputs(self, images: Tensor) -> list[Tensor]:
        """Raw learner outputs for the training loss: per scale (J, B, w)."""
        return [p.embeddings for p in self._passes(images)[0]]

    def forward(self, images: Tensor) -> Tensor:
        outputs = self.learner_outputs(images)
        return torch.cat([F.normalize(e, dim=-1).permute(1, 0, 2).flatten(1) for e in outputs], dim=1)

    # --- inspection -----------------------------------------------------------------------
    @torch.no_grad()
    def attention(self, images: Tensor) -> dict[str, Tensor]:
        """Maps for figures, (B, h, w) in [0, 1] over the original image.

        - ``oam_scale{i}``: the OAM saliency computed on scale i's input, pasted back at
          where that input lies in the original image (0 elsewhere);
        - ``crop_scale{i}``: 1 inside the box the OAM of scale i crops — the input of scale i + 1
          (for the last scale, where a further scale would look);
        - ``cam{j}``: scale 0's CAM-attended map of CAM j averaged over channels, at the
          resolution of ``cam_after`` (scaled to [0, 1] jointly over the J CAMs of each image).
        """
        size = spatial_size(images)
        passes, saliencies, boxes = self._passes(images, last_saliency=True)
        full = torch.tensor([0.0, 0.0, size[1], size[0]], device=images.device).expand(images.shape[0], 4)
        outer = full
        maps: dict[str, Tensor] = {}
        for scale, (saliency, box) in enumerate(zip(saliencies, boxes)):
            maps[f"oam_scale{scale}"] = paste_into_image(saliency, outer, size).clamp(0, 1)
            outer = compose_boxes(outer, box, size)
            maps[f"crop_scale{scale}"] = box_mask(outer, size)
        if passes[0].cam_maps is not None:
            attended = passes[0].cam_maps.mean(2)  # (J, B, h, w)
            joint = (
                minmax_scale(attended.permute(1, 0, 2, 3).flatten(1, 2))
                .view(attended.shape[1], attended.shape[0], *attended.shape[2:])
                .permute(1, 0, 2, 3)
            )
            for j, cam_map in enumerate(joint):
                maps[f"cam{j}"] = cam_map
        return maps
