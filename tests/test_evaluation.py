"""Behaviour of dmlbench.evaluation against hand-computed answers and pytorch-metric-learning."""

from __future__ import annotations

import json
from collections.abc import Iterator
from fractions import Fraction

import numpy as np
import pytest

from dmlbench.evaluation import (
    KMeansSettings,
    evaluate_embeddings,
    evaluate_file,
    evaluate_views,
    recall_at_k,
    retrieval,
)
from dmlbench.evaluation.clustering import clustering_nmi
from dmlbench.evaluation.knn import faiss_threads, make_index, search

FAST_KMEANS = KMeansSettings(seed=0, niter=10, nredo=1)


@pytest.fixture(autouse=True)
def single_faiss_thread() -> Iterator[None]:
    """One faiss thread: on these tiny inputs OpenMP start-up and barriers cost more than the work."""
    with faiss_threads(1):
        yield


def line(*positions: float) -> np.ndarray:
    """Points on a line as an (N, 1) float32 embedding."""
    return np.array(positions, dtype=np.float32)[:, None]


def clustered(
    num_classes: int, per_class: int, dim: int, seed: int, spread: float = 0.6
) -> tuple[np.ndarray, np.ndarray]:
    """Gaussian blobs around random centres: (N, d) float32 and (N,) labels."""
    rng = np.random.default_rng(seed)
    centres = rng.normal(size=(num_classes, dim))
    labels = np.repeat(np.arange(num_classes), per_class)
    x = centres[labels] + spread * rng.normal(size=(len(labels), dim))
    return x.astype(np.float32), labels


# Six points on a line, classes A=0, B=1, C=2:
#   row   0    1    2    3    4    5
#   pos   0.0  1.0  3.0  4.5  6.5  10.5
#   class A    B    A    C    B    C
# Neighbours by distance (the query excluded) and the rank of the first same-class item:
#   0: 1(B,1)  2(A,3)                               -> 2
#   1: 0(A,1)  2(A,2)  3(C,3.5)  4(B,5.5)           -> 4
#   2: 3(C,1.5)  1(B,2)  0(A,3)                     -> 3
#   3: 2(A,1.5)  4(B,2)  1(B,3.5)  0(A,4.5)  5(C,6) -> 5
#   4: 3(C,2)  2(A,3.5)  5(C,4)  1(B,5.5)           -> 4
#   5: 4(B,4)  3(C,6)                               -> 2
SIX_POINTS = line(0.0, 1.0, 3.0, 4.5, 6.5, 10.5)
SIX_LABELS = np.array([0, 1, 0, 2, 1, 2])


def test_recall_at_k_hand_computed() -> None:
    assert recall_at_k(SIX_POINTS, SIX_LABELS, [1, 2, 3, 4, 5]) == {1: 0.0, 2: 2 / 6, 3: 3 / 6, 4: 5 / 6, 5: 1.0}


def test_evaluate_embeddings_recall_matches_recall_at_k() -> None:
    metrics = evaluate_embeddings(SIX_POINTS, SIX_LABELS, [1, 2, 3, 4, 5], kmeans=FAST_KMEANS)
    assert [metrics[f"R@{k}"] for k in (1, 2, 3, 4, 5)] == [0.0, 2 / 6, 3 / 6, 5 / 6, 1.0]


# Seven points on a line, classes A=0 (R=3), B=1 (R=1), C=2 (a lone item):
#   row   0    1    2    3    4    5     6
#   pos   0.0  1.0  2.2  3.5  5.0  10.5  30.0
#   class A    A    B    A    A    B     C
# First R neighbours, AP@R = (1/R) sum_i P(i) rel(i), RP = hits / R, first-hit rank:
#   0: A B A  (R=3)  AP = (1/1 + 2/3) / 3 = 5/9   RP = 2/3  rank 1
#   1: A B A  (R=3)  AP = 5/9                     RP = 2/3  rank 1
#   2: A      (R=1)  AP = 0                       RP = 0    rank 5 (1 A, 3 A, 0 A, 4 A, 5 B)
#   3: B A A  (R=3)  AP = (1/2 + 2/3) / 3 = 7/18  RP = 2/3  rank 2
#   4: A B A  (R=3)  AP = 5/9                     RP = 2/3  rank 1
#   5: A      (R=1)  AP = 0                       RP = 0    rank 3 (4 A, 3 A, 2 B)
#   6: lone (R=0), left out.
# MAP@R = (3 * 5/9 + 7/18) / 6 = 37/108; RP = (4 * 2/3) / 6 = 4/9;
# R@1 = 3/6, R@2 = 4/6, R@3 = 5/6, R@5 = 6/6.
SEVEN_POINTS = line(0.0, 1.0, 2.2, 3.5, 5.0, 10.5, 30.0)
SEVEN_LABELS = np.array([0, 0, 1, 0, 0, 1, 2])


