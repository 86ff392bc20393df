"""Placement: each training job on a machine with several GPUs claims a GPU (or a slot of one) of its own.

Snakemake caps how many GPU jobs run at once (the ``gpu`` profile's global ``resources: gpu=N``) but
hands out no device ids, so a job picks its device itself: with ``training.device: auto`` and more
than one visible CUDA device, :func:`claim_device` takes a free slot — a lock file
``cuda<D>.slot<S>.lock`` created with ``O_CREAT | O_EXCL`` in ``.scratch/gpu_slots/<host>/``
holding the owner's host and pid — and removes it when the job ends. Each device has
``DMLBENCH_GPU_SLOTS`` slots (an environment variable, default 1): 2 lets two small runs share a GPU.
A lock whose process is gone (a killed job) is reclaimed. Slots fill the devices evenly: every
device's slot 0 first, then every slot 1, ...
"""

from __future__ import annotations

import os
import re
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

from dmlbench.atomic import exclusive_lock, host_name, process_running
from dmlbench.errors import DmlbenchError

#: Where the slot locks live (relative to the working folder), one subfolder per host.
DEFAULT_LOCK_ROOT = Path(".scratch") / "gpu_slots"
#: The environment variable with the number of concurrent jobs per GPU.
SLOTS_ENV = "DMLBENCH_GPU_SLOTS"

Slot = tuple[int, int]
_LOCK_NAME = re.compile(r"cuda(\d+)\.slot(\d+)\.lock")


class GpuSlotsBusyError(DmlbenchError, RuntimeError):
    """Every GPU slot of this machine is held by a running job."""


class GpuSlotsConfigError(DmlbenchError, ValueError):
    """``DMLBENCH_GPU_SLOTS`` is not a positive whole number."""


def free_slot(devices: int, slots_per_device: int, held: set[Slot]) -> Slot | None:
    """The first free ``(device, slot)`` with the least-used devices first, or ``None`` when all are held.

    >>> free_slot(2, 1, {(0, 0)})
    (1, 0)
    >>> free_slot(2, 2, {(0, 0), (1, 0)})
    (0, 1)
    """
    return next(
        ((device, slot) for slot in range(slots_per_device) for device in range(devices) if (device, slot) not in held),
        None,
    )


def slots_per_device() -> int:
    """Concurrent jobs per GPU from ``DMLBENCH_GPU_SLOTS`` (default 1).

    Raises:
        GpuSlotsConfigError: the variable is set but not a whole number ≥ 1.
    """
    value = os.environ.get(SLOTS_ENV, "1")
    if not value.strip().isdigit() or int(value) < 1:
        raise GpuSlotsConfigError(f"{SLOTS_ENV}={value!r}: set the number of jobs per GPU, a whole number >= 1")
    return int(value)


def lock_path(lock_dir: Path, slot: Slot) -> Path:
    """The lock file of ``slot`` = (device, slot index) in ``lock_dir``."""
    return lock_dir / f"cuda{slot[0]}.slot{slot[1]}.lock"


def _live_holder(lock: Path) -> bool:
    """Whether the process named in ``lock`` (``host pid``) still runs; a lock of another host counts as live."""
    try:
        host, _, pid = lock.read_text().strip().rpartition(" ")
    except FileNotFoundError:
        return False
    if not pid.isdigit():
        return False  # locks are written whole under the guard: this one's writer died mid-write
    return host != host_name() or process_running(int(pid))


def held_slots(lock_dir: Path) -> set[Slot]:
    """The slots locked in ``lock_dir`` by running processes; stale locks (their process is gone) are removed."""
    held = set()
    for lock in lock_dir.glob("cuda*.slot*.lock"):
        match = _LOCK_NAME.fullmatch(lock.name)
        if match is None:
            continue
        if _live_holder(lock):
            held.add((int(match[1]), int(match[2])))
        else:
            lock.unlink(missing_ok=True)
    return held


