"""Tests of the report step: loading runs, LaTeX tables, captions, plots, paper numbers."""

from __future__ import annotations

import json
import math
import shutil
import subprocess
from pathlib import Path

import numpy as np
import pytest
from PIL import Image

from dmlbench.report import (
    PaperNumbersError,
    ReportInputError,
    RunDir,
    TableSpec,
    aggregate_over_seeds,
    build_report,
    caption_text,
    collect_runs,
    escape_latex,
    load_logs,
    load_paper_numbers,
    merge_settings,
    plot_recall_at_k,
    plot_training_curves,
    render_comparison_table,
    summarise,
    write_table,
)
from dmlbench.report.plots import DPI, LEGEND_HEIGHT, PANEL_HEIGHT, PANEL_WIDTH

SETTINGS = {
    "protocol": "clean",
    "backbone": "ResNet-50",
    "pretrained": True,
    "embedding_dim": 512,
    "image_size": (227, 256),
    "epochs": 70,
    "seeds": [0, 1],
    "datasets": ["Synthetic"],
    "deterministic": True,
}


QUERIES = 50


def per_query_ranks(metrics: dict, queries: int = QUERIES) -> np.ndarray:
    """(Q,) first-hit ranks whose R@K fractions are those in ``metrics`` (each × Q an integer): the first
    R@K1 · Q queries at rank K1, the next (R@K2 − R@K1) · Q at rank K2, ..., the rest beyond the largest K."""
    ks = sorted(int(key[2:]) for key in metrics if key.startswith("R@"))
    ranks = np.full(queries, (ks[-1] if ks else 1) + 1)
    done = 0
    for k in ks:
        hits = round(metrics[f"R@{k}"] * queries)
        ranks[done:hits] = k
        done = hits
    return ranks


def make_run(root: Path, dataset: str, method: str, seed: int, metrics: dict, epochs: int = 3) -> RunDir:
    """A run directory with metrics.json, a per_query.npz that agrees with it, and a small log.csv."""
    path = root / dataset / method / f"seed{seed}"
    path.mkdir(parents=True)
    (path / "metrics.json").write_text(json.dumps({**metrics, "kmeans_seed": seed, "num_queries": QUERIES}))
    np.savez(path / "per_query.npz", row=np.arange(QUERIES), first_hit_rank=per_query_ranks(metrics))
    rows = ["epoch,loss,val_R@1,lr,seconds,images_per_s"]
    rows += [f"{e},{1.0 / e + 0.01 * seed},{0.1 * e + 0.01 * seed},0.01,2.0,50" for e in range(1, epochs + 1)]
    (path / "log.csv").write_text("\n".join(rows) + "\n")
    return RunDir.from_path(path)


def spec_for(datasets: list[str], methods: list[str], metrics: list[str], **labels) -> TableSpec:
    return TableSpec(datasets=datasets, methods=methods, metrics={d: list(metrics) for d in datasets}, **labels)


def table_row(tex: str, label: str) -> list[str]:
    """The cells (after the label) of the table line starting with ``label &``."""
    for line in tex.splitlines():
        if line.startswith(f"{label} & "):
            return [cell.strip() for cell in line.removesuffix("\\\\").split(" & ")[1:]]
    raise AssertionError(f"no row '{label}' in\n{tex}")


@pytest.fixture
def two_by_two(tmp_path: Path) -> list[RunDir]:
    """Methods a, b x seeds 0, 1 on 'synthetic' (hand-checkable numbers)."""
    values = {
        ("a", 0): {"R@1": 0.60, "R@2": 0.70, "NMI": 0.70},
        ("a", 1): {"R@1": 0.62, "R@2": 0.80, "NMI": 0.70},
        ("b", 0): {"R@1": 0.50, "R@2": 0.90, "NMI": 0.70},
        ("b", 1): {"R@1": 0.54, "R@2": 0.90, "NMI": 0.70},
    }
    return [make_run(tmp_path / "runs", "synthetic", m, s, v) for (m, s), v in values.items()]


# ----------------------------------------------------------------- collect


