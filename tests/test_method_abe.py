"""ABE: divergence and per-learner contrastive losses by hand, masks, gradients, M = 1, batches, recipe."""

from __future__ import annotations

import copy

import numpy as np
import pandas as pd
import pytest
import torch

from dmlbench.data.samplers import PairBatchSampler
from dmlbench.evaluation.evaluate import self_pair_similarity
from dmlbench.losses import ContrastiveLoss, build_loss
from dmlbench.losses.abe_divergence import ABELoss, divergence_loss, partner_contrastive, split_learners
from dmlbench.methods import OptionsError, build_recipe
from dmlbench.methods.abe import divergence_ramp
from dmlbench.methods.health import failed_checks
from dmlbench.models.abe import AttentionEnsemble, HeadsEnsemble
from dmlbench.models.backbones import build_backbone
from dmlbench.models.backbones.googlenet import build_googlenet
from dmlbench.models.embedder import Embedder
from dmlbench.models.heads import LinearEmbedding
from dmlbench.training.checkpoint import load_checkpoint
from dmlbench.training.trainer import train_run

from conftest import parameter_group_ids, tiny_run

ABE = {"label": "ABE", "recipe": "abe", "loss": {"name": "contrastive", "margin": 1.0}}


def abe_run(params: dict, epochs: int = 2, dim: int = 8, **options) -> dict:
    """A tiny resolved ABE run (width-4 CNN, 20 px: stage2 3×3, stage3 2×2) with the given options."""
    config = copy.deepcopy(params)
    config["methods"]["abe"] = {**ABE, "options": {"pair_anchors": 4, **options}}
    run = tiny_run(config, "abe", epochs=epochs)
    run["training"]["embedding_dim"] = dim
    return run


def small_backbone():
    return build_backbone({"name": "small_cnn", "width": 4})


# ------------------------------------------------------------------------------ losses by hand
def test_divergence_loss_by_hand():
    """M = 3 learners, 2 images, w = 2; Eq. 9 over ordered pairs p ≠ q, mean over images.

    Image 0: e1 = e3 = (1, 0), e2 = (0, 1): only (1, 3) is inside the margin, d² = 0 → 1, twice → 2.
    Image 1: e1 = (1, 0), e2 = (0.6, 0.8), e3 = (−1, 0): d²(1, 2) = 0.8 → 0.2, twice → 0.4;
    d²(1, 3) = 4 and d²(2, 3) = 3.2 are outside. Mean over the images of the sum: (2 + 0.4) / 2 = 1.2
    ('sum'); 'per_learner' divides by M − 1 = 2 (each learner's mean over the others): 0.6.
    """
    learners = torch.tensor(
        [
            [[1.0, 0.0], [1.0, 0.0]],
            [[0.0, 1.0], [0.6, 0.8]],
            [[1.0, 0.0], [-1.0, 0.0]],
        ]
    )  # (M, B, w)
    assert divergence_loss(learners, margin=1.0, reduction="sum").item() == pytest.approx(1.2, abs=1e-6)
    assert divergence_loss(learners, margin=1.0).item() == pytest.approx(0.6, abs=1e-6)  # default: per_learner
    # margin 4: image 0 pairs (1,2), (2,3): 4 − 2 = 2 each, (1,3): 4 → 8 × 2 = 16; image 1: 3.2, 0, 0.8 → 8
    assert divergence_loss(learners, margin=4.0, reduction="sum").item() == pytest.approx((16 + 8) / 2, abs=1e-5)
    assert divergence_loss(learners[:1], margin=1.0).item() == 0.0  # one learner: no self pair
    with pytest.raises(ValueError, match="divergence_margin"):
        divergence_loss(learners, margin=0.0)
    with pytest.raises(ValueError, match="divergence_reduction"):
        divergence_loss(learners, reduction="mean")


def init_like_learners(
    num_learners: int, num_images: int = 16, spread: float = 0.3
) -> tuple[torch.Tensor, torch.Tensor]:
    """Ensemble embeddings as at the initialisation of ABE with a shared final layer (``embedding_layer:
    shared``): the M learners of an image are close (a shared
    direction + a little per-learner noise, self-pair cosine ≈ 0.9), w = 8; 4 images per class."""
    generator = torch.Generator().manual_seed(0)
    shared = torch.randn(num_images, 1, 8, generator=generator)
    noise = spread * torch.randn(num_images, num_learners, 8, generator=generator)
    learners = torch.nn.functional.normalize(shared + noise, dim=2)  # (B, M, w)
    return learners.flatten(1), torch.arange(num_images) // 4


