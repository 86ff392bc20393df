"""Confidence intervals, the paired test and the bold rule of the tables; CSV, Markdown and console text."""

from __future__ import annotations

import json
import math
from pathlib import Path

import numpy as np
import pandas as pd
import pytest

from dmlbench.cli import main
from dmlbench.report import (
    CELL_COLUMNS,
    ReportInputError,
    RunDir,
    TableSpec,
    caption_text,
    collect_runs,
    read_cells_csv,
    render_markdown,
    render_text,
    summarise,
)
from dmlbench.report.significance import ALPHA, bootstrap_means, percentile_interval, worse_p_value
from dmlbench.report.summary import write_cells_csv

# ------------------------------------------------------------------ bootstrap


def test_constant_values_have_a_point_interval() -> None:
    low, high = percentile_interval(bootstrap_means(np.full((3, 20, 1), 0.3)))
    assert low[0] == pytest.approx(0.3) and high[0] == pytest.approx(0.3)


def test_seed_level_interval_of_two_seeds_is_hand_computed() -> None:
    """Seeds whose queries all score 0.2 and 0.8: replicate means are 0.2, 0.5, 0.8 with probabilities
    1/4, 1/2, 1/4, so the 2.5 % and 97.5 % quantiles are 0.2 and 0.8 and the median 0.5."""
    replicates = bootstrap_means(np.array([[0.2] * 30, [0.8] * 30])[:, :, None])
    low, high = percentile_interval(replicates)
    assert (low[0], high[0]) == pytest.approx((0.2, 0.8))
    assert np.median(replicates) == pytest.approx(0.5)
    assert 0.4 < np.mean(np.isclose(replicates, 0.5)) < 0.6


def test_query_interval_of_one_seed_matches_the_binomial_width() -> None:
    """One seed, 400 queries, half of them hits: the 95 % half-width is about 1.96 · √(0.25 / 400) = 0.049."""
    hits = np.tile([1.0, 0.0], 200)[None, :, None]
    low, high = percentile_interval(bootstrap_means(hits))
    assert low[0] < 0.5 < high[0]
    assert 0.042 < (high[0] - low[0]) / 2 < 0.056


def test_draws_depend_only_on_the_shape() -> None:
    """Same shape → same resampled seeds and queries: deterministic, and paired between two rows."""
    values = np.random.default_rng(3).random((3, 40, 2))
    first = bootstrap_means(values)
    assert np.array_equal(first, bootstrap_means(values))
    assert np.allclose(bootstrap_means(values + 0.1) - first, 0.1)


def test_paired_test_separates_a_clearly_better_row_and_not_identical_ones() -> None:
    better = np.zeros((3, 100, 1))
    better[:, :90] = 1.0  # 90 % hits
    worse = np.zeros((3, 100, 1))
    worse[:, :50] = 1.0  # 50 % hits, on a subset of the same queries
    best, other = bootstrap_means(better)[:, 0], bootstrap_means(worse)[:, 0]
    assert worse_p_value(best, other) < ALPHA
    assert worse_p_value(best, best.copy()) == 1.0


# ------------------------------------------------------------------ cells from runs


def make_run(root: Path, method: str, seed: int, ranks: list[int], nmi: float, per_query: bool = True) -> RunDir:
    """A run on 'syn' with the given first-hit ranks (metrics.json agrees with them)."""
    path = root / "syn" / method / f"seed{seed}"
    path.mkdir(parents=True)
    ranks_ = np.array(ranks)
    metrics = {"R@1": float(np.mean(ranks_ <= 1)), "NMI": nmi}
    (path / "metrics.json").write_text(json.dumps(metrics))
    if per_query:
        np.savez(path / "per_query.npz", row=np.arange(len(ranks)), first_hit_rank=ranks_)
    return RunDir.from_path(path)


SPEC = TableSpec(datasets=["syn"], methods=["best", "close", "worse"], metrics={"syn": ["R@1", "NMI"]})


def test_bold_marks_the_best_and_rows_not_significantly_worse(tmp_path: Path) -> None:
    """100 queries, one seed: 'close' misses one of best's 60 hits (p ≈ (1 − 1/100)^100 ≈ 0.37: bold),
    'worse' hits 30 of them (p ≈ 0: not bold). NMI of one seed has no interval: only the best is bold."""
    best = [1] * 60 + [2] * 40
    runs = [
        make_run(tmp_path, "best", 0, best, 0.5),
        make_run(tmp_path, "close", 0, [2] + best[1:], 0.5),
        make_run(tmp_path, "worse", 0, [1] * 30 + [2] * 70, 0.4),
    ]
    cells = summarise(collect_runs(runs), runs, SPEC).set_index(["metric", "method"])
    assert cells.loc[("R@1", "best"), "mean"] == pytest.approx(0.60)
    assert cells.loc[("R@1", "close"), "p_worse"] == pytest.approx(0.37, abs=0.06)
    assert cells.loc[("R@1", "worse"), "p_worse"] < ALPHA
    assert list(cells.loc["R@1", "bold"]) == [True, True, False]
    assert cells.loc[("R@1", "best"), "ci_low"] < 0.6 < cells.loc[("R@1", "best"), "ci_high"]
    assert list(cells.loc["NMI", "bold"]) == [True, True, False]  # equal NMI: p = 1; lower: p = 0
    assert math.isnan(cells.loc[("NMI", "best"), "ci_low"]) and cells.loc[("NMI", "best"), "queries"] == 0


