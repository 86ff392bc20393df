"""Intra-batch message passing (MPN): attention step, equivariance, losses, test-time batches, recipe, ensembles."""

from __future__ import annotations

import copy
import math
from pathlib import Path

import numpy as np
import pytest
import torch
import torch.nn.functional as F

from dmlbench.losses.mpn_cross_entropy import MPNCrossEntropyLoss, MPNLossConfig, tempered_cross_entropy
from dmlbench.methods import OptionsError, build_recipe
from dmlbench.methods.health import failed_checks
from dmlbench.methods.mpn import MAX_ENTROPY_RATIO, MIN_SAME_CLASS_RATIO, attention_health
from dmlbench.methods.mpn_batches import (
    GraphBatch,
    cluster_batches,
    nearest_neighbour_batches,
    reciprocal_knn_batches,
    reciprocal_knn_sets,
    reciprocal_sets,
    refine_in_batches,
)
from dmlbench.cli import main
from dmlbench.config import resolve_method, resolve_run
from dmlbench.evaluation.ensemble import concatenate_members, ensemble_files, member_seeds
from dmlbench.models.mpn import MessagePassingNetwork, MessagePassingStep, MultiHeadDotProductAttention
from dmlbench.params import load_config
from dmlbench.settings import OptimizerSettings
from dmlbench.training.optim import build_optimizer
from dmlbench.training.checkpoint import load_checkpoint
from dmlbench.training.embed import embed_run
from dmlbench.training.trainer import train_run

from conftest import REPO, tiny_run


# --- the attention step -------------------------------------------------------------------
def test_attention_weights_by_hand_on_four_nodes():
    """One head, W_q = W_k = W = I, d = 2: α_ij = softmax_j(h_i · h_j / √2)."""
    attention = MultiHeadDotProductAttention(2, heads=1, dropout=0.0)
    for linear in (attention.query, attention.key, attention.value):
        torch.nn.init.eye_(linear.weight)
    h = torch.tensor([[1.0, 0.0], [0.0, 1.0], [1.0, 1.0], [0.0, 0.0]])
    alpha = attention.weights(h)[0]
    e = math.exp(1 / math.sqrt(2))
    assert alpha[3].tolist() == pytest.approx([0.25] * 4)  # the zero node attends uniformly
    assert alpha[0].tolist() == pytest.approx([e / (2 * e + 2), 1 / (2 * e + 2), e / (2 * e + 2), 1 / (2 * e + 2)])
    # node 2 = (1, 1): scores (1, 1, 2, 0) / √2
    scores = np.exp(np.array([1, 1, 2, 0]) / math.sqrt(2))
    assert alpha[2].tolist() == pytest.approx((scores / scores.sum()).tolist())
    # the message is Σ_j α_ij h_j
    assert attention(h)[2].tolist() == pytest.approx((alpha[2] @ h).tolist())


def _hand_step(
    h: np.ndarray,
    wq: np.ndarray,
    wk: np.ndarray,
    wv: np.ndarray,
    heads: int,
    scale: float,
    w1: np.ndarray,
    b1: np.ndarray,
    w2: np.ndarray,
    b2: np.ndarray,
) -> np.ndarray:
    """Eq. 3–6 with explicit loops: per head and receiver i, softmax over senders j; LayerNorm without affine."""
    n, d = h.shape
    hd = d // heads

    def layer_norm(x):
        return (x - x.mean()) / math.sqrt(x.var() + 1e-5)

    messages = np.zeros((n, d))
    for m in range(heads):
        rows = slice(m * hd, (m + 1) * hd)
        for i in range(n):
            scores = [float(wq[rows] @ h[i] @ (wk[rows] @ h[j])) / scale for j in range(n)]
            alpha = np.exp(scores - np.max(scores))
            alpha /= alpha.sum()
            messages[i, rows] = sum(alpha[j] * (wv[rows] @ h[j]) for j in range(n))
    out = np.zeros_like(h)
    for i in range(n):
        f = layer_norm(messages[i] + h[i])  # Eq. 5
        ff = w2 @ np.maximum(w1 @ f + b1, 0) + b2
        out[i] = layer_norm(ff + f)  # Eq. 6
    return out


