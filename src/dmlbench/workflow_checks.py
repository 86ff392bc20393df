"""What the Snakemake workflow checks and prepares when it loads (``workflow/rules/common.smk``).

* ``snakemake --config KEY=VALUE`` changes the configuration Snakemake plans with; the ``dmlbench``
  commands of its jobs read parameter files only, so the overrides are written as one more overlay
  (:func:`overrides_overlay`) that every command gets last.
* Snakemake keeps only the last of several ``--configfile`` options and drops the others silently:
  :func:`check_one_configfile_option` refuses such a command line.
* Snakemake takes an output older than one of its inputs as out of date and deletes and redoes it; a
  file dated in the future (a clock set wrong, a copy from a machine whose clock runs ahead) makes
  finished work look old: :func:`check_no_future_dated_files` stops before any job runs.
"""

from __future__ import annotations

import hashlib
import os
import shlex
import time
from collections.abc import Iterator, Mapping, Sequence
from datetime import datetime
from pathlib import Path
from typing import Any

import yaml

from dmlbench.atomic import write_text_atomic
from dmlbench.config import EXPERIMENTS_KEY, ConfigError
from dmlbench.errors import DmlbenchError

#: Where :func:`overrides_overlay` writes (inside Snakemake's own folder of the working directory).
OVERRIDES_FOLDER = Path(".snakemake/dmlbench")
#: A file modified more than this many seconds after this machine's clock is dated in the future.
FUTURE_SLACK_SECONDS = 60.0
#: The folders of the workflow's inputs and outputs, each with how many levels below it are checked: the
#: deepest file of a rule (``results/runs/<dataset>/<method>/seed<n>/checkpoint.pt``, ``data/pretrained/
#: <dataset>/<backbone>_run/checkpoint.pt``, ``data/prepared/<dataset>/manifest.csv``). The images of a
#: prepared dataset or an extracted archive lie deeper and are not walked: no rule compares their times.
CHECKED_TREES = {"data/raw": 2, "data/prepared": 2, "data/pretrained": 3, "results": 5}
#: At most this many future-dated files are named in the error.
LISTED_FILES = 20


class FutureDatedFilesError(DmlbenchError, OSError):
    """Files of the workflow are dated in the future, so Snakemake would redo the outputs made from them."""


def overrides_overlay(overrides: Mapping[str, Any], folder: Path = OVERRIDES_FOLDER) -> Path | None:
    """Write Snakemake's ``--config KEY=VALUE`` overrides as a parameter overlay; return its path (``None``
    when there are none).

    The file is named by the SHA-256 of its content, so the same overrides give the same file, and is
    written atomically (a job reading it sees the whole file). Merged last, it gives the ``dmlbench``
    commands exactly the configuration Snakemake planned with.

    Raises:
        ConfigError: the overrides set ``experiments``, whose files are found relative to the file that
            lists them and so cannot come from the command line.
    """
    if not overrides:
        return None
    if EXPERIMENTS_KEY in overrides:
        raise ConfigError(
            f"--config {EXPERIMENTS_KEY}=...: experiments files cannot be given on the command "
            f"line; list them under `{EXPERIMENTS_KEY}:` in an overlay and pass it with --configfile"
        )
    text = yaml.safe_dump(dict(overrides), sort_keys=True)
    digest = hashlib.sha256(text.encode("utf-8")).hexdigest()
    return write_text_atomic(folder / f"config_overrides-{digest}.yaml", text)


def is_snakemake_command(argv: Sequence[str]) -> bool:
    """Whether ``argv`` is Snakemake's own command line (``snakemake ...``, ``python -m snakemake ...``),
    not that of a program running the workflow through Snakemake's API (``make_dvc_yaml.py``, a test)."""
    program = Path(argv[0]) if argv else Path()
    return program.name == "snakemake" or program.parts[-2:] == ("snakemake", "__main__.py")


