"""Placement: concurrent jobs claim different GPUs (or slots) through lock files; on CPU with a fake count."""

from __future__ import annotations

import subprocess
import sys
import textwrap
import time
from contextlib import ExitStack, contextmanager
from pathlib import Path

import pytest
from conftest import tiny_run

import dmlbench.training.embed as embed_module
import dmlbench.training.trainer as trainer_module
from dmlbench.atomic import host_name
from dmlbench.placement import (
    SLOTS_ENV,
    GpuSlotsBusyError,
    GpuSlotsConfigError,
    claim_device,
    free_slot,
    lock_path,
)


def test_free_slot_spreads_over_devices_then_slots():
    assert free_slot(2, 1, set()) == (0, 0)
    assert free_slot(2, 1, {(0, 0)}) == (1, 0)
    assert free_slot(2, 1, {(0, 0), (1, 0)}) is None
    assert free_slot(2, 2, {(0, 0), (1, 0)}) == (0, 1)


def test_two_claims_get_different_devices(tmp_path):
    with claim_device("auto", 2, tmp_path) as first, claim_device("auto", 2, tmp_path) as second:
        assert {first, second} == {"cuda:0", "cuda:1"}


def test_third_claim_with_one_slot_per_device_says_all_busy(tmp_path):
    with claim_device("auto", 2, tmp_path), claim_device("auto", 2, tmp_path):
        with pytest.raises(GpuSlotsBusyError, match="all 2 GPU slots busy"):
            with claim_device("auto", 2, tmp_path):
                pass


def test_two_slots_per_device_fit_four_claims(tmp_path, monkeypatch):
    monkeypatch.setenv(SLOTS_ENV, "2")
    with ExitStack() as stack:
        devices = [stack.enter_context(claim_device("auto", 2, tmp_path)) for _ in range(4)]
        assert sorted(devices) == ["cuda:0", "cuda:0", "cuda:1", "cuda:1"]
        with pytest.raises(GpuSlotsBusyError, match="all 4 GPU slots busy"):
            stack.enter_context(claim_device("auto", 2, tmp_path))


def test_release_frees_the_slot(tmp_path):
    with claim_device("auto", 2, tmp_path):
        with claim_device("auto", 2, tmp_path) as second:
            pass
        with claim_device("auto", 2, tmp_path) as again:
            assert again == second
    assert not list((tmp_path / host_name()).glob("*.lock"))


def test_stale_lock_of_a_dead_process_is_reclaimed(tmp_path):
    dead = subprocess.Popen([sys.executable, "-c", "pass"])
    dead.wait()
    lock_dir = tmp_path / host_name()
    lock_dir.mkdir()
    for slot in [(0, 0), (1, 0)]:
        lock_path(lock_dir, slot).write_text(f"{host_name()} {dead.pid}\n")
    with claim_device("auto", 2, tmp_path) as device:
        assert device == "cuda:0"
        assert not lock_path(lock_dir, (1, 0)).exists()


def test_no_claim_for_a_named_device_or_a_single_gpu(tmp_path):
    with claim_device("cuda:1", 2, tmp_path) as named, claim_device("auto", 1, tmp_path) as single:
        assert (named, single) == ("cuda:1", "auto")
    assert not tmp_path.joinpath(host_name()).exists()


def test_malformed_slots_setting_is_a_clear_error(tmp_path, monkeypatch):
    monkeypatch.setenv(SLOTS_ENV, "two")
    with pytest.raises(GpuSlotsConfigError, match=SLOTS_ENV):
        with claim_device("auto", 2, tmp_path):
            pass


CHILD = textwrap.dedent("""
    import sys, time
    from pathlib import Path
    from dmlbench.placement import claim_device
    root, out, release = Path(sys.argv[1]), Path(sys.argv[2]), Path(sys.argv[3])
    with claim_device("auto", 2, root) as device:
        out.write_text(device)
        deadline = time.monotonic() + 60
        while not release.exists() and time.monotonic() < deadline:
            time.sleep(0.05)
""")


def test_two_processes_get_different_devices(tmp_path):
    release = tmp_path / "release"
    outs = [tmp_path / f"device{i}.txt" for i in range(2)]
    children = [
        subprocess.Popen([sys.executable, "-c", CHILD, str(tmp_path / "locks"), str(out), str(release)]) for out in outs
    ]
    try:
        deadline = time.monotonic() + 60
        while not all(out.exists() for out in outs) and time.monotonic() < deadline:
            assert all(child.poll() is None for child in children), "a claiming process exited early"
            time.sleep(0.05)
        assert sorted(out.read_text() for out in outs) == ["cuda:0", "cuda:1"]
    finally:
        release.touch()
        assert [child.wait(timeout=60) for child in children] == [0, 0]
    assert not list(Path(tmp_path / "locks" / host_name()).glob("*.lock"))


def test_training_and_embedding_each_claim_their_device(params, tiny_manifest, tmp_path, monkeypatch):
    """Both GPU steps of a run go through claim_device (embedding a large test set on the GPU that a
    training job already holds would slow both); the claim's answer is the device they use."""
    claims: list[tuple[str, str]] = []

    def recording_claim(step: str):
        @contextmanager
        def claim(name: str):
            claims.append((step, name))
            yield "cpu"

        return claim

    monkeypatch.setattr(trainer_module, "claim_device", recording_claim("train"))
    monkeypatch.setattr(embed_module, "claim_device", recording_claim("embed"))
    run = tiny_run(params, epochs=1)
    run["training"]["device"] = "auto"
    trainer_module.train_run(run, tiny_manifest, tmp_path / "out", tmp_path / "scratch", progress=False)
    embed_module.embed_run(tmp_path / "out" / "checkpoint.pt", tiny_manifest, tmp_path / "out" / "embeddings.npz")
    assert claims == [("train", "auto"), ("embed", "auto")]
