"""Tests of the claims table: verdicts from the paired seed × query bootstrap (order and equivalence claims,
per-query and per-run keys, fixed reference values), dead mechanisms, outputs, config errors."""

from __future__ import annotations

import json
import math
from pathlib import Path

import numpy as np
import pandas as pd
import pytest

from dmlbench.config import ConfigError
from dmlbench.methods.health import HealthCheck
from dmlbench.params import merge_params, validate_config
from dmlbench.report.claims import (
    CONTRADICTED,
    INCONCLUSIVE,
    NOT_RUN,
    SUPPORTED,
    Claim,
    claim_runs,
    claims_caption,
    claims_of,
    evaluate_claims,
    render_latex,
    render_markdown,
    verdict,
    write_claims,
)
from dmlbench.report.collect import RunDir, collect_runs
from dmlbench.report.latex import render_comparison_table
from dmlbench.report.spec import TableSpec
from dmlbench.report.summary import CELL_COLUMNS
from dmlbench.report.summary import render_markdown as table_markdown

PARAMS = Path(__file__).resolve().parents[1] / "params.yaml"
SEEDS = (0, 1, 2)


def write_run(
    root: Path,
    method: str,
    seed: int,
    hits: dict[str, list[int]] | None = None,
    metrics: dict[str, float] | None = None,
) -> None:
    """A run with metrics.json and per_query.npz: ``hits`` maps a view prefix ("" or "scale2/") to the
    queries' R@1 hits (1: first hit at rank 1, 0: at rank 2); ``metrics``: other metrics.json keys."""
    path = root / "synthetic" / method / f"seed{seed}"
    path.mkdir(parents=True)
    hits = hits or {}
    arrays = {"row": np.arange(len(next(iter(hits.values()), [0])), dtype=np.int64)}
    values = dict(metrics or {})
    for prefix, view in hits.items():
        arrays[f"{prefix}first_hit_rank"] = np.where(np.array(view) == 1, 1, 2).astype(np.int64)
        values[f"{prefix}R@1"] = float(np.mean(view))
    np.savez(path / "per_query.npz", **arrays)
    (path / "metrics.json").write_text(json.dumps(values))


def run_claims(root: Path, claims: list[Claim]) -> pd.DataFrame:
    """evaluate_claims on the runs under ``root`` that the claims read, indexed by claim id."""
    keys = sorted({(m, s) for c in claims for m, _ in c.sides for s in c.seeds})
    runs = [RunDir("synthetic", m, s, root / "synthetic" / m / f"seed{s}") for m, s in keys]
    return evaluate_claims(claims, collect_runs(runs), runs, {}).set_index("id")


def order(claim_id: str, higher: str, lower: str, metric: str = "R@1", seeds=SEEDS, **extra) -> Claim:
    return Claim(
        claim_id,
        "P",
        f"{higher} > {lower}",
        "",
        metric,
        higher,
        lower,
        tuple(seeds),
        lower_metric=extra.pop("lower_metric", metric),
        **extra,
    )


def test_clear_differences_are_supported_or_contradicted(tmp_path: Path) -> None:
    """a hits every query, b none, in 3 seeds: every replicate has d = 1 (a > b) or −1 (b > a)."""
    for seed in SEEDS:
        write_run(tmp_path, "a", seed, {"": [1, 1, 1, 1]})
        write_run(tmp_path, "b", seed, {"": [0, 0, 0, 0]})
    table = run_claims(tmp_path, [order("ab", "a", "b"), order("ba", "b", "a")])
    assert table.loc["ab", "verdict"] == SUPPORTED and table.loc["ba", "verdict"] == CONTRADICTED
    assert table.loc["ab", ["difference", "difference_low", "difference_high"]].tolist() == [1.0, 1.0, 1.0]
    assert table.loc["ab", "p_not_higher"] == 0.0 and table.loc["ba", "p_not_higher"] == 1.0
    assert table.loc["ab", "queries"] == 4


