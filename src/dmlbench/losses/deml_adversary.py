"""DeML's diversity constraint between the CA learners of one scale (Chen & Deng 2019, Eq. 4).

Paper (default, ``adversary: grl``): an adversary network F (its own per scale) maps
every learner's embedding; the loss is the discrepancy between the learners' images

    L_adv = λ0 · mean_n Σ_{j<j'} ‖F(CA_j(x_n)) − F(CA_j'(x_n))‖²

(Eq. 4 sums over all ordered pairs j, j', which only doubles the unordered sum; averaged
over the images of the batch). F minimises it; a gradient reversal layer (Ganin et al.
2016) between the learners and F makes the network before it (CAMs, GNet, FNet, learners)
maximise it, i.e. one ``min`` of the total loss plays the max–min game. The learners'
embeddings are L2-normalised before F: the metric loss only sees their directions, and
maximising a distance between unnormalised outputs would be unbounded. Fig. 3(c) of the
paper draws F but the text gives no sizes; ours is Linear(w → h) → ReLU → Linear(h → h).
Caveat: min over F is degenerate — F can map everything to one point and make L_adv 0,
after which the reversed gradient vanishes. Trained on the embedded default it does exactly
that (the term falls from 0.02 to 3e-6 in 10 epochs and the CA learners of an image end at
cosine 0.996, as without L_adv); the authors' README says they replaced the network by the
hinge below to "ease the training".

Authors' code (``adversary: contrastive``): no adversary network; a contrastive hinge
pushes the L2-normalised learners of the same image apart, Caffe's ``ContrastiveLoss`` with
every pair labelled dissimilar, margin 2 (on the Euclidean distance, non-legacy form) and
loss weight 0.2 per learner pair:

    L_adv = λ0 · Σ_{j<j'} 1/(2B) Σ_n max(m − ‖ê_j(x_n) − ê_j'(x_n)‖, 0)².
"""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import Tensor, nn

from .pairwise import safe_sqrt

__all__ = ["AdversaryNetwork", "GradientReversal", "contrastive_hinge_diversity", "grad_reverse"]


class GradientReversal(torch.autograd.Function):
    """Identity forward; the backward pass multiplies the gradient by −``scale``."""

    @staticmethod
    def forward(ctx, x: Tensor, scale: float) -> Tensor:
        ctx.scale = scale
        return x.view_as(x)

    @staticmethod
    def backward(ctx, grad: Tensor) -> tuple[Tensor, None]:
        return -ctx.scale * grad, None


def grad_reverse(x: Tensor, scale: float = 1.0) -> Tensor:
    """Gradient reversal layer: ``x`` forward, ``−scale × gradient`` backward."""
    return GradientReversal.apply(x, scale)


class AdversaryNetwork(nn.Module):
    """The adversary F of one scale, behind a gradient reversal layer.

    Args:
        width: w, the dimensions of one CA learner.
        hidden: h, the width of F's hidden and output layers.

    ``forward(embeddings)``: (J, B, w) raw learner outputs → scalar
    ``mean_n Σ_{j<j'} ‖F(ê_j) − F(ê_j')‖²`` with ê the L2-normalised embeddings, the
    gradient reversed in front of F. Fewer than 2 learners: 0 (with a grad_fn).
    """

    def __init__(self, width: int, hidden: int = 128):
        super().__init__()
        self.net = nn.Sequential(nn.Linear(width, hidden), nn.ReLU(inplace=True), nn.Linear(hidden, hidden))

    def forward(self, embeddings: Tensor) -> Tensor:
        mapped = self.net(grad_reverse(F.normalize(embeddings, dim=-1)))  # (J, B, h)
        return _pair_differences(mapped).pow(2).sum(-1).mean(-1).sum()


def contrastive_hinge_diversity(embeddings: Tensor, margin: float = 2.0) -> Tensor:
    """The authors' code's diversity term: Σ_{j<j'} 1/(2B) Σ_n max(m − ‖ê_j − ê_j'‖, 0)².

    Args:
        embeddings: (J, B, w) raw learner outputs of one scale (L2-normalised here).
        margin: m on the Euclidean distance (2 in the code: antipodal unit vectors).

    Returns:
        Scalar; 0 (with a grad_fn) for fewer than 2 learners.
    """
    distances = safe_sqrt(_pair_differences(F.normalize(embeddings, dim=-1)).pow(2).sum(-1))  # (P, B)
    return 0.5 * F.relu(margin - distances).pow(2).mean(-1).sum()


def _pair_differences(per_learner: Tensor) -> Tensor:
    """(J, B, k) → (P, B, k): ``x[j] − x[j']`` for the P = J(J−1)/2 learner pairs j < j' (P = 0 for J = 1)."""
    first, second = torch.triu_indices(len(per_learner), len(per_learner), offset=1, device=per_learner.device)
    return per_learner[first] - per_learner[second]
