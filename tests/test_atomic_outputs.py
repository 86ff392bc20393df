"""Outputs are atomic (issue 28, data loss): a prepared dataset is swapped in whole and under a lock, the outputs
of one command are distinct files, and the files of one report are renamed into place together."""

from __future__ import annotations

import errno
import hashlib
import multiprocessing
import os
from collections.abc import Callable
from pathlib import Path

import numpy as np
import pytest
from datasets_fakes import make_cub, make_sop
from test_report import SETTINGS, make_run, spec_for

from dmlbench import atomic
from dmlbench.atomic import OutputPathError, atomic_folder, exclusive_lock
from dmlbench.cli import main
from dmlbench.data import official, synthetic
from dmlbench.data.manifest import read_manifest
from dmlbench.data.registry import OWNER_MARKER, prepare_dataset
from dmlbench.paths import SameFileError
from dmlbench.report import build
from dmlbench.report.build import build_report

TINY = {"kind": "synthetic", "num_classes": 6, "images_per_class": 3, "image_size": 32}
#: how many calls of a patched write step succeed before it fails as a full disk would.
CALLS_BEFORE_FAILURE = 4


def _digests(root: Path) -> dict[str, str]:
    """SHA-256 of every file under ``root``, keyed by relative path."""
    return {
        str(p.relative_to(root)): hashlib.sha256(p.read_bytes()).hexdigest()
        for p in sorted(root.rglob("*"))
        if p.is_file()
    }


def _fail_after(function: Callable, calls: int = CALLS_BEFORE_FAILURE) -> Callable:
    """``function``, which raises ENOSPC (a full disk) from its ``calls + 1``-th call on."""
    done = []

    def patched(*args, **kwargs):
        if len(done) >= calls:
            raise OSError(errno.ENOSPC, "No space left on device")
        done.append(1)
        return function(*args, **kwargs)

    return patched


def _leftovers(out: Path) -> list[str]:
    """Names beside ``out`` and inside it that a builder leaves only when something went wrong."""
    beside = [
        p.name for p in out.parent.iterdir() if p.name.startswith(f".{out.name}.") and not p.name.endswith(".lock")
    ]
    inside = [str(p.relative_to(out)) for p in out.rglob("*") if ".tmp" in p.name]
    return beside + inside


def _cub_cropped(tmp_path: Path) -> dict:
    return make_cub(tmp_path / "raw").config("cub200", cropped=True)


def _sop(tmp_path: Path) -> dict:
    return make_sop(tmp_path / "raw").config("sop")


# (config maker, module attribute that writes, how many of its calls succeed) — one write step per kind of output:
# generated images, bbox crops of a local copy, and the last file (the manifest) after a side table.
FAILURES = {
    "synthetic-images": (lambda tmp_path: TINY, synthetic, "encode_png", CALLS_BEFORE_FAILURE),
    "cub200-crops": (_cub_cropped, official, "save_crop", CALLS_BEFORE_FAILURE),
    "sop-manifest": (_sop, official, "write_manifest", 0),
}


@pytest.mark.parametrize("case", FAILURES.values(), ids=FAILURES.keys())
def test_a_reprepare_that_fails_midway_leaves_the_old_dataset_whole(case, tmp_path: Path, monkeypatch) -> None:
    make_config, module, step, calls = case
    config = make_config(tmp_path)
    out = tmp_path / "out"
    prepare_dataset(config, out)
    before = _digests(out)
    monkeypatch.setattr(module, step, _fail_after(getattr(module, step), calls))
    with pytest.raises(Exception, match="No space left"):  # an OSError, or a crop error that lists it
        prepare_dataset(config, out)
    assert _digests(out) == before
    assert _leftovers(out) == []
    assert all(Path(p).is_file() for p in read_manifest(out / "manifest.csv")["path"])


def test_a_builder_killed_between_the_renames_of_the_swap_is_recovered_by_the_next(tmp_path: Path, monkeypatch) -> None:
    out = tmp_path / "out"
    prepare_dataset(TINY, out)
    before = _digests(out)
    renames: list = []

    def replace_then_die(src, dst):
        if Path(src).is_dir():
            renames.append(dst)
        if len(renames) == 2:  # the old folder is aside, the new one not yet in place
            raise KeyboardInterrupt
        os.rename(src, dst)

    monkeypatch.setattr(atomic.os, "replace", replace_then_die)
    with pytest.raises(KeyboardInterrupt):
        prepare_dataset({**TINY, "seed": 1}, out)
    monkeypatch.undo()
    assert not out.exists()  # the state a SIGKILL at that instant leaves
    with pytest.raises(RuntimeError), atomic_folder(out):
        raise RuntimeError("the next builder fails too")
    assert _digests(out) == before and _leftovers(out) == []


def _prepare_in_process(out: str, start: multiprocessing.synchronize.Barrier) -> None:
    start.wait()
    prepare_dataset(TINY, out)


def test_concurrent_prepares_of_one_folder_run_one_after_the_other(tmp_path: Path) -> None:
    out = tmp_path / "out"
    prepare_dataset({**TINY, "seed": 1}, out)  # an older dataset to replace
    context = multiprocessing.get_context("fork")
    start = context.Barrier(3)
    workers = [context.Process(target=_prepare_in_process, args=(str(out), start)) for _ in range(3)]
    for worker in workers:
        worker.start()
    for worker in workers:
        worker.join(timeout=60)
    assert [worker.exitcode for worker in workers] == [0, 0, 0]
    prepare_dataset(TINY, tmp_path / "fresh")
    assert _digests(out) == _digests(tmp_path / "fresh")
    assert _leftovers(out) == []


