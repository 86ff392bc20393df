"""DeML: random-walk OAM, crop-and-zoom, CAM, gradient reversal, the loss terms by hand, the network and recipe."""

from __future__ import annotations

import copy
import math
from types import SimpleNamespace

import numpy as np
import pytest
import torch
from conftest import tiny_run
from PIL import Image

from dmlbench.config import resolve_method, resolve_run
from dmlbench.data.dataset import ImageDataset
from dmlbench.data.manifest import ManifestError
from dmlbench.data.transforms import eval_transform
from dmlbench.losses import BinomialDevianceLoss
from dmlbench.losses.deml_adversary import (
    AdversaryNetwork,
    contrastive_hinge_diversity,
    grad_reverse,
)
from dmlbench.losses.deml_loss import (
    DeMLLoss,
    activation_decay,
    nontrivial_solution_penalty,
)
from dmlbench.methods import OptionsError, build_recipe
from dmlbench.methods.base import TrainContext
from dmlbench.methods.deml import HEALTH_KEYS, DeMLOptions, oam_health, transformed_box
from dmlbench.methods.health import failed_checks
from dmlbench.models.deml_attention import (
    ChannelAttention,
    attention_box,
    connected_components,
    crop_and_zoom,
    largest_component,
    oam_saliency,
    object_saliency,
    paste_into_image,
    random_walk_saliency,
    transition_matrix,
)
from dmlbench.settings import training_settings
from dmlbench.training.trainer import train_run

DEML = {"label": "DeML", "recipe": "deml", "loss": {"name": "binomial", "alpha": 2.0, "beta": 0.5, "neg_weight": 35.0}}


def deml_run(params: dict, epochs: int = 2, dim: int = 12, **options) -> dict:
    """A tiny resolved DeML run (width-4 CNN, 20 px) with the given options."""
    config = copy.deepcopy(params)
    config["methods"]["deml"] = {**DEML, "options": options}
    run = tiny_run(config, "deml", epochs=epochs)
    run["training"]["embedding_dim"] = dim
    return run


# ------------------------------------------------------------------------------ OAM random walk
def test_transition_matrix_and_stationary_mass_by_hand():
    """A 1×3 map with scalar features 0, 1, 3: edge weights |u_a − u_b|, rows normalised."""
    features = torch.tensor([0.0, 1.0, 3.0]).view(1, 1, 1, 3)
    expected = torch.tensor([[0, 1, 3], [1, 0, 2], [3, 2, 0]], dtype=torch.float32)
    expected = expected / expected.sum(1, keepdim=True)  # [0 1/4 3/4], [1/3 0 2/3], [3/5 2/5 0]
    assert torch.allclose(transition_matrix(features)[0], expected, atol=1e-6)
    # symmetric weights: the walk's stationary mass is each node's total weight / all: (4, 3, 5) / 12
    mass = random_walk_saliency(features, iterations=200)[0, 0]
    assert torch.allclose(mass, torch.tensor([4.0, 3.0, 5.0]) / 12, atol=1e-6)


@pytest.mark.parametrize("gaussian_sigma", [0.0, 0.15])
def test_random_walk_reaches_the_eigenvector_of_eigenvalue_one(gaussian_sigma):
    generator = torch.Generator().manual_seed(0)
    features = torch.randn(2, 5, 3, 4, generator=generator)
    transition = transition_matrix(features, gaussian_sigma).double()
    assert torch.allclose(transition.sum(-1), torch.ones(2, 12, dtype=torch.float64), atol=1e-6)
    for b in range(2):
        values, vectors = np.linalg.eig(transition[b].numpy().T)  # mass' = Pᵀ mass
        top = np.argmin(np.abs(values - 1.0))
        assert abs(values[top] - 1.0) < 1e-6
        stationary = np.real(vectors[:, top])
        stationary = stationary / stationary.sum()
        for iterations, tolerance in ((10, 2e-3), (100, 1e-6)):
            mass = random_walk_saliency(features[b : b + 1], iterations, gaussian_sigma)[0].flatten().double()
            assert abs(float(mass.sum()) - 1.0) < 1e-5
            assert np.abs(mass.numpy() - stationary).max() < tolerance, iterations