def test_collect_runs_long_format(two_by_two: list[RunDir]) -> None:
    frame = collect_runs(two_by_two)
    assert list(frame.columns) == ["dataset", "method", "seed", "metric", "value"]
    assert len(frame) == 4 * 5  # 3 metrics + 2 bookkeeping keys per run
    value = frame.query("method == 'a' and seed == 1 and metric == 'R@1'")["value"].item()
    assert value == pytest.approx(0.62)


def test_run_dir_from_path() -> None:
    run = RunDir.from_path("results/runs/cub200/margin/seed3")
    assert (run.dataset, run.method, run.seed) == ("cub200", "margin", 3)
    with pytest.raises(ReportInputError, match="not a run directory"):
        RunDir.from_path("results/runs/cub200/margin/latest")


@pytest.mark.parametrize(
    ("content", "message"),
    [
        ('{"R@1": "0.5"}', "non-numeric"),
        ('{"R@1": 61.3}', "outside \\[0, 1\\]"),
        ('{"R@1": NaN}', "not finite"),
        ('{"R@1": [0.5]}', "non-numeric"),
        ("{not json", "not valid JSON"),
    ],
)
def test_malformed_metrics_names_the_file(tmp_path: Path, content: str, message: str) -> None:
    run = make_run(tmp_path, "synthetic", "a", 0, {"R@1": 0.5})
    (run.path / "metrics.json").write_text(content)
    with pytest.raises(ReportInputError, match=message) as info:
        collect_runs([run])
    assert str(run.path / "metrics.json") in str(info.value)


def test_missing_metrics_names_the_file(tmp_path: Path) -> None:
    run = make_run(tmp_path, "synthetic", "a", 0, {"R@1": 0.5})
    (run.path / "metrics.json").unlink()
    with pytest.raises(ReportInputError, match="not found") as info:
        collect_runs([run])
    assert str(run.path / "metrics.json") in str(info.value)


def test_duplicate_run_is_rejected(two_by_two: list[RunDir]) -> None:
    with pytest.raises(ReportInputError, match="given twice"):
        collect_runs([*two_by_two, two_by_two[0]])


def test_load_logs(two_by_two: list[RunDir]) -> None:
    logs = load_logs(two_by_two)
    assert len(logs) == 4 * 3
    assert {"dataset", "method", "seed", "epoch", "loss", "val_R@1"} <= set(logs.columns)
    assert logs["epoch"].dtype.kind == "i"


@pytest.mark.parametrize(
    ("content", "message"),
    [
        ("epoch,loss,val_R@1,lr,seconds,images_per_s\n1,abc,0.1,0.1,1,1\n", "column 'loss' is not numeric"),
        ("epoch,loss,lr,seconds,images_per_s\n1,0.5,0.1,1,1\n", "missing column"),
        ("epoch,loss,val_R@1,lr,seconds,images_per_s\n2,0.5,0.1,0.1,1,1\n", "'epoch' must be 1, 2"),
        ("epoch,loss,val_R@1,lr,seconds,images_per_s\n", "no epochs"),
    ],
)
def test_malformed_log_names_the_file(tmp_path: Path, content: str, message: str) -> None:
    run = make_run(tmp_path, "synthetic", "a", 0, {"R@1": 0.5})
    (run.path / "log.csv").write_text(content)
    with pytest.raises(ReportInputError, match=message) as info:
        load_logs([run])
    assert str(run.path / "log.csv") in str(info.value)


# ------------------------------------------------------------------- table


def render(runs: list[RunDir], spec: TableSpec, caption: str = "c", label: str = "t", **kwargs) -> str:
    """The LaTeX table of ``runs``."""
    return render_comparison_table(summarise(collect_runs(runs), runs, spec), spec, caption, label, **kwargs)