def test_a_prepare_waits_for_the_lock_of_its_folder(tmp_path: Path) -> None:
    out = tmp_path / "out"
    context = multiprocessing.get_context("fork")
    with exclusive_lock(tmp_path / ".out.lock"):
        worker = context.Process(target=prepare_dataset, args=(TINY, out))
        worker.start()
        worker.join(timeout=1.0)
        assert worker.is_alive() and not out.exists()
    worker.join(timeout=60)
    assert worker.exitcode == 0 and (out / OWNER_MARKER).is_file()


def test_a_symlinked_dataset_folder_is_replaced_where_it_points(tmp_path: Path) -> None:
    target = tmp_path / "other_disk" / "synthetic"
    prepare_dataset({**TINY, "seed": 1}, target)
    link = tmp_path / "synthetic"
    link.symlink_to(target)
    prepare_dataset(TINY, link)
    assert link.is_symlink() and _digests(link) == _digests(target)
    assert (target / OWNER_MARKER).is_file()


def test_an_output_folder_that_is_a_file_is_refused_and_kept(tmp_path: Path) -> None:
    out = tmp_path / "notes.txt"
    out.write_text("mine")
    with pytest.raises(OutputPathError, match=r"notes.txt: is a file, not a folder; move it away"):
        prepare_dataset(TINY, out)
    assert out.read_text() == "mine"


# ------------------------------------------------ two outputs of one command (or an output and an input) differ


def _embeddings(path: Path) -> Path:
    embeddings = np.eye(4, dtype=np.float32)[[0, 0, 1, 1, 2, 2]] + 0.01 * np.arange(6, dtype=np.float32)[:, None]
    np.savez(path, embeddings=embeddings, labels=np.array([0, 0, 1, 1, 2, 2]))
    return path


SAME_FILE_COMMANDS = {
    "per-query-is-out": (["evaluate", "e.npz", "--out", "m.json", "--per-query", "m.json"], "--per-query m.json"),
    "dotted-path": (["evaluate", "e.npz", "--out", "m.json", "--per-query", "sub/../m.json"], "sub/../m.json"),
    "symlink-to-out": (["evaluate", "e.npz", "--out", "m.json", "--per-query", "link.json"], "link.json"),
    "out-is-input": (["evaluate", "e.npz", "--out", "e.npz"], "--out e.npz"),
    "default-per-query-is-input": (["evaluate", "per_query.npz", "--out", "m.json"], "per_query.npz"),
    "ensemble-out-is-member": (
        ["ensemble", "e.npz", "f.npz", "--out", "./f.npz"],
        "--out f.npz: is the same file as input MEMBER1 f.npz",
    ),
}


@pytest.mark.parametrize("case", SAME_FILE_COMMANDS.values(), ids=SAME_FILE_COMMANDS.keys())
def test_a_command_whose_outputs_are_one_file_is_refused_before_writing(
    case, tmp_path: Path, monkeypatch, capsys
) -> None:
    argv, named = case
    monkeypatch.chdir(tmp_path)
    inputs = [_embeddings(tmp_path / name) for name in ("e.npz", "f.npz", "per_query.npz")]
    (tmp_path / "sub").mkdir()
    (tmp_path / "m.json").write_text("{}")
    (tmp_path / "link.json").symlink_to(tmp_path / "m.json")
    before = {path: path.read_bytes() for path in [*inputs, tmp_path / "m.json"]}
    assert main(argv) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and named in err and "is the same file as" in err and "its own path" in err, err
    assert {path: path.read_bytes() for path in before} == before


def test_a_report_whose_plot_paths_are_one_file_is_refused(tmp_path: Path) -> None:
    runs = [make_run(tmp_path / "runs", "synthetic", "a", seed, {"R@1": 0.5, "NMI": 0.6}) for seed in (0, 1)]
    with pytest.raises(SameFileError, match="is the same file as"):
        build_report(
            runs,
            spec_for(["synthetic"], ["a"], ["R@1", "NMI"]),
            SETTINGS,
            table_path=tmp_path / "t.tex",
            curves_png=tmp_path / "p.png",
            recall_png=tmp_path / "p.png",
            label="t",
        )
    assert sorted(p.name for p in tmp_path.iterdir()) == ["runs"]


# ------------------------------------------------ a report is committed as a whole


REPORT_STEPS = ["write_cells_csv", "plot_recall_at_k", "write_html_page"]  # early, middle, last


@pytest.mark.parametrize("step", REPORT_STEPS)
def test_a_report_that_fails_midway_leaves_every_old_file(step: str, tmp_path: Path, monkeypatch) -> None:
    spec = spec_for(["synthetic"], ["a"], ["R@1", "NMI"])
    outputs = {
        "table_path": tmp_path / "tables" / "t.tex",
        "curves_png": tmp_path / "plots" / "t_curves.png",
        "recall_png": tmp_path / "plots" / "t_recall.png",
    }

    runs = {
        r_at_1: [
            make_run(tmp_path / f"runs{r_at_1}", "synthetic", "a", seed, {"R@1": r_at_1, "NMI": 0.6}) for seed in (0, 1)
        ]
        for r_at_1 in (0.5, 0.7)
    }

    def report(r_at_1: float) -> None:
        build_report(runs[r_at_1], spec, SETTINGS, label="t", **outputs)

    report(0.5)
    before = {**_digests(tmp_path / "tables"), **_digests(tmp_path / "plots")}
    assert len(before) == 6
    monkeypatch.setattr(build, step, _fail_after(getattr(build, step), 0))
    with pytest.raises(OSError, match="No space left"):
        report(0.7)
    assert {**_digests(tmp_path / "tables"), **_digests(tmp_path / "plots")} == before  # no .tmp files either
    monkeypatch.undo()
    report(0.7)
    assert "70.0" in (tmp_path / "tables" / "t.md").read_text()