def test_random_walk_gathers_mass_on_the_odd_positions_and_handles_constant_maps():
    features = torch.randn(1, 3, 5, 5, generator=torch.Generator().manual_seed(0)) * 0.5
    features[0, :, 1:3, 2:4] += 3.0  # a 2×2 "object" unlike its background
    mass = random_walk_saliency(features)[0]
    background = torch.ones(5, 5, dtype=torch.bool)
    background[1:3, 2:4] = False
    assert mass[1:3, 2:4].min() > 1.5 * mass[background].max()
    flat = random_walk_saliency(torch.ones(1, 3, 4, 4))[0]
    assert torch.allclose(flat, torch.full((4, 4), 1 / 16))


def test_two_valued_maps_make_a_periodic_walk():
    """A flat object on a flat background is a complete bipartite graph: the mass alternates
    (the paper's ergodicity argument needs aperiodicity too); an even T returns to uniform."""
    features = torch.zeros(1, 3, 5, 5)
    features[0, :, 1:3, 2:4] = 1.0
    assert torch.allclose(random_walk_saliency(features, 10)[0], torch.full((5, 5), 1 / 25))
    odd = random_walk_saliency(features, 11)[0]
    assert torch.allclose(odd[1:3, 2:4].sum(), torch.tensor(21 / 25))  # 21 of 25 nodes send all mass in


# ------------------------------------------------------------------------------ box, crop and zoom
def _object_map() -> torch.Tensor:
    saliency = torch.zeros(1, 40, 40)
    saliency[0, 10:20, 5:30] = 1.0  # the object: rows 10–19, columns 5–29
    saliency[0, 30:33, 35:38] = 0.8  # a smaller distractor region
    return saliency


def test_box_takes_the_largest_above_mean_region_and_squares_it():
    assert largest_component(_object_map() > 0.5)[0].nonzero().min(0).values.tolist() == [10, 5]
    # w = 25, h = 10: x += round(15/4) = 4, y += round(-15/4) = -4, side = round(17.5) = 18
    assert attention_box(_object_map()).tolist() == [[9.0, 6.0, 27.0, 24.0]]
    corner = torch.zeros(1, 40, 40)
    corner[0, 0:4, 0:20] = 1.0  # square (4, −4, 16, 8) sticks out above the image and is clipped
    assert attention_box(corner).tolist() == [[4.0, 0.0, 16.0, 8.0]]


def _labels_by_propagation(mask: torch.Tensor) -> torch.Tensor:
    """Oracle: every pixel takes the largest position index reachable through 8-neighbours in the mask."""
    b, h, w = mask.shape
    inside = mask.float()
    labels = torch.arange(1, h * w + 1, dtype=torch.float32).view(1, h, w) * inside
    while True:
        grown = torch.nn.functional.max_pool2d(labels[:, None], 3, stride=1, padding=1)[:, 0] * inside
        if torch.equal(grown, labels):
            return labels.long()
        labels = grown


def test_connected_components_label_each_region_by_its_largest_position_within_its_own_map():
    generator = torch.Generator().manual_seed(0)
    noise = torch.rand(6, 23, 31, generator=generator)
    mask = torch.nn.functional.avg_pool2d(noise[:, None], 3, stride=1, padding=1)[:, 0] > 0.52
    mask[5] = False  # an empty map
    mask[4] = True  # one region covering the map: its label is H × W
    labels = connected_components(mask)
    assert labels.dtype == torch.int64 and torch.equal(labels, _labels_by_propagation(mask))
    assert labels[4].unique().tolist() == [23 * 31] and labels[5].abs().sum() == 0
    spiral = torch.zeros(1, 9, 9, dtype=torch.bool)  # a long snake: one region, its label the last pixel
    spiral[0, 0, :] = spiral[0, :, 8] = spiral[0, 8, 2:] = spiral[0, 2:, 2] = spiral[0, 2, 2:7] = True
    assert connected_components(spiral)[0][spiral[0]].unique().tolist() == [9 * 8 + 8 + 1]


def test_regions_touching_diagonally_are_one_region():
    saliency = torch.zeros(1, 10, 10)
    for i in range(6):
        saliency[0, i, i] = 1.0  # a diagonal line of 6 pixels beats a 2×2 block of 4
    saliency[0, 7:9, 7:9] = 1.0
    assert attention_box(saliency).tolist() == [[0.0, 0.0, 6.0, 6.0]]


def test_constant_saliency_keeps_the_whole_image():
    assert attention_box(torch.full((2, 8, 6), 0.3)).tolist() == [[0.0, 0.0, 6.0, 8.0]] * 2


