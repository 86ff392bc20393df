"""End to end on a tiny configuration: Snakemake builds table1, DVC reruns only what an edit touches,
and a training process killed with SIGKILL resumes to the same result.

Marked ``slow`` (about three minutes on 2 cores): ``pytest -m "not slow"`` skips them.
"""

from __future__ import annotations

import os
import re
import shutil
import signal
import subprocess
import sys
import time
from pathlib import Path

import pandas as pd
import pytest
import torch
import yaml
from conftest import REPO

from dmlbench.training.checkpoint import RESUME_CHECKPOINT_KEYS, load_checkpoint

pytestmark = pytest.mark.slow
BIN = Path(sys.executable).parent
TINY_PARAMS = {
    "seeds": [0],
    "datasets": {
        "tiny": {
            "kind": "synthetic",
            "label": "Tiny",
            "recall_ks": [1, 2],
            "seed": 3,
            "num_classes": 8,
            "images_per_class": 6,
            "image_size": 32,
            "classes_per_family": 4,
        }
    },
    "training": {
        "device": "cpu",
        "amp": False,
        "deterministic": True,
        "num_workers": 0,
        "cache_images": True,
        "pipeline": "pil",
        "epochs": 2,
        "selection": "val",
        "val_fraction": 0.5,
        "val_split_seed": 0,
        "eval_batch_size": 32,
        "embedding_dim": 8,
        "backbone": {"name": "small_cnn", "width": 4, "pooling": "avg", "freeze_bn": False},
        "image": {"resize": 32, "test_crop": 28, "train_crop": 28, "crop_scale": [0.6, 1.0], "flip": True},
        "sampler": {"classes_per_batch": 2, "images_per_class": 3},
        "optimizer": {"name": "adam", "lr": 0.001, "weight_decay": 0.0},
        "schedule": {"name": "constant"},
    },
    "evaluation": {"chunk_size": 64, "kmeans": {"seed": 0, "niter": 10, "nredo": 1}},
    "methods": {
        "triplet": {"label": "Triplet", "recipe": "baseline", "loss": {"name": "triplet", "margin": 0.2}},
        "norm_softmax": {
            "label": "NormSoftmax",
            "recipe": "baseline",
            "loss": {"name": "norm_softmax", "temperature": 0.05},
        },
    },
    "tables": {"table1": {"datasets": ["tiny"], "methods": ["triplet", "norm_softmax"]}},
}


def run(args: list[str], cwd: Path, timeout: int = 600) -> str:
    env = {**os.environ, "PATH": f"{BIN}{os.pathsep}{os.environ['PATH']}"}
    result = subprocess.run(args, cwd=cwd, env=env, capture_output=True, text=True, timeout=timeout)
    assert result.returncode == 0, f"{args} failed:\n{result.stdout[-3000:]}\n{result.stderr[-3000:]}"
    return result.stdout + result.stderr


def set_param(project: Path, keys: list[str], value) -> None:
    path = project / "params.yaml"
    params = yaml.safe_load(path.read_text())
    node = params
    for key in keys[:-1]:
        node = node[key]
    node[keys[-1]] = value
    path.write_text(yaml.safe_dump(params, sort_keys=False))


@pytest.fixture(scope="module")
def project(tmp_path_factory) -> Path:
    """A copy of the workflow with the tiny params, its own dvc.yaml, and a DVC repository."""
    root = tmp_path_factory.mktemp("project")
    for name in ("Snakefile", "workflow", "src", ".gitignore"):
        source = REPO / name
        (shutil.copytree if source.is_dir() else shutil.copy)(source, root / name)
    (root / "params.yaml").write_text(yaml.safe_dump(TINY_PARAMS, sort_keys=False))
    run([sys.executable, "workflow/scripts/make_dvc_yaml.py"], root)
    run(["git", "init", "-q"], root)
    run([str(BIN / "dvc"), "init", "-q"], root)
    run([str(BIN / "dvc"), "config", "core.analytics", "false"], root)
    commit(root, "workflow")
    return root


def commit(project: Path, message: str) -> None:
    run(["git", "add", "-A"], project)
    run(["git", "-c", "user.name=test", "-c", "user.email=test@example.org", "commit", "-q", "-m", message], project)


def stages_run(output: str) -> set[str]:
    """The stages dvc ran, named ``<group>-<run>`` whether the run is one of a foreach group (``train@tiny-…``)
    or, alone in its group, a stage of its own (``train-tiny-…``)."""
    return {stage.replace("@", "-", 1) for stage in re.findall(r"Running stage '([^']+)'", output)}


