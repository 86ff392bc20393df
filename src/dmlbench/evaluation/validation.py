"""Checks of the evaluation inputs; each raises :class:`EvaluationInputError` (a ValueError;
:class:`EvaluationInputTypeError`, a TypeError, for wrong kinds) saying what is wrong."""

from __future__ import annotations

import re
from collections.abc import Sequence

import numpy as np

from dmlbench.errors import DmlbenchError

SPLIT_VALUES = ("query", "gallery")

#: Largest |value| accepted in an embedding: squared distances of 512-d rows stay far from float32's
#: overflow (3.4e38), where faiss' K-means aborts the process.
MAX_ABS_EMBEDDING = 1.0e15
#: Largest class id: labels are compared as int64.
INT64_MAX = np.iinfo(np.int64).max


class EvaluationInputError(DmlbenchError, ValueError):
    """An evaluation input has the wrong shape or values."""


class EvaluationInputTypeError(DmlbenchError, TypeError):
    """An evaluation input has the wrong dtype."""


class CollapsedEmbeddingsError(EvaluationInputError):
    """Every embedding a query is ranked against is the same vector: the model collapsed to one point."""


def check_embeddings(embeddings: np.ndarray) -> np.ndarray:
    """(N, d) real, finite, N ≥ 2, d ≥ 1; returned as C-contiguous float32."""
    array = np.asarray(embeddings)
    if array.ndim != 2:
        raise EvaluationInputError(f"embeddings must be a 2-D (N, d) array, got shape {array.shape}")
    if array.dtype.kind != "f":
        raise EvaluationInputTypeError(f"embeddings must be floating point, got dtype {array.dtype}")
    if array.shape[0] < 2 or array.shape[1] < 1:
        raise EvaluationInputError(f"embeddings need at least 2 rows and 1 column, got shape {array.shape}")
    array = np.ascontiguousarray(array, dtype=np.float32)
    bad_rows = np.flatnonzero(~np.isfinite(array).all(axis=1))
    if len(bad_rows):
        raise EvaluationInputError(
            f"embeddings have non-finite values (NaN or inf, after conversion to float32) in {len(bad_rows)} "
            f"of {len(array)} rows; first bad rows: {bad_rows[:5].tolist()}"
        )
    largest = float(np.abs(array).max())
    if largest > MAX_ABS_EMBEDDING:
        raise EvaluationInputError(
            f"embeddings hold values up to {largest:.3g}, beyond {MAX_ABS_EMBEDDING:.0e}: squared distances "
            f"overflow float32. A trained model's embeddings this large mean the run diverged; "
            f"L2-normalise them if they are meant as directions"
        )
    return array


def check_labels(labels: np.ndarray, num_rows: int) -> np.ndarray:
    """(N,) integer class labels, one per embedding row."""
    array = np.asarray(labels)
    if array.ndim != 1:
        raise EvaluationInputError(f"labels must be a 1-D (N,) array, got shape {array.shape}")
    if array.dtype.kind not in "iu":
        raise EvaluationInputTypeError(f"labels must be integers, got dtype {array.dtype}")
    if len(array) != num_rows:
        raise EvaluationInputError(f"labels has {len(array)} entries but embeddings has {num_rows} rows")
    if array.dtype.kind == "u" and len(array) and array.max() > INT64_MAX:
        row = int(np.argmax(array > INT64_MAX))
        raise EvaluationInputError(
            f"labels row {row} holds {array[row]}, beyond {INT64_MAX}, the largest class id "
            f"(int64) the evaluation compares; number the classes from 0 (as prepare does)"
        )
    if len(np.unique(array)) < 2:
        raise EvaluationInputError(
            f"labels hold a single class ({array[0]}): every neighbour is a match and every clustering is "
            f"perfect, so Recall@K, MAP@R and NMI would all read 1.0; evaluate a split with at least 2 classes"
        )
    return array.astype(np.int64)