def as_numpy(parameter: torch.Tensor) -> np.ndarray:
    return parameter.detach().double().numpy()


@pytest.mark.parametrize("scale", ["embedding", "head"])
def test_message_passing_step_matches_hand_computation_on_four_nodes(scale):
    torch.manual_seed(0)
    step = MessagePassingStep(4, heads=2, attention_dropout=0.0, dropout=0.0, ff_multiplier=2, scale=scale).eval()
    h = torch.randn(4, 4)
    att = step.attention
    expected = _hand_step(
        h.double().numpy(),
        as_numpy(att.query.weight),
        as_numpy(att.key.weight),
        as_numpy(att.value.weight),
        heads=2,
        scale=math.sqrt(4 if scale == "embedding" else 2),
        w1=as_numpy(step.feed_forward[0].weight),
        b1=as_numpy(step.feed_forward[0].bias),
        w2=as_numpy(step.feed_forward[3].weight),
        b2=as_numpy(step.feed_forward[3].bias),
    )
    with torch.no_grad():
        got = step(h)
    np.testing.assert_allclose(got.numpy(), expected, rtol=1e-4, atol=1e-5)


def test_heads_must_divide_the_embedding_size():
    with pytest.raises(ValueError, match="multiple of the number of heads"):
        MultiHeadDotProductAttention(6, heads=4)


def test_mpn_is_permutation_equivariant_over_the_batch():
    torch.manual_seed(1)
    mpn = MessagePassingNetwork(8, steps=2, heads=4, output_projection=True, input_projection=True).eval()
    x = torch.randn(7, 8)
    perm = torch.randperm(7)
    with torch.no_grad():
        np.testing.assert_allclose(mpn(x[perm]).numpy(), mpn(x)[perm].numpy(), rtol=1e-5, atol=1e-6)
        # stacked graphs are refined independently: (G, n, d) equals one call per graph
        y = torch.randn(7, 8)
        both = mpn(torch.stack([x, y]))
        np.testing.assert_allclose(both[1].numpy(), mpn(y).numpy(), rtol=1e-5, atol=1e-6)
    # message passing mixes the nodes: changing one node changes the others' outputs
    z = x.clone()
    z[0] += 1.0
    with torch.no_grad():
        assert not torch.allclose(mpn(z)[1:], mpn(x)[1:])


def score_spread_at_init(node_scale: str, dim: int = 64, nodes: int = 32) -> float:
    """Mean over receivers of the std of the scaled scores, one step of 2 heads on unit-norm random nodes."""
    torch.manual_seed(0)
    mpn = MessagePassingNetwork(dim, steps=1, heads=2, node_scale=node_scale)
    mpn(F.normalize(torch.randn(nodes, dim), dim=-1))
    return mpn.steps[0].attention.last_scores.std(dim=-1).mean().item()


def test_default_node_scale_lets_the_scores_spread_at_initialisation():
    """Unit-norm 64-d nodes into q·k/√d: scores spread ≈ 0.004 (uniform attention); × √d: ≈ 0.23."""
    assert score_spread_at_init("sqrt_dim") > 0.1
    assert score_spread_at_init("unit") < 0.01
    # the scores are bilinear in the nodes: × √d on both sides multiplies them by d = 64
    assert score_spread_at_init("sqrt_dim") == pytest.approx(64 * score_spread_at_init("unit"), rel=1e-4)
    with pytest.raises(ValueError, match="node scale"):
        MessagePassingNetwork(8, node_scale="half")


