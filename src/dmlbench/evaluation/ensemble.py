"""Ensembles of independently trained networks (MPN paper, Table 4): concatenated, L2-normalised embeddings.

The paper (after the Group Loss) builds an ensemble "by simply concatenating the features of k
independently trained networks". The honest version here: E runs of the same method that differ
only in their seed, each embedded on its own, then combined by :func:`concatenate_members`. Each
member becomes one learner slice, so the evaluation also reports every member's own metrics
(``learner{m}/R@1``) and their mean (``learners_mean/R@1``) next to the ensemble's.

Member seeds of ensemble seed s with E members: ``s·E, …, s·E + E − 1`` (:func:`member_seeds`),
so ensemble seed 0 reuses the single-network runs of seeds 0..E−1 and different ensemble seeds
never share a member. Command line (one ``.npz`` per member, as written by ``dmlbench embed``)::

    dmlbench ensemble MEMBER0.npz MEMBER1.npz ... --out ENSEMBLE.npz
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from pathlib import Path

import numpy as np

from dmlbench.atomic import write_npz_atomic
from dmlbench.evaluation.evaluate import l2_normalise
from dmlbench.evaluation.files import load_embeddings_npz
from dmlbench.paths import distinct_outputs

#: stats that add up over the members (the ensemble runs every member at test time).
ADDITIVE_STATS = ("num_parameters", "gflops")


def member_seeds(seed: int, members: int) -> list[int]:
    """Seeds of the member runs of ensemble seed ``seed`` with ``members`` networks.

    >>> member_seeds(0, 2), member_seeds(1, 2), member_seeds(0, 5)
    ([0, 1], [2, 3], [0, 1, 2, 3, 4])
    """
    if seed < 0 or members < 1:
        raise ValueError(f"need seed ≥ 0 and members ≥ 1, got seed {seed}, members {members}")
    return [seed * members + i for i in range(members)]


def _stats(members: Sequence[Mapping[str, np.ndarray]]) -> dict[str, float]:
    """Per stat name: the sum over members for :data:`ADDITIVE_STATS`, the mean otherwise; only names all share."""
    tables = [
        dict(zip(m["stat_names"].tolist(), m["stat_values"].tolist())) if "stat_names" in m else {} for m in members
    ]
    shared = [name for name in tables[0] if all(name in t for t in tables)]
    return {
        name: float(np.sum([t[name] for t in tables]) if name in ADDITIVE_STATS else np.mean([t[name] for t in tables]))
        for name in shared
    }


def concatenate_members(
    members: Sequence[Mapping[str, np.ndarray]], names: Sequence[str] | None = None
) -> dict[str, np.ndarray]:
    """Ensemble of E embedding sets of the same test images: each L2-normalised, then concatenated.

    Args:
        members: E ≥ 2 mappings like :func:`~dmlbench.evaluation.files.load_embeddings_npz` returns
            (``embeddings`` (N, d_e), ``labels`` (N,), optional ``split``, ``stat_names`` / ``stat_values``);
            same rows in the same order (labels and split must agree). A member's own learner
            slices and views are not carried over: each member is one learner of the ensemble.

        names: what error messages call each member (its file); default ``member 0``, ``member 1``, …

    Returns:
        ``embeddings`` (N, Σ d_e) float32 whose rows have norm √E, ``labels``, ``split`` (if the
        members have one), ``learner_slices`` (E, 2), and the combined stats (:data:`ADDITIVE_STATS`
        summed, other shared stats averaged).

    Raises:
        ValueError: fewer than two members, or members that disagree on the rows.
    """
    if len(members) < 2:
        raise ValueError(f"an ensemble needs at least 2 members, got {len(members)}")
    names = list(names) if names is not None else [f"member {m}" for m in range(len(members))]
    labels = np.asarray(members[0]["labels"])
    fix = "embed every member from the same prepared dataset (same test rows in the same order)"
    for name, member in zip(names[1:], members[1:], strict=True):
        if not np.array_equal(np.asarray(member["labels"]), labels):
            raise ValueError(f"ensemble: {name} has other labels (or another row order) than {names[0]}; {fix}")
        if ("split" in member) != ("split" in members[0]) or (
            "split" in member and not np.array_equal(member["split"], members[0]["split"])
        ):
            raise ValueError(f"ensemble: {name} has another query/gallery split than {names[0]}; {fix}")
        if len(member["embeddings"]) != len(labels):
            raise ValueError(f"ensemble: {name} has {len(member['embeddings'])} rows for {len(labels)} labels")
    parts = [l2_normalise(np.asarray(member["embeddings"], dtype=np.float32)) for member in members]
    bounds = np.cumsum([0] + [p.shape[1] for p in parts])
    result: dict[str, np.ndarray] = {
        "embeddings": np.ascontiguousarray(np.concatenate(parts, axis=1)),
        "labels": labels,
        "learner_slices": np.stack([bounds[:-1], bounds[1:]], axis=1).astype(np.int64),
    }
    if "split" in members[0]:
        result["split"] = members[0]["split"]
    stats = _stats(members)
    if stats:
        result["stat_names"] = np.asarray(list(stats), dtype=str)
        result["stat_values"] = np.asarray(list(stats.values()), dtype=np.float64)
    return result


def ensemble_files(member_paths: Sequence[str | Path], out_path: str | Path) -> Path:
    """Read the members' ``.npz`` files, write the ensemble's (atomically); returns ``out_path``.

    Raises:
        SameFileError: ``out_path`` is one of the members.
    """
    out_path = Path(out_path)
    distinct_outputs({"--out": out_path}, inputs={f"MEMBER{i}": p for i, p in enumerate(member_paths)})
    members = [load_embeddings_npz(p) for p in member_paths]
    write_npz_atomic(out_path, **concatenate_members(members, names=[str(p) for p in member_paths]))
    return out_path