def check_not_collapsed(embeddings: np.ndarray, database_rows: np.ndarray | None) -> None:
    """The database (``database_rows`` of ``embeddings``; None: every row) holds at least two distinct vectors:
    were they all one vector, every distance would tie, and Recall@K, MAP@R and NMI would only reflect the order
    of the rows. Near-identical but distinct rows are fine.

    Raises:
        CollapsedEmbeddingsError: saying how many rows are identical and that the model collapsed.
    """
    database = embeddings if database_rows is None else embeddings[database_rows]
    if len(database) < 2 or np.ptp(database, axis=0).any():
        return
    which = "embeddings" if database_rows is None else "gallery embeddings"
    value = "all zero" if not database[0].any() else "one and the same vector"
    raise CollapsedEmbeddingsError(
        f"all {len(database):,} {which} are identical ({value}): the model collapsed to one point, so every "
        f"neighbour ties and Recall@K would only reflect the order of the rows. Retrain it (e.g. a lower lr) "
        f"and check its training log, or re-create the file if it was written wrongly"
    )


def check_split(split: np.ndarray | None, num_rows: int) -> np.ndarray | None:
    """(N,) of 'query'/'gallery' with at least one of each; returns the query mask (N,) bool, or None."""
    if split is None:
        return None
    array = np.asarray(split)
    if array.dtype.kind == "S":
        array = np.char.decode(array, "ascii")
    if array.ndim != 1 or len(array) != num_rows:
        raise EvaluationInputError(f"split must have shape ({num_rows},) like the labels, got {array.shape}")
    values = set(array.tolist())
    unknown = values - set(SPLIT_VALUES)
    if unknown:
        shown = sorted(map(repr, unknown))[:5]
        raise EvaluationInputError(f"split values must be 'query' or 'gallery'; found {', '.join(shown)}")
    missing = set(SPLIT_VALUES) - values
    if missing:
        raise EvaluationInputError(f"split has no {missing.pop()!r} rows; the query/gallery protocol needs both")
    return array == "query"


def check_learner_slices(learner_slices: np.ndarray | None, dim: int) -> list[tuple[int, int]]:
    """(M, 2) integer [start, stop) column ranges, non-empty, not overlapping, tiling [0, dim)."""
    if learner_slices is None:
        return []
    array = np.asarray(learner_slices)
    if array.ndim != 2 or array.shape[1] != 2 or array.shape[0] < 1:
        raise EvaluationInputError(f"learner_slices must have shape (M, 2) with M >= 1, got {array.shape}")
    if array.dtype.kind not in "iu":
        raise EvaluationInputTypeError(f"learner_slices must be integers, got dtype {array.dtype}")
    slices = [(int(start), int(stop)) for start, stop in array]
    for m, (start, stop) in enumerate(slices):
        if not 0 <= start < stop <= dim:
            raise EvaluationInputError(
                f"learner slice {m} = [{start}, {stop}) is empty or outside the {dim} embedding columns"
            )
    ordered = sorted(range(len(slices)), key=lambda m: slices[m])
    for before, after in zip(ordered, ordered[1:]):
        if slices[after][0] < slices[before][1]:
            raise EvaluationInputError(
                f"learner slices {before} = [{slices[before][0]}, {slices[before][1]}) and "
                f"{after} = [{slices[after][0]}, {slices[after][1]}) overlap"
            )
    covered = sum(stop - start for start, stop in slices)
    if covered != dim:
        raise EvaluationInputError(
            f"learner slices cover {covered} of the {dim} embedding columns; the learners of a multi-learner "
            f"embedding must tile all of it (the ensemble is their concatenation)"
        )
    return slices


