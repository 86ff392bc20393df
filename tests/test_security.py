"""Security (issue 28): no name reaches a shell, a regex or a path unchecked.

One name pattern (dmlbench.names, the schema's ``$defs/name``) for every named section, the workflow's
wildcards and the command line; wildcards accept only the names the parameters define; every shell
word built from a wildcard or a path is quoted; writers join names with dmlbench.paths.contained.
Each class is tried on many members, most of them not named in the issue.
"""

from __future__ import annotations

import contextlib
import copy
import io
import re
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
import yaml
from conftest import REPO

from dmlbench.cli import main
from dmlbench.config import ConfigError
from dmlbench.names import NAME_PATTERN, is_name, one_of
from dmlbench.params import load_config, validate_config
from dmlbench.paths import PathOutsideError, contained
from dmlbench.schema import schema

#: hostile names: shell substitution and separators, path climbing, regex metacharacters, a newline
#: (which Python's ``$`` lets through), unicode look-alikes (Cyrillic а, fullwidth ｘ), case, empty.
HOSTILE = [
    "x$(touch PWNED)",
    "x`touch PWNED`",
    "a;touch PWNED",
    "a && b",
    "a|b",
    "a b",
    "a'b",
    'a"b',
    "$HOME",
    "..",
    "../x",
    "a/b",
    "/etc",
    "a\n",
    "a\nb",
    "tаble1",
    "ｘ",
    ".*",
    "a(",
    "[a]",
    "a+",
    "A",
    "-rf",
    "",
    "a\x00b",
]
#: a target per wildcard of the workflow, ``{}`` where the hostile name goes, with a name the tiny
#: overlay below defines for the positive control.
TARGETS = [
    ("data/raw/cub200/{}", "CUB_200_2011.tgz"),
    ("data/raw/{}/CUB_200_2011.tgz", "cub200"),
    ("data/prepared/{}", "synthetic"),
    ("results/runs/{}/triplet/seed0/checkpoint.pt", "synthetic"),
    ("results/runs/synthetic/{}/seed0/embeddings.npz", "triplet"),
    ("results/runs/synthetic/triplet/seed{}/metrics.json", "0"),
    ("results/tables/{}.tex", "table1"),
    ("results/plots/{}.png", "retrieval_grid_best"),
    ("data/pretrained/synthetic/{}.pt", "small_cnn"),
]
#: an overlay under which rule download has targets (cub200's archives).
DOWNLOAD_OVERLAY = {"datasets": {"cub200": {"download": True, "root": None}}}


@pytest.fixture(scope="module")
def workflow(tmp_path_factory: pytest.TempPathFactory):
    """The parsed workflow (its rules with their wildcard constraints), params.yaml + DOWNLOAD_OVERLAY."""
    from snakemake.api import SnakemakeApi
    from snakemake.settings.enums import Quietness
    from snakemake.settings.types import ConfigSettings, DAGSettings, OutputSettings, ResourceSettings

    overlay = tmp_path_factory.mktemp("overlay") / "download.yaml"
    overlay.write_text(yaml.safe_dump(DOWNLOAD_OVERLAY))
    with contextlib.redirect_stdout(io.StringIO()), SnakemakeApi(OutputSettings(quiet={Quietness.ALL})) as api:
        workflow_api = api.workflow(
            resource_settings=ResourceSettings(cores=1),
            config_settings=ConfigSettings(configfiles=[overlay]),
            snakefile=REPO / "Snakefile",
            workdir=REPO,
        )
        yield workflow_api.dag(DAGSettings(targets=set())).workflow_api._workflow


def producers(workflow, target: str) -> list[str]:
    return [rule.name for rule in workflow.rules if rule.output and rule.is_producer(target)]


