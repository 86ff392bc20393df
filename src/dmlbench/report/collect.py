"""Load per-run results (``metrics.json``, ``log.csv``, ``per_query.npz``) into tidy DataFrames and arrays.

A run is (dataset, method, seed) and lives in its run folder,
``results/runs/<dataset>/<method>/seed<k>/`` (:mod:`dmlbench.layout`). Every problem with an input file
raises :class:`ReportInputError` naming that file.
"""

from __future__ import annotations

import json
import math
import re
from collections.abc import Iterable
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import pandas as pd

from dmlbench.errors import DmlbenchError
from dmlbench.evaluation.files import NPZ_READ_ERRORS, repeated_members
from dmlbench.evaluation.per_query import metric_values
from dmlbench.layout import EMBEDDINGS_FILE, LOG_COLUMNS, LOG_FILE, METRICS_FILE, RUNS_DIR, run_dir, run_key

#: Keys of metrics.json that are evaluation metrics, hence fractions in [0, 1].
#: Everything else (``kmeans_seed``, ``num_queries``, ...) is bookkeeping: any finite number.
METRIC_KEY = re.compile(r"^([a-z0-9_]+/)?(R@\d+|NMI|MAP@R|RP)$")

#: columns of :data:`~dmlbench.layout.LOG_COLUMNS` that a log may lack: test R@1 (computed on request) and the
#: loader's share of the epoch (added after logs had been written).
LOG_COLUMNS_MAY_LACK = ("test_R@1", "loader_wait_share")
LOG_REQUIRED_COLUMNS = tuple(column for column in LOG_COLUMNS if column not in LOG_COLUMNS_MAY_LACK)

RESULT_COLUMNS = ["dataset", "method", "seed", "metric", "value"]


class ReportInputError(DmlbenchError, ValueError):
    """A run's metrics.json or log.csv is missing or malformed (the message names the file)."""


@dataclass(frozen=True)
class RunDir:
    """One run's identity and its directory ``<root>/<dataset>/<method>/seed<k>``."""

    dataset: str
    method: str
    seed: int
    path: Path

    @classmethod
    def of(cls, dataset: str, method: str, seed: int, runs_dir: Path = RUNS_DIR) -> RunDir:
        """The run's folder under ``runs_dir`` (:func:`dmlbench.layout.run_dir`)."""
        return cls(dataset, method, seed, run_dir(dataset, method, seed, runs_dir))

    @classmethod
    def from_path(cls, path: str | Path) -> RunDir:
        """Parse ``.../<dataset>/<method>/seed<k>`` into a :class:`RunDir`.

        Raises:
            ReportInputError: when the last component is not ``seed<k>``.
        """
        path = Path(path)
        key = run_key(path)
        if key is None:
            raise ReportInputError(f"{path}: not a run directory (expected .../<dataset>/<method>/seed<k>)")
        return cls(*key, path=path)


def _unique(runs: Iterable[RunDir]) -> list[RunDir]:
    runs = list(runs)
    seen: dict[tuple[str, str, int], Path] = {}
    for run in runs:
        key = (run.dataset, run.method, run.seed)
        if key in seen:
            raise ReportInputError(f"run {key} given twice: {seen[key]} and {run.path}")
        seen[key] = run.path
    return runs


def read_metrics(path: str | Path) -> dict[str, float]:
    """Read one flat ``metrics.json``: numbers only, metric keys as fractions in [0, 1].

    Raises:
        ReportInputError: missing file, invalid JSON, not a flat object, a non-numeric or
            non-finite value, or a metric outside [0, 1] (e.g. written in percent).
    """
    path = Path(path)
    if not path.is_file():
        raise ReportInputError(
            f"{path}: metrics file not found; build the runs first: `snakemake --cores N "
            f"<target>` builds every run a table or figure needs (or `dmlbench evaluate`)"
        )
    try:
        data = json.loads(path.read_text())
    except (json.JSONDecodeError, UnicodeDecodeError) as err:
        raise ReportInputError(f"{path}: not valid JSON ({err})") from err
    if not isinstance(data, dict) or not data:
        raise ReportInputError(f"{path}: expected a non-empty flat JSON object of numbers")
    metrics: dict[str, float] = {}
    for key, value in data.items():
        if isinstance(value, bool) or not isinstance(value, int | float):
            raise ReportInputError(f"{path}: key '{key}' has non-numeric value {value!r}")
        if not math.isfinite(value):
            raise ReportInputError(f"{path}: key '{key}' is not finite ({value})")
        if METRIC_KEY.match(key) and not 0.0 <= value <= 1.0:
            raise ReportInputError(f"{path}: metric '{key}' = {value} is outside [0, 1] (fractions expected)")
        metrics[key] = float(value)
    return metrics


def collect_runs(runs: Iterable[RunDir]) -> pd.DataFrame:
    """Load every run's ``metrics.json`` into a long DataFrame.

    Returns:
        Columns ``dataset, method, seed, metric, value`` (value as stored: fractions for
        metrics), one row per (run, key), bookkeeping keys included; sorted.
    """
    rows = [
        (run.dataset, run.method, run.seed, key, value)
        for run in _unique(runs)
        for key, value in read_metrics(run.path / METRICS_FILE).items()
    ]
    frame = pd.DataFrame(rows, columns=RESULT_COLUMNS)
    frame["seed"] = frame["seed"].astype(int)
    frame["value"] = frame["value"].astype(float)
    return frame.sort_values(RESULT_COLUMNS[:4], ignore_index=True)


