"""Entries that change only test-time behaviour (``checkpoint_of: <method>``) re-embed that method's checkpoint:
config validation, the recipes' test-time options, and the embed command."""

from __future__ import annotations

import dataclasses
from pathlib import Path

import numpy as np
import pytest
import torch
import yaml

from dmlbench.cli import main
from dmlbench.config import ConfigError, checkpoint_source, deep_merge, has_training, resolve_run
from dmlbench.methods import RECIPES, build_recipe, recipe_class
from dmlbench.params import load_config, validate_config
from dmlbench.training.embed import embed_run

from conftest import REPO

VARIANTS = ("mpn_test_rknn", "mpn_test_kmeans", "mpn_test_nn")
#: shrinks every synthetic run to seconds; the MPN's reciprocal-kNN test batches fit the tiny test split.
TINY_OVERLAY = {
    "training": {
        "device": "cpu",
        "amp": False,
        "embedding_dim": 8,
        "eval_batch_size": 16,
        "val_fraction": 0.34,
        "backbone": {"width": 4, "pretrained": None},
        "image": {"resize": 24, "test_crop": 20, "train_crop": 20},
        "sampler": {"classes_per_batch": 3, "images_per_class": 3},
    },
    "methods": {"mpn": {"options": {"rknn_k": 3, "test_batch_size": 4}}},
}


def with_methods(params: dict, **methods: dict) -> dict:
    """params with extra (or overridden) ``methods`` entries."""
    return deep_merge(params, {"methods": methods})


# --- params.yaml ----------------------------------------------------------------------------
def test_mpn_test_time_rows_reuse_the_mpn_checkpoint(params):
    for variant in VARIANTS:
        assert checkpoint_source(params, variant) == "mpn"
        assert not has_training(params, variant)
    assert has_training(params, "mpn") and checkpoint_source(params, "mpn") is None
    assert not has_training(params, "mpn_ens2")  # an ensemble is not trained either


def test_checkpoint_of_is_not_inherited(params):
    """A method derived from a re-embedding entry states its own ``checkpoint_of`` or trains itself."""
    config = with_methods(params, mpn_test_h4={"base": "mpn_test_rknn", "options": {"heads": 4}})
    validate_config(config)
    assert has_training(config, "mpn_test_h4")
    assert "checkpoint_of" not in resolve_run(config, "synthetic", "mpn_test_h4", 0)["method_config"]


# --- validation -----------------------------------------------------------------------------
@pytest.mark.parametrize(
    ("change", "key"),
    [
        ({"options": {"heads": 4}}, "options.heads"),
        ({"loss": {"aux_weight": 0.0}}, "loss.aux_weight"),
        ({"training": {"epochs": 3}}, "training.epochs"),
        ({"per_dataset": {"synthetic": {"options": {"steps": 2}}}}, "options.steps"),
    ],
)
def test_a_variant_that_changes_training_is_rejected_naming_the_key(params, change, key):
    config = with_methods(params, mpn_variant={"base": "mpn", "checkpoint_of": "mpn", **change})
    with pytest.raises(ConfigError, match=rf"methods\.mpn_variant\.checkpoint_of.*{key}.*checkpoint_of"):
        validate_config(config)


def test_a_variant_may_change_test_time_options_and_label(params):
    test_time = {
        "test_embedding": "mpn",
        "test_batches": "kmeans",
        "test_seed": 3,
        "test_chunk_size": 2,
        "test_chunks_per_batch": 2,
        "kmeans_images_per_cluster": 3.0,
        "rknn_k": 5,
        "rknn_alpha": 0.5,
    }
    validate_config(
        with_methods(params, mpn_variant={"base": "mpn", "checkpoint_of": "mpn", "label": "x", "options": test_time})
    )