def test_map_at_r_and_r_precision_hand_computed() -> None:
    metrics = evaluate_embeddings(SEVEN_POINTS, SEVEN_LABELS, [1, 2, 3, 5], kmeans=FAST_KMEANS)
    assert metrics["MAP@R"] == pytest.approx(float(Fraction(37, 108)), abs=1e-15)
    assert metrics["RP"] == pytest.approx(4 / 9, abs=1e-15)
    assert [metrics[f"R@{k}"] for k in (1, 2, 3, 5)] == [3 / 6, 4 / 6, 5 / 6, 1.0]
    assert (metrics["num_queries"], metrics["num_lone_queries"], metrics["num_classes"]) == (6.0, 1.0, 3.0)


def test_result_is_flat_dict_of_floats_with_kmeans_settings() -> None:
    metrics = evaluate_embeddings(SEVEN_POINTS, SEVEN_LABELS, [1], kmeans=KMeansSettings(seed=7, niter=3, nredo=2))
    assert all(type(value) is float for value in metrics.values())
    assert (metrics["kmeans_seed"], metrics["kmeans_niter"], metrics["kmeans_nredo"]) == (7.0, 3.0, 2.0)
    assert set(metrics) == {
        "R@1", "NMI", "MAP@R", "RP", "num_queries", "num_lone_queries", "num_classes",
        "kmeans_seed", "kmeans_niter", "kmeans_nredo", "kmeans_iterations",
    }  # fmt: skip
    assert 1 <= metrics["kmeans_iterations"] <= 3


def test_query_never_retrieves_itself_among_duplicates() -> None:
    # Rows 0 and 1 coincide but differ in class, as do rows 2 and 3. Excluding by
    # distance 0 would drop the duplicate too; retrieving oneself would give R@1 = 1.
    x = np.array([[0, 0], [0, 0], [5, 0], [5, 0]], dtype=np.float32)
    labels = np.array([0, 1, 0, 1])
    assert recall_at_k(x, labels, [1, 3]) == {1: 0.0, 3: 1.0}


def test_self_excluded_by_index_when_more_duplicates_than_k() -> None:
    x = np.zeros((6, 3), dtype=np.float32)
    rows = np.arange(6)
    neighbours = search(make_index(x, k=3), x, rows, k=2, exclude_self=True)
    assert not (neighbours == rows[:, None]).any()
    # exact ties are ordered by row index
    assert neighbours.tolist() == [[1, 2], [0, 2], [0, 1], [0, 1], [0, 1], [0, 1]]


# Query/gallery example on a line:
#   row    0      1        2      3        4
#   pos    0.0    1.0      0.4    3.0      1.8
#   class  A      B        A      A        B
#   split  query  gallery  query  gallery  query
# All-vs-all nearest neighbours: 0->2 (A, hit), 1->2 (miss), 2->0 (hit), 3->4 (miss), 4->1 (hit): R@1 = 3/5.
# Query/gallery (gallery = rows 1, 3): 0->1 (miss), 2->1 (miss), 4->1 (hit): R@1 = 1/3, each R = 1,
# so MAP@R = RP = 1/3.
QG_POINTS = line(0.0, 1.0, 0.4, 3.0, 1.8)
QG_LABELS = np.array([0, 1, 0, 0, 1])
QG_SPLIT = np.array(["query", "gallery", "query", "gallery", "query"])


