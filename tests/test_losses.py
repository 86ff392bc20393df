"""Tests of dmlbench.losses: every loss against a value computed by hand.

The hand values use unit vectors in 2-D at chosen angles, for which
D^2 = 2 - 2 cos(Δθ) and cos similarities are known; the arithmetic is spelled
out with ``math`` and never calls the implementation's helpers.
"""

from __future__ import annotations

import math

import pytest
import torch
import torch.nn.functional as F
from pytorch_metric_learning.losses import ProxyNCALoss as PMLProxyNCALoss

from dmlbench.losses import (
    LOSS_NAMES,
    BinomialDevianceLoss,
    ContrastiveLoss,
    DistanceWeightedMarginLoss,
    NormalizedSoftmaxLoss,
    ProxyNCALoss,
    SemiHardTripletLoss,
    build_loss,
    distance_weighted_probabilities,
    loss_defaults,
    sample_distance_weighted_triplets,
    semihard_negative_distances,
    smoothed_cross_entropy,
)

ATOL = 1e-6


def unit(*degrees: float) -> torch.Tensor:
    """(B, 2) float64 unit vectors at the given angles, requiring grad."""
    rad = torch.tensor(degrees, dtype=torch.float64) * math.pi / 180
    return torch.stack([rad.cos(), rad.sin()], dim=1).requires_grad_()


def labels(*values: int) -> torch.Tensor:
    return torch.tensor(values, dtype=torch.int64)


def chord2(angle: float) -> float:
    """Squared distance of two unit vectors ``angle`` degrees apart."""
    return 2 - 2 * math.cos(math.radians(angle))


def chord(angle: float) -> float:
    return math.sqrt(chord2(angle))


def close(value: torch.Tensor, expected: float) -> bool:
    return torch.allclose(value, torch.tensor(expected, dtype=value.dtype), atol=ATOL, rtol=0)


def build(name: str, num_classes: int = 4, embedding_dim: int = 2, **hyper) -> torch.nn.Module:
    return build_loss({"name": name, **hyper}, num_classes, embedding_dim)


# --------------------------------------------------------------------------- contrastive

# 0°, 60° (class 0), 90°, 180° (class 1). Pairs i<j and their D^2:
# (0,1)+ 1 | (0,2)- 2 | (0,3)- 4 | (1,2)- 2-√3 (30°) | (1,3)- 3 | (2,3)+ 2
FOUR = (0.0, 60.0, 90.0, 180.0)
FOUR_LABELS = (0, 0, 1, 1)


def test_contrastive_squared_margin_by_hand():
    loss = ContrastiveLoss(margin=1.0)(unit(*FOUR), labels(*FOUR_LABELS))
    positives = 1 + 2
    negatives = 0 + 0 + (1 - (2 - math.sqrt(3))) + 0  # only the 30° pair is inside the margin
    assert close(loss, (positives + negatives) / 6)


def test_contrastive_larger_margin_by_hand():
    loss = ContrastiveLoss(margin=2.5)(unit(*FOUR), labels(*FOUR_LABELS))
    negatives = (2.5 - 2) + 0 + (2.5 - (2 - math.sqrt(3))) + 0
    assert close(loss, (1 + 2 + negatives) / 6)


def test_contrastive_hadsell_form_by_hand():
    loss = ContrastiveLoss(margin=1.0, squared=False)(unit(*FOUR), labels(*FOUR_LABELS))
    d_30 = math.sqrt(2 - math.sqrt(3))
    assert close(loss, (1 + 2 + (1 - d_30) ** 2) / 6)


def test_contrastive_without_positive_pair_is_the_negative_term():
    loss = ContrastiveLoss()(unit(0.0, 30.0), labels(0, 1))
    assert close(loss, 1 - (2 - math.sqrt(3)))


# --------------------------------------------------------------------------- triplet

# Case with semi-hard negatives: 0°, 40° (class 0), 20°, 60° (class 1), 110° (class 2).
SEMI = (0.0, 40.0, 20.0, 60.0, 110.0)
SEMI_LABELS = (0, 0, 1, 1, 2)
# Positive pair -> (angle a-p, angle a-chosen negative):
#   (0,1): negatives at 20° (inside), 60°, 110° (outside)  -> 60°
#   (1,0): negatives at 20°, 20° (inside), 70° (outside)   -> 70°
#   (2,3): negatives at 20°, 20° (inside), 90° (outside)   -> 90°
#   (3,2): negatives at 60°, 20°, 50°; outside: 60°, 50°   -> 50°
SEMI_CHOICES = {(0, 1): 60.0, (1, 0): 70.0, (2, 3): 90.0, (3, 2): 50.0}