@pytest.mark.parametrize(
    ("entry", "message"),
    [
        ({"base": "mpn", "checkpoint_of": "nothing"}, r"'nothing' is not defined"),
        ({"base": "mpn", "checkpoint_of": "mpn_test_rknn"}, r"'mpn_test_rknn' has no checkpoint of its own"),
        ({"base": "mpn", "checkpoint_of": "mpn_ens2"}, r"'mpn_ens2' has no checkpoint of its own"),
        ({"base": "triplet", "checkpoint_of": "mpn"}, r"\['recipe'"),
        ({"base": "mpn", "checkpoint_of": "mpn_variant"}, r"its own checkpoint"),
    ],
)
def test_checkpoint_of_must_name_another_trained_method(params, entry, message):
    with pytest.raises(ConfigError, match=message):
        validate_config(with_methods(params, mpn_variant=entry))


@pytest.mark.parametrize("name", sorted(RECIPES))
def test_declared_test_time_options_are_options_of_the_recipe(name):
    cls = recipe_class(name)
    fields = {f.name for f in dataclasses.fields(cls.options_class)} if cls.options_class else set()
    assert cls.TEST_TIME_OPTIONS <= fields


# --- the embed command ----------------------------------------------------------------------
@pytest.fixture
def tiny_config_files(tmp_path: Path) -> list[str]:
    overlay = tmp_path / "tiny.yaml"
    overlay.write_text(yaml.safe_dump(TINY_OVERLAY))
    return [str(REPO / "params.yaml"), str(overlay)]


def save_untrained_checkpoint(run: dict, path: Path) -> Path:
    """A checkpoint of the run's freshly initialised model (what embed reads: run, model, summary)."""
    torch.manual_seed(0)
    recipe = build_recipe(run)
    model = recipe.build_model()
    path.parent.mkdir(parents=True)
    torch.save({"run": run, "model": model.state_dict(), "summary": recipe.summary()}, path)
    return path


def embed_args(run_dir: Path, method: str, config_files: list[str], manifest: Path, out: Path) -> list[str]:
    configs = [arg for path in config_files for arg in ("--config", path)]
    return ["embed", str(run_dir), "--method", method, *configs, "--manifest", str(manifest), "--out", str(out)]


def test_embed_reembeds_the_base_checkpoint_with_the_variants_test_time_options(
    tiny_config_files, tiny_manifest, tmp_path
):
    config = load_config(tiny_config_files)
    base = save_untrained_checkpoint(resolve_run(config, "synthetic", "mpn", 0), tmp_path / "mpn" / "checkpoint.pt")
    variant_npz = tmp_path / "variant.npz"
    assert main(embed_args(base.parent, "mpn_test_rknn", tiny_config_files, tiny_manifest, variant_npz)) == 0
    variant = np.load(variant_npz)
    backbone = np.load(embed_run(base, tiny_manifest, tmp_path / "backbone.npz"))
    by_hand = torch.load(base, weights_only=True)
    by_hand["run"] = resolve_run(config, "synthetic", "mpn_test_rknn", 0)
    torch.save(by_hand, tmp_path / "by_hand.pt")
    expected = np.load(embed_run(tmp_path / "by_hand.pt", tiny_manifest, tmp_path / "by_hand.npz"))
    np.testing.assert_array_equal(variant["embeddings"], expected["embeddings"])
    assert not np.allclose(variant["embeddings"], backbone["embeddings"])  # the MPN refined them
    np.testing.assert_array_equal(variant["stat_values"], backbone["stat_values"])  # the base's training summary


@pytest.mark.parametrize(("method", "key"), [("mpn_l1_h4", "options.heads"), ("triplet", "recipe")])
def test_embed_refuses_a_method_that_trains_differently(
    tiny_config_files, tiny_manifest, tmp_path, capsys, method, key
):
    config = load_config(tiny_config_files)
    base = save_untrained_checkpoint(resolve_run(config, "synthetic", "mpn", 0), tmp_path / "mpn" / "checkpoint.pt")
    assert main(embed_args(base.parent, method, tiny_config_files, tiny_manifest, tmp_path / "x.npz")) == 2
    assert key in capsys.readouterr().err and not (tmp_path / "x.npz").exists()