def check_views(names: np.ndarray | None, slices: np.ndarray | None, dim: int) -> dict[str, tuple[int, int]]:
    """(V,) distinct names matching ``[a-z0-9_]+`` and (V, 2) integer [start, stop) ranges within [0, dim]."""
    if names is None and slices is None:
        return {}
    if names is None or slices is None:
        raise EvaluationInputError("view_names and view_slices must be given together")
    names_list = [str(n) for n in np.asarray(names).ravel()]
    array = np.asarray(slices)
    if array.ndim != 2 or array.shape != (len(names_list), 2) or array.dtype.kind not in "iu":
        raise EvaluationInputError(
            f"view_slices must be integers of shape ({len(names_list)}, 2), got {array.dtype} {array.shape}"
        )
    if len(set(names_list)) != len(names_list):
        raise EvaluationInputError(f"view_names repeat a name: {names_list}")
    views = {}
    for name, (start, stop) in zip(names_list, array.tolist()):
        if not re.fullmatch(r"[a-z0-9_]+", name) or name.startswith("learner"):
            raise EvaluationInputError(f"view name {name!r} must match [a-z0-9_]+ and not start with 'learner'")
        if not 0 <= start < stop <= dim:
            raise EvaluationInputError(
                f"view {name!r} = [{start}, {stop}) is empty or outside the {dim} embedding columns"
            )
        views[name] = (int(start), int(stop))
    return views


#: A training statistic's name: ``clustering_share``, or one ``/`` level such as ``health/mask_std``, or an
#: evaluation metric of another checkpoint choice such as ``test_selected/R@1`` (never a bare metric name, which
#: would stand for the evaluation's own).
STAT_NAME = r"[a-z0-9_]+(/([a-z0-9_]+|R@[0-9]+|NMI|MAP@R|RP))?"


def check_stats(names: np.ndarray | None, values: np.ndarray | None) -> dict[str, float]:
    """(S,) distinct names matching :data:`STAT_NAME` and (S,) finite numbers → ``{name: float}``.

    >>> check_stats(np.array(["health/mask_std", "test_selected/R@1"]), np.array([0.5, 0.25]))
    {'health/mask_std': 0.5, 'test_selected/R@1': 0.25}
    >>> check_stats(np.array(["R@1"]), np.array([0.25]))  # doctest: +ELLIPSIS
    Traceback (most recent call last):
    ...
    dmlbench.evaluation.validation.EvaluationInputError: stats must have names matching ...
    """
    if names is None and values is None:
        return {}
    if names is None or values is None:
        raise EvaluationInputError("stat_names and stat_values must be given together")
    names_list = [str(n) for n in np.asarray(names).ravel()]
    numbers = np.asarray(values, dtype=np.float64).ravel()
    if len(numbers) != len(names_list) or len(set(names_list)) != len(names_list):
        raise EvaluationInputError(f"stat_names {names_list} and stat_values {numbers.tolist()} must match one to one")
    bad = [n for n in names_list if not re.fullmatch(STAT_NAME, n)]
    if bad or not np.isfinite(numbers).all():
        raise EvaluationInputError(
            f"stats must have names matching {STAT_NAME} and finite values: {dict(zip(names_list, numbers))}"
        )
    return {name: float(value) for name, value in zip(names_list, numbers)}


def check_recall_ks(recall_ks: Sequence[int], database_size: int) -> list[int]:
    """Positive integer K values, each ≤ the database size; returned sorted and without duplicates."""
    ks = list(recall_ks)
    if not ks:
        raise EvaluationInputError("recall_ks is empty; give at least one K")
    if any(isinstance(k, bool) or not isinstance(k, int | np.integer) or k < 1 for k in ks):
        raise EvaluationInputError(f"recall_ks must be positive integers, got {ks}")
    if max(ks) > database_size:
        raise EvaluationInputError(
            f"Recall@{max(ks)} asks for more neighbours than the {database_size} database items "
            "a query is ranked against"
        )
    return sorted({int(k) for k in ks})


def check_positive(value: int | None, name: str, optional: bool = False) -> None:
    """``value`` is an integer ≥ 1 (or None when ``optional``)."""
    if optional and value is None:
        return
    if isinstance(value, bool) or not isinstance(value, int | np.integer) or value < 1:
        raise EvaluationInputError(f"{name} must be a positive integer, got {value!r}")
