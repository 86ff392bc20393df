"""The two DAGs: dvc.yaml is generated from the Snakefile, is fresh, and DVC reads the same jobs."""

from __future__ import annotations

import json
import re
import subprocess
import sys

import pytest
from conftest import REPO

SCRIPT = REPO / "workflow" / "scripts" / "make_dvc_yaml.py"
REPORT_CODE = "src/dmlbench/report"

DUMP_JOBS = f"""
import json, sys
sys.path.insert(0, {str(SCRIPT.parent)!r})
import make_dvc_yaml as m
jobs = m.snakemake_jobs(m.default_targets())
names = m.stage_names(jobs)
print(json.dumps([dict(rule=j.rule, name=names[j], command=j.spec.command, inputs=j.spec.inputs,
                       outputs=j.spec.outputs, logs=j.spec.logs, params=[key for _, key in j.spec.params],
                       param_files=j.spec.params, code=j.spec.code) for j in jobs]))
"""


@pytest.fixture(scope="module")
def snakemake_jobs() -> list[dict]:
    out = subprocess.run([sys.executable, "-c", DUMP_JOBS], cwd=REPO, capture_output=True, text=True, check=True)
    return json.loads(out.stdout.strip().splitlines()[-1])


@pytest.fixture(scope="module")
def dvc_stages() -> dict[str, dict]:
    """Every stage of dvc.yaml as DVC reads it (foreach groups expanded)."""
    from dvc.repo import Repo

    repo = Repo(str(REPO))
    stages = {}
    for stage in repo.index.stages:
        outs = {str(o.def_path): o for o in stage.outs}
        stages[stage.name] = {
            "cmd": stage.cmd,
            "deps": {str(d.def_path) for d in stage.deps if not hasattr(d, "params")},
            "params": {key for d in stage.deps if hasattr(d, "params") for key in d.params},
            "param_files": {(str(d.def_path), key) for d in stage.deps if hasattr(d, "params") for key in d.params},
            "outs": set(outs),
            "metrics": {path for path, o in outs.items() if o.metric},
            "plots": {path: o.plot for path, o in outs.items() if o.plot},
            "uncached": {path for path, o in outs.items() if not o.use_cache},
            "upstream": {s.name for s in repo.index.graph.successors(stage)},
        }
    return stages


def test_dvc_yaml_is_fresh():
    result = subprocess.run([sys.executable, str(SCRIPT), "--check"], cwd=REPO, capture_output=True, text=True)
    assert result.returncode == 0, result.stderr


def test_one_stage_per_job_with_the_same_command_inputs_outputs_and_params(snakemake_jobs, dvc_stages):
    assert {j["name"] for j in snakemake_jobs} == set(dvc_stages)
    for job in snakemake_jobs:
        stage = dvc_stages[job["name"]]
        assert stage["cmd"] == job["command"], job["name"]
        assert job["command"].split(" && ", 1)[1].startswith("dmlbench "), job["name"]  # the CLI, not Snakemake
        assert stage["deps"] == set(job["inputs"]) | set(job["code"]), job["name"]
        assert stage["outs"] == set(job["outputs"]) | set(job["logs"]), job["name"]
        assert stage["uncached"] == set(job["logs"]), job["name"]
        assert stage["params"] == set(job["params"]), job["name"]
        assert stage["param_files"] == {tuple(pair) for pair in job["param_files"]}, job["name"]


def test_params_are_declared_under_the_file_that_sets_them(snakemake_jobs, dvc_stages):
    """DVC reads params per file: an experiments file's keys are declared under it, params.yaml's under it."""
    from dmlbench.config import defines
    from dmlbench.params import params_sources

    sources = {str(path.relative_to(REPO)): data for path, data in params_sources(REPO / "params.yaml")}
    declared = {pair for stage in dvc_stages.values() for pair in stage["param_files"]}
    assert all(defines(sources[file], key) for file, key in declared)
    assert {
        ("params.yaml", "methods.margin.loss"),
        ("workflow/experiments/dnc.yaml", "methods.dnc.options"),
        ("workflow/experiments/mpn.yaml", "methods.mpn.options"),
        ("params.yaml", "tables.table1"),
        ("workflow/experiments/abe.yaml", "tables.abe_table1"),
    } <= declared


