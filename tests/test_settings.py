"""Typed settings (dmlbench.settings): a run's training and evaluation sections parsed once into frozen
dataclasses whose defaults are the schema's, unknown keys and wrong types refused with the key path."""

from __future__ import annotations

import copy
import dataclasses
import typing
from typing import Any

import numpy as np
import pytest
import torch
from conftest import tiny_run

from dmlbench.config import resolve_run
from dmlbench.methods import build_recipe
from dmlbench.schema import schema
from dmlbench.settings import (
    BackboneSettings,
    EvaluationSettings,
    SettingsError,
    TrainingSettings,
    evaluation_settings,
    parse_dataclass,
    training_settings,
)


def _normalised(value: Any) -> Any:
    """A JSON default as the dataclass holds it (lists become tuples)."""
    return tuple(value) if isinstance(value, list) else value


def _drift(cls: type, properties: dict[str, Any], where: str) -> list[str]:
    """Every difference between the fields of ``cls`` (and its nested settings classes) and the schema's
    ``properties``: a field or key on one side only, a default stated on one side only or with another value."""
    problems = []
    extra = getattr(cls, "EXTRA_KEYS_FIELD", None)
    hints = typing.get_type_hints(cls)
    fields = {f.name: f for f in dataclasses.fields(cls) if f.name != extra}
    problems += [f"{where}.{key}: in the schema, not a field" for key in properties if key not in fields]
    for name, field in fields.items():
        entry = properties.get(name)
        if entry is None:
            problems.append(f"{where}.{name}: a field, not in the schema")
            continue
        if dataclasses.is_dataclass(hints[name]):
            problems += _drift(hints[name], entry["properties"], f"{where}.{name}")
        has_default = field.default is not dataclasses.MISSING
        if has_default != ("default" in entry):
            problems.append(f"{where}.{name}: default stated only in the {'dataclass' if has_default else 'schema'}")
        elif has_default and _normalised(entry["default"]) != field.default:
            problems.append(f"{where}.{name}: dataclass default {field.default!r}, schema {entry['default']!r}")
    return problems


def test_every_default_and_key_is_the_schemas():
    full = schema()
    assert _drift(TrainingSettings, full["$defs"]["training"]["properties"], "training") == []
    assert _drift(EvaluationSettings, full["properties"]["evaluation"]["properties"], "evaluation") == []


def test_the_drift_check_sees_a_changed_default():
    """The check above can fail: a schema default that differs from the field's is reported."""
    properties = copy.deepcopy(schema()["$defs"]["training"]["properties"])
    properties["optimizer"]["properties"]["momentum"]["default"] = 0.5
    del properties["log_test_recall"]["default"]
    assert _drift(TrainingSettings, properties, "training") == [
        "training.optimizer.momentum: dataclass default 0.9, schema 0.5",
        "training.log_test_recall: default stated only in the dataclass",
    ]


def test_every_run_of_the_parameters_parses(params):
    for method in params["methods"]:
        run = resolve_run(params, "synthetic", method, 0)
        settings = training_settings(run)
        assert settings.embedding_dim == run["training"]["embedding_dim"]
        assert settings.backbone.name == run["training"]["backbone"]["name"]
        assert evaluation_settings(run).kmeans.niter == run["evaluation"]["kmeans"]["niter"]


def test_values_are_kept_lists_become_tuples_and_absent_keys_take_the_default(params):
    training = copy.deepcopy(params["training"])
    training["optimizer"] = {"name": "sgd", "lr": 1}
    settings = parse_dataclass(TrainingSettings, training, "training")
    assert settings.optimizer.lr == 1 and isinstance(settings.optimizer.lr, int)  # no float(): same numbers
    assert settings.optimizer.momentum == 0.9 and settings.optimizer.decoupled_weight_decay is None
    assert settings.image.crop_scale == (0.5, 1.0) and settings.schedule.milestones is None
    assert settings.sampler.batches_per_epoch is None and settings.log_test_recall is False