def test_query_gallery_protocol_differs_from_all_vs_all() -> None:
    everything = evaluate_embeddings(QG_POINTS, QG_LABELS, [1], kmeans=FAST_KMEANS)
    split = evaluate_embeddings(QG_POINTS, QG_LABELS, [1, 2], split=QG_SPLIT, kmeans=FAST_KMEANS)
    assert everything["R@1"] == 3 / 5
    assert (split["R@1"], split["R@2"], split["MAP@R"], split["RP"]) == (1 / 3, 1.0, 1 / 3, 1 / 3)
    assert split["num_queries"] == 3.0


def test_learner_slices_match_each_slice_evaluated_alone() -> None:
    x, labels = clustered(num_classes=12, per_class=6, dim=10, seed=1)
    x[:, :4] *= 5.0  # the learners are not unit-norm: each must be normalised on its own
    slices = np.array([[4, 10], [0, 4]])
    metrics = evaluate_embeddings(x, labels, [1, 4], learner_slices=slices, kmeans=FAST_KMEANS)
    full = {k: v for k, v in metrics.items() if "/" not in k}
    assert full == evaluate_embeddings(x, labels, [1, 4], kmeans=FAST_KMEANS)  # the full embedding as given
    for m, (start, stop) in enumerate(slices):
        part = x[:, start:stop] / np.linalg.norm(x[:, start:stop], axis=1, keepdims=True)
        alone = evaluate_embeddings(part, labels, [1, 4], kmeans=FAST_KMEANS)
        for name in ("R@1", "R@4", "NMI", "MAP@R", "RP"):
            assert metrics[f"learner{m}/{name}"] == alone[name], (m, name)


def test_chunk_size_and_second_pass_do_not_change_results(monkeypatch: pytest.MonkeyPatch) -> None:
    # Integer coordinates keep every float32 distance exact, so faiss's direct and
    # BLAS kernels (chosen by the number of queries per call) agree bit for bit,
    # and the many exact ties exercise the deterministic tie-breaking.
    rng = np.random.default_rng(3)
    x = rng.integers(-3, 4, size=(200, 6)).astype(np.float32)
    labels = rng.integers(0, 15, size=200)
    split = np.where(rng.random(200) < 0.4, "query", "gallery")
    ks = [1, 2, 8, 30]
    for protocol in ({}, {"split": split}):
        reference = evaluate_embeddings(x, labels, ks, chunk_size=4096, kmeans=FAST_KMEANS, **protocol)
        assert evaluate_embeddings(x, labels, ks, chunk_size=3, kmeans=FAST_KMEANS, **protocol) == reference
        with monkeypatch.context() as patch:
            patch.setattr(retrieval, "FIRST_PASS_K", 1)  # most queries need the deeper search for K > max R
            assert evaluate_embeddings(x, labels, ks, chunk_size=7, kmeans=FAST_KMEANS, **protocol) == reference
    assert recall_at_k(x, labels, [1, 5], chunk_size=7) == recall_at_k(x, labels, [1, 5])


def test_deterministic_and_thread_count_independent() -> None:
    x, labels = clustered(num_classes=20, per_class=5, dim=8, seed=2)
    first = evaluate_embeddings(x, labels, [1, 2], kmeans=FAST_KMEANS)
    assert evaluate_embeddings(x, labels, [1, 2], kmeans=FAST_KMEANS) == first
    assert evaluate_embeddings(x, labels, [1, 2], kmeans=FAST_KMEANS, num_threads=2) == first