def test_dvc_repro_builds_the_table_and_reruns_only_the_edited_method(project: Path):
    dvc = str(BIN / "dvc")
    run([dvc, "repro", "-q"], project)
    table = (project / "results/tables/table1.tex").read_text()
    assert "Triplet" in table and "NormSoftmax" in table and "\\toprule" in table
    for method in ("triplet", "norm_softmax"):
        metrics = yaml.safe_load((project / f"results/runs/tiny/{method}/seed0/metrics.json").read_text())
        assert 0.0 <= metrics["R@1"] <= 1.0
    assert "results/runs/tiny/triplet/seed0/metrics.json" in run([dvc, "metrics", "show"], project)
    run([dvc, "plots", "show", "-o", str(project.parent / "plots")], project)
    assert "results/runs/tiny/triplet/seed0/log.csv" in (project.parent / "plots/index.html").read_text()
    commit(project, "table1")

    triplet = {"train-tiny-triplet-0", "embed-tiny-triplet-0", "evaluate-tiny-triplet-0", "report-table1"}
    assert stages_run(run([dvc, "exp", "run", "-S", "methods.triplet.loss.margin=0.3"], project)) == triplet
    assert "methods.triplet.loss.margin" in run([dvc, "exp", "show", "--md"], project)
    assert "results/runs/tiny/triplet/seed0/metrics.json" in run([dvc, "metrics", "diff"], project)

    set_param(project, ["methods", "norm_softmax", "label"], "Normalised softmax")
    assert stages_run(run([dvc, "repro"], project)) == {"report-table1"}

    with (project / "src/dmlbench/report/latex.py").open("a") as source:  # report code: only the report reruns
        source.write("\n# edited\n")
    assert stages_run(run([dvc, "repro"], project)) == {"report-table1"}


def test_snakemake_reruns_only_the_edited_method(project: Path):
    # DVC's runs leave no Snakemake metadata (the params a job ran with): rebuild under Snakemake first
    built = run([str(BIN / "snakemake"), "--cores", "2", "--forceall", "results/tables/table1.tex"], project)
    # the run ends (onsuccess, on stdout; Snakemake's log is on stderr) with the table it rebuilt, as text
    assert "results/tables/table1.tex (also .csv, .md, .html):" in built
    assert re.search(r"^Triplet +\*?\d+\.\d ± \d+\.\d", built, flags=re.M)
    set_param(project, ["methods", "norm_softmax", "loss", "temperature"], 0.1)
    dry = run([str(BIN / "snakemake"), "-n", "--cores", "1", "results/tables/table1.tex"], project)
    assert "(also .csv, .md, .html)" not in dry  # a dry run prints no table
    jobs = re.findall(r"^rule (\w+):\n(?:.*\n)*?\s+wildcards: (.*)$", dry, flags=re.M)
    assert sorted(rule for rule, _ in jobs) == ["embed", "evaluate", "report", "train"]
    assert all("method=norm_softmax" in wildcards for rule, wildcards in jobs if rule != "report")


def test_sigkilled_training_resumes_to_the_same_result(project: Path):
    common = [
        str(BIN / "dmlbench"),
        "train",
        "--dataset",
        "tiny",
        "--method",
        "norm_softmax",
        "--seed",
        "0",
        "--manifest",
        "data/prepared/tiny/manifest.csv",
        "--config",
        "params.yaml",
        "--no-progress",
        "--threads",
        "1",
    ]
    set_param(project, ["training", "epochs"], 30)  # long enough (about 0.3 s an epoch) to be killed mid-run
    set_param(project, ["training", "sampler", "batches_per_epoch"], 10)
    run([*common, "--out", "full", "--scratch-dir", "scratch_full"], project)

    scratch = project / "scratch_cut" / "last.pt"
    process = subprocess.Popen(
        [*common, "--out", "cut", "--scratch-dir", "scratch_cut"],
        cwd=project,
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
    )
    deadline = time.monotonic() + 300
    while not scratch.exists() and time.monotonic() < deadline:
        time.sleep(0.05)
    process.send_signal(signal.SIGKILL)
    process.wait()
    assert not (project / "cut" / "checkpoint.pt").exists()
    resumed_from = load_checkpoint(scratch, required=RESUME_CHECKPOINT_KEYS)["epoch"]
    assert 1 <= resumed_from < 30

    output = run([*common, "--out", "cut", "--scratch-dir", "scratch_cut"], project)
    assert f"resuming from {scratch.relative_to(project)} after epoch {resumed_from}" in output
    full, cut = load_checkpoint(project / "full/checkpoint.pt"), load_checkpoint(project / "cut/checkpoint.pt")
    for key in full["model"]:
        assert torch.equal(full["model"][key], cut["model"][key]), key
    timing = ["seconds", "images_per_s", "loader_wait_share"]
    pd.testing.assert_frame_equal(
        pd.read_csv(project / "full/log.csv").drop(columns=timing),
        pd.read_csv(project / "cut/log.csv").drop(columns=timing),
    )