def test_table_cells_are_mean_and_confidence_interval(two_by_two: list[RunDir]) -> None:
    tex = render(two_by_two, spec_for(["synthetic"], ["a", "b", "c"], ["R@1", "R@2", "NMI"]), label="tab:x")
    # means over seeds: a R@1 (0.60, 0.62) -> 61.0, R@2 (0.7, 0.8) -> 75.0; b 52.0, 90.0. a's hits are a
    # superset of b's at R@1 (and b's of a's at R@2), so the worse row is significantly worse; NMI ties.
    a, b = table_row(tex, "a"), table_row(tex, "b")
    assert [cell.split(" $\\pm$ ")[0] for cell in a] == [r"\textbf{61.0", "75.0", r"\textbf{70.0"]
    assert [cell.split(" $\\pm$ ")[0] for cell in b] == ["52.0", r"\textbf{90.0", r"\textbf{70.0"]
    assert a[2] == b[2] == r"\textbf{70.0 $\pm$ 0.0}"  # the same NMI in every seed: no spread
    assert table_row(tex, "c") == ["--", "--", "--"]
    for rule in (r"\toprule", r"\midrule", r"\bottomrule", r"\cmidrule(lr){2-4}", r"\multicolumn{3}{c}{synthetic}"):
        assert rule in tex
    assert r"\label{tab:x}" in tex and r"\begin{table}" in tex


def test_one_seed_per_run_numbers_show_the_mean_only(tmp_path: Path) -> None:
    """NMI has no per-query values: with one seed there is no interval, and any difference counts."""
    runs = [make_run(tmp_path, "synthetic", m, 0, {"R@1": 0.6, "NMI": nmi}) for m, nmi in (("a", 0.61), ("b", 0.60))]
    tex = render(runs, spec_for(["synthetic"], ["a", "b"], ["R@1", "NMI"]))
    assert table_row(tex, "a")[1] == r"\textbf{61.0}" and table_row(tex, "b")[1] == "60.0"
    # R@1 of one seed: an interval over the 50 queries; identical hits: both bold
    assert table_row(tex, "a")[0] == table_row(tex, "b")[0] != r"\textbf{60.0}"
    assert table_row(tex, "a")[0].startswith(r"\textbf{60.0 $\pm$ ")


def test_missing_cells_render_as_dashes(tmp_path: Path) -> None:
    runs = [
        make_run(tmp_path, "synthetic", "a", 0, {"R@1": 0.5, "NMI": 0.4}),
        make_run(tmp_path, "other", "a", 0, {"R@1": 0.3}),
        make_run(tmp_path, "other", "b", 0, {"R@1": 0.2}),
    ]
    spec = spec_for(["synthetic", "other"], ["a", "b"], ["R@1", "NMI"])
    tex = render(runs, spec)
    shown = [cell.split(" $\\pm$ ")[0] for cell in table_row(tex, "a")]
    assert shown == [r"\textbf{50.0", r"\textbf{40.0}", r"\textbf{30.0", "--"]
    assert [cell.split(" $\\pm$ ")[0] for cell in table_row(tex, "b")] == ["--", "--", "20.0", "--"]


def test_labels_are_escaped(two_by_two: list[RunDir]) -> None:
    spec = spec_for(
        ["synthetic"],
        ["a", "b"],
        ["R@1"],
        method_labels={"a": "my_method & 5% #1", "b": "b"},
        dataset_labels={"synthetic": "Synth_set"},
    )
    tex = render(two_by_two, spec)
    assert table_row(tex, r"my\_method \& 5\% \#1")
    assert r"\multicolumn{1}{c}{Synth\_set}" in tex
    assert escape_latex(r"a\b{c}~^$<>") == (
        r"a\textbackslash{}b\{c\}\textasciitilde{}\textasciicircum{}\$\textless{}\textgreater{}"
    )


def test_write_table_is_atomic_and_replaces(tmp_path: Path) -> None:
    target = tmp_path / "tables" / "t.tex"
    write_table(target, "old\n")
    write_table(target, "new\n")
    assert target.read_text() == "new\n"
    assert [p.name for p in target.parent.iterdir()] == ["t.tex"]


# ---------------------------------------------------------- reference rows


def test_no_reference_rows_for_synthetic_only_table(two_by_two: list[RunDir]) -> None:
    spec = spec_for(["synthetic"], ["a", "margin"], ["R@1"])
    tex = render(two_by_two, spec, references=load_paper_numbers())
    assert "paper:" not in tex
    assert tex.count(r"\midrule") == 1


