"""Typed settings: a section of the parameters → a frozen dataclass, parsed once, unknown keys refused.

One mechanism for every typed section (:func:`parse_dataclass`): a run's ``training`` settings
(:class:`TrainingSettings`, with its backbone, image, sampler, optimiser and schedule), its
``evaluation`` settings (:class:`EvaluationSettings`) and each recipe's ``methods.<name>.options``
(:func:`dmlbench.methods.options.parse_options`). The recipes, the trainer and the embed step read the
attributes of these objects, never the mapping's keys; the mapping itself still travels where it is
written down (``checkpoint.pt``, ``run.yaml``, the configuration digest), unchanged.

A setting's default, when it has one, is its field's default here and nowhere else in the code (the
JSON schema states the same value, which ``tests/test_settings.py`` checks); a field without a default is
one that ``params.yaml``'s ``training`` / ``evaluation`` section sets for every run.
"""

from __future__ import annotations

import dataclasses
import numbers
import types
import typing
from collections.abc import Mapping
from typing import Any, ClassVar, Literal, TypeVar

from dmlbench.errors import DmlbenchError, did_you_mean

T = TypeVar("T")

#: faiss' largest K-means seed (its seed is a 32-bit signed int).
FAISS_MAX_SEED = 2**31 - 1
#: Recall@K's K values where no dataset's ``recall_ks`` applies (``dmlbench evaluate`` without ``--dataset``).
DEFAULT_RECALL_KS: tuple[int, ...] = (1, 2, 4, 8)


class SettingsError(DmlbenchError, ValueError):
    """A settings section has an unknown key, lacks a required one, or has a value of the wrong type."""


def matches(value: Any, annotation: Any) -> bool:
    """Whether ``value`` fits a simple annotation (int, float, bool, str, tuple/list, Literal, Optional, Any).

    >>> matches(3, float), matches(True, int), matches([1, 2], tuple[int, ...]), matches("seed", int | Literal["seed"])
    (True, False, True, True)
    """
    origin = typing.get_origin(annotation)
    if annotation is Any:
        return True
    if origin is Literal:
        return value in typing.get_args(annotation)
    if origin in (typing.Union, types.UnionType):
        return any(matches(value, arg) for arg in typing.get_args(annotation))
    if annotation is type(None):
        return value is None
    if origin in (tuple, list):
        args = [arg for arg in typing.get_args(annotation) if arg is not Ellipsis]
        if not isinstance(value, list | tuple):
            return False
        return all(matches(v, args[0] if args else Any) for v in value)
    if annotation is float:
        return isinstance(value, int | float) and not isinstance(value, bool)
    if annotation is int:
        return isinstance(value, int) and not isinstance(value, bool)
    if isinstance(annotation, type):
        return isinstance(value, annotation)
    return True


def _is_settings_class(annotation: Any) -> bool:
    return isinstance(annotation, type) and dataclasses.is_dataclass(annotation)


def _required(field: dataclasses.Field) -> bool:
    return field.default is dataclasses.MISSING and field.default_factory is dataclasses.MISSING


