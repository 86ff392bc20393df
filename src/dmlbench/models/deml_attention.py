"""DeML's attention modules (Chen & Deng, CVPR 2019, §3.1–3.2): CAM, the random-walk OAM and crop-and-zoom.

- :class:`ChannelAttention` (CAM, §3.2): spatial average pooling → FC C→64 → ReLU →
  FC 64→C → sigmoid → per-channel re-weighting of the feature map (a squeeze-excitation
  block). ``pooled=False`` is the authors' Caffe variant: the two FCs are 1×1 convolutions
  applied at every position (no pooling), so the weights vary over space. ``init`` (see
  :data:`CAM_INITS`): ``identity`` (default) gates with 2σ(z) and zero-initialises the last FC,
  so every gate is exactly 1 at initialisation and the CAM passes the pretrained map unchanged
  (gate slope 2σ'(0) = 0.5); ``paper`` is the paper's σ(z) at PyTorch's default init, gates
  ≈ 0.5 that halve the map in front of the frozen-BatchNorm layers of GNet.
- The object-attention module (OAM, §3.1, Eq. 2–3) is parameter-free and runs without
  gradient: a fully connected graph over the H·W positions of a feature map with edge
  weights ‖u_a − u_b‖ (:func:`transition_matrix`), out-edges normalised to 1, and T
  random-walk steps from the uniform mass (:func:`random_walk_saliency`). The mass
  gathers where features differ from the rest (the object, when it is the rarer part; see
  the variants below). :func:`object_saliency` resizes the maps of several layers to the
  image and averages them, one vote per layer;
  :func:`attention_box` turns the average into a box and :func:`crop_and_zoom` resamples
  the box to the next scale's input.

Reading of Eq. 3 ("M ← D × M" with D row-normalised): taken literally, a row-stochastic D
times M only averages M, which converges to a constant map. The text describes mass
that nodes "receive and diffuse via the inbound and outbound edges", i.e. a random walk
whose mass at b is Σ_a M_a D_ab = (Dᵀ M)_b; that is what the authors' code computes
(it normalises the symmetric weight matrix by columns and multiplies). We do the same.
With symmetric weights the walk's stationary distribution is proportional to each
node's total edge weight, which the T = 10 steps approach (tests compare it with the
eigenvector of eigenvalue 1). The paper's "ergodic because strongly connected" also needs
aperiodicity: a map with two feature values (flat object on flat background) has no edges
inside either group, the walk alternates between them and an even T returns the uniform
map. Real feature maps are not two-valued; we keep the published T steps.

Box rule: the paper gives none, so both variants use the authors' ``ProposalCrop`` rule —
threshold the averaged map at its mean, take the bounding box of the largest 8-connected
region above it (by pixel count; the code uses OpenCV's external-contour area), make it
square around its centre with the side (w + h) / 2 and clip it to the image. (The box of
*all* above-mean positions spans the whole image as soon as the map is diffuse.)

Variants (``oam_variant``, :func:`oam_saliency`): ``code`` (the recipe's default) follows
``ProposalCrop``: edge weights multiplied by a Gaussian of the spatial distance (σ = 0.15 ×
the map side) and the first CAM branch only (its ``slice_att1``). ``paper`` is Eq. 2 as
printed (no spatial term) and averages all CAM branches of a layer. Without the spatial term
the stationary mass of a node is its dissimilarity to *every* other node, so the walk favours
the rarest features: the background as soon as the object covers half the map (measured on
the embedded default after training: saliency higher inside the object on 34 % of the
images, against 100 % with the Gaussian term). In both variants every layer has one vote in
the average (a layer after the CAMs does not count once per branch).
"""

from __future__ import annotations

import math
from collections.abc import Sequence

import numpy as np
import torch
import torch.nn.functional as F
from scipy import ndimage
from torch import Tensor, nn