def test_dvc_yaml_is_templated_one_foreach_stage_per_rule_and_template(snakemake_jobs):
    import yaml

    stages = yaml.safe_load((REPO / "dvc.yaml").read_text())["stages"]
    templated = {name: body for name, body in stages.items() if "foreach" in body}
    assert {"train", "embed", "evaluate"} <= set(templated)
    for name in ("train", "embed", "evaluate"):
        assert "${item.method}" in templated[name]["do"]["cmd"], name
    assert sum(len(body.get("foreach", [None])) for body in stages.values()) == len(snakemake_jobs)
    assert len(stages) < len(snakemake_jobs) / 5


def test_dependency_edges_agree(snakemake_jobs, dvc_stages):
    producer = {out: job["name"] for job in snakemake_jobs for out in job["outputs"]}
    for job in snakemake_jobs:
        upstream = {producer[i] for i in job["inputs"] if i in producer}
        assert dvc_stages[job["name"]]["upstream"] == upstream, job["name"]


def test_stages_depend_only_on_the_code_they_import(snakemake_jobs, dvc_stages):
    """Editing report code reruns only report, figure and claims stages; evaluation does not depend on training."""

    def reads_report(deps: set[str]) -> bool:
        return any(dep == REPORT_CODE or dep.startswith(f"{REPORT_CODE}/") for dep in deps)

    depends_on_report = {j["rule"] for j in snakemake_jobs if reads_report(dvc_stages[j["name"]]["deps"])}
    assert depends_on_report == {j["rule"] for j in snakemake_jobs} & {"report", "figure", "claims"}
    code: dict[str, set[str]] = {}
    for job in snakemake_jobs:
        code.setdefault(job["rule"], set()).update(job["code"])
    assert {
        "src/dmlbench/training/trainer.py",
        "src/dmlbench/models/embedder.py",
        "src/dmlbench/losses/registry.py",
        "src/dmlbench/methods/base.py",
        "src/dmlbench/data/manifest.py",
    } <= code["train"]
    assert "src/dmlbench/evaluation/recall.py" in code["evaluate"] or "src/dmlbench/evaluation" in code["evaluate"]
    assert not any(
        path.startswith(("src/dmlbench/training", "src/dmlbench/models", "src/dmlbench/data"))
        for path in code["evaluate"]
    )
    assert all((REPO / path).exists() for paths in code.values() for path in paths)


def stage_code(snakemake_jobs: list[dict], rule: str, method: str) -> set[str]:
    """The code deps of ``rule``'s job for ``method`` on the synthetic dataset, seed 0."""
    job = next(
        j
        for j in snakemake_jobs
        if j["rule"] == rule and j["outputs"][0].split("/")[3] == method and j["outputs"][0].split("/")[4] == "seed0"
    )
    return set(job["code"])


def test_a_train_stage_depends_on_its_own_recipe_loss_and_backbone_modules_only(snakemake_jobs, dvc_stages):
    """Issue 31: editing methods/dnc.py reruns D&C's stages, not triplet's (and a loss edit, its methods' only)."""
    dnc, triplet = stage_code(snakemake_jobs, "train", "dnc"), stage_code(snakemake_jobs, "train", "triplet")
    assert {
        "src/dmlbench/methods/dnc.py",
        "src/dmlbench/methods/dnc_clustering.py",
        "src/dmlbench/models/dnc.py",
        "src/dmlbench/losses/margin.py",
    } <= dnc  # D&C (margin): its recipe, model and loss
    assert "src/dmlbench/losses/triplet.py" in triplet
    assert not any("dnc" in path for path in triplet) and "src/dmlbench/losses/margin.py" not in triplet
    assert "src/dmlbench/losses/triplet.py" not in dnc
    assert "src/dmlbench/methods/dnc.py" in stage_code(snakemake_jobs, "embed", "dnc")
    assert "src/dmlbench/methods/dnc.py" not in stage_code(snakemake_jobs, "embed", "triplet")
    for job in (j for j in snakemake_jobs if j["rule"] in ("train", "embed")):
        assert dvc_stages[job["name"]]["deps"] >= set(job["code"]), job["name"]
    # every train stage group shares one recipe: a D&C stage's deps name dnc.py, no other's do
    from dmlbench.config import resolve_method
    from dmlbench.params import load_config

    config = load_config([REPO / "params.yaml"])
    dnc_methods = {m for m in config["methods"] if resolve_method(config, m).get("recipe") == "dnc"}
    for job in (j for j in snakemake_jobs if j["rule"] == "train"):
        reads_dnc = "src/dmlbench/methods/dnc.py" in dvc_stages[job["name"]]["deps"]
        assert reads_dnc == (job["outputs"][0].split("/")[3] in dnc_methods), job["name"]


