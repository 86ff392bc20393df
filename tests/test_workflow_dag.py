"""The two DAGs: dvc.yaml is generated from the Snakefile, is fresh, and DVC reads the same jobs."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

from conftest import REPO

SCRIPT = REPO / "workflow" / "scripts" / "make_dvc_yaml.py"
CODE_DEPS = {"src/dmlbench", "Snakefile", "workflow/rules"}

DUMP_JOBS = f"""
import json, sys
sys.path.insert(0, {str(SCRIPT.parent)!r})
import make_dvc_yaml as m
jobs = m.snakemake_jobs(m.default_targets())
print(json.dumps([dict(rule=j.rule, name=j.stage_name, inputs=j.inputs, outputs=j.outputs, logs=j.logs,
                       params=j.params) for j in jobs]))
"""


@pytest.fixture(scope="module")
def snakemake_jobs() -> list[dict]:
    out = subprocess.run([sys.executable, "-c", DUMP_JOBS], cwd=REPO, capture_output=True, text=True, check=True)
    return json.loads(out.stdout.strip().splitlines()[-1])


@pytest.fixture(scope="module")
def dvc_stages() -> dict[str, dict]:
    from dvc.repo import Repo

    repo = Repo(str(REPO))
    stages = {}
    for stage in repo.index.stages:
        stages[stage.name] = {
            "deps": {str(d.def_path) for d in stage.deps if not hasattr(d, "params")} - CODE_DEPS,
            "params": {key for d in stage.deps if hasattr(d, "params") for key in d.params},
            "outs": {str(o.def_path) for o in stage.outs},
            "upstream": {s.name for s in repo.index.graph.successors(stage)},
        }
    return stages


def test_dvc_yaml_is_fresh():
    result = subprocess.run([sys.executable, str(SCRIPT), "--check"], cwd=REPO, capture_output=True, text=True)
    assert result.returncode == 0, result.stderr


def test_one_stage_per_job_with_the_same_inputs_outputs_and_params(snakemake_jobs, dvc_stages):
    assert {j["name"] for j in snakemake_jobs} == set(dvc_stages)
    for job in snakemake_jobs:
        stage = dvc_stages[job["name"]]
        assert stage["deps"] == set(job["inputs"]), job["name"]
        assert stage["outs"] == set(job["outputs"]) | set(job["logs"]), job["name"]
        assert stage["params"] == set(job["params"]), job["name"]


def test_dependency_edges_agree(snakemake_jobs, dvc_stages):
    producer = {out: job["name"] for job in snakemake_jobs for out in job["outputs"]}
    for job in snakemake_jobs:
        upstream = {producer[i] for i in job["inputs"] if i in producer}
        assert dvc_stages[job["name"]]["upstream"] == upstream, job["name"]


def test_each_run_has_train_embed_evaluate_and_tracks_only_its_method(snakemake_jobs):
    from dmlbench.config import load_config, method_chain

    config = load_config([REPO / "params.yaml"])

    def runs_of(rule: str) -> set[tuple[str, str, str]]:
        return {tuple(j["outputs"][0].split("/")[2:5]) for j in snakemake_jobs if j["rule"] == rule}

    evaluated, trained = runs_of("evaluate"), runs_of("train")
    embedded = runs_of("embed") | runs_of("ensemble") | runs_of("reembed")
    tables = {(d, m, f"seed{s}") for t in config["tables"].values() for d in t["datasets"] for m in t["methods"]
              for s in t.get("seeds", config["seeds"])}
    assert tables <= evaluated <= embedded
    assert runs_of("embed") <= trained
    assert not {m for _, m, _ in trained} & {m for m, spec in config["methods"].items()
                                             if "ensemble_members" in spec or "checkpoint_of" in spec}
    for job in (j for j in snakemake_jobs if j["rule"] == "train"):
        method = job["outputs"][0].split("/")[3]
        methods = {p.split(".")[1] for p in job["params"] if p.startswith("methods.")}
        assert methods == set(method_chain(config, method))  # its own section and its bases'
        assert not any(p.endswith(".label") for p in job["params"])  # renaming a method does not retrain it


def test_test_time_variants_reembed_their_base_checkpoint_and_have_no_train_job(snakemake_jobs):
    """`checkpoint_of: mpn` entries (Tables 3/8's MPN-at-test rows): no train job; their embed job reads mpn's
    checkpoint and tracks their own keys; the report reads no training log of theirs."""
    from dmlbench.config import checkpoint_source, load_config

    config = load_config([REPO / "params.yaml"])
    variants = {m: checkpoint_source(config, m) for m in config["methods"] if checkpoint_source(config, m)}
    assert {"mpn_test_rknn", "mpn_test_kmeans", "mpn_test_nn"} <= set(variants)
    assert not {j["outputs"][0].split("/")[3] for j in snakemake_jobs if j["rule"] == "train"} & set(variants)
    reembedded = set()
    for job in (j for j in snakemake_jobs if j["rule"] == "reembed"):
        dataset, method, seed = job["outputs"][0].split("/")[2:5]
        assert job["outputs"] == [f"results/runs/{dataset}/{method}/{seed}/embeddings.npz"]
        assert f"results/runs/{dataset}/{variants[method]}/{seed}/checkpoint.pt" in job["inputs"]
        assert {f"methods.{method}.options", f"methods.{method}.checkpoint_of"} <= set(job["params"])
        reembedded.add((dataset, method, seed))
    assert ("synthetic", "mpn_test_rknn", "seed0") in reembedded
    logs = {i for j in snakemake_jobs if j["rule"] in ("report", "figure")
            for i in j["inputs"] if i.endswith("/log.csv")}
    assert not {path.split("/")[3] for path in logs} & set(variants)
