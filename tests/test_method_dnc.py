"""Divide and conquer (``recipe: dnc``): slice masking, cluster matching, phases (warm-up, divide, fine-tune),
merged loss, mechanism health, K = 1 = baseline, resume."""

from __future__ import annotations

import copy
from pathlib import Path
from types import SimpleNamespace

import numpy as np
import pandas as pd
import pytest
import torch

from dmlbench.data.samplers import ClassBalancedBatchSampler
from dmlbench.methods import OptionsError, TrainContext, build_recipe
from dmlbench.methods.dnc import MIN_CLUSTER_BALANCE, MIN_FIRST_NMI_EXCESS
from dmlbench.methods.dnc_clustering import (
    ClusterBatchSampler,
    grouping_health,
    match_clusters,
    random_partition,
    read_class_groups,
    training_class_groups,
)
from dmlbench.methods.health import failed_checks
from dmlbench.training.checkpoint import load_checkpoint
from dmlbench.training.data import load_run_data
from dmlbench.training.optim import build_optimizer
from dmlbench.training.trainer import train_run

from conftest import tiny_run

TIMING_COLUMNS = ["seconds", "images_per_s", "loader_wait_share", "clustering_seconds"]


class Interrupted(Exception):
    pass


def dnc_run(params: dict, loss: dict, epochs: int = 3, seed: int = 0, **options) -> dict:
    """A tiny ``recipe: dnc`` run; no warm-up unless ``warmup_epochs`` is given (the phase tests pick epochs)."""
    options.setdefault("warmup_epochs", 0)
    config = copy.deepcopy(params)
    config["methods"]["dnc_test"] = {"recipe": "dnc", "loss": loss, "options": options}
    return tiny_run(config, "dnc_test", seed=seed, epochs=epochs)


def train(run: dict, manifest: Path, root: Path, **kwargs):
    return train_run(run, manifest, root / "out", root / "scratch", progress=False, **kwargs)


def outputs(root: Path) -> tuple[dict, pd.DataFrame]:
    checkpoint = load_checkpoint(root / "out" / "checkpoint.pt")
    log = pd.read_csv(root / "out" / "log.csv")
    return checkpoint, log.drop(columns=[c for c in TIMING_COLUMNS if c in log.columns])


def fake_context(labels: np.ndarray) -> SimpleNamespace:
    return SimpleNamespace(data=SimpleNamespace(train=SimpleNamespace(labels=labels)))


def one_step(recipe, model, loss, labels: np.ndarray, rows: list[int], images: torch.Tensor) -> None:
    """One optimiser step (Adam with weight decay, as configured) on the batch of training rows ``rows``."""
    optimizer = build_optimizer(recipe.settings.optimizer, model, loss)
    optimizer.zero_grad(set_to_none=True)
    value = recipe.training_loss(model, loss, images, torch.as_tensor(labels[rows]), torch.as_tensor(rows))
    value.backward()
    optimizer.step()


def snapshot(module: torch.nn.Module) -> dict[str, torch.Tensor]:
    return {k: v.detach().clone() for k, v in module.state_dict().items()}


# --- the model and the loss per learner --------------------------------------------------------------


def test_a_batch_of_cluster_k_changes_only_learner_k_and_the_backbone(params):
    run = dnc_run(params, {"name": "proxy_nca"}, num_clusters=3, merged_beta="own")
    recipe = build_recipe(run)
    torch.manual_seed(0)
    model, loss = recipe.build_model(), recipe.build_loss(num_classes=4)
    model.train()
    labels = np.repeat(np.arange(4), 3)
    recipe.clusters = np.array([0, 0, 0, 1, 1, 1, 1, 1, 1, 2, 2, 2])  # cluster 1 = classes 1 and 2
    recipe.on_epoch_start(2, model, fake_context(labels))  # T = 2: no re-clustering at epoch 2
    before_model, before_loss = snapshot(model), snapshot(loss)
    rows = [3, 4, 5, 6, 7, 8]
    one_step(recipe, model, loss, labels, rows, torch.rand(len(rows), 3, 20, 20))
    grads = {name: p.grad for name, p in model.named_parameters()}
    for name, value in snapshot(model).items():
        if name.startswith("head.learners."):
            learner = int(name.split(".")[2])
            assert (grads[name] is None) == (learner != 1), name
            assert torch.equal(value, before_model[name]) == (learner != 1), name
    changed = [
        n for n, v in snapshot(model).items() if n.startswith("backbone.") and not torch.equal(v, before_model[n])
    ]
    assert changed  # the shared backbone learns
    for name, value in snapshot(loss).items():  # proxies: only learner 1's
        assert torch.equal(value, before_loss[name]) == (not name.startswith("learners.1.")), name
    assert [tuple(s) for s in model.learner_slices] == [(0, 3), (3, 6), (6, 8)]