#: σ of the Gaussian spatial weighting of the authors' code, as a fraction of the map side.
CODE_GAUSSIAN_SIGMA = 0.15
#: The OAM variants: the authors' ``ProposalCrop`` (default) and the paper's Eq. 2 as printed.
OAM_VARIANTS = ("code", "paper")
#: CAM initialisations: ``identity`` (gate 2σ(z), last FC zero: every gate 1 at init) and ``paper``
#: (gate σ(z), PyTorch's default init: gates ≈ 0.5).
CAM_INITS = ("identity", "paper")
#: Gate gain of the ``identity`` CAM: 2σ(0) = 1, so a zero pre-activation leaves a channel unchanged.
IDENTITY_GATE_GAIN = 2.0


class ChannelAttention(nn.Module):
    """Channel-attention module: ``U ⊙ g · σ(W2 δ(W1 Ψ(U)))`` (DeML §3.2; g = 1 in the paper).

    Args:
        channels: C of the input map.
        hidden: width of the bottleneck (64 in the paper).
        pooled: True: Ψ = spatial average pooling, one weight per channel (paper);
            False: per-position 1×1 convolutions without pooling (authors' code).
        init: 'identity' (default): g = :data:`IDENTITY_GATE_GAIN` and W2, b2 = 0, so every
            gate is 2σ(0) = 1 and the module is the identity at initialisation; gates live in
            (0, 2) and move with slope 2σ'(0) = 0.5 from the first step. 'paper': g = 1 at
            PyTorch's default init (gates in (0, 1), ≈ 0.5 at init). An open bias on the
            paper's σ (b2 = 4.6: gate 0.99) would also start near the identity, but with a slope
            σ'(4.6) ≈ 0.01, 50× flatter: the gate would barely learn.

    ``forward``: (B, C, H, W) → (B, C, H, W), the re-weighted map.
    """

    def __init__(self, channels: int, hidden: int = 64, pooled: bool = True, init: str = "identity"):
        super().__init__()
        if init not in CAM_INITS:
            raise ValueError(f"CAM init must be one of {CAM_INITS}, got {init!r}")
        self.pooled = pooled
        self.reduce = nn.Conv2d(channels, hidden, 1)
        self.expand = nn.Conv2d(hidden, channels, 1)
        self.gain = IDENTITY_GATE_GAIN if init == "identity" else 1.0
        if init == "identity":
            nn.init.zeros_(self.expand.weight)
            assert self.expand.bias is not None  # Conv2d's default bias=True
            nn.init.zeros_(self.expand.bias)

    def weights(self, features: Tensor) -> Tensor:
        """Channel weights in (0, gain): (B, C, 1, 1) (pooled) or (B, C, H, W) (per position)."""
        squeezed = features.mean(dim=(2, 3), keepdim=True) if self.pooled else features
        return self.gain * torch.sigmoid(self.expand(F.relu(self.reduce(squeezed))))

    def forward(self, features: Tensor) -> Tensor:
        return features * self.weights(features)


def spatial_size(maps: Tensor) -> tuple[int, int]:
    """(H, W): the sizes of the last two axes of ``maps`` (..., H, W).

    >>> spatial_size(torch.zeros(2, 3, 5, 7))
    (5, 7)
    """
    return maps.shape[-2], maps.shape[-1]


def _grid_squared_distances(height: int, width: int, device: torch.device) -> Tensor:
    """(H·W, H·W) squared distances between the grid positions (row-major), in cells."""
    rows, cols = torch.meshgrid(torch.arange(height, device=device), torch.arange(width, device=device), indexing="ij")
    points = torch.stack([rows.flatten(), cols.flatten()], dim=1).float()
    return (points[:, None, :] - points[None, :, :]).pow(2).sum(-1)


