"""Intra-batch message passing (Seidenschwarz et al., ICML 2021, §3.2–3.3): the MPN and the model around it.

The mini-batch is a fully connected graph whose nodes are the images' embeddings
(self loops included). One message-passing step (Eq. 1–6) is

- M-head dot-product attention: for head m, α^m_ij = softmax_j(W_q^m h_i · W_k^m h_j / s)
  with W_q^m, W_k^m, W^m ∈ R^{d/M × d}, message Σ_j α^m_ij W^m h_j; heads concatenated (Eq. 4);
- skip connection + LayerNorm (Eq. 5);
- two-layer feed-forward network (d → 4d → d, ReLU) + skip connection + LayerNorm (Eq. 6).

Node scale (``node_scale``): the nodes are the L2-normalised embeddings (paper and code). Fed as
they are into q·k / √d with the default Linear initialisation, the scores spread by ≈ 0.004 at
initialisation (d = 64): the attention starts uniform, and its gradient, proportional to that
spread, keeps it there. ``node_scale='sqrt_dim'`` (default) multiplies the unit-norm nodes by √d,
i.e. unit RMS per coordinate, the scale every later step gets from its LayerNorm (score spread
≈ 0.24 at d = 64); ``'unit'`` feeds them as they are (the paper's and the code's variant).

Paper vs the authors' code (dvl-tum/intra_batch, ``net/attentions.py``, ``net/gnn_base.py``):
the paper scales the scores by s = √d (Eq. 3) and has no projection after the concatenation
(Eq. 4); the code scales by √(d/M) (``attention_scale='head'``), adds an output Linear after
the concatenation (``output_projection=True``) and a Linear d → d before the first step
(``input_projection=True``). Dropout as in the code: on the attention weights, on both
residual branches and inside the feed-forward network (0.1 each).

Every module works on a batch of independent graphs: nodes (..., n, d) → (..., n, d), so
test-time batches of equal size are refined in one call.
"""

from __future__ import annotations

import math
from typing import Literal, cast

import torch
import torch.nn.functional as F
from torch import nn

from dmlbench.models.backbones import StagedBackbone, freeze_batchnorm

AttentionScale = Literal["embedding", "head"]
NodeScale = Literal["sqrt_dim", "unit"]


class MultiHeadDotProductAttention(nn.Module):
    """Eq. 3–4: M-head dot-product attention over all nodes of each graph.

    Args:
        dim: d, node feature size; a multiple of ``heads``.
        heads: M.
        dropout: dropout probability on the attention weights α (training only).
        scale: ``embedding`` divides the scores by √d (paper, Eq. 3); ``head`` by √(d/M) (code).
        output_projection: a Linear d → d after concatenating the heads (code); the paper has none.

    ``query``, ``key``, ``value`` hold the stacked per-head matrices: rows [m·d/M, (m+1)·d/M) of
    ``query.weight`` are W_q^m (likewise W_k^m, W^m).

    After each forward, :attr:`last_scores` holds the detached scaled scores (..., M, n, n) of that
    call (softmax over the last axis gives α), for the mechanism-health numbers.
    """

    def __init__(
        self,
        dim: int,
        heads: int,
        dropout: float = 0.1,
        scale: AttentionScale = "embedding",
        output_projection: bool = False,
    ):
        super().__init__()
        if heads < 1 or dim % heads:
            raise ValueError(f"the embedding size {dim} must be a positive multiple of the number of heads {heads}")
        if scale not in ("embedding", "head"):
            raise ValueError(f"attention scale must be 'embedding' or 'head', got {scale!r}")
        self.heads = heads
        self.head_dim = dim // heads
        self.scale = math.sqrt(dim if scale == "embedding" else self.head_dim)
        self.query = nn.Linear(dim, dim, bias=False)
        self.key = nn.Linear(dim, dim, bias=False)
        self.value = nn.Linear(dim, dim, bias=False)
        self.dropout = nn.Dropout(dropout)
        self.output = nn.Linear(dim, dim) if output_projection else nn.Identity()
        self.last_scores: torch.Tensor | None = None

    def _split(self, x: torch.Tensor) -> torch.Tensor:
        """(..., n, d) → (..., M, n, d/M)."""
        return x.unflatten(-1, (self.heads, self.head_dim)).transpose(-3, -2)

    def scores(self, nodes: torch.Tensor) -> torch.Tensor:
        """Scaled scores W_q^m h_i · W_k^m h_j / s: (..., n, d) → (..., M, n, n), row i = receiver."""
        return self._split(self.query(nodes)) @ self._split(self.key(nodes)).transpose(-1, -2) / self.scale

    def weights(self, nodes: torch.Tensor) -> torch.Tensor:
        """Attention weights α: (..., n, d) → (..., M, n, n), row i = receiver, softmax over senders j."""
        return torch.softmax(self.scores(nodes), dim=-1)

    def forward(self, nodes: torch.Tensor) -> torch.Tensor:
        """(..., n, d) → (..., n, d): the concatenated messages of Eq. 4 (then the optional projection)."""
        scores = self.scores(nodes)
        self.last_scores = scores.detach()
        messages = self.dropout(torch.softmax(scores, dim=-1)) @ self._split(self.value(nodes))  # (..., M, n, d/M)
        return self.output(messages.transpose(-3, -2).flatten(-2))


