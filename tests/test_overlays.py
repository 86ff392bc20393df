"""The shipped overlays build every table1 model: their cut points name stages of their backbones."""

from __future__ import annotations

import pytest
import torch

from dmlbench.config import load_config, resolve_run
from dmlbench.methods import build_recipe

from conftest import REPO


@pytest.mark.parametrize("overlay", ["cub_lite", "paper"])
def test_every_table1_model_builds_and_embeds_on_the_overlay_backbone(overlay: str):
    """Random initial weights (no file needed) and 96 px input; a cut point that names a stage the
    overlay's backbone lacks (e.g. small_cnn's ``stage2`` on EfficientNet-Lite0) fails to build."""
    config = load_config([REPO / "params.yaml", REPO / "workflow" / "overlays" / f"{overlay}.yaml"])
    torch.manual_seed(0)
    images = torch.rand(2, 3, 96, 96)
    for method in config["tables"]["table1"]["methods"]:
        run = resolve_run(config, "cub200", method, 0)
        run["training"]["backbone"]["pretrained"] = None
        model = build_recipe(run).build_model().eval()
        with torch.no_grad():
            embeddings = model(images)
        slices = getattr(model, "learner_slices", None) or [(0, embeddings.shape[1])]
        # reference rows embed the pooled backbone features themselves (C dimensions, no head)
        dim = (model.backbone.out_channels["pool"] if run["method_config"]["recipe"] == "reference"
               else run["training"]["embedding_dim"])
        assert embeddings.shape[0] == 2 and slices[-1][1] == embeddings.shape[1] <= dim
        for start, stop in slices:
            norms = embeddings[:, start:stop].norm(dim=1)
            torch.testing.assert_close(norms, torch.ones(2), msg=f"{overlay}: {method} [{start}, {stop})")