def transition_matrix(features: Tensor, gaussian_sigma: float = 0.0) -> Tensor:
    """Row-stochastic transition matrices of the OAM graphs (DeML Eq. 2, out-edges normalised).

    Args:
        features: (B, C, H, W) feature maps.
        gaussian_sigma: 0 (paper): edge weight ‖u_a − u_b‖; > 0 (authors' code): times
            exp(−dist² / (2 s²)) with s = gaussian_sigma × max(H, W) cells.

    Returns:
        (B, N, N) float32, N = H·W; entry [a, b] is the probability of stepping from a to b.
        A map whose positions all have the same feature (every weight 0) gets the uniform
        matrix.
    """
    b, _, h, w = features.shape
    u = features.detach().float().flatten(2).transpose(1, 2)  # (B, N, C)
    squared_norms = u.pow(2).sum(-1)
    d2 = torch.baddbmm(squared_norms[:, :, None] + squared_norms[:, None, :], u, u.transpose(1, 2), alpha=-2.0)
    eye = torch.eye(h * w, dtype=torch.bool, device=u.device)
    weights = d2.clamp_min(0.0).masked_fill(eye, 0.0).sqrt()
    if gaussian_sigma > 0:
        side = gaussian_sigma * max(h, w)
        weights = weights * torch.exp(-_grid_squared_distances(h, w, u.device) / (2 * side * side))
    totals = weights.sum(-1, keepdim=True)
    uniform = torch.full_like(weights, 1.0 / (h * w))
    return torch.where(totals > 0, weights / totals.clamp_min(torch.finfo(weights.dtype).tiny), uniform)


def random_walk_saliency(features: Tensor, iterations: int = 10, gaussian_sigma: float = 0.0) -> Tensor:
    """Object-attention proposal M of each map (DeML Eq. 3): T walk steps from uniform mass.

    Args:
        features: (B, C, H, W).
        iterations: T ≥ 1 (10 in the paper).
        gaussian_sigma: see :func:`transition_matrix`.

    Returns:
        (B, H, W) float32 mass, non-negative, summing to 1 per map.
    """
    if iterations < 1:
        raise ValueError(f"the random walk needs at least 1 iteration, got {iterations}")
    b, _, h, w = features.shape
    transition = transition_matrix(features, gaussian_sigma)
    mass = torch.full((b, 1, h * w), 1.0 / (h * w), device=transition.device)
    for _ in range(iterations):
        mass = torch.bmm(mass, transition)  # mass at b = Σ_a mass_a P[a, b]
    return mass.view(b, h, w)


def minmax_scale(maps: Tensor) -> Tensor:
    """Each (h, w) map of a (..., h, w) tensor scaled to [0, 1]; a constant map becomes 0."""
    flat = maps.flatten(-2)
    low, high = flat.amin(-1, keepdim=True), flat.amax(-1, keepdim=True)
    scaled = (flat - low) / (high - low).clamp_min(torch.finfo(flat.dtype).tiny)
    return torch.where(high > low, scaled, torch.zeros_like(scaled)).view_as(maps)


def object_saliency(
    feature_maps: Sequence[Tensor], size: tuple[int, int], iterations: int = 10, gaussian_sigma: float = 0.0
) -> Tensor:
    """The final object-attention proposal: walk each map, scale to [0, 1], resize, average.

    Every layer has one vote: a layer's K maps (e.g. one per CAM branch) are averaged first,
    then the layers ("all M^{l_k} ... are averaged to a single map", §3.1), so a layer after the
    CAMs does not outweigh one before them by its number of branches.

    Args:
        feature_maps: tensors (K, B, C, h, w), K maps per image each (e.g. one per CAM branch);
            the layers may have different sizes.
        size: (H, W) of the image.
        iterations, gaussian_sigma: of :func:`random_walk_saliency`.

    Returns:
        (B, H, W) float32 in [0, 1] (all zero where every map is constant).
    """
    if not feature_maps:
        raise ValueError("object_saliency needs at least one feature map")
    layers = []
    for maps in feature_maps:
        k, b = maps.shape[:2]
        mass = random_walk_saliency(maps.flatten(0, 1), iterations, gaussian_sigma)
        layer = minmax_scale(mass).view(k, b, *mass.shape[1:]).mean(0)  # resizing is linear: average first
        layers.append(F.interpolate(layer[:, None], size=size, mode="bilinear", align_corners=False)[:, 0])
    return torch.stack(layers).mean(0).clamp(0.0, 1.0)