def test_reference_rows_only_for_shown_datasets_and_never_bold(tmp_path: Path) -> None:
    runs = [make_run(tmp_path, "cub200", "margin", s, {"R@1": 0.10 + 0.02 * s, "NMI": 0.2}) for s in (0, 1)]
    spec = spec_for(["synthetic", "cub200"], ["margin"], ["R@1", "NMI"], method_labels={"margin": "Margin"})
    tex = render(runs, spec, references=load_paper_numbers())
    reference = table_row(tex, r"Margin (paper: D\&C Tab. 3; ResNet-50, d=128)")
    assert reference == ["--", "--", "63.6", "69.0"]  # synthetic: none; CUB from D&C Table 3, not bold
    margin = table_row(tex, "Margin")
    assert margin[:2] == ["--", "--"] and margin[2].startswith(r"\textbf{11.0 $\pm$ ")
    assert margin[3] == r"\textbf{20.0 $\pm$ 0.0}"
    assert tex.count(r"\midrule") == 2
    assert "Lower block" in tex  # the caption explains the reference rows


# ----------------------------------------------------------------- caption


def test_caption_states_all_settings() -> None:
    text = caption_text(SETTINGS)
    for fragment in (
        "Clean protocol",
        "class-disjoint validation split",
        "ResNet-50",
        "ImageNet-pretrained",
        "embedding size 512",
        "227 (train crop) / 256 (test crop)",
        "epochs 70",
        "2 seeds (0, 1)",
        "Synthetic",
    ):
        assert fragment in text
    assert "best test Recall@1" in caption_text({**SETTINGS, "protocol": "paper", "seeds": [7]})
    assert "no model selection" in caption_text({**SETTINGS, "protocol": "last"})


def test_caption_lists_differing_settings_and_flags_mixed_protocols() -> None:
    merged = merge_settings(
        {"CUB-200-2011": SETTINGS, "SOP": {**SETTINGS, "protocol": "paper", "epochs": 40, "backbone": "BN_Inception"}}
    )
    text = caption_text(merged)
    assert text.startswith(r"\textbf{Mixed protocols}")
    assert "clean (CUB-200-2011); paper (SOP)" in text
    assert "epochs [70 for CUB-200-2011; 40 for SOP]" in text
    assert r"BN\_Inception for SOP" in text
    assert "embedding size 512;" in text  # agreeing settings stay single


def test_caption_states_a_setting_most_rows_share_once() -> None:
    rows = {name: SETTINGS for name in ("Triplet", "Margin", "D&C")}
    merged = merge_settings({**rows, "DeML": {**SETTINGS, "embedding_dim": 64}})
    assert r"embedding size 512 (DeML: 64);" in caption_text(merged)


def test_caption_states_non_deterministic_kernels_only_when_used() -> None:
    assert "deterministic" not in caption_text(SETTINGS)
    assert "GPU kernels were not deterministic (training.deterministic: false): a rerun may differ" in caption_text(
        {**SETTINGS, "deterministic": False}
    )
    merged = merge_settings({"Triplet": SETTINGS, "MPN": {**SETTINGS, "deterministic": False}})
    assert "not deterministic (training.deterministic: false) for MPN: a rerun of those" in caption_text(merged)


def test_caption_rejects_missing_or_unknown_settings() -> None:
    with pytest.raises(ValueError, match="missing key"):
        caption_text({k: v for k, v in SETTINGS.items() if k != "epochs"})
    with pytest.raises(ValueError, match="unknown key"):
        caption_text({**SETTINGS, "batch": 32})
    with pytest.raises(ValueError, match="unknown protocol"):
        caption_text({**SETTINGS, "protocol": "best"})


# ---------------------------------------------------------------- pdflatex