def test_crop_and_zoom_samples_the_box():
    ys, xs = torch.meshgrid(torch.arange(32.0), torch.arange(32.0), indexing="ij")
    image = torch.stack([xs, ys, xs + ys])[None]  # pixel values = coordinates
    same_scale = crop_and_zoom(image, torch.tensor([[8.0, 4.0, 24.0, 20.0]]), (16, 16))
    assert torch.allclose(same_scale, image[:, :, 4:20, 8:24], atol=1e-4)
    zoomed = crop_and_zoom(image, torch.tensor([[8.0, 4.0, 16.0, 12.0]]))  # 8 px → 32 px
    u = torch.arange(32.0)
    expected_x = 8 + (u + 0.5) * 8 / 32 - 0.5  # bilinear is exact on a linear ramp inside the image
    assert torch.allclose(zoomed[0, 0, 10], expected_x, atol=1e-4)
    assert torch.allclose(zoomed[0, 1, :, 10], expected_x - 4, atol=1e-4)


def test_paste_into_image_inverts_crop_and_zoom_inside_the_box():
    ys, xs = torch.meshgrid(torch.arange(24.0), torch.arange(24.0), indexing="ij")
    ramp = (xs + 2 * ys)[None]
    box = torch.tensor([[4.0, 6.0, 16.0, 18.0]])
    back = paste_into_image(crop_and_zoom(ramp[:, None], box)[:, 0], box, (24, 24))
    assert torch.allclose(back[0, 7:17, 5:15], ramp[0, 7:17, 5:15], atol=1e-3)
    assert back[0, :5].abs().max() == 0 and back[0, :, 17:].abs().max() == 0


def test_oam_box_finds_a_known_object_in_feature_maps():
    features = torch.randn(1, 1, 8, 8, 8, generator=torch.Generator().manual_seed(1)) * 0.05
    features[..., 2:5, 3:6] += 2.0  # object cells: rows 2–4, columns 3–5 → pixels 16–40, 24–48 at 8 px/cell
    saliency = object_saliency([features], (64, 64))
    x0, y0, x1, y1 = attention_box(saliency)[0].tolist()  # the object's box is square already
    assert 12 <= y0 <= 20 and 36 <= y1 <= 44 and 20 <= x0 <= 28 and 44 <= x1 <= 52


def _large_object_maps(seed: int, side: int = 14, channels: int = 8) -> torch.Tensor:
    """(1, 1, C, side, side) noisy features with a large object: cells 2..11 of 14 on both axes
    (51 % of the map) share one feature direction; the background is noise."""
    generator = torch.Generator().manual_seed(seed)
    features = torch.randn(1, 1, channels, side, side, generator=generator) * 0.3
    features[..., 2:12, 2:12] += torch.randn(channels, generator=generator)[:, None, None]
    return features


@pytest.mark.parametrize("seed", range(5))
def test_default_oam_localises_a_large_object(seed):
    """The object covers half the map: without the code's Gaussian spatial term the walk gathers
    the mass on the rarer background. Object pixels 16..48 of 56 (4 px per cell)."""
    saliency = oam_saliency([_large_object_maps(seed)], (56, 56), 10, DeMLOptions().oam_variant)[0]
    inside = torch.zeros(56, 56, dtype=torch.bool)
    inside[8:48, 8:48] = True
    assert saliency[inside].mean() > saliency[~inside].mean()
    x0, y0, x1, y1 = attention_box(saliency[None])[0].tolist()
    assert x0 <= 8 and y0 <= 8 and x1 >= 48 and y1 >= 48


def test_paper_oam_prefers_the_rarer_background_on_a_large_object():
    saliency = oam_saliency([_large_object_maps(0)], (56, 56), 10, "paper")[0]
    inside = torch.zeros(56, 56, dtype=torch.bool)
    inside[8:48, 8:48] = True
    assert saliency[inside].mean() < saliency[~inside].mean()


@pytest.mark.parametrize("variant", ["paper", "code"])
def test_saliency_weighs_layers_equally(variant):
    """Layer A (one map) is layer B (three identical CAM-branch maps) mirrored left–right: with one
    vote per layer the averaged saliency is mirror-symmetric; one vote per map would give B 3/4."""
    layer_b = _large_object_maps(1, side=8).expand(3, 1, 8, 8, 8).clone()
    layer_b[..., :, :, 4:] = 0.0  # B's right half is flat, A's left half
    layer_a = layer_b[:1].flip(-1)
    saliency = oam_saliency([layer_a, layer_b], (32, 32), 10, variant)[0]
    assert torch.allclose(saliency, saliency.flip(-1), atol=1e-5)
    only_b = oam_saliency([layer_b], (32, 32), 10, variant)[0]
    assert not torch.allclose(only_b, only_b.flip(-1), atol=1e-2)


