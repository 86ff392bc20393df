"""Plots a reader can read (issue 30, item 4): one style per method across every plot, legends that are never
clipped, the table's confidence intervals as error bars, reference rows kept off the trained methods' axis."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pandas as pd
import pytest
from matplotlib.backends.backend_agg import FigureCanvasAgg
from matplotlib.colors import to_hex
from matplotlib.offsetbox import DrawingArea

from dmlbench.report import RunDir, TableSpec, collect_runs, load_logs, plots, summarise
from dmlbench.report.figures import metric_vs_param, render_figure
from dmlbench.report.pipeline import table_spec
from dmlbench.report.plots import (
    DPI,
    plot_recall_at_k,
    plot_training_curves,
    seed_half_widths,
)
from dmlbench.report.styles import PALETTE, REFERENCE_COLORS, Styles
from dmlbench.report.summary import cell_text

KS = (1, 2, 4, 8)


def write_run(root: Path, dataset: str, method: str, seed: int, ranks: np.ndarray, epochs: int = 4) -> RunDir:
    """A run whose metrics.json and per_query.npz agree (first-hit ``ranks``), with a small log.csv."""
    path = root / dataset / method / f"seed{seed}"
    path.mkdir(parents=True)
    metrics = {f"R@{k}": float(np.mean(ranks <= k)) for k in KS}
    (path / "metrics.json").write_text(json.dumps({**metrics, "NMI": 0.5 + 0.01 * seed, "num_queries": len(ranks)}))
    np.savez(path / "per_query.npz", row=np.arange(len(ranks)), first_hit_rank=ranks)
    epoch = np.arange(1, epochs + 1)
    pd.DataFrame(
        {
            "epoch": epoch,
            "loss": 1.0 / epoch + 0.01 * seed,
            "val_R@1": 0.2 + 0.01 * epoch + 0.002 * seed,
            "lr": 0.1,
            "seconds": 1.0,
            "images_per_s": 10.0,
        }
    ).to_csv(path / "log.csv", index=False)
    return RunDir(dataset, method, seed, path)


def ranks_for(r1: float, rng: np.random.Generator, queries: int = 40, grow: float = 0.3) -> np.ndarray:
    """First-hit ranks of ``queries`` queries with R@1 about ``r1``; a share ``grow`` of the misses at each K hits
    at the next."""
    ranks = np.where(rng.random(queries) < r1, 1, 16)
    for k in KS[1:]:
        ranks = np.where((ranks == 16) & (rng.random(queries) < grow), k, ranks)
    return ranks


@pytest.fixture
def drawn(monkeypatch) -> dict[str, object]:
    """The matplotlib figures the plots save, by output file name."""
    figures: dict[str, object] = {}
    write = plots._write_png

    def capture(fig, out_png):
        figures[Path(out_png).name] = fig
        return write(fig, out_png)

    monkeypatch.setattr(plots, "_write_png", capture)
    return figures


def data_lines(fig) -> dict[str, object]:
    """The line of each method (its ``gid``) in a figure."""
    return {line.get_gid(): line for ax in fig.axes for line in ax.get_lines() if line.get_gid()}


def errorbars(ax, method: str) -> tuple[np.ndarray, np.ndarray]:
    """Means and half-widths of the error bars a method has in ``ax``."""
    for container in ax.containers:
        data_line, _, (bars, *_) = container.lines
        if data_line.get_gid() == method:
            segments = bars.get_segments()
            return (
                np.asarray(data_line.get_ydata(), dtype=float),
                np.array([(top[1] - bottom[1]) / 2 for bottom, top in segments]),
            )
    raise AssertionError(f"no error bars of {method}")


def legend_entries_outside(fig) -> list[str]:
    """The parts of the legend (an entry's text or its handle's box, the title, the whole legend) whose drawn box
    is not inside the figure as saved (at :data:`DPI`)."""
    canvas = FigureCanvasAgg(fig)
    fig.set_dpi(DPI)
    canvas.draw()
    renderer = canvas.get_renderer()
    box = fig.bbox

    def inside(extent) -> bool:
        return (
            extent.x0 >= box.x0 - 0.5
            and extent.y0 >= box.y0 - 0.5
            and extent.x1 <= box.x1 + 0.5
            and extent.y1 <= box.y1 + 0.5
        )

    outside = []
    for legend in fig.legends:
        handle_boxes = legend.findobj(DrawingArea)  # one per entry: the box its marker and line are drawn in
        assert len(handle_boxes) == len(legend.get_texts())
        parts = [
            *((text.get_text(), text) for text in legend.get_texts()),
            *((f"handle {i}", area) for i, area in enumerate(handle_boxes)),
            ("title", legend.get_title()),
            ("legend", legend),
        ]
        outside += [name for name, part in parts if not inside(part.get_window_extent(renderer))]
    return outside


# ---------------------------------------------------------------------------------------------- the styles


def test_thirty_names_have_thirty_colour_marker_pairs_and_references_stand_apart():
    names = [f"method{i}" for i in range(30)]
    styles = Styles(["untrained", *names, "frozen"], references=["untrained", "frozen"])
    pairs = [(styles[n].color, styles[n].marker) for n in names]
    assert len(set(pairs)) == 30
    assert len({styles[n].color for n in names[:20]}) == 20  # the first 20 differ in colour alone
    for reference in ("untrained", "frozen"):
        assert styles[reference].linestyle == "--" and styles[reference].color in REFERENCE_COLORS
    assert {styles[n].color for n in names} <= set(PALETTE) and {styles[n].linestyle for n in names} == {"-"}
    assert (styles["untrained"].color, styles["untrained"].marker) != (styles["frozen"].color, styles["frozen"].marker)


def test_methods_drawn_together_never_share_a_colour(params):
    styles = Styles.from_config(params)
    pairs = [(styles[m].color, styles[m].marker) for m in params["methods"]]
    assert len(set(pairs)) == len(pairs)  # no two methods of the project look alike
    for table in params["tables"].values():
        colors = [styles[m].color for m in table["methods"]]
        assert len(set(colors)) == len(colors), table["methods"]


def test_a_methods_style_does_not_depend_on_the_other_names(params):
    project = Styles.from_config(params)
    table1 = table_spec(params, "table1")
    for methods in (["deml"], ["margin", "deml", "untrained"], ["untrained", "deml", "margin"], table1.methods):
        spec = TableSpec(["synthetic"], methods, {"synthetic": ["R@1"]}, method_styles={m: project[m] for m in methods})
        for method in methods:
            assert spec.styles()[method] == project[method] == table1.styles()[method]
    assert table_spec(params, "dnc_table1").styles()["margin"] == table1.styles()["margin"]


def test_one_style_per_method_in_both_plots_of_a_table_and_in_a_figure(params, tmp_path, monkeypatch, drawn):
    rng = np.random.default_rng(0)
    methods = ["untrained", "contrastive", "margin", "deml"]
    runs = [
        write_run(tmp_path / "results" / "runs", "synthetic", m, s, ranks_for(0.05 if m == "untrained" else 0.3, rng))
        for m in methods
        for s in (0, 1)
    ]
    spec = table_spec(params, "table1")
    plot_recall_at_k(summarise(collect_runs(runs), runs, spec), spec, tmp_path / "recall.png")
    plot_training_curves(load_logs([r for r in runs if r.method != "untrained"]), tmp_path / "curves.png", spec)
    monkeypatch.chdir(tmp_path)
    params = {
        **params,
        "seeds": [0, 1],
        "figures": {
            "curves": {
                "kind": "training_curves",
                "dataset": "synthetic",
                "methods": ["deml", "margin"],
                "columns": ["val_R@1"],
            }
        },
    }
    render_figure(params, "curves", tmp_path / "figure.png")
    recall, curves, figure = (data_lines(drawn[name]) for name in ("recall.png", "curves.png", "figure.png"))
    project = Styles.from_config(params)
    for method in methods:
        looks = [
            (to_hex(line.get_color()), line.get_marker(), line.get_linestyle())
            for lines in (recall, curves, figure)
            if method in lines
            for line in [lines[method]]
        ]
        expected = project[method]
        assert looks and set(looks) == {(expected.color, expected.marker, expected.linestyle)}
    assert (
        set(recall) == set(methods)
        and set(curves) == set(methods) - {"untrained"}
        and set(figure) == {"deml", "margin"}
    )


# ---------------------------------------------------------------------------------------------- the legends


def test_every_legend_entry_lies_inside_the_saved_figure(params, tmp_path, monkeypatch, drawn):
    rng = np.random.default_rng(1)
    spec = table_spec(params, "table1")  # 14 methods with long labels
    runs = [
        write_run(tmp_path / "results" / "runs", "synthetic", m, s, ranks_for(0.05 if m == "untrained" else 0.3, rng))
        for m in spec.methods
        for s in (0, 1)
    ]
    plot_recall_at_k(summarise(collect_runs(runs), runs, spec), spec, tmp_path / "recall.png")
    trained = [r for r in runs if r.method not in spec.references]
    plot_training_curves(load_logs(trained), tmp_path / "curves.png", spec)
    monkeypatch.chdir(tmp_path)
    figure = {
        "kind": "training_curves",
        "dataset": "synthetic",
        "columns": ["val_R@1"],
        "methods": [m for m in spec.methods if m not in spec.references],
    }
    render_figure({**params, "seeds": [0, 1], "figures": {"curves": figure}}, "curves", tmp_path / "figure.png")
    for name in ("recall.png", "curves.png", "figure.png"):
        fig = drawn[name]
        assert len(fig.legends) == 1
        assert len(fig.legends[0].get_texts()) == len(data_lines(fig))  # one entry per method drawn
        assert legend_entries_outside(fig) == [], name


# ---------------------------------------------------------------------------------------------- the intervals


def test_error_bars_are_the_tables_confidence_intervals(tmp_path, drawn):
    # a: a hit in seed 0 and a miss in seed 1 (one query each) at K = 1 and 2, hits in both at K = 4 and 8: the
    # bootstrap draws the seeds (a, a), (a, b), (b, a) or (b, b), a mean of 1, 0.5 or 0, so the 95 % interval
    # is [0, 1]: 50 ± 50 points; at K = 4 every draw is 1: 100 ± 0. b: misses at K = 1 in both seeds, hits at 2.
    runs = [
        write_run(tmp_path, "synthetic", "a", 0, np.array([1])),
        write_run(tmp_path, "synthetic", "a", 1, np.array([3])),
        write_run(tmp_path, "synthetic", "b", 0, np.array([2])),
        write_run(tmp_path, "synthetic", "b", 1, np.array([2])),
    ]
    spec = TableSpec(["synthetic"], ["a", "b"], {"synthetic": ["R@1", "R@2", "R@4", "R@8"]})
    cells = summarise(collect_runs(runs), runs, spec)
    plot_recall_at_k(cells, spec, tmp_path / "recall.png")
    ax = drawn["recall.png"].axes[0]
    means, halves = errorbars(ax, "a")
    assert means.tolist() == [50.0, 50.0, 100.0, 100.0] and halves.tolist() == [50.0, 50.0, 0.0, 0.0]
    means, halves = errorbars(ax, "b")
    assert means.tolist() == [0.0, 100.0, 100.0, 100.0] and halves.tolist() == [0.0, 0.0, 0.0, 0.0]
    shown = cells.set_index(["method", "metric"])
    assert cell_text(cells[(cells["method"] == "a") & (cells["metric"] == "R@1")].iloc[0]) == "50.0 ± 50.0"  # printed
    for method in ("a", "b"):
        table = [
            100 * (shown.loc[(method, f"R@{k}"), "ci_high"] - shown.loc[(method, f"R@{k}"), "ci_low"]) / 2 for k in KS
        ]
        assert errorbars(ax, method)[1] == pytest.approx(table, abs=1e-9)


def test_training_curve_bands_are_the_tables_interval_of_per_run_numbers(tmp_path):
    nmi = np.array([0.51, 0.55, 0.62])  # a per-run number: the table resamples its seeds only
    runs = []
    for seed, value in enumerate(nmi):
        run = write_run(tmp_path, "synthetic", "a", seed, np.array([1, 2]))
        metrics = json.loads((run.path / "metrics.json").read_text())
        (run.path / "metrics.json").write_text(json.dumps({**metrics, "NMI": value}))
        runs.append(run)
    spec = TableSpec(["synthetic"], ["a"], {"synthetic": ["NMI"]})
    cell = summarise(collect_runs(runs), runs, spec).iloc[0]
    assert seed_half_widths(nmi[:, None])[0] == pytest.approx((cell["ci_high"] - cell["ci_low"]) / 2, abs=1e-12)
    assert np.isnan(seed_half_widths(np.array([[0.5, 0.4], [np.nan, 0.6]]))[0])  # one seed: no interval


@pytest.mark.parametrize("metric", ["R@1", "NMI"])
def test_metric_vs_param_bars_are_the_tables_confidence_intervals(params, tmp_path, monkeypatch, drawn, metric):
    # margin: a hit in seed 0 and a miss in seed 1 (one query each) at K = 1: 50 ± 50 in the table (sample std: 70.7);
    # contrastive misses at K = 1 in both seeds: 0 ± 0. NMI (0.50, 0.51 in both): seeds only, 50.5 ± 0.5 (std 0.7).
    root = tmp_path / "results" / "runs"
    ranks = {("margin", 0): [1], ("margin", 1): [3], ("contrastive", 0): [2], ("contrastive", 1): [2]}
    runs = [write_run(root, "synthetic", m, s, np.array(r)) for (m, s), r in ranks.items()]
    monkeypatch.chdir(tmp_path)
    figure = {
        "kind": "metric_vs_param",
        "dataset": "synthetic",
        "metric": metric,
        "x_label": "x",
        "series": {"line": {"contrastive": 2.0, "margin": 1.0}},
    }
    render_figure({**params, "seeds": [0, 1], "figures": {"f": figure}}, "f", tmp_path / "f.png")
    fig = drawn["f.png"]
    means, halves = errorbars(fig.axes[0], "line")  # in x order: margin, contrastive
    spec = TableSpec(["synthetic"], ["margin", "contrastive"], {"synthetic": [metric]})
    table = summarise(collect_runs(runs), runs, spec).set_index("method")
    assert means == pytest.approx([100 * table.loc[m, "mean"] for m in ("margin", "contrastive")], abs=1e-9)
    assert halves == pytest.approx(
        [100 * (table.loc[m, "ci_high"] - table.loc[m, "ci_low"]) / 2 for m in ("margin", "contrastive")], abs=1e-9
    )
    assert halves.tolist() == pytest.approx([50.0, 0.0] if metric == "R@1" else [0.5, 0.5], abs=1e-9)
    assert fig.legends[0].get_title().get_text() == metric_vs_param.LEGEND_TITLE  # says what the bars are


# ---------------------------------------------------------------------------------------------- reference rows


def test_reference_rows_do_not_stretch_the_axis_of_the_trained_methods(tmp_path, drawn):
    rng = np.random.default_rng(2)
    r1 = {"untrained": 0.03, "frozen": 0.31, "a": 0.30, "b": 0.34, "c": 0.38}
    runs = [
        write_run(tmp_path, "synthetic", m, s, ranks_for(v, rng, 200, 0.02 if m == "untrained" else 0.3))
        for m, v in r1.items()
        for s in (0, 1)
    ]
    spec = TableSpec(
        ["synthetic"],
        list(r1),
        {"synthetic": [f"R@{k}" for k in KS]},
        method_labels={"untrained": "Untrained network"},
        references=["untrained", "frozen"],
    )
    cells = summarise(collect_runs(runs), runs, spec).set_index(["method", "metric"])
    plot_recall_at_k(cells.reset_index(), spec, tmp_path / "recall.png")
    fig = drawn["recall.png"]
    ax = fig.axes[0]
    low, high = ax.get_ylim()
    trained = [100 * cells.loc[(m, f"R@{k}"), bound] for m in "abc" for k in KS for bound in ("ci_low", "ci_high")]
    assert low <= min(trained) and max(trained) <= high  # the axis fits the trained methods' intervals
    untrained = [100 * cells.loc[("untrained", f"R@{k}"), "mean"] for k in KS]
    assert max(untrained) < low and low > 10  # the untrained row does not pull the axis down to 0
    lines = data_lines(fig)
    assert lines["untrained"].get_linestyle() == "--" and lines["frozen"].get_linestyle() == "--"
    assert lines["a"].get_linestyle() == "-"
    notes = [text.get_text() for text in ax.texts if (text.get_gid() or "").startswith("off-axis:")]
    assert len(notes) == 1 and "Untrained network" in notes[0] and "below the axis" in notes[0]
    assert f"{min(untrained):.1f}–{max(untrained):.1f} %" in notes[0]