def test_semihard_negative_selection():
    x = unit(*SEMI).detach()
    distances = torch.cdist(x, x)
    d_an = semihard_negative_distances(distances, labels(*SEMI_LABELS))
    for (a, p), angle in SEMI_CHOICES.items():
        assert close(d_an[a, p], chord(angle))


def test_triplet_semihard_squared_by_hand():
    loss = SemiHardTripletLoss(margin=1.0)(unit(*SEMI), labels(*SEMI_LABELS))
    hinges = [max(chord2(40.0) - chord2(neg) + 1.0, 0.0) for neg in SEMI_CHOICES.values()]
    assert sum(h > 0 for h in hinges) == 3  # the (2,3) triplet satisfies the margin
    assert close(loss, sum(hinges) / 4)


def test_triplet_semihard_euclidean_by_hand():
    loss = SemiHardTripletLoss(margin=0.2, squared=False)(unit(*SEMI), labels(*SEMI_LABELS))
    hinges = [max(chord(40.0) - chord(neg) + 0.2, 0.0) for neg in SEMI_CHOICES.values()]
    assert close(loss, sum(hinges) / 4)


def test_triplet_fallback_to_largest_inside_negative():
    # 0°, 90° (class 0); 30° (class 1); 45° (class 2): every negative is closer
    # than the positive (90°), so the farthest negative is used:
    # anchor 0: negatives at 30°, 45° -> 45°;  anchor 1: at 60°, 45° -> 60°.
    x, y = unit(0.0, 90.0, 30.0, 45.0), labels(0, 0, 1, 2)
    squared = SemiHardTripletLoss(margin=0.2)(x, y)
    assert close(squared, ((chord2(90) - chord2(45) + 0.2) + (chord2(90) - chord2(60) + 0.2)) / 2)
    plain = SemiHardTripletLoss(margin=0.2, squared=False)(x, y)
    assert close(plain, ((chord(90) - chord(45) + 0.2) + (chord(90) - chord(60) + 0.2)) / 2)


def brute_force_semihard(x: torch.Tensor, y: list[int], margin: float) -> float:
    """Loop transcription of TF's triplet_semihard_loss (squared distances)."""
    d = [[float(((x[i] - x[j]) ** 2).sum()) for j in range(len(y))] for i in range(len(y))]
    losses = []
    for a in range(len(y)):
        negatives = [d[a][n] for n in range(len(y)) if y[n] != y[a]]
        for p in range(len(y)):
            if p == a or y[p] != y[a] or not negatives:
                continue
            outside = [v for v in negatives if v > d[a][p]]
            d_an = min(outside) if outside else max(negatives)
            losses.append(max(d[a][p] - d_an + margin, 0.0))
    return sum(losses) / len(losses)


def test_triplet_matches_loop_reference_on_random_batch():
    gen = torch.Generator().manual_seed(0)
    x = F.normalize(torch.randn(12, 5, generator=gen, dtype=torch.float64), dim=1)
    y = [0, 0, 0, 1, 1, 1, 2, 2, 3, 3, 3, 4]
    loss = SemiHardTripletLoss(margin=0.5)(x, torch.tensor(y))
    assert close(loss, brute_force_semihard(x, y, 0.5))


# --------------------------------------------------------------------------- binomial


def test_binomial_by_hand():
    loss = BinomialDevianceLoss(alpha=2.0, beta=0.5, neg_weight=25.0)(unit(*FOUR), labels(*FOUR_LABELS))
    # cosines: positives (0,1) 0.5, (2,3) 0; negatives (0,2) 0, (0,3) -1, (1,2) √3/2, (1,3) -0.5
    positive = (math.log1p(math.exp(-2 * (0.5 - 0.5))) + math.log1p(math.exp(-2 * (0.0 - 0.5)))) / 2
    negative_cos = [0.0, -1.0, math.sqrt(3) / 2, -0.5]
    negative = sum(math.log1p(math.exp(2 * (s - 0.5) * 25)) for s in negative_cos) / 4
    assert close(loss, positive + negative)