def test_query_noise_makes_inconclusive_what_the_old_rule_called_a_clear_yes(tmp_path: Path) -> None:
    """Every seed: a hits [1, 1, 1, 0], b [1, 0, 0, 1], so per-query d = [0, 1, 1, −1], mean 0.25 and
    std over seeds 0 for both: the old rule (sign of the mean, 'within noise' only if |d| ≤ the larger
    seed std = 0) said a plain "yes". A replicate sums 12 draws of d (+1 w.p. 1/2, −1 and 0 w.p. 1/4):
    mean 3, sd √(12 · 0.6875) ≈ 2.87, so P(d ≤ 0) ≈ 0.11 > α = 0.05: inconclusive."""
    for seed in SEEDS:
        write_run(tmp_path, "a", seed, {"": [1, 1, 1, 0]})
        write_run(tmp_path, "b", seed, {"": [1, 0, 0, 1]})
    row = run_claims(tmp_path, [order("ab", "a", "b")]).loc["ab"]
    assert row.difference == pytest.approx(0.25)
    assert row.verdict == INCONCLUSIVE and 0.05 < row.p_not_higher < 0.2


@pytest.mark.parametrize(
    ("b_hits", "margin", "expected"),
    [([1, 1, 0, 0], 0.05, SUPPORTED), ([0, 0, 0, 0], 0.05, CONTRADICTED), ([1, 1, 1, 0], 0.25, INCONCLUSIVE)],
)
def test_equivalence_inside_and_outside_the_margin(
    tmp_path: Path, b_hits: list[int], margin: float, expected: str
) -> None:
    """a hits [1, 1, 0, 0] in 3 seeds. b the same: d ≡ 0, inside ±0.05: supported. b none: d = 0.5 in every
    replicate, wholly outside ±0.05: contradicted. b [1, 1, 1, 0]: per-query d = [0, 0, −1, 0], so a
    replicate's d = −(share of its 12 query draws that hit query 2), mean −0.25 = −margin: P(d ≤ −0.25) =
    P(≥ 3 of 12 draws) ≈ 0.61 and P(d ≥ −0.25) = P(≤ 3 of 12) ≈ 0.65, both ≥ α: inconclusive."""
    for seed in SEEDS:
        write_run(tmp_path, "a", seed, {"": [1, 1, 0, 0]})
        write_run(tmp_path, "b", seed, {"": b_hits})
    claim = Claim("eq", "P", "a ≈ b", "", "R@1", "a", "b", SEEDS, lower_metric="R@1", margin=margin)
    row = run_claims(tmp_path, [claim]).loc["eq"]
    assert row.kind == "≈" and row.verdict == expected


@pytest.mark.parametrize(
    ("difference", "margin", "expected"),
    [
        ([0.01] * 19 + [-0.01], None, INCONCLUSIVE),  # P(d ≤ 0) = 0.05, not below α
        ([0.01] * 39 + [-0.01], None, SUPPORTED),  # 0.025
        ([-0.01] * 39 + [0.01], None, CONTRADICTED),
        ([0.0] * 40, None, INCONCLUSIVE),  # identical sides
        ([0.009] * 39 + [0.011], 0.01, SUPPORTED),  # P(d ≥ 0.01) = 0.025
        ([0.009] * 19 + [0.011], 0.01, INCONCLUSIVE),  # 0.05
        ([-0.02] * 40, 0.01, CONTRADICTED),
    ],
)
def test_verdict_reads_the_one_sided_shares(difference: list[float], margin: float | None, expected: str) -> None:
    assert verdict(np.array(difference), margin) == expected


def test_per_run_keys_resample_seeds_only_and_one_seed_is_inconclusive(tmp_path: Path) -> None:
    """self_similarity has no per-query values: with one seed 0.9 vs 0.1 there is no spread (inconclusive);
    with 3 seeds, each higher value above every lower one, every seed replicate has d ≥ 0.6 (supported)."""
    for seed, (high, low) in zip(SEEDS, [(0.9, 0.1), (0.8, 0.2), (0.85, 0.15)]):
        write_run(tmp_path, "nodiv", seed, {"": [1]}, {"self_similarity": high})
        write_run(tmp_path, "div", seed, {"": [1]}, {"self_similarity": low})
    table = run_claims(
        tmp_path,
        [
            order("one", "nodiv", "div", "self_similarity", seeds=(0,)),
            order("three", "nodiv", "div", "self_similarity"),
        ],
    )
    assert table.loc["one", "verdict"] == INCONCLUSIVE and np.isnan(table.loc["one", "higher_ci_low"])
    assert table.loc["one", "difference"] == pytest.approx(0.8) and table.loc["one", "queries"] == 0
    assert table.loc["three", "verdict"] == SUPPORTED and table.loc["three", "difference_low"] >= 0.6 - 1e-12


