"""Multi-learner evaluation: per-learner means, self-pair similarity, named views, stats passthrough."""

from __future__ import annotations

import numpy as np
import pytest

from dmlbench.evaluation import evaluate_embeddings
from dmlbench.evaluation.evaluate import self_pair_similarity


def brute_force_self_similarity(x: np.ndarray, slices: list[tuple[int, int]]) -> float:
    parts = [x[:, a:b] / np.linalg.norm(x[:, a:b], axis=1, keepdims=True) for a, b in slices]
    values = [
        float(np.sum(parts[m][i] * parts[n][i]))
        for i in range(len(x))
        for m in range(len(parts))
        for n in range(len(parts))
        if m != n
    ]
    return float(np.mean(values))


def test_self_pair_similarity_matches_brute_force():
    x = np.random.default_rng(0).normal(size=(7, 12)).astype(np.float32)
    slices = [(0, 4), (4, 8), (8, 12)]
    assert self_pair_similarity(x, slices) == pytest.approx(brute_force_self_similarity(x, slices), abs=1e-6)


def test_self_pair_similarity_of_identical_learners_is_one():
    half = np.random.default_rng(1).normal(size=(5, 3)).astype(np.float32)
    assert self_pair_similarity(np.hstack([half, 2 * half]), [(0, 3), (3, 6)]) == pytest.approx(1.0)


def test_self_pair_similarity_needs_equal_widths():
    with pytest.raises(ValueError, match="equal width"):
        self_pair_similarity(np.ones((2, 5), np.float32), [(0, 2), (2, 5)])


@pytest.fixture
def two_learners():
    """Learner 0 separates the classes perfectly, learner 1 is noise."""
    rng = np.random.default_rng(0)
    labels = np.repeat(np.arange(4), 5)
    centres = np.eye(4, dtype=np.float32) * 10
    good = centres[labels] + rng.normal(scale=0.1, size=(20, 4)).astype(np.float32)
    noise = rng.normal(size=(20, 4)).astype(np.float32)
    return np.hstack([good, noise]), labels


def test_learner_metrics_and_their_mean(two_learners):
    x, labels = two_learners
    metrics = evaluate_embeddings(x, labels, [1], learner_slices=np.array([[0, 4], [4, 8]]))
    assert metrics["learner0/R@1"] == 1.0
    assert metrics["learners_mean/R@1"] == pytest.approx((1.0 + metrics["learner1/R@1"]) / 2)
    assert metrics["learners_mean/NMI"] == pytest.approx((metrics["learner0/NMI"] + metrics["learner1/NMI"]) / 2)
    assert metrics["self_similarity"] == pytest.approx(self_pair_similarity(x, [(0, 4), (4, 8)]))


def test_named_views_and_stats(two_learners):
    x, labels = two_learners
    metrics = evaluate_embeddings(
        x,
        labels,
        [1],
        view_names=np.array(["good"]),
        view_slices=np.array([[0, 4]]),
        stat_names=np.array(["num_parameters", "gflops", "health/mask_std"]),
        stat_values=np.array([1234.0, 0.5, 0.2]),
    )
    assert metrics["good/R@1"] == 1.0
    assert metrics["num_parameters"] == 1234.0 and metrics["gflops"] == 0.5 and metrics["health/mask_std"] == 0.2
    assert "self_similarity" not in metrics and "learners_mean/R@1" not in metrics


@pytest.mark.parametrize(
    ("kwargs", "message"),
    [
        ({"view_names": np.array(["a"])}, "given together"),
        ({"view_names": np.array(["a", "a"]), "view_slices": np.array([[0, 2], [2, 4]])}, "repeat"),
        ({"view_names": np.array(["learner9"]), "view_slices": np.array([[0, 2]])}, "not start with 'learner'"),
        ({"view_names": np.array(["a"]), "view_slices": np.array([[0, 9]])}, "outside the 8"),
        ({"stat_names": np.array(["x"]), "stat_values": np.array([np.nan])}, "finite"),
        ({"stat_names": np.array(["x", "y"]), "stat_values": np.array([1.0])}, "one to one"),
        ({"stat_names": np.array(["health/a/b"]), "stat_values": np.array([1.0])}, "names matching"),
    ],
)
def test_bad_views_and_stats_are_clear_errors(two_learners, kwargs, message):
    x, labels = two_learners
    with pytest.raises(ValueError, match=message):
        evaluate_embeddings(x, labels, [1], **kwargs)
