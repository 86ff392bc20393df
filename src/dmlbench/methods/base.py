"""A method is a recipe: model + loss + sampler + training hooks + test-time embedding.

Recipes are named in ``methods.<name>.recipe``; everything they need comes from
the resolved run (:func:`dmlbench.config.resolve_run`): its training settings parsed once
(:attr:`Recipe.settings`, a :class:`~dmlbench.settings.TrainingSettings`), their own settings from
``methods.<name>.options`` (a dataclass, :attr:`Recipe.options_class`). The
trainer, the embed step and the figures only talk to this interface, so a new
method is a new recipe, not a new trainer.

Contract of the model a recipe builds (:meth:`Recipe.build_model`):

- an ``nn.Module`` with a ``backbone`` attribute (a
  :class:`~dmlbench.models.backbones.StagedBackbone`, or an ``nn.ModuleList`` of
  them for models with one backbone per branch, e.g. DeML's scales; its
  parameters form the optimiser's ``backbone`` group, every other parameter of
  the model the ``head`` group);
- ``forward(images)``: (B, 3, H, W) RGB in [0, 1] → (B, d) float embeddings,
  unit-norm rows, or unit-norm per learner slice for multi-learner models;
- ``learner_slices``: None, or the [start, stop) column range of each learner
  (evaluation reports each learner's metrics and their self-pair similarity);
- optionally ``backbone_copies()``: modules outside ``backbone`` that are copies of
  backbone stages (ABE's attention trunk, M-heads' extra heads, DIABLO's φ); they
  join the ``backbone`` group.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from typing import Any, ClassVar

import numpy as np
import torch
from torch import nn

from dmlbench.data.samplers import ClassBalancedBatchSampler
from dmlbench.data.stored_dataset import ImageSet
from dmlbench.losses import build_loss
from dmlbench.methods.health import HealthCheck
from dmlbench.methods.options import parse_options
from dmlbench.models.backbones import build_backbone
from dmlbench.models.embedder import Embedder
from dmlbench.models.heads import LinearEmbedding
from dmlbench.settings import TrainingSettings, training_settings
from dmlbench.models.embedding import compute_embeddings


@dataclass
class TrainContext:
    """What epoch hooks may use besides the model.

    Attributes:
        data: the run's datasets (:class:`~dmlbench.training.data.RunData`).
        device: the training device.
        eval_batch_size: batch size for no-gradient passes (``training.eval_batch_size``).
        num_workers: loader processes of those passes (``training.num_workers``).
    """

    data: Any
    device: torch.device
    eval_batch_size: int
    num_workers: int = 0


class Recipe:
    """Base recipe (``recipe: baseline``): a linear L2-normalised embedding trained with one loss.

    Args:
        run: the resolved run (``dataset_config``, ``method_config``, ``training``, ``seed``).

    Attributes:
        settings: the run's ``training`` section, parsed (the hooks read it, never ``run["training"]``).

    Subclasses set :attr:`options_class` to a frozen dataclass of their options
    (every field with a default) and override the hooks they need.
    """

    #: dataclass of ``methods.<name>.options``; None: the recipe takes no options.
    options_class: ClassVar[type | None] = None
    #: options that change only how a trained model embeds the test set, never the training: a method
    #: that differs from another only in these re-embeds its checkpoints (``checkpoint_of``).
    TEST_TIME_OPTIONS: ClassVar[frozenset[str]] = frozenset()
    #: the parsed options, an instance of :attr:`options_class` (subclasses narrow the annotation to it).
    options: object | None

    def __init__(self, run: Mapping[str, Any]):
        self.run = run
        self.settings: TrainingSettings = training_settings(run)
        self.method = run["method_config"]
        where = f"methods.{run.get('method', '?')}.options"
        if self.options_class is None:
            if self.method.get("options"):
                raise ValueError(f"{where}: recipe {self.method.get('recipe')!r} takes no options")
            self.options = None
        else:
            self.options = parse_options(self.options_class, self.method.get("options"), where)

    # --- model, loss, batches -------------------------------------------------------------
    def build_model(self) -> nn.Module:
        """Backbone (``training.backbone``) + linear embedding of ``training.embedding_dim``."""
        backbone = build_backbone(self.settings.backbone.section)
        head = LinearEmbedding(backbone.out_channels["pool"], self.settings.embedding_dim)
        return Embedder(backbone, head, freeze_bn=self.settings.backbone.freeze_bn)

    def build_loss(self, num_classes: int) -> nn.Module:
        """The loss of ``methods.<name>.loss`` for ``num_classes`` training classes."""
        return build_loss(self.method["loss"], num_classes=num_classes, embedding_dim=self.settings.embedding_dim)

    def build_sampler(self, labels: np.ndarray, generator: torch.Generator) -> Iterable[list[int]]:
        """Batches of training row indices; default P × K class-balanced from ``training.sampler``.

        Args:
            labels: (N_train,) labels 0..C-1 of the training rows.
            generator: the epoch's RNG; every draw must come from it (determinism).
        """
        return self.class_balanced_sampler(labels, generator)

    def class_balanced_sampler(self, labels: np.ndarray, generator: torch.Generator) -> ClassBalancedBatchSampler:
        """The default batches of :meth:`build_sampler`: P × K class-balanced from ``training.sampler``."""
        sampler = self.settings.sampler
        return ClassBalancedBatchSampler(
            labels,
            sampler.classes_per_batch,
            sampler.images_per_class,
            generator,
            num_batches=sampler.batches_per_epoch,
        )

    def training_loss(
        self, model: nn.Module, loss: nn.Module, images: torch.Tensor, labels: torch.Tensor, indices: torch.Tensor
    ) -> torch.Tensor:
        """Loss of one batch → scalar.

        Args:
            images: (B, 3, H, W) in [0, 1].
            labels: (B,) int64 in 0..C-1.
            indices: (B,) int64 row indices of the batch in the training set.
        """
        return loss(model(images), labels)

    # --- epoch hooks and state ------------------------------------------------------------
    def on_epoch_start(self, epoch: int, model: nn.Module, context: TrainContext) -> None:
        """Called before each epoch (1-based), before :meth:`build_sampler`; the RNG is already seeded
        from (seed, epoch). E.g. divide-and-conquer re-clusters the training set here."""

    def epoch_log(self) -> dict[str, float]:
        """Extra ``log.csv`` columns for the epoch just trained (same keys every epoch)."""
        return {}

    def summary(self) -> dict[str, float]:
        """Numbers about the whole training (finite floats), copied into ``metrics.json``."""
        return {}

    def health_checks(self) -> list[HealthCheck]:
        """The bounds that show this run's mechanism engaged (:mod:`dmlbench.methods.health`), for
        its options (e.g. no divergence check when ``divergence_weight`` is 0). The report marks a
        cell whose run fails one. Plain baselines have no mechanism to check."""
        return []

    def state_dict(self) -> dict[str, Any]:
        """Recipe state that must survive an interruption (saved in the resume checkpoint)."""
        return {}

    def load_state_dict(self, state: Mapping[str, Any]) -> None:
        """Restore :meth:`state_dict`."""

    # --- test time ------------------------------------------------------------------------
    def embed(
        self, model: nn.Module, dataset: ImageSet, batch_size: int, device: torch.device, num_workers: int = 0
    ) -> np.ndarray:
        """Test-time embeddings (N, d) float32 of ``dataset`` in its order (default: ``model`` in eval mode),
        decoded by ``num_workers`` loader processes."""
        return compute_embeddings(model, dataset, batch_size, device, num_workers)

    def embedding_views(self, model: nn.Module) -> dict[str, tuple[int, int]]:
        """Named column ranges evaluated on their own besides the learners (e.g. ``scale1`` of DeML)."""
        return {}

    def attention_maps(self, model: nn.Module, images: torch.Tensor) -> dict[str, torch.Tensor]:
        """Named attention maps of a batch for figures: name → (B, h, w) float in [0, 1].

        Raises:
            NotImplementedError: the method has no attention.
        """
        raise NotImplementedError(f"recipe {self.method.get('recipe')!r} has no attention maps to show")