def train_on_neighbour_task(node_scale: str = "sqrt_dim", steps: int = 900, seed: int = 0) -> dict[str, float]:
    """Train a 1-step, 1-head MPN + its classifier (no backbone) on batches where only the neighbours know
    the class, and return :func:`attention_health` of a fresh batch.

    Each batch: P = 4 of C = 16 classes × K = 4 nodes. The first half of a node (8 dims) is a random code
    drawn anew for its class in every batch (same-class nodes match; useless to classify); the second
    half holds the class centre on one node per class and zeros on the three others. Three quarters of
    the nodes can only be classified by attending to the informative node of their class, and since 12
    of 16 classes are absent, ruling the batch's other classes out does not work either.
    """
    half, classes, p, k = 8, 16, 4, 4
    generator = torch.Generator().manual_seed(seed)
    torch.manual_seed(seed)
    centres = F.normalize(torch.randn(classes, half, generator=generator), dim=-1)
    informative = (torch.arange(p * k) % k == 0)[:, None]

    def batch() -> tuple[torch.Tensor, torch.Tensor]:
        labels = torch.randperm(classes, generator=generator)[:p].repeat_interleave(k)
        codes = F.normalize(torch.randn(p, half, generator=generator), dim=-1).repeat_interleave(k, dim=0)
        return F.normalize(torch.cat([codes, centres[labels] * informative], dim=1), dim=-1), labels

    mpn = MessagePassingNetwork(2 * half, steps=1, heads=1, attention_dropout=0.0, dropout=0.0, node_scale=node_scale)
    loss = MPNCrossEntropyLoss(classes, 2 * half, MPNLossConfig(temperature=0.5, label_smoothing=0.0, aux_weight=0.0))
    mpn.backbone = torch.nn.Identity()  # the optimiser's groups: every MPN parameter is a head parameter
    settings = OptimizerSettings(name="radam", lr=0.003, weight_decay=6e-6, decoupled_weight_decay=True)
    optimizer = build_optimizer(settings, mpn, loss)
    for _ in range(steps):
        nodes, labels = batch()
        value = loss(nodes, mpn(nodes), labels)
        optimizer.zero_grad()
        value.backward()
        optimizer.step()
    nodes, labels = batch()
    with torch.no_grad():
        mpn(nodes)
    return attention_health(mpn.steps[0].attention.last_scores, labels)


def test_trained_attention_moves_to_the_nodes_own_class():
    """Behavioural: the mechanism engages. Uniform attention has ratio 1 and entropy ratio 1; with the
    paper's unit-norm nodes the same 900 steps end at ratio ≈ 1.7, entropy ratio ≈ 0.96."""
    health = train_on_neighbour_task()
    assert health["same_class_attention_ratio"] > 2.5
    assert health["attention_entropy_ratio"] < 0.9


# --- mechanism health ---------------------------------------------------------------------
def test_attention_health_by_hand_on_four_nodes():
    """Labels (0, 0, 1, 1), one head. Row 0 scores (0, ln 2, 0, 0): α = (1, 2, 1, 1)/5, same-class share
    of the others 2/4; rows 1–3 uniform: 1/3 each. Uniform value (K − 1)/(B − 1) = 1/3."""
    scores = torch.zeros(1, 4, 4)
    scores[0, 0, 1] = math.log(2)
    health = attention_health(scores, torch.tensor([0, 0, 1, 1]))
    same = (0.5 + 3 * (1 / 3)) / 4
    assert health["same_class_attention"] == pytest.approx(same)
    assert health["same_class_attention_ratio"] == pytest.approx(same * 3)
    row0 = -(3 * 0.2 * math.log(0.2) + 0.4 * math.log(0.4))
    assert health["attention_entropy_ratio"] == pytest.approx((row0 + 3 * math.log(4)) / 4 / math.log(4))
    assert health["attention_score_std"] == pytest.approx(torch.tensor([0.0, math.log(2), 0.0, 0.0]).std().item() / 4)
    assert health["self_attention"] == pytest.approx((0.2 + 3 * 0.25) / 4)
    # attending to oneself is not a relation between images: the share is over the other nodes
    selfish = attention_health(torch.zeros(1, 4, 4) + torch.eye(4) * 10.0, torch.tensor([0, 0, 1, 1]))
    assert selfish["same_class_attention_ratio"] == pytest.approx(1.0)
    assert selfish["self_attention"] == pytest.approx(math.exp(10) / (math.exp(10) + 3))
    with pytest.raises(ValueError, match="another node of its class"):
        attention_health(torch.zeros(3, 3), torch.tensor([0, 1, 2]))