def test_binomial_penalises_similar_negatives_more_than_dissimilar_ones():
    loss = BinomialDevianceLoss()
    near, far = loss(unit(0.0, 10.0), labels(0, 1)), loss(unit(0.0, 170.0), labels(0, 1))
    assert near > 10 * far
    assert close(near, math.log1p(math.exp(2 * (math.cos(math.radians(10)) - 0.5) * 25)))


# --------------------------------------------------------------------------- margin (loss)


def test_margin_loss_from_fixed_triplets_by_hand():
    loss_fn = DistanceWeightedMarginLoss(num_classes=2, margin=0.2, nu=0.1)
    with torch.no_grad():
        loss_fn.beta.copy_(torch.tensor([1.1, 0.9]))
    x, y = unit(*FOUR), labels(*FOUR_LABELS)
    triplets = (labels(0, 1, 2, 3), labels(1, 0, 3, 2), labels(2, 3, 1, 0))
    loss = loss_fn.loss_from_triplets(x, y, triplets)
    # (a,p,n) -> D(a,p), D(a,n), β of the anchor's class
    rows = [
        (1.0, math.sqrt(2), 1.1),
        (1.0, math.sqrt(3), 1.1),
        (math.sqrt(2), chord(30), 0.9),
        (math.sqrt(2), 2.0, 0.9),
    ]
    pos = [max(0.2 + d_ap - b, 0.0) for d_ap, _, b in rows]
    neg = [max(0.2 - (d_an - b), 0.0) for _, d_an, b in rows]
    active = sum(v > 0 for v in pos + neg)
    assert active == 5
    assert close(loss, (sum(pos) + sum(neg) + 0.1 * (1.1 + 1.1 + 0.9 + 0.9)) / active)
    loss.backward()
    assert loss_fn.beta.grad is not None and torch.all(loss_fn.beta.grad != 0)
    assert x.grad is not None and torch.isfinite(x.grad).all()


def test_margin_loss_single_constant_beta_by_hand():
    loss_fn = build("margin", num_classes=2, beta=1.1, learn_beta=False, class_specific_beta=False)
    assert list(loss_fn.parameters()) == []
    assert list(loss_fn.state_dict()) == ["beta"]  # a buffer: saved, moved by .to()
    x, y = unit(*FOUR), labels(*FOUR_LABELS)
    loss = loss_fn.loss_from_triplets(x, y, (labels(2), labels(3), labels(1)))
    pos, neg = 0.2 + math.sqrt(2) - 1.1, 0.2 - (chord(30) - 1.1)
    assert close(loss, (pos + neg) / 2)


def test_margin_loss_single_learnable_beta_normalises_its_nu_term_like_the_class_specific_one():
    loss_fn = build("margin", num_classes=2, beta=1.1, nu=0.5, class_specific_beta=False)
    x, y = unit(*FOUR), labels(*FOUR_LABELS)
    loss = loss_fn.loss_from_triplets(x, y, (labels(2, 0), labels(3, 1), labels(1, 2)))
    # (a, p, n) = (90°, 180°, 60°): D(a,p) = √2, D(a,n) = chord(30); (0°, 60°, 90°): D(a,p) = 1, D(a,n) = √2
    terms = [0.2 + math.sqrt(2) - 1.1, 0.2 - (chord(30) - 1.1), 0.2 + 1.0 - 1.1, 0.2 - (math.sqrt(2) - 1.1)]
    active = [t for t in terms if t > 0]
    assert len(active) == 3  # the last negative lies beyond β + α
    assert close(loss, (sum(active) + 0.5 * 2 * 1.1) / 3)


def test_margin_loss_without_an_active_term_is_zero_with_zero_gradients():
    loss_fn = build("margin", num_classes=2, beta=1.1, margin=0.01)
    x, y = unit(0.0, 0.0, 180.0, 180.0), labels(0, 0, 1, 1)  # positives at 0 (< β - α), negatives at 2 (> β + α)
    loss = loss_fn.loss_from_triplets(x, y, (labels(0), labels(1), labels(2)))
    loss.backward()
    assert loss.item() == 0.0
    assert x.grad is not None and torch.all(x.grad == 0) and torch.all(loss_fn.beta.grad == 0)


