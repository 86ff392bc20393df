"""``attention_maps``: a trained model's attention maps drawn over test images (ABE Fig. 6, DeML Fig. 4, DIABLO).

Spec: ``method`` (key), ``images`` (how many test images; the first image of each of the
first classes in manifest order), optional ``maps`` (which of the recipe's map names, in
order; default all). The first of the figure's ``seeds`` is used. Rows are images; the
first column the image, then one column per map, resized (bilinear) to the image and
blended over it.
"""

from __future__ import annotations

from collections.abc import Mapping
from pathlib import Path
from typing import Any

import numpy as np

from dmlbench.config import ConfigError
from dmlbench.layout import CHECKPOINT_FILE, MANIFEST_FILE, prepared_dir, run_file
from dmlbench.report.plots import _plain, _style_context, _write_png

from .common import check_methods, figure_seeds, method_label, require

CELL_IN = 1.6


def check(config: Mapping[str, Any], spec: Mapping[str, Any], where: str) -> None:
    require(spec, ("method", "images"), where)
    check_methods(config, [spec["method"]], f"{where}.method", trained=CHECKPOINT_FILE)
    if isinstance(spec["images"], bool) or not isinstance(spec["images"], int) or not 1 <= spec["images"] <= 16:
        raise ConfigError(f"{where}.images must be an integer in 1..16, got {spec['images']!r}")


def inputs(config: Mapping[str, Any], spec: Mapping[str, Any]) -> list[str]:
    seed = figure_seeds(config, spec)[0]
    return [run_file(spec["dataset"], spec["method"], seed, CHECKPOINT_FILE), prepared_dir(spec["dataset"]).as_posix()]


def first_of_classes(labels: np.ndarray, count: int) -> list[int]:
    """Row of the first item of each of the first ``count`` classes (in order of appearance).

    >>> first_of_classes(np.array([3, 3, 1, 3, 2]), 2)
    [0, 2]
    """
    _, first_rows = np.unique(labels, return_index=True)
    return sorted(first_rows.tolist())[:count]


def render(config: Mapping[str, Any], spec: Mapping[str, Any], out_png: Path) -> None:
    # here, not at the top: every validation of the parameters imports this module (for check)
    import torch
    import torch.nn.functional as F
    from matplotlib.figure import Figure

    from dmlbench.data.stored_dataset import model_inputs
    from dmlbench.methods import build_recipe
    from dmlbench.training.checkpoint import load_checkpoint
    from dmlbench.training.data import load_run_data

    checkpoint_path, data_dir = inputs(config, spec)
    checkpoint = load_checkpoint(checkpoint_path)
    run = checkpoint["run"]
    recipe = build_recipe(run)
    model = recipe.build_model()
    model.load_state_dict(checkpoint["model"])
    model.eval()
    test = load_run_data(run, Path(data_dir) / MANIFEST_FILE).test
    rows = first_of_classes(test.labels, spec["images"])
    images = model_inputs(test, rows, torch.device("cpu"))
    with torch.no_grad():
        maps = recipe.attention_maps(model, images)
    names = list(spec.get("maps") or maps)
    unknown = [n for n in names if n not in maps]
    if unknown:
        raise ValueError(f"{out_png}: the recipe gives maps {list(maps)}, not {unknown} (figures key 'maps')")
    size = images.shape[-2:]
    with _style_context():
        fig = Figure(figsize=(CELL_IN * (len(names) + 1), CELL_IN * len(rows) + 0.6), layout="constrained")
        axes = fig.subplots(len(rows), len(names) + 1, squeeze=False)
        for r in range(len(rows)):
            picture = images[r].permute(1, 2, 0).clamp(0, 1).numpy()
            axes[r, 0].imshow(picture)
            for c, name in enumerate(names, start=1):
                heat = (
                    F.interpolate(maps[name][r][None, None].float(), size=size, mode="bilinear", align_corners=False)[
                        0, 0
                    ]
                    .clamp(0, 1)
                    .numpy()
                )
                axes[r, c].imshow(picture)
                axes[r, c].imshow(heat, cmap="jet", alpha=0.5, vmin=0, vmax=1)
                if r == 0:
                    axes[r, c].set_title(_plain(name), fontsize=8)
            for ax in axes[r]:
                ax.set_axis_off()
        axes[0, 0].set_title("image", fontsize=8)
        fig.suptitle(_plain(spec.get("title") or f"Attention maps: {method_label(config, spec['method'])}"))
        _write_png(fig, out_png)