def test_health_checks_fail_on_uniform_attention_and_pass_on_a_healthy_one(params):
    checks = build_recipe(mpn_run(params)).health_checks()
    assert {c.key for c in checks} == {"health/same_class_attention_ratio", "health/attention_entropy_ratio"}
    uniform = {"health/same_class_attention_ratio": 1.0, "health/attention_entropy_ratio": 1.0}
    assert len(failed_checks(checks, uniform)) == 2
    healthy = {
        "health/same_class_attention_ratio": MIN_SAME_CLASS_RATIO + 0.5,
        "health/attention_entropy_ratio": MAX_ENTROPY_RATIO - 0.05,
    }
    assert failed_checks(checks, healthy) == []
    ce_only = mpn_run(params)
    ce_only["method_config"]["loss"]["mpn_weight"] = 0.0
    assert build_recipe(ce_only).health_checks() == []  # no trained attention to check


# --- losses -------------------------------------------------------------------------------
def test_tempered_cross_entropy_matches_the_formula():
    torch.manual_seed(2)
    logits, labels = torch.randn(5, 4), torch.tensor([0, 3, 1, 1, 2])
    tau, eps = 0.2, 0.1
    z = logits.double().numpy() / tau
    log_p = z - np.log(np.exp(z).sum(axis=1, keepdims=True))
    expected = np.mean([(1 - eps) * -log_p[i, y] + eps * np.mean(-log_p[i]) for i, y in enumerate(labels.tolist())])
    assert tempered_cross_entropy(logits, labels, tau, eps).item() == pytest.approx(expected, rel=1e-5)
    # ε = 0, τ = 1: plain cross-entropy; a lower temperature sharpens (the loss of correct logits falls)
    plain = F.cross_entropy(logits, labels).item()
    assert tempered_cross_entropy(logits, labels, 1.0, 0.0).item() == pytest.approx(plain)
    confident = F.one_hot(labels, 4).float() * 3
    assert tempered_cross_entropy(confident, labels, 0.5, 0.0) < tempered_cross_entropy(confident, labels, 1.0, 0.0)
    with pytest.raises(ValueError, match="temperature"):
        tempered_cross_entropy(logits, labels, 0.0, 0.1)


def test_mpn_loss_weights_its_two_terms():
    torch.manual_seed(3)
    config = MPNLossConfig(temperature=0.5, label_smoothing=0.1, mpn_weight=2.0, aux_weight=0.5)
    loss = MPNCrossEntropyLoss(3, 4, config)
    features, refined, labels = torch.randn(6, 4), torch.randn(6, 4), torch.tensor([0, 1, 2, 0, 1, 2])
    total = loss(features, refined, labels)
    mpn = tempered_cross_entropy(loss.mpn_classifier(refined), labels, 0.5, 0.1)
    aux = tempered_cross_entropy(loss.aux_classifier(features), labels, 0.5, 0.1)
    assert total.item() == pytest.approx((2.0 * mpn + 0.5 * aux).item())
    assert set(loss.last_terms) == {"mpn_ce", "aux_ce"}
    only_aux = MPNCrossEntropyLoss(3, 4, MPNLossConfig(mpn_weight=0.0))
    assert only_aux.mpn_classifier is None and not only_aux.uses_mpn
    with pytest.raises(ValueError, match="needs the refined node features"):
        loss(features, None, labels)
    with pytest.raises(ValueError, match="both 0"):
        MPNLossConfig(mpn_weight=0.0, aux_weight=0.0)
    neck = MPNCrossEntropyLoss(3, 4, MPNLossConfig(classifier_batchnorm=True))
    assert isinstance(neck.mpn_classifier[0], torch.nn.BatchNorm1d) and neck.mpn_classifier[1].bias is None


