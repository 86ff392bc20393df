"""Experiments files: each paper's methods, tables and figures in workflow/experiments/<paper>.yaml, merged
right after params.yaml (which lists them), before the overlays; an entry is defined by one file only."""

from __future__ import annotations

import json
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
import yaml
from conftest import REPO

from dmlbench.config import EXPERIMENT_SECTIONS, ConfigError, deep_merge, load_yaml, resolve_method
from dmlbench.generated import origin_keys
from dmlbench.params import load_config, merge_params, params_sources

PARAMS = REPO / "params.yaml"
FIRST_EXPERIMENTS_FILE = "workflow/experiments/abe.yaml"


def git(*args: str) -> str:
    return subprocess.run(["git", "-C", str(REPO), *args], capture_output=True, text=True, check=True).stdout


def write_project(root: Path, files: dict[str, dict]) -> Path:
    """YAML files under ``root``; returns its params.yaml."""
    for name, data in files.items():
        (root / name).parent.mkdir(parents=True, exist_ok=True)
        (root / name).write_text(yaml.safe_dump(data, sort_keys=False))
    return root / "params.yaml"


def test_the_split_merges_to_the_single_params_yaml_it_replaced(tmp_path):
    """The commit that added the experiments files moved entries without changing them: its params.yaml with
    its experiments files loads to exactly what its parent's single params.yaml loaded to (before that commit
    is made: the working tree against HEAD)."""
    try:
        added = git("log", "--diff-filter=A", "--format=%H", "--", FIRST_EXPERIMENTS_FILE).split()
    except (OSError, subprocess.CalledProcessError):
        pytest.skip("not a git checkout")
    split, single = (added[-1], f"{added[-1]}^") if added else (None, "HEAD")
    # merged without validation: today's schema may require keys that the historical files predate
    if split is None:
        new = merge_params([PARAMS])
    else:
        split_params = tmp_path / "split" / "params.yaml"
        split_params.parent.mkdir()
        split_params.write_text(git("show", f"{split}:params.yaml"))
        for name in load_yaml(split_params)["experiments"]:
            (split_params.parent / name).parent.mkdir(parents=True, exist_ok=True)
            (split_params.parent / name).write_text(git("show", f"{split}:{name}"))
        new = merge_params([split_params])
    (tmp_path / "params.yaml").write_text(git("show", f"{single}:params.yaml"))
    old = merge_params([tmp_path / "params.yaml"])
    for key in ("methods", "tables", "figures", "claims"):
        assert new[key] == old[key], key
    assert new == old


def test_params_yaml_then_its_experiments_files_each_entry_from_one_file():
    sources = params_sources(PARAMS)
    assert [str(path.relative_to(REPO)) for path, _ in sources] == [
        "params.yaml",
        *(f"workflow/experiments/{paper}.yaml" for paper in ("abe", "deml", "diablo", "dnc", "mpn")),
    ]
    assert "experiments" not in sources[0][1]
    merged = merge_params([PARAMS])
    assert "experiments" not in merged
    for name in EXPERIMENT_SECTIONS:
        owned = [(entry, data[name][entry]) for _, data in sources for entry in data.get(name, {})]
        assert dict(owned) == {entry: merged[name][entry] for entry, _ in owned} and len(owned) == len(dict(owned))
        # the rest are generated (sweeps' points, tuned twins): tracked by the keys that generate them
        generated = set(merged[name]) - dict(owned).keys()
        assert all(not origin_keys(merged, name, entry)[0].startswith(f"{name}.{entry}.") for entry in generated)
    assert {"mpn", "mpn_table3", "mpn_fig5_dim_recall"} <= {
        *sources[-1][1]["methods"],
        *sources[-1][1]["tables"],
        *sources[-1][1]["figures"],
    }


@pytest.mark.parametrize(
    ("files", "message"),
    [
        (
            {
                "params.yaml": {"experiments": ["a.yaml", "b.yaml"], "methods": {}},
                "a.yaml": {"methods": {"x": {"recipe": "baseline"}}},
                "b.yaml": {"methods": {"x": {"recipe": "abe"}}},
            },
            r"b\.yaml: methods\.x is already defined in .*a\.yaml",
        ),
        (
            {"params.yaml": {"experiments": ["a.yaml"], "tables": {"t": {}}}, "a.yaml": {"tables": {"t": {}}}},
            r"a\.yaml: tables\.t is already defined in .*params\.yaml",
        ),
        (
            {"params.yaml": {"experiments": ["a.yaml"]}, "a.yaml": {"datasets": {"d": {}}}},
            r"a\.yaml: an experiments file defines only \['methods', 'tables', 'figures', 'sweeps'\]; it sets \['datasets'\]",
        ),
        ({"params.yaml": {"experiments": "a.yaml"}}, r"params\.yaml: experiments: 'a.yaml' is not of type 'array'"),
        ({"params.yaml": {"experiments": ["missing.yaml"]}}, r"missing\.yaml: parameter file not found"),
    ],
)
def test_an_experiments_file_adds_entries_and_redefines_none(tmp_path, files, message):
    with pytest.raises(ConfigError, match=message):
        merge_params([write_project(tmp_path, files)])