def oam_saliency(feature_maps: Sequence[Tensor], size: tuple[int, int], iterations: int, variant: str) -> Tensor:
    """The OAM proposal of one variant (no gradient), see the module docstring.

    Args:
        feature_maps: per layer, (K, B, C, h, w) maps (K CAM branches after the CAMs, else 1).
        size: (H, W) of the image.
        iterations: random-walk steps T.
        variant: 'code' (default of the recipe: first branch, edge weights × the Gaussian of
            the spatial distance, σ = :data:`CODE_GAUSSIAN_SIGMA` × side) or 'paper' (all
            branches, edge weights ‖u_a − u_b‖ only).

    Returns:
        (B, H, W) float32 in [0, 1].
    """
    if variant not in OAM_VARIANTS:
        raise ValueError(f"oam variant must be one of {OAM_VARIANTS}, got {variant!r}")
    if variant == "code":
        return object_saliency([m[:1].detach() for m in feature_maps], size, iterations, CODE_GAUSSIAN_SIGMA)
    return object_saliency([m.detach() for m in feature_maps], size, iterations)


#: scipy.ndimage.label structure: 8-connectivity within each map of a (B, H, W) stack, none across maps.
_EIGHT_CONNECTED_PER_MAP = np.zeros((3, 3, 3), dtype=bool)
_EIGHT_CONNECTED_PER_MAP[1] = True


def connected_components(mask: Tensor) -> Tensor:
    """Labels of the 8-connected regions of boolean maps, batched.

    One ``scipy.ndimage.label`` call over the stack (on the CPU; a few ms for 32 maps of 128 × 128,
    where label propagation by max-pooling took 1.5 s: its iterations grow with a region's length).

    Args:
        mask: (B, H, W) bool.

    Returns:
        (B, H, W) int64 on ``mask``'s device: 0 outside the mask; inside, each region carries the
        largest 1-based row-major position index among its pixels (labels differ between regions).
    """
    b, h, w = mask.shape
    regions, count = ndimage.label(mask.detach().cpu().numpy(), structure=_EIGHT_CONNECTED_PER_MAP)
    positions = np.broadcast_to(np.arange(1, h * w + 1, dtype=np.int64).reshape(1, h, w), (b, h, w))
    top = np.zeros(count + 1, dtype=np.int64)
    if count:
        top[1:] = ndimage.maximum(positions, labels=regions, index=np.arange(1, count + 1))
    return torch.from_numpy(top[regions]).to(mask.device)


def largest_component(mask: Tensor) -> Tensor:
    """The largest 8-connected region (by pixel count) of each boolean map (B, H, W) → bool (B, H, W).

    Ties go to the region with the larger label; an empty map stays empty.
    """
    b, h, w = mask.shape
    labels = connected_components(mask)
    offsets = torch.arange(b, device=mask.device)[:, None] * (h * w + 1)
    counts = torch.bincount((labels.flatten(1) + offsets).flatten(), minlength=b * (h * w + 1))
    counts = counts.view(b, h * w + 1)
    counts[:, 0] = 0
    best = counts.argmax(1)
    return (labels == best[:, None, None]) & mask


def mask_box(mask: Tensor) -> Tensor:
    """Bounding boxes (B, 4) = (x0, y0, x1, y1) in pixels, end exclusive, of boolean maps (B, H, W).

    An empty map gives the whole image.
    """
    b, h, w = mask.shape
    rows, cols = mask.any(2), mask.any(1)
    grid_y = torch.arange(h, device=mask.device).expand(b, h)
    grid_x = torch.arange(w, device=mask.device).expand(b, w)
    y0 = torch.where(rows, grid_y, h).amin(1)
    y1 = torch.where(rows, grid_y, -1).amax(1) + 1
    x0 = torch.where(cols, grid_x, w).amin(1)
    x1 = torch.where(cols, grid_x, -1).amax(1) + 1
    boxes = torch.stack([x0, y0, x1, y1], dim=1).float()
    full = torch.tensor([0.0, 0.0, float(w), float(h)], device=mask.device).expand(b, 4)
    return torch.where(mask.flatten(1).any(1, keepdim=True), boxes, full)


