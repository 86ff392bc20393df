"""Bad input to the Snakemake workflow (issue 28): what Snakemake is told on its command line reaches the
jobs or is refused, and a file dated in the future stops the workflow before it redoes finished work.

The workflow runs (``snakemake -n``) in a copy of ``Snakefile``, ``workflow/`` and ``params.yaml``, so the
files these tests write never touch the repository's ``.snakemake/``, ``data/`` or ``results/``.
"""

from __future__ import annotations

import hashlib
import os
import shlex
import subprocess
import sys
import time
from pathlib import Path

import pytest
import yaml
from conftest import copy_workflow

from dmlbench.config import ConfigError, resolve_run
from dmlbench.params import load_config
from dmlbench.workflow_checks import (
    OVERRIDES_FOLDER,
    configfile_options,
    future_dated_files,
    overrides_overlay,
)

TARGET = "results/runs/synthetic/margin/seed0/log.csv"
#: Snakemake as a command (the script) and as a module: both are Snakemake's own command line.
SNAKEMAKE_SCRIPT = [str(Path(sys.executable).parent / "snakemake")]
SNAKEMAKE_MODULE = [sys.executable, "-m", "snakemake"]


@pytest.fixture(scope="module")
def project(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return copy_workflow(tmp_path_factory.mktemp("workflow"))


def snakemake(project: Path, *args: str, command: list[str] = SNAKEMAKE_MODULE) -> subprocess.CompletedProcess:
    """``snakemake -n -p --forceall TARGET ARGS`` in ``project``."""
    return subprocess.run(
        [*command, "-n", "-p", "--forceall", TARGET, *args],
        cwd=project,
        capture_output=True,
        text=True,
        timeout=300,
        check=False,
    )


def train_command(result: subprocess.CompletedProcess) -> list[str]:
    """The words of the planned `dmlbench train` command, up to its redirection."""
    assert result.returncode == 0, result.stdout[-3000:] + result.stderr[-3000:]
    line = next(line for line in result.stdout.splitlines() if "dmlbench train" in line)
    return shlex.split(line.split(">")[0].removeprefix("Shell command:"))


def config_files(command: list[str]) -> list[str]:
    """The parameter files a dmlbench command gets, in order (the value after each `--config`)."""
    return [command[i + 1] for i, word in enumerate(command) if word == "--config"]


# --- snakemake --config KEY=VALUE ------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("overrides", "overlay", "expected"),
    [
        (["training={device: cpu}"], {"training": {"device": "cpu"}}, {("device",): "cpu"}),
        (
            ["training={selection: last}", "methods={margin: {training: {backbone: {pooling: max}}}}"],
            {"training": {"selection": "last"}, "methods": {"margin": {"training": {"backbone": {"pooling": "max"}}}}},
            {("selection",): "last", ("backbone", "pooling"): "max"},
        ),
    ],
)
def test_config_overrides_reach_the_command_as_a_generated_overlay(
    project: Path, overrides: list[str], overlay: dict, expected: dict
):
    """`--config KEY=VALUE` (one key or two, nested 2 to 5 levels) changed Snakemake's plan only; now the
    command gets them as its last parameter file, named by its content's SHA-256, and the run it resolves
    has the overridden values."""
    files = config_files(train_command(snakemake(project, "--config", *overrides)))
    generated = project / files[-1]
    assert files[:-1] == ["params.yaml"]
    assert generated.parent == project / OVERRIDES_FOLDER
    assert generated.name == f"config_overrides-{hashlib.sha256(generated.read_bytes()).hexdigest()}.yaml"
    assert yaml.safe_load(generated.read_text()) == overlay
    training = resolve_run(load_config([project / file for file in files]), "synthetic", "margin", 0)["training"]
    baseline = resolve_run(load_config([project / "params.yaml"]), "synthetic", "margin", 0)["training"]
    for keys, value in expected.items():
        got, before = training, baseline
        for key in keys:
            got, before = got[key], before[key]
        assert got == value and before != value, keys


@pytest.mark.parametrize(
    ("override", "named"),
    [
        ("bogus=1", "'bogus' was unexpected"),
        ("training={devise: cpu}", "'devise' was unexpected"),
    ],
)
def test_an_override_outside_the_schema_is_refused_naming_the_key_and_the_command_line(
    project: Path, override: str, named: str
):
    result = snakemake(project, "--config", override)
    output = result.stdout + result.stderr
    assert result.returncode != 0
    assert named in output and "+ --config)" in output


@pytest.mark.parametrize("listed", [["workflow/experiments/deml.yaml"], []])
def test_experiments_files_cannot_come_from_the_command_line(tmp_path: Path, listed: list[str]):
    """Experiments files are found relative to the file that lists them: an override has no such file."""
    with pytest.raises(ConfigError, match=r"--config experiments=.*--configfile"):
        overrides_overlay({"experiments": listed, "seeds": [0]}, tmp_path)
    assert list(tmp_path.iterdir()) == []