def test_margin_loss_from_triplets_is_permutation_invariant():
    loss_fn = DistanceWeightedMarginLoss(num_classes=2)
    x, y = unit(*FOUR), labels(*FOUR_LABELS)
    triplets = (labels(0, 1, 2, 3), labels(1, 0, 3, 2), labels(2, 3, 1, 0))
    perm = torch.tensor([2, 0, 3, 1])
    new_position = torch.argsort(perm)  # old index -> new index
    permuted = tuple(new_position[t] for t in triplets)
    expected = loss_fn.loss_from_triplets(x, y, triplets).item()
    assert close(loss_fn.loss_from_triplets(x[perm], y[perm], permuted), expected)


# --------------------------------------------------------------------------- margin (sampler)


def test_distance_weighted_probabilities_follow_the_formula():
    n = 16
    # anchor 0: same class 1 (0.7); negatives 2..5 at 0.3 (clipped to 0.5), 0.8, 1.2, 1.5 (beyond 1.4)
    row = [0.0, 0.7, 0.3, 0.8, 1.2, 1.5]
    distances = torch.zeros(6, 6, dtype=torch.float64)
    distances[0] = distances[:, 0] = torch.tensor(row, dtype=torch.float64)
    y = labels(0, 0, 1, 1, 2, 3)
    probabilities = distance_weighted_probabilities(distances, y, n, cutoff=0.5, nonzero_loss_cutoff=1.4)

    def inverse_density(d: float) -> float:
        return d ** (2 - n) * (1 - d * d / 4) ** (-(n - 3) / 2)

    weights = [0.0, 0.0, inverse_density(0.5), inverse_density(0.8), inverse_density(1.2), 0.0]
    expected = torch.tensor([w / sum(weights) for w in weights], dtype=torch.float64)
    assert torch.allclose(probabilities[0], expected, atol=ATOL, rtol=0)
    assert torch.allclose(probabilities.sum(dim=1), torch.ones(6, dtype=torch.float64))
    same_class = y.unsqueeze(0) == y.unsqueeze(1)
    assert torch.all(probabilities[same_class] == 0)


def test_distance_weighted_probabilities_fall_back_to_uniform():
    # all negatives of anchor 0 lie beyond the non-zero-loss cutoff
    distances = torch.full((4, 4), 1.9, dtype=torch.float64).fill_diagonal_(0.0)
    probabilities = distance_weighted_probabilities(distances, labels(0, 0, 1, 2), 8)
    assert torch.allclose(probabilities[0], torch.tensor([0, 0, 0.5, 0.5], dtype=torch.float64))
    # an anchor without any negative gets an all-zero row
    one_class = distance_weighted_probabilities(distances[:2, :2], labels(3, 3), 8)
    assert torch.all(one_class == 0)


def test_sampler_never_draws_own_class_nor_far_negatives():
    # class 0 at 0°, 10°; near negatives (class 1) at 40°, 60°; far negatives
    # (class 2) at 150°, 180° (D > 1.4 from every class-0 point)
    x, y = unit(0.0, 10.0, 40.0, 60.0, 150.0, 180.0).detach(), labels(0, 0, 1, 1, 2, 2)
    gen = torch.Generator().manual_seed(0)
    anchors, positives, negatives = [], [], []
    for _ in range(100):
        a, p, n = sample_distance_weighted_triplets(x, y, generator=gen)
        anchors.append(a), positives.append(p), negatives.append(n)
    a, p, n = torch.cat(anchors), torch.cat(positives), torch.cat(negatives)
    assert torch.all(y[a] == y[p]) and torch.all(a != p)
    assert torch.all(y[a] != y[n])
    class0 = y[a] == 0
    assert set(n[class0].tolist()) == {2, 3}  # both near negatives drawn, far ones never