# ------------------------------------------------------------------------------ CAM and gradient reversal
def test_cam_reweights_channels():
    """The paper's σ gate at PyTorch's init: weights in (0, 1) that vary over channels (and positions)."""
    cam = ChannelAttention(6, hidden=4, init="paper")
    x = torch.randn(2, 6, 5, 5)
    weights = cam.weights(x)
    assert weights.shape == (2, 6, 1, 1) and weights.flatten(1).std(1).min() > 0
    assert weights.min() > 0 and weights.max() < 1
    assert torch.allclose(cam(x), x * weights)
    per_position = ChannelAttention(6, hidden=4, pooled=False, init="paper").weights(x)
    assert per_position.shape == (2, 6, 5, 5) and per_position.std(dim=(2, 3)).min() > 0


@pytest.mark.parametrize("pooled", [True, False])
def test_identity_cam_leaves_features_unchanged_and_its_gate_learns(pooled):
    """Default init: gate 2σ(z) with the last layer zero, so U ⊙ 1 = U exactly (the paper's init halves
    U, ≈ 0.5 per gate). The gate still learns from the first step: ∂out/∂b2_c = U_c · 2σ'(0) = U_c / 2."""
    torch.manual_seed(0)
    x = torch.randn(2, 6, 5, 5)
    cam = ChannelAttention(6, hidden=4, pooled=pooled)
    assert torch.equal(cam(x), x)
    old = ChannelAttention(6, hidden=4, pooled=pooled, init="paper")
    assert (old(x) - x).norm() / x.norm() > 0.3
    upstream = torch.randn_like(x)
    (cam(x) * upstream).sum().backward()
    by_hand = 0.5 * (x * upstream).sum(dim=(0, 2, 3))
    assert torch.allclose(cam.expand.bias.grad, by_hand, atol=1e-5)
    assert cam.expand.weight.grad.abs().sum() > 0
    with pytest.raises(ValueError, match="CAM init"):
        ChannelAttention(6, init="open")


def _backbone_embedding(model, scale: int, images: torch.Tensor, learner: int = 0) -> torch.Tensor:
    """CA learner ``learner`` of ``scale`` on the bare backbone's pooled features, L2-normalised: (B, w)."""
    return torch.nn.functional.normalize(model.learner(scale, learner)(model.backbone[scale](images)), dim=-1)


@pytest.mark.parametrize("cam_pooled", [True, False])
def test_default_deml_at_init_embeds_every_scale_as_its_backbone(params, cam_pooled):
    """DeML(3, 2) at init with the default CAMs: every learner of scale i is the backbone of scale i on
    that scale's input (the image, then the zoomed OAM crops) through its own linear layer; with the
    paper's CAMs the embedding differs from the bare backbone's."""
    torch.manual_seed(0)
    images = torch.rand(4, 3, 20, 20)
    model = build_recipe(deml_run(params, dim=12, num_scales=3, num_cams=2, cam_pooled=cam_pooled)).build_model().eval()
    with torch.no_grad():
        embedding = model(images).view(4, 3, 2, 2)  # (B, scale, learner, w)
        _, _, boxes = model._passes(images)
        x = images
        for scale in range(3):
            for learner in range(2):
                expected = _backbone_embedding(model, scale, x, learner)
                assert torch.allclose(embedding[:, scale, learner], expected, atol=1e-5)
            if scale < 2:
                x = crop_and_zoom(x, boxes[scale])
    paper = (
        build_recipe(deml_run(params, dim=12, num_scales=1, num_cams=2, cam_pooled=cam_pooled, cam_init="paper"))
        .build_model()
        .eval()
    )
    with torch.no_grad():
        gap = (paper(images).view(4, 2, 6)[:, 0] - _backbone_embedding(paper, 0, images)).norm(dim=-1)
    assert gap.min() > 1e-3


def test_gradient_reversal_flips_the_sign():
    x = torch.randn(4, 3, requires_grad=True)
    w = torch.randn(4, 3)
    y = grad_reverse(x, 0.5)
    assert torch.equal(y, x)
    (y * w).sum().backward()
    assert torch.allclose(x.grad, -0.5 * w)


def test_adversary_trains_to_shrink_the_discrepancy_while_its_input_is_pushed_to_grow_it():
    torch.manual_seed(0)
    adversary = AdversaryNetwork(width=3, hidden=5)
    embeddings = torch.randn(2, 4, 3, requires_grad=True)
    adversary(embeddings).backward()
    reversed_grad = embeddings.grad.clone()
    embeddings.grad = None
    unit = torch.nn.functional.normalize(embeddings, dim=-1)
    mapped = adversary.net(unit)
    ((mapped[0] - mapped[1]).pow(2).sum(-1).mean()).backward()  # the same loss without reversal
    assert torch.allclose(reversed_grad, -embeddings.grad, atol=1e-6)