def parse_dataclass(
    cls: type[T],
    values: Mapping[str, Any] | None,
    where: str,
    *,
    error: type[Exception] = SettingsError,
    what: str = "a setting",
) -> T:
    """Build the frozen dataclass ``cls`` from the section ``values``, checking every key against its fields.

    A field whose type is itself a dataclass is parsed from its sub-section (errors at ``where.key.sub``);
    lists become tuples (the object stays immutable); values are kept as given otherwise (an int stays an
    int where a float is allowed: the numbers computed from them do not change). A class with a
    ``EXTRA_KEYS_FIELD`` collects the keys that are not its fields into that field, as ``(key, value)``
    pairs in the section's order, instead of refusing them.

    Args:
        cls: the dataclass.
        values: the section (None or empty: all defaults).
        where: the section's dotted path for messages, e.g. ``training`` or ``methods.abe8.options``.
        error: the exception class raised.
        what: what a key of the section is, for the unknown-key message.

    Raises:
        error: an unknown key (the message lists the known ones), a missing key without a default, or a
            value of the wrong type (the message names the key and the expected type).

    >>> @dataclasses.dataclass(frozen=True)
    ... class Demo:
    ...     learners: int
    ...     weight: float = 1.0
    >>> parse_dataclass(Demo, {"learners": 4}, "methods.x.options")
    Demo(learners=4, weight=1.0)
    >>> parse_dataclass(Demo, {"learners": 4, "wieght": 2}, "methods.x.options")
    Traceback (most recent call last):
    ...
    dmlbench.settings.SettingsError: methods.x.options.wieght is not a setting (did you mean 'weight'?); known: learners, weight
    >>> parse_dataclass(Demo, {"learners": "4"}, "methods.x.options")
    Traceback (most recent call last):
    ...
    dmlbench.settings.SettingsError: methods.x.options.learners = '4' does not have the expected type int
    """
    if values is not None and not isinstance(values, Mapping):
        raise error(f"{where} = {values!r} is not a mapping of settings; write it as `key: value` lines")
    given = dict(values or {})
    extra_field = getattr(cls, "EXTRA_KEYS_FIELD", None)
    fields = {f.name: f for f in dataclasses.fields(cls) if f.name != extra_field}  # type: ignore[arg-type]
    hints = typing.get_type_hints(cls)
    unknown = [key for key in given if key not in fields]
    if unknown and extra_field is None:
        key = unknown[0]
        raise error(f"{where}.{key} is not {what}{did_you_mean(str(key), fields)}; known: {', '.join(fields)}")
    missing = [name for name, field in fields.items() if _required(field) and name not in given]
    if missing:
        raise error(
            f"{where}.{missing[0]} is not set and has no default: set it (the section has "
            f"{', '.join(map(str, given)) or 'no keys'})"
        )
    parsed: dict[str, Any] = {}
    for key, value in given.items():
        if key not in fields:
            continue
        hint = hints[key]
        if _is_settings_class(hint) and not isinstance(value, hint):
            parsed[key] = parse_dataclass(hint, value, f"{where}.{key}", error=error, what=what)
            continue
        if not matches(value, hint):
            shown = getattr(hint, "__name__", None) if isinstance(hint, type) else None
            raise error(f"{where}.{key} = {value!r} does not have the expected type {shown or hint}")
        parsed[key] = tuple(value) if isinstance(value, list) else value
    if extra_field is not None:
        parsed[extra_field] = tuple((key, given[key]) for key in unknown)
    try:
        return cls(**parsed)
    except (TypeError, ValueError) as err:
        raise error(f"{where}: {err}") from err


@dataclasses.dataclass(frozen=True)
class BackboneSettings:
    """``training.backbone``: the network the recipe builds its model on.

    Attributes:
        name: a registered backbone (``dmlbench list backbones``) or ``timm:<model>``.
        pretrained: the weights it starts from (a dataset's pretraining stage, a timm source), None: random.
        freeze_bn: keep the backbone's BatchNorm layers in eval mode with frozen affine parameters.
        frozen_through: the stage up to which the backbone's weights are fixed, None: none.
        builder_arguments: the section's other keys, ``(key, value)`` pairs passed to the backbone's builder
            (e.g. ``width``, ``pooling``); the builder checks them.
    """

    EXTRA_KEYS_FIELD: ClassVar[str] = "builder_arguments"

    name: str
    pretrained: str | bool | None = None
    freeze_bn: bool = False
    frozen_through: str | None = None
    builder_arguments: tuple[tuple[str, Any], ...] = ()

    @property
    def section(self) -> dict[str, Any]:
        """The section as :func:`dmlbench.models.backbones.build_backbone` takes it (a new dict)."""
        return {
            "name": self.name,
            **dict(self.builder_arguments),
            "pretrained": self.pretrained,
            "freeze_bn": self.freeze_bn,
            "frozen_through": self.frozen_through,
        }


