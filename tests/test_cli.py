"""The command line: clear errors with exit code 2, and each step callable by hand."""

from __future__ import annotations

import argparse
import re
from pathlib import Path

import numpy as np
import pytest
from conftest import REPO

import dmlbench.evaluation as evaluation
from dmlbench import __version__
from dmlbench.cli import build_parser, main
from dmlbench.params import merge_params


def test_unknown_dataset_is_a_clear_error(capsys):
    assert main(["prepare", "imagenet", "--config", str(REPO / "params.yaml")]) == 2
    assert "parameter 'datasets.imagenet' is not defined" in capsys.readouterr().err


def test_bad_params_file_names_the_key(tmp_path: Path, capsys):
    overlay = tmp_path / "o.yaml"
    overlay.write_text("training:\n  epochs: zero\n")
    assert (
        main(
            [
                "train",
                "--dataset",
                "synthetic",
                "--method",
                "triplet",
                "--seed",
                "0",
                "--config",
                str(REPO / "params.yaml"),
                "--config",
                str(overlay),
            ]
        )
        == 2
    )
    assert "training.epochs" in capsys.readouterr().err


def test_missing_manifest_says_to_prepare(tmp_path: Path, capsys):
    assert (
        main(
            [
                "train",
                "--dataset",
                "synthetic",
                "--method",
                "triplet",
                "--seed",
                "0",
                "--config",
                str(REPO / "params.yaml"),
                "--manifest",
                str(tmp_path / "none.csv"),
                "--out",
                str(tmp_path / "run"),
            ]
        )
        == 2
    )
    assert "dmlbench prepare" in capsys.readouterr().err


def test_evaluate_writes_metrics_and_rejects_a_bad_file(tmp_path: Path, capsys):
    embeddings = np.eye(4, dtype=np.float32)[[0, 0, 1, 1, 2, 2]] + 0.01 * np.arange(6)[:, None]
    np.savez(tmp_path / "e.npz", embeddings=embeddings.astype(np.float32), labels=np.array([0, 0, 1, 1, 2, 2]))
    assert main(["evaluate", str(tmp_path / "e.npz"), "--out", str(tmp_path / "m.json"), "--recall-ks", "1,2"]) == 0
    assert (tmp_path / "m.json").read_text().count('"R@1": 1.0') == 1
    assert (tmp_path / "per_query.npz").is_file()  # beside --out by default
    np.savez(tmp_path / "bad.npz", labels=np.array([0, 1]))
    assert main(["evaluate", str(tmp_path / "bad.npz"), "--out", str(tmp_path / "x.json")]) == 2
    assert "embeddings" in capsys.readouterr().err and not (tmp_path / "x.json").exists()


@pytest.mark.parametrize(
    ("options", "ks", "niter"),
    [
        ([], [1, 2, 4], 3),  # from the params: datasets.d.recall_ks, evaluation
        (["--recall-ks", "1", "--kmeans-niter", "5"], [1], 5),  # options given on the command line win
    ],
)
def test_evaluate_reads_its_settings_from_the_params_of_a_dataset(tmp_path: Path, monkeypatch, options, ks, niter):
    """The DVC stage's command is fixed text: the settings must come from params.yaml at run time."""
    seen = {}

    def fake_evaluate_file(path, out, recall_ks, kmeans, chunk_size, per_query_path):
        seen.update(ks=recall_ks, niter=kmeans.niter, chunk=chunk_size)
        return {}

    monkeypatch.setattr(evaluation, "evaluate_file", fake_evaluate_file)
    overlay = tmp_path / "o.yaml"
    overlay.write_text(
        "datasets: {synthetic: {recall_ks: [1, 2, 4]}}\nevaluation: {chunk_size: 7, kmeans: {niter: 3}}\n"
    )
    assert (
        main(
            [
                "evaluate",
                "e.npz",
                "--out",
                str(tmp_path / "m.json"),
                "--dataset",
                "synthetic",
                *options,
                "--config",
                str(REPO / "params.yaml"),
                "--config",
                str(overlay),
            ]
        )
        == 0
    )
    assert seen == {"ks": ks, "niter": niter, "chunk": 7}


