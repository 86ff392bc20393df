"""Experiment figures (figures.<name>): validation, inputs, rendering from fake runs; metric display in tables."""

from __future__ import annotations

import copy
import json
from pathlib import Path

import numpy as np
import pandas as pd
import pytest
from PIL import Image

from dmlbench.config import ConfigError
from dmlbench.params import validate_config
from dmlbench.report.collect import RunDir
from dmlbench.report.figures import check_figure, figure_inputs, render_figure
from dmlbench.report.figures.retrieval_grid import retrieve
from dmlbench.report.figures.similarity_histogram import pair_similarities, sample_pairs
from dmlbench.report.latex import render_comparison_table
from dmlbench.report.metric_format import metric_format
from dmlbench.report.spec import TableSpec
from dmlbench.report.summary import summarise


def with_figures(params: dict, **figures: dict) -> dict:
    config = copy.deepcopy(params)
    config["seeds"] = [0, 1]
    config["figures"] = figures
    return config


LINE = {
    "kind": "metric_vs_param",
    "dataset": "synthetic",
    "metric": "R@1",
    "x_label": "margin",
    "series": {"Margin": {"margin": 0.2, "contrastive": 1.0}},
}


def write_run(root, method: str, seed: int, r1: float, epochs: int = 3, queries: int = 10) -> None:
    """A run of ``queries`` test queries whose R@1 is ``r1`` (metrics.json and per_query.npz agree), with a log."""
    run = root / "results" / "runs" / "synthetic" / method / f"seed{seed}"
    run.mkdir(parents=True)
    (run / "metrics.json").write_text(json.dumps({"R@1": r1, "NMI": 0.5}))
    hits = round(r1 * queries)
    ranks = np.where(np.arange(queries) < hits, 1, 2)
    np.savez(run / "per_query.npz", row=np.arange(queries), first_hit_rank=ranks)
    pd.DataFrame(
        {
            "epoch": range(1, epochs + 1),
            "loss": [1.0] * epochs,
            "val_R@1": [r1] * epochs,
            "lr": [0.1] * epochs,
            "seconds": [1.0] * epochs,
            "images_per_s": [10.0] * epochs,
        }
    ).to_csv(run / "log.csv", index=False)


def test_inputs_are_the_runs_of_every_seed(params):
    config = with_figures(params, line=LINE)
    assert figure_inputs(config, "line") == [  # R@1 resamples the test queries: their per-query results too
        f"results/runs/synthetic/{m}/seed{s}/{name}"
        for m in ("margin", "contrastive")
        for s in (0, 1)
        for name in ("metrics.json", "per_query.npz")
    ]
    nmi = with_figures(params, line={**LINE, "metric": "NMI"})  # a per-run number: metrics.json alone
    assert figure_inputs(nmi, "line") == [
        f"results/runs/synthetic/{m}/seed{s}/metrics.json" for m in ("margin", "contrastive") for s in (0, 1)
    ]


@pytest.mark.parametrize(
    ("figure", "message"),
    [
        ({**LINE, "kind": "pie"}, "kind = 'pie' is unknown"),
        ({**LINE, "dataset": "mnist"}, "dataset = 'mnist' is not defined"),
        ({**LINE, "series": {"A": {"nope": 1}}}, r"methods \['nope'\] are not defined"),
        ({**LINE, "series": {"A": {"margin": "x"}}}, "x values must be numbers"),
        ({k: v for k, v in LINE.items() if k != "x_label"}, r"missing key\(s\) \['x_label'\]"),
        ({"kind": "attention_maps", "dataset": "synthetic", "method": "margin", "images": 0}, "images must be"),
        ({"kind": "training_curves", "dataset": "synthetic", "methods": [], "columns": ["val_R@1"]}, "names no method"),
        (
            {
                "kind": "training_curves",
                "dataset": "synthetic",
                "methods": ["margin", "mpn_test_rknn"],
                "columns": ["loss"],
            },
            r"methods \['mpn_test_rknn'\] are not trained themselves .* no log.csv",
        ),
        (
            {"kind": "attention_maps", "dataset": "synthetic", "method": "mpn_ens2", "images": 2},
            r"methods \['mpn_ens2'\] are not trained themselves .* no checkpoint.pt",
        ),
    ],
)
def test_bad_figure_specs_name_the_key(params, figure, message):
    with pytest.raises(ConfigError, match=message):
        validate_config(with_figures(params, bad=figure))