def read_per_query(path: str | Path) -> dict[str, np.ndarray]:
    """The arrays of one run's ``per_query.npz`` (:mod:`dmlbench.evaluation.per_query`).

    Raises:
        ReportInputError: the file is missing (runs evaluated before per-query files existed: the
            message says how to rerun evaluate), unreadable, holds an array twice, or has no ``row`` array.
    """
    path = Path(path)
    run = path.parent
    rerun = (
        f"rerun the run's evaluate step: `snakemake {path}` or `dvc repro` (it is an output of the evaluate "
        f"rule), or by hand `dmlbench evaluate {run / EMBEDDINGS_FILE} --out {run / METRICS_FILE} "
        f"--dataset {run.parent.parent.name}`"
    )
    if not path.is_file():
        raise ReportInputError(
            f"{path}: per-query results not found (the run was evaluated before evaluate "
            f"wrote them, or the file was removed); {rerun}"
        )
    try:
        with np.load(path, allow_pickle=False) as archive:
            repeated = repeated_members(archive)
            arrays = {key: archive[key] for key in archive.files}
    except NPZ_READ_ERRORS as err:
        raise ReportInputError(f"{path}: not a readable per-query .npz ({err}); {rerun}") from err
    if repeated:
        raise ReportInputError(
            f"{path}: holds the array {repeated[0]!r} more than once (numpy reads only one); {rerun}"
        )
    if "row" not in arrays:
        raise ReportInputError(f"{path}: no 'row' array (has {sorted(arrays)}); {rerun}")
    return arrays


def per_query_values(arrays: dict[str, np.ndarray], metric: str, path: str | Path) -> np.ndarray | None:
    """:func:`~dmlbench.evaluation.per_query.metric_values` of a run's per-query arrays; None when ``metric``
    has no per-query decomposition.

    Raises:
        ReportInputError: the file lacks the metric's array (naming the file and the array).
    """
    try:
        return metric_values(arrays, metric)
    except KeyError as err:
        raise ReportInputError(
            f"{path}: no per-query array {err.args[0]!r} for metric '{metric}' "
            f"(has {sorted(arrays)}); rerun the run's evaluation"
        ) from err


def read_log(path: str | Path) -> pd.DataFrame:
    """Read one per-epoch ``log.csv`` and validate it.

    Required columns: :data:`LOG_REQUIRED_COLUMNS`; the others of :data:`~dmlbench.layout.LOG_COLUMNS` are
    optional, and the recipe's own columns are kept. All columns must be numeric (empty cells become NaN,
    except in ``epoch``, which must be the integers 1, 2, ... in order).

    Raises:
        ReportInputError: naming the file and the offending column.
    """
    path = Path(path)
    if not path.is_file():
        raise ReportInputError(f"{path}: training log not found")
    try:
        frame = pd.read_csv(path, dtype=str, keep_default_na=False)
    except (pd.errors.ParserError, pd.errors.EmptyDataError, UnicodeDecodeError) as err:
        raise ReportInputError(f"{path}: not a readable CSV ({err})") from err
    missing = [column for column in LOG_REQUIRED_COLUMNS if column not in frame.columns]
    if missing:
        raise ReportInputError(f"{path}: missing column(s) {missing} (has {list(frame.columns)})")
    if frame.empty:
        raise ReportInputError(f"{path}: no epochs logged")
    for column in frame.columns:
        text = frame[column].str.strip()
        try:
            frame[column] = pd.to_numeric(text.mask(text == ""), errors="raise").astype(float)
        except (ValueError, TypeError) as err:
            raise ReportInputError(f"{path}: column '{column}' is not numeric ({err})") from err
    epochs = frame["epoch"]
    expected = range(1, len(frame) + 1)
    if epochs.isna().any() or list(epochs) != list(expected):
        raise ReportInputError(f"{path}: column 'epoch' must be 1, 2, ..., {len(frame)} in order")
    frame["epoch"] = epochs.astype(int)
    return frame


def load_logs(runs: Iterable[RunDir]) -> pd.DataFrame:
    """Load every run's ``log.csv`` into one DataFrame, one row per (run, epoch).

    Returns:
        Columns ``dataset, method, seed`` followed by the log's columns.
    """
    frames = []
    for run in _unique(runs):
        log = read_log(run.path / LOG_FILE)
        log.insert(0, "seed", run.seed)
        log.insert(0, "method", run.method)
        log.insert(0, "dataset", run.dataset)
        frames.append(log)
    if not frames:
        return pd.DataFrame(columns=["dataset", "method", "seed", *LOG_REQUIRED_COLUMNS])
    return pd.concat(frames, ignore_index=True).sort_values(["dataset", "method", "seed", "epoch"], ignore_index=True)


def aggregate_over_seeds(results: pd.DataFrame) -> pd.DataFrame:
    """Mean and sample standard deviation (ddof=1) over seeds, per (dataset, method, metric).

    Returns:
        Columns ``dataset, method, metric, mean, std, n``; ``std`` is NaN when ``n == 1``.
    """
    grouped = results.groupby(["dataset", "method", "metric"], sort=True)["value"]
    summary = grouped.agg(mean="mean", std=lambda v: v.std(ddof=1), n="count").reset_index()
    summary["n"] = summary["n"].astype(int)
    return summary