def test_recall_ks_must_be_positive_integers():
    with pytest.raises(SystemExit):
        main(["evaluate", "e.npz", "--out", "m.json", "--recall-ks", "1,x"])


def test_info_backbones_lists_stages(capsys):
    assert main(["info", "backbones", "--image-size", "64"]) == 0
    out = capsys.readouterr().out
    assert "small_cnn" in out and "stage4" in out and "pool" in out


@pytest.mark.parametrize(
    ("kind", "line"),
    [
        ("methods", r"^triplet +Triplet \(semi-hard\): recipe baseline, loss triplet$"),
        ("methods", r"^untrained +Untrained network \(reference\): reference row \(not trained\)$"),
        ("tables", r"^table1 +Comparison of metric-learning methods \(14 methods on synthetic\)$"),
        ("datasets", r"^cub200 +CUB-200-2011 \(kind cub200\)$"),
        ("backbones", r"^resnet50 +ResNet-50 with stages stem, layer1, layer2, layer3, layer4, pool\.$"),
    ],
)
def test_list_names_every_entry_on_one_line(capsys, kind: str, line: str):
    assert main(["list", kind, "--config", str(REPO / "params.yaml")]) == 0
    out = capsys.readouterr().out
    assert re.search(line, out, flags=re.M)
    if kind != "backbones":
        defined = merge_params([REPO / "params.yaml"])[kind]
        assert [row.split()[0] for row in out.splitlines()] == list(defined)


@pytest.mark.parametrize(
    ("argv", "message"),
    [
        (["tarin"], "unknown command 'tarin' (did you mean 'train'?)"),
        (["list", "method"], "invalid choice: 'method'"),
    ],
)
def test_mistyped_commands_are_refused_with_a_suggestion(capsys, argv: list[str], message: str):
    with pytest.raises(SystemExit) as exit_:
        main(argv)
    assert exit_.value.code == 2 and message in capsys.readouterr().err


@pytest.mark.parametrize(
    ("argv", "message"),
    [
        (
            ["train", "--dataset", "synthetic", "--method", "tripplet", "--seed", "0"],
            "parameter 'methods.tripplet' is not defined (did you mean 'triplet'?)",
        ),
        (["report", "tabel1"], "parameter 'tables.tabel1' is not defined (did you mean 'table1'?)"),
    ],
)
def test_mistyped_names_in_params_get_a_suggestion(capsys, argv: list[str], message: str):
    assert main([*argv, "--config", str(REPO / "params.yaml")]) == 2
    assert message in capsys.readouterr().err


def test_a_mistyped_params_key_gets_a_suggestion(tmp_path: Path, capsys):
    overlay = tmp_path / "o.yaml"
    overlay.write_text("training:\n  optimiser: {lr: 0.1}\n")
    assert main(["report", "table1", "--config", str(REPO / "params.yaml"), "--config", str(overlay)]) == 2
    assert "'optimiser' was unexpected) (did you mean 'optimizer'?)" in capsys.readouterr().err


def test_version_and_plain_help(capsys):
    with pytest.raises(SystemExit):
        main(["--version"])
    assert capsys.readouterr().out.strip() == f"dmlbench {__version__}"
    with pytest.raises(SystemExit):
        main(["--help"])
    assert "``" not in capsys.readouterr().out


def test_every_option_has_help_text():
    parser = build_parser()
    commands = next(a for a in parser._actions if isinstance(a, argparse._SubParsersAction)).choices
    silent = [
        f"{name} {action.dest}"
        for name, command in commands.items()
        for action in command._actions
        if not action.help and not isinstance(action, argparse._HelpAction)
    ]
    assert silent == []