# ------------------------------------------------------------------------------ loss terms by hand
def _deviance(cosine: float, positive: bool, alpha=2.0, beta=0.5, c_neg=35.0) -> float:
    z = -alpha * (cosine - beta) if positive else alpha * c_neg * (cosine - beta)
    return math.log1p(math.exp(z))


def test_binomial_deviance_by_hand_and_averaged_over_learners():
    angles = [(0.0, 30.0, 100.0, 180.0), (0.0, 90.0, 60.0, 45.0)]  # two learners, 4 images
    classes = [0, 0, 1, 1]
    per_learner = []
    for degrees in angles:
        positives, negatives = [], []
        for p in range(4):
            for q in range(p + 1, 4):
                cosine = math.cos(math.radians(degrees[p] - degrees[q]))
                (positives if classes[p] == classes[q] else negatives).append(
                    _deviance(cosine, classes[p] == classes[q])
                )
        per_learner.append(sum(positives) / len(positives) + sum(negatives) / len(negatives))  # 1/w_pq
    rad = torch.tensor(angles, dtype=torch.float64) * math.pi / 180
    embeddings = torch.stack([rad.cos(), rad.sin()], dim=-1) * 3.0  # (J=2, B=4, 2), not unit: cosine only
    labels = torch.tensor(classes)
    binomial = BinomialDevianceLoss(alpha=2.0, beta=0.5, neg_weight=35.0)
    assert float(binomial(embeddings[0], labels)) == pytest.approx(per_learner[0], rel=1e-9)
    loss = DeMLLoss(
        binomial, num_scales=1, learners_per_scale=2, learner_dim=2, adversary="none", decay_weight=0.0, ntri_weight=0.0
    )
    terms = loss([embeddings], labels, [torch.eye(2)])
    assert float(terms.total) == pytest.approx(sum(per_learner) / 2, rel=1e-9)


def test_activation_decay_and_nontrivial_term_by_hand():
    outputs = [torch.tensor([[[3.0, 4.0], [0.0, 1.0]]])]  # 1 learner, 2 images: ½ (25 + 1) / 2
    assert float(activation_decay(outputs)) == pytest.approx(6.5)
    # rows of ω: ‖(1, 1)‖² = 2, ‖(0, 1)‖² = 1 → (2 − 1)² + 0; ωωᵀ's off-diagonal is not penalised
    omega = torch.tensor([[1.0, 1.0], [0.0, 1.0]])
    assert float(nontrivial_solution_penalty([omega], variant="paper")) == pytest.approx(1.0)
    loss = DeMLLoss(
        BinomialDevianceLoss(),
        num_scales=1,
        learners_per_scale=1,
        learner_dim=2,
        decay_weight=0.014,
        ntri_weight=0.25,
        ntri_variant="paper",
    )
    terms = loss(outputs, torch.tensor([0, 1]), [torch.tensor([[1.0, 1.0], [0.0, 1.0]])])
    assert float(terms.decay) == pytest.approx(0.014 * 6.5) and float(terms.ntri) == pytest.approx(0.25)
    assert float(terms.adversary) == 0.0  # one learner: no adversary


def test_code_scaled_nontrivial_term_by_hand():
    """The released code: λ2 = 0.5 × the mean over the rows of each distinct matrix; a matrix shared
    by the learners of a scale counts once. Rows with ‖ω_k‖² = 1/3 (PyTorch's default init) and 1."""
    shared = torch.tensor([[1.0, 1.0, 1.0], [1.0, 0.0, 0.0]]) / torch.tensor([[3.0], [3.0**0.5]])
    other = torch.eye(2, 3)
    code = nontrivial_solution_penalty([shared, shared, other], variant="code")
    assert float(code) == pytest.approx(((1 / 3 - 1) ** 2 + (1 / 3 - 1) ** 2) / 2 + 0.0)
    paper = nontrivial_solution_penalty([shared, shared, other], variant="paper")
    assert float(paper) == pytest.approx(2 * 2 * (2 / 3) ** 2)
    assert DeMLOptions().ntri_variant == "code" and DeMLOptions().lambda2 == 0.5
    assert DeMLOptions(ntri_variant="paper").lambda2 == 0.25