@pytest.mark.skipif(shutil.which("pdflatex") is None, reason="pdflatex not installed")
def test_table_compiles_with_pdflatex(tmp_path: Path) -> None:
    datasets = ["synthetic", "cub200", "sop"]
    runs = [
        make_run(tmp_path / "runs", d, m, s, {"R@1": 0.5 + 0.02 * s, "R@2": 0.6, "NMI": 0.4})
        for d in datasets
        for m in ("margin", "mpn")
        for s in (0, 1)
    ]
    spec = spec_for(datasets, ["margin", "mpn", "odd"], ["R@1", "R@2", "NMI"], method_labels={"odd": "x_y & 5% #2"})
    caption = caption_text({**SETTINGS, "backbone": "resnet_50 & co", "datasets": datasets})
    tex = render(runs, spec, caption, "tab:main", references=load_paper_numbers())
    assert r"\begin{table*}" in tex  # 9 value columns: wide
    write_table(tmp_path / "table.tex", tex)
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
    )
    assert proc.returncode == 0, proc.stdout[-3000:]
    assert (tmp_path / "doc.pdf").stat().st_size > 0


# ------------------------------------------------------------------- plots


def expected_size(ncols: int, nrows: int, width: float) -> tuple[int, int]:
    return round(width * ncols * DPI), round((PANEL_HEIGHT * nrows + LEGEND_HEIGHT) * DPI)


def test_plots_are_pngs_of_the_expected_size_and_deterministic(tmp_path: Path, two_by_two: list[RunDir]) -> None:
    spec = spec_for(["synthetic"], ["a", "b"], ["R@1", "R@2", "NMI"], method_labels={"a": "A$1", "b": "b_2"})
    results, logs = collect_runs(two_by_two), load_logs(two_by_two)
    outputs = {}
    for attempt in ("1", "2"):
        outputs[attempt] = (
            plot_training_curves(logs, tmp_path / attempt / "curves.png", spec),
            plot_recall_at_k(summarise(results, two_by_two, spec), spec, tmp_path / attempt / "recall.png"),
        )
    curves, recall = outputs["1"]
    with Image.open(curves) as image:
        assert image.format == "PNG" and image.size == expected_size(2, 1, PANEL_WIDTH)
    with Image.open(recall) as image:
        assert image.format == "PNG" and image.size == expected_size(1, 1, PANEL_WIDTH)
    for first, second in zip(outputs["1"], outputs["2"], strict=True):
        assert first.read_bytes() == second.read_bytes()


def test_recall_plot_grid_for_four_datasets(tmp_path: Path) -> None:
    datasets = ["cub200", "cars196", "sop", "inshop"]
    runs = [make_run(tmp_path, d, "margin", 0, {"R@1": 0.5, "R@10": 0.7}) for d in datasets]
    spec = spec_for(datasets, ["margin"], ["R@1", "R@10"])
    path = plot_recall_at_k(summarise(collect_runs(runs), runs, spec), spec, tmp_path / "recall.png")
    with Image.open(path) as image:
        assert image.size == expected_size(3, 2, PANEL_WIDTH)


def test_plot_without_data_is_an_error(tmp_path: Path, two_by_two: list[RunDir]) -> None:
    spec = spec_for(["cub200"], ["a"], ["R@1"])
    with pytest.raises(ValueError, match="nothing to plot"):
        plot_recall_at_k(summarise(collect_runs(two_by_two), [], spec), spec, tmp_path / "r.png")
    with pytest.raises(ValueError, match="no training logs"):
        plot_training_curves(load_logs(two_by_two), tmp_path / "c.png", spec)


# ----------------------------------------------------------- paper numbers