# --- test-time batches --------------------------------------------------------------------
# Seven points on a line: two groups {0, 1, 2}, {3, 4, 5} and point 6 in between (closest to 2).
POSITIONS = np.array([0.0, 1.0, 2.5, 10.0, 11.0, 13.0, 5.8])
DISTANCES = np.abs(POSITIONS[:, None] - POSITIONS[None, :])


def _ranking() -> np.ndarray:
    order = np.argsort(DISTANCES, axis=1, kind="stable")
    return np.stack([row[row != i] for i, row in enumerate(order)])


def _distances_to(q: int, rows: np.ndarray) -> np.ndarray:
    return DISTANCES[q, rows]


def test_reciprocal_sets_on_a_toy_distance_matrix():
    sets = reciprocal_sets(_ranking(), 3)
    # N(0,3) = {0,1,2,6} but 0 ∉ N(6,3) = {6,2,3,1}; N(6,3) is fully reciprocal
    assert sets[0].tolist() == [0, 1, 2]
    assert sets[6].tolist() == [6, 2, 3, 1]
    assert sets[4].tolist() == [4, 3, 5]


def test_reciprocal_knn_batches_on_a_toy_distance_matrix():
    ranking = _ranking()
    batches = reciprocal_knn_sets(ranking, k=3, alpha=2 / 3, size=5, distances_to=_distances_to)
    # q = 6: R = {6,2,3,1}; the ½k-sets R(2,2) = R(1,2) = {0,1,2} share 2 of 3 ≥ α·3 with R, so 0 joins
    # (the code's strict '>' would reject them); R(3,2) = {3,4,5} shares 1 < 2 and stays out.
    # Sorted by distance to 6: 2, 3, 1, 0 — instead of the plain nearest neighbour 4.
    assert batches[6].tolist() == [6, 2, 3, 1, 0]
    # q = 0: R = {0,1,2}, no expansion outside it; filled with 0's nearest others 6, 3
    assert batches[0].tolist() == [0, 1, 2, 6, 3]
    assert batches[3].tolist() == [3, 4, 5, 6, 2]
    # a stricter α rejects the expansion: the batch of 6 is filled with its next neighbour, 4
    strict = reciprocal_knn_sets(ranking, k=3, alpha=0.7, size=5, distances_to=_distances_to)
    assert strict[6].tolist() == [6, 2, 3, 1, 4]
    # a smaller k_r keeps the closest members
    assert reciprocal_knn_sets(ranking, 3, 2 / 3, 3, _distances_to)[6].tolist() == [6, 2, 3]
    # the faiss-backed version on the points themselves gives the same batches
    plan = reciprocal_knn_batches(POSITIONS[:, None].astype(np.float32), k=3, alpha=2 / 3, size=5)
    assert plan[0].nodes.tolist() == batches.tolist()
    assert plan[0].outputs[:, 0].tolist() == list(range(7)) and (plan[0].outputs[:, 1:] == -1).all()


