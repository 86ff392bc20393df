"""Atomic file writes: a temporary file in the target folder, then ``os.replace``.

A reader (or an interrupted workflow) therefore sees either the old file or the
complete new one, never a half-written manifest, checkpoint, table or PNG. Work
that several jobs may start at once (extracting an archive, building an image
store, taking a GPU slot) runs under :func:`exclusive_lock`. A whole folder (a
prepared dataset) is built beside its place and swapped in by :func:`atomic_folder`;
the files of one report are written in full first and renamed together at the end
(:func:`atomic_outputs`).
"""

from __future__ import annotations

import fcntl
import os
import shutil
import socket
import tempfile
import time
from collections.abc import Iterator, Mapping
from contextlib import ExitStack, contextmanager
from pathlib import Path

import numpy as np

from dmlbench.errors import DmlbenchError
from dmlbench.paths import distinct_outputs

#: An orphan temporary file of another machine (a shared file system) is removed after this long.
FOREIGN_ORPHAN_SECONDS = 24 * 3600


@contextmanager
def exclusive_lock(path: str | os.PathLike[str]) -> Iterator[None]:
    """Hold an exclusive advisory lock (``flock``) on the file ``path`` (created with its folders) for the
    block; other processes asking for it wait. The kernel drops the lock when its process dies, so a
    killed job never leaves it held."""
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    with open(path, "a") as handle:
        fcntl.flock(handle, fcntl.LOCK_EX)
        try:
            yield
        finally:
            fcntl.flock(handle, fcntl.LOCK_UN)


class OutputPathError(DmlbenchError, OSError):
    """An output path cannot hold a file (it is a folder, or a file stands where its folder should be)."""


def check_output_path(path: Path) -> None:
    """Stop before writing when ``path`` is a folder or one of its parents is a file.

    Raises:
        OutputPathError: naming ``path`` and the fix.
    """
    if path.is_dir():
        raise OutputPathError(f"{path}: is a folder; name a file to write (e.g. {path / 'metrics.json'})")
    blocking = next((parent for parent in path.parents if parent.exists() and not parent.is_dir()), None)
    if blocking is not None:
        raise OutputPathError(
            f"{path}: cannot be written because {blocking} is a file, not a folder; "
            f"move that file away or choose another output path"
        )


def host_name() -> str:
    """This machine's name as it appears in temporary files' and lock folders' names (no dots)."""
    return socket.gethostname().replace(".", "_")


def _owner_tag() -> str:
    return f"{host_name()}-{os.getpid()}"


def process_running(pid: int) -> bool:
    """Whether a process ``pid`` of this machine is alive (one of another user counts as alive)."""
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    return True


def sweep_orphans(path: str | os.PathLike[str]) -> list[Path]:
    """Remove the temporary files that killed writers of ``path`` left beside it; return them.

    A temporary file is named ``.<name>.<host>-<pid>.<random>.tmp<suffix>``: one of this host whose
    process is gone is an orphan, one of another host when it is older than
    :data:`FOREIGN_ORPHAN_SECONDS`.
    """
    path = Path(path)
    host = host_name()
    removed = []
    for candidate in path.parent.glob(f".{path.name}.*-*.*.tmp{path.suffix}"):
        owner = candidate.name[len(path.name) + 2 :].split(".", 1)[0]
        owner_host, _, pid = owner.rpartition("-")
        if not pid.isdigit():
            continue
        if owner_host == host:
            orphan = not process_running(int(pid))
        else:
            orphan = time.time() - candidate.stat().st_mtime > FOREIGN_ORPHAN_SECONDS
        if orphan:
            candidate.unlink(missing_ok=True)
            removed.append(candidate)
    return removed


@contextmanager
def atomic_output(path: str | os.PathLike[str]) -> Iterator[Path]:
    """Yield a temporary path next to ``path``; on success it replaces ``path``, on error it is removed.

    Parent folders are created (:class:`OutputPathError` when ``path`` cannot be a file), and the
    temporary files of earlier writers that were killed are swept (:func:`sweep_orphans`). The
    temporary name keeps ``path``'s suffix, so writers that append a suffix of their own
    (``np.savez``) leave it alone. The data are flushed to disk (``fsync``) before the rename, so a
    crash cannot leave a complete-looking empty file.

    >>> import tempfile, pathlib
    >>> target = pathlib.Path(tempfile.mkdtemp()) / "out.txt"
    >>> with atomic_output(target) as tmp:
    ...     _ = tmp.write_text("done")
    >>> target.read_text()
    'done'
    """
    path = Path(path)
    check_output_path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    sweep_orphans(path)
    fd, tmp_name = tempfile.mkstemp(
        dir=path.parent, prefix=f".{path.name}.{_owner_tag()}.", suffix=f".tmp{path.suffix}"
    )
    os.close(fd)
    tmp = Path(tmp_name)
    try:
        yield tmp
        with open(tmp, "rb+") as stream:
            os.fsync(stream.fileno())
        os.chmod(tmp, 0o644)
        os.replace(tmp, path)
    finally:
        tmp.unlink(missing_ok=True)