def test_divergence_to_metric_ratio_at_init_does_not_grow_with_m():
    """Eq. 8 with the default options: λ_div · L_div / Σ_m L_metric,(m) on init-like embeddings is
    the same order for M = 2 and M = 8 (the summed L_div grows with M − 1 against M metric terms)."""
    ratios = {}
    for m in (2, 8):
        embeddings, labels = init_like_learners(m)
        loss = ABELoss(ContrastiveLoss(margin=1.0), [(8 * i, 8 * (i + 1)) for i in range(m)])
        loss(embeddings, labels)
        ratios[m] = (loss.divergence_weight * loss.last_terms["divergence"] / loss.last_terms["metric"]).item()
    assert ratios[2] > 0.1  # the self pairs are inside the margin: L_div is engaged at both sizes
    assert 0.5 < ratios[8] / ratios[2] < 2.0, ratios


def test_per_learner_contrastive_plus_divergence_by_hand():
    """Two learners (A | B columns), 3 images with labels 0, 0, 1, all pairs (class-balanced mode).

    A: x0 = (1, 0), x1 = (0.6, 0.8), x2 = (0, 1). Pairs: (0, 1) positive d² = 0.8; (0, 2) negative
       d² = 2 → [1 − 2]_+ = 0; (1, 2) negative d² = 0.4 → 0.6. Mean over 3 pairs: 1.4 / 3.
    B: all (1, 0): positive 0, two negatives with d² = 0 → 1 each. Mean: 2 / 3.
    Divergence: image 0 d² = 0 → 1 (×2 ordered pairs); image 1 d² = 0.8 → 0.2 (×2); image 2
       d² = 2 → 0. Mean: (2 + 0.4) / 3 = 0.8.
    """
    a = torch.tensor([[1.0, 0.0], [0.6, 0.8], [0.0, 1.0]])
    b = torch.tensor([[1.0, 0.0], [1.0, 0.0], [1.0, 0.0]])
    embeddings, labels = torch.cat([a, b], dim=1), torch.tensor([0, 0, 1])
    slices = [(0, 2), (2, 4)]
    metric = 1.4 / 3 + 2 / 3
    for weight in (0.0, 0.5, 1.0):
        loss = ABELoss(ContrastiveLoss(margin=1.0), slices, divergence_weight=weight)
        assert loss(embeddings, labels).item() == pytest.approx(metric + weight * 0.8, abs=1e-6)
        assert loss.last_terms["metric"].item() == pytest.approx(metric, abs=1e-6)
        assert loss.last_terms["divergence"].item() == pytest.approx(0.8, abs=1e-6)


def test_partner_contrastive_uses_only_the_designated_pairs():
    """Pair batch [a1, a2, b1, b2], labels [0, 1, 0, 2]: (a1, b1) positive d² = 0.8 → 0.8;
    (a2, b2) negative d² = 0.4 → 0.6; mean 0.7. The pair (a1, a2) etc. are not used."""
    e = torch.tensor([[1.0, 0.0], [0.0, 1.0], [0.6, 0.8], [0.6, 0.8]])
    labels = torch.tensor([0, 1, 0, 2])
    assert partner_contrastive(e, labels, margin=1.0).item() == pytest.approx(0.7, abs=1e-6)
    loss = ABELoss(ContrastiveLoss(margin=1.0), [(0, 2)], divergence_weight=1.0, pairs="partners")
    assert loss(e, labels).item() == pytest.approx(0.7, abs=1e-6)
    with pytest.raises(ValueError, match="even"):
        partner_contrastive(e[:3], labels[:3], margin=1.0)
    with pytest.raises(ValueError, match="contrastive"):
        ABELoss(build_loss({"name": "triplet"}, num_classes=3, embedding_dim=2), [(0, 2)], pairs="partners")