class MessagePassingStep(nn.Module):
    """One step (Eq. 4–6): attention, skip + LayerNorm, feed-forward, skip + LayerNorm.

    Args:
        dim: d.
        heads: M.
        attention_dropout: dropout on α.
        dropout: dropout on both residual branches and after the feed-forward ReLU.
        ff_multiplier: hidden size of the feed-forward network = ff_multiplier × d.
        scale, output_projection: see :class:`MultiHeadDotProductAttention`.
    """

    def __init__(
        self,
        dim: int,
        heads: int,
        attention_dropout: float = 0.1,
        dropout: float = 0.1,
        ff_multiplier: int = 4,
        scale: AttentionScale = "embedding",
        output_projection: bool = False,
    ):
        super().__init__()
        self.attention = MultiHeadDotProductAttention(dim, heads, attention_dropout, scale, output_projection)
        self.norm1 = nn.LayerNorm(dim)
        self.feed_forward = nn.Sequential(
            nn.Linear(dim, ff_multiplier * dim),
            nn.ReLU(),
            nn.Dropout(dropout),
            nn.Linear(ff_multiplier * dim, dim),
        )
        self.norm2 = nn.LayerNorm(dim)
        self.dropout = nn.Dropout(dropout)

    def forward(self, nodes: torch.Tensor) -> torch.Tensor:
        """(..., n, d) → (..., n, d)."""
        nodes = self.norm1(nodes + self.dropout(self.attention(nodes)))  # Eq. 5
        return self.norm2(nodes + self.dropout(self.feed_forward(nodes)))  # Eq. 6


class MessagePassingNetwork(nn.Module):
    """L message-passing steps over fully connected graphs (optionally after a Linear d → d, as in the code).

    Permutation equivariant over the nodes of each graph (no positional information).

    Args:
        dim: d.
        steps: L ≥ 1.
        heads: M.
        input_projection: a Linear d → d on the node features before the first step (code).
        node_scale: ``sqrt_dim``: the (unit-norm) nodes are multiplied by √d first, to unit RMS per
            coordinate (default); ``unit``: fed as they are (paper, code). See the module doc.
        other arguments: see :class:`MessagePassingStep`.
    """

    def __init__(
        self,
        dim: int,
        steps: int = 1,
        heads: int = 2,
        attention_dropout: float = 0.1,
        dropout: float = 0.1,
        ff_multiplier: int = 4,
        scale: AttentionScale = "embedding",
        output_projection: bool = False,
        input_projection: bool = False,
        node_scale: NodeScale = "sqrt_dim",
    ):
        super().__init__()
        if steps < 1:
            raise ValueError(f"the MPN needs at least one message-passing step, got {steps}")
        if node_scale not in ("sqrt_dim", "unit"):
            raise ValueError(f"node scale must be 'sqrt_dim' or 'unit', got {node_scale!r}")
        self.node_scale = math.sqrt(dim) if node_scale == "sqrt_dim" else 1.0
        self.input = nn.Linear(dim, dim) if input_projection else nn.Identity()
        self.steps = nn.ModuleList(
            MessagePassingStep(dim, heads, attention_dropout, dropout, ff_multiplier, scale, output_projection)
            for _ in range(steps)
        )

    def forward(self, nodes: torch.Tensor) -> torch.Tensor:
        """Node features (..., n, d) → refined node features (..., n, d) (not normalised)."""
        nodes = self.input(nodes * self.node_scale)
        for step in self.steps:
            nodes = step(nodes)
        return nodes

    def last_attention_scores(self) -> torch.Tensor:
        """(L, ..., M, n, n): each step's :attr:`MultiHeadDotProductAttention.last_scores` of the last forward.

        Raises:
            RuntimeError: the network has not run a forward yet.
        """
        scores = [cast(MessagePassingStep, step).attention.last_scores for step in self.steps]
        present = [s for s in scores if s is not None]
        if len(present) < len(scores):
            raise RuntimeError("the MPN has no attention scores yet: run a forward first")
        return torch.stack(present)


