"""ABE's training objective (Kim et al., ECCV 2018, Eq. 8–10): per-learner metric loss + divergence loss.

Eq. 8:  L = Σ_m L_metric,(m) + λ_div · L_div

- ``L_metric,(m)`` (Eq. 10) is the metric loss of learner m's own embedding B_m(x), a slice of
  the ensemble embedding: the contrastive loss ``y·D² + (1 − y)·[m_c − D²]_+`` with margin
  m_c = 1 in the paper. With class-balanced batches every pair of the batch takes part
  (:class:`~dmlbench.losses.ContrastiveLoss`, mean over pairs); with the paper's pair batches
  (:class:`~dmlbench.data.samplers` order ``[a_1 … a_n, b_1 … b_n]``, b_i the sampled partner
  of a_i) only the n designated pairs (a_i, b_i) do, as in the Caffe siamese set-up the paper
  describes (mean over the n pairs, :func:`partner_contrastive`).
- ``L_div`` (Eq. 9) pushes apart the embeddings that two *different* learners give the *same*
  image (a "self pair"): ``Σ_i Σ_{p≠q} [m_div − ‖B_p(x_i) − B_q(x_i)‖²]_+`` with m_div = 1.

Normalisation (the paper's sums run over the whole training set; how its Caffe loss normalises
a batch is not stated). The batch estimate of Eq. 9 is a mean over the batch images of, per
image, the hinge over the M(M − 1) *ordered* learner pairs p ≠ q (the p = q terms are the
constant m_div and carry no gradient, so they are left out), reduced by ``reduction``:

- ``per_learner`` (default): Σ_p mean_{q≠p} — each learner's mean hinge against the others,
  summed over learners, i.e. the ordered-pair sum / (M − 1). It has M terms, like
  Σ_m L_metric,(m), so the ratio λ_div · L_div / Σ_m L_metric,(m) does not grow with M and one
  λ_div means the same balance for every M. For M = 2 it equals ``sum``.
- ``sum``: Σ_{p≠q}, the literal double sum of Eq. 9 (M(M − 1) terms against M metric terms:
  the divergence weighs (M − 1)× more than with ``per_learner``; with λ_div = 1 it swamps the
  metric loss of ABE-8, whose learners then collapse). The repository's earlier behaviour.

Eq. 10's 1/N is read, as for the repository's contrastive loss, as a mean over the pairs of the
batch, so each learner's metric loss does not depend on the batch size either.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Literal, cast

import torch
import torch.nn.functional as F
from torch import Tensor, nn

from .checks import check_batch, check_positive
from .contrastive import ContrastiveLoss
from .pairwise import safe_sqrt

__all__ = ["ABELoss", "DIVERGENCE_REDUCTIONS", "divergence_loss", "partner_contrastive", "split_learners"]

PairMode = Literal["all", "partners"]
DivergenceReduction = Literal["per_learner", "sum"]

#: The reductions of L_div over the ordered learner pairs (see the module docstring).
DIVERGENCE_REDUCTIONS: tuple[str, ...] = ("per_learner", "sum")


def split_learners(embeddings: Tensor, learner_slices: Sequence[tuple[int, int]]) -> Tensor:
    """The learners' embeddings stacked: (B, d) → (M, B, w), all slices of the same width w."""
    widths = {stop - start for start, stop in learner_slices}
    if len(widths) != 1:
        raise ValueError(f"ABE learners must have equal widths, got slices {list(learner_slices)}")
    return torch.stack([embeddings[:, start:stop] for start, stop in learner_slices])


def _check_reduction(reduction: str) -> None:
    if reduction not in DIVERGENCE_REDUCTIONS:
        raise ValueError(f"divergence_reduction must be one of {DIVERGENCE_REDUCTIONS}, got {reduction!r}")


def divergence_loss(learners: Tensor, margin: float = 1.0, reduction: DivergenceReduction = "per_learner") -> Tensor:
    """Eq. 9 on a batch: mean over images of the hinges [margin − ‖e_p − e_q‖²]_+ of the self pairs.

    Args:
        learners: (M, B, w) each learner's (L2-normalised) embedding of the B images.
        margin: m_div > 0, on the squared Euclidean distance.
        reduction: over the M(M − 1) ordered pairs p ≠ q of an image: ``per_learner`` (Σ_p mean_{q≠p},
            = the sum / (M − 1)) or ``sum`` (Σ_{p≠q}, Eq. 9 literally); see the module docstring.

    Returns:
        Scalar; 0 (with a grad_fn) for a single learner.

    Two learners, one image, embeddings (1, 0) and (0.6, 0.8): ‖Δ‖² = 0.16 + 0.64 = 0.8, so each of
    the two ordered pairs contributes 1 − 0.8 = 0.2 (M − 1 = 1: both reductions agree):

    >>> e = torch.tensor([[[1.0, 0.0]], [[0.6, 0.8]]])
    >>> round(divergence_loss(e).item(), 6), round(divergence_loss(e, reduction="sum").item(), 6)
    (0.4, 0.4)
    """
    if learners.ndim != 3:
        raise ValueError(f"learners must have shape (M, B, w), got {tuple(learners.shape)}")
    check_positive("divergence_margin", margin)
    _check_reduction(reduction)
    per_image = learners.transpose(0, 1)  # (B, M, w)
    norms = per_image.pow(2).sum(-1)  # (B, M)
    d2 = (norms.unsqueeze(2) + norms.unsqueeze(1) - 2.0 * per_image @ per_image.transpose(1, 2)).clamp_min(0.0)
    num_learners = learners.shape[0]
    off_diagonal = ~torch.eye(num_learners, dtype=torch.bool, device=learners.device)
    hinge = F.relu(margin - d2) * off_diagonal  # (B, M, M)
    total = hinge.sum(dim=(1, 2)).mean()
    return total / (num_learners - 1) if reduction == "per_learner" and num_learners > 1 else total