def test_the_backbone_passes_its_other_keys_to_the_builder(params):
    section = {"name": "small_cnn", "width": 4, "pooling": "max", "freeze_bn": True}
    backbone = parse_dataclass(BackboneSettings, section, "training.backbone")
    assert backbone.builder_arguments == (("width", 4), ("pooling", "max"))
    assert backbone.section == {**section, "pretrained": None, "frozen_through": None}


@pytest.mark.parametrize(
    "change, message",
    [
        (
            lambda t: t["optimizer"].update(lrr=0.1),
            r"^training\.optimizer\.lrr is not a setting \(did you mean 'lr'\?\); known: name, lr, weight_decay, ",
        ),
        (
            lambda t: t.update(embeding_dim=8),
            r"^training\.embeding_dim is not a setting \(did you mean 'embedding_dim'",
        ),
        (lambda t: t.pop("embedding_dim"), r"^training\.embedding_dim is not set and has no default: set it"),
        (
            lambda t: t.update(embedding_dim="64"),
            r"^training\.embedding_dim = '64' does not have the expected type int$",
        ),
        (
            lambda t: t["backbone"].update(freeze_bn="yes"),
            r"^training\.backbone\.freeze_bn = 'yes' does not have the expected type bool$",
        ),
        (
            lambda t: t.update(selection="best"),
            r"^training\.selection = 'best' does not have the expected type "
            r"typing\.Literal\['val', 'test', 'last'\]$",
        ),
        (lambda t: t.update(sampler=4), r"^training\.sampler = 4 is not a mapping of settings"),
    ],
)
def test_a_bad_key_is_named_with_its_path(params, change, message):
    training = copy.deepcopy(params["training"])
    change(training)
    with pytest.raises(SettingsError, match=message):
        parse_dataclass(TrainingSettings, training, "training")


def test_a_bad_evaluation_value_names_the_key(params):
    evaluation = {"chunk_size": 64, "kmeans": {"seed": -1, "niter": 10, "nredo": 1}}
    with pytest.raises(SettingsError, match=r"^evaluation\.kmeans: KMeansSettings\.seed must be in \[0, "):
        parse_dataclass(EvaluationSettings, evaluation, "evaluation")


def test_settings_are_frozen(params):
    settings = training_settings(resolve_run(params, "synthetic", "triplet", 0))
    with pytest.raises(dataclasses.FrozenInstanceError):
        settings.embedding_dim = 8  # type: ignore[misc]
    with pytest.raises(dataclasses.FrozenInstanceError):
        settings.backbone.freeze_bn = False  # type: ignore[misc]


def test_the_recipe_reads_its_settings_once_from_the_run(params):
    run = tiny_run(params)
    recipe = build_recipe(run)
    assert recipe.settings == training_settings(run)
    run["training"]["embedding_dim"] = 16  # the mapping changed afterwards: the recipe keeps what it parsed
    assert recipe.build_model().head.linear.out_features == 8


def test_the_trainer_changes_its_batches_per_epoch_for_its_recipe_too(params, tiny_manifest, tmp_path):
    from dmlbench.training.data import load_run_data
    from dmlbench.training.trainer import Trainer

    run = tiny_run(params)
    trainer = Trainer(
        run,
        load_run_data(run, tiny_manifest),
        tmp_path / "out",
        tmp_path / "scratch",
        torch.device("cpu"),
        progress=False,
    )
    labels = np.repeat(np.arange(6), 6)
    assert len(trainer.recipe.build_sampler(labels, torch.Generator().manual_seed(0))) == 2
    trainer.set_batches_per_epoch(5)
    assert trainer.recipe.settings is trainer.settings and trainer.settings.sampler.batches_per_epoch == 5
    assert len(trainer.recipe.build_sampler(labels, torch.Generator().manual_seed(0))) == 5
    assert run["training"]["sampler"]["batches_per_epoch"] == 2  # the run as given, as the checkpoint records it
