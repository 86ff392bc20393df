"""Baseline deep-metric-learning losses.

Every loss is an ``nn.Module`` with ``forward(embeddings (B, d), labels (B,))
-> scalar``, taking L2-normalised embeddings and contiguous integer labels.
Build them from a config with :func:`build_loss`.

Batches without a valid tuple (e.g. no anchor-positive pair for the triplet
and margin losses, a single sample for the pair losses) give a zero loss that
still has a ``grad_fn`` (``0 * embeddings.sum()``); malformed batches (shape
or dtype mismatch) raise ``ValueError``. Each loss's docstring names its
paper, the authors' code differences and how pytorch-metric-learning compares.
"""

from .binomial import BinomialDevianceLoss
from .contrastive import ContrastiveLoss
from .cross_entropy import smoothed_cross_entropy
from .margin import (
    DistanceWeightedMarginLoss,
    distance_weighted_probabilities,
    sample_distance_weighted_triplets,
)
from .norm_softmax import NormalizedSoftmaxLoss
from .proxy_nca import ProxyNCALoss
from .registry import LOSS_NAMES, build_loss, loss_defaults
from .triplet import SemiHardTripletLoss, semihard_negative_distances

__all__ = [
    "LOSS_NAMES",
    "BinomialDevianceLoss",
    "ContrastiveLoss",
    "DistanceWeightedMarginLoss",
    "NormalizedSoftmaxLoss",
    "ProxyNCALoss",
    "SemiHardTripletLoss",
    "build_loss",
    "distance_weighted_probabilities",
    "loss_defaults",
    "sample_distance_weighted_triplets",
    "semihard_negative_distances",
    "smoothed_cross_entropy",
]