def test_nontrivial_term_at_init_is_small_next_to_the_metric(params):
    """The embedded default DeML(3, 3) at initialisation: the code's scale gives L_ntri ≈ 0.5 × 3 ×
    (1 − 1/3)² ≈ 0.67 next to a binomial deviance of ≈ 13; the paper's sum over 9 learners × 56
    rows at λ2 = 0.25 gave 56, four times the metric."""
    torch.manual_seed(0)
    run = resolve_run(params, "synthetic", "deml", 0)
    run["training"]["device"] = "cpu"
    run["training"]["backbone"]["pretrained"] = None  # random initial weights, as measured
    recipe = build_recipe(run)
    model, loss = recipe.build_model(), recipe.build_loss(40)
    images, labels = torch.rand(16, 3, 56, 56), torch.arange(4).repeat_interleave(4)
    with torch.no_grad():
        terms = loss(model.learner_outputs(images), labels, model.learner_weights())
    assert 0.01 < float(terms.ntri) / float(terms.metric) < 0.2


def test_contrastive_hinge_diversity_by_hand():
    same = torch.tensor([[[1.0, 0.0]], [[2.0, 0.0]]])  # identical directions: ½ (2 − 0)² = 2
    assert float(contrastive_hinge_diversity(same)) == pytest.approx(2.0)
    orthogonal = torch.tensor([[[1.0, 0.0]], [[0.0, 1.0]]])  # distance √2: ½ (2 − √2)²
    assert float(contrastive_hinge_diversity(orthogonal)) == pytest.approx(0.5 * (2 - math.sqrt(2)) ** 2)
    opposite = torch.tensor([[[1.0, 0.0]], [[-1.0, 0.0]]])
    assert float(contrastive_hinge_diversity(opposite)) == 0.0


# ------------------------------------------------------------------------------ network and recipe
def test_network_layout_slices_views_and_unit_learners(params):
    recipe = build_recipe(deml_run(params, dim=20, num_scales=3, num_cams=3))
    model = recipe.build_model().eval()
    assert len(model.backbone) == 3 and model.learner_dim == 2  # ⌊20 / 9⌋
    assert model.learner_slices == [(2 * m, 2 * m + 2) for m in range(9)]
    assert recipe.embedding_views(model) == {"scale0": (0, 6), "scale1": (6, 12), "scale2": (12, 18)}
    embeddings = model(torch.rand(3, 3, 20, 20))
    assert embeddings.shape == (3, 18)
    assert torch.allclose(embeddings.view(3, 9, 2).norm(dim=-1), torch.ones(3, 9), atol=1e-5)


def test_unattended_baseline_is_one_plain_learner(params):
    recipe = build_recipe(deml_run(params, dim=12, num_scales=1, num_cams=0))
    model = recipe.build_model()
    assert model.learner_slices is None and recipe.embedding_views(model) == {}
    assert len(model.cams[0]) == 0 and model.learner_weights()[0].shape == (12, 32)
    assert model(torch.rand(2, 3, 20, 20)).shape == (2, 12)


@pytest.mark.parametrize("share", [True, False])
def test_shared_learners_differ_only_through_their_cams(params, share):
    torch.manual_seed(0)
    model = build_recipe(deml_run(params, num_scales=1, num_cams=2, share_learners=share)).build_model().eval()
    model.cams[0][1].load_state_dict(model.cams[0][0].state_dict())  # two identical CAMs
    first, second = model.learner_outputs(torch.rand(3, 3, 20, 20))[0]
    assert torch.allclose(first, second) == share
    weights = model.learner_weights()
    assert len(weights) == 2 and (weights[0] is weights[1]) == share


def test_no_gradient_flows_through_the_crop(params):
    recipe = build_recipe(deml_run(params, num_scales=2, num_cams=2))
    model = recipe.build_model()
    second_scale = model.learner_outputs(torch.rand(4, 3, 20, 20))[1]
    second_scale.sum().backward()
    assert all(p.grad is None for p in model.backbone[0].parameters())
    assert any(p.grad is not None and p.grad.abs().sum() > 0 for p in model.backbone[1].parameters())


def test_attention_maps_for_figures(params):
    recipe = build_recipe(deml_run(params, num_scales=2, num_cams=2))
    maps = recipe.attention_maps(recipe.build_model().eval(), torch.rand(3, 3, 20, 20))
    assert set(maps) == {"oam_scale0", "crop_scale0", "oam_scale1", "crop_scale1", "cam0", "cam1"}
    for value in maps.values():
        assert value.shape[0] == 3 and value.min() >= 0 and value.max() <= 1
    crop = maps["crop_scale0"]
    assert set(crop.unique().tolist()) <= {0.0, 1.0} and crop.sum() > 0
    assert (maps["oam_scale1"] * (1 - crop)).abs().max() < 1e-5  # scale 1 lives inside scale 0's crop