# ------------------------------------------------------------------------------ the network
def test_masks_have_the_shape_of_s_and_are_per_learner():
    torch.manual_seed(0)
    model = AttentionEnsemble(small_backbone(), 3, 4, "stage2", "stage4").eval()
    images = torch.rand(2, 3, 20, 20)
    features = model.spatial_features(images)
    masks = model.masks(features)
    assert features.shape == (2, 8, 3, 3)
    assert masks.shape == (3, *features.shape)  # (M, B, C, h, w): one mask of S(x)'s shape per learner
    assert not torch.allclose(masks[0], masks[1])  # learners have their own A'_m
    maps = model.attention_maps(images)  # channel mean, resized to the image
    expected = torch.nn.functional.interpolate(masks.mean(2), size=(20, 20), mode="bilinear", align_corners=False)
    assert maps.shape == (3, 2, 20, 20) and torch.allclose(maps, expected)
    out = model(images)
    assert out.shape == (2, 12)
    for start, stop in model.learner_slices:
        assert torch.allclose(out[:, start:stop].norm(dim=1), torch.ones(2), atol=1e-6)


def masking_change(model: AttentionEnsemble, images: torch.Tensor) -> torch.Tensor:
    """‖S(x) ∘ A_m − S(x)‖ / ‖S(x)‖ for each learner m: (M,)."""
    with torch.no_grad():
        features = model.spatial_features(images)
        masks = model.masks(features)
    return (features * masks - features).flatten(1).norm(dim=1) / features.norm()


def test_masks_start_open_so_abe_keeps_the_backbone_features():
    """Default init: every learner's mask is near 1, so S(x) ∘ A_m(S(x)) ≈ S(x) and ABE at init computes
    almost the backbone's function; the masks still differ between learners (symmetry broken). The
    paper's Glorot / zero-bias init halves the features (σ(0) = 0.5)."""
    images = torch.rand(4, 3, 20, 20)
    torch.manual_seed(0)
    model = AttentionEnsemble(small_backbone(), 8, 4, "stage2", "stage3").eval()
    assert masking_change(model, images).max() < 0.1
    masks = model.masks(model.spatial_features(images))
    assert not torch.equal(masks[0], masks[1])
    torch.manual_seed(0)
    paper = AttentionEnsemble(small_backbone(), 8, 4, "stage2", "stage3", mask_bias=0.0, mask_weight_gain=1.0).eval()
    assert masking_change(paper, images).min() > 0.3
    with pytest.raises(ValueError, match="mask_weight_gain"):
        AttentionEnsemble(small_backbone(), 2, 4, "stage2", "stage3", mask_weight_gain=0.0)


def self_cosine(model: AttentionEnsemble, images: torch.Tensor) -> float:
    """Mean cosine of the self pairs (two learners, one image) of ``model``'s embedding of ``images``."""
    with torch.no_grad():
        return self_pair_similarity(model(images).numpy(), model.learner_slices)


def test_learners_differ_at_init_but_keep_the_backbone_features():
    """Default (a final layer per learner, initialised as M-heads'): the learners differ at init
    (self-pair cosine near 0: independent random projections; the shared final layer of Eq. 7 makes
    them copies, > 0.95 with open masks); with the masks exactly 1 learner m computes
    L2(W_m · G(S(x))), the linear head on the backbone's own pooled features, and with the default
    open masks within a few per cent of it."""
    images = torch.rand(6, 3, 20, 20)
    torch.manual_seed(0)
    model = AttentionEnsemble(small_backbone(), 8, 8, "stage2", "stage3").eval()
    torch.manual_seed(0)
    shared = AttentionEnsemble(small_backbone(), 8, 8, "stage2", "stage3", shared_embedding=True).eval()
    assert len(model.embedding) == 8 and len(shared.embedding) == 1
    assert abs(self_cosine(model, images)) < 0.3
    assert self_cosine(shared, images) > 0.95
    with torch.no_grad():
        pooled = model.backbone(images)  # the backbone's own pooled features, no mask
        unmasked = torch.cat([torch.nn.functional.normalize(layer(pooled), dim=1) for layer in model.embedding], 1)
        open_masks = model(images)
        model.mask_conv.weight.zero_()
        model.mask_conv.bias.fill_(100.0)  # σ(100) == 1.0 in float32: masks exactly 1
        assert torch.allclose(model(images), unmasked, atol=1e-6)
    assert (open_masks - unmasked).norm() / unmasked.norm() < 0.1