def test_the_finetune_phase_trains_the_full_embedding(params):
    run = dnc_run(params, {"name": "triplet"}, epochs=3, num_clusters=2, finetune_epoch=3)
    recipe = build_recipe(run)
    model, loss = recipe.build_model(), recipe.build_loss(num_classes=4)
    model.train()
    labels = np.repeat(np.arange(4), 3)
    recipe.clusters = np.array([0] * 6 + [1] * 6)
    recipe.on_epoch_start(3, model, fake_context(labels))
    assert not recipe.learner_loss and set(recipe.active) == {0}
    before = snapshot(model)
    rows = [0, 1, 4, 7, 10, 11]  # classes of both former clusters in one batch
    images = torch.rand(len(rows), 3, 20, 20)
    with torch.no_grad():
        expected = loss.full(model.head.merged(model.backbone(images)), torch.as_tensor(labels[rows]))
    assert recipe.training_loss(
        model, loss, images, torch.as_tensor(labels[rows]), torch.as_tensor(rows)
    ).item() == pytest.approx(expected.item())
    one_step(recipe, model, loss, labels, rows, images)
    after = snapshot(model)
    for k in range(2):
        assert not torch.equal(after[f"head.learners.{k}.weight"], before[f"head.learners.{k}.weight"])
    merged = model.head.merged(model.backbone(images))
    assert torch.allclose(merged.norm(dim=1), torch.ones(len(rows)))


def test_full_embedding_loss_switch_keeps_cluster_batches(params):
    run = dnc_run(
        params,
        {"name": "triplet"},
        epochs=4,
        num_clusters=2,
        recluster_every=4,
        finetune_epoch=4,
        full_embedding_loss_epoch=3,
    )
    recipe = build_recipe(run)
    labels = np.repeat(np.arange(4), 3)
    recipe.clusters = np.array([0] * 6 + [1] * 6)
    phases = []
    for epoch in (2, 3, 4):
        recipe.on_epoch_start(epoch, None, fake_context(labels))
        phases.append((recipe.learner_loss, len(set(recipe.active.tolist()))))
    assert phases == [(True, 2), (False, 2), (False, 1)]


def tiny_context(params: dict, manifest: Path) -> SimpleNamespace:
    data = load_run_data(tiny_run(params), manifest)
    return TrainContext(data=data, device=torch.device("cpu"), eval_batch_size=16)


def test_warmup_trains_the_full_embedding_and_the_first_divide_epoch_clusters(params, tiny_manifest):
    run = dnc_run(params, {"name": "margin"}, epochs=6, num_clusters=2, warmup_epochs=2, finetune_epoch=6)
    recipe = build_recipe(run)
    context = tiny_context(params, tiny_manifest)
    model = recipe.build_model()
    phases = []
    for epoch in range(1, 7):
        recipe.on_epoch_start(epoch, model, context)
        phases.append(
            (
                recipe.learner_loss,
                recipe.clusters is not None,
                recipe.epoch_clustering > 0,
                len(set(recipe.active.tolist()) - {-1}),
            )
        )
    assert phases == [
        (False, False, False, 1),
        (False, False, False, 1),  # warm-up: no clustering, one group, full loss
        (True, True, True, 2),
        (True, True, False, 2),  # divide: K-means at W + 1 = 3, T = 2
        (True, True, True, 2),  # re-clustered at 5
        (False, True, False, 1),  # fine-tune
    ]
    assert len(recipe.grouping_health) == 2


