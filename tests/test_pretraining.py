"""The pretraining stage and the reference rows: disjoint pretraining classes, checksummed weights that
runs load, and untrained/frozen rows that embed the pooled backbone features."""

from __future__ import annotations

import copy
import os
from pathlib import Path

import numpy as np
import pandas as pd
import pytest
import torch
import torch.nn.functional as F

from conftest import tiny_run, write_tiny_dataset
from dmlbench.config import ConfigError
from dmlbench.data.synthetic import make_class_table, pretrain_splits
from dmlbench.methods import build_recipe
from dmlbench.models.backbones import build_backbone
from dmlbench.models.backbones.weights import PretrainedWeightsError, sha256_sidecar
from dmlbench.params import validate_config
from dmlbench.training.checkpoint import load_checkpoint
from dmlbench.training.pretrain import backbone_state, pretrain_backbone
from dmlbench.training.trainer import train_run

ATTRIBUTE_COLUMNS = [f"{p}_{a}" for p in ("head", "wing", "tail", "crest") for a in ("shape", "colour", "texture")]


# --- the pretraining classes ---------------------------------------------------------------------
def test_pretraining_classes_are_new_combinations_and_leave_the_benchmark_unchanged():
    plain = make_class_table({"num_classes": 40})
    table = make_class_table({"num_classes": 40, "pretrain_classes": 50})
    pd.testing.assert_frame_equal(table.iloc[:40].reset_index(drop=True), plain)
    pretrain = table[table["split"] == "pretrain"]
    assert list(pretrain["label"]) == list(range(40, 90))
    assert set(pretrain["family"]).isdisjoint(plain["family"])
    benchmark = {tuple(row) for row in plain[ATTRIBUTE_COLUMNS].itertuples(index=False)}
    assert not benchmark & {tuple(row) for row in pretrain[ATTRIBUTE_COLUMNS].itertuples(index=False)}


def test_every_fifth_pretraining_family_is_held_out_as_test():
    table = make_class_table({"num_classes": 20, "pretrain_classes": 100})
    rows = table.loc[table["split"] == "pretrain", ["label", "class_name"]].assign(path="x", split="pretrain")
    splits = pretrain_splits(rows, table).merge(table[["label", "family"]], on="label")
    first = splits["family"].min()
    test_families = sorted(set(splits.loc[splits["split"] == "test", "family"] - first))
    assert test_families == [4, 9]
    assert (splits.groupby("family")["split"].nunique() == 1).all()  # families never straddle


def test_too_few_pretraining_families_is_an_error_naming_the_key():
    with pytest.raises(ValueError, match="pretrain_classes.*41"):
        make_class_table({"num_classes": 20, "pretrain_classes": 30})


# --- weights: pretrained: synthetic ------------------------------------------------------------------
@pytest.fixture
def in_tmp(tmp_path: Path):
    cwd = os.getcwd()
    os.chdir(tmp_path)
    yield tmp_path
    os.chdir(cwd)


def write_stage_weights(root: Path, state: dict[str, torch.Tensor]) -> Path:
    from dmlbench.models.backbones.weights import sha256_of

    path = root / "data" / "pretrained" / "synthetic" / "small_cnn.pt"
    path.parent.mkdir(parents=True)
    torch.save(state, path)
    sha256_sidecar(path).write_text(sha256_of(path) + "\n")
    return path


def test_pretrained_synthetic_loads_the_stage_file_and_checks_its_checksum(in_tmp):
    source = build_backbone({"name": "small_cnn", "width": 4})
    path = write_stage_weights(in_tmp, source.body.state_dict())
    loaded = build_backbone({"name": "small_cnn", "width": 4, "pretrained": "synthetic"})
    for key, value in source.body.state_dict().items():
        assert torch.equal(loaded.body.state_dict()[key], value), key
    sha256_sidecar(path).write_text("0" * 64 + "\n")
    with pytest.raises(PretrainedWeightsError, match="sha256 mismatch"):
        build_backbone({"name": "small_cnn", "width": 4, "pretrained": "synthetic"})
    with pytest.raises(PretrainedWeightsError, match="wrong shape"):  # saved at another width
        sha256_sidecar(path).unlink()
        path.unlink()
        path.parent.rmdir()
        write_stage_weights(in_tmp, build_backbone({"name": "small_cnn", "width": 8}).body.state_dict())
        build_backbone({"name": "small_cnn", "width": 4, "pretrained": "synthetic"})


