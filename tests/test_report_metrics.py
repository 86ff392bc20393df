"""MAP@R and R-precision in the tables (issue 30, item 6): a table's `metrics` chooses its columns (`R@K` = the
dataset's Recall@K set), table1 shows MAP@R and RP with the same intervals, test and bold rule as R@K, the
papers' reference rows show -- there, the caption defines the columns, and a wide table stays readable."""

from __future__ import annotations

import copy
import json
import shutil
import subprocess
from pathlib import Path

import numpy as np
import pytest

from dmlbench.report import RunDir, TableSpec, build_report, collect_runs, load_paper_numbers, summarise
from dmlbench.report.latex import dataset_blocks, render_comparison_table
from dmlbench.report.pipeline import table_metrics, table_spec
from dmlbench.report.significance import bootstrap_means, percentile_interval

SETTINGS = {
    "protocol": "clean",
    "backbone": "ResNet-50",
    "pretrained": True,
    "embedding_dim": 512,
    "image_size": (227, 256),
    "epochs": 70,
    "seeds": [0, 1],
    "datasets": ["CUB-200-2011"],
    "deterministic": True,
}
TABLE1 = ["R@1", "R@2", "R@4", "R@8", "NMI", "MAP@R", "RP"]


def write_run(root: Path, dataset: str, method: str, seed: int, ranks, ap, rp, nmi: float = 0.5) -> RunDir:
    """A run whose metrics.json holds the means of its per-query first-hit ranks, AP@R and R-precision."""
    ranks, ap, rp = np.asarray(ranks), np.asarray(ap, dtype=float), np.asarray(rp, dtype=float)
    path = root / dataset / method / f"seed{seed}"
    path.mkdir(parents=True)
    metrics = {
        **{f"R@{k}": float(np.mean(ranks <= k)) for k in (1, 2, 4, 8)},
        "NMI": nmi,
        "MAP@R": float(ap.mean()),
        "RP": float(rp.mean()),
        "num_queries": len(ranks),
    }
    (path / "metrics.json").write_text(json.dumps(metrics))
    np.savez(path / "per_query.npz", row=np.arange(len(ranks)), first_hit_rank=ranks, ap_at_r=ap, r_precision=rp)
    epochs = "\n".join(f"{e},{1 / e},{0.1 * e},0.01,1.0,10" for e in (1, 2))
    (path / "log.csv").write_text(f"epoch,loss,val_R@1,lr,seconds,images_per_s\n{epochs}\n")
    return RunDir(dataset, method, seed, path)


def row(tex: str, label: str) -> list[str]:
    for line in tex.splitlines():
        if line.startswith(f"{label} & "):
            return [cell.strip() for cell in line.removesuffix("\\\\").split(" & ")[1:]]
    raise AssertionError(f"no row {label!r} in\n{tex}")


# ------------------------------------------------------------------------------------------------ the columns


def test_table1_shows_recall_nmi_map_at_r_and_r_precision(params):
    assert table_spec(params, "table1").metrics == {"synthetic": TABLE1}


def test_r_at_k_stands_for_each_datasets_recall_set(params):
    config = copy.deepcopy(params)
    config["tables"]["table1"]["datasets"] = ["synthetic", "sop"]  # sop: R@1, 10, 100, 1000
    assert table_metrics(config, "table1", "sop") == ["R@1", "R@10", "R@100", "R@1000", "NMI", "MAP@R", "RP"]
    del config["tables"]["table1"]["metrics"]  # a table without `metrics`: R@K and NMI, as before
    assert table_spec(config, "table1").metrics["synthetic"] == ["R@1", "R@2", "R@4", "R@8", "NMI"]
    config["tables"]["table1"]["metrics"] = ["MAP@R", "R@K"]  # any order, any key
    assert table_metrics(config, "table1", "synthetic") == ["MAP@R", "R@1", "R@2", "R@4", "R@8"]


# ---------------------------------------------------------------------------- values, intervals, test, bold