def test_warmup_delays_fixed_partitions_too(params, tiny_manifest):
    recipe = build_recipe(
        dnc_run(params, {"name": "triplet"}, epochs=3, num_clusters=2, grouping="random", warmup_epochs=1)
    )
    context = tiny_context(params, tiny_manifest)
    recipe.on_epoch_start(1, None, context)
    assert recipe.clusters is None and not recipe.learner_loss
    recipe.on_epoch_start(2, None, context)
    assert sorted(set(recipe.clusters.tolist())) == [0, 1] and recipe.learner_loss


def test_warmup_must_leave_a_divide_epoch(params):
    with pytest.raises(ValueError, match=r"warmup_epochs \(2\) leaves no divide epoch before finetune_epoch \(3\)"):
        build_recipe(dnc_run(params, {"name": "triplet"}, warmup_epochs=2, finetune_epoch=3))
    with pytest.raises(ValueError, match=r"options\.warmup_epochs = 3 leaves no epoch to divide"):
        build_recipe(dnc_run(params, {"name": "triplet"}, warmup_epochs=3))


# --- the merged loss (merged_beta) ------------------------------------------------------------------------


def learned_beta_then_finetune(params: dict, merged_beta: str) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """A divide step on a batch of cluster 0 (classes 0, 1), then the fine-tune epoch.

    Returns: cluster 0's β after that step, the merged loss's β at the start of the fine-tune, the initial β.
    """
    run = dnc_run(params, {"name": "margin"}, epochs=3, num_clusters=2, finetune_epoch=3, merged_beta=merged_beta)
    run["training"]["optimizer"]["loss_lr_multiplier"] = 100.0
    recipe = build_recipe(run)
    torch.manual_seed(0)
    model, loss = recipe.build_model(), recipe.build_loss(num_classes=4)
    model.train()
    initial = loss.full.beta.detach().clone()
    labels = np.repeat(np.arange(4), 3)
    recipe.clusters = np.array([0] * 6 + [1] * 6)
    recipe.on_epoch_start(2, model, fake_context(labels))
    rows = [0, 1, 2, 3, 4, 5]
    one_step(recipe, model, loss, labels, rows, torch.rand(len(rows), 3, 20, 20))
    recipe.on_epoch_start(3, model, fake_context(labels))
    assert not recipe.learner_loss
    return loss.learners[0].beta.detach().clone(), loss.full.beta.detach().clone(), initial


def test_merged_beta_own_starts_the_finetune_at_the_initial_beta(params):
    cluster0, merged, initial = learned_beta_then_finetune(params, "own")
    assert torch.equal(merged, initial) and torch.equal(initial, torch.full((4,), 1.2))
    assert not torch.equal(cluster0[:2], initial[:2])  # cluster 0 did learn its classes' β


def test_merged_beta_cluster0_starts_the_finetune_from_cluster_0s_learned_beta(params):
    cluster0, merged, initial = learned_beta_then_finetune(params, "cluster0")
    assert torch.equal(merged, cluster0) and not torch.equal(merged[:2], initial[:2])


def test_merged_beta_cluster0_needs_a_width_free_loss(params):
    recipe = build_recipe(dnc_run(params, {"name": "proxy_nca"}, num_clusters=2))  # cluster0: the default
    with pytest.raises(ValueError, match=r"merged_beta = 'cluster0'.*'proxy_nca'.*use merged_beta: own"):
        recipe.build_loss(num_classes=4)


# --- mechanism health ---------------------------------------------------------------------------------------


def health_of(recipe, clusters: np.ndarray, labels: np.ndarray) -> dict[str, float]:
    """The run summary after one grouping ``clusters`` of the training rows."""
    recipe.clusters = clusters
    recipe._record_health(1, labels)
    return recipe.summary()


def test_grouping_health_by_hand():
    labels = np.array([0, 0, 1, 1, 2, 2, 3, 3])
    clusters = np.array([0, 0, 0, 0, 1, 1, 1, 2])  # sizes 4, 3, 1; N / K = 8 / 3
    health = grouping_health(clusters, labels, 3, np.random.default_rng(0))
    assert health["cluster_balance"] == pytest.approx(1 / 4)
    assert health["cluster_min_share"] == pytest.approx(3 / 8) and health["cluster_max_share"] == pytest.approx(12 / 8)
    # H(classes) = ln 4, H(clusters) = −(½ ln ½ + ⅜ ln ⅜ + ⅛ ln ⅛),
    # MI = H(clusters) − H(clusters | classes), H(clusters | classes) = ¼ × ln 2 (class 3 is split in halves).
    h_clusters = -(0.5 * np.log(0.5) + 0.375 * np.log(0.375) + 0.125 * np.log(0.125))
    mi = h_clusters - 0.25 * np.log(2)
    assert health["cluster_class_nmi"] == pytest.approx(2 * mi / (np.log(4) + h_clusters))