def square_box(boxes: Tensor, size: tuple[int, int]) -> Tensor:
    """Boxes made square around their centre with side (w + h) / 2, then clipped to the image.

    As the authors' code: ``x += round((w − h) / 4)``, ``y += round((h − w) / 4)``,
    ``side = round((w + h) / 2)``, intersect with the image (rounding half away from zero).
    """
    x0, y0, x1, y1 = boxes.unbind(1)
    w, h = x1 - x0, y1 - y0

    def round_half_away(v: Tensor) -> Tensor:
        return torch.sign(v) * torch.floor(v.abs() + 0.5)

    nx0, ny0 = x0 + round_half_away((w - h) / 4), y0 + round_half_away((h - w) / 4)
    side = round_half_away((w + h) / 2)
    height, width = size
    return torch.stack(
        [nx0.clamp(0, width), ny0.clamp(0, height), (nx0 + side).clamp(0, width), (ny0 + side).clamp(0, height)], dim=1
    )


def attention_box(saliency: Tensor) -> Tensor:
    """The object box of saliency maps (B, H, W) → (B, 4) (x0, y0, x1, y1) pixels, end exclusive.

    The positions strictly above each map's mean; the bounding box of their largest
    8-connected region, made square (:func:`square_box`). A constant map gives the whole image.
    """
    mask = saliency > saliency.mean(dim=(1, 2), keepdim=True)
    boxes = square_box(mask_box(largest_component(mask)), spatial_size(saliency))
    constant = ~mask.flatten(1).any(1, keepdim=True)
    full = torch.tensor([0.0, 0.0, saliency.shape[2], saliency.shape[1]], device=saliency.device)
    return torch.where(constant, full.expand_as(boxes), boxes)


def _affine(boxes: Tensor, size: tuple[int, int]) -> Tensor:
    """(B, 2, 3) matrices mapping output grid coordinates in [-1, 1] to the boxes' source coordinates."""
    height, width = size
    x0, y0, x1, y1 = boxes.float().unbind(1)
    zeros = torch.zeros_like(x0)
    return torch.stack(
        [
            torch.stack([(x1 - x0) / width, zeros, (x0 + x1) / width - 1], dim=1),
            torch.stack([zeros, (y1 - y0) / height, (y0 + y1) / height - 1], dim=1),
        ],
        dim=1,
    )


def crop_and_zoom(images: Tensor, boxes: Tensor, size: tuple[int, int] | None = None) -> Tensor:
    """Crop each box and resize it (bilinear) to ``size`` — the ⊙ operation of DeML Fig. 2.

    Args:
        images: (B, C, H, W).
        boxes: (B, 4) (x0, y0, x1, y1) in pixels of ``images``, end exclusive.
        size: output (h, w); default the input size.

    Returns:
        (B, C, h, w); output pixel centres sample the box uniformly (``align_corners=False``).
    """
    out = size or spatial_size(images)
    grid = F.affine_grid(
        _affine(boxes, spatial_size(images)).to(images.dtype),
        [images.shape[0], images.shape[1], *out],
        align_corners=False,
    )
    return F.grid_sample(images, grid, mode="bilinear", padding_mode="border", align_corners=False)


def compose_boxes(outer: Tensor, inner: Tensor, crop_size: tuple[int, int]) -> Tensor:
    """Boxes ``inner`` given in the pixels of crops of size ``crop_size`` taken from ``outer`` boxes,
    expressed in the pixels of the original image. (B, 4) each."""
    height, width = crop_size
    ox0, oy0, ox1, oy1 = outer.unbind(1)
    sx, sy = (ox1 - ox0) / width, (oy1 - oy0) / height
    ix0, iy0, ix1, iy1 = inner.unbind(1)
    return torch.stack([ox0 + ix0 * sx, oy0 + iy0 * sy, ox0 + ix1 * sx, oy0 + iy1 * sy], dim=1)