# --- snakemake --configfile a.yaml --configfile b.yaml ---------------------------------------------------


@pytest.mark.parametrize(
    ("options", "command"),
    [
        (["--configfile", "--configfile"], SNAKEMAKE_SCRIPT),
        (["--configfile", "--configfiles", "--configfile="], SNAKEMAKE_MODULE),
    ],
)
def test_a_repeated_configfile_option_is_refused_and_one_option_takes_every_overlay(
    project: Path, options: list[str], command: list[str]
):
    """Snakemake kept the overlays of the last --configfile only; now a second one is an error that says how
    to give them all, and one --configfile with all of them passes them all, in order."""
    overlays = [f"overlay{i}.yaml" for i in range(len(options))]
    for i, overlay in enumerate(overlays):
        (project / overlay).write_text(f"evaluation: {{chunk_size: {100 + i}}}\n")
    repeated = [
        word
        for option, overlay in zip(options, overlays)
        for word in ([option + overlay] if option.endswith("=") else [option, overlay])
    ]
    result = snakemake(project, *repeated, command=command)
    assert result.returncode != 0
    assert f"--configfile given {len(options)} times" in result.stdout + result.stderr
    assert "give every overlay after one --configfile: --configfile a.yaml b.yaml" in result.stdout + result.stderr
    assert config_files(train_command(snakemake(project, "--configfile", *overlays, command=command))) == [
        "params.yaml",
        *(str(project / overlay) for overlay in overlays),
    ]


@pytest.mark.parametrize(
    ("argv", "options"),
    [
        (
            ["snakemake", "-n", "--configf", "a.yaml", "--configfiles=b.yaml", "--config", "x=1"],
            ["--configf", "--configfiles=b.yaml"],
        ),
        (
            ["/venv/bin/snakemake", "--configfile", "a.yaml", "b.yaml", "--configfile-x", "--config-file"],
            ["--configfile"],
        ),
    ],
)
def test_configfile_options_counts_every_spelling_argparse_accepts(argv: list[str], options: list[str]):
    assert configfile_options(argv) == options


# --- a file dated in the future -----------------------------------------------------------------------------


@pytest.mark.parametrize(
    "future", ["data/prepared/synthetic/manifest.csv", "results/runs/synthetic/margin/seed0/checkpoint.pt"]
)
def test_a_future_dated_file_stops_the_workflow_naming_it_before_any_job(tmp_path: Path, future: str):
    """A manifest or a finished checkpoint dated 2 h ahead made Snakemake take what was made from it (or the
    checkpoint itself) as out of date; now `snakemake -n` stops, naming the file and the fix."""
    project = copy_workflow(tmp_path)
    path = project / future
    path.parent.mkdir(parents=True)
    path.write_text("finished\n")
    ahead = time.time() + 2 * 3600
    os.utime(path, (ahead, ahead))
    result = snakemake(project)
    output = result.stdout + result.stderr
    assert result.returncode != 0
    assert f"  {future} (2.0 h ahead)" in output
    assert "FutureDatedFilesError" in output and "set it right" in output and "touch -c -h -d @" in output


def test_future_dated_files_walks_only_the_levels_rules_read(tmp_path: Path, monkeypatch: pytest.MonkeyPatch):
    """Files and folders up to the given depth and more than the slack ahead are found; an image deeper in a
    prepared dataset and a file within the slack are not."""
    now = 1_000_000.0
    dated = {
        "data/prepared/cub/manifest.csv": now + 3600,  # found: depth 2
        "data/prepared/cub/images/0001.jpg": now + 3600,  # too deep: not walked
        "results/runs/cub/triplet/seed0/metrics.json": now + 61,  # found: depth 5, just beyond the slack
        "results/runs/cub/triplet/seed1/checkpoint.pt": now + 59,  # within the slack
        "results/tables/table1.tex": now,
    }
    monkeypatch.chdir(tmp_path)
    for name in dated:
        Path(name).parent.mkdir(parents=True, exist_ok=True)
        Path(name).write_text("x")
    for path in Path(".").rglob("*"):  # folders too: made now, far after the `now` above
        os.utime(path, (now, now))
    os.utime("data/prepared/cub/images", (now + 7200, now + 7200))  # the folder itself is at depth 2
    for name, mtime in dated.items():
        os.utime(name, (mtime, mtime))
    found = future_dated_files({"data/prepared": 2, "results": 5, "missing": 3}, now=now, slack=60)
    assert [(str(path), round(ahead)) for path, ahead in found] == [
        ("data/prepared/cub/images", 7200),
        ("data/prepared/cub/manifest.csv", 3600),
        ("results/runs/cub/triplet/seed0/metrics.json", 61),
    ]