def test_sampler_uses_every_positive_pair_once_and_is_reproducible():
    gen_x = torch.Generator().manual_seed(1)
    x = F.normalize(torch.randn(12, 8, generator=gen_x), dim=1)
    y = torch.arange(12) % 4
    a, p, n = sample_distance_weighted_triplets(x, y, generator=torch.Generator().manual_seed(5))
    assert len(a) == 12 * 2  # 4 classes x 3 images: 3*2 ordered pairs each
    assert len({(int(i), int(j)) for i, j in zip(a, p)}) == len(a)
    again = sample_distance_weighted_triplets(x, y, generator=torch.Generator().manual_seed(5))
    assert all(torch.equal(u, v) for u, v in zip((a, p, n), again))
    loss_fn = DistanceWeightedMarginLoss(num_classes=4)
    torch.manual_seed(3)
    first = loss_fn(x, y)
    torch.manual_seed(3)
    assert torch.equal(first, loss_fn(x, y))


# --------------------------------------------------------------------------- proxy-NCA

PROXY_ANGLES = (0.0, 90.0, 180.0)  # proxies of classes 0, 1, 2
PROXY_X, PROXY_Y = (0.0, 90.0, 45.0), (0, 2, 1)


def proxy_nca_with_proxies(**kwargs) -> ProxyNCALoss:
    loss_fn = ProxyNCALoss(num_classes=3, embedding_dim=2, **kwargs)
    with torch.no_grad():
        loss_fn.proxies.copy_(2.0 * unit(*PROXY_ANGLES))  # norm 2: the loss normalises
    return loss_fn


def test_proxy_nca_excludes_positive_from_denominator_by_hand():
    loss = proxy_nca_with_proxies(scale=3.0)(unit(*PROXY_X), labels(*PROXY_Y))
    s2 = 9.0  # d = s^2 * (2 - 2 cos)
    per_sample = [
        0.0 + math.log(math.exp(-s2 * 2) + math.exp(-s2 * 4)),  # x at 0°, class 0
        s2 * 2 + math.log(math.exp(-s2 * 2) + math.exp(0.0)),  # x at 90°, class 2 (proxy at 180°)
        s2 * chord2(45) + math.log(math.exp(-s2 * chord2(45)) + math.exp(-s2 * chord2(135))),
    ]
    assert close(loss, sum(per_sample) / 3)


def test_pml_proxy_nca_includes_the_positive_and_scales_distances():
    """Documents the difference: PML = softmax over all proxies, softmax_scale on d."""
    ours = proxy_nca_with_proxies(scale=1.0)
    pml = PMLProxyNCALoss(num_classes=3, embedding_size=2, softmax_scale=1.0)
    with torch.no_grad():
        pml.proxies.copy_(ours.proxies)
    x, y = unit(*PROXY_X), labels(*PROXY_Y)
    d = [[chord2(abs(a - p)) for p in PROXY_ANGLES] for a in PROXY_X]
    included = sum(d[i][c] + math.log(sum(math.exp(-v) for v in d[i])) for i, c in enumerate(PROXY_Y)) / 3
    excluded = (
        sum(d[i][c] + math.log(sum(math.exp(-v) for j, v in enumerate(d[i]) if j != c)) for i, c in enumerate(PROXY_Y))
        / 3
    )
    assert close(pml(x, y), included)
    assert close(ours(x, y), excluded)


def test_proxy_nca_init_and_gradients():
    loss_fn = ProxyNCALoss(num_classes=5, embedding_dim=8)
    assert torch.allclose(loss_fn.proxies.norm(dim=1), torch.ones(5))
    x = F.normalize(torch.randn(6, 8), dim=1).requires_grad_()
    loss_fn(x, torch.tensor([0, 1, 2, 3, 4, 0])).backward()
    assert loss_fn.proxies.grad is not None and loss_fn.proxies.grad.abs().sum() > 0
    with pytest.raises(ValueError, match="at least 2 classes"):
        ProxyNCALoss(num_classes=1, embedding_dim=8)


# --------------------------------------------------------------------------- normalised softmax / CE


def test_smoothed_cross_entropy_by_hand():
    logits = torch.tensor([[1.0, 2.0, 3.0], [0.0, 0.0, 5.0]], dtype=torch.float64)
    y, eps = labels(0, 2), 0.2
    total = 0.0
    for row, target in zip(logits.tolist(), (0, 2)):
        log_z = math.log(sum(math.exp(v) for v in row))
        nll = [log_z - v for v in row]  # -log p_c
        total += (1 - eps) * nll[target] + eps * sum(nll) / 3
    assert close(smoothed_cross_entropy(logits, y, eps), total / 2)
    plain = sum(math.log(sum(math.exp(v) for v in r)) - r[t] for r, t in zip(logits.tolist(), (0, 2))) / 2
    assert close(smoothed_cross_entropy(logits, y, 0.0), plain)
    with pytest.raises(ValueError, match="label_smoothing"):
        smoothed_cross_entropy(logits, y, 1.0)