def test_a_run_without_per_query_results_is_a_clear_error(tmp_path: Path) -> None:
    runs = [make_run(tmp_path, "best", 0, [1, 2], 0.5), make_run(tmp_path, "close", 0, [1, 2], 0.5, per_query=False)]
    with pytest.raises(ReportInputError, match="per-query results not found") as info:
        summarise(collect_runs(runs), runs, SPEC)
    message = str(info.value)
    assert str(runs[1].path / "per_query.npz") in message and "dmlbench evaluate" in message


def test_per_query_results_that_disagree_with_metrics_are_an_error(tmp_path: Path) -> None:
    runs = [make_run(tmp_path, "best", 0, [1, 2], 0.5)]
    np.savez(runs[0].path / "per_query.npz", row=np.arange(2), first_hit_rank=np.array([2, 2]))
    with pytest.raises(ReportInputError, match="different evaluations"):
        summarise(collect_runs(runs), runs, SPEC)


def test_caption_states_interval_test_alpha_and_seeds() -> None:
    settings = {
        "protocol": "clean",
        "backbone": "small_cnn",
        "pretrained": False,
        "embedding_dim": 64,
        "image_size": (64, 64),
        "epochs": 3,
        "seeds": [0, 1, 2],
        "datasets": ["Synthetic"],
        "deterministic": True,
    }
    text = caption_text(settings)
    for fragment in (
        "95 \\% confidence interval (percentile bootstrap, 1000 replicates",
        "3 seeds resampled, then test queries within each seed",
        "NMI and other per-run numbers: seeds",
        "one-sided paired bootstrap test",
        "matched by seed index",
        "$\\alpha$ = 0.05",
        "3 seeds (0, 1, 2)",
    ):
        assert fragment in text
    assert "1 seed, so over test queries only" in caption_text({**settings, "seeds": [4]})


# ------------------------------------------------------------------ CSV, Markdown, text

HAND_CELLS = pd.DataFrame(
    [
        ["syn", "Synthetic", "a", "A", "R@1", 0.61, 0.60, 0.62, 2, 50, math.nan, True, False],
        ["syn", "Synthetic", "b", "B", "R@1", 0.52, 0.50, 0.55, 2, 50, 0.001, False, True],
        ["syn", "Synthetic", "a", "A", "NMI", 0.70, 0.69, 0.71, 2, 0, math.nan, True, False],
        ["syn", "Synthetic", "b", "B", "NMI", math.nan, math.nan, math.nan, 0, 0, math.nan, False, True],
    ],
    columns=CELL_COLUMNS,
)


def test_markdown_of_a_hand_built_table() -> None:
    assert render_markdown(HAND_CELLS, "Caption.") == (
        "| Method | R@1 | NMI |\n"
        "|---|---|---|\n"
        "| A | **61.0 ± 1.0** | **70.0 ± 1.0** |\n"
        "| B | 52.0 ± 2.5 † | -- |\n"
        "\n"
        "Caption.\n"
    )


def test_text_of_a_hand_built_table() -> None:
    lines = render_text(HAND_CELLS).splitlines()
    assert lines[:4] == [
        "Method           R@1          NMI",
        "------  ------------  -----------",
        "A        61.0 ± 1.0*  70.0 ± 1.0*",
        "B       52.0 ± 2.5 †           --",
    ]
    assert lines[5].startswith("Cells: mean ± half-width of the 95 % confidence interval")
    assert "2 seeds resampled" in lines[5] and "*: not significantly worse" in lines[5]
    assert lines[6].startswith("†: the method's mechanism did not engage")


def test_csv_round_trip_and_summary_command(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    path = write_cells_csv(tmp_path / "t1.csv", HAND_CELLS)
    assert path.read_text().splitlines()[:2] == [
        "dataset,dataset_label,method,method_label,metric,mean,ci_low,ci_high,seeds,queries,p_worse,bold,dead",
        "syn,Synthetic,a,A,R@1,0.61,0.6,0.62,2,50,,True,False",
    ]
    pd.testing.assert_frame_equal(read_cells_csv(path), HAND_CELLS, check_dtype=False)
    assert main(["summary", "t1", "--tables-dir", str(tmp_path)]) == 0
    assert capsys.readouterr().out == render_text(HAND_CELLS)
    assert main(["summary", "missing", "--tables-dir", str(tmp_path)]) == 2
    assert "dmlbench report missing" in capsys.readouterr().err
