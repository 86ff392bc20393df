"""Numbers reported in the papers (``paper_numbers.yaml``), validated and loaded as a DataFrame.

The YAML file documents its conventions in its header; in short, one entry per
(method, dataset, paper, table, row) with values in percent as printed, and
``primary: true`` on the single entry per (method, dataset) that tables show.
"""

from __future__ import annotations

import math
import re
from collections.abc import Mapping
from importlib import resources
from pathlib import Path
from typing import Any

import pandas as pd
import yaml

from dmlbench.errors import DmlbenchError

PACKAGED_FILE = "paper_numbers.yaml"

KNOWN_METHODS = frozenset(
    {"contrastive", "triplet", "margin", "binomial", "proxy_nca", "norm_softmax", "abe", "mpn", "deml", "diablo", "dnc"}
)
KNOWN_DATASETS = frozenset({"cub200", "cars196", "sop", "inshop"})

_REQUIRED = ("method", "dataset", "paper", "table", "row", "backbone", "embedding_dim", "primary", "metrics")
_OPTIONAL = ("quoted_from", "note")
_PAPER_KEYS = frozenset({"short", "title"})
_METRIC = re.compile(r"^(R@\d+|NMI)$")
_TABLE = re.compile(r"^Table \d+$")

COLUMNS = [
    "method", "dataset", "paper", "citation", "table", "row", "backbone",
    "embedding_dim", "quoted_from", "primary", "metric", "value",
]  # fmt: skip


class PaperNumbersError(DmlbenchError, ValueError):
    """The paper-numbers file is malformed (the message names the file and the entry)."""


def _check_entry(entry: Any, where: str, papers: Mapping[str, Any]) -> None:
    if not isinstance(entry, Mapping):
        raise PaperNumbersError(f"{where}: expected a mapping, got {type(entry).__name__}")
    unknown = sorted(set(entry) - set(_REQUIRED) - set(_OPTIONAL))
    missing = [key for key in _REQUIRED if key not in entry]
    if unknown or missing:
        raise PaperNumbersError(f"{where}: unknown key(s) {unknown}, missing key(s) {missing}")
    if entry["method"] not in KNOWN_METHODS:
        raise PaperNumbersError(f"{where}: unknown method '{entry['method']}' (known: {sorted(KNOWN_METHODS)})")
    if entry["dataset"] not in KNOWN_DATASETS:
        raise PaperNumbersError(f"{where}: unknown dataset '{entry['dataset']}' (known: {sorted(KNOWN_DATASETS)})")
    if entry["paper"] not in papers:
        raise PaperNumbersError(f"{where}: paper '{entry['paper']}' is not listed under 'papers'")
    if not isinstance(entry["table"], str) or not _TABLE.match(entry["table"]):
        raise PaperNumbersError(f"{where}: table must look like 'Table 3', got {entry['table']!r}")
    if not isinstance(entry["row"], str) or not entry["row"].strip():
        raise PaperNumbersError(f"{where}: 'row' must be the row label as printed, got {entry['row']!r}")
    for key in ("backbone", "quoted_from", "note"):
        value = entry.get(key)
        if value is not None and not (isinstance(value, str) and value.strip()):
            raise PaperNumbersError(f"{where}: '{key}' must be a non-empty string or null, got {value!r}")
    dim = entry["embedding_dim"]
    if dim is not None and (isinstance(dim, bool) or not isinstance(dim, int) or dim <= 0):
        raise PaperNumbersError(f"{where}: embedding_dim must be a positive integer or null, got {dim!r}")
    if not isinstance(entry["primary"], bool):
        raise PaperNumbersError(f"{where}: primary must be true or false, got {entry['primary']!r}")
    metrics = entry["metrics"]
    if not isinstance(metrics, Mapping) or not metrics:
        raise PaperNumbersError(f"{where}: metrics must be a non-empty mapping")
    for key, value in metrics.items():
        if not isinstance(key, str) or not _METRIC.match(key):
            raise PaperNumbersError(f"{where}: metric key {key!r} is not R@<K> or NMI")
        if isinstance(value, bool) or not isinstance(value, int | float) or not math.isfinite(value):
            raise PaperNumbersError(f"{where}: metric '{key}' has non-numeric value {value!r}")
        if not 0 <= value <= 100:
            raise PaperNumbersError(f"{where}: metric '{key}' = {value} is outside [0, 100] (percent expected)")


