"""The MPN paper's losses (Seidenschwarz et al. 2021, §3.4): label-smoothed, temperature-scaled cross-entropy
on the MPN-refined node features plus an auxiliary one on the backbone embedding.

The class weights (the two classifiers) live in this module, like the proxies of Proxy-NCA and the
class weights of the normalised softmax: they are needed only to train, the trainer saves them with
the loss state, and they get ``lr × loss_lr_multiplier``. (A recipe builds its model before it
knows the number of training classes, so the classifiers cannot be model parameters.)
"""

from __future__ import annotations

from dataclasses import dataclass

from torch import Tensor, nn

from .checks import check_batch, check_fraction, check_labels_in_range, check_positive
from .cross_entropy import smoothed_cross_entropy

__all__ = ["MPNCrossEntropyLoss", "MPNLossConfig", "tempered_cross_entropy"]


def tempered_cross_entropy(logits: Tensor, labels: Tensor, temperature: float, smoothing: float) -> Tensor:
    """Label-smoothed cross-entropy of ``logits / temperature``, averaged over the batch.

    Per sample, with p = softmax(z / τ) over the C classes and ε = smoothing::

        (1 - ε) · (-log p_y) + ε · mean_c(-log p_c)

    (see :func:`~dmlbench.losses.cross_entropy.smoothed_cross_entropy`). τ < 1 sharpens the softmax
    ("low temperature scaling", Zhai & Wu 2019; Teh et al. 2020), as in the MPN code
    (``loss(probs / temperatur, Y)``).

    Args:
        logits: (B, C) unnormalised scores.
        labels: (B,) integer labels in 0..C-1.
        temperature: τ > 0.
        smoothing: ε in [0, 1).

    Returns:
        Scalar loss.
    """
    check_positive("temperature", temperature)
    return smoothed_cross_entropy(logits.float() / temperature, labels, smoothing)


@dataclass(frozen=True)
class MPNLossConfig:
    """``methods.<name>.loss`` of the ``mpn`` recipe (besides ``name: mpn_cross_entropy``).

    Attributes:
        temperature: τ of both cross-entropies (logits / τ); the authors' code: CUB 0.2, Cars 0.11,
            SOP 0.60, In-Shop 0.19.
        label_smoothing: ε of both cross-entropies, in [0, 1) (code: 0.1).
        mpn_weight: weight of the cross-entropy on the MPN-refined node features (0: no MPN loss,
            and no MPN is built unless the test embedding needs one).
        aux_weight: weight of the auxiliary cross-entropy on the backbone embedding (0: none).
        classifier_batchnorm: BatchNorm1d (no shift) before a bias-free MPN classifier, the "BNNeck"
            of the authors' code (``classifier.neck: 1``); the paper mentions only a fully connected
            layer (False).
    """

    temperature: float = 0.2
    label_smoothing: float = 0.1
    mpn_weight: float = 1.0
    aux_weight: float = 1.0
    classifier_batchnorm: bool = False

    def __post_init__(self) -> None:
        check_positive("temperature", self.temperature)
        check_fraction("label_smoothing", self.label_smoothing)
        check_positive("mpn_weight", self.mpn_weight, allow_zero=True)
        check_positive("aux_weight", self.aux_weight, allow_zero=True)
        if self.mpn_weight == 0 and self.aux_weight == 0:
            raise ValueError("mpn_weight and aux_weight are both 0: nothing to train")


class MPNCrossEntropyLoss(nn.Module):
    """``mpn_weight · CE(mpn_classifier(refined)) + aux_weight · CE(aux_classifier(features))``.

    Each CE is :func:`tempered_cross_entropy` with the config's τ and ε. The auxiliary classifier
    is a Linear d → C with bias on the un-normalised backbone embedding (code: ``fc`` on ``fc7``);
    the MPN classifier a Linear d → C on the refined node features, optionally after a BatchNorm.
    A classifier whose weight is 0 is not built.

    Args:
        num_classes: C, training classes.
        embedding_dim: d.
        config: the hyperparameters.

    After each call, :attr:`last_terms` holds the detached unweighted terms (``mpn_ce``, ``aux_ce``).
    """

    def __init__(self, num_classes: int, embedding_dim: int, config: MPNLossConfig = MPNLossConfig()):
        super().__init__()
        self.num_classes = num_classes
        self.config = config
        self.aux_classifier = nn.Linear(embedding_dim, num_classes) if config.aux_weight > 0 else None
        self.mpn_classifier: nn.Module | None = None
        if config.mpn_weight > 0:
            linear = nn.Linear(embedding_dim, num_classes, bias=not config.classifier_batchnorm)
            if config.classifier_batchnorm:
                norm = nn.BatchNorm1d(embedding_dim)
                norm.bias.requires_grad_(False)  # no shift, as in the code's bottleneck
                self.mpn_classifier = nn.Sequential(norm, linear)
            else:
                self.mpn_classifier = linear
        self.last_terms: dict[str, Tensor] = {}

    @property
    def uses_mpn(self) -> bool:
        """Whether the loss needs the MPN-refined features."""
        return self.mpn_classifier is not None

    def _ce(self, logits: Tensor, labels: Tensor) -> Tensor:
        return tempered_cross_entropy(logits, labels, self.config.temperature, self.config.label_smoothing)

    def forward(self, features: Tensor, refined: Tensor | None, labels: Tensor) -> Tensor:
        """Args:
            features: (B, d) un-normalised backbone embeddings.
            refined: (B, d) MPN output for the same nodes; None when ``mpn_weight`` is 0.
            labels: (B,) in 0..C-1.

        Returns:
            Scalar loss.
        """
        features = check_batch(features, labels)
        check_labels_in_range(labels, self.num_classes)
        total = features.new_zeros(())
        terms: dict[str, Tensor] = {}
        if self.mpn_classifier is not None:
            if refined is None:
                raise ValueError("the MPN loss (mpn_weight > 0) needs the refined node features")
            refined = check_batch(refined, labels)
            terms["mpn_ce"] = self._ce(self.mpn_classifier(refined), labels)
            total = total + self.config.mpn_weight * terms["mpn_ce"]
        if self.aux_classifier is not None:
            terms["aux_ce"] = self._ce(self.aux_classifier(features), labels)
            total = total + self.config.aux_weight * terms["aux_ce"]
        self.last_terms = {name: value.detach() for name, value in terms.items()}
        return total