@dataclasses.dataclass(frozen=True)
class ImageSettings:
    """``training.image``: input sizes (px) and the training augmentation.

    Attributes:
        resize: test images: the shorter side resized to this, then centre-cropped to ``test_crop``.
        test_crop: side of the test (and validation) input.
        train_crop: side of the training input, a random resized crop.
        crop_scale: (low, high) share of the image area the random crop covers, in (0, 1].
        flip: random horizontal flips in training.
    """

    resize: int
    test_crop: int
    train_crop: int
    crop_scale: tuple[float, ...]
    flip: bool


@dataclasses.dataclass(frozen=True)
class SamplerSettings:
    """``training.sampler``: P × K class-balanced training batches.

    Attributes:
        classes_per_batch: P classes per batch.
        images_per_class: K images of each.
        batches_per_epoch: batches per epoch; None: the sampler's own count (about one pass over the images).
    """

    classes_per_batch: int
    images_per_class: int
    batches_per_epoch: int | None = None


@dataclasses.dataclass(frozen=True)
class OptimizerSettings:
    """``training.optimizer`` (:func:`dmlbench.training.optim.build_optimizer`).

    Attributes:
        name: sgd, adam, adamw or radam.
        lr: the backbone's learning rate.
        weight_decay: λ ≥ 0.
        decoupled_weight_decay: True: decoupled (AdamW-style), False: coupled, None: the optimiser's own.
        momentum: SGD's momentum in [0, 1).
        head_lr_multiplier: the other model parameters' lr = lr × this.
        loss_lr_multiplier: the loss parameters' (proxies') lr = lr × this.
    """

    name: str
    lr: float
    weight_decay: float = 0.0
    decoupled_weight_decay: bool | None = None
    momentum: float = 0.9
    head_lr_multiplier: float = 1.0
    loss_lr_multiplier: float = 1.0


@dataclasses.dataclass(frozen=True)
class ScheduleSettings:
    """``training.schedule``, stepped once per epoch (:func:`dmlbench.training.optim.build_scheduler`).

    Attributes:
        name: constant, step or cosine.
        milestones: step: the epochs after which the lr is multiplied by ``gamma`` (None: not set).
        gamma: step: the factor at each milestone.
        min_lr_fraction: cosine: the lr it ends at, as a fraction of the initial lr.
    """

    name: str
    milestones: tuple[int, ...] | None = None
    gamma: float = 0.1
    min_lr_fraction: float = 0.0


@dataclasses.dataclass(frozen=True)
class TrainingSettings:
    """A run's ``training`` section (``params.yaml`` ← dataset ← method, :func:`dmlbench.config.resolve_run`).

    Attributes:
        device: ``auto`` (CUDA when available, else CPU), ``cpu``, ``cuda``, ``cuda:N`` or ``mps``.
        amp: mixed precision (CUDA only).
        num_workers: loader processes.
        cache_images: pipeline pil: keep the decoded training and validation images in memory.
        pipeline: ``pil`` or ``decoded_uint8`` (:func:`dmlbench.training.data.load_run_data`).
        epochs: epochs trained (0: nothing trained, reference rows).
        selection: the kept epoch: best validation R@1 (``val``), best test R@1 (``test``), or ``last``.
        val_fraction: share of the training classes held out for validation, in [0, 1).
        val_split_seed: seed of that split, or ``"seed"`` for the run's seed.
        eval_batch_size: images per embedding batch.
        embedding_dim: d, the embedding's dimensions.
        backbone, image, sampler, optimizer, schedule: the sub-sections.
        deterministic: GPU: deterministic kernels, no autotuning.
        channels_last: convolution weights in the channels-last memory format.
        eval_images_per_class: None: every validation and test image; N: the first N of each class.
        log_train_recall: log R@1 on the training images every epoch.
        log_test_recall: log test R@1 every epoch.
    """

    device: str
    amp: bool
    num_workers: int
    cache_images: bool
    pipeline: Literal["pil", "decoded_uint8"]
    epochs: int
    selection: Literal["val", "test", "last"]
    val_fraction: float
    val_split_seed: int | Literal["seed"]
    eval_batch_size: int
    embedding_dim: int
    backbone: BackboneSettings
    image: ImageSettings
    sampler: SamplerSettings
    optimizer: OptimizerSettings
    schedule: ScheduleSettings
    deterministic: bool = True
    channels_last: bool = False
    eval_images_per_class: int | None = None
    log_train_recall: bool = False
    log_test_recall: bool = False