@contextmanager
def atomic_outputs(paths: Mapping[str, str | os.PathLike[str]]) -> Iterator[dict[str, Path]]:
    """:func:`atomic_output` for a group of files that belong together (a table's ``.tex``, ``.csv``, ``.md``,
    ``.html`` and its plots): yield ``{name: temporary path}``; when the block succeeds, every temporary file
    replaces its output, one rename after another at the very end, so a run killed while writing leaves all
    the old files; on error every temporary file is removed.

    Raises:
        dmlbench.paths.SameFileError: two of ``paths`` are one file (one would replace the other).
    """
    distinct_outputs(paths)
    with ExitStack() as stack:
        yield {name: stack.enter_context(atomic_output(path)) for name, path in paths.items()}


def write_bytes_atomic(path: str | os.PathLike[str], data: bytes) -> Path:
    """Write ``data`` to ``path`` atomically; returns the path."""
    with atomic_output(path) as tmp:
        tmp.write_bytes(data)
    return Path(path)


def write_text_atomic(path: str | os.PathLike[str], text: str) -> Path:
    """Write UTF-8 ``text`` to ``path`` atomically; returns the path."""
    return write_bytes_atomic(path, text.encode("utf-8"))


def write_npz_atomic(path: str | os.PathLike[str], **arrays: np.ndarray) -> Path:
    """Write ``arrays`` as an uncompressed ``.npz`` atomically (``np.savez`` keeps the temporary name's
    ``.npz`` suffix); returns the path."""
    with atomic_output(path) as tmp:
        np.savez(tmp, **arrays)  # type: ignore[arg-type]  # numpy types **arrays against allow_pickle: bool
    return Path(path)


#: Beside a folder ``NAME`` that :func:`atomic_folder` builds: its lock file, the folder being built, the old one.
FOLDER_LOCK, FOLDER_BUILD, FOLDER_OLD = ".{name}.lock", ".{name}.build-", ".{name}.old-"


def _recover_folder(path: Path) -> None:
    """Clean up after a builder of ``path`` that was killed (the caller holds its lock): its half-built
    folder is removed; an old folder it had moved aside is put back when ``path`` is missing (killed between
    the two renames of the swap), else removed."""
    for build in path.parent.glob(FOLDER_BUILD.format(name=path.name) + "*"):
        shutil.rmtree(build)
    for old in sorted(path.parent.glob(FOLDER_OLD.format(name=path.name) + "*")):
        if path.exists():
            shutil.rmtree(old)
        else:
            os.replace(old, path)


@contextmanager
def atomic_folder(path: str | os.PathLike[str]) -> Iterator[Path]:
    """Yield a new empty folder beside ``path`` to build it in; on success it replaces ``path``, on error it is
    removed and ``path`` is left as it was.

    The whole build runs under :func:`exclusive_lock` of ``.<name>.lock`` beside the folder, so a second
    builder of the same folder waits for the first instead of deleting its work. The swap is the last step:
    the old folder is renamed aside, the new one renamed into place, and only then the old one deleted. A
    builder killed at any point leaves ``path`` old or new, never mixed; what it left beside it is cleaned
    up by the next builder (:func:`_recover_folder`). A symbolic link at ``path`` is followed: the folder it
    points to is the one replaced, so a dataset kept on another disk stays there.
    """
    path = Path(os.path.realpath(path))
    if path.exists() and not path.is_dir():
        raise OutputPathError(f"{path}: is a file, not a folder; move it away or choose another output folder")
    lock = path.parent / FOLDER_LOCK.format(name=path.name)
    check_output_path(lock)
    with exclusive_lock(lock):
        _recover_folder(path)
        build = Path(tempfile.mkdtemp(dir=path.parent, prefix=FOLDER_BUILD.format(name=path.name) + _owner_tag()))
        try:
            yield build
            os.chmod(build, 0o755)
            old = path.parent / (FOLDER_OLD.format(name=path.name) + _owner_tag())
            if path.exists():
                os.replace(path, old)
            os.replace(build, path)
            shutil.rmtree(old, ignore_errors=True)
        finally:
            shutil.rmtree(build, ignore_errors=True)