def _create_lock(lock: Path) -> None:
    """Create ``lock`` exclusively with ``<host> <pid>`` inside (``FileExistsError`` when it exists)."""
    fd = os.open(lock, os.O_CREAT | os.O_EXCL | os.O_WRONLY, 0o644)
    with os.fdopen(fd, "w") as stream:
        stream.write(f"{host_name()} {os.getpid()}\n")


def acquire_slot(devices: int, per_device: int, lock_dir: Path) -> Slot:
    """Lock a free slot in ``lock_dir`` and return it (release with :func:`release_slot`).

    The scan, stale-lock removal and creation run under an ``flock`` on ``lock_dir/.guard``, which
    the kernel drops when its process dies, so two jobs starting together never take the same slot.

    Raises:
        GpuSlotsBusyError: all ``devices × per_device`` slots are held by running processes.
    """
    with exclusive_lock(lock_dir / ".guard"):
        slot = free_slot(devices, per_device, held_slots(lock_dir))
        if slot is None:
            raise GpuSlotsBusyError(
                f"all {devices * per_device} GPU slots busy ({devices} GPU(s) × {SLOTS_ENV}={per_device}; "
                f"locks in {lock_dir}); run at most that many GPU jobs at once (snakemake --resources "
                f"gpu={devices * per_device}) or raise {SLOTS_ENV}"
            )
        _create_lock(lock_path(lock_dir, slot))
    return slot


def release_slot(lock_dir: Path, slot: Slot) -> None:
    """Remove this process's lock of ``slot`` (a lock another process holds is left alone)."""
    lock = lock_path(lock_dir, slot)
    try:
        owner = lock.read_text().strip()
    except FileNotFoundError:
        return
    if owner == f"{host_name()} {os.getpid()}":
        lock.unlink(missing_ok=True)


def _cuda_count() -> int:
    """The number of CUDA devices this process sees (0 without CUDA)."""
    import torch

    return torch.cuda.device_count() if torch.cuda.is_available() else 0


@contextmanager
def claim_device(name: str, device_count: int | None = None, lock_root: Path = DEFAULT_LOCK_ROOT) -> Iterator[str]:
    """Yield the device name a job should use, holding a GPU slot while it runs when there is a choice.

    ``name`` other than ``auto``, or fewer than two CUDA devices: ``name`` itself, nothing is locked.
    Otherwise a slot is locked (:func:`acquire_slot`) in ``lock_root/<host>``, ``cuda:<device>`` is
    yielded and printed, and the lock is removed on exit.

    Args:
        name: ``training.device`` (``auto``, ``cpu``, ``cuda:1``, ...).
        device_count: visible CUDA devices; ``None`` asks torch (tests pass a fake count).
        lock_root: the folder of the per-host lock folders.

    Raises:
        GpuSlotsBusyError: every slot is held.
        GpuSlotsConfigError: ``DMLBENCH_GPU_SLOTS`` is malformed.
    """
    devices = _cuda_count() if device_count is None else device_count
    if name != "auto" or devices < 2:
        yield name
        return
    lock_dir = Path(lock_root) / host_name()
    per_device = slots_per_device()
    slot = acquire_slot(devices, per_device, lock_dir)
    print(
        f"[dmlbench] device cuda:{slot[0]} (slot {slot[1] + 1} of {per_device} on GPU {slot[0]} of {devices}; "
        f"lock {lock_path(lock_dir, slot)})",
        flush=True,
    )
    try:
        yield f"cuda:{slot[0]}"
    finally:
        release_slot(lock_dir, slot)


def gpu_index(device: str) -> int:
    """The CUDA device index of a device name, -1 for any other device (the CPU).

    >>> gpu_index("cuda:1"), gpu_index("cuda"), gpu_index("cpu")
    (1, 0, -1)
    """
    kind, _, index = device.partition(":")
    return int(index or 0) if kind == "cuda" else -1