def norm_softmax_with_weights(**kwargs) -> NormalizedSoftmaxLoss:
    loss_fn = NormalizedSoftmaxLoss(num_classes=3, embedding_dim=2, **kwargs)
    # class directions 0°, 90°, 180° with norms 2, 0.5, 3: the loss normalises them
    w = unit(0.0, 90.0, 180.0).detach() * torch.tensor([[2.0], [0.5], [3.0]], dtype=torch.float64)
    with torch.no_grad():
        loss_fn.weight.copy_(w.T)
    return loss_fn


def norm_softmax_by_hand(temperature: float, eps: float) -> float:
    # embeddings at 0° (class 0), 45° (class 1), 120° (class 2)
    cosines = [[1.0, 0.0, -1.0], [math.sqrt(0.5), math.sqrt(0.5), -math.sqrt(0.5)], [-0.5, math.sqrt(3) / 2, 0.5]]
    total = 0.0
    for target, row in enumerate(cosines):
        logits = [c / temperature for c in row]
        log_z = math.log(sum(math.exp(v) for v in logits))
        nll = [log_z - v for v in logits]
        total += (1 - eps) * nll[target] + eps * sum(nll) / 3
    return total / 3


@pytest.mark.parametrize("eps", [0.0, 0.1])
def test_norm_softmax_by_hand(eps: float):
    loss = norm_softmax_with_weights(temperature=0.5, label_smoothing=eps)(unit(0.0, 45.0, 120.0), labels(0, 1, 2))
    assert close(loss, norm_softmax_by_hand(0.5, eps))


def test_norm_softmax_default_temperature_and_weight_gradient():
    loss_fn = norm_softmax_with_weights()
    loss = loss_fn(unit(0.0, 45.0, 120.0), labels(0, 1, 2))
    assert close(loss, norm_softmax_by_hand(0.05, 0.0))
    loss.backward()
    assert loss_fn.weight.grad is not None and loss_fn.weight.grad.abs().sum() > 0


def test_norm_softmax_keeps_float32_weights_under_half_inputs():
    loss_fn = NormalizedSoftmaxLoss(num_classes=3, embedding_dim=4)
    x = F.normalize(torch.randn(5, 4), dim=1).half()
    loss = loss_fn(x, torch.tensor([0, 1, 2, 0, 1]))
    assert loss.dtype == torch.float32 and loss_fn.weight.dtype == torch.float32


# --------------------------------------------------------------------------- all losses

ALL = pytest.mark.parametrize("name", LOSS_NAMES)
DETERMINISTIC = [n for n in LOSS_NAMES if n != "margin"]


def random_batch(seed: int = 0, batch: int = 12, dim: int = 8) -> tuple[torch.Tensor, torch.Tensor]:
    gen = torch.Generator().manual_seed(seed)
    x = F.normalize(torch.randn(batch, dim, generator=gen, dtype=torch.float64), dim=1)
    return x.requires_grad_(), torch.arange(batch) % 4


@ALL
def test_gradient_reaches_embeddings_and_is_finite(name: str):
    x, y = random_batch()
    loss = build(name, embedding_dim=8)(x, y)
    assert loss.ndim == 0 and torch.isfinite(loss)
    loss.backward()
    assert x.grad is not None and torch.isfinite(x.grad).all() and x.grad.abs().sum() > 0


@pytest.mark.parametrize("name", DETERMINISTIC)
def test_batch_permutation_leaves_loss_unchanged(name: str):
    torch.manual_seed(0)
    loss_fn = build(name, embedding_dim=8)
    x, y = random_batch()
    perm = torch.randperm(len(y))
    assert close(loss_fn(x[perm], y[perm]), loss_fn(x, y).item())


@pytest.mark.parametrize("name", ["triplet", "margin"])
def test_no_positive_pair_gives_zero_with_grad_fn(name: str):
    loss = build(name)(unit(0.0, 90.0, 180.0), labels(0, 1, 2))
    assert loss.item() == 0.0 and loss.grad_fn is not None