def configfile_options(argv: Sequence[str]) -> list[str]:
    """The ``--configfile``/``--configfiles`` options in ``argv``, as written (``--configfile=a.yaml`` and the
    abbreviations argparse accepts, such as ``--configf``, included)."""
    return [
        arg
        for arg in argv
        if (name := arg.split("=", 1)[0]).startswith("--configf") and "--configfiles".startswith(name)
    ]


def check_one_configfile_option(argv: Sequence[str]) -> None:
    """Refuse a Snakemake command line with more than one ``--configfile`` option: Snakemake would use the
    overlays of the last one only. (The jobs Snakemake starts itself get one ``--configfiles``.)

    Raises:
        ConfigError: naming the options and the fix.
    """
    options = configfile_options(argv) if is_snakemake_command(argv) else []
    if len(options) > 1:
        raise ConfigError(
            f"--configfile given {len(options)} times ({', '.join(options)}): Snakemake would use "
            f"only the overlays after the last one; give every overlay after one --configfile: "
            f"--configfile a.yaml b.yaml"
        )


def _entries(folder: Path, depth: int) -> Iterator[os.DirEntry[str]]:
    """Every entry of ``folder`` and of its subfolders down to ``depth`` levels (links are not followed; a
    folder that vanishes meanwhile is skipped)."""
    try:
        with os.scandir(folder) as entries:
            for entry in entries:
                yield entry
                if depth > 1 and entry.is_dir(follow_symlinks=False):
                    yield from _entries(Path(entry.path), depth - 1)
    except (FileNotFoundError, NotADirectoryError):
        return


def future_dated_files(
    trees: Mapping[str, int] = CHECKED_TREES, now: float | None = None, slack: float = FUTURE_SLACK_SECONDS
) -> list[tuple[Path, float]]:
    """The files and folders in ``trees`` (folder → levels checked below it) modified more than ``slack``
    seconds after ``now`` (default: this machine's clock), each with how many seconds it is ahead; sorted."""
    now = time.time() if now is None else now
    found = []
    for root, depth in trees.items():
        for entry in _entries(Path(root), depth):
            try:
                ahead = entry.stat(follow_symlinks=False).st_mtime - now
            except FileNotFoundError:
                continue
            if ahead > slack:
                found.append((Path(entry.path), ahead))
    return sorted(found)


def _future_dated_message(
    found: Sequence[tuple[Path, float]], trees: Mapping[str, int], now: float, slack: float
) -> str:
    """The error for :func:`check_no_future_dated_files`: the files, how far ahead, and the fix."""
    listed = "\n".join(f"  {path} ({ahead / 3600:.1f} h ahead)" for path, ahead in found[:LISTED_FILES])
    more = f"\n  ... and {len(found) - LISTED_FILES} more" if len(found) > LISTED_FILES else ""
    roots = sorted({root for root in trees if any(Path(root) in path.parents for path, _ in found)})
    find = (
        f"find {' '.join(shlex.quote(root) for root in roots)} -newermt @{now + slack:.0f} "
        f"-exec touch -c -h -d @{now:.0f} {{}} +"
    )
    return (
        f"{len(found)} file(s) of the workflow are modified in the future (more than {slack:.0f} s after this "
        f"machine's clock, {datetime.fromtimestamp(now):%Y-%m-%d %H:%M:%S}); Snakemake would take every output "
        f"made from them as out of date and delete and redo it, finished checkpoints included:\n{listed}{more}\n"
        f"Fix: if this machine's clock is behind, set it right; otherwise give those files the current time "
        f"(one time for all of them):\n  {find}\nthen look at what `snakemake -n` would rerun before running it."
    )


def check_no_future_dated_files(
    trees: Mapping[str, int] = CHECKED_TREES, now: float | None = None, slack: float = FUTURE_SLACK_SECONDS
) -> None:
    """Stop when a file of the workflow is dated in the future (see :func:`future_dated_files`).

    Raises:
        FutureDatedFilesError: naming the files and the fix.
    """
    now = time.time() if now is None else now
    found = future_dated_files(trees, now, slack)
    if found:
        raise FutureDatedFilesError(_future_dated_message(found, trees, now, slack))
