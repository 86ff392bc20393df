"""Well-formed inputs that are the wrong ones, and inputs whose size or shape would crash the CLI
(issue 28): a checkpoint used with another dataset's manifest, YAML that expands beyond its limits,
and errors of any type at the command-line boundary. Each ends in one line naming the file and the fix."""

from __future__ import annotations

import re
import shutil
from pathlib import Path

import pandas as pd
import pytest
import torch
import yaml
from conftest import REPO, tiny_run, write_tiny_dataset

import dmlbench.cli as cli
from dmlbench.cli import main
from dmlbench.config import YAML_MAX_DEPTH, YAML_MAX_NODES, ConfigError, load_yaml
from dmlbench.params import load_config
from dmlbench.training.checkpoint import MANIFEST_DIGEST_KEY, MANIFEST_KEY, ManifestMismatchError
from dmlbench.training.embed import embed_run
from dmlbench.training.trainer import train_run


class Interrupted(Exception):
    """Stands for a kill after an epoch."""


def stop_after_first_epoch(epoch: int) -> None:
    raise Interrupted


def other_dataset(manifest: Path) -> Path:
    """Another dataset's manifest (beside ``manifest``'s folder): the same classes, other images."""
    return write_tiny_dataset(manifest.parent.parent / "other", num_classes=12, per_class=5, seed=1)


def one_row_dropped(manifest: Path) -> Path:
    """The same dataset less one image, beside the original images."""
    path = manifest.parent / "one_row_dropped.csv"
    pd.read_csv(manifest).iloc[1:].to_csv(path, index=False)
    return path


def copied(manifest: Path) -> Path:
    """The very same manifest bytes under another name."""
    return Path(shutil.copy(manifest, manifest.parent / "copy.csv"))


@pytest.fixture
def trained(params: dict, tiny_manifest: Path, tmp_path: Path) -> Path:
    """A finished one-epoch run; returns its checkpoint."""
    train_run(tiny_run(params, epochs=1), tiny_manifest, tmp_path / "run", tmp_path / "scratch", progress=False)
    return tmp_path / "run" / "checkpoint.pt"


@pytest.mark.parametrize("wrong", [other_dataset, one_row_dropped])
def test_a_resumed_run_refuses_another_manifest_and_resumes_on_its_own(params, tiny_manifest, tmp_path, wrong):
    run = tiny_run(params, epochs=2)
    scratch = tmp_path / "scratch"
    with pytest.raises(Interrupted):
        train_run(run, tiny_manifest, tmp_path / "out", scratch, progress=False, on_epoch_end=stop_after_first_epoch)
    other = wrong(tiny_manifest)
    with pytest.raises(ManifestMismatchError) as caught:
        train_run(run, other, tmp_path / "out", scratch, progress=False)
    message = str(caught.value)
    assert "\n" not in message
    for part in (str(scratch / "last.pt"), str(tiny_manifest), str(other), "--manifest", "delete"):
        assert part in message
    assert (scratch / "last.pt").is_file() and not (tmp_path / "out").exists()  # nothing lost, nothing written
    assert (
        train_run(run, copied(tiny_manifest), tmp_path / "out", scratch, progress=False).epochs_run_now == 1
    )  # same bytes elsewhere: resumes at epoch 2


@pytest.mark.parametrize("wrong", [other_dataset, one_row_dropped])
def test_embed_refuses_another_manifest(tiny_manifest, tmp_path, trained, wrong):
    other = wrong(tiny_manifest)
    out = tmp_path / "emb.npz"
    with pytest.raises(ManifestMismatchError, match="--manifest") as caught:
        embed_run(trained, other, out)
    assert str(trained) in str(caught.value) and str(other) in str(caught.value) and not out.exists()
    assert embed_run(trained, copied(tiny_manifest), out).is_file()


def test_the_checkpoint_records_the_manifest(tiny_manifest, trained):
    checkpoint = torch.load(trained, weights_only=True)
    assert checkpoint[MANIFEST_KEY] == str(tiny_manifest) and len(checkpoint[MANIFEST_DIGEST_KEY]) == 64


def test_a_checkpoint_from_before_manifests_were_recorded_still_embeds(tiny_manifest, tmp_path, trained):
    checkpoint = torch.load(trained, weights_only=True)
    del checkpoint[MANIFEST_KEY], checkpoint[MANIFEST_DIGEST_KEY]
    torch.save(checkpoint, trained)
    assert embed_run(trained, other_dataset(tiny_manifest), tmp_path / "emb.npz").is_file()


def test_the_cli_embed_with_another_manifest_is_one_line_and_exit_2(tiny_manifest, tmp_path, trained, capsys):
    other = other_dataset(tiny_manifest)
    code = main(["embed", str(trained.parent), "--manifest", str(other), "--out", str(tmp_path / "e.npz")])
    err = capsys.readouterr().err
    assert code == 2 and err.count("\n") == 1 and str(other) in err and "Traceback" not in err