def test_nearest_neighbour_and_cluster_batches_refine_every_row_once():
    points = POSITIONS[:, None].astype(np.float32)
    rng = np.random.default_rng(0)
    nn_plan = nearest_neighbour_batches(points, chunk_size=3, chunks_per_batch=2, rng=rng)
    anchors = np.concatenate([b.outputs[b.outputs >= 0] for b in nn_plan])
    assert sorted(anchors.tolist()) == list(range(7))
    for batch in nn_plan:  # each anchor's chunk = the anchor and its 2 nearest neighbours
        for nodes, outputs in zip(batch.nodes, batch.outputs):
            for position in np.flatnonzero(outputs >= 0):
                assert nodes[position + 1 : position + 3].tolist() == _ranking()[nodes[position], :2].tolist()
    assert [b.nodes.shape for b in nn_plan] == [(3, 6), (1, 3)]  # 7 chunks of 3 → 3 batches of 2 + 1 of 1
    cluster_plan = cluster_batches(np.array([0, 0, 0, 1, 1, 1, 1]), chunk_size=2, chunks_per_batch=2, rng=rng)
    rows = np.concatenate([b.outputs.ravel() for b in cluster_plan])
    assert sorted(rows.tolist()) == list(range(7))
    for batch in cluster_plan:  # every chunk holds images of one cluster
        assert (batch.nodes == batch.outputs).all()


def test_refine_in_batches_collects_each_row_once():
    points = np.random.default_rng(1).normal(size=(7, 3)).astype(np.float32)
    plan = reciprocal_knn_batches(points, k=2, alpha=0.5, size=4)
    identity = refine_in_batches(lambda x: x, points, plan, torch.device("cpu"), max_nodes=8)
    np.testing.assert_allclose(identity, points / np.linalg.norm(points, axis=1, keepdims=True), rtol=1e-6)
    missing = [GraphBatch(np.array([[0, 1]]), np.array([[0, -1]]))]
    with pytest.raises(ValueError, match="not exactly once"):
        refine_in_batches(lambda x: x, points[:2], missing, torch.device("cpu"))


# --- the recipe ---------------------------------------------------------------------------
MPN_METHOD = {
    "recipe": "mpn",
    "loss": {"name": "mpn_cross_entropy", "temperature": 0.5, "label_smoothing": 0.1},
    "options": {"steps": 1, "heads": 2},
}


def mpn_run(params: dict, seed: int = 0, epochs: int = 2, **options) -> dict:
    run = tiny_run(params, "contrastive", seed=seed, epochs=epochs)
    run["method"] = "mpn"
    run["method_config"] = copy.deepcopy(MPN_METHOD)
    run["method_config"]["options"].update(options)
    run["training"]["optimizer"]["name"] = "radam"
    return run


def test_recipe_rejects_inconsistent_settings(params):
    run = mpn_run(params)
    run["method_config"]["loss"]["name"] = "norm_softmax"
    with pytest.raises(OptionsError, match="loss.name must be 'mpn_cross_entropy'"):
        build_recipe(run)
    run = mpn_run(params, test_embedding="mpn")
    run["method_config"]["loss"]["mpn_weight"] = 0.0
    with pytest.raises(OptionsError, match="never be trained"):
        build_recipe(run)
    with pytest.raises(OptionsError, match="must divide"):
        build_recipe(mpn_run(params, heads=3))
    with pytest.raises(OptionsError, match="not an option"):
        build_recipe(mpn_run(params, layers=2))


def test_ce_only_variant_builds_no_mpn(params):
    run = mpn_run(params)
    run["method_config"]["loss"]["mpn_weight"] = 0.0
    recipe = build_recipe(run)
    assert recipe.build_model().mpn is None and recipe.summary() == {"mpn_parameters": 0.0}
    assert recipe.health_checks() == []


