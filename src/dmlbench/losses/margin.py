"""Margin loss with distance-weighted sampling (Wu, Manmatha, Smola & Krähenbühl 2017)."""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import Tensor, nn

from .checks import check_batch, check_labels_in_range, check_positive
from .pairwise import label_masks, pairwise_distances, zero_loss
from .state_keys import rename_state_keys_on_load

__all__ = [
    "DistanceWeightedMarginLoss",
    "distance_weighted_probabilities",
    "sample_distance_weighted_triplets",
]

Triplets = tuple[Tensor, Tensor, Tensor]


def distance_weighted_probabilities(
    distances: Tensor,
    labels: Tensor,
    embedding_dim: int,
    *,
    cutoff: float = 0.5,
    nonzero_loss_cutoff: float = 1.4,
) -> Tensor:
    """Probability of drawing each negative for each anchor.

    Wu et al. (§4) draw a negative n for anchor a with probability
    ``∝ min(λ, q(d)^-1)``, where ``q(d) ∝ d^(n-2) (1 - d^2/4)^((n-3)/2)`` is
    the density of distances between uniform points on the unit sphere in
    R^n. As in the authors' code, λ is realised by clipping the distance
    below at ``cutoff``, and negatives at ``d >= nonzero_loss_cutoff`` (whose
    margin loss is 0) get weight 0. The log-weights
    ``(2 - n) log d - (n - 3)/2 log(1 - d^2/4)`` are normalised per anchor
    with a softmax (log-space, no under/overflow). The authors' code instead
    subtracts one global maximum over the whole matrix before ``exp``, which
    can underflow a whole row to 0 for large n; the normalised result is the
    same whenever theirs is finite.

    Anchors whose negatives all lie beyond ``nonzero_loss_cutoff`` fall back
    to a uniform draw over their negatives (as the authors' code); anchors
    without any negative get a zero row. Same-class entries are always 0.

    Args:
        distances: (B, B) Euclidean distances of L2-normalised embeddings.
        labels: (B,) integer labels.
        embedding_dim: n, the dimension of the embedding space.
        cutoff: lower clip of the distance.
        nonzero_loss_cutoff: distances at or beyond it are never drawn unless
            an anchor has no other negative.

    Returns:
        (B, B) matrix; row a is the distribution over negatives of anchor a.
    """
    _, negative = label_masks(labels)
    clipped = distances.clamp_min(cutoff)
    n = float(embedding_dim)
    one_minus = (1.0 - 0.25 * clipped.pow(2)).clamp_min(0.0)
    log_weights = (2.0 - n) * clipped.log() - 0.5 * (n - 3.0) * one_minus.log()
    candidates = negative & (distances < nonzero_loss_cutoff) & torch.isfinite(log_weights)
    weighted = torch.softmax(log_weights.masked_fill(~candidates, float("-inf")), dim=1)
    uniform = negative.to(distances.dtype) / negative.sum(dim=1, keepdim=True).clamp_min(1)
    return torch.where(candidates.any(dim=1, keepdim=True), weighted, uniform)


def sample_distance_weighted_triplets(
    embeddings: Tensor,
    labels: Tensor,
    *,
    cutoff: float = 0.5,
    nonzero_loss_cutoff: float = 1.4,
    generator: torch.Generator | None = None,
) -> Triplets:
    """Draw one negative per ordered anchor-positive pair.

    Every ordered pair (a, p), a != p, of the same class whose anchor has at
    least one negative is used once (as the authors' code); its negative is
    drawn from :func:`distance_weighted_probabilities` row a, independently
    per pair, with ``torch.multinomial`` (torch's global RNG unless a
    ``generator`` is given). No gradient flows through the sampling.

    Args:
        embeddings: (B, d) L2-normalised embeddings.
        labels: (B,) integer labels.
        cutoff, nonzero_loss_cutoff: see :func:`distance_weighted_probabilities`.
        generator: optional RNG for reproducible draws.

    Returns:
        ``(anchors, positives, negatives)``, three (T,) int64 index tensors.
    """
    with torch.no_grad():
        distances = pairwise_distances(embeddings)
        probabilities = distance_weighted_probabilities(
            distances,
            labels,
            embeddings.shape[1],
            cutoff=cutoff,
            nonzero_loss_cutoff=nonzero_loss_cutoff,
        )
        positive, negative = label_masks(labels)
        anchors, positives = torch.nonzero(positive & negative.any(dim=1, keepdim=True), as_tuple=True)
        if anchors.numel() == 0:
            return anchors, positives, anchors.clone()
        negatives = torch.multinomial(probabilities[anchors], 1, generator=generator).squeeze(1)
    return anchors, positives, negatives