def test_the_generator_uses_no_private_snakemake_api():
    """Jobs come from a public dry run (issue 31), not from `_workflow`, `_prepare_dag` and `_build_dag`."""
    assert re.findall(r"\._(?!_)\w+", SCRIPT.read_text()) == []


def test_code_deps_follow_imports_and_module_names_in_strings():
    sys.path.insert(0, str(SCRIPT.parent))
    import make_dvc_yaml as m

    everything = m.code_deps("train")  # no run named: every recipe (named by strings in methods.RECIPES)
    assert {"src/dmlbench/methods/dnc.py", "src/dmlbench/methods/mpn.py"} <= set(everything)
    triplet = m.code_deps("train", (("recipe", "baseline"), ("loss", "triplet"), ("backbone", "small_cnn")))
    assert "src/dmlbench/methods/base.py" in triplet and "src/dmlbench/methods/mpn.py" not in triplet
    assert "src/dmlbench/models/backbones/small_cnn.py" in triplet
    assert "src/dmlbench/models/backbones/resnet.py" not in triplet
    assert not any(path.startswith("src/dmlbench/report") for path in everything)  # config.py's lazy imports
    with pytest.raises(ValueError, match="cmd_nosuch"):
        m.code_deps("nosuch")


def test_templates_give_their_jobs_back():
    sys.path.insert(0, str(SCRIPT.parent))
    import make_dvc_yaml as m

    wildcards = {"dataset": "synthetic", "method": "triplet", "seed": "1"}
    path = "results/runs/synthetic/triplet/seed1/log.csv"
    other = {"dataset": "synthetic", "method": "margin", "seed": "2"}
    literals = m.path_literals([[path], ["results/runs/synthetic/margin/seed2/log.csv"]], [wildcards, other])
    assert literals == {"dataset": {""}, "method": {""}, "seed": {"", "seed"}}
    commands = m.aligned_templates(
        ["train --seed 1 --threads 1 x/seed1", "train --seed 2 --threads 1 x/seed2"], [wildcards, other]
    )
    assert commands == ["train --seed ${item.seed} --threads 1 x/seed${item.seed}"] * 2
    expected = "results/runs/${item.dataset}/${item.method}/seed${item.seed}/log.csv"
    assert m.templated(path, wildcards, literals) == expected
    assert m.templated("methods.triplet_wide.loss", wildcards, literals) == "methods.triplet_wide.loss"
    spec = m.Spec("cmd --threads 1", (path,), (), (), (("params.yaml", "methods.triplet.loss"),))
    template = m.Spec(
        "cmd --threads 1",
        (m.templated(path, wildcards, literals),),
        (),
        (),
        (("params.yaml", m.templated("methods.triplet.loss", wildcards, literals)),),
    )
    assert m.instantiate(template, wildcards) == spec


def test_metrics_are_dvc_metrics_and_training_logs_dvc_plots(snakemake_jobs, dvc_stages):
    for job in snakemake_jobs:
        stage = dvc_stages[job["name"]]
        assert stage["metrics"] == {o for o in job["outputs"] if o.endswith("/metrics.json")}, job["name"]
        runs_logs = {o for o in job["outputs"] if o.startswith("results/runs/") and o.endswith("/log.csv")}
        assert set(stage["plots"]) >= runs_logs, job["name"]
        assert all(stage["plots"][o] == {"x": "epoch", "y": "val_R@1"} for o in runs_logs), job["name"]
    assert any(stage["metrics"] for stage in dvc_stages.values())