def test_the_issues_example_runs_nothing(tmp_path: Path):
    """`snakemake 'data/raw/cub200/x$(touch PWNED)'` ran the command substitution; now no rule matches."""
    for name in ("Snakefile", "workflow", "params.yaml"):
        (shutil.copytree if (REPO / name).is_dir() else shutil.copy)(REPO / name, tmp_path / name)
    out = subprocess.run(
        [sys.executable, "-m", "snakemake", "--cores", "1", "data/raw/cub200/x$(touch PWNED)"],
        cwd=tmp_path,
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert not (tmp_path / "PWNED").exists()
    assert out.returncode != 0 and "MissingRuleException" in out.stdout + out.stderr


@pytest.mark.parametrize(("pattern", "good"), TARGETS)
def test_no_rule_produces_a_path_with_a_hostile_name(workflow, pattern: str, good: str):
    assert producers(workflow, pattern.format(good)), "positive control: the defined name has its rule"
    accepted = [name for name in HOSTILE if producers(workflow, pattern.format(name))]
    assert accepted == []


@pytest.mark.parametrize("pattern", [pattern for pattern, _ in TARGETS])
def test_wildcards_accept_only_the_names_the_parameters_define(workflow, pattern: str):
    """Well-formed names that the parameters do not define match no rule either."""
    for name in ("undefined_name", "table1x", "x_table1", "0x"):
        assert producers(workflow, pattern.format(name)) == [], name


def test_every_word_built_from_a_wildcard_or_a_path_is_quoted(workflow):
    """`{wildcards.x}`, `{input}`, `{output}`, `{log}` in every rule's command carry `:q` (shlex.quote)."""
    unquoted = {
        rule.name: words
        for rule in workflow.rules
        if rule.shellcmd
        for words in [re.findall(r"\{((?:wildcards|input|output|log)\b[^}:]*)\}", rule.shellcmd)]
        if words
    }
    assert unquoted == {}


def test_one_of_escapes_regex_metacharacters():
    regex = one_of(["a.b", "c*"])
    assert re.fullmatch(regex, "a.b") and re.fullmatch(regex, "c*")
    assert not re.fullmatch(regex, "axb") and not re.fullmatch(regex, "cc") and not re.fullmatch(one_of([]), "")


def _with_name(config: dict, section: str, name: str) -> dict:
    """``config`` with a section's first entry renamed to ``name`` (claims: the first claim's id)."""
    config = copy.deepcopy(config)
    if section == "claims":
        config["claims"]["items"][0]["id"] = name
    else:
        first = next(iter(config[section]))
        config[section] = {name: config[section][first], **config[section]}
    return config


@pytest.mark.parametrize("section", ["datasets", "methods", "tables", "figures", "pretraining", "claims"])
def test_every_named_section_refuses_a_hostile_name(section: str):
    config = load_config([REPO / "params.yaml"])
    accepted = []
    for name in HOSTILE:
        try:
            validate_config(_with_name(config, section, name))
            accepted.append(name)
        except ConfigError as err:
            assert "is not a valid name: use only lower-case letters" in str(err)
    assert accepted == []


def test_the_pattern_is_the_schemas_and_rejects_a_trailing_newline():
    assert NAME_PATTERN == schema()["$defs"]["name"]["pattern"]
    assert is_name("table1") and not any(is_name(name) for name in HOSTILE)


@pytest.mark.parametrize(
    "argv",
    [
        ["report", "{}"],
        ["summary", "{}"],
        ["figure", "{}"],
        ["prepare", "{}"],
        ["download", "{}"],
        ["train", "--dataset", "{}", "--method", "triplet", "--seed", "0"],
        ["train", "--dataset", "synthetic", "--method", "{}", "--seed", "0"],
        ["pretrain", "--dataset", "{}"],
        ["evaluate", "e.npz", "--out", "m.json", "--dataset", "{}"],
    ],
)
def test_command_line_names_are_checked_before_anything_runs(tmp_path: Path, capsys, monkeypatch, argv: list[str]):
    monkeypatch.chdir(tmp_path)
    for name in [name for name in HOSTILE if not name.startswith("-")]:  # "-rf" is an option to argparse
        with pytest.raises(SystemExit) as exit_:
            main([word.replace("{}", name) for word in argv])
        assert exit_.value.code == 2 and "is not a valid" in capsys.readouterr().err
    assert list(tmp_path.iterdir()) == []


@pytest.mark.parametrize("part", ["../x", "../../etc/passwd", "a/../../b", "/etc/passwd", "a/./../../b"])
def test_contained_refuses_a_path_that_leads_out(tmp_path: Path, part: str):
    with pytest.raises(PathOutsideError, match="would be written outside"):
        contained(tmp_path / "base", part)


@pytest.mark.parametrize("part", ["a", "a/b/c.png", "a/../b", "./a"])
def test_contained_keeps_a_path_inside(tmp_path: Path, part: str):
    assert contained(tmp_path / "base", part) == tmp_path / "base" / part


@pytest.mark.parametrize("archive", ["../../PWNED", "/tmp/PWNED", "a/../../../PWNED"])
def test_download_does_not_write_outside_the_raw_folder(tmp_path: Path, capsys, archive: str):
    assert main(["download", "cub200", "--archive", archive, "--raw-dir", str(tmp_path / "raw")]) == 2
    assert "would be written outside" in capsys.readouterr().err and not (tmp_path / "raw").exists()