def alias_bomb(kind: str, levels: int = 8) -> str:
    """Ten-fold aliases of aliases: ``10 ** levels`` values from a few lines."""
    if kind == "list":
        return "a0: &a0 [x, x, x, x, x, x, x, x, x, x]\n" + "".join(
            f"a{i}: &a{i} [{', '.join([f'*a{i - 1}'] * 10)}]\n" for i in range(1, levels)
        )
    return "m0: &m0 {a: 1, b: 2}\n" + "".join(
        f"m{i}: &m{i} {{{', '.join(f'k{j}: *m{i - 1}' for j in range(10))}}}\n" for i in range(1, levels)
    )


HOSTILE_YAML = {
    "list_alias_bomb": (alias_bomb("list"), f"{YAML_MAX_NODES:,} values"),
    "mapping_alias_bomb": (alias_bomb("mapping"), f"{YAML_MAX_NODES:,} values"),
    "merge_key_bomb": (
        "b0: &b0 {x: 1, y: 2}\n"
        + "".join(
            f"b{i}: &b{i} {{<<: *b{i - 1}, {', '.join(f'k{j}: *b{i - 1}' for j in range(10))}}}\n" for i in range(1, 8)
        ),
        f"{YAML_MAX_NODES:,} values",
    ),
    "flow_list_5000_deep": ("training: " + "[" * 5000 + "]" * 5000 + "\n", f"deeper than {YAML_MAX_DEPTH}"),
    "block_mapping_3000_deep": (
        "".join("  " * i + f"k{i}:\n" for i in range(3000)) + "  " * 3000 + "v: 1\n",
        f"deeper than {YAML_MAX_DEPTH}",
    ),
    "deep_through_aliases": (
        "d0: &d0 " + "[" * 20 + "]" * 20 + "\nd1: &d1 " + "[" * 20 + "*d0" + "]" * 20 + "\n",
        f"{YAML_MAX_DEPTH} levels",
    ),
    "alias_of_itself": ("a: &a [1, *a]\n", "contains it"),
}


@pytest.mark.parametrize("name", HOSTILE_YAML)
def test_yaml_beyond_the_limits_is_a_prompt_error_naming_the_file(tmp_path, name, capsys):
    text, expected = HOSTILE_YAML[name]
    overlay = tmp_path / f"{name}.yaml"
    overlay.write_text(text)
    with pytest.raises(ConfigError, match=re.escape(expected)) as caught:
        load_config([REPO / "params.yaml", overlay])
    assert str(caught.value).startswith(str(overlay)) and "\n" not in str(caught.value)
    assert main(["list", "methods", "--config", str(REPO / "params.yaml"), "--config", str(overlay)]) == 2
    assert "Traceback" not in capsys.readouterr().err


def test_the_projects_anchors_and_aliases_still_load():
    paper = REPO / "workflow" / "overlays" / "paper.yaml"  # `training: &dnc_training` ... `*dnc_training`
    assert "*dnc_training" in paper.read_text()
    assert load_yaml(paper) == yaml.safe_load(paper.read_text())
    load_config([REPO / "params.yaml", paper])


@pytest.mark.parametrize(
    "error",
    [
        OverflowError("int too large to convert"),
        MemoryError(),
        TypeError("bad operand"),
        RecursionError("maximum recursion depth exceeded"),
        AttributeError("no attribute x"),
    ],
    ids=lambda e: type(e).__name__,
)
@pytest.mark.parametrize("where", ["command", "parser"])
def test_any_error_at_the_cli_boundary_is_one_line_exit_2_and_a_traceback_on_request(monkeypatch, capsys, error, where):
    def fail(*_args):
        raise error

    monkeypatch.setattr(cli, "cmd_list" if where == "command" else "build_parser", fail)
    assert main(["list", "methods"]) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and type(error).__name__ in err and cli.TRACEBACK_ENV in err
    monkeypatch.setenv(cli.TRACEBACK_ENV, "1")
    with pytest.raises(type(error)):
        main(["list", "methods"])


def test_ctrl_c_is_one_line_and_exit_130(monkeypatch, capsys):
    def interrupted(_args):
        raise KeyboardInterrupt

    monkeypatch.setattr(cli, "cmd_list", interrupted)
    assert main(["list", "methods"]) == cli.EXIT_INTERRUPTED == 130
    assert capsys.readouterr().err == "dmlbench list: interrupted\n"


def test_a_missing_key_deep_inside_names_the_files_read(tmp_path, trained, capsys):
    checkpoint = torch.load(trained, weights_only=True)
    del checkpoint["run"]["seed"]
    torch.save(checkpoint, trained)
    assert main(["embed", str(trained.parent), "--out", str(tmp_path / "e.npz")]) == 2
    err = capsys.readouterr().err
    assert "'seed'" in err and str(trained.parent) in err and "re-create" in err and err.count("\n") == 1
