"""Tests of the claims table: direction, noise, dead mechanisms, outputs, config errors."""

from __future__ import annotations

import json
import math
from pathlib import Path

import pandas as pd
import pytest

from dmlbench.config import ConfigError, merge_params, validate_config
from dmlbench.methods.health import HealthCheck
from dmlbench.report.claims import Claim, claim_runs, evaluate_claims, write_claims

PARAMS = Path(__file__).resolve().parents[1] / "params.yaml"


def long_results(values: dict[tuple[str, int], float], metric: str = "R@1") -> pd.DataFrame:
    return pd.DataFrame([("s", m, seed, metric, v) for (m, seed), v in values.items()],
                        columns=["dataset", "method", "seed", "metric", "value"])


def test_direction_and_noise_follow_the_seed_means_and_stds() -> None:
    """a: 0.50, 0.60 (mean 0.55, std 0.0707); b: 0.52, 0.54 (mean 0.53, std 0.0141). Δ = 0.02 ≤ 0.0707:
    the claim a > b holds in direction but within noise; b > a does not hold."""
    frame = long_results({("a", 0): 0.50, ("a", 1): 0.60, ("b", 0): 0.52, ("b", 1): 0.54})
    claims = [Claim("ab", "P", "a > b", "", "R@1", "a", "b", (0, 1)),
              Claim("ba", "P", "b > a", "", "R@1", "b", "a", (0, 1))]
    table = evaluate_claims(claims, frame, {}).set_index("id")
    assert table.loc["ab", "difference"] == pytest.approx(0.02)
    assert table.loc["ab", "higher_std"] == pytest.approx(math.sqrt(0.005))
    assert bool(table.loc["ab", "holds"]) and bool(table.loc["ab", "within_noise"])
    assert not bool(table.loc["ba", "holds"])


def test_one_seed_has_no_noise_estimate() -> None:
    frame = long_results({("a", 0): 0.5, ("b", 0): 0.4})
    row = evaluate_claims([Claim("x", "P", "a > b", "", "R@1", "a", "b", (0,))], frame, {}).iloc[0]
    assert bool(row.holds) and not bool(row.within_noise) and math.isnan(row.higher_std)


def test_a_missing_metric_names_the_method_key_and_seeds() -> None:
    frame = long_results({("a", 0): 0.5, ("b", 0): 0.4})
    with pytest.raises(ConfigError, match=r"b has no 'self_similarity' in metrics.json of seed\(s\) \[0\]"):
        evaluate_claims([Claim("x", "P", "", "", "self_similarity", "b", "a", (0,))],
                        long_results({("a", 0): 0.1}, "self_similarity"), {})


def make_config(tmp_path: Path) -> dict:
    config = merge_params([PARAMS])
    config["claims"] = {"dataset": "synthetic", "items": [
        {"id": "abe_vs_heads", "paper": "ABE", "claim": "ABE-8 > 8-heads", "reported": "60.6 vs 56.0 (Tab. 1)",
         "metric": "R@1", "higher": "abe8", "lower": "heads8", "seeds": [0, 1]},
    ]}
    return config


def write_run(root: Path, method: str, seed: int, metrics: dict) -> None:
    path = root / "synthetic" / method / f"seed{seed}"
    path.mkdir(parents=True)
    (path / "metrics.json").write_text(json.dumps(metrics))


def test_write_claims_writes_three_files_and_marks_a_dead_side(tmp_path: Path) -> None:
    config = make_config(tmp_path)
    runs = tmp_path / "runs"
    for seed, (abe, heads) in enumerate([(0.30, 0.20), (0.32, 0.22)]):
        write_run(runs, "abe8", seed, {"R@1": abe, "health/mask_std": 0.01})
        write_run(runs, "heads8", seed, {"R@1": heads})
    checks = {"abe8": [HealthCheck("health/mask_std", minimum=0.05, meaning="masks constant")], "heads8": []}
    table = write_claims(config, runs, tmp_path / "out", checks)
    assert table.loc[0, "difference"] == pytest.approx(0.10) and bool(table.loc[0, "higher_dead"])
    markdown = (tmp_path / "out" / "claims.md").read_text()
    assert "| ABE | ABE-8 > 8-heads | 60.6 vs 56.0 (Tab. 1) | 31.0 ± 1.4 † | 21.0 ± 1.4 | 10.0 | yes |" in markdown
    assert "\\textsuperscript{\\dag}" in (tmp_path / "out" / "claims.tex").read_text()
    assert pd.read_csv(tmp_path / "out" / "claims.csv")["holds"].tolist() == [True]


def test_claim_runs_lists_each_run_once(tmp_path: Path) -> None:
    config = make_config(tmp_path)
    config["claims"]["items"].append({**config["claims"]["items"][0], "id": "again"})
    runs = claim_runs(config, tmp_path)
    assert [(r.method, r.seed) for r in runs] == [("abe8", 0), ("abe8", 1), ("heads8", 0), ("heads8", 1)]


@pytest.mark.parametrize(("edit", "message"), [
    (lambda c: c["claims"]["items"][0].update(higher="abe9"), r"claims.items\[0\].higher = 'abe9' is not defined"),
    (lambda c: c["claims"]["items"].append(dict(c["claims"]["items"][0])), r"claims.items\[1\].id = 'abe_vs_heads' is used twice"),
    (lambda c: c["claims"].update(dataset="nowhere"), r"datasets.nowhere"),
    (lambda c: c["tables"].update(claims=c["tables"]["table1"]), r"tables.claims: the name 'claims' belongs"),
    (lambda c: c["claims"]["items"][0].pop("metric"), r"claims.items.0: 'metric' is a required property"),
])
def test_bad_claims_are_config_errors_naming_the_key(tmp_path: Path, edit, message: str) -> None:
    config = make_config(tmp_path)
    edit(config)
    with pytest.raises(ConfigError, match=message):
        validate_config(config)