def test_attention_trunk_keeps_the_resolution_and_is_a_copy():
    backbone = small_backbone()
    model = AttentionEnsemble(backbone, 2, 4, "stage2", "stage4")
    trunk_convs = [m for m in model.attention_trunk.modules() if isinstance(m, torch.nn.Conv2d)]
    assert trunk_convs and all(m.stride == (1, 1) for m in trunk_convs)
    assert backbone.body["stage3"][0].stride == (2, 2)  # the backbone itself is untouched
    trunk_ids = {id(p) for p in model.attention_trunk.parameters()}
    assert trunk_ids.isdisjoint(id(p) for p in backbone.parameters())
    # depth 0: no trunk, the masks come from S(x) itself
    flat = AttentionEnsemble(small_backbone(), 2, 4, "stage2", "stage2")
    assert isinstance(flat.attention_trunk, torch.nn.Identity) and flat.mask_conv.in_channels == 8


def test_googlenet_paper_cut_points():
    """S = … pool3 (480 channels), C = inception 4a–4e (832 → 480 masks); a trunk through 5b drops pool4."""
    torch.manual_seed(0)
    backbone = build_googlenet()
    model = AttentionEnsemble(backbone, 2, 4, "pool3", "inception4e")
    assert (model.mask_conv.in_channels, model.mask_conv.out_channels) == (832, 2 * 480)
    deep = AttentionEnsemble(backbone, 2, 4, "pool3", "inception5b").eval()
    assert isinstance(deep.attention_trunk.pool4, torch.nn.Identity)
    with torch.no_grad():
        images = torch.rand(1, 3, 64, 64)
        assert deep.masks(deep.spatial_features(images)).shape == (2, 1, 480, 4, 4)
        assert deep(images).shape == (1, 8)


def test_gradient_reaches_every_learners_attention():
    torch.manual_seed(0)
    model = AttentionEnsemble(small_backbone(), 4, 4, "stage2", "stage3")
    images, labels = torch.rand(6, 3, 20, 20), torch.tensor([0, 0, 1, 1, 2, 2])
    full = ABELoss(ContrastiveLoss(), model.learner_slices, divergence_weight=1.0)
    objectives = {
        "Eq. 8": lambda e: full(e, labels),
        "L_div alone": lambda e: divergence_loss(split_learners(e, model.learner_slices)),
    }
    for objective in objectives.values():
        model.zero_grad()
        objective(model(images)).backward()
        per_learner = model.mask_conv.weight.grad.split(model.feature_channels)
        assert all(block.abs().sum() > 0 for block in per_learner)  # every A'_m gets a gradient
        assert all(b.abs().sum() > 0 for b in model.mask_conv.bias.grad.split(model.feature_channels))
        assert all(p.grad is not None and p.grad.abs().sum() > 0 for p in model.attention_trunk.parameters())


def test_one_learner_without_divergence_is_a_single_attended_embedding():
    """ABE-1 without L_div = the baseline network (backbone + one linear layer to d, L2) with one
    learned sigmoid mask multiplying S(x): with the mask at exactly 1 it computes the same function
    as :class:`Embedder`, and its loss is the plain contrastive loss of that embedding."""
    torch.manual_seed(0)
    model = AttentionEnsemble(small_backbone(), 1, 8, "stage2", "stage3").eval()
    assert model.learner_slices == [(0, 8)]
    with torch.no_grad():
        model.mask_conv.weight.zero_()
        model.mask_conv.bias.fill_(100.0)  # σ(100) == 1.0 in float32
    head = LinearEmbedding(model.backbone.out_channels["pool"], 8)
    head.linear = model.embedding[0]
    baseline = Embedder(model.backbone, head).eval()
    images, labels = torch.rand(5, 3, 20, 20), torch.tensor([0, 0, 1, 1, 2])
    with torch.no_grad():
        assert torch.equal(model.masks(model.spatial_features(images)), torch.ones(1, 5, 8, 3, 3))
        assert torch.equal(model(images), baseline(images))
    # with a learned (non-trivial) mask it differs from the unattended network
    torch.nn.init.normal_(model.mask_conv.weight)
    torch.nn.init.zeros_(model.mask_conv.bias)
    with torch.no_grad():
        attended = model(images)
    assert not torch.allclose(attended, baseline(images))
    for weight in (0.0, 1.0):  # one learner: L_div has no pair, so λ_div does not matter
        loss = ABELoss(ContrastiveLoss(margin=1.0), model.learner_slices, divergence_weight=weight)
        assert torch.equal(loss(attended, labels), ContrastiveLoss(margin=1.0)(attended, labels))


