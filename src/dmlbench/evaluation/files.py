"""Evaluate an ``.npz`` of embeddings and write the metrics as JSON (atomically)."""

from __future__ import annotations

import json
import zipfile
from collections.abc import Mapping, Sequence
from pathlib import Path

import numpy as np

from dmlbench.atomic import write_npz_atomic, write_text_atomic
from dmlbench.errors import DmlbenchError
from dmlbench.evaluation.clustering import KMeansSettings
from dmlbench.evaluation.evaluate import evaluate_views
from dmlbench.evaluation.timing import phase
from dmlbench.paths import distinct_outputs
from dmlbench.settings import DEFAULT_CHUNK_SIZE

REQUIRED_KEYS = ("embeddings", "labels")
OPTIONAL_KEYS = ("split", "learner_slices", "view_names", "view_slices", "stat_names", "stat_values")
#: What numpy raises on a damaged, truncated or foreign .npz file.
NPZ_READ_ERRORS: tuple[type[BaseException], ...] = (OSError, ValueError, zipfile.BadZipFile, EOFError)


class EmbeddingsFileError(DmlbenchError, ValueError):
    """An embeddings file cannot be read or lacks its keys; the message names the file."""


def repeated_members(archive: np.lib.npyio.NpzFile) -> list[str]:
    """Array names that an ``.npz`` archive holds more than once: numpy reads only one of them (the last
    written), so the file says two things and a reader would silently take one."""
    return [name for name in dict.fromkeys(archive.files) if archive.files.count(name) > 1]


def load_embeddings_npz(path: str | Path) -> dict[str, np.ndarray]:
    """Arrays of an embeddings file, keyed like the arguments of :func:`evaluate_embeddings`.

    Keys: ``embeddings`` (N, d) float32, ``labels`` (N,) int, optional
    ``split`` (N,) 'query'/'gallery' strings, optional ``learner_slices`` (M, 2)
    int, optional ``view_names`` (V,) / ``view_slices`` (V, 2) and ``stat_names`` (S,) /
    ``stat_values`` (S,) (see :func:`evaluate_embeddings`). Pickled (object) arrays are refused.

    Raises:
        FileNotFoundError: no such file.
        EmbeddingsFileError: not an .npz archive, a required key is missing, a key is unknown or
            repeated, or an array cannot be read; the message names the file and the key.
    """
    path = Path(path)
    if not path.is_file():
        raise FileNotFoundError(
            f"{path}: embeddings file not found; write it with `dmlbench embed RUN_DIR` "
            f"(or build its run with `snakemake --cores N {path}`)"
        )
    try:
        archive = np.load(path, allow_pickle=False)
    except NPZ_READ_ERRORS as err:
        raise EmbeddingsFileError(
            f"{path}: not a readable .npz archive ({err}); re-create it with `dmlbench embed` "
            f"(or numpy.savez with the keys {REQUIRED_KEYS})"
        ) from err
    if not isinstance(archive, np.lib.npyio.NpzFile):
        raise EmbeddingsFileError(
            f"{path}: holds a single array (.npy), not an .npz archive with the keys "
            f"{REQUIRED_KEYS}; write it with numpy.savez(path, embeddings=..., labels=...)"
        )
    with archive:
        repeated = repeated_members(archive)
        if repeated:
            raise EmbeddingsFileError(
                f"{path}: holds the array {repeated[0]!r} more than once (a zip member "
                f"written twice); numpy would read only one of them. Re-create the file "
                f"with `dmlbench embed` (or one numpy.savez call)"
            )
        keys = set(archive.files)
        unknown = sorted(keys - set(REQUIRED_KEYS) - set(OPTIONAL_KEYS))
        if unknown:
            raise EmbeddingsFileError(
                f"{path}: unknown key(s) {unknown}; allowed keys are {REQUIRED_KEYS + OPTIONAL_KEYS}"
            )
        for key in REQUIRED_KEYS:
            if key not in keys:
                raise EmbeddingsFileError(f"{path}: missing required key {key!r} (found {sorted(keys)})")
        arrays = {}
        for key in sorted(keys):
            try:
                arrays[key] = archive[key]
            except NPZ_READ_ERRORS as err:
                raise EmbeddingsFileError(f"{path}: cannot read key {key!r} ({err}); re-create the file") from err
    return arrays


def write_json_atomic(payload: Mapping[str, float], path: str | Path) -> None:
    """Write ``payload`` as JSON (sorted keys, indent 2, no NaN) atomically (:func:`atomic_output`).

    A reader never sees a partial file; the parent directory is created if needed.
    """
    text = json.dumps(dict(payload), sort_keys=True, indent=2, allow_nan=False) + "\n"
    write_text_atomic(path, text)


def evaluate_file(
    npz_path: str | Path,
    out_json: str | Path,
    recall_ks: Sequence[int],
    kmeans: KMeansSettings = KMeansSettings(),
    chunk_size: int = DEFAULT_CHUNK_SIZE,
    per_query_path: str | Path | None = None,
) -> dict[str, float]:
    """Compute :func:`evaluate_views` on an embeddings file and write the metrics to ``out_json``.

    Args:
        npz_path: file with the keys described in :func:`load_embeddings_npz`.
        out_json: metrics file to (over)write atomically.
        recall_ks: K values of Recall@K.
        kmeans: K-means settings for NMI.
        chunk_size: queries per kNN search.
        per_query_path: where to write the per-query results (:mod:`dmlbench.evaluation.per_query`,
            atomically); None: not written.

    Returns:
        The metrics written.

    Raises:
        ValueError, TypeError: the file or its arrays are malformed; the message starts with the file name.
        SameFileError: ``out_json``, ``per_query_path`` and ``npz_path`` are not three files.
    """
    outputs = {"--out": out_json} if per_query_path is None else {"--out": out_json, "--per-query": per_query_path}
    distinct_outputs(outputs, inputs={"EMBEDDINGS": npz_path})
    with phase("read embeddings"):
        arrays = load_embeddings_npz(npz_path)
    try:
        # the keys are the array parameters (load_embeddings_npz checks them); mypy matches **arrays to every keyword
        evaluation = evaluate_views(recall_ks=recall_ks, kmeans=kmeans, chunk_size=chunk_size, **arrays)  # type: ignore[arg-type]
    except (TypeError, ValueError) as err:
        raise type(err)(f"{npz_path}: {err}") from err
    if per_query_path is not None:
        with phase("per-query file"):
            write_npz_atomic(per_query_path, **evaluation.per_query)
    with phase("metrics file"):
        write_json_atomic(evaluation.metrics, out_json)
    return evaluation.metrics