def test_a_fixed_lower_value_and_two_views_of_one_method(tmp_path: Path) -> None:
    """health ratio 1.5, 1.6, 1.4 against uniform attention (1.0): every replicate ≥ 1.4, supported, and the
    lower side has no interval. scale2 hits [1, 1, 1, 1], scale0 [1, 0, 1, 0] in one seed, paired per query:
    d = share of the 4 query draws on queries 1 and 3, so P(d ≤ 0) = 0.5⁴ = 0.0625 ≥ α: inconclusive."""
    for seed, ratio in zip(SEEDS, (1.5, 1.6, 1.4)):
        write_run(
            tmp_path,
            "mpn",
            seed,
            {"": [1, 0, 1, 0], "scale0/": [1, 0, 1, 0], "scale2/": [1, 1, 1, 1]},
            {"health/same_class_attention_ratio": ratio},
        )
    attention = Claim(
        "att",
        "MPN",
        "ratio > 1",
        "",
        "health/same_class_attention_ratio",
        "mpn",
        None,
        SEEDS,
        lower_metric="health/same_class_attention_ratio",
        lower_value=1.0,
    )
    scales = Claim("sc", "DeML", "fine > coarse", "", "scale2/R@1", "mpn", "mpn", (0,), lower_metric="scale0/R@1")
    table = run_claims(tmp_path, [attention, scales])
    assert table.loc["att", "verdict"] == SUPPORTED and table.loc["att", "difference"] == pytest.approx(0.5)
    assert np.isnan(table.loc["att", "lower_ci_low"]) and table.loc["att", "lower"] == ""
    assert table.loc["sc", "difference"] == pytest.approx(0.5) and table.loc["sc", "queries"] == 4
    assert table.loc["sc", "p_not_higher"] == pytest.approx(0.5**4, abs=0.03)
    assert table.loc["sc", "verdict"] == INCONCLUSIVE


def test_a_missing_metric_names_the_method_key_and_seeds(tmp_path: Path) -> None:
    write_run(tmp_path, "a", 0, {"": [1]}, {"self_similarity": 0.1})
    write_run(tmp_path, "b", 0, {"": [1]})
    with pytest.raises(ConfigError, match=r"b has no 'self_similarity' in metrics.json of seed\(s\) \[0\]"):
        run_claims(tmp_path, [order("x", "a", "b", "self_similarity", seeds=(0,))])


def make_config() -> dict:
    config = merge_params([PARAMS])
    config["claims"] = {
        "dataset": "synthetic",
        "items": [
            {
                "id": "abe_vs_heads",
                "paper": "ABE",
                "claim": "ABE-8 > 8-heads",
                "reported": "60.6 vs 56.0 (Tab. 1)",
                "metric": "R@1",
                "higher": "abe8",
                "lower": "heads8",
                "seeds": [0, 1],
            },
        ],
    }
    return config


def test_write_claims_writes_three_files_and_marks_a_dead_side(tmp_path: Path) -> None:
    """abe8 hits every query, heads8 none (2 seeds): 100.0 ± 0.0 vs 0.0 ± 0.0, difference 100 [100, 100]."""
    runs = tmp_path / "runs"
    for seed in (0, 1):
        write_run(runs, "abe8", seed, {"": [1, 1, 1]}, {"health/mask_std": 0.01})
        write_run(runs, "heads8", seed, {"": [0, 0, 0]})
    checks = {"abe8": [HealthCheck("health/mask_std", minimum=0.05, meaning="masks constant")], "heads8": []}
    table = write_claims(make_config(), runs, tmp_path / "out", checks)
    assert table.loc[0, "difference"] == pytest.approx(1.0) and bool(table.loc[0, "higher_dead"])
    markdown = (tmp_path / "out" / "claims.md").read_text()
    assert (
        "| ABE | ABE-8 > 8-heads | 60.6 vs 56.0 (Tab. 1) | 100.0 ± 0.0 † | 0.0 ± 0.0 | 100.0 [100.0, 100.0] "
        "| supported |"
    ) in markdown
    assert "\\textsuperscript{\\dag}" in (tmp_path / "out" / "claims.tex").read_text()
    assert pd.read_csv(tmp_path / "out" / "claims.csv")["verdict"].tolist() == [SUPPORTED]