def test_parameter_counts_abe_shares_g_heads_copy_it():
    def count(model):
        return sum(p.numel() for p in model.parameters())

    def abe(shared_embedding: bool) -> list[int]:
        return [
            count(AttentionEnsemble(small_backbone(), m, 4, "stage2", "stage3", shared_embedding=shared_embedding))
            for m in (1, 2)
        ]

    heads = [count(HeadsEnsemble(small_backbone(), m, 4, "stage2")) for m in (1, 2)]
    mask_block = 16 * 8 + 8  # one more learner: a 1×1 conv block 16 → 8 channels with bias
    linear = 32 * 4 + 4  # a linear layer 32 → 4 with bias
    shared, per_learner = abe(shared_embedding=True), abe(shared_embedding=False)
    assert shared[1] - shared[0] == mask_block  # Eq. 7 literally: only the mask is per learner
    assert per_learner[1] - per_learner[0] == mask_block + linear  # the default: its own final layer too
    later = sum(p.numel() for p in small_backbone().stages("stage2", "pool").parameters())
    assert heads[1] - heads[0] == later + linear  # a copy of G + its own linear layer
    assert heads[0] == count(small_backbone()) + linear


def test_heads_learners_are_separate_networks():
    torch.manual_seed(0)
    model = HeadsEnsemble(small_backbone(), 3, 4, "stage2").eval()
    images = torch.rand(2, 3, 20, 20)
    out = model(images)
    assert out.shape == (2, 12)
    loss = ABELoss(ContrastiveLoss(), model.learner_slices, divergence_weight=0.0)
    loss(model(images), torch.tensor([0, 0])).backward()
    assert all(p.grad is not None for head in model.extra_heads for p in head.parameters() if p.requires_grad)


# ------------------------------------------------------------------------------ the recipe
def test_recipe_options_and_errors(params):
    recipe = build_recipe(abe_run(params, learners=4))
    model = recipe.build_model()
    assert isinstance(model, AttentionEnsemble) and model.learner_slices == [(0, 2), (2, 4), (4, 6), (6, 8)]
    assert isinstance(recipe.build_sampler(np.repeat(np.arange(4), 3), torch.Generator()), PairBatchSampler)
    with pytest.raises(ValueError, match="embedding_dim = 8 is not divisible.*learners = 3"):
        build_recipe(abe_run(params, learners=3))
    with pytest.raises(ValueError, match=r"options.branch_after = 'pool9' is not a stage"):
        build_recipe(abe_run(params, branch_after="pool9")).build_model()
    with pytest.raises(ValueError, match="attention_until = 'stage1' must be"):
        build_recipe(abe_run(params, attention_until="stage1")).build_model()
    with pytest.raises(OptionsError, match="pair_anchors"):
        build_recipe(abe_run(params, pair_anchors=3))
    with pytest.raises(OptionsError, match="not an option"):
        build_recipe(abe_run(params, heads=3))
    heads = build_recipe(abe_run(params, architecture="heads", learners=2))
    with pytest.raises(NotImplementedError):
        heads.attention_maps(heads.build_model(), torch.rand(1, 3, 20, 20))


def test_recipe_default_learners_differ_at_init(params):
    """The recipe's default ``embedding_layer: per_learner``: one final layer per learner and learners
    that differ at init; ``shared`` (Eq. 7 read literally) keeps one layer and near-identical learners."""
    images = torch.rand(6, 3, 20, 20)
    torch.manual_seed(0)
    model = build_recipe(abe_run(params, learners=8, dim=64)).build_model().eval()
    torch.manual_seed(0)
    shared = build_recipe(abe_run(params, learners=8, dim=64, embedding_layer="shared")).build_model().eval()
    assert len(model.embedding) == 8 and len(shared.embedding) == 1
    assert abs(self_cosine(model, images)) < 0.3 < 0.95 < self_cosine(shared, images)
    with pytest.raises(OptionsError, match="embedding_layer"):
        build_recipe(abe_run(params, embedding_layer="both"))


