"""The embedded ``synthetic`` dataset: a generated fine-grained image dataset (CUB/Cars-like, CPU-sized).

Every image shows one *object* (a bird-like body plus 3–4 *parts*: head,
wing, tail and optionally crest) on a cluttered background. A part has a
shape, a colour and a texture; a *class* is one combination of part
attributes. Classes come in *families*: a random prototype plus mutants that
change one or two part attributes, so many classes differ in exactly one
attribute of one part (fine-grained). Drawing is in
:mod:`dmlbench.data.synthetic_render`; this module builds the class table,
validates the configuration and writes the dataset.

Configuration keys (``datasets.synthetic`` params section; the keys
``kind``, ``label``, ``recall_ks`` and ``training`` belong to other parts of
the benchmark and are ignored here; any other key is an error):

Dataset and classes
    ``seed`` (0): seed of every random draw (class table and images).
    ``num_classes`` (100): even, 2..1000; labels ``0..C/2-1`` are ``train``,
    the rest ``test``.
    ``images_per_class`` (40): 1..1000.
    ``image_size`` (64): side of the square RGB images in px, 32..512.
    ``num_parts`` (4): 3 (head, wing, tail) or 4 (+ crest).
    ``classes_per_family`` (10): most classes per family, 2..20; each split
    half is cut into ``ceil(half / classes_per_family)`` families of
    near-equal size.
    ``double_mutation_fraction`` (0.3): share of a family's non-prototype
    classes that mutate two attributes instead of one, 0..1.

Pretraining classes
    ``pretrain_classes`` (0): 0..1000 further classes, labels ``C..C+P-1``,
    for pretraining a backbone by classification (rule ``pretrain``) — the
    role ImageNet plays for the papers: the same part vocabulary, other
    combinations (their own families, with prototypes as far from every other
    prototype as the benchmark's are from each other), so no benchmark class is
    seen in pretraining. They are drawn after the benchmark's classes, so
    adding them changes no benchmark class or image. Every fifth family
    (families 4, 9, ...) is held out as the pretraining run's ``test`` split.
    Their images have ``images_per_class`` each.

Instance variation
    ``scale_range`` ([0.8, 1.1]): object scale, uniform; at scale 1 a part is
    ≈ 0.2 × image_size wide (13 px at 64 px).
    ``rotation_deg`` (25): in-plane rotation of the whole object, uniform in
    ±this many degrees, 0..180.
    ``flip_prob`` (0.5): probability of mirroring the layout (head left).
    ``offset_fraction`` (0.12): object centre offset from the image centre,
    uniform in ±this fraction of image_size per axis, 0..0.5.
    ``part_jitter`` (0.15): per-instance shift of each part, uniform in ±this
    many object units (1 unit = 0.1 × image_size × scale), 0..1.
    ``num_distractors`` (3): most distractor shapes per image (uniform
    count 0..this, 0..20); same shape/colour/texture vocabulary as parts.
    ``occlusion_prob`` (0.1): probability that one distractor is drawn in
    front of the object instead of behind it.
    ``brightness_range`` ([0.7, 1.3]): global brightness factor, uniform.
    ``contrast_range`` ([0.7, 1.2]): contrast factor about grey 128, uniform.
    ``colour_cast`` (0.1): per-channel gain, uniform in 1 ± this, 0..<1.
    ``gradient_strength`` (0.3): lighting gradient, a multiplicative ramp of
    up to ± this across the image in a random direction, 0..<1.
    ``noise_amplitude`` (8): per-pixel uniform noise in ± this (0..255 scale).

Output under ``out_dir`` (see :func:`prepare`)::

    images/<label:03d>_<class_name>/<image:03d>.png
    classes.csv     label, class_name, family, split, <part>_shape, <part>_colour, <part>_texture ...
    pretrain.csv    the pretraining classes' rows, as manifest.csv (split train/test; only with pretrain_classes)
    manifest.csv    path, label, class_name, split, bbox   (written last; benchmark classes only)

``bbox`` is the object's box (body and parts, ignoring occluders) in the
manifest's format ``"x y w h"``, whole pixels of the image file (as CUB's
``bounding_boxes.txt``); see :class:`~dmlbench.data.synthetic_render.RenderedImage`.

PNG files are written by :func:`encode_png` (uncompressed deflate blocks), so
their bytes depend only on the pixels, which depend only on the
configuration: the same seed gives identical files on any machine and with
any Pillow/zlib build.
"""

from __future__ import annotations

import math
import struct
import zlib
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
import pandas as pd