def load_paper_numbers(path: str | Path | None = None) -> pd.DataFrame:
    """Load and validate the paper numbers (the packaged file when ``path`` is None).

    Returns:
        Long DataFrame with columns :data:`COLUMNS`: one row per (entry, metric); ``value``
        in percent; ``citation`` is the paper's short name (e.g. ``D&C``), unescaped.

    Raises:
        PaperNumbersError: naming the file and the entry (index, method/dataset, paper, table).
    """
    if path is None:
        source = f"dmlbench/report/{PACKAGED_FILE}"
        text = resources.files("dmlbench.report").joinpath(PACKAGED_FILE).read_text(encoding="utf-8")
    else:
        source = str(path)
        try:
            text = Path(path).read_text(encoding="utf-8")
        except OSError as err:
            raise PaperNumbersError(f"{source}: cannot read ({err})") from err
    try:
        data = yaml.safe_load(text)
    except yaml.YAMLError as err:
        raise PaperNumbersError(f"{source}: not valid YAML ({err})") from err
    if not isinstance(data, Mapping) or set(data) != {"papers", "entries"}:
        raise PaperNumbersError(f"{source}: top level must have exactly the keys 'papers' and 'entries'")
    papers = data["papers"]
    if not isinstance(papers, Mapping):
        raise PaperNumbersError(f"{source}: 'papers' must map a paper file name to its short name and title")
    for name, paper in papers.items():
        if not isinstance(paper, Mapping) or set(paper) != _PAPER_KEYS:
            raise PaperNumbersError(f"{source}: papers.{name} must have exactly the keys {sorted(_PAPER_KEYS)}")
    entries = data["entries"]
    if not isinstance(entries, list):
        raise PaperNumbersError(f"{source}: 'entries' must be a list")

    rows: list[dict[str, Any]] = []
    seen: set[tuple[str, ...]] = set()
    primaries: dict[tuple[str, str], str] = {}
    for index, entry in enumerate(entries):
        label = (
            f"{entry.get('method')}/{entry.get('dataset')}, {entry.get('paper')} {entry.get('table')}"
            if isinstance(entry, Mapping)
            else "?"
        )
        where = f"{source}: entry {index} ({label})"
        _check_entry(entry, where, papers)
        key = (entry["method"], entry["dataset"], entry["paper"], entry["table"], entry["row"])
        if key in seen:
            raise PaperNumbersError(f"{where}: duplicate of an earlier entry (same method, dataset, paper, table, row)")
        seen.add(key)
        if entry["primary"]:
            pair = (entry["method"], entry["dataset"])
            if pair in primaries:
                raise PaperNumbersError(f"{where}: a second primary entry for {pair} (first: {primaries[pair]})")
            primaries[pair] = where
        base = {key: entry.get(key) for key in ("method", "dataset", "paper", "table", "row", "backbone")}
        base.update(
            citation=papers[entry["paper"]]["short"],
            embedding_dim=entry["embedding_dim"],
            quoted_from=entry.get("quoted_from"),
            primary=entry["primary"],
        )
        rows += [{**base, "metric": metric, "value": float(value)} for metric, value in entry["metrics"].items()]
    frame = pd.DataFrame(rows, columns=COLUMNS)
    frame["embedding_dim"] = frame["embedding_dim"].astype("Int64")
    frame["primary"] = frame["primary"].astype(bool)
    return frame