def test_paper_numbers_load_with_verified_values() -> None:
    numbers = load_paper_numbers()
    primary = numbers[numbers["primary"]].set_index(["method", "dataset", "metric"])["value"]
    # Spot checks against the paper texts (MPN Tab. 1/2, D&C Tab. 1-4, DeML Tab. 3, DIABLO Tab. 1/2).
    assert primary["mpn", "cub200", "R@1"] == 70.3
    assert primary["mpn", "cub200", "NMI"] == 74.0
    assert primary["mpn", "inshop", "R@1"] == 92.8
    assert primary["dnc", "sop", "R@1"] == 75.9
    assert primary["dnc", "inshop", "NMI"] == 88.6
    assert primary["deml", "cub200", "R@1"] == 65.4
    assert primary["diablo", "cub200", "R@1"] == 62.8  # N = 8, our `diablo` (N = 16: 63.9, not primary)
    assert primary["abe", "cars196", "R@1"] == 85.2
    assert primary["margin", "cub200", "R@1"] == 63.6
    assert primary["norm_softmax", "sop", "R@1"] == 78.2
    assert primary["contrastive", "inshop", "R@50"] == 98.7
    assert not primary.index.duplicated().any()
    assert set(numbers["method"]) == {
        "contrastive", "triplet", "margin", "binomial", "proxy_nca", "norm_softmax",
        "abe", "mpn", "deml", "diablo", "dnc",
    }  # fmt: skip
    assert numbers["value"].between(0, 100).all()


@pytest.mark.parametrize(
    ("change", "message"),
    [
        ({"typo": 1}, "unknown key"),
        ({"metrics": {"R@1": "70.3"}}, "non-numeric"),
        ({"metrics": {"R@1": 0.703, "MAP": 1}}, "not R@<K> or NMI"),
        ({"method": "foo"}, "unknown method"),
        ({"embedding_dim": "512"}, "embedding_dim"),
    ],
)
def test_paper_numbers_validation_names_the_entry(tmp_path: Path, change: dict, message: str) -> None:
    entry = {
        "method": "mpn", "dataset": "cub200", "paper": "p.txt", "table": "Table 1", "row": "Ours",
        "backbone": "ResNet-50", "embedding_dim": 512, "primary": True, "metrics": {"R@1": 70.3},
    }  # fmt: skip
    good = {"papers": {"p.txt": {"short": "P", "title": "T"}}, "entries": [entry]}
    path = tmp_path / "numbers.yaml"
    path.write_text(json.dumps(good))
    assert len(load_paper_numbers(path)) == 1
    path.write_text(json.dumps({**good, "entries": [entry, {**entry, **change}]}))
    with pytest.raises(PaperNumbersError, match=message) as info:
        load_paper_numbers(path)
    assert "entry 1" in str(info.value) and str(path) in str(info.value)


def test_paper_numbers_reject_two_primaries(tmp_path: Path) -> None:
    entry = {
        "method": "mpn", "dataset": "cub200", "paper": "p.txt", "table": "Table 1", "row": "Ours",
        "backbone": None, "embedding_dim": None, "primary": True, "metrics": {"R@1": 70.3},
    }  # fmt: skip
    data = {"papers": {"p.txt": {"short": "P", "title": "T"}}, "entries": [entry, {**entry, "row": "Ours 2"}]}
    path = tmp_path / "numbers.yaml"
    path.write_text(json.dumps(data))
    with pytest.raises(PaperNumbersError, match="second primary"):
        load_paper_numbers(path)


# ------------------------------------------------------------- build_report


def test_build_report_writes_table_and_plots(tmp_path: Path, two_by_two: list[RunDir]) -> None:
    spec = spec_for(["synthetic"], ["a", "b"], ["R@1", "R@2"])
    out = tmp_path / "out"
    build_report(
        two_by_two,
        spec,
        SETTINGS,
        table_path=out / "table1.tex",
        curves_png=out / "curves.png",
        recall_png=out / "recall.png",
        label="tab:main",
    )
    tex = (out / "table1.tex").read_text()
    assert "Clean protocol" in tex and "paper:" not in tex
    assert sorted(p.name for p in out.iterdir()) == [
        "curves.png",
        "recall.png",
        "table1.csv",
        "table1.html",
        "table1.md",
        "table1.tex",
    ]


def test_build_report_rejects_seeds_that_contradict_the_caption(tmp_path: Path, two_by_two: list[RunDir]) -> None:
    spec = spec_for(["synthetic"], ["a", "b"], ["R@1"])
    kwargs = {"table_path": tmp_path / "t.tex", "curves_png": tmp_path / "c.png", "recall_png": tmp_path / "r.png"}
    with pytest.raises(ValueError, match="other seeds"):
        build_report(two_by_two, spec, {**SETTINGS, "seeds": [0, 1, 2]}, label="t", **kwargs)
    with pytest.raises(ValueError, match="not part of the table"):
        build_report(two_by_two, spec_for(["synthetic"], ["a"], ["R@1"]), SETTINGS, label="t", **kwargs)
    assert not any(tmp_path.glob("*.tex"))


