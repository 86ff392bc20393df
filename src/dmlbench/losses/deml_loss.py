"""DeML's training objective (Chen & Deng 2019, Eq. 4–6): metric + adversary + activation decay.

    L = L_metric + L_adv + L_act,   L_act = L_decay + L_ntri

- L_metric (Eq. 5): the metric loss of ``methods.<name>.loss`` (binomial deviance on cosine
  similarity, α = 2, β = 0.5, C_neg = 35, each pair weighted by 1 / #positive resp.
  #negative pairs: :class:`~dmlbench.losses.binomial.BinomialDevianceLoss`) on every CA
  learner's own embedding, averaged over the I·J learners (the paper's 1 / IJ; the authors'
  code divides by J within a scale and sums the scales).
- L_adv (Eq. 4): :mod:`dmlbench.losses.deml_adversary`, summed over the scales.
- L_decay (Eq. 6, "activation decay"): λ1 / (2 I J N) Σ_ij Σ_n ‖CA_ij(x_n)‖², i.e. λ1 × the
  mean over learners and images of half the squared norm of the raw (unnormalised)
  learner outputs.
- L_ntri (Eq. 6): λ2 Σ_ij tr[(ω ωᵀ − I) ⊙ (ω ωᵀ − I)] with ω (w × d1) the weights of learner
  (i, j). The trace of a Hadamard square only reads the diagonal, so this is
  λ2 Σ_ij Σ_k (‖ω_k‖² − 1)²: every output unit's weight row is kept at unit norm, which is
  what stops L_decay from driving all weights to 0 (the paper's stated purpose). We
  implement the formula as printed (not the full ‖ω ωᵀ − I‖²_F), at one of two scales
  (``ntri_variant``):

  - ``code`` (default): the released code's scale. Its ``InnerProduct`` layer with
    ``act_init: true, lamda: 0.5`` adds 4 (λ/w) (‖ω_k‖² − 1) ω_k to the gradient of each row,
    the gradient of (λ/w) Σ_k (‖ω_k‖² − 1)², once per *distinct* matrix (the J learners of a
    scale share theirs): L_ntri = λ2 Σ_matrices mean_k (‖ω_k‖² − 1)², λ2 = 0.5
    (:data:`CODE_NTRI_WEIGHT`).
  - ``paper``: the sum over the I·J learners and their w rows, λ2 = 0.25 (§4). With PyTorch's
    default init (‖ω_k‖² ≈ 1/3) and the embedded DeML(3, 3) (w = 56, a shared matrix counted
    once per learner) that is 0.25 × 9 × 56 × 4/9 = 56 at initialisation, four times the
    metric loss and 84 × the code's 0.67: the term then dominates the first updates.

The authors' code applies the activation decay to the first CA learner of each scale only
and stops its gradient at the learner's input; we follow the paper (all learners, full
gradient).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Literal

import torch
from torch import Tensor, nn

from .checks import check_positive
from .deml_adversary import AdversaryNetwork, contrastive_hinge_diversity

__all__ = [
    "CODE_NTRI_WEIGHT",
    "DeMLLoss",
    "DeMLLossTerms",
    "NTRI_VARIANTS",
    "PAPER_NTRI_WEIGHT",
    "activation_decay",
    "nontrivial_solution_penalty",
]

#: The scales of L_ntri: the released code's (default) and the paper's as printed.
NTRI_VARIANTS = ("code", "paper")
#: λ2 of the released code (``lamda: 0.5`` of its ``act_init`` inner-product layers), per distinct matrix and row mean.
CODE_NTRI_WEIGHT = 0.5
#: λ2 of the paper (§4), per learner and summed over rows.
PAPER_NTRI_WEIGHT = 0.25


def activation_decay(embeddings: Sequence[Tensor]) -> Tensor:
    """Mean over learners and images of ½‖e‖² (the λ1-free part of L_decay).

    Args:
        embeddings: per scale, (J, B, w) raw learner outputs (all scales have the same J, B, w).
    """
    return 0.5 * torch.stack([e.float().pow(2).sum(-1).mean() for e in embeddings]).mean()


def nontrivial_solution_penalty(weights: Sequence[Tensor], variant: str = "code") -> Tensor:
    """The λ2-free L_ntri from tr[(ω ωᵀ − I) ⊙ (ω ωᵀ − I)] = Σ_k (‖ω_k‖² − 1)².

    Args:
        weights: each learner's (w, d1) weight matrix (a shared matrix once per learner).
        variant: 'code': Σ over the distinct matrices of the mean over their rows; 'paper': Σ
            over the learners of the sum over their rows.
    """
    if variant not in NTRI_VARIANTS:
        raise ValueError(f"ntri variant must be one of {NTRI_VARIANTS}, got {variant!r}")
    if variant == "code":
        distinct = list({id(w): w for w in weights}.values())
        return torch.stack([(w.pow(2).sum(1) - 1.0).pow(2).mean() for w in distinct]).sum()
    return torch.stack([(w.pow(2).sum(1) - 1.0).pow(2).sum() for w in weights]).sum()


@dataclass
class DeMLLossTerms:
    """The weighted terms of one batch (scalars): ``total`` is what is minimised."""

    total: Tensor
    metric: Tensor
    adversary: Tensor
    decay: Tensor
    ntri: Tensor


class DeMLLoss(nn.Module):
    """The whole DeML objective; holds the adversary networks (their parameters train in the loss group).

    Args:
        metric: the per-learner metric loss, ``forward(embeddings (B, w), labels (B,)) → scalar``.
        num_scales: I.
        learners_per_scale: J (1 for a scale without CAMs).
        learner_dim: w.
        adversary: 'grl' (paper, Eq. 4), 'contrastive' (authors' code) or 'none'.
        adversary_weight: λ0 ≥ 0.
        adversary_hidden: h of the adversary networks ('grl').
        adversary_margin: m of the contrastive hinge ('contrastive').
        decay_weight: λ1 ≥ 0 (0.014 in the paper; 0 = no activation decay).
        ntri_weight: λ2 ≥ 0 (:data:`CODE_NTRI_WEIGHT` for 'code', :data:`PAPER_NTRI_WEIGHT` for 'paper').
        ntri_variant: the scale of L_ntri, 'code' or 'paper' (:func:`nontrivial_solution_penalty`).
    """

    def __init__(
        self,
        metric: nn.Module,
        *,
        num_scales: int,
        learners_per_scale: int,
        learner_dim: int,
        adversary: Literal["grl", "contrastive", "none"] = "grl",
        adversary_weight: float = 1.0,
        adversary_hidden: int = 128,
        adversary_margin: float = 2.0,
        decay_weight: float = 0.014,
        ntri_weight: float = CODE_NTRI_WEIGHT,
        ntri_variant: str = "code",
    ):
        super().__init__()
        if adversary not in ("grl", "contrastive", "none"):
            raise ValueError(f"adversary must be 'grl', 'contrastive' or 'none', got {adversary!r}")
        for name, value in (
            ("adversary_weight", adversary_weight),
            ("decay_weight", decay_weight),
            ("ntri_weight", ntri_weight),
        ):
            if value < 0:
                raise ValueError(f"{name} must be ≥ 0, got {value}")
        if ntri_variant not in NTRI_VARIANTS:
            raise ValueError(f"ntri_variant must be one of {NTRI_VARIANTS}, got {ntri_variant!r}")
        check_positive("adversary_margin", adversary_margin)
        self.metric = metric
        self.adversary = adversary if learners_per_scale > 1 and adversary_weight > 0 else "none"
        self.adversary_weight = adversary_weight
        self.adversary_margin = adversary_margin
        self.decay_weight = decay_weight
        self.ntri_weight = ntri_weight
        self.ntri_variant = ntri_variant
        self.adversaries = nn.ModuleList(
            [AdversaryNetwork(learner_dim, adversary_hidden) for _ in range(num_scales)]
            if self.adversary == "grl"
            else []
        )

    def forward(self, embeddings: Sequence[Tensor], labels: Tensor, learner_weights: Sequence[Tensor]) -> DeMLLossTerms:
        """Args:
        embeddings: per scale, (J, B, w) raw learner outputs.
        labels: (B,) class labels.
        learner_weights: the (w, d1) weight matrix of every learner (for L_ntri).
        """
        metric = torch.stack([self.metric(e, labels) for scale in embeddings for e in scale]).mean()
        zero = metric.new_zeros(())
        if self.adversary == "grl":
            adversary = self.adversary_weight * sum((f(e) for f, e in zip(self.adversaries, embeddings)), zero)
        elif self.adversary == "contrastive":
            adversary = self.adversary_weight * sum(
                (contrastive_hinge_diversity(e, self.adversary_margin) for e in embeddings), zero
            )
        else:
            adversary = zero
        decay = self.decay_weight * activation_decay(embeddings) if self.decay_weight > 0 else zero
        ntri = (
            self.ntri_weight * nontrivial_solution_penalty(learner_weights, self.ntri_variant)
            if self.ntri_weight > 0
            else zero
        )
        return DeMLLossTerms(metric + adversary + decay + ntri, metric, adversary, decay, ntri)