class MPNEmbedder(nn.Module):
    """Backbone → Linear C → d (the embedding used at test time) + the MPN over batches of embeddings.

    Args:
        backbone: staged backbone; its ``pool`` output feeds the linear embedding.
        dim: d.
        mpn: the message-passing network, or None when no loss and no test-time use needs it.
        freeze_bn: keep the backbone's BatchNorm layers in eval mode with frozen affine parameters.
        mpn_lr_multiplier: the MPN's learning rate in units of the head group's (> 0, checked by the
            optimiser's :func:`~dmlbench.training.optim.multiplier_groups`).

    ``forward(images)`` (B, 3, H, W) → (B, d) L2-normalised backbone embeddings (the default
    test-time embedding). ``features`` gives the same before normalisation (the auxiliary
    classifier's input, as in the authors' code); ``refine`` runs the MPN on normalised embeddings.
    """

    learner_slices = None

    def __init__(
        self,
        backbone: StagedBackbone,
        dim: int,
        mpn: MessagePassingNetwork | None,
        freeze_bn: bool = False,
        mpn_lr_multiplier: float = 1.0,
    ):
        super().__init__()
        self.backbone = backbone
        self.embedding = nn.Linear(backbone.out_channels["pool"], dim)
        self.mpn = mpn
        self.mpn_lr_multiplier = mpn_lr_multiplier
        self.freeze_bn = freeze_bn
        if freeze_bn:
            freeze_batchnorm(self.backbone)

    def train(self, mode: bool = True) -> "MPNEmbedder":
        super().train(mode)
        if mode and self.freeze_bn:
            freeze_batchnorm(self.backbone)
        return self

    def parameter_group_multipliers(self) -> dict[str, tuple[nn.Module, float]]:
        """The optimiser hook (:func:`dmlbench.training.optim.parameter_groups`): the MPN's parameters
        form the group ``head/mpn`` at ``mpn_lr_multiplier`` × the head's lr; none without an MPN."""
        return {} if self.mpn is None else {"mpn": (self.mpn, self.mpn_lr_multiplier)}

    def features(self, images: torch.Tensor) -> torch.Tensor:
        """(B, 3, H, W) → (B, d) un-normalised backbone embeddings."""
        return self.embedding(self.backbone(images))

    def forward(self, images: torch.Tensor) -> torch.Tensor:
        return F.normalize(self.features(images), dim=-1)

    def refine(self, embeddings: torch.Tensor) -> torch.Tensor:
        """MPN over graphs of L2-normalised embeddings: (..., n, d) → (..., n, d) refined features.

        Raises:
            RuntimeError: the model was built without an MPN.
        """
        if self.mpn is None:
            raise RuntimeError(
                "this model has no MPN (the MPN loss weight is 0 and the test embedding is the "
                "backbone's); set loss.mpn_weight > 0 or options.test_embedding: mpn"
            )
        return self.mpn(embeddings)