def test_agrees_with_pytorch_metric_learning() -> None:
    torch = pytest.importorskip("torch")
    accuracy_calculator = pytest.importorskip("pytorch_metric_learning.utils.accuracy_calculator")
    inference = pytest.importorskip("pytorch_metric_learning.utils.inference")
    x, labels = clustered(num_classes=40, per_class=7, dim=16, seed=4, spread=0.9)
    labels[-20:] = 100 + np.arange(20)  # 20 lone items, and class 37 keeps a single item
    settings = KMeansSettings(seed=3, niter=20, nredo=1)
    ours = evaluate_embeddings(x, labels, [1], kmeans=settings)

    num_clusters = len(np.unique(labels))
    kmeans_func = inference.FaissKMeans(
        niter=settings.niter,
        nredo=settings.nredo,
        seed=settings.seed,
        max_points_per_centroid=-(-len(x) // num_clusters) + 1,
        min_points_per_centroid=1,
    )
    calculator = accuracy_calculator.AccuracyCalculator(
        include=("precision_at_1", "r_precision", "mean_average_precision_at_r", "NMI"),
        k="max_bin_count",
        device=torch.device("cpu"),
        kmeans_func=kmeans_func,
    )
    theirs = calculator.get_accuracy(torch.from_numpy(x), torch.from_numpy(labels))
    assert ours["num_lone_queries"] == 21.0
    assert ours["R@1"] == pytest.approx(theirs["precision_at_1"], abs=1e-12)
    assert ours["RP"] == pytest.approx(theirs["r_precision"], abs=1e-12)
    assert ours["MAP@R"] == pytest.approx(theirs["mean_average_precision_at_r"], abs=1e-12)
    assert ours["NMI"] == pytest.approx(theirs["NMI"], abs=1e-12)
    assert 0.1 < ours["MAP@R"] < 0.9  # the comparison is not between trivial values


def test_query_gallery_agrees_with_pytorch_metric_learning() -> None:
    torch = pytest.importorskip("torch")
    accuracy_calculator = pytest.importorskip("pytorch_metric_learning.utils.accuracy_calculator")
    x, labels = clustered(num_classes=30, per_class=8, dim=12, seed=9, spread=0.9)
    is_query = np.random.default_rng(10).random(len(x)) < 0.5
    is_query[labels == 0] = True  # class 0 has no gallery item: its queries are lone
    ours = evaluate_embeddings(x, labels, [1], split=np.where(is_query, "query", "gallery"), kmeans=FAST_KMEANS)

    calculator = accuracy_calculator.AccuracyCalculator(
        include=("precision_at_1", "r_precision", "mean_average_precision_at_r"),
        k="max_bin_count",
        device=torch.device("cpu"),
    )
    theirs = calculator.get_accuracy(
        torch.from_numpy(x[is_query]),
        torch.from_numpy(labels[is_query]),
        torch.from_numpy(x[~is_query]),
        torch.from_numpy(labels[~is_query]),
        ref_includes_query=False,
    )
    assert ours["num_lone_queries"] == 8.0
    assert ours["R@1"] == pytest.approx(theirs["precision_at_1"], abs=1e-12)
    assert ours["RP"] == pytest.approx(theirs["r_precision"], abs=1e-12)
    assert ours["MAP@R"] == pytest.approx(theirs["mean_average_precision_at_r"], abs=1e-12)


def test_nmi_is_one_on_separated_clusters_and_low_on_random_labels() -> None:
    x, labels = clustered(num_classes=4, per_class=25, dim=8, seed=6, spread=0.01)
    settings = KMeansSettings(seed=0, niter=20, nredo=5)
    assert evaluate_embeddings(x, labels, [1], kmeans=settings)["NMI"] == pytest.approx(1.0)
    shuffled = np.random.default_rng(0).permutation(labels)
    assert evaluate_embeddings(x, shuffled, [1], kmeans=settings)["NMI"] < 0.15


@pytest.mark.parametrize(
    ("change", "message"),
    [
        (
            {"embeddings": np.array([[0.0], [np.nan], [1.0], [np.inf]], dtype=np.float32)},
            r"non-finite values .* in 2 of 4 rows; first bad rows: \[1, 3\]",
        ),
        ({"labels": np.array([0, 0, 1])}, r"labels has 3 entries but embeddings has 4 rows"),
        ({"labels": np.array([0.0, 0.0, 1.0, 1.0])}, r"labels must be integers"),
        ({"split": np.array(["query", "gallery", "test", "query"])}, r"'query' or 'gallery'; found 'test'"),
        ({"split": np.array(["query"] * 4)}, r"no 'gallery' rows"),
        ({"learner_slices": np.array([[0, 1], [1, 3]])}, r"slice 1 = \[1, 3\) .* outside the 2 embedding columns"),
        ({"learner_slices": np.array([[0, 2], [1, 2]])}, r"learner slices 0 = \[0, 2\) and 1 = \[1, 2\) overlap"),
        ({"recall_ks": [1, 4]}, r"Recall@4 asks for more neighbours than the 3 database items"),
        ({"recall_ks": []}, r"recall_ks is empty"),
        ({"labels": np.array([0, 1, 2, 3])}, r"none of the 4 queries has an item of its class"),
        ({"chunk_size": 0}, r"chunk_size must be a positive integer"),
    ],
)
def test_invalid_inputs_raise_informative_errors(change: dict, message: str) -> None:
    arguments = {
        "embeddings": np.array([[0.0, 1.0], [1.0, 0.0], [2.0, 2.0], [3.0, 1.0]], dtype=np.float32),
        "labels": np.array([0, 0, 1, 1]),
        "recall_ks": [1],
        "kmeans": FAST_KMEANS,
    }
    with pytest.raises((ValueError, TypeError), match=message):
        evaluate_embeddings(**(arguments | change))


def test_kmeans_settings_are_validated() -> None:
    with pytest.raises(ValueError, match=r"niter must be >= 1"):
        KMeansSettings(niter=0)
    with pytest.raises(TypeError, match=r"seed must be an int"):
        KMeansSettings(seed=1.5)  # type: ignore[arg-type]


def test_evaluate_file_round_trip(tmp_path) -> None:
    npz = tmp_path / "embeddings.npz"
    np.savez(npz, embeddings=QG_POINTS, labels=QG_LABELS, split=QG_SPLIT)
    out = tmp_path / "metrics" / "test.json"
    returned = evaluate_file(npz, out, [1, 2], kmeans=FAST_KMEANS)
    text = out.read_text()
    assert (
        json.loads(text)
        == returned
        == evaluate_embeddings(QG_POINTS, QG_LABELS, [1, 2], split=QG_SPLIT, kmeans=FAST_KMEANS)
    )
    assert list(json.loads(text)) == sorted(returned)
    assert text == json.dumps(returned, sort_keys=True, indent=2) + "\n"
    assert [p.name for p in out.parent.iterdir()] == ["test.json"]  # no temporary file left
    evaluate_file(npz, out, [1, 2], kmeans=FAST_KMEANS)
    assert out.read_text() == text  # same inputs, identical JSON


def test_evaluate_file_with_learner_slices(tmp_path) -> None:
    x, labels = clustered(num_classes=6, per_class=4, dim=6, seed=8)
    npz = tmp_path / "e.npz"
    np.savez(npz, embeddings=x, labels=labels, learner_slices=np.array([[0, 3], [3, 6]]))
    metrics = evaluate_file(npz, tmp_path / "m.json", [1], kmeans=FAST_KMEANS)
    assert {"learner0/R@1", "learner1/NMI", "learner1/MAP@R", "learner0/RP"} <= set(metrics)


def test_evaluate_file_key_errors_name_file_and_key(tmp_path) -> None:
    missing = tmp_path / "missing.npz"
    np.savez(missing, embeddings=QG_POINTS)
    with pytest.raises(ValueError, match=r"missing\.npz: missing required key 'labels'"):
        evaluate_file(missing, tmp_path / "out.json", [1])
    unknown = tmp_path / "unknown.npz"
    np.savez(unknown, embeddings=QG_POINTS, labels=QG_LABELS, splits=QG_SPLIT)
    with pytest.raises(ValueError, match=r"unknown\.npz: unknown key\(s\) \['splits'\]"):
        evaluate_file(unknown, tmp_path / "out.json", [1])
    bad = tmp_path / "bad.npz"
    np.savez(bad, embeddings=QG_POINTS, labels=QG_LABELS, split=np.array(["query", "x", "query", "gallery", "query"]))
    with pytest.raises(ValueError, match=r"bad\.npz: split values"):
        evaluate_file(bad, tmp_path / "out.json", [1])
    assert not (tmp_path / "out.json").exists()


# ------------------------------------------------------------------ per-query results


@pytest.mark.parametrize("ks", [[1], [1, 2, 3, 5]])
def test_per_query_file_hand_computed(tmp_path, ks) -> None:
    """SEVEN_POINTS (table above): first-hit ranks 1, 1, 5, 2, 1, 3 for rows 0-5 (row 6 is lone). With ks = [1]
    only R = 3 neighbours are searched, so row 2's rank 5 comes from the exhaustive count."""
    npz = tmp_path / "e.npz"
    np.savez(npz, embeddings=SEVEN_POINTS, labels=SEVEN_LABELS)
    metrics = evaluate_file(npz, tmp_path / "m.json", ks, kmeans=FAST_KMEANS, per_query_path=tmp_path / "pq.npz")
    with np.load(tmp_path / "pq.npz") as saved:
        per_query = dict(saved)
    assert per_query["row"].tolist() == [0, 1, 2, 3, 4, 5]
    assert per_query["label"].tolist() == [0, 0, 1, 0, 0, 1]
    assert per_query["num_relevant"].tolist() == [3, 3, 1, 3, 3, 1]
    assert per_query["first_hit_rank"].tolist() == [1, 1, 5, 2, 1, 3]
    ap = [Fraction(5, 9), Fraction(5, 9), 0, Fraction(7, 18), Fraction(5, 9), 0]
    assert per_query["ap_at_r"] == pytest.approx([float(a) for a in ap], abs=1e-15)
    assert per_query["r_precision"] == pytest.approx([2 / 3, 2 / 3, 0, 2 / 3, 2 / 3, 0], abs=1e-15)
    for k in ks:
        assert np.mean(per_query["first_hit_rank"] <= k) == metrics[f"R@{k}"]
    assert per_query["ap_at_r"].mean() == metrics["MAP@R"] and per_query["r_precision"].mean() == metrics["RP"]


def test_per_query_ranks_beyond_the_search_in_both_protocols() -> None:
    """SIX_POINTS with K = 1 (every first hit lies beyond rank 1): ranks 2, 4, 3, 5, 4, 2 by the exhaustive
    count. Query/gallery (QG_*, gallery rows 1 and 3): query 0 → 1 (B, miss), 3 (A); 2 → 1 (miss), 3; 4 → 1 (B)."""
    six = evaluate_views(SIX_POINTS, SIX_LABELS, [1], kmeans=FAST_KMEANS).per_query
    assert six["first_hit_rank"].tolist() == [2, 4, 3, 5, 4, 2]
    split = evaluate_views(QG_POINTS, QG_LABELS, [1], split=QG_SPLIT, kmeans=FAST_KMEANS).per_query
    assert (split["row"].tolist(), split["first_hit_rank"].tolist()) == ([0, 2, 4], [2, 2, 1])


def test_per_query_arrays_of_each_learner() -> None:
    x, labels = clustered(num_classes=5, per_class=4, dim=6, seed=3)
    evaluation = evaluate_views(x, labels, [1, 2], learner_slices=np.array([[0, 3], [3, 6]]), kmeans=FAST_KMEANS)
    for prefix in ("", "learner0/", "learner1/"):
        ranks = evaluation.per_query[f"{prefix}first_hit_rank"]
        assert np.mean(ranks <= 2) == evaluation.metrics[f"{prefix}R@2"]
        assert evaluation.per_query[f"{prefix}ap_at_r"].mean() == evaluation.metrics[f"{prefix}MAP@R"]


def test_kmeans_records_the_iterations_it_ran_below_the_ceiling_at_a_fixed_point() -> None:
    """niter is a ceiling: K-means stops once the objective no longer changes, and metrics.json says when."""
    rng = np.random.default_rng(0)
    x = np.concatenate([rng.normal(c, 0.3, size=(60, 4)) for c in (0.0, 3.0, 6.0, 9.0)]).astype(np.float32)
    labels = np.repeat(np.arange(4), 60)
    converged = clustering_nmi(x, labels, KMeansSettings(niter=100))
    capped = clustering_nmi(x, labels, KMeansSettings(niter=1))
    assert 2 <= converged[1] < 100 and capped[1] == 1
    assert clustering_nmi(x, labels, KMeansSettings(niter=int(converged[1]) + 20)) == converged  # a fixed point
    assert evaluate_embeddings(x, labels, [1], kmeans=KMeansSettings(niter=100))["kmeans_iterations"] == converged[1]
