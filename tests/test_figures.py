"""Experiment figures (figures.<name>): validation, inputs, rendering from fake runs; metric display in tables."""

from __future__ import annotations

import copy
import json

import numpy as np
import pandas as pd
import pytest
from PIL import Image

from dmlbench.config import ConfigError, validate_config
from dmlbench.report.figures import check_figure, figure_inputs, render_figure
from dmlbench.report.figures.similarity_histogram import pair_similarities, sample_pairs
from dmlbench.report.latex import render_comparison_table
from dmlbench.report.metric_format import metric_format
from dmlbench.report.spec import TableSpec


def with_figures(params: dict, **figures: dict) -> dict:
    config = copy.deepcopy(params)
    config["seeds"] = [0, 1]
    config["figures"] = figures
    return config


LINE = {"kind": "metric_vs_param", "dataset": "synthetic", "metric": "R@1", "x_label": "margin",
        "series": {"Margin": {"margin": 0.2, "contrastive": 1.0}}}


def write_run(root, method: str, seed: int, r1: float, epochs: int = 3) -> None:
    run = root / "results" / "runs" / "synthetic" / method / f"seed{seed}"
    run.mkdir(parents=True)
    (run / "metrics.json").write_text(json.dumps({"R@1": r1, "NMI": 0.5}))
    pd.DataFrame({"epoch": range(1, epochs + 1), "loss": [1.0] * epochs, "val_R@1": [r1] * epochs,
                  "lr": [0.1] * epochs, "seconds": [1.0] * epochs, "images_per_s": [10.0] * epochs,
                  }).to_csv(run / "log.csv", index=False)


def test_inputs_are_the_runs_of_every_seed(params):
    config = with_figures(params, line=LINE)
    assert figure_inputs(config, "line") == [
        f"results/runs/synthetic/{m}/seed{s}/metrics.json" for m in ("margin", "contrastive") for s in (0, 1)]


@pytest.mark.parametrize(("figure", "message"), [
    ({**LINE, "kind": "pie"}, "kind = 'pie' is unknown"),
    ({**LINE, "dataset": "mnist"}, "dataset = 'mnist' is not defined"),
    ({**LINE, "series": {"A": {"nope": 1}}}, r"methods \['nope'\] are not defined"),
    ({**LINE, "series": {"A": {"margin": "x"}}}, "x values must be numbers"),
    ({k: v for k, v in LINE.items() if k != "x_label"}, r"missing key\(s\) \['x_label'\]"),
    ({"kind": "attention_maps", "dataset": "synthetic", "method": "margin", "images": 0}, "images must be"),
    ({"kind": "training_curves", "dataset": "synthetic", "methods": [], "columns": ["val_R@1"]}, "names no method"),
    ({"kind": "training_curves", "dataset": "synthetic", "methods": ["margin", "mpn_test_rknn"], "columns": ["loss"]},
     r"methods \['mpn_test_rknn'\] are not trained themselves .* no log.csv"),
    ({"kind": "attention_maps", "dataset": "synthetic", "method": "mpn_ens2", "images": 2},
     r"methods \['mpn_ens2'\] are not trained themselves .* no checkpoint.pt"),
])
def test_bad_figure_specs_name_the_key(params, figure, message):
    with pytest.raises(ConfigError, match=message):
        validate_config(with_figures(params, bad=figure))


def test_metric_vs_param_and_training_curves_render(params, tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    for seed, (a, b) in enumerate([(0.2, 0.4), (0.3, 0.5)]):
        write_run(tmp_path, "margin", seed, a)
        write_run(tmp_path, "contrastive", seed, b)
    curves = {"kind": "training_curves", "dataset": "synthetic", "methods": ["margin", "contrastive"],
              "columns": ["val_R@1", "loss"]}
    config = with_figures(params, line=LINE, curves=curves, missing={**curves, "columns": ["train_R@1"]})
    for name in ("line", "curves"):
        out = render_figure(config, name, tmp_path / f"{name}.png")
        assert Image.open(out).size[0] > 300
    with pytest.raises(ValueError, match=r"no run logged \['train_R@1'\].*log_train_recall"):
        render_figure(config, "missing", tmp_path / "missing.png")
    assert not (tmp_path / "missing.png").exists()


def test_sample_pairs_are_positive_or_negative_as_asked():
    labels = np.array([5, 1, 5, 2, 1, 5, 3])
    rng = np.random.default_rng(0)
    i, j = sample_pairs(labels, True, 500, rng)
    assert np.all(i != j) and np.all(labels[i] == labels[j])
    assert set(labels[i]) == {1, 5}  # class 2 and 3 have no partner
    i, j = sample_pairs(labels, False, 500, rng)
    assert np.all(labels[i] != labels[j])
    assert set(np.concatenate([i, j])) == set(range(7))  # every item can appear in a negative pair
    with pytest.raises(ValueError, match="no positive pairs"):
        sample_pairs(np.arange(4), True, 3, rng)


def test_pair_similarities_of_a_two_learner_model():
    labels = np.array([0, 0, 1, 1])
    learner = np.array([[1, 0], [1, 0], [0, 1], [0, 1]], dtype=np.float32)  # classes orthogonal
    arrays = {"embeddings": np.hstack([learner, -learner]), "labels": labels,
              "learner_slices": np.array([[0, 2], [2, 4]])}
    similarity = pair_similarities(arrays, np.random.default_rng(0))
    assert np.allclose(similarity["positive"], 1.0) and np.allclose(similarity["negative"], 0.0)
    assert np.allclose(similarity["self"], -1.0) and len(similarity["self"]) == 4


def test_non_metric_columns_are_formatted_and_never_bold():
    results = pd.DataFrame([
        ("d", m, 0, metric, value)
        for m, r1, params_ in (("a", 0.5, 2_000_000), ("b", 0.6, 1_000_000))
        for metric, value in (("R@1", r1), ("num_parameters", params_), ("self_similarity", 0.25))
    ], columns=["dataset", "method", "seed", "metric", "value"])
    spec = TableSpec(["d"], ["a", "b"], {"d": ["R@1", "num_parameters", "self_similarity", "learner0/R@1"]})
    text = render_comparison_table(results, spec, "caption", "tab:x")
    assert r"a & 50.0 & 2.00 & 0.250 & -- \\" in text
    assert r"b & \textbf{60.0} & 1.00 & 0.250 & -- \\" in text
    assert "Params (M) & Self-pair sim. & R@1 (learner 0)" in text


def test_metric_format_of_unknown_keys_is_plain():
    assert metric_format("clustering_seconds").text(1.23456) == "1.235"
    assert not metric_format("clustering_seconds").bold_best
    assert metric_format("scale1/R@2").header == "R@2 (scale1)"


def test_check_figure_accepts_the_committed_params(params):
    for name in params.get("figures", {}):
        check_figure(params, name)
