"""Write a compact copy of CUB-200-2011 (official layout) for a machine that receives only a few MiB.

A GPU machine lent for a session gets the checkout and at most 64 MiB of carried files; the
development copy of CUB (160 px shorter side, JPEG quality 85) is 128 MiB. This script writes every
image again with its shorter side at ``--short-side`` px (PIL bicubic, as the development copy was
made) and JPEG quality ``--quality``, scales ``bounding_boxes.txt`` by each image's own factor, and
copies the other list files unchanged, so ``dmlbench prepare cub200`` reads the copy as it reads the
official archive. The default, 146 px (the cub_lite test resize; its 128 px crops never need more),
gives about 48 MiB at quality 70 — measured numbers are printed. A copy's pixels differ from the
source's by the re-encoding: numbers from it are comparable with each other, and within ~1–2 R@1
points with the development copy's (docs/results.md).

    python benchmarks/compact_copy.py --root /path/to/CUB_200_2011 --out .gpudata/CUB_200_2011

``--every-nth-class N`` keeps classes 1, 1 + N, 1 + 2N, … only (a copy for throughput checks,
whose numbers are not CUB's). ``--out`` must not exist or be empty; it is written whole into a
temporary folder beside it and renamed into place, so an interrupted copy leaves nothing that
looks finished.
"""

from __future__ import annotations

import argparse
import shutil
import tempfile
from pathlib import Path

from PIL import Image

#: The list files of the official layout copied as they are (``bounding_boxes.txt`` is rescaled).
LIST_FILES = ("images.txt", "classes.txt", "image_class_labels.txt", "train_test_split.txt")


def scaled_size(width: int, height: int, short_side: int) -> tuple[int, int]:
    """(width, height) with the shorter side at ``short_side`` px, aspect kept (never enlarged).

    >>> scaled_size(200, 160, 146), scaled_size(100, 300, 146), scaled_size(120, 100, 146)
    ((182, 146), (146, 438), (120, 100))
    """
    short = min(width, height)
    if short <= short_side:
        return width, height
    factor = short_side / short
    return round(width * factor), round(height * factor)


def kept_image_ids(root: Path, every_nth_class: int) -> set[str]:
    """Ids of the images whose class id c has (c - 1) divisible by ``every_nth_class``."""
    kept = set()
    for line in (root / "image_class_labels.txt").read_text().splitlines():
        if line.strip():
            image_id, class_id = line.split()
            if (int(class_id) - 1) % every_nth_class == 0:
                kept.add(image_id)
    return kept


def filtered_lines(path: Path, kept: set[str], column: int = 0) -> str:
    """The lines of a list file whose ``column``-th field is a kept id (all lines of ``classes.txt``)."""
    return "".join(
        line + "\n" for line in path.read_text().splitlines() if line.strip() and line.split()[column] in kept
    )


def compact_copy(root: Path, out: Path, short_side: int, quality: int, every_nth_class: int = 1) -> dict[str, float]:
    """Write the copy; return its image count, its size (MiB) and the source's size (MiB)."""
    if out.exists() and any(out.iterdir()):
        raise SystemExit(f"--out {out} exists and is not empty: choose a new folder or remove it")
    missing = [name for name in (*LIST_FILES, "bounding_boxes.txt") if not (root / name).is_file()]
    if missing:
        raise SystemExit(f"--root {root} is not an extracted CUB_200_2011 folder: no {', '.join(missing)}")
    out.parent.mkdir(parents=True, exist_ok=True)
    source_bytes = written_bytes = 0
    with tempfile.TemporaryDirectory(dir=out.parent, prefix=f".{out.name}.tmp") as tmp:
        staging = Path(tmp)
        kept = kept_image_ids(root, every_nth_class)
        for name in LIST_FILES:
            if name == "classes.txt":
                shutil.copy2(root / name, staging / name)
            else:
                (staging / name).write_text(filtered_lines(root / name, kept))
        paths = dict(line.split(maxsplit=1) for line in (staging / "images.txt").read_text().splitlines() if line)
        factors: dict[str, float] = {}
        for image_id, relative in paths.items():
            relative = relative.strip()
            source = root / "images" / relative
            target = staging / "images" / relative
            target.parent.mkdir(parents=True, exist_ok=True)
            with Image.open(source) as image:
                size = scaled_size(*image.size, short_side)
                factors[image_id] = size[0] / image.size[0]
                image.convert("RGB" if image.mode != "L" else "L").resize(size, Image.BICUBIC).save(
                    target, "JPEG", quality=quality
                )
            source_bytes += source.stat().st_size
            written_bytes += target.stat().st_size
        boxes = []
        for line in (root / "bounding_boxes.txt").read_text().splitlines():
            if line.strip():
                image_id, *values = line.split()
                if image_id not in kept:
                    continue
                scaled = (float(v) * factors[image_id] for v in values)
                boxes.append(" ".join([image_id, *(f"{v:.1f}" for v in scaled)]))
        (staging / "bounding_boxes.txt").write_text("\n".join(boxes) + "\n")
        if out.exists():
            out.rmdir()
        staging.rename(out)
        Path(tmp).mkdir()  # TemporaryDirectory removes its (now renamed) folder on exit
    return {"images": float(len(paths)), "copy_MiB": written_bytes / 2**20, "source_MiB": source_bytes / 2**20}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--root", type=Path, required=True, help="an extracted CUB_200_2011 folder")
    parser.add_argument("--out", type=Path, required=True, help="the copy's folder (new or empty)")
    parser.add_argument("--short-side", type=int, default=146, help="shorter side of every image (px)")
    parser.add_argument("--quality", type=int, default=70, help="JPEG quality, 1-95")
    parser.add_argument("--every-nth-class", type=int, default=1, help="keep every N-th class only")
    args = parser.parse_args()
    numbers = compact_copy(args.root, args.out, args.short_side, args.quality, args.every_nth_class)
    print(
        f"{numbers['images']:.0f} images: {numbers['copy_MiB']:.1f} MiB "
        f"(source {numbers['source_MiB']:.1f} MiB) in {args.out}"
    )


if __name__ == "__main__":
    main()