from dmlbench.atomic import atomic_output
from dmlbench.data.images import format_bbox
from dmlbench.data.manifest import write_manifest
from dmlbench.data.synthetic_render import COLOURS, PART_NAMES, SHAPES, TEXTURES, Part, RenderParams, render_image

#: Every configuration key with its default.
DEFAULTS: dict[str, Any] = {
    "seed": 0,
    "num_classes": 100,
    "images_per_class": 40,
    "image_size": 64,
    "num_parts": 4,
    "classes_per_family": 10,
    "double_mutation_fraction": 0.3,
    "pretrain_classes": 0,
    "scale_range": [0.8, 1.1],
    "rotation_deg": 25.0,
    "flip_prob": 0.5,
    "offset_fraction": 0.12,
    "part_jitter": 0.15,
    "num_distractors": 3,
    "occlusion_prob": 0.1,
    "brightness_range": [0.7, 1.3],
    "contrast_range": [0.7, 1.2],
    "colour_cast": 0.1,
    "gradient_strength": 0.3,
    "noise_amplitude": 8.0,
}
#: Keys of the params section that belong to other parts of the benchmark.
FOREIGN_KEYS: frozenset[str] = frozenset({"kind", "label", "recall_ks", "training"})
#: Part attributes and their vocabularies, in column order.
ATTRIBUTES: dict[str, tuple[str, ...]] = {"shape": SHAPES, "colour": tuple(COLOURS), "texture": TEXTURES}

IMAGES_DIR = "images"
CLASSES_FILE = "classes.csv"
MANIFEST_FILE = "manifest.csv"
PRETRAIN_MANIFEST_FILE = "pretrain.csv"
#: ``split`` of the pretraining classes in classes.csv; pretrain.csv splits them into train/test.
PRETRAIN_SPLIT = "pretrain"
#: Every this-many-th pretraining family (the last of each run of this many) is held out as ``test``.
PRETRAIN_TEST_EVERY = 5
# Independent random streams derived from the seed: np.random.default_rng([seed, stream, ...]).
_CLASS_STREAM = 0
_IMAGE_STREAM = 1
_MAX_DRAWS_PER_CLASS = 1000


@dataclass(frozen=True)
class SyntheticConfig:
    """A validated configuration (see the module docstring for each field)."""

    seed: int
    num_classes: int
    images_per_class: int
    num_parts: int
    classes_per_family: int
    double_mutation_fraction: float
    render: RenderParams
    pretrain_classes: int = 0

    @property
    def part_names(self) -> tuple[str, ...]:
        """Names of the parts in use, in :data:`PART_NAMES` order."""
        return PART_NAMES[: self.num_parts]


# ----------------------------------------------------------------------------- configuration


def _as_int(key: str, value: Any, low: int, high: int) -> int:
    if isinstance(value, bool) or not isinstance(value, (int, np.integer)):
        raise ValueError(f"synthetic: '{key}' must be an integer, got {value!r}")
    if not low <= value <= high:
        raise ValueError(f"synthetic: '{key}' = {value} is outside [{low}, {high}]")
    return int(value)


def _as_float(key: str, value: Any, low: float, high: float, *, open_high: bool = False) -> float:
    if isinstance(value, bool) or not isinstance(value, (int, float, np.integer, np.floating)):
        raise ValueError(f"synthetic: '{key}' must be a number, got {value!r}")
    value = float(value)
    if not (low <= value < high if open_high else low <= value <= high):
        raise ValueError(f"synthetic: '{key}' = {value} is outside [{low}, {high}{')' if open_high else ']'}")
    return value


def _as_range(key: str, value: Any, low: float, high: float) -> tuple[float, float]:
    if isinstance(value, (str, bytes)) or not isinstance(value, Sequence) or len(value) != 2:
        raise ValueError(f"synthetic: '{key}' must be a pair [low, high], got {value!r}")
    lo, hi = (_as_float(key, v, low, high) for v in value)
    if lo > hi:
        raise ValueError(f"synthetic: '{key}' = {list(value)} has low > high")
    return lo, hi