def test_training_is_deterministic_and_mpn_test_embedding_differs(params, tiny_manifest, tmp_path):
    run = mpn_run(params, test_embedding="mpn", rknn_k=3, test_batch_size=4)
    for name in ("a", "b"):
        train_run(run, tiny_manifest, tmp_path / name, tmp_path / f"scratch_{name}", progress=False)
    a, b = (load_checkpoint(tmp_path / name / "checkpoint.pt") for name in ("a", "b"))
    assert a["model"].keys() == b["model"].keys() and any(k.startswith("mpn.") for k in a["model"])
    for key in a["model"]:
        assert torch.equal(a["model"][key], b["model"][key]), key
    assert torch.equal(a["loss"]["mpn_classifier.weight"], b["loss"]["mpn_classifier.weight"])
    header = (tmp_path / "a" / "log.csv").read_text().splitlines()[0].split(",")
    health = [
        "health/same_class_attention",
        "health/same_class_attention_ratio",
        "health/attention_entropy_ratio",
        "health/self_attention",
        "health/attention_score_std",
    ]
    assert header[-7:] == ["mpn_ce", "aux_ce", *health]
    assert set(health) <= set(a["summary"]) and all(math.isfinite(a["summary"][key]) for key in health)
    refined = np.load(embed_run(tmp_path / "a" / "checkpoint.pt", tiny_manifest, tmp_path / "mpn.npz"))
    backbone_run = copy.deepcopy(a)
    backbone_run["run"]["method_config"]["options"]["test_embedding"] = "backbone"
    torch.save(backbone_run, tmp_path / "backbone.pt")
    plain = np.load(embed_run(tmp_path / "backbone.pt", tiny_manifest, tmp_path / "backbone.npz"))
    assert refined["embeddings"].shape == plain["embeddings"].shape
    assert not np.allclose(refined["embeddings"], plain["embeddings"])
    stats = dict(zip(plain["stat_names"].tolist(), plain["stat_values"].tolist()))
    assert 0 < stats["mpn_parameters"] < stats["num_parameters"]


@pytest.mark.parametrize("construction", ["nearest_neighbours", "kmeans"])
def test_other_test_time_constructions_embed_every_image(params, construction):
    recipe = build_recipe(
        mpn_run(params, test_embedding="mpn", test_batches=construction, kmeans_images_per_cluster=3.0)
    )
    points = np.random.default_rng(2).normal(size=(20, 8)).astype(np.float32)
    rows = np.concatenate([b.outputs[b.outputs >= 0] for b in recipe.test_batches(points)])
    assert sorted(rows.tolist()) == list(range(20))


# --- the paper overlay --------------------------------------------------------------------
#: dataset → (lr, weight decay, temperature, steps, heads, P, K): the authors' configs (REFERENCE.md).
PAPER_MPN = {
    "cub200": (1.563663718906821e-4, 6.059722614369727e-06, 0.2, 1, 2, 6, 9),
    "cars196": (3.6683239911604993e-4, 2.551918610962277e-09, 0.1111111111111, 2, 8, 10, 7),
    "sop": (2.472471515853406e-4, 2.7650277063275255e-13, 0.6046908988578005, 1, 8, 15, 6),
    "inshop": (1.1265974954242144e-4, 1.0554824926510768e-07, 0.18591347176280537, 1, 4, 14, 4),
}


def test_paper_overlay_gives_mpn_the_authors_settings_per_dataset():
    config = load_config([REPO / "params.yaml", REPO / "workflow" / "overlays" / "paper.yaml"])
    for dataset, (lr, decay, temperature, steps, heads, p, k) in PAPER_MPN.items():
        run = resolve_run(config, dataset, "mpn", 0)
        training, method = run["training"], run["method_config"]
        assert (training["optimizer"]["name"], training["optimizer"]["lr"], training["optimizer"]["weight_decay"]) == (
            "radam",
            lr,
            decay,
        ), dataset
        assert (training["sampler"]["classes_per_batch"], training["sampler"]["images_per_class"]) == (p, k), dataset
        assert (training["embedding_dim"], training["epochs"]) == (512, 70), dataset
        assert (method["loss"]["temperature"], method["options"]["steps"], method["options"]["heads"]) == (
            temperature,
            steps,
            heads,
        ), dataset
        build_recipe(run)  # the options and the loss parse
    # an ablation's own options win over the base's per-dataset ones; its other settings follow the dataset
    ablation = resolve_method(config, "mpn_l1_h1", "cars196")
    assert (ablation["options"]["steps"], ablation["options"]["heads"], ablation["loss"]["temperature"]) == (
        1,
        1,
        PAPER_MPN["cars196"][2],
    )