def test_overlays_still_win_over_experiments_files(tmp_path):
    overlay = write_project(tmp_path, {"overlay.yaml": {"methods": {"abe8": {"options": {"learners": 4}}}}}).parent
    config = load_config([PARAMS, overlay / "overlay.yaml"])
    assert resolve_method(config, "abe8")["options"]["learners"] == 4
    assert resolve_method(config, "abe2")["options"]["learners"] == 2  # its own entry still wins over its base
    for name in ("paper", "cub_lite"):  # the shipped overlays restate some experiment methods' settings
        path = REPO / "workflow" / "overlays" / f"{name}.yaml"
        overlay_methods = yaml.safe_load(path.read_text()).get("methods", {})
        merged = load_config([PARAMS, path])["methods"]
        base = merge_params([PARAMS])["methods"]
        for method, section in overlay_methods.items():
            assert merged[method] == deep_merge(base.get(method, {}), section), (name, method)


def tracked_values(config: dict, keys: list[str]) -> dict:
    """What a job's Snakemake params hold (workflow/rules/common.smk, tracked_params): the value of each key."""

    def value(key: str):
        node = config
        for part in key.split("."):
            node = node[part]
        return node

    return {key: value(key) for key in keys}


def downstream(jobs: list[dict], start: list[dict]) -> list[dict]:
    """``start`` and every job that reads, transitively, an output of theirs (what Snakemake reruns)."""
    planned, outputs = list(start), {path for job in start for path in job["outputs"]}
    grown = True  # the jobs come sorted by rule name, not in DAG order: grow to a fixed point
    while grown:
        grown = False
        for job in jobs:
            if job not in planned and outputs & set(job["inputs"]):
                planned.append(job)
                outputs |= set(job["outputs"])
                grown = True
    return planned


@pytest.fixture(scope="module")
def snakemake_jobs() -> list[dict]:
    """Every job of the default targets: rule, wildcards, inputs, outputs and tracked params keys."""
    dump = (
        f"import json, sys; sys.path.insert(0, {str(REPO / 'workflow' / 'scripts')!r}); import make_dvc_yaml as m; "
        "print(json.dumps([dict(rule=j.rule, wildcards=dict(j.wildcards), inputs=j.spec.inputs, "
        "outputs=j.spec.outputs, params=[k for _, k in j.spec.params]) "
        "for j in m.snakemake_jobs(m.default_targets())]))"
    )
    out = subprocess.run([sys.executable, "-c", dump], cwd=REPO, capture_output=True, text=True, check=True)
    return json.loads(out.stdout.strip().splitlines()[-1])


def edited_jobs(tmp_path: Path, jobs: list[dict], paper: str, old: str, new: str) -> tuple[list[dict], list[dict]]:
    """The jobs whose params change when ``old`` becomes ``new`` in experiments/<paper>.yaml (a copy), and
    those and every job downstream of them."""
    project = tmp_path / "project"
    for path, _ in params_sources(PARAMS):
        (project / path.relative_to(REPO)).parent.mkdir(parents=True, exist_ok=True)
        shutil.copy(path, project / path.relative_to(REPO))
    experiments = project / "workflow" / "experiments" / f"{paper}.yaml"
    assert experiments.read_text().count(old) == 1
    experiments.write_text(experiments.read_text().replace(old, new))
    before, after = load_config([PARAMS]), load_config([project / "params.yaml"])
    changed = [job for job in jobs if tracked_values(before, job["params"]) != tracked_values(after, job["params"])]
    return changed, downstream(jobs, changed)


def test_editing_an_experiments_file_reruns_only_that_methods_jobs(tmp_path, snakemake_jobs):
    """Snakemake reruns a job whose params changed and the jobs downstream of it: editing mpn_ce_only in mpn.yaml
    replans mpn_ce_only's runs, the table and the claims that show them, nothing else."""
    changed, planned = edited_jobs(
        tmp_path, snakemake_jobs, "mpn", "    loss: {mpn_weight: 0.0}\n", "    loss: {mpn_weight: 0.5}\n"
    )
    assert {(job["rule"], job["wildcards"]["method"]) for job in changed} == {("train", "mpn_ce_only")}
    runs = {(job["rule"], job["wildcards"]["method"]) for job in planned if "method" in job["wildcards"]}
    assert runs == {("train", "mpn_ce_only"), ("embed", "mpn_ce_only"), ("evaluate", "mpn_ce_only")}
    assert {job["wildcards"].get("table") for job in planned if job["rule"] == "report"} == {"mpn_table3"}
    assert {job["rule"] for job in planned} == {"train", "embed", "evaluate", "report", "claims"}


def test_editing_a_sweep_reruns_its_points_and_nothing_else(tmp_path, snakemake_jobs):
    """A sweep's points are tracked by its keys: turning on the training-recall log of the U<d> sweep replans
    deml_u384, deml_u192 and deml_u64 and the table that shows them."""
    old = '    label: "U{d}"\n    set: {training: {log_train_recall: false, log_test_recall: false}}\n'
    changed, planned = edited_jobs(
        tmp_path, snakemake_jobs, "deml", old, old.replace("log_train_recall: false", "log_train_recall: true")
    )
    points = {"deml_u384", "deml_u192", "deml_u64"}
    assert {(job["rule"], job["wildcards"]["method"]) for job in changed} == {("train", m) for m in points}
    runs = {(job["rule"], job["wildcards"]["method"]) for job in planned if "method" in job["wildcards"]}
    assert runs == {(rule, m) for rule in ("train", "embed", "evaluate") for m in points}
    assert {job["wildcards"].get("table") for job in planned if job["rule"] == "report"} == {"deml_table1"}