def test_divergence_ramp_by_hand(params):
    """λ_div share min(1, (epoch − 1 + batch / batches) / W): W = 2 epochs of 4 batches."""
    assert [divergence_ramp(1, b, 4, 2.0) for b in range(4)] == [0.0, 0.125, 0.25, 0.375]
    assert [divergence_ramp(2, b, 4, 2.0) for b in range(4)] == [0.5, 0.625, 0.75, 0.875]
    assert divergence_ramp(3, 0, 4, 2.0) == divergence_ramp(9, 3, 4, 2.0) == 1.0
    assert divergence_ramp(1, 1, 4, 0.5) == 0.5 and divergence_ramp(1, 2, 4, 0.5) == 1.0  # half an epoch
    assert divergence_ramp(1, 0, 4, 0.0) == 1.0  # no warm-up: in full from the first batch
    with pytest.raises(OptionsError, match="divergence_warmup_epochs"):
        build_recipe(abe_run(params, divergence_warmup_epochs=-1.0))


def test_divergence_warmup_is_applied_logged_and_resumed(params, tiny_manifest, tmp_path):
    """W = 2 epochs, 2 batches per epoch, λ_div = 0.5: the batches get 0.5 × (0, 0.25 | 0.5, 0.75 | 1, 1),
    so log.csv's epoch means of the applied λ_div are 0.0625, 0.3125, 0.5 — in a run cut after epoch 2
    and resumed as in one that was not; without warm-up every epoch logs 0.5."""
    run = abe_run(
        params, epochs=3, learners=2, batches="class_balanced", divergence_weight=0.5, divergence_warmup_epochs=2.0
    )

    class Stop(Exception):
        pass

    def stop(epoch: int) -> None:
        if epoch == 2:
            raise Stop

    train_run(run, tiny_manifest, tmp_path / "a" / "out", tmp_path / "a" / "scratch", progress=False)
    with pytest.raises(Stop):
        train_run(
            run, tiny_manifest, tmp_path / "b" / "out", tmp_path / "b" / "scratch", progress=False, on_epoch_end=stop
        )
    train_run(run, tiny_manifest, tmp_path / "b" / "out", tmp_path / "b" / "scratch", progress=False)
    for name in ("a", "b"):
        logged = pd.read_csv(tmp_path / name / "out" / "log.csv")["divergence_weight"].tolist()
        assert logged == pytest.approx([0.0625, 0.3125, 0.5], abs=1e-12), name
    plain = abe_run(params, epochs=2, learners=2, batches="class_balanced", divergence_weight=0.5)
    train_run(plain, tiny_manifest, tmp_path / "c" / "out", tmp_path / "c" / "scratch", progress=False)
    assert pd.read_csv(tmp_path / "c" / "out" / "log.csv")["divergence_weight"].tolist() == [0.5, 0.5]
    # the loss applies what the recipe computes: batch 1 of epoch 1 gets 0.5 × 0.25
    recipe = build_recipe(run)
    model, loss = recipe.build_model(), recipe.build_loss(num_classes=3)
    recipe.on_epoch_start(1, model, None)
    recipe.build_sampler(np.repeat(np.arange(3), 3), torch.Generator())
    images, labels = torch.rand(4, 3, 20, 20), torch.tensor([0, 0, 1, 1])
    for expected in (0.0, 0.125):
        value = recipe.training_loss(model, loss, images, labels, torch.arange(4))
        assert loss.divergence_weight == expected
        terms = loss.last_terms
        assert value.item() == pytest.approx((terms["metric"] + expected * terms["divergence"]).item(), abs=1e-6)


def test_recipe_attention_maps_are_per_learner(params):
    recipe = build_recipe(abe_run(params, learners=4))
    maps = recipe.attention_maps(recipe.build_model().eval(), torch.rand(3, 3, 20, 20))
    assert list(maps) == ["learner0", "learner1", "learner2", "learner3"]
    assert all(m.shape == (3, 20, 20) for m in maps.values())