class DistanceWeightedMarginLoss(nn.Module):
    """Margin loss of Wu et al. 2017 on distance-weighted triplets.

    ``forward`` = :meth:`sample` (distance-weighted negatives) +
    :meth:`loss_from_triplets`. For each sampled triplet (a, p, n), with
    β = β_{class(a)} (class-specific) or a single β::

        pos = [α + (D(a, p) - β)]_+      neg = [α - (D(a, n) - β)]_+
        loss = (Σ_triplets (pos + neg) + ν Σ_triplets β) / #(non-zero pos and neg terms)

    with D the Euclidean distance. The normalisation by the number of
    non-zero terms and the ν-term (ν Σβ summed over the triplets' anchors,
    inside the normalisation) follow the authors' code
    (chaoyuaw/incubator-mxnet ``example/gluon/embedding_learning``; the D&C
    code does the same). If no term is non-zero the loss is 0.

    Paper: Wu et al., "Sampling matters in deep embedding learning", ICCV
    2017, eq. for ℓ_margin and §4 (sampling). Defaults: α = 0.2, β = 1.2
    (also D&C §4), learnable class-specific β, ν = 0, cutoff 0.5,
    non-zero-loss cutoff 1.4 (REFERENCE.md). β's learning rate is the
    trainer's business (the authors train β with its own lr).

    Differences found:
        * The released D&C code (CompVis, ``lib/loss/sampler.py``) does *not*
          draw distance-weighted negatives: it takes, for each anchor, the
          K closest negatives with ``d >= cutoff`` (deterministic).
        * pytorch-metric-learning's ``DistanceWeightedMiner`` differs from
          the authors' sampler: it draws random positives with replacement
          instead of using every (a, p) pair, drops anchors whose
          negatives all lie beyond ``nonzero_loss_cutoff`` instead of drawing
          uniformly, and subtracts a global maximum. Hence the sampler is
          written here.
        * pytorch-metric-learning's ``MarginLoss`` computes, for given
          triplets and class-specific β, exactly this loss; until 2026-11 it
          was called for :meth:`loss_from_triplets`, and the loss here keeps
          its operations in their order (the embeddings are normalised once
          more, as two copies, and their distances taken with ``torch.cdist``), so a run gives
          the numbers it gave then (``tests/test_losses.py`` compares the two
          bit for bit when PML is installed). For a *single* learnable β PML
          adds ν β un-normalised; here ν β is summed over the triplets and
          normalised like the class-specific term (the authors' code has no
          single learnable β).

    A batch without any anchor-positive pair whose anchor has a negative
    gives 0 with a grad_fn.

    Args:
        num_classes: number of training classes (one β each if class-specific).
        margin: α > 0.
        beta: initial β > 0.
        learn_beta: β is an ``nn.Parameter`` (else a constant).
        class_specific_beta: one β per class, indexed by the anchor's class.
        nu: ν >= 0, weight of the β regulariser.
        cutoff: lower clip of the sampling distance.
        nonzero_loss_cutoff: negatives at or beyond it are not drawn.
    """

    def __init__(
        self,
        num_classes: int,
        *,
        margin: float = 0.2,
        beta: float = 1.2,
        learn_beta: bool = True,
        class_specific_beta: bool = True,
        nu: float = 0.0,
        cutoff: float = 0.5,
        nonzero_loss_cutoff: float = 1.4,
    ) -> None:
        super().__init__()
        check_positive("margin", margin)
        check_positive("beta", beta)
        check_positive("nu", nu, allow_zero=True)
        check_positive("cutoff", cutoff)
        if nonzero_loss_cutoff <= cutoff:
            raise ValueError(
                f"hyperparameter 'nonzero_loss_cutoff' ({nonzero_loss_cutoff}) must be > 'cutoff' ({cutoff})"
            )
        self.num_classes = num_classes
        self.class_specific_beta = class_specific_beta
        self.margin = margin
        self.nu = nu
        self.cutoff = cutoff
        self.nonzero_loss_cutoff = nonzero_loss_cutoff
        initial_beta = torch.full((num_classes if class_specific_beta else 1,), float(beta))
        self.beta: Tensor
        if learn_beta:
            self.beta = nn.Parameter(initial_beta)
        else:
            self.register_buffer("beta", initial_beta)  # a buffer: saved, and moved by .to(device)
        self.learn_beta = learn_beta
        rename_state_keys_on_load(self, {"pml_loss.beta": "beta"})

    def sample(self, embeddings: Tensor, labels: Tensor, generator: torch.Generator | None = None) -> Triplets:
        """Distance-weighted triplets of the batch; see :func:`sample_distance_weighted_triplets`."""
        return sample_distance_weighted_triplets(
            embeddings,
            labels,
            cutoff=self.cutoff,
            nonzero_loss_cutoff=self.nonzero_loss_cutoff,
            generator=generator,
        )

    def loss_from_triplets(self, embeddings: Tensor, labels: Tensor, triplets: Triplets) -> Tensor:
        """Margin loss of given triplets.

        Args:
            embeddings: (B, d) L2-normalised embeddings.
            labels: (B,) integer labels in 0..num_classes-1.
            triplets: ``(anchors, positives, negatives)`` (T,) index tensors.

        Returns:
            Scalar loss (0 with a grad_fn when T = 0).
        """
        embeddings = check_batch(embeddings, labels)
        if self.class_specific_beta:
            check_labels_in_range(labels, self.num_classes)
        anchors, positives, negatives = triplets
        if anchors.numel() == 0:
            return zero_loss(embeddings)
        beta = self.beta[labels[anchors]] if self.class_specific_beta else self.beta
        # two normalised copies, as PML's distance took them: their gradients add up in its order
        distances = torch.cdist(F.normalize(embeddings, p=2, dim=1), F.normalize(embeddings, p=2, dim=1), p=2)
        positive_term = F.relu(distances[anchors, positives] - beta + self.margin)
        negative_term = F.relu(beta - distances[anchors, negatives] + self.margin)
        active = (positive_term > 0.0).sum() + (negative_term > 0.0).sum()
        divisor = active.clamp_min(1)
        hinge = (positive_term + negative_term).sum() / divisor
        if not (self.learn_beta and self.nu > 0.0):
            return hinge
        regulariser = (beta.expand_as(positive_term) * self.nu).sum() / divisor
        return torch.stack((hinge, regulariser)).sum()

    def forward(self, embeddings: Tensor, labels: Tensor) -> Tensor:
        """Args: embeddings (B, d) L2-normalised, labels (B,). Returns: scalar."""
        embeddings = check_batch(embeddings, labels)
        return self.loss_from_triplets(embeddings, labels, self.sample(embeddings, labels))