@pytest.mark.parametrize("name", ["contrastive", "binomial", "triplet", "margin"])
def test_single_sample_gives_zero_with_grad_fn(name: str):
    x = unit(30.0)
    loss = build(name)(x, labels(1))
    assert loss.item() == 0.0 and loss.grad_fn is not None
    loss.backward()
    assert torch.all(x.grad == 0)


@pytest.mark.parametrize(
    "hyper", [{"name": "triplet", "squared": False}, {"name": "contrastive", "squared": False}, {"name": "margin"}]
)
def test_duplicate_embeddings_give_finite_gradients(hyper: dict):
    x = unit(0.0, 0.0, 0.0, 90.0)
    loss = build_loss(hyper, 4, 2)(x, labels(0, 0, 1, 1))
    loss.backward()
    assert torch.isfinite(x.grad).all()


@ALL
def test_shape_mismatches_raise(name: str):
    loss_fn = build(name, embedding_dim=8)
    x, y = random_batch()
    with pytest.raises(ValueError, match="mismatch"):
        loss_fn(x, y[:-1])
    with pytest.raises(ValueError, match=r"\(B, d\)"):
        loss_fn(x[0], y[:1])
    with pytest.raises(ValueError, match="integer"):
        loss_fn(x, y.double())


@pytest.mark.parametrize("name", ["proxy_nca", "norm_softmax", "margin"])
def test_labels_out_of_range_raise(name: str):
    x, _ = random_batch()
    with pytest.raises(ValueError, match=r"\[0, 3\]"):
        build(name, num_classes=4, embedding_dim=8)(x, torch.arange(12) % 5)


# --------------------------------------------------------------------------- registry


def test_registry_names_and_defaults():
    assert LOSS_NAMES == ("contrastive", "triplet", "margin", "binomial", "proxy_nca", "norm_softmax")
    assert loss_defaults("contrastive") == {"margin": 1.0, "squared": True}
    assert loss_defaults("triplet") == {"margin": 0.2, "squared": True}
    assert loss_defaults("binomial") == {"alpha": 2.0, "beta": 0.5, "neg_weight": 25.0}
    assert loss_defaults("proxy_nca") == {"scale": 3.0}
    assert loss_defaults("norm_softmax") == {"temperature": 0.05, "label_smoothing": 0.0}
    assert loss_defaults("margin") == {
        "margin": 0.2,
        "beta": 1.2,
        "learn_beta": True,
        "class_specific_beta": True,
        "nu": 0.0,
        "cutoff": 0.5,
        "nonzero_loss_cutoff": 1.4,
    }


def test_registry_builds_with_parameters_and_coerces_ints():
    margin = build("margin", num_classes=7)
    assert [p.shape for p in margin.parameters()] == [torch.Size([7])]
    assert torch.allclose(margin.beta, torch.full((7,), 1.2))
    assert [p.shape for p in build("proxy_nca", num_classes=7, embedding_dim=5).parameters()] == [torch.Size([7, 5])]
    assert [p.shape for p in build("norm_softmax", num_classes=7, embedding_dim=5).parameters()] == [torch.Size([5, 7])]
    assert list(build("contrastive").parameters()) == []
    assert build("contrastive", margin=2).margin == 2.0


@pytest.mark.parametrize(
    ("config", "pattern"),
    [
        ({"margin": 0.2}, r"missing the key 'name'.*contrastive"),
        ({"name": "lifted"}, r"unknown loss name 'lifted'; known: \['binomial', 'contrastive'.*'pml:<LossClass>'"),
        ({"name": "triplet", "alpha": 0.2}, r"'alpha'.*allowed: margin, squared"),
        ({"name": "triplet", "margin": "0.2"}, r"'margin' must be a float"),
        ({"name": "binomial", "alpha": True}, r"'alpha' must be a float"),
        ({"name": "contrastive", "squared": 1}, r"'squared' must be a bool"),
        ({"name": "triplet", "margin": -0.1}, r"'margin' must be > 0"),
        ({"name": "norm_softmax", "label_smoothing": 1.5}, r"'label_smoothing' must be in \[0, 1\)"),
        ({"name": "margin", "nonzero_loss_cutoff": 0.4}, r"'nonzero_loss_cutoff'"),
    ],
)
def test_registry_errors_name_the_key(config: dict, pattern: str):
    with pytest.raises(ValueError, match=pattern):
        build_loss(config, 4, 8)