def test_missing_stage_weights_name_the_file_and_the_command(in_tmp):
    with pytest.raises(PretrainedWeightsError, match=r"data/pretrained/synthetic/small_cnn\.pt.*snakemake"):
        build_backbone({"name": "small_cnn", "pretrained": "synthetic"})


def test_backbone_state_keeps_only_the_body():
    state = {
        "backbone.body.stem.0.weight": torch.ones(1),
        "backbone.normalize.mean": torch.ones(3),
        "head.linear.weight": torch.ones(1),
    }
    assert list(backbone_state(state)) == ["stem.0.weight"]
    with pytest.raises(ValueError, match="backbone.body"):
        backbone_state({"head.linear.weight": torch.ones(1)})


# --- the stage end to end, on a tiny dataset ----------------------------------------------------------
def tiny_pretraining_config(params: dict, tmp_path: Path) -> dict:
    config = copy.deepcopy(params)
    run = tiny_run(params, "pretrain_classifier", epochs=2)
    config["training"] = run["training"]
    config["methods"]["pretrain_classifier"].pop("training")
    return config


def test_pretrain_exports_the_selected_backbone_that_a_run_then_starts_from(params, in_tmp):
    prepared = in_tmp / "data" / "prepared" / "synthetic"
    manifest = write_tiny_dataset(prepared, num_classes=12)
    os.replace(manifest, prepared / "pretrain.csv")
    config = tiny_pretraining_config(params, in_tmp)
    weights = pretrain_backbone(config, "synthetic", prepared)
    assert weights == Path("data/pretrained/synthetic/small_cnn.pt")
    trained = load_checkpoint(weights.parent / "small_cnn_run" / "checkpoint.pt")["model"]
    exported = torch.load(weights, weights_only=True)
    assert exported.keys() == backbone_state(trained).keys()
    assert all(torch.equal(exported[k], trained[f"backbone.body.{k}"]) for k in exported)
    start = build_backbone({**config["training"]["backbone"], "pretrained": "synthetic"})
    assert all(torch.equal(start.body.state_dict()[k], v) for k, v in exported.items())


def test_pretraining_a_pretrained_backbone_is_refused(params):
    config = copy.deepcopy(params)
    config["methods"]["pretrain_classifier"]["training"]["backbone"]["pretrained"] = "synthetic"
    with pytest.raises(ConfigError, match="pretrained: null"):
        pretrain_backbone(config, "synthetic", Path("unused"))


def test_a_missing_pretraining_manifest_says_how_to_make_it(params, tmp_path):
    with pytest.raises(ConfigError, match="pretrain_classes"):
        pretrain_backbone(params, "synthetic", tmp_path)


def test_pretraining_section_must_name_defined_entries(params):
    config = copy.deepcopy(params)
    config["pretraining"]["synthetic"]["method"] = "nope"
    with pytest.raises(ConfigError, match="pretraining.synthetic.method"):
        validate_config(config)


# --- reference rows ----------------------------------------------------------------------------------
def test_reference_row_is_its_initial_network_and_embeds_normalised_pooled_features(params, tiny_manifest, tmp_path):
    from dmlbench.seeding import derive_seed, seed_everything

    run = tiny_run(params, "untrained", epochs=0)
    train_run(run, tiny_manifest, tmp_path / "run", tmp_path / "scratch", progress=False)
    checkpoint = load_checkpoint(tmp_path / "run" / "checkpoint.pt")
    assert checkpoint["selected_epoch"] == 0
    seed_everything(derive_seed(run["seed"], "init"))
    initial = build_recipe(run).build_model().state_dict()
    assert checkpoint["model"].keys() == initial.keys()
    assert all(torch.equal(checkpoint["model"][k], initial[k]) for k in initial)
    model = build_recipe(checkpoint["run"]).build_model()
    model.load_state_dict(checkpoint["model"])
    model.train()  # BatchNorm stays in eval mode: the row is a fixed network
    images = torch.rand(3, 3, 20, 20)
    with torch.no_grad():
        pooled = model.backbone(images)
        np.testing.assert_allclose(model(images).numpy(), F.normalize(pooled, dim=1).numpy(), rtol=1e-6)
        np.testing.assert_allclose(model(images[:1]).numpy(), model(images)[:1].numpy(), rtol=1e-5, atol=1e-6)
    assert pooled.shape == (3, model.backbone.out_channels["pool"])


def test_reference_rows_train_nothing(params):
    run = tiny_run(params, "untrained", epochs=3)
    with pytest.raises(ValueError, match="training.epochs: 0"):
        build_recipe(run)