@dataclasses.dataclass(frozen=True)
class KMeansSettings:
    """``evaluation.kmeans``: the faiss K-means run behind NMI; recorded in the metrics.

    Attributes:
        seed: faiss clustering seed (initial centroids, empty-cluster splits), in [0, 2**31).
        niter: the ceiling of Lloyd iterations per run, ≥ 1. faiss stops a run earlier once its
            objective no longer changes (a fixed point, which further iterations would not leave);
            the iterations actually run are recorded as ``kmeans_iterations``. Measured: 12–13 at
            SOP size (11,316 clusters), 25–28 on CUB-sized embeddings (``benchmarks/bench_evaluate.py``),
            so 100 is a ceiling that real runs do not reach and costs nothing when they converge.
        nredo: independent runs; the one with the lowest objective is kept, ≥ 1.
    """

    seed: int = 0
    niter: int = 100
    nredo: int = 1

    def __post_init__(self) -> None:
        for name, low, high in (("seed", 0, FAISS_MAX_SEED), ("niter", 1, None), ("nredo", 1, None)):
            value = getattr(self, name)
            if isinstance(value, bool) or not isinstance(value, numbers.Integral):
                raise TypeError(f"KMeansSettings.{name} must be an int, got {value!r}")
            if value < low or (high is not None and value > high):
                bound = f"in [{low}, {high}]" if high is not None else f">= {low}"
                raise ValueError(f"KMeansSettings.{name} must be {bound}, got {value}")

    def as_metrics(self) -> dict[str, float]:
        """The settings as numeric metric entries (``kmeans_seed``, ``kmeans_niter``, ``kmeans_nredo``)."""
        return {"kmeans_seed": float(self.seed), "kmeans_niter": float(self.niter), "kmeans_nredo": float(self.nredo)}


#: Query rows per block of the kNN search (``evaluation.chunk_size``): bounds the distance block in memory.
DEFAULT_CHUNK_SIZE = 4096


@dataclasses.dataclass(frozen=True)
class EvaluationSettings:
    """The ``evaluation`` section (``EvaluationSettings()``: the defaults, as ``dmlbench evaluate`` without
    ``--dataset`` uses them).

    Attributes:
        chunk_size: query rows per block of the kNN search.
        kmeans: the NMI's K-means.
    """

    chunk_size: int = DEFAULT_CHUNK_SIZE
    kmeans: KMeansSettings = dataclasses.field(default_factory=KMeansSettings)


def training_settings(run: Mapping[str, Any]) -> TrainingSettings:
    """The resolved run's ``training`` section (:func:`dmlbench.config.resolve_run`) as :class:`TrainingSettings`.

    Raises:
        SettingsError: naming the key path (``training.…``) and the fix.
    """
    return parse_dataclass(TrainingSettings, run["training"], "training")


def evaluation_settings(run: Mapping[str, Any]) -> EvaluationSettings:
    """The resolved run's ``evaluation`` section as :class:`EvaluationSettings`.

    Raises:
        SettingsError: naming the key path (``evaluation.…``) and the fix.
    """
    return parse_dataclass(EvaluationSettings, run["evaluation"], "evaluation")