def paste_into_image(maps: Tensor, boxes: Tensor, size: tuple[int, int]) -> Tensor:
    """Maps (B, h, w) defined on crops placed back at their ``boxes`` in an image of ``size``; 0 outside.

    The inverse of :func:`crop_and_zoom`, for drawing a later scale's saliency on the original image.
    """
    height, width = size
    x0, y0, x1, y1 = boxes.float().unbind(1)
    bw, bh = (x1 - x0).clamp_min(1e-6), (y1 - y0).clamp_min(1e-6)
    # Output (original image) grid coordinate g ∈ [-1, 1] ↔ pixel p = (g + 1) W / 2; inside the crop
    # its normalised coordinate is 2 (p − x0) / bw − 1.
    zeros = torch.zeros_like(x0)
    theta = torch.stack(
        [
            torch.stack([width / bw, zeros, (width - 2 * x0) / bw - 1], dim=1),
            torch.stack([zeros, height / bh, (height - 2 * y0) / bh - 1], dim=1),
        ],
        dim=1,
    )
    grid = F.affine_grid(theta.to(maps.dtype), [maps.shape[0], 1, height, width], align_corners=False)
    return F.grid_sample(maps[:, None], grid, mode="bilinear", padding_mode="zeros", align_corners=False)[:, 0]


def box_mask(boxes: Tensor, size: tuple[int, int]) -> Tensor:
    """(B, H, W) float maps: 1 on the pixels whose centre lies inside the box, else 0."""
    height, width = size
    ys = torch.arange(height, device=boxes.device).float() + 0.5
    xs = torch.arange(width, device=boxes.device).float() + 0.5
    x0, y0, x1, y1 = (v[:, None] for v in boxes.float().unbind(1))
    inside_y = (ys[None] >= y0) & (ys[None] < y1)
    inside_x = (xs[None] >= x0) & (xs[None] < x1)
    return (inside_y[:, :, None] & inside_x[:, None, :]).float()


def box_coverage(boxes: Tensor, objects: Tensor) -> Tensor:
    """Share of each object box's area that a box covers: |box ∩ object| / |object|, (B,) in [0, 1].

    Args:
        boxes, objects: (B, 4) (x0, y0, x1, y1) in the same pixels; an empty object gives NaN.
    """
    width = (torch.minimum(boxes[:, 2], objects[:, 2]) - torch.maximum(boxes[:, 0], objects[:, 0])).clamp_min(0)
    height = (torch.minimum(boxes[:, 3], objects[:, 3]) - torch.maximum(boxes[:, 1], objects[:, 1])).clamp_min(0)
    area = (objects[:, 2] - objects[:, 0]) * (objects[:, 3] - objects[:, 1])
    return torch.where(
        area > 0, width * height / area.clamp_min(torch.finfo(area.dtype).tiny), torch.full_like(area, math.nan)
    )


def saliency_contrast(saliency: Tensor, objects: Tensor) -> Tensor:
    """Mean saliency inside each object box minus the mean outside it, (B,) (NaN where the box
    holds no pixel centre or all of them).

    Args:
        saliency: (B, H, W).
        objects: (B, 4) (x0, y0, x1, y1) pixels of ``saliency``.
    """
    inside = box_mask(objects, spatial_size(saliency))
    count = inside.sum((1, 2))
    total = float(inside[0].numel())
    mean_in = (saliency * inside).sum((1, 2)) / count.clamp_min(1)
    mean_out = (saliency * (1 - inside)).sum((1, 2)) / (total - count).clamp_min(1)
    return torch.where((count > 0) & (count < total), mean_in - mean_out, torch.full_like(count, math.nan))
