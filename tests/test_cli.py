"""The command line: clear errors with exit code 2, and each step callable by hand."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest

from dmlbench.cli import main

from conftest import REPO


def test_unknown_dataset_is_a_clear_error(capsys):
    assert main(["prepare", "imagenet", "--config", str(REPO / "params.yaml")]) == 2
    assert "parameter 'datasets.imagenet' is not defined" in capsys.readouterr().err


def test_bad_params_file_names_the_key(tmp_path: Path, capsys):
    overlay = tmp_path / "o.yaml"
    overlay.write_text("training:\n  epochs: zero\n")
    assert main(["train", "--dataset", "synthetic", "--method", "triplet", "--seed", "0",
                 "--config", str(REPO / "params.yaml"), "--config", str(overlay)]) == 2
    assert "training.epochs" in capsys.readouterr().err


def test_missing_manifest_says_to_prepare(tmp_path: Path, capsys):
    assert main(["train", "--dataset", "synthetic", "--method", "triplet", "--seed", "0",
                 "--config", str(REPO / "params.yaml"), "--manifest", str(tmp_path / "none.csv"),
                 "--out", str(tmp_path / "run")]) == 2
    assert "dmlbench prepare" in capsys.readouterr().err


def test_evaluate_writes_metrics_and_rejects_a_bad_file(tmp_path: Path, capsys):
    embeddings = np.eye(4, dtype=np.float32)[[0, 0, 1, 1, 2, 2]] + 0.01 * np.arange(6)[:, None]
    np.savez(tmp_path / "e.npz", embeddings=embeddings.astype(np.float32), labels=np.array([0, 0, 1, 1, 2, 2]))
    assert main(["evaluate", str(tmp_path / "e.npz"), "--out", str(tmp_path / "m.json"), "--recall-ks", "1,2"]) == 0
    assert (tmp_path / "m.json").read_text().count('"R@1": 1.0') == 1
    np.savez(tmp_path / "bad.npz", labels=np.array([0, 1]))
    assert main(["evaluate", str(tmp_path / "bad.npz"), "--out", str(tmp_path / "x.json")]) == 2
    assert "embeddings" in capsys.readouterr().err and not (tmp_path / "x.json").exists()


def test_recall_ks_must_be_positive_integers():
    with pytest.raises(SystemExit):
        main(["evaluate", "e.npz", "--out", "m.json", "--recall-ks", "1,x"])


def test_info_backbones_lists_stages(capsys):
    assert main(["info", "backbones", "--image-size", "64"]) == 0
    out = capsys.readouterr().out
    assert "small_cnn" in out and "stage4" in out and "pool" in out