# --------------------------------------------------------------------------- margin and norm_softmax vs PML


def _random_batch(seed: int, batch: int, dim: int, classes: int) -> tuple[torch.Tensor, torch.Tensor]:
    generator = torch.Generator().manual_seed(seed)
    embeddings = F.normalize(torch.randn(batch, dim, generator=generator), dim=1).requires_grad_()
    return embeddings, torch.randint(0, classes, (batch,), generator=generator)


@pytest.mark.parametrize("seed", range(4))
@pytest.mark.parametrize(
    "beta_options",
    [
        {"learn_beta": True, "class_specific_beta": True, "nu": 0.0},
        {"learn_beta": True, "class_specific_beta": True, "nu": 0.1},
        {"learn_beta": False, "class_specific_beta": True, "nu": 0.0},
        {"learn_beta": False, "class_specific_beta": False, "nu": 0.0},
    ],
)
def test_margin_loss_matches_pml_bit_for_bit(seed: int, beta_options: dict) -> None:
    """The loss once called PML's MarginLoss: its value and gradients are the same to the bit (32 rows: cdist's GEMM path)."""
    from pytorch_metric_learning.losses import MarginLoss

    x, y = _random_batch(seed, 32 + seed, 16 + 8 * seed, 6)
    ours = DistanceWeightedMarginLoss(num_classes=6, **beta_options)
    class_specific = beta_options["class_specific_beta"]
    theirs = MarginLoss(
        margin=0.2,
        nu=beta_options["nu"],
        beta=1.2,
        learn_beta=beta_options["learn_beta"],
        num_classes=6 if class_specific else None,
    )
    triplets = ours.sample(x.detach(), y, generator=torch.Generator().manual_seed(seed))
    ours_loss, theirs_loss = ours.loss_from_triplets(x, y, triplets), theirs(x, y, indices_tuple=triplets)
    ours_grads = torch.autograd.grad(ours_loss, [x, *ours.parameters()])
    theirs_grads = torch.autograd.grad(theirs_loss, [x, *theirs.parameters()])
    assert torch.equal(ours_loss, theirs_loss)
    assert all(torch.equal(a, b) for a, b in zip(ours_grads, theirs_grads, strict=True))


@pytest.mark.parametrize("seed", range(4))
def test_norm_softmax_matches_pml_bit_for_bit(seed: int) -> None:
    """The loss once wrapped PML's NormalizedSoftmaxLoss: same initial weights from the same seed, same loss and
    gradients to the bit."""
    from pytorch_metric_learning.losses import NormalizedSoftmaxLoss as PMLNormalizedSoftmaxLoss

    x, y = _random_batch(seed, 24 + seed, 16 + 8 * seed, 7)
    torch.manual_seed(seed)
    ours = NormalizedSoftmaxLoss(7, x.shape[1])
    torch.manual_seed(seed)
    theirs = PMLNormalizedSoftmaxLoss(7, x.shape[1])
    assert torch.equal(ours.weight, theirs.W)
    ours_loss, theirs_loss = ours(x, y), theirs(x, y)
    assert torch.equal(ours_loss, theirs_loss)
    ours_grads = torch.autograd.grad(ours_loss, [x, ours.weight])
    theirs_grads = torch.autograd.grad(theirs_loss, [x, theirs.W])
    assert all(torch.equal(a, b) for a, b in zip(ours_grads, theirs_grads, strict=True))


@pytest.mark.parametrize(
    ("loss_name", "old_key", "new_key", "shape"),
    [("margin", "pml_loss.beta", "beta", (4,)), ("norm_softmax", "pml_loss.W", "weight", (2, 4))],
)
def test_a_state_saved_under_the_pml_wrapper_keys_loads(loss_name: str, old_key: str, new_key: str, shape) -> None:
    """A resume checkpoint written while the loss wrapped PML names its parameter ``pml_loss.<name>``."""
    loss_fn = build(loss_name)
    saved = torch.arange(math.prod(shape), dtype=torch.float32).reshape(shape)
    loss_fn.load_state_dict({old_key: saved})
    assert torch.equal(loss_fn.state_dict()[new_key], saved)
