"""The SLURM profile plans the paper overlay's jobs with their GPU, CPU, memory and time requests.

`snakemake --profile workflow/profiles/slurm -n` runs without SLURM (a dry run calls no sbatch, sinfo or
sacct) but needs the executor plugin, which the `test` extra installs; elsewhere these tests skip.
"""

from __future__ import annotations

import re
import subprocess
import sys

import pytest
import yaml
from conftest import REPO

pytest.importorskip("snakemake_executor_plugin_slurm")

PROFILE = REPO / "workflow" / "profiles" / "slurm"
#: table1 (train, embed, evaluate, report, prepare), its equal-budget twin (tune, train_tuned), MPN's Table 8
#: (reembed) and Table 4 (ensemble), and the paper overlay's pretraining stage (pretrain), which its tables do not
#: use (their backbones are ImageNet's)
TARGETS = [
    "results/tables/table1.tex",
    "results/tables/table1_tuned.tex",
    "results/tables/mpn_table8.tex",
    "results/tables/mpn_table4.tex",
    "data/pretrained/synthetic/resnet50.pt",
]
GPU_RULES = {"train", "train_tuned", "tune", "pretrain", "embed", "reembed"}
CPU_RULES = {"prepare", "evaluate", "ensemble", "report"}
_RULE = re.compile(r"^(?:local)?rule (\w+):$")


def parse_jobs(text: str) -> list[dict]:
    """The dry run's jobs: rule, threads (1 when not printed) and resources (ints where they are ints)."""
    jobs: list[dict] = []
    for line in text.splitlines():
        if match := _RULE.match(line):
            jobs.append({"rule": match.group(1), "threads": 1, "resources": {}})
        elif jobs and line.startswith("    threads: "):
            jobs[-1]["threads"] = int(line.split(": ", 1)[1])
        elif jobs and line.startswith("    resources: "):
            pairs = (item.split("=", 1) for item in line.split(": ", 1)[1].split(", "))
            jobs[-1]["resources"] = {key: int(value) if value.isdigit() else value for key, value in pairs}
    return jobs


@pytest.fixture(scope="module")
def profile() -> dict:
    return yaml.safe_load((PROFILE / "config.yaml").read_text())


@pytest.fixture(scope="module")
def planned() -> list[dict]:
    # A dry run caps threads at --cores (1 when not given); a SLURM run does not, so lift the cap to see them.
    out = subprocess.run(
        [
            sys.executable,
            "-m",
            "snakemake",
            "--profile",
            str(PROFILE.relative_to(REPO)),
            "--configfile",
            "workflow/overlays/paper.yaml",
            "-n",
            "--forceall",
            "--cores",
            "64",
            *TARGETS,
        ],
        cwd=REPO,
        capture_output=True,
        text=True,
        check=False,
    )
    assert out.returncode == 0, out.stdout[-3000:] + out.stderr[-3000:]
    jobs = parse_jobs(out.stdout + out.stderr)
    assert {job["rule"] for job in jobs} == GPU_RULES | CPU_RULES
    assert all(job["resources"] for job in jobs)
    return jobs


def test_profile_uses_the_slurm_executor(profile):
    assert profile["executor"] == "slurm"


def test_gpu_rules_ask_for_one_gpu_their_threads_memory_and_time(planned, profile):
    for job in (j for j in planned if j["rule"] in GPU_RULES):
        rule, resources = job["rule"], job["resources"]
        wanted = profile["set-resources"][rule]
        assert resources.get("gpu") == 1, job
        assert resources["mem_mb"] == wanted["mem_mb"] >= 16000, job
        assert resources["runtime"] == wanted["runtime"], job
        assert resources["slurm_partition"] == wanted["slurm_partition"], job
        assert job["threads"] == profile["set-threads"][rule] > 1, job
    # a training run gets the day and the memory it needs, more than an embedding pass
    train = next(j["resources"] for j in planned if j["rule"] == "train")
    embed = next(j["resources"] for j in planned if j["rule"] == "embed")
    assert train["runtime"] >= 720 and train["mem_mb"] >= embed["mem_mb"]


def test_cpu_rules_ask_for_no_gpu(planned, profile):
    defaults = profile["default-resources"]
    for job in (j for j in planned if j["rule"] in CPU_RULES):
        rule, resources = job["rule"], job["resources"]
        wanted = {**defaults, **profile.get("set-resources", {}).get(rule, {})}
        assert not resources.get("gpu") and "gres" not in resources and "gpu_model" not in resources, job
        assert resources["mem_mb"] == wanted["mem_mb"], job
        assert resources["runtime"] == wanted["runtime"], job
        assert job["threads"] == profile["set-threads"].get(rule, 1), job


def test_the_plugin_turns_the_planned_resources_into_sbatch_options(planned, profile):
    """What the plugin would submit (its own functions, without sbatch): --gpus=1 only for the GPU rules."""
    from snakemake_executor_plugin_slurm.submit_string import get_submit_command
    from snakemake_executor_plugin_slurm.utils import set_gres_string

    class Resources(dict):
        __getattr__ = dict.__getitem__

    def sbatch(rule: str) -> str:
        job = next(j for j in planned if j["rule"] == rule)
        fake = type("Job", (), {"threads": job["threads"], "resources": Resources(job["resources"])})()
        params = {
            "run_uuid": "uuid",
            "slurm_logfile": "slurm.log",
            "comment_str": f"rule_{rule}",
            "account": "",
            "partition": "",
            "workdir": str(REPO),
        }
        return get_submit_command(fake, params) + set_gres_string(fake)

    for rule in ("train", "embed", "evaluate", "report"):
        call, wanted = sbatch(rule), profile["set-resources"][rule]
        assert (" --gpus=1" in call) == (rule in GPU_RULES) and "--gres" not in call, call
        assert f" --mem {wanted['mem_mb']} " in call and f" -t {wanted['runtime']} " in call, call
        assert f" --cpus-per-task={profile['set-threads'].get(rule, 1)}" in call, call