def parse_config(config: Mapping[str, Any]) -> SyntheticConfig:
    """Validate ``config`` (missing keys take :data:`DEFAULTS`).

    Raises:
        ValueError: naming the first unknown key or invalid value.
    """
    unknown = sorted(set(config) - set(DEFAULTS) - FOREIGN_KEYS)
    if unknown:
        raise ValueError(f"synthetic: unknown config key(s) {unknown}; known: {sorted(DEFAULTS)}")
    c = {**DEFAULTS, **{k: v for k, v in config.items() if k in DEFAULTS}}
    num_classes = _as_int("num_classes", c["num_classes"], 2, 1000)
    if num_classes % 2:
        raise ValueError(f"synthetic: 'num_classes' = {num_classes} must be even (half train, half test)")
    render = RenderParams(
        image_size=_as_int("image_size", c["image_size"], 32, 512),
        scale_range=_as_range("scale_range", c["scale_range"], 0.3, 2.0),
        rotation_deg=_as_float("rotation_deg", c["rotation_deg"], 0.0, 180.0),
        flip_prob=_as_float("flip_prob", c["flip_prob"], 0.0, 1.0),
        offset_fraction=_as_float("offset_fraction", c["offset_fraction"], 0.0, 0.5),
        part_jitter=_as_float("part_jitter", c["part_jitter"], 0.0, 1.0),
        num_distractors=_as_int("num_distractors", c["num_distractors"], 0, 20),
        occlusion_prob=_as_float("occlusion_prob", c["occlusion_prob"], 0.0, 1.0),
        brightness_range=_as_range("brightness_range", c["brightness_range"], 0.05, 3.0),
        contrast_range=_as_range("contrast_range", c["contrast_range"], 0.0, 3.0),
        colour_cast=_as_float("colour_cast", c["colour_cast"], 0.0, 1.0, open_high=True),
        gradient_strength=_as_float("gradient_strength", c["gradient_strength"], 0.0, 1.0, open_high=True),
        noise_amplitude=_as_float("noise_amplitude", c["noise_amplitude"], 0.0, 128.0),
    )
    classes_per_family = _as_int("classes_per_family", c["classes_per_family"], 2, 20)
    pretrain_classes = _as_int("pretrain_classes", c["pretrain_classes"], 0, 1000)
    if 0 < pretrain_classes and math.ceil(pretrain_classes / classes_per_family) < PRETRAIN_TEST_EVERY:
        raise ValueError(
            f"synthetic: 'pretrain_classes' = {pretrain_classes} makes "
            f"{math.ceil(pretrain_classes / classes_per_family)} families of at most {classes_per_family}; "
            f"at least {PRETRAIN_TEST_EVERY} are needed (every {PRETRAIN_TEST_EVERY}th is held out as the "
            f"pretraining test split): raise it to {classes_per_family * (PRETRAIN_TEST_EVERY - 1) + 1} "
            "or more, or set 0"
        )
    return SyntheticConfig(
        seed=_as_int("seed", c["seed"], 0, 2**63 - 1),
        num_classes=num_classes,
        images_per_class=_as_int("images_per_class", c["images_per_class"], 1, 1000),
        num_parts=_as_int("num_parts", c["num_parts"], 3, 4),
        classes_per_family=classes_per_family,
        double_mutation_fraction=_as_float("double_mutation_fraction", c["double_mutation_fraction"], 0.0, 1.0),
        render=render,
        pretrain_classes=pretrain_classes,
    )


# ----------------------------------------------------------------------------- classes

#: A class as the tuple of its attribute values, one per slot (part, attribute) in slot order.
Combo = tuple[str, ...]


def _slots(part_names: Sequence[str]) -> list[tuple[str, str]]:
    """(part, attribute) pairs in column order: head_shape, head_colour, head_texture, wing_shape, ..."""
    return [(part, attr) for part in part_names for attr in ATTRIBUTES]