def test_every_mpn_entry_decays_decoupled_at_the_authors_scale_with_scaled_nodes():
    """params.yaml's mpn entry carries the fixes, so every mpn_* inherits them; the paper overlay keeps
    decoupled decay with its per-dataset λ."""
    config = load_config([REPO / "params.yaml"])
    entries = [m for m, spec in config["methods"].items() if spec.get("recipe") == "mpn" or m.startswith("mpn")]
    for method in (m for m in entries if "ensemble_members" not in config["methods"][m]):
        run = resolve_run(config, "synthetic", method, 0)
        optimizer = run["training"]["optimizer"]
        assert (optimizer["name"], optimizer["weight_decay"], optimizer["decoupled_weight_decay"]) == (
            "radam",
            6e-6,
            True,
        ), method
        assert build_recipe(run).options.node_scale == "sqrt_dim", method
    paper = load_config([REPO / "params.yaml", REPO / "workflow" / "overlays" / "paper.yaml"])
    for dataset in PAPER_MPN:
        assert resolve_run(paper, dataset, "mpn", 0)["training"]["optimizer"]["decoupled_weight_decay"] is True
    cub_lite = load_config([REPO / "params.yaml", REPO / "workflow" / "overlays" / "cub_lite.yaml"])
    optimizer = resolve_run(cub_lite, "cub200", "mpn", 0)["training"]["optimizer"]
    assert (optimizer["weight_decay"], optimizer["decoupled_weight_decay"]) == (6e-6, True)


# --- ensembles ----------------------------------------------------------------------------
def test_ensemble_concatenates_l2_normalised_members(tmp_path: Path):
    labels = np.array([0, 0, 1])
    a = {
        "embeddings": np.array([[3.0, 4.0], [1.0, 0.0], [0.0, 2.0]], dtype=np.float32),
        "labels": labels,
        "stat_names": np.array(["num_parameters", "R_demo"]),
        "stat_values": np.array([10.0, 0.2]),
    }
    b = {
        "embeddings": np.array([[0.0, 0.0, 5.0], [2.0, 0.0, 0.0], [1.0, 1.0, 0.0]], dtype=np.float32),
        "labels": labels,
        "stat_names": np.array(["num_parameters", "R_demo"]),
        "stat_values": np.array([30.0, 0.4]),
    }
    result = concatenate_members([a, b])
    np.testing.assert_allclose(result["embeddings"][0], [0.6, 0.8, 0.0, 0.0, 1.0])
    np.testing.assert_allclose(np.linalg.norm(result["embeddings"], axis=1), math.sqrt(2), rtol=1e-6)
    assert result["learner_slices"].tolist() == [[0, 2], [2, 5]]
    stats = dict(zip(result["stat_names"], result["stat_values"]))
    assert stats == {"num_parameters": 40.0, "R_demo": pytest.approx(0.3)}
    with pytest.raises(ValueError, match="other labels"):
        concatenate_members([a, {**b, "labels": np.array([0, 1, 1])}])
    with pytest.raises(ValueError, match="at least 2"):
        concatenate_members([a])
    for name, member in (("a", a), ("b", b)):
        np.savez(tmp_path / f"{name}.npz", **member)
    written = np.load(ensemble_files([tmp_path / "a.npz", tmp_path / "b.npz"], tmp_path / "ens" / "e.npz"))
    np.testing.assert_array_equal(written["embeddings"], result["embeddings"])
    assert main(["ensemble", str(tmp_path / "a.npz"), str(tmp_path / "b.npz"), "--out", str(tmp_path / "cli.npz")]) == 0
    np.testing.assert_array_equal(np.load(tmp_path / "cli.npz")["learner_slices"], result["learner_slices"])
    assert member_seeds(1, 5) == [5, 6, 7, 8, 9]
