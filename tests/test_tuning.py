"""Equal-budget tuning (dmlbench.tuning): spaces, tuned entries, folds, the study's resume, a tune job's data."""

from __future__ import annotations

import dataclasses
import re
import subprocess
import sys
from pathlib import Path

import numpy as np
import pandas as pd
import pytest
import yaml
from conftest import REPO, copy_workflow, write_tiny_dataset

from dmlbench.config import ConfigError, deep_merge, resolve_run
from dmlbench.data.manifest import read_manifest
from dmlbench.params import load_config, params_sources, validate_config
from dmlbench.settings import TrainingSettings, parse_dataclass
from dmlbench.sweeps import expand_sweeps
from dmlbench.tuning.entries import expand_tuned, tuned_methods
from dmlbench.tuning.folds import class_folds, fold_data, training_rows
from dmlbench.tuning.job import tune
from dmlbench.tuning.space import Range, check_values, parse_range
from dmlbench.tuning.study import (
    STUDY_FILE,
    TrialOutcome,
    TuneSetup,
    best_yaml_text,
    completed_trials,
    open_study,
    requeue_interrupted,
    run_study,
)

TABLE1_TRAINED = [
    "contrastive",
    "triplet",
    "margin",
    "binomial",
    "proxy_nca",
    "norm_softmax",
    "abe8",
    "heads8",
    "mpn",
    "deml",
    "diablo",
    "dnc",
]

#: a tune job shrunk to seconds: 1 epoch of 2 tiny batches, a width-4 CNN from random weights, 8-d embeddings.
TINY_OVERLAY = {
    "training": {
        "epochs": 1,
        "device": "cpu",
        "eval_batch_size": 16,
        "backbone": {"width": 4, "pretrained": None},
        "image": {"resize": 24, "test_crop": 20, "train_crop": 20},
        "sampler": {"classes_per_batch": 3, "images_per_class": 3, "batches_per_epoch": 2},
    },
    "tuning": {"trials": 2, "folds": 2, "startup_trials": 1, "embedding_dim": 8},
}


@pytest.fixture(scope="module")
def params() -> dict:
    return load_config([REPO / "params.yaml"])


def unexpanded() -> dict:
    """params.yaml and its experiments files merged, with the sweeps' points but not yet the tuned entries."""
    merged: dict = {}
    for _, data in params_sources(REPO / "params.yaml"):
        merged = deep_merge(merged, data)
    return expand_sweeps(merged)


def tiny_config(tmp_path: Path) -> dict:
    overlay = tmp_path / "tiny_overlay.yaml"
    overlay.write_text(yaml.safe_dump(TINY_OVERLAY))
    return load_config([REPO / "params.yaml", overlay])


# --- spaces ---------------------------------------------------------------------------------------------


def test_a_range_holds_values_of_its_own_type_within_its_bounds():
    lr = parse_range("training.optimizer.lr", {"type": "float", "low": 1e-4, "high": 1e-2, "log": True}, "x")
    k = parse_range("options.num_clusters", {"type": "categorical", "choices": [2, 4]}, "x")
    n = parse_range("options.steps", {"type": "int", "low": 1, "high": 4}, "x")
    assert [lr.contains(v) for v in (1e-4, 1e-2, 0.5, float("nan"), "0.001", True)] == [
        True,
        True,
        False,
        False,
        False,
        False,
    ]
    assert [k.contains(v) for v in (2, 4, 3, 2.0, True)] == [True, True, False, False, False]
    assert [n.contains(v) for v in (1, 4, 5, 2.0)] == [True, True, False, False]
    assert lr.describe() == "[0.0001, 0.01] log" and k.describe() == "{2, 4}"


@pytest.mark.parametrize(
    ("spec", "message"),
    [
        ({"type": "float", "low": 0.5, "high": 0.5}, "low = 0.5 is not below high = 0.5"),
        ({"type": "float", "low": 0.0, "high": 1.0, "log": True}, "log: true needs low > 0"),
    ],
)
def test_a_malformed_range_is_an_error_naming_its_key(spec, message):
    with pytest.raises(ConfigError, match=f"methods.m.tuning.space.loss.margin: {message}"):
        parse_range("loss.margin", spec, "methods.m.tuning.space.loss.margin")


def test_tuned_values_must_fill_the_space_within_its_ranges():
    space = {"loss.margin": Range("loss.margin", "float", 0.1, 0.5)}
    check_values(space, {"loss.margin": 0.3}, "w")
    for values, message in [
        ({"loss.margin": 0.6}, r"loss.margin = 0.6 lies outside its search range \[0.1, 0.5\]"),
        ({}, r"missing: \['loss.margin'\]"),
        ({"loss.margin": 0.3, "loss.beta": 1.0}, r"outside it: \['loss.beta'\]"),
    ]:
        with pytest.raises(ConfigError, match=message):
            check_values(space, values, "w")


# --- tuned entries and tables ---------------------------------------------------------------------------