def _family_sizes(half: int, classes_per_family: int) -> list[int]:
    """Cut ``half`` classes into the fewest families of at most ``classes_per_family``, sizes differing by ≤ 1."""
    n_families = math.ceil(half / classes_per_family)
    return [half // n_families + (1 if i < half % n_families else 0) for i in range(n_families)]


def _random_combo(slots: Sequence[tuple[str, str]], rng: np.random.Generator) -> Combo:
    return tuple(ATTRIBUTES[attr][int(rng.integers(len(ATTRIBUTES[attr])))] for _, attr in slots)


def _mutate(combo: Combo, slots: Sequence[tuple[str, str]], n_changes: int, rng: np.random.Generator) -> Combo:
    """``combo`` with ``n_changes`` distinct slots set to a different value each."""
    out = list(combo)
    for s in sorted(int(i) for i in rng.permutation(len(slots))[:n_changes]):
        choices = [v for v in ATTRIBUTES[slots[s][1]] if v != combo[s]]
        out[s] = choices[int(rng.integers(len(choices)))]
    return tuple(out)


def _draw_new(
    draw: Callable[[], Combo], seen: set[Combo], what: str, accept: Callable[[Combo], bool] = lambda combo: True
) -> Combo:
    """Call ``draw()`` until it returns a combo not in ``seen`` that passes ``accept``; add it to ``seen``."""
    for _ in range(_MAX_DRAWS_PER_CLASS):
        combo = draw()
        if combo not in seen and accept(combo):
            seen.add(combo)
            return combo
    raise ValueError(f"synthetic: could not draw a new {what}; lower 'classes_per_family' or 'num_classes'")


def _family_combos(
    prototype: Combo,
    size: int,
    double_fraction: float,
    slots: Sequence[tuple[str, str]],
    seen: set[Combo],
    rng: np.random.Generator,
) -> list[Combo]:
    """Prototype, then single-attribute mutants, then two-attribute mutants (``size`` in all)."""
    n_double = math.floor((size - 1) * double_fraction + 0.5)
    n_single = size - 1 - n_double
    single = [_draw_new(lambda: _mutate(prototype, slots, 1, rng), seen, "single mutant") for _ in range(n_single)]
    double = [_draw_new(lambda: _mutate(prototype, slots, 2, rng), seen, "double mutant") for _ in range(n_double)]
    return [prototype, *single, *double]


def _class_name(family: int, n_families: int, prototype: Combo, combo: Combo, slots: Sequence[tuple[str, str]]) -> str:
    """``fam03_proto``, ``fam03_wing-red``, ``fam03_head-square_tail-dots``: family + changes to its prototype.

    Attribute values are unique across attributes, so ``<part>-<value>`` is unambiguous; names are file-name safe.
    """
    width = max(2, len(str(n_families - 1)))
    changes = [f"{slots[i][0]}-{v}" for i, (p, v) in enumerate(zip(prototype, combo)) if p != v]
    return f"fam{family:0{width}d}_" + ("_".join(changes) or "proto")


def build_class_table(cfg: SyntheticConfig) -> pd.DataFrame:
    """The class table of a validated configuration (see :func:`make_class_table`)."""
    rng = np.random.default_rng([cfg.seed, _CLASS_STREAM])
    slots = _slots(cfg.part_names)
    min_distance = math.ceil(len(slots) / 2)  # prototypes differ in at least half their attributes
    half = cfg.num_classes // 2
    sizes = {split: _family_sizes(half, cfg.classes_per_family) for split in ("train", "test")}
    if cfg.pretrain_classes:
        sizes[PRETRAIN_SPLIT] = _family_sizes(cfg.pretrain_classes, cfg.classes_per_family)
    n_families = sum(len(s) for s in sizes.values())
    seen: set[Combo] = set()
    prototypes: list[Combo] = []

    def far_from_prototypes(combo: Combo) -> bool:
        return all(sum(a != b for a, b in zip(combo, p)) >= min_distance for p in prototypes)

    rows: list[dict[str, Any]] = []
    for split, family_sizes in sizes.items():
        for size in family_sizes:
            family = len(prototypes)
            prototype = _draw_new(lambda: _random_combo(slots, rng), seen, "family prototype", far_from_prototypes)
            prototypes.append(prototype)
            for combo in _family_combos(prototype, size, cfg.double_mutation_fraction, slots, seen, rng):
                name = _class_name(family, n_families, prototype, combo, slots)
                rows.append(
                    {
                        "label": len(rows),
                        "class_name": name,
                        "family": family,
                        "split": split,
                        **{f"{part}_{attr}": v for (part, attr), v in zip(slots, combo)},
                    }
                )
    return pd.DataFrame(rows)


def make_class_table(config: Mapping[str, Any]) -> pd.DataFrame:
    """One row per class, without rendering anything.

    Classes are grouped in families: each split half (labels ``0..C/2-1``
    train, the rest test) is cut into families of at most
    ``classes_per_family``; a family is a random prototype (differing from
    every other prototype in at least half of its attributes), its
    single-attribute mutants, then ``double_mutation_fraction`` of two-attribute
    mutants. All classes are distinct attribute combinations. The
    ``pretrain_classes`` follow (labels ``C..C+P-1``, split ``pretrain``, their
    own families).

    Returns:
        DataFrame with columns ``label`` (0..C+P-1), ``class_name``, ``family``
        (int, families never straddle the split), ``split`` and, per part,
        ``<part>_shape``, ``<part>_colour``, ``<part>_texture``.
    """
    return build_class_table(parse_config(config))


def class_parts(row: Mapping[str, Any], part_names: Sequence[str]) -> tuple[Part, ...]:
    """The :class:`Part` tuple of one class-table row."""
    return tuple(Part(p, row[f"{p}_shape"], row[f"{p}_colour"], row[f"{p}_texture"]) for p in part_names)


# ----------------------------------------------------------------------------- output


def encode_png(image: np.ndarray) -> bytes:
    """Encode an (H, W, 3) uint8 RGB array as a PNG with stored (uncompressed) deflate blocks.

    No metadata, filter type 0; the bytes are a function of the pixels only
    (unlike zlib compression, whose output differs between zlib builds).
    """
    height, width, _ = image.shape
    raw = np.zeros((height, 1 + 3 * width), dtype=np.uint8)
    raw[:, 1:] = image.reshape(height, 3 * width)
    data = raw.tobytes()
    blocks = []
    for start in range(0, len(data), 65535):
        block = data[start : start + 65535]
        is_last = start + len(block) == len(data)
        blocks.append(struct.pack("<BHH", is_last, len(block), len(block) ^ 0xFFFF) + block)
    idat = b"\x78\x01" + b"".join(blocks) + struct.pack(">I", zlib.adler32(data))

    def chunk(tag: bytes, payload: bytes) -> bytes:
        return struct.pack(">I", len(payload)) + tag + payload + struct.pack(">I", zlib.crc32(tag + payload))

    header = struct.pack(">IIBBBBB", width, height, 8, 2, 0, 0, 0)
    return b"\x89PNG\r\n\x1a\n" + chunk(b"IHDR", header) + chunk(b"IDAT", idat) + chunk(b"IEND", b"")


def image_rng(seed: int, label: int, index: int) -> np.random.Generator:
    """The random stream of image ``index`` of class ``label`` (independent of all other images)."""
    return np.random.default_rng([seed, _IMAGE_STREAM, label, index])


def class_dir_name(label: int, class_name: str) -> str:
    """Folder of a class under ``images/``."""
    return f"{label:03d}_{class_name}"


def _write_images(classes: pd.DataFrame, cfg: SyntheticConfig, root: Path) -> pd.DataFrame:
    """Render and write every image under ``root``; return manifest rows with paths relative to ``root.parent``."""
    rows = []
    for cls in classes.to_dict("records"):
        folder = class_dir_name(cls["label"], cls["class_name"])
        (root / folder).mkdir(parents=True)
        parts = class_parts(cls, cfg.part_names)
        for index in range(cfg.images_per_class):
            rendered = render_image(parts, cfg.render, image_rng(cfg.seed, cls["label"], index))
            (root / folder / f"{index:03d}.png").write_bytes(encode_png(rendered.image))
            rows.append(
                {
                    "path": f"{IMAGES_DIR}/{folder}/{index:03d}.png",
                    "label": cls["label"],
                    "class_name": cls["class_name"],
                    "split": cls["split"],
                    "bbox": format_bbox(rendered.box),
                }
            )
    return pd.DataFrame(rows)


def _write_csv_atomic(frame: pd.DataFrame, path: Path) -> None:
    with atomic_output(path) as tmp:
        frame.to_csv(tmp, index=False, lineterminator="\n")


def prepare(config: Mapping[str, Any], out_dir: Path) -> Path:
    """Generate the dataset into ``out_dir`` and return the path of its manifest; a rerun gives
    byte-identical files.

    ``out_dir`` is a new folder: :func:`dmlbench.data.registry.prepare_dataset` builds the dataset
    beside its place and swaps it in when complete, so an interrupted run leaves the old dataset whole
    and files of an earlier run (another configuration) do not survive.
    """
    cfg = parse_config(config)
    classes = build_class_table(cfg)
    out_dir = Path(out_dir)
    manifest = _write_images(classes, cfg, out_dir / IMAGES_DIR)
    _write_csv_atomic(classes, out_dir / CLASSES_FILE)
    pretraining = manifest["split"] == PRETRAIN_SPLIT
    if pretraining.any():
        write_manifest(pretrain_splits(manifest[pretraining], classes), out_dir / PRETRAIN_MANIFEST_FILE)
    return write_manifest(manifest[~pretraining], out_dir / MANIFEST_FILE)


def pretrain_splits(rows: pd.DataFrame, classes: pd.DataFrame) -> pd.DataFrame:
    """The pretraining rows with ``split`` train, or test for every :data:`PRETRAIN_TEST_EVERY`-th family.

    Args:
        rows: manifest rows of the pretraining classes (split ``pretrain``).
        classes: the class table (its ``family`` column).
    """
    families = classes.set_index("label")["family"]
    first = families[classes.loc[classes["split"] == PRETRAIN_SPLIT, "label"]].min()
    held_out = (rows["label"].map(families) - first) % PRETRAIN_TEST_EVERY == PRETRAIN_TEST_EVERY - 1
    return rows.assign(split=np.where(held_out, "test", "train"))