def test_aggregate_std_is_sample_std(two_by_two: list[RunDir]) -> None:
    summary = aggregate_over_seeds(collect_runs(two_by_two)).set_index(["method", "metric"])
    assert summary.loc[("a", "R@1"), "std"] == pytest.approx(math.sqrt(2 * 0.01**2 / 1))
    assert summary.loc[("a", "R@1"), "n"] == 2


# ------------------------------------------------------------- mechanism health


def test_a_run_whose_mechanism_did_not_engage_marks_every_cell_of_its_method(tmp_path: Path) -> None:
    """Method a: seed 1 has uniform attention (entropy ratio 0.999 > 0.95) → its cells carry the dagger
    and the caption names the seed, the bound and its meaning; method b passes in both seeds."""
    from dmlbench.methods.health import HealthCheck

    runs = [
        make_run(tmp_path / "runs", "synthetic", m, s, {"R@1": 0.5, "R@2": 0.6, "health/entropy_ratio": ratio})
        for (m, s), ratio in {("a", 0): 0.4, ("a", 1): 0.999, ("b", 0): 0.3, ("b", 1): 0.5}.items()
    ]
    check = HealthCheck("health/entropy_ratio", maximum=0.95, meaning="attention stays uniform")
    spec = spec_for(["synthetic"], ["a", "b"], ["R@1", "R@2"])
    out = tmp_path / "out"
    dead = build_report(
        runs,
        spec,
        SETTINGS,
        table_path=out / "t.tex",
        curves_png=out / "c.png",
        recall_png=out / "r.png",
        label="t",
        health_checks={("synthetic", "a"): [check], ("synthetic", "b"): [check]},
    ).dead
    tex = (out / "t.tex").read_text()
    assert dead == {("synthetic", "a"): ["seed 1: health/entropy_ratio <= 0.95 (got 0.999): attention stays uniform"]}
    assert all(cell.endswith("\\textsuperscript{\\dag}") for cell in table_row(tex, "a"))
    assert not any("dag" in cell for cell in table_row(tex, "b"))
    assert "seed 1: health/entropy\\_ratio \\textless{}= 0.95 (got 0.999): attention stays uniform" in tex


def test_a_health_number_that_was_not_recorded_counts_as_dead(tmp_path: Path, two_by_two: list[RunDir]) -> None:
    from dmlbench.methods.health import HealthCheck
    from dmlbench.report.health import dead_cells

    check = HealthCheck("health/mask_std", minimum=0.05, meaning="masks constant")
    dead = dead_cells(collect_runs(two_by_two), {("synthetic", "b"): [check]})
    assert list(dead) == [("synthetic", "b")] and all("not recorded" in f for f in dead[("synthetic", "b")])


def test_a_health_check_needs_a_bound_in_order() -> None:
    from dmlbench.methods.health import HealthCheck

    with pytest.raises(ValueError, match="give a minimum, a maximum or both"):
        HealthCheck("health/x")
    with pytest.raises(ValueError, match="minimum 1 > maximum 0"):
        HealthCheck("health/x", minimum=1.0, maximum=0.0)


def test_every_trained_method_is_checked_for_init_parity_and_a_reference_row_is_not(params):
    from dmlbench.methods.health import failed_checks
    from dmlbench.report.pipeline import health_checks

    trained = health_checks(params, "synthetic", "triplet", 0)
    assert [c.key for c in trained] == ["health/init_shortfall"]
    assert failed_checks(trained, {"health/init_shortfall": -0.01}) == []
    assert failed_checks(trained, {"health/init_shortfall": 0.025})[0].startswith(
        "health/init_shortfall <= 0.02 (got 0.025)"
    )
    assert all(c.key != "health/init_shortfall" for c in health_checks(params, "synthetic", "untrained", 0))