def test_table1_gets_a_tuned_twin_with_every_trained_method_at_the_same_embedding_size(params):
    twin = params["tables"]["table1_tuned"]
    assert twin["methods"] == ["untrained", "frozen_pretrained", *(f"{m}_tuned" for m in TABLE1_TRAINED)]
    assert list(tuned_methods(params, "table1")) == TABLE1_TRAINED
    for method in TABLE1_TRAINED:
        training = resolve_run(params, "synthetic", f"{method}_tuned", 0)["training"]
        assert (training["embedding_dim"], training["selection"], training["val_fraction"]) == (64, "last", 0.0)
    assert resolve_run(params, "synthetic", "deml", 0)["training"]["embedding_dim"] == 512  # the paper's row keeps it
    assert "8 trials" in twin["caption"] and "2 class-disjoint folds" in twin["caption"]
    assert "D&C (margin): lr [2e-05, 0.002] log, margin [0.05, 0.5], num_clusters {2, 4, 8}" in twin["caption"]


def test_a_space_is_neither_a_setting_of_the_runs_nor_inherited(params):
    assert "tuning" not in resolve_run(params, "synthetic", "margin", 0)["method_config"]
    config = unexpanded()
    del config["methods"]["heads8"]["tuning"]  # heads8 derives from abe8, whose space tunes L_div
    with pytest.raises(ConfigError, match="methods.heads8 has no tuning.space"):
        expand_tuned(config)


def test_a_space_key_the_run_does_not_have_is_an_error():
    config = unexpanded()
    config["methods"]["margin"]["tuning"]["space"]["loss.margn"] = {"type": "float", "low": 0.1, "high": 0.2}
    with pytest.raises(ConfigError, match=r"methods.margin.tuning.space.loss.margn: the tuned run has no setting"):
        validate_config(expand_tuned(config))


# --- folds ----------------------------------------------------------------------------------------------


def test_folds_are_class_disjoint_cover_the_classes_and_are_seeded():
    classes = np.arange(50, 100)
    folds = class_folds(classes, k=3, seed=0)
    assert sorted(np.concatenate(folds).tolist()) == classes.tolist()
    assert sorted(len(f) for f in folds) == [16, 17, 17]
    assert all(not set(a) & set(b) for i, a in enumerate(folds) for b in folds[i + 1 :])
    assert [f.tolist() for f in class_folds(classes, 3, seed=0)] == [f.tolist() for f in folds]
    assert [f.tolist() for f in class_folds(classes, 3, seed=1)] != [f.tolist() for f in folds]
    with pytest.raises(ValueError, match="at least 8 training classes"):
        class_folds(np.arange(7), k=4, seed=0)


def test_a_folds_run_trains_on_the_other_folds_and_is_scored_on_the_held_out_one(tmp_path: Path, params):
    manifest = write_tiny_dataset(tmp_path / "tiny", num_classes=12)
    rows = training_rows(manifest)
    assert set(rows["split"]) == {"train"} and len(rows) == 36
    folds = class_folds(rows["label"].unique(), k=2, seed=0)
    training = parse_dataclass(TrainingSettings, {**params["training"], "eval_images_per_class": 4}, "training")
    data = fold_data(rows, training, folds, held_out=1)
    assert sorted(data.train_classes.tolist()) == folds[0].tolist()
    assert sorted(set(data.test.labels.tolist())) == folds[1].tolist()
    assert len(data.test.labels) == 4 * len(folds[1]) and set(data.test_split) == {"test"} and data.val is None
    test_paths = set(read_manifest(manifest).query("split == 'test'")["path"])
    assert not test_paths & {*data.train.paths, *data.test.paths}


# --- the study ------------------------------------------------------------------------------------------

#: margin's own search space (params.yaml), 5 trials, the first 2 at random
SETUP = dataclasses.replace(
    TuneSetup.from_config(load_config([REPO / "params.yaml"]), "synthetic", "margin"), trials=5, startup_trials=2
)


def score(values: dict) -> TrialOutcome:
    """A made-up objective (no training): highest near margin 0.2."""
    return TrialOutcome([1 - abs(values["loss.margin"] - 0.2), 1 - abs(values["loss.margin"] - 0.25)])


def evaluated(study) -> list[dict]:
    return [dict(trial.params) for trial in completed_trials(study)]


def test_an_interrupted_study_resumes_to_the_budget_without_redoing_completed_trials(tmp_path: Path):
    uninterrupted = open_study(tmp_path / "a" / STUDY_FILE, "setup")
    run_study(uninterrupted, SETUP, score, report=lambda line: None)
    calls: list[dict] = []

    def killed_at_the_third(values: dict) -> TrialOutcome:
        calls.append(values)
        if len(calls) == 3:
            raise KeyboardInterrupt  # the job is killed while it trains its third trial
        return score(values)

    with pytest.raises(KeyboardInterrupt):
        run_study(open_study(tmp_path / "b" / STUDY_FILE, "setup"), SETUP, killed_at_the_third, lambda line: None)
    resumed = open_study(tmp_path / "b" / STUDY_FILE, "setup")  # a new job: the study from its journal
    assert len(completed_trials(resumed)) == 2 and requeue_interrupted(resumed) == [2]
    calls.clear()
    run_study(resumed, SETUP, lambda values: (calls.append(values), score(values))[1], lambda line: None)
    assert len(calls) == 3 and calls[0] == evaluated(uninterrupted)[2]  # the interrupted values first, once
    assert evaluated(resumed) == evaluated(uninterrupted)  # the same values as a job that was never killed
    assert len(evaluated(resumed)) == SETUP.trials