@pytest.mark.parametrize("grouping", ["kmeans", "kmeans_no_split"])
def test_health_checks_fail_on_dead_clusterings_and_pass_on_a_class_grouping(params, grouping):
    labels = np.repeat(np.arange(40), 40)  # the embedded default's 40 training classes × 40 images
    recipe = build_recipe(dnc_run(params, {"name": "margin"}, num_clusters=4, grouping=grouping))
    checks = recipe.health_checks()
    assert [c.key for c in checks] == ["health/cluster_balance", "health/cluster_class_nmi_first_excess"]
    by_class = labels % 4  # each class wholly in one of 4 equal clusters
    assert failed_checks(checks, health_of(recipe, by_class, labels)) == []
    one_cluster = np.zeros_like(labels)
    assert [
        f.split(" ")[0] for f in failed_checks(checks, health_of(build_recipe(recipe.run), one_cluster, labels))
    ] == ["health/cluster_balance", "health/cluster_class_nmi_first_excess"]
    random = random_partition(len(labels), 4, np.random.default_rng(0))
    random_health = health_of(build_recipe(recipe.run), random, labels)
    assert random_health["health/cluster_class_nmi_first_excess"] < MIN_FIRST_NMI_EXCESS / 5
    assert [f.split(" ")[0] for f in failed_checks(checks, random_health)] == ["health/cluster_class_nmi_first_excess"]
    skewed = np.where(labels < 2, 0, 1 + labels % 3)  # a K-means of untrained features: 80 vs ≈ 500 rows
    assert health_of(build_recipe(recipe.run), skewed, labels)["health/cluster_balance"] < MIN_CLUSTER_BALANCE


def test_health_checks_only_for_kmeans_with_several_clusters(params):
    assert build_recipe(dnc_run(params, {"name": "margin"}, num_clusters=1)).health_checks() == []
    assert build_recipe(dnc_run(params, {"name": "margin"}, num_clusters=2, grouping="random")).health_checks() == []


def test_clustering_of_class_structured_embeddings_passes_and_of_noise_fails(params, monkeypatch):
    """The path embedding → K-means → health: embeddings that carry the classes give a healthy first clustering,
    embeddings of an untrained network (noise) a dead one."""
    labels = np.repeat(np.arange(40), 40)
    rng = np.random.default_rng(0)
    centres = rng.standard_normal((40, 8))

    def first_clustering(embeddings: np.ndarray) -> list[str]:
        recipe = build_recipe(dnc_run(params, {"name": "margin"}, num_clusters=4))
        monkeypatch.setattr(recipe, "_training_embeddings", lambda model, context: embeddings.astype(np.float32))
        recipe.on_epoch_start(1, None, fake_context(labels))
        return [f.split(" ")[0] for f in failed_checks(recipe.health_checks(), recipe.summary())]

    assert first_clustering(centres[labels] + 0.3 * rng.standard_normal((len(labels), 8))) == []
    assert first_clustering(rng.standard_normal((len(labels), 8))) == ["health/cluster_class_nmi_first_excess"]


# --- grouping -----------------------------------------------------------------------------------------


def test_hungarian_matching_recovers_a_permutation():
    rng = np.random.default_rng(0)
    previous = rng.integers(0, 5, size=400)
    permutation = np.array([3, 0, 4, 1, 2])
    current = permutation[previous]
    noisy = current.copy()
    moved = rng.choice(400, size=40, replace=False)  # 10 % of the rows changed cluster
    noisy[moved] = rng.integers(0, 5, size=40)
    assert np.array_equal(match_clusters(previous, current, 5), previous)
    matched = match_clusters(previous, noisy, 5)
    assert np.array_equal(matched[np.setdiff1d(np.arange(400), moved)], previous[np.setdiff1d(np.arange(400), moved)])
    # the matched ids are a relabelling of the new clustering: the same partition
    assert len(set(zip(matched.tolist(), noisy.tolist()))) == 5