@pytest.mark.parametrize(
    ("options", "message"),
    [
        ({"num_cams": -1}, "num_cams must be ≥ 0"),
        ({"oam_variant": "other"}, "oam_variant"),
        ({"cam_init": "open_bias"}, "cam_init"),
        ({"oam_layers": []}, "oam_layers must name at least one stage"),
        ({"adversary_weight": -1.0}, "adversary_weight must be ≥ 0"),
    ],
)
def test_bad_options_are_rejected(params, options, message):
    with pytest.raises(OptionsError, match=message):
        build_recipe(deml_run(params, **options))


def test_bad_cut_points_name_the_option(params):
    with pytest.raises(ValueError, match=r"methods\.deml\.options\.cam_after / oam_layers.*'inception4e'"):
        build_recipe(deml_run(params, oam_layers=["inception4e"])).build_model()
    with pytest.raises(ValueError, match=r"smaller than the 9 learners"):
        build_recipe(deml_run(params, dim=8, num_scales=3, num_cams=3)).build_model()


def test_adversary_weight_defaults_follow_the_variant():
    assert DeMLOptions().lambda0 == 1.0
    assert DeMLOptions(adversary="contrastive").lambda0 == 0.2
    assert DeMLOptions(adversary="contrastive", adversary_weight=0.5).lambda0 == 0.5


def test_training_is_deterministic_and_logs_the_terms(params, tiny_manifest, tmp_path):
    """The tiny dataset has no boxes: the health numbers are NaN in log.csv and absent from the summary."""
    run = deml_run(params, epochs=1, num_scales=2, num_cams=2, oam_variant="code", adversary="grl")
    states, summaries = [], []
    for name in ("a", "b"):
        train_run(run, tiny_manifest, tmp_path / name, tmp_path / f"scratch_{name}", progress=False)
        checkpoint = torch.load(tmp_path / name / "checkpoint.pt", weights_only=False)
        states.append(checkpoint["model"])
        summaries.append(checkpoint["summary"])
    assert states[0].keys() == states[1].keys()
    assert all(torch.equal(states[0][k], states[1][k]) for k in states[0])
    log = (tmp_path / "a" / "log.csv").read_text().splitlines()
    header = log[0].split(",")
    row = dict(zip(header, log[1].split(",")))
    assert math.isfinite(float(row["learner_cosine"])) and float(row["loss_ntri"]) > 0
    assert all(row[key] in ("", "nan") for key in HEALTH_KEYS)  # NaN
    assert not set(summaries[0]) & set(HEALTH_KEYS)  # the OAM numbers are absent, not NaN


# ------------------------------------------------------------------------------ mechanism health
def _boxed_context(tmp_path, run) -> TrainContext:
    """Two 24×24 validation images whose object box is (4, 6, 12, 10) px (x, y, w, h)."""
    paths = []
    for i in range(2):
        path = tmp_path / f"{i}.png"
        Image.new("RGB", (24, 24), (i * 50, 0, 0)).save(path)
        paths.append(str(path))
    image = training_settings(run).image
    val = ImageDataset(paths, np.array([0, 1]), eval_transform(image.resize, image.test_crop))
    data = SimpleNamespace(val=val, val_boxes=np.array([[4.0, 6.0, 12.0, 10.0]] * 2), train_boxes=None)
    return TrainContext(data=data, device=torch.device("cpu"), eval_batch_size=16)


class _FixedOAM(torch.nn.Module):
    """A model whose scale-0 OAM returns a given saliency map and crop box for every image."""

    def __init__(self, saliency: torch.Tensor, crop: list[float]):
        super().__init__()
        self.map, self.crop = saliency, torch.tensor([crop])

    def first_proposal(self, images):
        return self.map.expand(len(images), -1, -1), self.crop.expand(len(images), 4)