def test_each_run_has_train_embed_evaluate_and_tracks_only_its_method(snakemake_jobs):
    from dmlbench.config import method_chain
    from dmlbench.generated import origin_keys
    from dmlbench.params import load_config

    config = load_config([REPO / "params.yaml"])

    def runs_of(rule: str) -> set[tuple[str, str, str]]:
        return {tuple(j["outputs"][0].split("/")[2:5]) for j in snakemake_jobs if j["rule"] == rule}

    evaluated, trained = runs_of("evaluate"), runs_of("train") | runs_of("train_tuned")
    embedded = runs_of("embed") | runs_of("ensemble") | runs_of("reembed")
    tables = {
        (d, m, f"seed{s}")
        for t in config["tables"].values()
        for d in t["datasets"]
        for m in t["methods"]
        for s in t.get("seeds", config["seeds"])
    }
    assert tables <= evaluated <= embedded
    assert runs_of("embed") <= trained
    assert not {m for _, m, _ in trained} & {
        m for m, spec in config["methods"].items() if "ensemble_members" in spec or "checkpoint_of" in spec
    }
    for job in (j for j in snakemake_jobs if j["rule"] in ("train", "train_tuned")):
        method = job["outputs"][0].split("/")[3]
        methods = {p.split(".")[1] for p in job["params"] if p.startswith("methods.")}
        # its own section and its bases', each written one by its keys (a generated one by those that generate it)
        assert methods == {
            m
            for m in method_chain(config, method)
            if all(key.startswith(f"methods.{m}.") for key in origin_keys(config, "methods", m))
        }
        assert not any(p.endswith(".label") for p in job["params"])  # renaming a method does not retrain it


def test_test_time_variants_reembed_their_base_checkpoint_and_have_no_train_job(snakemake_jobs):
    """`checkpoint_of: mpn` entries (Tables 3/8's MPN-at-test rows): no train job; their embed job reads mpn's
    checkpoint and tracks their own keys; the report reads no training log of theirs."""
    from dmlbench.config import checkpoint_source
    from dmlbench.params import load_config

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
    logs = {
        i for j in snakemake_jobs if j["rule"] in ("report", "figure") for i in j["inputs"] if i.endswith("/log.csv")
    }
    assert not {path.split("/")[3] for path in logs} & set(variants)


def test_stage_groups_are_named_after_what_their_jobs_share():
    """A group of one method is ``<rule>_<method>``; a family is named by its common prefix (and a common
    ``_word`` suffix); a name taken already, or a group sharing nothing, falls back to a number."""
    sys.path.insert(0, str(SCRIPT.parent))
    import make_dvc_yaml as m

    def jobs(template: str, *methods: str) -> list:
        return [
            m.Job("train", (("dataset", "d"), ("method", method), ("seed", "0")), None, template) for method in methods
        ]

    groups = m.stage_groups(
        [
            *jobs("a", "dnc_k2", "dnc_k16"),
            *jobs("b", "dnc"),
            *jobs("c", "dnc_families", "dnc_random"),
            *jobs("d", "abe2_nodiv", "abe8_nodiv"),
            *jobs("e", "heads1", "abe1"),
            *jobs("f", "triplet", "margin"),
        ]
    )
    methods = {name: sorted({dict(job.wildcards)["method"] for job in members}) for name, members in groups.items()}
    assert methods == {
        "train": ["abe1", "heads1"],
        "train_2": ["margin", "triplet"],
        "train_abe_nodiv": ["abe2_nodiv", "abe8_nodiv"],
        "train_dnc": ["dnc"],
        "train_dnc_2": ["dnc_families", "dnc_random"],
        "train_dnc_k": ["dnc_k16", "dnc_k2"],
    }
    assert list(m.stage_groups(jobs("a", "dnc_k2", "dnc_k16"))) == ["train"]  # a rule's only group: the rule's name


def test_dvc_yaml_names_the_table1_baselines_groups_after_their_method():
    import yaml
    from conftest import REPO as repo

    stages = yaml.safe_load((repo / "dvc.yaml").read_text())["stages"]
    for method in ("margin", "triplet", "dnc", "deml"):
        assert {item["method"] for item in stages[f"train_{method}"]["foreach"].values()} == {method}