def test_metric_vs_param_and_training_curves_render(params, tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    for seed, (a, b) in enumerate([(0.2, 0.4), (0.3, 0.5)]):
        write_run(tmp_path, "margin", seed, a)
        write_run(tmp_path, "contrastive", seed, b)
    curves = {
        "kind": "training_curves",
        "dataset": "synthetic",
        "methods": ["margin", "contrastive"],
        "columns": ["val_R@1", "loss"],
    }
    config = with_figures(params, line=LINE, curves=curves, missing={**curves, "columns": ["train_R@1"]})
    for name in ("line", "curves"):
        out = render_figure(config, name, tmp_path / f"{name}.png")
        assert Image.open(out).size[0] > 300
    with pytest.raises(
        ConfigError,
        match=r"columns names 'train_R@1', but \['margin', 'contrastive'\] do not log "
        r"it.*log_train_recall: true",
    ):
        render_figure(config, "missing", tmp_path / "missing.png")
    config["training"]["log_train_recall"] = True  # asked for now, but the runs on disk were trained without it
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
    arrays = {
        "embeddings": np.hstack([learner, -learner]),
        "labels": labels,
        "learner_slices": np.array([[0, 2], [2, 4]]),
    }
    similarity = pair_similarities(arrays, np.random.default_rng(0))
    assert np.allclose(similarity["positive"], 1.0) and np.allclose(similarity["negative"], 0.0)
    assert np.allclose(similarity["self"], -1.0) and len(similarity["self"]) == 4


def test_non_metric_columns_are_formatted_and_never_bold():
    results = pd.DataFrame(
        [
            ("d", m, 0, metric, value)
            for m, nmi, params_ in (("a", 0.5, 2_000_000), ("b", 0.6, 1_000_000))
            for metric, value in (("NMI", nmi), ("num_parameters", params_), ("self_similarity", 0.25))
        ],
        columns=["dataset", "method", "seed", "metric", "value"],
    )
    spec = TableSpec(["d"], ["a", "b"], {"d": ["NMI", "num_parameters", "self_similarity", "learner0/R@1"]})
    runs = [RunDir("d", m, 0, Path("unused")) for m in ("a", "b")]  # per-run numbers only: no per_query.npz read
    text = render_comparison_table(summarise(results, runs, spec), spec, "caption", "tab:x")
    assert r"a & 50.0 & 2.00 & 0.250 & -- \\" in text
    assert r"b & \textbf{60.0} & 1.00 & 0.250 & -- \\" in text
    assert "NMI & Params (M) & Self-pair sim. & R@1 (learner 0)" in text


def test_metric_format_of_unknown_keys_is_plain():
    assert metric_format("clustering_seconds").text(1.23456) == "1.235"
    assert not metric_format("clustering_seconds").bold_best
    assert metric_format("scale1/R@2").header == "R@2 (scale1)"


def test_check_figure_accepts_the_committed_params(params):
    for name in params.get("figures", {}):
        check_figure(params, name)


def on_circle(degrees: list[float], norms: list[float] | None = None) -> np.ndarray:
    """(N, 2) float32 points at the given angles; cosine ranking orders them by angle difference."""
    radians = np.deg2rad(degrees)
    scale = np.ones(len(degrees)) if norms is None else np.asarray(norms)
    return (np.stack([np.cos(radians), np.sin(radians)], axis=1) * scale[:, None]).astype(np.float32)


def neighbours_by_query(grid) -> dict[int, tuple[list[int], list[bool], int]]:
    return {
        int(q): (n.tolist(), c.tolist(), int(r))
        for q, n, c, r in zip(grid.query_rows, grid.neighbour_rows, grid.correct, grid.first_hit_rank, strict=True)
    }


def test_retrieval_grid_all_vs_all_neighbours_are_the_hand_computed_ones():
    # angles 0, 12, 30, 100, 110, 210 degrees; norms differ, so only the L2-normalised (cosine) order is this one
    x = on_circle([0, 12, 30, 100, 110, 210], norms=[1, 3, 0.5, 2, 1, 4])
    labels = np.array([0, 1, 0, 1, 1, 2])  # row 5 is alone in its class: never a query
    grid = retrieve(x, labels, None, queries=5, k=2, query_seed=0)
    assert neighbours_by_query(grid) == {
        0: ([1, 2], [False, True], 2),
        1: ([0, 2], [False, False], 3),  # first hit (row 3, 88 degrees away) beyond k: exact rank
        2: ([1, 0], [False, True], 2),
        3: ([4, 2], [True, False], 1),
        4: ([3, 2], [True, False], 1),
    }
    assert not (grid.neighbour_rows == grid.query_rows[:, None]).any()
    assert np.array_equal(retrieve(x, labels, None, 5, 2, 0).query_rows, grid.query_rows)  # seeded order
    with pytest.raises(ValueError, match="queries = 6, but only 5 queries"):
        retrieve(x, labels, None, queries=6, k=2, query_seed=0)
    with pytest.raises(ValueError, match="k = 6, but a query is ranked against only 5 items"):
        retrieve(x, labels, None, queries=1, k=6, query_seed=0)


def test_retrieval_grid_searches_the_gallery_only_with_a_split():
    x = on_circle([0, 50, 20, 90, 80, 45, 88])
    labels = np.array([0, 0, 1, 1, 1, 2, 0])
    split = np.array(["query", "gallery", "gallery", "query", "gallery", "query", "query"])
    grid = retrieve(x, labels, split, queries=3, k=2, query_seed=1)
    assert neighbours_by_query(grid) == {  # query 6 (88 degrees) is 2 away from query 3 but not in the gallery
        0: ([2, 1], [False, True], 2),
        3: ([4, 1], [True, False], 1),
        6: ([4, 1], [False, True], 2),
    }
    with pytest.raises(ValueError, match="only 3 items"):
        retrieve(x, labels, split, queries=1, k=4, query_seed=0)


GRID = {"kind": "retrieval_grid", "dataset": "synthetic", "method": "margin", "seeds": [0], "queries": 2, "k": 2}


@pytest.mark.parametrize(
    ("figure", "message"),
    [
        ({**GRID, "k": 0}, r"figures\.bad\.k must be an integer in 1\.\.20, got 0"),
        ({**GRID, "queries": "6"}, r"figures\.bad\.queries must be an integer"),
        ({**GRID, "query_seed": -1}, r"figures\.bad\.query_seed must be an integer"),
        ({**GRID, "seeds": [0, 1]}, r"figures\.bad\.seeds must be a list of one seed"),
        ({**GRID, "querys": 3}, r"figures\.bad: unknown key\(s\) \['querys'\]"),
        ({**GRID, "method": "nope"}, r"figures\.bad\.method: methods \['nope'\] are not defined"),
        ({k: v for k, v in GRID.items() if k != "method"}, r"figures\.bad: missing key\(s\) \['method'\]"),
    ],
)
def test_bad_retrieval_grid_specs_name_the_key(params, figure, message):
    with pytest.raises(ConfigError, match=message):
        validate_config(with_figures(params, bad=figure))


def write_tiny_dataset(root: Path, labels: list[int]) -> None:
    """data/prepared/synthetic: two train rows, then one 8×8 test image per label (a distinct grey level)."""
    prepared = root / "data" / "prepared" / "synthetic"
    (prepared / "images").mkdir(parents=True)
    rows = [(f"images/train{i}.png", 90 + i, "train") for i in range(2)]
    rows += [(f"images/test{i}.png", label, "test") for i, label in enumerate(labels)]
    for i, (path, _, _) in enumerate(rows):
        Image.fromarray(np.full((8, 8, 3), 20 * i, dtype=np.uint8)).save(prepared / path)
    pd.DataFrame(
        [{"path": path, "label": label, "class_name": f"class{label}", "split": split} for path, label, split in rows]
    ).to_csv(prepared / "manifest.csv", index=False)


def test_retrieval_grid_renders_framed_and_byte_identical(params, tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    labels = [0, 1, 0, 1, 1, 2]
    write_tiny_dataset(tmp_path, labels)
    run = tmp_path / "results" / "runs" / "synthetic" / "margin" / "seed0"
    run.mkdir(parents=True)
    np.savez(run / "embeddings.npz", embeddings=on_circle([0, 12, 30, 100, 110, 210]), labels=np.array(labels))
    config = with_figures(params, grid=GRID)
    assert figure_inputs(config, "grid") == [
        str(run.relative_to(tmp_path) / "embeddings.npz"),
        "data/prepared/synthetic",
    ]
    first = render_figure(config, "grid", tmp_path / "a.png").read_bytes()
    assert render_figure(config, "grid", tmp_path / "b.png").read_bytes() == first
    pixels = np.asarray(Image.open(tmp_path / "a.png").convert("RGB")).reshape(-1, 3)
    for colour in ((0x2C, 0xA0, 0x2C), (0xD6, 0x27, 0x28)):  # green and red frames are drawn
        assert (pixels == colour).all(axis=1).sum() > 100
    np.savez(run / "embeddings.npz", embeddings=on_circle([0, 12, 30, 100, 110, 210]), labels=np.array(labels[::-1]))
    with pytest.raises(ValueError, match="do not match"):
        render_figure(config, "grid", tmp_path / "c.png")