def test_a_larger_budget_continues_a_study_and_another_setup_starts_afresh(tmp_path: Path):
    journal = tmp_path / STUDY_FILE
    run_study(open_study(journal, "setup"), SETUP, score, lambda line: None)
    more = open_study(journal, "setup")
    run_study(more, dataclasses.replace(SETUP, trials=7), score, lambda line: None)
    assert len(completed_trials(more)) == 7
    lines: list[str] = []
    fresh = open_study(journal, "other setup", report=lines.append)
    assert completed_trials(fresh) == [] and (tmp_path / f"{STUDY_FILE}.stale").is_file() and "afresh" in lines[0]


def test_a_diverged_trial_scores_zero_and_spends_budget():
    assert TrialOutcome([0.4], diverged="loss is nan").value == 0.0
    assert TrialOutcome([0.4, 0.6]).value == pytest.approx(0.5)


def test_best_yaml_is_a_parameter_overlay_that_gives_the_tuned_entry_the_best_values(tmp_path: Path):
    study = open_study(tmp_path / STUDY_FILE, "setup")
    run_study(study, SETUP, score, lambda line: None)
    best = max(completed_trials(study), key=lambda trial: trial.value)
    path = tmp_path / "best.yaml"
    path.write_text(best_yaml_text(SETUP, study))
    run = resolve_run(load_config([REPO / "params.yaml", path]), "synthetic", "margin_tuned", 0)
    assert run["method_config"]["loss"]["margin"] == best.params["loss.margin"]
    assert run["training"]["optimizer"]["lr"] == best.params["training.optimizer.lr"]
    edited = yaml.safe_load(path.read_text())
    edited["methods"]["margin_tuned"]["per_dataset"]["synthetic"]["loss"]["margin"] = 5.0
    path.write_text(yaml.safe_dump(edited))
    with pytest.raises(ConfigError, match="loss.margin = 5.0 lies outside its search range"):
        load_config([REPO / "params.yaml", path])


# --- a tune job -----------------------------------------------------------------------------------------


def test_a_tune_job_never_reads_the_test_split(tmp_path: Path, monkeypatch: pytest.MonkeyPatch):
    manifest = write_tiny_dataset(tmp_path / "tiny", num_classes=12)
    frame = read_manifest(manifest)
    test_paths = set(frame.loc[frame["split"] == "test", "path"])
    for path in test_paths:  # reading a test image now fails
        Path(path).unlink()
    opened: list[str] = []
    import dmlbench.data.dataset as dataset_module

    real_load = dataset_module.load_rgb
    monkeypatch.setattr(dataset_module, "load_rgb", lambda path: (opened.append(str(path)), real_load(path))[1])
    result = tune(
        tiny_config(tmp_path),
        "synthetic",
        "margin",
        manifest,
        tmp_path / "out",
        tmp_path / "scratch",
        report=lambda line: None,
    )
    assert result.completed == 2 and opened and not test_paths & set(opened)
    trials = pd.read_csv(result.trials)
    assert list(trials["state"]) == ["COMPLETE", "COMPLETE"] and trials[["fold0", "fold1"]].notna().all().all()
    assert not any((tmp_path / "scratch").iterdir())  # the trials' checkpoints are gone once scored


def test_a_method_no_tuned_table_tunes_is_refused(params, tmp_path: Path):
    with pytest.raises(ConfigError, match="'abe8_lambda01' is tuned by no table of tuning.tables"):
        tune(params, "synthetic", "abe8_lambda01", tmp_path / "m.csv", tmp_path / "o", tmp_path / "s")


def test_snakemake_plans_a_tune_job_for_every_trained_method_of_table1(tmp_path: Path):
    project = copy_workflow(tmp_path)
    result = subprocess.run(
        [
            sys.executable,
            "-m",
            "snakemake",
            "-n",
            "-p",
            "--forceall",
            "--cores",
            "1",
            "results/tables/table1_tuned.tex",
        ],
        cwd=project,
        capture_output=True,
        text=True,
        timeout=300,
        check=False,
    )
    assert result.returncode == 0, result.stdout[-3000:] + result.stderr[-3000:]
    planned = re.findall(
        r"^rule tune:\n(?:    .*\n)*?    wildcards: dataset=synthetic, method=(\w+)$", result.stdout, flags=re.MULTILINE
    )
    assert sorted(planned) == sorted(TABLE1_TRAINED)
    assert "--config results/tuning/synthetic/margin/best.yaml" in result.stdout  # the tuned runs' overlay