def test_matching_follows_iou_where_raw_overlap_disagrees():
    """Old clusters A = {0} (1 row), B = {1..8} (8), C = {9..11} (3). New: x = {0}, y = {1, 2}, z = {3..11}
    (6 rows of B and all of C). x keeps A's id either way. For y, z:
    IoU:  y→B 2/8 + z→C 3/9 = 0.583  >  y→C 0 + z→B 6/11 = 0.545   → y keeps B, z keeps C (appendix A);
    raw overlap (and the authors' L1 distance, = const − 2 × overlap): y→B, z→C 2 + 3 = 5 < 0 + 6, so z
    would take B."""
    previous = np.array([0] + [1] * 8 + [2] * 3)
    current = np.array([2] + [0] * 2 + [1] * 9)  # x = 2, y = 0, z = 1
    assert match_clusters(previous, current, 3).tolist() == [0] + [1] * 2 + [2] * 9


def test_cluster_sampler_batches_come_from_one_cluster_and_match_the_plain_sampler_for_one():
    labels = np.repeat(np.arange(8), 4)
    clusters = np.where(labels < 4, 0, 1)
    clusters[labels == 7] = -1
    sampler = ClusterBatchSampler(labels, clusters, 2, 2, torch.Generator().manual_seed(0), num_batches=200)
    seen = [set(clusters[batch].tolist()) for batch in sampler]
    assert all(len(s) == 1 and -1 not in s for s in seen)
    share = np.mean([s == {0} for s in seen])
    assert 0.4 < share < 0.6  # uniform over the two clusters
    assert sampler.finished_at is not None
    whole = list(ClusterBatchSampler(labels, np.zeros(32, dtype=int), 3, 2, torch.Generator().manual_seed(1)))
    plain = list(ClassBalancedBatchSampler(labels, 3, 2, torch.Generator().manual_seed(1)))
    assert whole == plain


def test_proportional_cluster_sampling_follows_sizes():
    labels = np.repeat(np.arange(8), 4)
    clusters = np.where(labels < 6, 0, 1)  # 24 vs 8 rows
    sampler = ClusterBatchSampler(
        labels, clusters, 2, 2, torch.Generator().manual_seed(0), num_batches=400, weighting="proportional"
    )
    share = np.mean([clusters[b[0]] == 0 for b in sampler])
    assert 0.68 < share < 0.82