@pytest.mark.parametrize("box", [[24.0, 0.0, 5.0, 5.0], [0.0, 30.0, 5.0, 5.0], [-9.0, 2.0, 9.0, 5.0]])
def test_a_box_outside_its_image_is_named_not_measured(params, tmp_path, box):
    """A box wholly outside the 24×24 image would count as an object the crop misses: a silent
    drop of DeML's crop_contains_object. A box overrunning the border (real CUB has some) is clipped."""
    context = _boxed_context(tmp_path, deml_run(params))
    with pytest.raises(ManifestError, match=r"0\.png: its bbox .* lies outside the 24×24 image"):
        transformed_box(context.data.val, 0, np.array(box))
    assert transformed_box(context.data.val, 0, np.array([20.0, 20.0, 9.0, 9.0])).tolist() == [18.0, 18.0, 20.0, 20.0]


def test_oam_health_measures_the_object_in_the_transformed_image(params, tmp_path):
    """Resize 24 → 24, centre crop 20: the box moves by −2 px to (2, 4)–(14, 14)."""
    run = deml_run(params)
    context = _boxed_context(tmp_path, run)
    assert transformed_box(context.data.val, 0, context.data.val_boxes[0]).tolist() == [2.0, 4.0, 14.0, 14.0]
    on_object = torch.zeros(20, 20)
    on_object[4:14, 2:14] = 1.0
    healthy = oam_health(_FixedOAM(on_object, [1.0, 3.0, 15.0, 17.0]), context)
    assert healthy == {
        "health/saliency_in_object": 1.0,
        "health/crop_contains_object": 1.0,
        "health/crop_area": pytest.approx(14 * 14 / 400),
    }
    dead = oam_health(_FixedOAM(1 - on_object, [0.0, 0.0, 8.0, 8.0]), context)  # crop covers 6×4 of 12×10
    assert dead["health/saliency_in_object"] == 0.0 and dead["health/crop_contains_object"] == 0.0
    context.data.val_boxes = np.full((2, 4), np.nan)
    assert all(math.isnan(v) for v in oam_health(_FixedOAM(on_object, [0.0, 0.0, 8.0, 8.0]), context).values())


def test_health_checks_fail_on_dead_values_and_pass_on_healthy(params):
    checks = build_recipe(resolve_run(params, "synthetic", "deml", 0)).health_checks()
    keys = {"health/saliency_in_object", "health/crop_contains_object", "self_similarity", "learners_mean/R@1"}
    assert {c.key for c in checks} == keys
    healthy = {
        "health/saliency_in_object": 0.95,
        "health/crop_contains_object": 0.9,
        "self_similarity": 0.1,
        "learners_mean/R@1": 0.15,
    }
    dead = {
        "health/saliency_in_object": 0.34,
        "health/crop_contains_object": 0.2,
        "self_similarity": 0.95,
        "learners_mean/R@1": 0.02,
    }
    assert failed_checks(checks, healthy) == []
    assert len(failed_checks(checks, dead)) == 4
    for key in keys:  # each bound fails on its own dead value
        assert len(failed_checks(checks, {**healthy, key: dead[key]})) == 1


@pytest.mark.parametrize(
    ("dataset", "method", "expected"),
    [
        ("synthetic", "deml_i1j8_noadv", {"learners_mean/R@1"}),  # no adversary, one scale: no OAM check
        ("synthetic", "deml_i1j8", {"self_similarity", "learners_mean/R@1"}),
        ("synthetic", "deml_i3j1", {"health/saliency_in_object", "health/crop_contains_object", "learners_mean/R@1"}),
        ("synthetic", "deml_u512_act", set()),
        ("sop", "deml_i3j1", {"learners_mean/R@1"}),  # SOP has no boxes
        ("cub200_cropped", "deml_i3j1", {"learners_mean/R@1"}),
    ],
)
def test_health_checks_follow_the_options_and_the_dataset(params, dataset, method, expected):
    checks = build_recipe(resolve_run(params, dataset, method, 0)).health_checks()
    assert {c.key for c in checks} == expected


def test_default_learners_start_different_and_table4_shares_them(params):
    """With CAM gates open at init, shared learners would give identical outputs (cosine 1), the adversary's
    hinge would start maximal and pull the learners apart through the gates; one ω_ij each starts apart."""
    torch.manual_seed(0)
    model = build_recipe(deml_run(params, num_scales=1, num_cams=2)).build_model().eval()
    first, second = model.learner_outputs(torch.rand(4, 3, 20, 20))[0]
    assert torch.nn.functional.cosine_similarity(first, second).mean() < 0.9
    entries = {name: resolve_method(params, name)["options"] for name in ("deml", "deml_i1j8", "deml_i1j8_noadv")}
    assert "share_learners" not in entries["deml"] and not DeMLOptions().share_learners
    assert entries["deml_i1j8"]["share_learners"] and entries["deml_i1j8_noadv"]["share_learners"]