def partner_contrastive(embeddings: Tensor, labels: Tensor, margin: float, squared: bool = True) -> Tensor:
    """Contrastive loss of the designated pairs of a pair batch ``[a_1 … a_n, b_1 … b_n]``.

    Pair i is (row i, row n + i); same label → D², else the hinge on the margin (on D² when
    ``squared``, as in ABE Eq. 10; ``[m − D]_+²`` otherwise, Hadsell et al.). Mean over the n pairs.

    Args:
        embeddings: (2n, w) L2-normalised.
        labels: (2n,) int.
        margin: m_c > 0.

    >>> e = torch.tensor([[1.0, 0.0], [1.0, 0.0], [0.0, 1.0], [1.0, 0.0]])
    >>> partner_contrastive(e, torch.tensor([0, 1, 0, 2]), margin=1.0).item()  # D² = 2 (pos), 0 (neg)
    1.5
    """
    embeddings = check_batch(embeddings, labels)
    if embeddings.shape[0] % 2:
        raise ValueError(f"a pair batch has an even number of rows, got {embeddings.shape[0]}")
    n = embeddings.shape[0] // 2
    d2 = (embeddings[:n] - embeddings[n:]).pow(2).sum(1)
    negative = F.relu(margin - d2) if squared else F.relu(margin - safe_sqrt(d2)).pow(2)
    return torch.where(labels[:n] == labels[n:], d2, negative).mean()


class ABELoss(nn.Module):
    """Σ_m metric(B_m) + λ_div · L_div over an ensemble embedding made of learner slices (Eq. 8).

    Args:
        metric: the per-learner metric loss (``methods.<m>.loss``), applied to each learner's slice.
        learner_slices: [start, stop) columns of each of the M learners (equal widths).
        divergence_weight: λ_div ≥ 0 (0 switches L_div off); kept in the attribute of that name, which
            the ABE recipe sets before each batch during a λ_div warm-up (``divergence_warmup_epochs``).
        divergence_margin: m_div > 0.
        divergence_reduction: ``per_learner`` (default; the L_div / metric balance does not depend on
            M) or ``sum`` (Eq. 9's literal double sum); see :func:`divergence_loss`.
        pairs: 'all' pairs of the batch (class-balanced batches) or only the 'partners' of a pair
            batch; 'partners' needs a :class:`~dmlbench.losses.ContrastiveLoss` metric.

    ``forward(embeddings (B, d), labels (B,))`` → scalar; :attr:`last_terms` holds the two terms
    of the last call (detached scalar tensors: ``metric`` = Σ_m L_metric,(m), ``divergence`` = L_div
    before weighting) for logging.
    """

    def __init__(
        self,
        metric: nn.Module,
        learner_slices: Sequence[tuple[int, int]],
        *,
        divergence_weight: float = 1.0,
        divergence_margin: float = 1.0,
        divergence_reduction: DivergenceReduction = "per_learner",
        pairs: PairMode = "all",
    ):
        super().__init__()
        check_positive("divergence_weight", divergence_weight, allow_zero=True)
        check_positive("divergence_margin", divergence_margin)
        if pairs not in ("all", "partners"):
            raise ValueError(f"pairs must be 'all' or 'partners', got {pairs!r}")
        _check_reduction(divergence_reduction)
        if pairs == "partners" and not isinstance(metric, ContrastiveLoss):
            raise ValueError(
                f"the paper's pair batches train a contrastive loss on the sampled pairs, got "
                f"{type(metric).__name__}: use loss name 'contrastive' or class-balanced batches"
            )
        self.metric = metric
        self.learner_slices = [(start, stop) for start, stop in learner_slices]
        self.divergence_weight = divergence_weight
        self.divergence_margin = divergence_margin
        self.divergence_reduction = divergence_reduction
        self.pairs = pairs
        self.last_terms: dict[str, Tensor] = {}

    def _metric(self, learner: Tensor, labels: Tensor) -> Tensor:
        if self.pairs == "partners":
            metric = cast(ContrastiveLoss, self.metric)  # checked in __init__
            return partner_contrastive(learner, labels, metric.margin, metric.squared)
        return self.metric(learner, labels)

    def forward(self, embeddings: Tensor, labels: Tensor) -> Tensor:
        learners = split_learners(check_batch(embeddings, labels), self.learner_slices)
        metric = torch.stack([self._metric(learner, labels) for learner in learners]).sum()
        divergence = divergence_loss(learners, self.divergence_margin, self.divergence_reduction)
        self.last_terms = {"metric": metric.detach(), "divergence": divergence.detach()}
        if self.divergence_weight == 0:
            return metric
        return metric + self.divergence_weight * divergence
