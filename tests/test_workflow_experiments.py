"""Experiment tables and figures in the DAG: derived methods, table seeds, figure jobs and their tracked params."""

from __future__ import annotations

import json
import subprocess
import sys

import yaml
from conftest import REPO

SCRIPT = REPO / "workflow" / "scripts" / "make_dvc_yaml.py"

OVERLAY = {
    "methods": {"margin_wide": {"base": "margin", "label": "Margin, d=128", "training": {"embedding_dim": 128}}},
    "tables": {
        "ablation": {
            "datasets": ["synthetic"],
            "methods": ["margin", "margin_wide"],
            "seeds": [0],
            "metrics": ["R@1", "num_parameters"],
        }
    },
    "figures": {
        "ablation_dim": {
            "kind": "metric_vs_param",
            "dataset": "synthetic",
            "metric": "R@1",
            "x_label": "d",
            "seeds": [0, 1],
            "series": {"Margin": {"margin": 64, "margin_wide": 128}},
        }
    },
}

DUMP_JOBS = f"""
import json, sys
from pathlib import Path
sys.path.insert(0, {str(SCRIPT.parent)!r})
import make_dvc_yaml as m
jobs = m.snakemake_jobs(sys.argv[2:], [Path(sys.argv[1])])
print(json.dumps([dict(rule=j.rule, wildcards=dict(j.wildcards), inputs=j.spec.inputs,
                  params=[key for _, key in j.spec.params])
                  for j in jobs]))
"""


def jobs_for(tmp_path, *targets: str) -> list[dict]:
    overlay = tmp_path / "overlay.yaml"
    overlay.write_text(yaml.safe_dump(OVERLAY))
    out = subprocess.run(
        [sys.executable, "-c", DUMP_JOBS, str(overlay), *targets], cwd=REPO, capture_output=True, text=True, check=True
    )
    return json.loads(out.stdout.strip().splitlines()[-1])


def test_table_seeds_figure_inputs_and_inherited_params(tmp_path):
    jobs = jobs_for(tmp_path, "results/tables/ablation.tex", "results/plots/ablation_dim.png")
    trains = {(j["wildcards"]["method"], j["wildcards"]["seed"]) for j in jobs if j["rule"] == "train"}
    assert trains == {("margin", "0"), ("margin_wide", "0"), ("margin", "1"), ("margin_wide", "1")}
    figure = next(j for j in jobs if j["rule"] == "figure")
    assert set(figure["inputs"]) == {
        f"results/runs/synthetic/{m}/seed{s}/{name}"  # R@1's interval: per query
        for m in ("margin", "margin_wide")
        for s in (0, 1)
        for name in ("metrics.json", "per_query.npz")
    }
    assert {"figures.ablation_dim", "methods.margin_wide.label", "methods.margin.label"} <= set(figure["params"])
    report = next(j for j in jobs if j["rule"] == "report")
    assert {i.split("/")[4] for i in report["inputs"]} == {"seed0"}  # the table's own seeds
    train_wide = next(j for j in jobs if j["rule"] == "train" and j["wildcards"]["method"] == "margin_wide")
    # the derived method's run depends on its own keys and on those of its base
    assert {
        "methods.margin_wide.training",
        "methods.margin_wide.base",
        "methods.margin.loss",
        "methods.margin.training",
    } <= set(train_wide["params"])
    assert "methods.margin_wide.label" not in train_wide["params"]


def test_jobs_pass_params_yaml_first_and_overlays_after_it(tmp_path):
    """The CLI merges --config files in order: overlays must come after params.yaml to win."""
    first, second = tmp_path / "first.yaml", tmp_path / "second.yaml"
    first.write_text("seeds: [0]\n")
    second.write_text("seeds: [0]\n")
    out = subprocess.run(
        [
            sys.executable,
            "-m",
            "snakemake",
            "-n",
            "-p",
            "--forceall",
            "results/runs/synthetic/margin/seed0/log.csv",
            "--configfile",
            str(first),
            str(second),
        ],
        cwd=REPO,
        capture_output=True,
        text=True,
        check=True,
    )
    command = next(line for line in out.stdout.splitlines() if "dmlbench train" in line)
    assert (
        command.index("--config params.yaml") < command.index(f"--config {first}") < command.index(f"--config {second}")
    )


def test_paper_overlay_plans_every_table_run():
    """`snakemake -n` with the paper overlay builds, and every dataset × method × seed of its tables is planned."""
    from dmlbench.params import load_config

    overlay = REPO / "workflow" / "overlays" / "paper.yaml"
    config = load_config([REPO / "params.yaml", overlay])
    targets = [f"results/tables/{t}.tex" for t in config["tables"]]
    out = subprocess.run(
        [sys.executable, "-c", DUMP_JOBS, str(overlay), *targets], cwd=REPO, capture_output=True, text=True, check=True
    )
    jobs = json.loads(out.stdout.strip().splitlines()[-1])
    planned = {
        (j["wildcards"]["dataset"], j["wildcards"]["method"], j["wildcards"]["seed"])
        for j in jobs
        if j["rule"] in ("evaluate",)
    }
    expected = {
        (d, m, str(s))
        for t in config["tables"].values()
        for d in t["datasets"]
        for m in t["methods"]
        for s in t.get("seeds", config["seeds"])
    }
    assert expected <= planned
    assert {"cub200", "cars196", "sop", "inshop"} <= {d for d, _, _ in planned}
