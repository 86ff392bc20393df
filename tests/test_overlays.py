"""The shipped overlays build every table1 model: their cut points name stages of their backbones."""

from __future__ import annotations

import pytest
import torch

from dmlbench.methods import build_recipe
from dmlbench.params import load_config
from dmlbench.report.claims import claim_methods

from conftest import REPO

from dmlbench.config import resolve_run


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
        dim = (
            model.backbone.out_channels["pool"]
            if run["method_config"]["recipe"] == "reference"
            else run["training"]["embedding_dim"]
        )
        assert embeddings.shape[0] == 2 and slices[-1][1] == embeddings.shape[1] <= dim
        for start, stop in slices:
            norms = embeddings[:, start:stop].norm(dim=1)
            torch.testing.assert_close(norms, torch.ones(2), msg=f"{overlay}: {method} [{start}, {stop})")


def test_every_claim_model_builds_under_cub_claims():
    """The claims on real CUB train their methods (skipped claims included: ``claims.skip: []`` runs
    them) on EfficientNet-Lite0: a variant whose cut points name small_cnn's stages (e.g. DIABLO's
    post-attention ablation, ``stage3``/``stage4``) must be given Lite0's stages by the overlay."""
    config = load_config(
        [
            REPO / "params.yaml",
            *(REPO / "workflow" / "overlays" / f"{name}.yaml" for name in ("cub_lite", "cub_claims")),
        ]
    )
    dataset = config["claims"]["dataset"]
    for method in claim_methods(config):
        run = resolve_run(config, dataset, method, 0)
        run["training"]["backbone"]["pretrained"] = None
        build_recipe(run).build_model()


#: training settings that make cub_lite's table1 a like-for-like comparison: a method's own entry in
#: params.yaml wins over an overlay's shared ``training``, so an entry written for the embedded default
#: (e.g. mpn's BatchNorm trained at one rate) would silently change the protocol for that method alone.
SHARED_PROTOCOL = [
    ("epochs",),
    ("embedding_dim",),
    ("image",),
    ("sampler",),
    ("schedule",),
    ("val_fraction",),
    ("backbone", "name"),
    ("backbone", "pretrained"),
    ("backbone", "freeze_bn"),
    ("backbone", "frozen_through"),
    ("backbone", "pooling"),
    ("optimizer", "lr"),
    ("optimizer", "head_lr_multiplier"),
]


def test_cub_lite_trains_every_table1_method_under_the_same_protocol():
    """Optimiser family, weight decay and the loss's own rate may differ per method; the rest may not."""
    config = load_config([REPO / "params.yaml", REPO / "workflow" / "overlays" / "cub_lite.yaml"])
    trained = {}
    for method in config["tables"]["table1"]["methods"]:
        training = resolve_run(config, "cub200", method, 0)["training"]
        if training["epochs"] > 0:
            trained[method] = training
    reference = trained["margin"]
    for method, training in trained.items():
        for path in SHARED_PROTOCOL:
            value, expected = training, reference
            for key in path:
                value, expected = value.get(key), expected.get(key)
            assert value == expected, (
                f"cub_lite: {method}'s training.{'.'.join(path)} = {value!r}, margin's {expected!r}"
            )


def test_the_test_selected_overlay_logs_test_recall_and_still_selects_on_validation():
    """``test_selected.yaml`` adds the papers' test-selected R@1 next to table1's columns; the runs it
    changes keep the clean protocol's checkpoint (``selection: val``)."""
    config = load_config(
        [
            REPO / "params.yaml",
            *(REPO / "workflow" / "overlays" / f"{name}.yaml" for name in ("cub_lite", "test_selected")),
        ]
    )
    assert "test_selected/R@1" in config["tables"]["table1"]["metrics"]
    for method in config["tables"]["table1"]["methods"]:
        training = resolve_run(config, "cub200", method, 0)["training"]
        assert training["log_test_recall"] is True and training["selection"] == "val", method


@pytest.mark.parametrize(
    ("method", "reference", "changed"),
    [
        ("norm_softmax_mpnloss", "norm_softmax", {"loss.temperature", "loss.label_smoothing"}),
        (
            "norm_softmax_mpnopt",
            "norm_softmax_mpnloss",
            {"optimizer.name", "optimizer.weight_decay", "optimizer.decoupled_weight_decay"},
        ),
        (
            "mpn_ce_only_adam",
            "mpn_ce_only",
            {"optimizer.name", "optimizer.weight_decay", "optimizer.decoupled_weight_decay"},
        ),
        ("mpn_adam", "mpn", {"optimizer.name", "optimizer.weight_decay", "optimizer.decoupled_weight_decay"}),
    ],
)
def test_each_mpn_diagnosis_entry_changes_one_thing_of_its_reference(method: str, reference: str, changed: set) -> None:
    """Each diagnostic run (docs/results.md, "Why MPN trails normalised softmax") differs from the run it
    is read against in the named settings only, under the overlay it is run with."""
    from dmlbench.tuning.space import flat_values

    overlays = REPO / "workflow" / "overlays"
    config = load_config([REPO / "params.yaml", overlays / "cub_lite.yaml", overlays / "mpn_diagnosis.yaml"])

    def settings(name: str) -> dict[str, object]:
        run = resolve_run(config, "cub200", name, 0)
        return flat_values({"loss": run["method_config"]["loss"], **run["training"]})

    ours, theirs = settings(method), settings(reference)
    differing = {key for key in ours.keys() | theirs.keys() if ours.get(key) != theirs.get(key)}
    assert differing == changed