def test_class_groups_follow_the_runs_training_labels(params, tiny_manifest, tmp_path):
    run = tiny_run(params, "triplet")
    data = load_run_data(run, tiny_manifest)
    frame = pd.read_csv(tiny_manifest)
    frame["group"] = frame["label"] // 2 + 10  # classes 0,1 → 10; 2,3 → 11; ...
    path = tmp_path / "groups.csv"
    frame[["label", "group", "split"]].drop_duplicates().to_csv(path, index=False)
    groups = training_class_groups(read_class_groups(path, "group"), data.train_classes)
    original = np.array([int(Path(p).name.split("_")[0]) for p in data.train.paths])  # images/<label>_<i>.png
    truth = np.unique(original // 2, return_inverse=True)[1]
    assert np.array_equal(groups[data.train.labels], truth)
    with pytest.raises(ValueError, match="does not describe this dataset"):
        training_class_groups(read_class_groups(path, "group"), np.append(data.train_classes, 999))


# --- whole runs ------------------------------------------------------------------------------------------


@pytest.mark.parametrize("loss", [{"name": "proxy_nca"}, {"name": "margin"}])
def test_one_cluster_is_the_baseline_bit_for_bit(params, tiny_manifest, tmp_path, loss):
    base = tiny_run(params, "proxy_nca" if loss["name"] == "proxy_nca" else "margin")
    base["method_config"]["loss"] = loss
    dnc = dnc_run(params, loss, num_clusters=1, finetune_epoch=3)
    dnc["training"] = copy.deepcopy(base["training"])
    train(base, tiny_manifest, tmp_path / "base")
    train(dnc, tiny_manifest, tmp_path / "dnc")
    (cb, lb), (cd, ld) = outputs(tmp_path / "base"), outputs(tmp_path / "dnc")
    assert [v for v in cb["model"].values()] and len(cb["model"]) == len(cd["model"])
    for (kb, vb), (kd, vd) in zip(cb["model"].items(), cd["model"].items(), strict=True):
        assert torch.equal(vb, vd), (kb, kd)
    assert [torch.equal(a, b) for a, b in zip(cb["loss"].values(), cd["loss"].values(), strict=True)] == [True] * len(
        cb["loss"]
    )
    pd.testing.assert_frame_equal(lb, ld[lb.columns])
    assert (ld["cluster_min"] == ld["cluster_max"]).all() and (ld["cluster_dropped"] == 0).all()


def test_kmeans_run_is_deterministic_resumable_and_logs_its_clusters(params, tiny_manifest, tmp_path):
    run = dnc_run(params, {"name": "margin"}, epochs=4, num_clusters=2, recluster_every=1, finetune_epoch=4)
    train(run, tiny_manifest, tmp_path / "full")

    def stop_after_two(epoch: int) -> None:
        if epoch == 2:
            raise Interrupted

    with pytest.raises(Interrupted):
        train(run, tiny_manifest, tmp_path / "cut", on_epoch_end=stop_after_two)
    assert train(run, tiny_manifest, tmp_path / "cut").epochs_run_now == 2
    (cf, lf), (cc, lc) = outputs(tmp_path / "full"), outputs(tmp_path / "cut")
    for key in cf["model"]:
        assert torch.equal(cf["model"][key], cc["model"][key]), key
    pd.testing.assert_frame_equal(lf, lc)
    full_log = pd.read_csv(tmp_path / "full" / "out" / "log.csv")
    assert (full_log["clustering_seconds"][:3] > 0).all() and full_log["clustering_seconds"][3] == 0
    assert (lf["cluster_min"][:3] > 0).all()
    train_rows = lf["cluster_max"][3]  # the fine-tune epoch: one cluster of every training row
    assert (lf["cluster_min"][:3] + lf["cluster_max"][:3] + lf["cluster_dropped"][:3] == train_rows).all()
    summary = cf["summary"]
    assert 0 < summary["clustering_share"] < 1
    assert summary["clustering_share"] == pytest.approx(summary["clustering_seconds"] / summary["training_seconds"])
    assert cf["model"]["head.learners.1.weight"].shape[0] == 4  # 8 dims, 2 learners
    assert lf["health/cluster_balance"][:3].notna().all() and lf["health/cluster_balance"][3:].isna().all()
    health = {k: v for k, v in summary.items() if k.startswith("health/")}
    assert health["health/groupings"] == 3 and health == {k: cc["summary"][k] for k in health}  # resumed too
    assert health["health/cluster_balance"] == pytest.approx(lf["health/cluster_balance"].min())


def test_clustering_does_not_disturb_the_training_random_stream(params, tiny_manifest, tmp_path):
    """Same seed, K-means vs fixed random partition: identical batches need identical augmentations,
    so the embedding pass of the clustering must not draw from torch's global RNG."""
    run = dnc_run(params, {"name": "triplet"}, epochs=1, num_clusters=2)
    recipe = build_recipe(run)
    data = load_run_data(run, tiny_manifest)
    model = recipe.build_model()
    context = TrainContext(data=data, device=torch.device("cpu"), eval_batch_size=16)
    torch.manual_seed(5)
    recipe.on_epoch_start(1, model, context)
    after_clustering = torch.rand(3)
    torch.manual_seed(5)
    assert torch.equal(after_clustering, torch.rand(3))
    assert sorted(set(recipe.clusters.tolist())) == [0, 1]


def test_grouping_variants(params, tiny_manifest, tmp_path):
    frame = pd.read_csv(tiny_manifest)
    frame["family"] = frame["label"] % 3
    path = tmp_path / "families.csv"
    frame[["label", "family", "split"]].drop_duplicates().to_csv(path, index=False)
    data = load_run_data(tiny_run(params), tiny_manifest)
    context = TrainContext(data=data, device=torch.device("cpu"), eval_batch_size=16)
    families = dnc_run(
        params,
        {"name": "triplet"},
        num_clusters=2,
        grouping="class_families",
        class_groups_file=str(path),
        class_groups_column="family",
    )
    recipe = build_recipe(families)
    recipe.on_epoch_start(1, recipe.build_model(), context)
    per_class = pd.Series(recipe.clusters).groupby(data.train.labels).nunique()
    assert (per_class == 1).all() and set(recipe.clusters.tolist()) == {0, 1}
    random = build_recipe(dnc_run(params, {"name": "triplet"}, num_clusters=3, grouping="random"))
    random.on_epoch_start(1, None, context)
    assert np.bincount(random.clusters).max() - np.bincount(random.clusters).min() <= 1
    whole = build_recipe(dnc_run(params, {"name": "proxy_nca"}, num_clusters=3, grouping="kmeans_no_split"))
    model, loss = whole.build_model(), whole.build_loss(data.num_classes)
    assert model.learner_slices is None and len(loss.learners) == 1 and loss.merged is None
    whole.on_epoch_start(1, model, context)
    assert not whole.learner_loss and len(set(whole.clusters.tolist())) == 3


@pytest.mark.parametrize(
    ("options", "message"),
    [
        ({"finetune_epoch": 9}, r"methods\.dnc_test\.options\.finetune_epoch = 9 is after the last epoch"),
        ({"num_clusters": 16}, r"num_clusters = 16 exceeds training\.embedding_dim = 8"),
        ({"num_clusters": 0}, r"num_clusters must be ≥ 1"),
        ({"finetune_epoch": 2, "full_embedding_loss_epoch": 3}, r"must not come after finetune_epoch"),
        ({"grouping": "kmeans_split"}, r"grouping = 'kmeans_split' does not have the expected type"),
    ],
)
def test_option_errors_name_the_key(params, options, message):
    with pytest.raises((ValueError, OptionsError), match=message):
        build_recipe(dnc_run(params, {"name": "triplet"}, **options))


def test_class_families_need_a_file_on_real_data(params):
    run = dnc_run(params, {"name": "triplet"}, grouping="class_families")
    run["dataset"], run["dataset_config"] = "cub200", {"kind": "cub200"}
    with pytest.raises(ValueError, match=r"class_groups_file is required.*'cub200'"):
        build_recipe(run)


# --- figure kind cluster_distances ------------------------------------------------------------------------


def test_cluster_distances_figure(params, tmp_path, monkeypatch):
    from PIL import Image

    from dmlbench.config import ConfigError
    from dmlbench.evaluation.evaluate import l2_normalise
    from dmlbench.report.figures import cluster_distances

    monkeypatch.chdir(tmp_path)
    spec = {"kind": "cluster_distances", "dataset": "synthetic", "methods": ["margin"], "clusters": 2, "seeds": [1]}
    assert cluster_distances.inputs(params, spec) == ["results/runs/synthetic/margin/seed1/embeddings.npz"]
    with pytest.raises(ConfigError, match=r"figures\.f\.clusters must be an integer ≥ 2"):
        cluster_distances.check(params, {**spec, "clusters": 1}, "figures.f")
    with pytest.raises(ConfigError, match="missing key"):
        cluster_distances.check(params, {k: v for k, v in spec.items() if k != "clusters"}, "figures.f")
    rng = np.random.default_rng(0)
    centres = np.array([[1.0, 0, 0, 0], [0, 0, 1.0, 0]])  # two far-apart groups of 5 classes each
    labels = np.repeat(np.arange(10), 20)
    x = l2_normalise((centres[labels // 5] + 0.05 * rng.standard_normal((200, 4))).astype(np.float32))
    run = tmp_path / "results/runs/synthetic/margin/seed1"
    run.mkdir(parents=True)
    np.savez(run / "embeddings.npz", embeddings=x, labels=labels)
    out = tmp_path / "plots" / "f.png"
    out.parent.mkdir()
    cluster_distances.render(params, spec, out)
    assert Image.open(out).size[0] > 300 and not list(out.parent.glob("*.tmp"))
    clusters = np.where(labels < 5, 0, 1)
    d = cluster_distances.negative_pair_distances(x, labels, clusters, 5000, np.random.default_rng(0))
    assert d["intra"].mean() < 0.3 < 1.2 < d["inter"].mean()  # negatives inside a cluster are the hard ones