@pytest.mark.parametrize("batches", ["pairs", "class_balanced"])
def test_training_is_deterministic_and_logs_the_terms(params, tiny_manifest, tmp_path, batches):
    run = abe_run(params, learners=2, batches=batches)
    for name in ("a", "b"):
        train_run(run, tiny_manifest, tmp_path / name / "out", tmp_path / name / "scratch", progress=False)
    a, b = (load_checkpoint(tmp_path / n / "out" / "checkpoint.pt")["model"] for n in ("a", "b"))
    assert a.keys() == b.keys() and all(torch.equal(a[k], b[k]) for k in a)
    log = pd.read_csv(tmp_path / "a" / "out" / "log.csv")
    health = ["health/train_self_similarity", "health/mask_mean", "health/mask_std"]
    assert {"metric_loss", "divergence_loss", *health} <= set(log.columns) and len(log) == 2
    summary = load_checkpoint(tmp_path / "a" / "out" / "checkpoint.pt")["summary"]
    assert {key: summary[key] for key in health} == log[health].iloc[-1].to_dict()  # the last epoch's


HEALTHY = {
    "R@1": 0.30,
    "learners_mean/R@1": 0.20,
    "self_similarity": 0.40,
    "health/mask_mean": 0.90,
    "health/mask_std": 0.10,
}


@pytest.mark.parametrize(
    ("options", "dead", "failing"),
    [
        ({}, {"learners_mean/R@1": 0.02}, "learners_mean/R@1"),  # the summed-L_div collapse (learners at chance)
        ({}, {"self_similarity": 0.95}, "self_similarity"),  # L_div has not spread the learners
        ({}, {"health/mask_std": 0.001}, "health/mask_std"),  # one uniform mask: attention does nothing
        ({}, {"health/mask_mean": 0.01}, "health/mask_mean"),  # masks closed: the features are switched off
        ({"architecture": "heads", "divergence_weight": 0.0}, {"learners_mean/R@1": 0.02}, "learners_mean/R@1"),
    ],
)
def test_health_checks_fail_on_a_dead_mechanism(params, options, dead, failing):
    checks = build_recipe(abe_run(params, learners=4, **options)).health_checks()
    assert failed_checks(checks, HEALTHY) == []
    failures = failed_checks(checks, {**HEALTHY, **dead})
    assert len(failures) == 1 and failing in failures[0], failures


def test_health_checks_follow_the_options(params):
    """No diversity check without L_div, no mask checks for M-heads, no learner checks for one learner."""

    def keys(**options):
        return {check.key for check in build_recipe(abe_run(params, **options)).health_checks()}

    ensemble = {"learners_mean/R@1"}
    masks = {"health/mask_mean", "health/mask_std"}
    assert keys(learners=4) == ensemble | {"self_similarity"} | masks
    assert keys(learners=4, divergence_weight=0.0) == ensemble | masks
    assert keys(learners=4, architecture="heads", divergence_weight=0.0) == ensemble
    assert keys(learners=4, architecture="heads") == ensemble | {"self_similarity"}
    assert keys(learners=1, divergence_weight=0.0) == masks


def two_learners(architecture: type, freeze_bn: bool = False) -> tuple[torch.nn.Module, torch.nn.Module]:
    """A 2-learner ensemble branching after stage2 (ABE: trunk = stage3) and its copied backbone stages."""
    args = ("stage2", "stage3") if architecture is AttentionEnsemble else ("stage2",)
    model = architecture(small_backbone(), 2, 4, *args, freeze_bn=freeze_bn)
    return model, model.attention_trunk if architecture is AttentionEnsemble else model.extra_heads


@pytest.mark.parametrize("architecture", [AttentionEnsemble, HeadsEnsemble])
def test_frozen_batchnorm_covers_the_copied_stages(architecture):
    model, copies = two_learners(architecture, freeze_bn=True)
    norms = [m for m in model.train().modules() if isinstance(m, torch.nn.BatchNorm2d)]
    assert any(isinstance(m, torch.nn.BatchNorm2d) for m in copies.modules())
    assert all(not m.training and not m.weight.requires_grad for m in norms)


@pytest.mark.parametrize("architecture", [AttentionEnsemble, HeadsEnsemble])
def test_copied_stages_train_at_the_backbone_lr(architecture):
    model, copies = two_learners(architecture)
    groups = parameter_group_ids(model)
    copied = {id(p) for p in copies.parameters()}
    assert copied and copied <= groups["backbone"]
    assert {id(p) for p in model.embedding.parameters()} <= groups["head"]