def test_claim_runs_lists_each_run_once_and_claims_seeds_override_the_items(tmp_path: Path) -> None:
    config = make_config()
    config["claims"]["items"].append({**config["claims"]["items"][0], "id": "again"})
    assert [(r.method, r.seed) for r in claim_runs(config, tmp_path)] == [
        ("abe8", 0),
        ("abe8", 1),
        ("heads8", 0),
        ("heads8", 1),
    ]
    config["claims"]["seeds"] = [2]
    assert {c.seeds for c in claims_of(config)[1]} == {(2,)}
    assert [(r.method, r.seed) for r in claim_runs(config, tmp_path)] == [("abe8", 2), ("heads8", 2)]


def test_the_cub_lite_overlay_moves_the_claims_to_cub200_on_three_seeds() -> None:
    config = merge_params([PARAMS, PARAMS.parent / "workflow" / "overlays" / "cub_lite.yaml"])
    dataset, claims = claims_of(config)
    assert dataset == "cub200" and {c.seeds for c in claims} == {(0, 1, 2)} and len(claims) >= 25


@pytest.mark.parametrize(
    ("edit", "message"),
    [
        (lambda c: c["claims"]["items"][0].update(higher="abe9"), r"claims.items\[0\].higher = 'abe9' is not defined"),
        (
            lambda c: c["claims"]["items"].append(dict(c["claims"]["items"][0])),
            r"claims.items\[1\].id = 'abe_vs_heads' is used twice",
        ),
        (lambda c: c["claims"].update(dataset="nowhere"), r"datasets.nowhere"),
        (lambda c: c["tables"].update(claims=c["tables"]["table1"]), r"tables.claims: the name 'claims' belongs"),
        (lambda c: c["claims"]["items"][0].pop("metric"), r"claims.items.0: 'metric' is a required property"),
        (
            lambda c: c["claims"]["items"][0].update(lower_value=1.0),
            r"claims.items\[0\] \(abe_vs_heads\): give exactly one of 'lower'",
        ),
        (lambda c: c["claims"]["items"][0].pop("lower"), r"give exactly one of 'lower' \(a method\) and 'lower_value'"),
        (lambda c: c["claims"]["items"][0].update(margin=0), r"claims.items.0.margin"),
    ],
)
def test_bad_claims_are_config_errors_naming_the_key(edit, message: str) -> None:
    config = make_config()
    edit(config)
    with pytest.raises(ConfigError, match=message):
        validate_config(config)


def test_skipped_claims_are_reported_not_run_and_need_no_runs(tmp_path: Path) -> None:
    """Two claims, the second skipped: only the first one's runs exist, its row is measured, the other 'not run'."""
    config = make_config()
    config["claims"]["items"].append({**config["claims"]["items"][0], "id": "skipped", "higher": "abe2"})
    config["claims"].update(skip=["skipped"], skip_reason="too slow here.")
    validate_config(config)
    assert [(r.method, r.seed) for r in claim_runs(config, tmp_path)] == [
        ("abe8", 0),
        ("abe8", 1),
        ("heads8", 0),
        ("heads8", 1),
    ]
    runs = tmp_path / "runs"
    for seed in (0, 1):
        write_run(runs, "abe8", seed, {"": [1, 1, 0]})
        write_run(runs, "heads8", seed, {"": [0, 0, 0]})
    table = write_claims(config, runs, tmp_path / "out", {"abe8": [], "heads8": []}).set_index("id")
    assert table.loc["abe_vs_heads", "verdict"] == SUPPORTED and table.loc["skipped", "verdict"] == NOT_RUN
    assert table.loc["skipped", "seeds"] == 0 and np.isnan(table.loc["skipped", "difference"])
    markdown = (tmp_path / "out" / "claims.md").read_text()
    assert "| ABE | ABE-8 > 8-heads | 60.6 vs 56.0 (Tab. 1) | -- | -- | -- | not run (claims.skip) |" in markdown
    assert markdown.rstrip().endswith("Not run: too slow here.")


def test_skip_must_name_claim_ids() -> None:
    config = make_config()
    config["claims"]["skip"] = ["abe_vs_head"]
    with pytest.raises(ConfigError, match=r"claims.skip names \['abe_vs_head'\], which are not ids"):
        validate_config(config)