@pytest.fixture
def runs(tmp_path: Path) -> list[RunDir]:
    """Methods a, b, c × seeds 0, 1 on cub200, eight queries each: a's AP@R and R-precision beat b's on every
    query, c's equal a's; their R@K are equal."""
    ranks = [1, 1, 2, 3, 5, 9, 1, 2]
    good_ap, bad_ap = [0.9, 0.8, 0.7, 0.9, 0.6, 0.8, 0.9, 0.7], [0.2, 0.1, 0.3, 0.2, 0.1, 0.2, 0.3, 0.1]
    good_rp, bad_rp = [0.8, 0.7, 0.6, 0.8, 0.5, 0.7, 0.8, 0.6], [0.3, 0.2, 0.2, 0.3, 0.2, 0.1, 0.2, 0.3]
    made = []
    for seed in (0, 1):
        shift = 0.05 * seed
        made += [
            write_run(tmp_path, "cub200", "a", seed, ranks, np.add(good_ap, -shift), good_rp),
            write_run(tmp_path, "cub200", "b", seed, ranks, bad_ap, np.add(bad_rp, shift)),
            write_run(tmp_path, "cub200", "c", seed, ranks, np.add(good_ap, -shift), good_rp),
        ]
    return made


def test_map_at_r_and_rp_cells_are_the_runs_metrics_with_the_tables_interval_and_bold_rule(runs):
    spec = TableSpec(["cub200"], ["a", "b", "c"], {"cub200": ["R@1", "MAP@R", "RP"]})
    cells = summarise(collect_runs(runs), runs, spec).set_index(["method", "metric"])
    for method in ("a", "b"):
        for metric in ("MAP@R", "RP"):
            stored = [json.loads((r.path / "metrics.json").read_text())[metric] for r in runs if r.method == method]
            assert cells.loc[(method, metric), "mean"] == pytest.approx(np.mean(stored), abs=1e-12)
            # the interval: the two-level bootstrap of the per-query values, as for R@K
            key = {"MAP@R": "ap_at_r", "RP": "r_precision"}[metric]
            values = np.stack([np.load(r.path / "per_query.npz")[key] for r in runs if r.method == method])
            low, high = percentile_interval(bootstrap_means(values[:, :, None]))
            assert (cells.loc[(method, metric), "ci_low"], cells.loc[(method, metric), "ci_high"]) == pytest.approx(
                (low[0], high[0]), abs=1e-12
            )
            assert cells.loc[(method, metric), "queries"] == 8 and cells.loc[(method, metric), "seeds"] == 2
    for metric in ("MAP@R", "RP"):  # b is worse on every query: significantly worse, not bold; a and c tie: bold
        assert cells.loc[("b", metric), "p_worse"] < 0.05 and not cells.loc[("b", metric), "bold"]
        assert cells.loc[("a", metric), "bold"] and cells.loc[("c", metric), "bold"]
    assert cells.loc[("a", "R@1"), "bold"] and cells.loc[("b", "R@1"), "bold"]  # equal hits: all bold
    tex = render_comparison_table(cells.reset_index(), spec, "c", "t")
    assert "& R@1 & MAP@R & RP \\\\" in tex
    assert row(tex, "a")[1].startswith(r"\textbf{") and not row(tex, "b")[1].startswith(r"\textbf{")


def test_reference_rows_show_dashes_for_map_at_r_and_rp(runs):
    runs = [r for r in runs if r.method == "a"]
    renamed = [RunDir(r.dataset, "margin", r.seed, r.path) for r in runs]
    spec = TableSpec(["cub200"], ["margin"], {"cub200": TABLE1}, method_labels={"margin": "Margin"})
    tex = render_comparison_table(
        summarise(collect_runs(renamed), renamed, spec), spec, "c", "t", references=load_paper_numbers()
    )
    reference = row(tex, r"Margin (paper: D\&C Tab. 3; ResNet-50, d=128)")
    assert reference[-2:] == ["--", "--"]  # MAP@R, RP: no paper reports them (an en dash in print)
    assert reference[:5] == ["63.6", "74.4", "83.1", "90.0", "69.0"]  # R@1..R@8, NMI as printed in the paper
    assert not any(cell.startswith(r"\textbf") for cell in reference)
    assert "-- where the paper prints none, as for MAP@R and RP)" in tex  # the caption says why


