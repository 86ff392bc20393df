"""Drawing of one image of the ``synthetic`` dataset (pure numpy, no PIL, no global RNG).

An image is a cluttered background, up to a few distractor shapes, and one
*object*: a body (an ellipse, the same for every class) plus 3–4 *parts* at
fixed positions relative to the body. Each part has a shape, a colour and a
texture from :data:`SHAPES`, :data:`COLOURS` and :data:`TEXTURES`; the class
lives only in the parts.

Geometry is computed in *object units*; at scale 1 one unit is
``UNIT_FRACTION × image_size`` pixels (6.4 px at 64 px), a part has radius
``PART_RADIUS`` units (a ≈13 px wide part at 64 px). Shapes are rasterised
at ``SUPERSAMPLE``× resolution with integer colours and averaged over
``SUPERSAMPLE × SUPERSAMPLE`` blocks (exact box-filter anti-aliasing).

Reproducibility across machines: random numbers come only from
``Generator.random``/``integers`` (exact integer/float arithmetic, no
``normal``), trigonometry only from :mod:`math` on scalars, and array maths
only from IEEE-exact element-wise operations (+, −, ×, ÷, sqrt, floor), so
the same seed gives the same pixels everywhere.

:func:`render_image` also returns the object's bounding box: the pixels that
any supersampled sample of the body or a part covers (occluders and
distractors ignored), computed from the shapes alone, so it draws nothing
from the random stream and leaves the pixels unchanged.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import NamedTuple

import numpy as np

#: Shape vocabulary of parts and distractors.
SHAPES: tuple[str, ...] = ("circle", "triangle", "square", "diamond")
#: Texture vocabulary; the pattern is drawn in a dark shade of the part colour.
TEXTURES: tuple[str, ...] = ("solid", "stripes", "dots", "checker")
#: Part colours (RGB, 0..255): six hues 60° apart, far apart under any lighting.
COLOURS: dict[str, tuple[int, int, int]] = {
    "red": (225, 45, 40),
    "yellow": (240, 210, 30),
    "green": (40, 175, 55),
    "cyan": (35, 200, 215),
    "blue": (45, 70, 215),
    "magenta": (205, 55, 195),
}
#: Part names in order; ``num_parts = 3`` uses the first three.
PART_NAMES: tuple[str, ...] = ("head", "wing", "tail", "crest")
#: Part centres in object units (x right = facing direction, y down), before jitter.
PART_OFFSETS: dict[str, tuple[float, float]] = {
    "head": (2.45, -0.95),
    "wing": (-0.3, 0.25),
    "tail": (-2.65, 0.2),
    "crest": (0.8, -2.0),
}
#: Drawing order of the parts (later ones on top).
PART_DRAW_ORDER: tuple[str, ...] = ("tail", "crest", "wing", "head")
#: Body: ellipse semi-axes in object units and mean colour (RGB).
BODY_SEMI_AXES: tuple[float, float] = (2.1, 1.3)
BODY_COLOUR: tuple[int, int, int] = (150, 125, 100)
BODY_COLOUR_JITTER = 15
#: Radius of a part in object units (that of a circle; the other shapes have about the same area).
PART_RADIUS = 1.0
#: One object unit at scale 1, as a fraction of the image side.
UNIT_FRACTION = 0.1
#: Outline width (object units) and colour of body, parts and distractors.
OUTLINE_WIDTH = 0.14
OUTLINE_COLOUR: tuple[int, int, int] = (25, 22, 20)
#: Texture period as a multiple of the part radius; texture colour = colour × TEXTURE_SHADE.
TEXTURE_PERIOD = 0.8
TEXTURE_SHADE = 0.3
#: Supersampling factor of the rasteriser.
SUPERSAMPLE = 4
#: Distractor radius as a multiple of the part radius (uniform in this range).
DISTRACTOR_SIZE_RANGE: tuple[float, float] = (0.7, 1.3)

_SQRT3_2 = math.sqrt(3.0) / 2.0
#: Farthest point of each shape from its centre, in radii (bounds the rasterised patch).
_EXTENT: dict[str, float] = {
    "circle": 1.0,
    "ellipse": 1.0,
    "square": 0.85 * math.sqrt(2.0),
    "diamond": 1.2,
    "triangle": 1.35,
}


@dataclass(frozen=True)
class RenderParams:
    """Instance-variation settings (see the ``synthetic`` module docstring for each key)."""

    image_size: int = 64
    scale_range: tuple[float, float] = (0.8, 1.1)
    rotation_deg: float = 25.0
    flip_prob: float = 0.5
    offset_fraction: float = 0.12
    part_jitter: float = 0.15
    num_distractors: int = 3
    occlusion_prob: float = 0.1
    brightness_range: tuple[float, float] = (0.7, 1.3)
    contrast_range: tuple[float, float] = (0.7, 1.2)
    colour_cast: float = 0.1
    gradient_strength: float = 0.3
    noise_amplitude: float = 8.0


class Part(NamedTuple):
    """Attributes of one part (names from :data:`PART_NAMES`, :data:`SHAPES`, :data:`COLOURS`, :data:`TEXTURES`)."""

    name: str
    shape: str
    colour: str
    texture: str


class RenderedImage(NamedTuple):
    """One rendered image and where its object is.

    Attributes:
        image: (image_size, image_size, 3) uint8 RGB.
        box: ``(x, y, w, h)`` integer pixels, the tightest pixel-aligned box around every
            pixel the object (body and parts) covers at least partly, clipped to the image;
            occluders in front of the object do not shrink it.
    """

    image: np.ndarray
    box: tuple[int, int, int, int]


class _Shape(NamedTuple):
    """One shape to rasterise, in supersampled pixel coordinates."""

    kind: str  # a SHAPES entry or "ellipse"
    cx: float
    cy: float
    radius: float  # px; for "ellipse" the semi-major axis
    angle: float  # radians, counter-clockwise on screen
    colour: tuple[int, int, int]
    texture: str
    phase: tuple[float, float]  # texture offset, px
    aspect: float = 1.0  # ellipse semi-minor / semi-major


def _gauge(kind: str, u: np.ndarray, v: np.ndarray, aspect: float) -> np.ndarray:
    """Shape 'norm' of local coordinates: the shape of radius r is ``gauge < r``.

    Normalised so that all part shapes have roughly the area of the circle
    (square half-side 0.85 r, diamond half-diagonal 1.2 r, triangle
    circumradius 1.35 r, apex up in the shape frame).
    """
    if kind == "circle":
        return np.sqrt(u * u + v * v)
    if kind == "ellipse":
        w = v / aspect
        return np.sqrt(u * u + w * w)
    if kind == "square":
        return np.maximum(np.abs(u), np.abs(v)) / 0.85
    if kind == "diamond":
        return (np.abs(u) + np.abs(v)) / 1.2
    if kind == "triangle":
        edges = np.maximum(np.maximum(v, _SQRT3_2 * u - 0.5 * v), -_SQRT3_2 * u - 0.5 * v)
        return edges / 0.675
    raise ValueError(f"unknown shape {kind!r}")


def _texture_mask(texture: str, u: np.ndarray, v: np.ndarray, period: float, phase: tuple[float, float]) -> np.ndarray:
    """Boolean mask (same shape as ``u``) of the pattern pixels of ``texture``."""
    a = (u + phase[0]) / period
    b = (v + phase[1]) / period
    if texture == "solid":
        return np.zeros(u.shape, dtype=bool)
    if texture == "stripes":
        return np.floor(2.0 * b) % 2 == 1
    if texture == "dots":
        du = a - np.floor(a) - 0.5
        dv = b - np.floor(b) - 0.5
        return du * du + dv * dv < 0.32 * 0.32
    if texture == "checker":
        return (np.floor(2.0 * a) + np.floor(2.0 * b)) % 2 == 1
    raise ValueError(f"unknown texture {texture!r}")


def _paint(colour_px: np.ndarray, cover_px: np.ndarray, shape: _Shape, outline: float) -> None:
    """Rasterise ``shape`` (with outline and texture) into the supersampled canvas in place.

    Args:
        colour_px: (H, W, 3) uint8 supersampled colour canvas.
        cover_px: (H, W) uint8 coverage canvas (1 where something is drawn).
        outline: outline width in supersampled px.
    """
    size = colour_px.shape[0]
    reach = _EXTENT[shape.kind] * shape.radius + 2.0
    x0, x1 = max(0, int(math.floor(shape.cx - reach))), min(size, int(math.ceil(shape.cx + reach)))
    y0, y1 = max(0, int(math.floor(shape.cy - reach))), min(size, int(math.ceil(shape.cy + reach)))
    if x0 >= x1 or y0 >= y1:
        return
    dx = (np.arange(x0, x1, dtype=np.float64) + 0.5 - shape.cx)[None, :]
    dy = (np.arange(y0, y1, dtype=np.float64) + 0.5 - shape.cy)[:, None]
    cos, sin = math.cos(shape.angle), math.sin(shape.angle)
    u = cos * dx - sin * dy
    v = sin * dx + cos * dy
    gauge = _gauge(shape.kind, u, v, shape.aspect)
    inside = gauge < shape.radius
    pattern = _texture_mask(shape.texture, u, v, TEXTURE_PERIOD * shape.radius, shape.phase)
    shade = tuple(int(c * TEXTURE_SHADE) for c in shape.colour)
    fill = np.where(pattern[:, :, None], np.array(shade, np.uint8), np.array(shape.colour, np.uint8))
    fill[gauge >= shape.radius - outline] = OUTLINE_COLOUR
    np.copyto(colour_px[y0:y1, x0:x1], fill, where=inside[:, :, None])
    np.copyto(cover_px[y0:y1, x0:x1], 1, where=inside)


def _uniform(rng: np.random.Generator, bounds: tuple[float, float]) -> float:
    """One draw, uniform in ``[bounds[0], bounds[1])``."""
    return bounds[0] + (bounds[1] - bounds[0]) * float(rng.random())


def _object_shapes(parts: tuple[Part, ...], params: RenderParams, rng: np.random.Generator) -> list[_Shape]:
    """Body and parts of one object instance (pose, scale, position, part jitter drawn from ``rng``)."""
    hi = params.image_size * SUPERSAMPLE
    unit = UNIT_FRACTION * hi * _uniform(rng, params.scale_range)
    angle = math.radians(_uniform(rng, (-params.rotation_deg, params.rotation_deg)))
    mirror = -1.0 if rng.random() < params.flip_prob else 1.0
    cx = hi * (0.5 + _uniform(rng, (-params.offset_fraction, params.offset_fraction)))
    cy = hi * (0.5 + _uniform(rng, (-params.offset_fraction, params.offset_fraction)))
    cos, sin = math.cos(angle), math.sin(angle)
    red, green, blue = (int(c) + int(rng.integers(-BODY_COLOUR_JITTER, BODY_COLOUR_JITTER + 1)) for c in BODY_COLOUR)
    body_colour = (red, green, blue)
    shapes = [
        _Shape(
            "ellipse",
            cx,
            cy,
            BODY_SEMI_AXES[0] * unit,
            angle,
            body_colour,
            "solid",
            (0.0, 0.0),
            BODY_SEMI_AXES[1] / BODY_SEMI_AXES[0],
        )
    ]
    by_name = {p.name: p for p in parts}
    for name in PART_DRAW_ORDER:
        if name not in by_name:
            continue
        part = by_name[name]
        ox, oy = PART_OFFSETS[name]
        ox = mirror * (ox + _uniform(rng, (-params.part_jitter, params.part_jitter)))
        oy = oy + _uniform(rng, (-params.part_jitter, params.part_jitter))
        radius = PART_RADIUS * unit * _uniform(rng, (0.9, 1.1))
        phase = (float(rng.random()) * hi, float(rng.random()) * hi)
        shapes.append(
            _Shape(
                part.shape,
                cx + unit * (cos * ox + sin * oy),
                cy + unit * (-sin * ox + cos * oy),
                radius,
                angle,
                COLOURS[part.colour],
                part.texture,
                phase,
            )
        )
    return shapes


def _distractor(params: RenderParams, rng: np.random.Generator) -> _Shape:
    """A random shape from the part vocabulary, anywhere in the image, any orientation."""
    hi = params.image_size * SUPERSAMPLE
    radius = PART_RADIUS * UNIT_FRACTION * hi * _uniform(rng, DISTRACTOR_SIZE_RANGE)
    colour = COLOURS[list(COLOURS)[int(rng.integers(len(COLOURS)))]]
    return _Shape(
        SHAPES[int(rng.integers(len(SHAPES)))],
        float(rng.random()) * hi,
        float(rng.random()) * hi,
        radius,
        2.0 * math.pi * float(rng.random()),
        colour,
        TEXTURES[int(rng.integers(len(TEXTURES)))],
        (float(rng.random()) * hi, float(rng.random()) * hi),
    )


def _value_noise(size: int, cells: int, rng: np.random.Generator) -> np.ndarray:
    """(size, size) smooth noise in [-1, 1): a (cells+1)² uniform lattice, bilinearly interpolated."""
    lattice = 2.0 * rng.random((cells + 1, cells + 1)) - 1.0
    pos = (np.arange(size, dtype=np.float64) + 0.5) * (cells / size)
    i = np.minimum(np.floor(pos).astype(np.int64), cells - 1)
    f = pos - i
    rows = lattice[i] * (1.0 - f)[:, None] + lattice[i + 1] * f[:, None]  # (size, cells+1)
    return rows[:, i] * (1.0 - f)[None, :] + rows[:, i + 1] * f[None, :]


def _linear_ramp(size: int, rng: np.random.Generator) -> np.ndarray:
    """(size, size) linear ramp in a random direction, spanning about [-1, 1] over the image."""
    a, b = 2.0 * float(rng.random()) - 1.0, 2.0 * float(rng.random()) - 1.0
    norm = max(abs(a) + abs(b), 1e-6)
    coords = (np.arange(size, dtype=np.float64) + 0.5) * (2.0 / size) - 1.0
    return (a / norm) * coords[None, :] + (b / norm) * coords[:, None]


def _background(size: int, rng: np.random.Generator) -> np.ndarray:
    """(size, size, 3) float background in 0..255: a two-colour gradient plus two octaves of value noise."""
    grey = 60.0 + 130.0 * rng.random(2)
    tint = 80.0 * rng.random((2, 3)) - 40.0
    c0, c1 = grey[0] + tint[0], grey[1] + tint[1]
    t = 0.5 + 0.5 * _linear_ramp(size, rng)
    base = c0[None, None, :] * (1.0 - t)[:, :, None] + c1[None, None, :] * t[:, :, None]
    texture = 35.0 * _value_noise(size, 4, rng) + 20.0 * _value_noise(size, 12, rng)
    colour_noise = 12.0 * _value_noise(size, 6, rng)
    channel_sign = np.array([1.0, -0.5, -0.5]) if rng.random() < 0.5 else np.array([-0.5, 1.0, -0.5])
    return base + texture[:, :, None] + colour_noise[:, :, None] * channel_sign[None, None, :]


def _apply_lighting(image: np.ndarray, params: RenderParams, rng: np.random.Generator) -> np.ndarray:
    """Contrast, brightness, colour cast, lighting gradient and sensor noise on a (S, S, 3) float image."""
    size = image.shape[0]
    contrast = _uniform(rng, params.contrast_range)
    brightness = _uniform(rng, params.brightness_range)
    cast = 1.0 + params.colour_cast * (2.0 * rng.random(3) - 1.0)
    gradient = 1.0 + params.gradient_strength * float(rng.random()) * _linear_ramp(size, rng)
    out = (128.0 + (image - 128.0) * contrast) * brightness
    out = out * cast[None, None, :] * gradient[:, :, None]
    return out + params.noise_amplitude * (2.0 * rng.random(image.shape) - 1.0)


def _block_sum(canvas: np.ndarray) -> np.ndarray:
    """Exact integer sums over ``SUPERSAMPLE × SUPERSAMPLE`` blocks: (H, W, ...) uint8 → (H/s, W/s, ...) uint16."""
    wide = canvas.astype(np.uint16)
    rows = sum(wide[i::SUPERSAMPLE] for i in range(1, SUPERSAMPLE)) + wide[0::SUPERSAMPLE]
    return sum(rows[:, i::SUPERSAMPLE] for i in range(1, SUPERSAMPLE)) + rows[:, 0::SUPERSAMPLE]


def _object_box(shapes: list[_Shape], size: int) -> tuple[int, int, int, int]:
    """``(x, y, w, h)`` pixels of the region the shapes cover, from a supersampled coverage canvas.

    Args:
        shapes: the object's shapes, in supersampled pixels.
        size: image side in (output) pixels.
    """
    hi = size * SUPERSAMPLE
    scratch = np.zeros((hi, hi, 3), dtype=np.uint8)
    cover = np.zeros((hi, hi), dtype=np.uint8)
    for shape in shapes:
        _paint(scratch, cover, shape, 0.0)
    rows, cols = np.flatnonzero(cover.any(1)), np.flatnonzero(cover.any(0))
    if not len(rows):
        return 0, 0, 0, 0
    y0, y1 = int(rows[0]) // SUPERSAMPLE, int(rows[-1]) // SUPERSAMPLE + 1
    x0, x1 = int(cols[0]) // SUPERSAMPLE, int(cols[-1]) // SUPERSAMPLE + 1
    return x0, y0, x1 - x0, y1 - y0


def render_image(parts: tuple[Part, ...], params: RenderParams, rng: np.random.Generator) -> RenderedImage:
    """Render one instance of the class whose parts are ``parts``.

    Args:
        parts: the class's parts (3 or 4, names from :data:`PART_NAMES`).
        params: instance-variation settings.
        rng: the source of all randomness of this image.

    Returns:
        The image ((image_size, image_size, 3) uint8 RGB) and its object box.
    """
    size = params.image_size
    hi = size * SUPERSAMPLE
    background = _background(size, rng)
    n_distractors = int(rng.integers(params.num_distractors + 1))
    distractors = [_distractor(params, rng) for _ in range(n_distractors)]
    occluder = n_distractors > 0 and rng.random() < params.occlusion_prob
    obj = _object_shapes(parts, params, rng)
    order = distractors[1:] + obj + distractors[:1] if occluder else distractors + obj
    colour_px = np.zeros((hi, hi, 3), dtype=np.uint8)
    cover_px = np.zeros((hi, hi), dtype=np.uint8)
    outline = OUTLINE_WIDTH * UNIT_FRACTION * hi
    for shape in order:
        _paint(colour_px, cover_px, shape, outline)
    n_sub = SUPERSAMPLE * SUPERSAMPLE
    alpha = (_block_sum(cover_px) / n_sub)[:, :, None]
    composite = _block_sum(colour_px) / n_sub + background * (1.0 - alpha)
    lit = _apply_lighting(composite, params, rng)
    return RenderedImage(np.clip(np.rint(lit), 0, 255).astype(np.uint8), _object_box(obj, size))