def test_the_cub_claims_overlay_runs_25_claims_on_three_seeds_of_its_own_dataset() -> None:
    overlays = PARAMS.parent / "workflow" / "overlays"
    config = merge_params([PARAMS, overlays / "cub_lite.yaml", overlays / "cub_claims.yaml"])
    validate_config(config)
    dataset, claims = claims_of(config)
    measured = [c for c in claims if not c.skipped]
    assert dataset == "cub200_short" and config["datasets"][dataset]["kind"] == "cub200"
    assert len(measured) >= 25 and {c.seeds for c in measured} == {(0, 1, 2)}
    assert all(run.path.parts[-3] == "cub200_short" for run in claim_runs(config, Path("runs")))


def _structure(tex: str) -> list[str]:
    """The skeleton of a rendered float: its lines without rows, caption, label, column specification and rules
    between header rows, ``table*`` read as ``table``."""
    skipped = ("\\caption{", "\\label{", "\\begin{tabular}", "\\cmidrule")
    return [
        line.replace("table*", "table")
        for line in tex.splitlines()
        if " & " not in line and not line.startswith(skipped)
    ]


def test_the_claims_table_is_rendered_as_the_comparison_tables_are() -> None:
    """One claim by hand: higher side R@1 0.613 in [0.609, 0.617] with a failed health check, lower side 0.5 without
    an interval, difference 0.113 in [0.100, 0.125], names with an underscore. A comparison table of the same two
    cells shows them with the same text: 61.3 ± 0.4 and the dagger, 50.0, a\\_b escaped alike, -- where missing,
    in the same booktabs skeleton; the Markdown the same way."""
    claim = {
        "id": "x",
        "paper": "P_1",
        "claim": "a_b > c",
        "reported": "",
        "kind": ">",
        "margin": math.nan,
        "higher": "a_b",
        "higher_metric": "R@1",
        "lower": "c",
        "lower_metric": "R@1",
        "lower_value": math.nan,
        "seeds": 3,
        "queries": 4,
        "higher_mean": 0.613,
        "higher_ci_low": 0.609,
        "higher_ci_high": 0.617,
        "lower_mean": 0.5,
        "lower_ci_low": math.nan,
        "lower_ci_high": math.nan,
        "difference": 0.113,
        "difference_low": 0.1,
        "difference_high": 0.125,
        "p_not_higher": 0.0,
        "verdict": SUPPORTED,
        "higher_dead": True,
        "lower_dead": False,
    }
    claims = pd.DataFrame([claim])
    caption = claims_caption(claims, "Data_set")
    tex, markdown = render_latex(claims, caption), render_markdown(claims, caption)
    assert (
        "P\\_1 & a\\_b \\textgreater{} c & -- & 61.3 $\\pm$ 0.4\\textsuperscript{\\dag} & 50.0 & "
        "11.3 [10.0, 12.5] & supported \\\\"
    ) in tex.splitlines()
    assert "| P_1 | a_b > c | -- | 61.3 ± 0.4 † | 50.0 | 11.3 [10.0, 12.5] | supported |" in markdown.splitlines()
    assert caption.startswith("Claims of the papers, re-measured on Data\\_set. Ours: mean $\\pm$ half-width")
    assert markdown.rstrip().splitlines()[-1].startswith("Claims of the papers, re-measured on Data_set. Ours: mean ±")

    spec = TableSpec(["d"], ["a_b", "c"], {"d": ["R@1"]})
    cells = pd.DataFrame(
        [
            ["d", "d", "a_b", "a_b", "R@1", 0.613, 0.609, 0.617, 3, 4, math.nan, False, True],
            ["d", "d", "c", "c", "R@1", 0.5, math.nan, math.nan, 1, 0, math.nan, False, False],
        ],
        columns=CELL_COLUMNS,
    )
    table_tex = render_comparison_table(cells, spec, "Caption.", "tab:t")
    assert "a\\_b & 61.3 $\\pm$ 0.4\\textsuperscript{\\dag} \\\\" in table_tex.splitlines()
    assert "c & 50.0 \\\\" in table_tex.splitlines()
    assert _structure(tex) == _structure(table_tex)
    assert {"| a_b | 61.3 ± 0.4 † |", "| c | 50.0 |"} <= set(table_markdown(cells, "Caption.").splitlines())