def test_the_caption_defines_map_at_r_and_rp(runs, tmp_path: Path):
    spec = TableSpec(["cub200"], ["a", "b", "c"], {"cub200": TABLE1})
    build_report(
        runs,
        spec,
        SETTINGS,
        table_path=tmp_path / "t.tex",
        curves_png=tmp_path / "c.png",
        recall_png=tmp_path / "r.png",
        label="tab:t",
        references=False,
    )
    md = (tmp_path / "t.md").read_text()
    assert md.splitlines()[0] == "| Method | R@1 | R@2 | R@4 | R@8 | NMI | MAP@R | RP |"
    for text in (
        "MAP@R: mean over the queries of the average precision of their R nearest neighbours",
        "RP: R-precision",
        "R: the number of items of the query's class",
        "Clean protocol",
    ):
        assert text in md
    assert "MAP@R: mean over the queries" in (tmp_path / "t.tex").read_text()


# -------------------------------------------------------------------------------------------- a wide table


def test_a_table_of_four_datasets_is_set_as_blocks_that_pdflatex_compiles(tmp_path: Path):
    datasets = {
        "cub200": [1, 2, 4, 8, 16, 32],
        "cars196": [1, 2, 4, 8, 16, 32],
        "sop": [1, 10, 100, 1000],
        "inshop": [1, 10, 20, 30, 40, 50],
    }
    metrics = {d: [*(f"R@{k}" for k in ks), "NMI", "MAP@R", "RP"] for d, ks in datasets.items()}
    spec = TableSpec(list(datasets), ["margin", "mpn"], metrics, method_labels={"margin": "Margin"})
    assert dataset_blocks(spec) == [["cub200"], ["cars196"], ["sop"], ["inshop"]]  # 9 + 9 > 12, 7 + 9 > 12
    results = collect_runs([])
    tex = render_comparison_table(
        summarise(results, [], spec), spec, "Caption.", "tab:wide", references=load_paper_numbers()
    )
    assert tex.count(r"\begin{tabular}") == 4 and tex.count(r"\caption{") == 1 and r"\begin{table*}" in tex
    assert tex.count("\nMargin & ") == 4 and tex.count("\nmpn & ") == 4  # every method in every block
    assert "Lower block of each part" in tex
    if shutil.which("pdflatex") is None:
        pytest.skip("pdflatex not installed")
    (tmp_path / "table.tex").write_text(tex)
    (tmp_path / "doc.tex").write_text(
        "\\documentclass{article}\n\\usepackage{booktabs}\n\\usepackage{graphicx}\n"
        "\\begin{document}\n\\input{table.tex}\n\\end{document}\n"
    )
    proc = subprocess.run(
        ["pdflatex", "-halt-on-error", "-interaction=nonstopmode", "doc.tex"],
        cwd=tmp_path,
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
    )
    assert proc.returncode == 0, proc.stdout[-3000:]


def test_a_test_selected_column_comes_from_metrics_json_with_an_interval_over_seeds_and_its_definition(
    runs, tmp_path: Path
):
    """``test_selected/R@1`` (the best per-epoch test R@1: the papers' protocol) has no per-query values, so its
    cell is the mean over seeds with a seeds-only interval, and the caption says what the column is."""
    best = {("a", 0): 0.75, ("a", 1): 0.5, ("b", 0): 0.25, ("b", 1): 0.5, ("c", 0): 0.5, ("c", 1): 0.5}
    for run in runs:
        metrics = json.loads((run.path / "metrics.json").read_text())
        metrics["test_selected/R@1"] = best[(run.method, run.seed)]
        (run.path / "metrics.json").write_text(json.dumps(metrics))
    spec = TableSpec(["cub200"], ["a", "b", "c"], {"cub200": ["R@1", "test_selected/R@1"]})
    cells = summarise(collect_runs(runs), runs, spec).set_index(["method", "metric"])
    assert cells.loc[("a", "test_selected/R@1"), "mean"] == pytest.approx(0.625)
    assert cells.loc[("b", "test_selected/R@1"), "mean"] == pytest.approx(0.375)
    assert cells.loc[("a", "test_selected/R@1"), "seeds"] == 2
    build_report(
        runs,
        spec,
        SETTINGS,
        table_path=tmp_path / "t.tex",
        curves_png=tmp_path / "c.png",
        recall_png=tmp_path / "r.png",
        label="tab:t",
        references=False,
    )
    md = (tmp_path / "t.md").read_text()
    assert md.splitlines()[0] == "| Method | R@1 | R@1 (test-selected epoch) |"
    assert "test-selected epoch: the best of the per-epoch test R@1" in md
