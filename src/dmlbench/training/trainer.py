"""The one generic trainer: optimiser and schedule from params, per-epoch model selection, resume.

Reproducibility contract (CPU): every random draw of epoch ``e`` is seeded
from ``(seed, e)``, and the scratch checkpoint written after each epoch holds
the model, loss, optimiser and scheduler states. A run killed at any point
and restarted therefore continues from its last completed epoch and ends with
bit-identical weights and metrics to an uninterrupted run.

Model selection (``training.selection``):

- ``val`` (clean protocol, default): keep the epoch with the best Recall@1 on
  the class-disjoint validation split; the test set is never looked at.
- ``test`` (paper protocol, as in the papers' code): keep the best test
  Recall@1. Optimistic; table captions say so.
- ``last``: keep the final epoch.
"""

from __future__ import annotations

import dataclasses
import math
import time
from collections.abc import Callable, Iterable, Iterator, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any, cast

import numpy as np
import pandas as pd
import torch
from torch import nn
from torch.utils.data import DataLoader
from tqdm import tqdm

from dmlbench.atomic import write_text_atomic
from dmlbench.config import ConfigError, run_yaml_text
from dmlbench.errors import DmlbenchError
from dmlbench.evaluation import recall_at_k
from dmlbench.layout import LOG_COLUMNS, RUN_FILE
from dmlbench.methods import Recipe, TrainContext, build_recipe
from dmlbench.methods.health import (
    INIT_GAP_KEY,
    INIT_LINEAR_HEAD_LOWEST_KEY,
    INIT_LINEAR_HEAD_VAL_R1_KEY,
    INIT_SHORTFALL_KEY,
    INIT_VAL_R1_KEY,
)
from dmlbench.models.backbones import build_backbone
from dmlbench.models.embedding import compute_embeddings
from dmlbench.models.heads import LinearEmbedding
from dmlbench.placement import claim_device
from dmlbench.seeding import configure_determinism, derive_seed, seed_everything
from dmlbench.settings import TrainingSettings, training_settings
from dmlbench.training.checkpoint import (
    RESUME_CHECKPOINT_KEYS,
    atomic_torch_save,
    check_manifest,
    config_digest,
    load_checkpoint,
    manifest_entries,
)
from dmlbench.training.data import RunData, load_run_data
from dmlbench.training.kernel_warnings import KernelWarnings
from dmlbench.training.optim import build_optimizer, build_scheduler

#: Seeded linear heads whose mean validation R@1 is the init-parity reference (:meth:`Trainer.measure_init_parity`).
INIT_PARITY_HEAD_DRAWS = 8


class WaitClock:
    """Iterates over ``items``, adding the seconds spent waiting for each next item to :attr:`seconds`.

    Over a training loader this is the time the training process sat idle for want of a batch: the share
    of an epoch it takes (``loader_wait_share`` in ``log.csv``) shows whether the data path keeps up. On a
    GPU the steps are queued without waiting for each other (:class:`LossTally`), so the GPU may still be
    busy with queued work while the process waits: the share bounds the GPU's idle time from above.
    """

    def __init__(self, items: Iterable[Any]):
        self.items = items
        self.seconds = 0.0

    def __iter__(self) -> Iterator[Any]:
        iterator = iter(self.items)
        while True:
            started = time.perf_counter()
            try:
                item = next(iterator)
            except StopIteration:
                return
            self.seconds += time.perf_counter() - started
            yield item


class EpochBatches:
    """A batch sampler whose batches are replaced every epoch (``current``), so that one DataLoader and its
    persistent workers serve every epoch; the batches are drawn in the training process."""

    def __init__(self) -> None:
        self.current: Iterable[list[int]] = ()

    def __iter__(self) -> Iterator[list[int]]:
        return iter(self.current)

    def __len__(self) -> int:
        return len(self.current)  # type: ignore[arg-type]


class LossTally:
    """The epoch's running loss, kept on the training device so that a step never waits for the GPU.

    :meth:`add` sums ``loss × batch size`` in float64 (the same sum, in the same order, as adding
    ``loss.item() × n`` in Python) and remembers the first step whose loss was NaN or infinite, with its
    value; reading them (:meth:`mean`, :meth:`first_non_finite`) waits for the queued steps.

    >>> tally = LossTally(torch.device("cpu"))
    >>> tally.add(torch.tensor(2.0), 4); tally.add(torch.tensor(float("nan")), 2); tally.add(torch.tensor(1.0), 2)
    >>> tally.seen, tally.first_non_finite()
    (8, (2, nan))
    """

    def __init__(self, device: torch.device):
        self.total = torch.zeros((), dtype=torch.float64, device=device)
        self.first_bad_step = torch.zeros((), dtype=torch.int64, device=device)
        self.first_bad_value = torch.zeros((), dtype=torch.float64, device=device)
        self.steps = 0
        self.seen = 0

    def add(self, loss: torch.Tensor, batch_size: int) -> None:
        """Count one step's scalar ``loss`` over ``batch_size`` images."""
        value = loss.detach().double()
        self.steps += 1
        self.seen += batch_size
        self.total += value * batch_size
        newly_bad = ~torch.isfinite(value) & (self.first_bad_step == 0)
        self.first_bad_step = torch.where(newly_bad, self.steps, self.first_bad_step)
        self.first_bad_value = torch.where(newly_bad, value, self.first_bad_value)

    def mean(self) -> float:
        """The mean loss per image so far (0 before the first step)."""
        return self.total.item() / max(self.seen, 1)

    def first_non_finite(self) -> tuple[int, float] | None:
        """(1-based step, its loss) of the first NaN or infinite loss, or None."""
        step = int(self.first_bad_step.item())
        return (step, self.first_bad_value.item()) if step else None


class NonFiniteLossError(DmlbenchError, RuntimeError):
    """The training loss became NaN or infinite."""


class NonFiniteWeightsError(DmlbenchError, RuntimeError):
    """A parameter or buffer (e.g. a BatchNorm running variance) became NaN or infinite: the run diverged."""


def non_finite_tensors(*modules: nn.Module) -> list[str]:
    """Names of the parameters and buffers of ``modules`` that hold a NaN or an infinity."""
    return [
        name
        for module in modules
        for name, tensor in (*module.named_parameters(), *module.named_buffers())
        if tensor.is_floating_point() and not torch.isfinite(tensor).all()
    ]


@dataclass
class EpochStats:
    """What one pass over an epoch's batches did.

    Attributes:
        mean_loss: mean training loss per image.
        images: images trained on.
        step_seconds: wall time of the batches alone (s): loading, augmentation, forward, backward, step.
        loader_wait_seconds: the part of ``step_seconds`` spent waiting for the loader (s).
    """

    mean_loss: float
    images: int
    step_seconds: float
    loader_wait_seconds: float


@dataclass
class TrainResult:
    """What :func:`train_run` returns: the selected epoch and its selection score."""

    best_epoch: int
    best_score: float
    epochs_run_now: int


def resolve_device(name: str) -> torch.device:
    """``auto`` → CUDA when available, else CPU; otherwise the named device, which must exist here.
    A numbered CUDA device (``cuda:K``, e.g. a claimed slot) becomes the current CUDA device.

    Raises:
        ConfigError: ``training.device`` is not a device name, or names a device this machine lacks.
    """
    if name == "auto":
        return torch.device("cuda" if torch.cuda.is_available() else "cpu")
    try:
        device = torch.device(name)
    except RuntimeError as err:
        raise ConfigError(
            f"training.device = {name!r} is not a device name; use auto, cpu, cuda, cuda:N or mps"
        ) from err
    available = {"cpu": 1, "cuda": torch.cuda.device_count(), "mps": int(torch.backends.mps.is_available())}
    count = available.get(device.type, 0)
    if (device.index or 0) >= count:
        raise ConfigError(
            f"training.device = {name!r}, but this machine has {count} {device.type} device(s); "
            f"set training.device: auto (CUDA when present, else CPU) or cpu"
        )
    if device.type == "cuda" and device.index is not None:
        torch.cuda.set_device(device)  # "cuda" alone (e.g. MPN's kNN, torch's evaluation search) means this GPU too
    return device


def place_model(model: nn.Module, channels_last: bool, device: torch.device) -> nn.Module:
    """``model`` on ``device``, in the channels-last memory format when ``channels_last``
    (``training.channels_last``) is true.

    Channels-last changes only how convolution weights are laid out in memory (the values are the same;
    sums may round differently), and it is what makes the CPU's convolutions fast: EfficientNet-Lite0
    trains at 80 instead of 38 img/s at 128 px on one core, small_cnn at 4,000 instead of 3,400 at 56 px
    (``benchmarks/bench_backbones.py --channels-last``).
    """
    model = model.to(device)
    return model.to(memory_format=torch.channels_last) if channels_last else model


def _snapshot(model: nn.Module) -> dict[str, torch.Tensor]:
    """A CPU copy of ``model``'s state dict (the weights a checkpoint keeps)."""
    return {k: v.detach().cpu().clone() for k, v in model.state_dict().items()}


def _write_log(rows: list[dict[str, float]], path: Path) -> None:
    """One row per epoch: :data:`LOG_COLUMNS`, then the optional and recipe columns in the order
    they first appear; a metric that was not computed (NaN) is an empty cell."""
    extra = [key for row in rows for key in row if key not in LOG_COLUMNS]
    columns = [*LOG_COLUMNS, *dict.fromkeys(extra)]
    write_text_atomic(path, pd.DataFrame(rows, columns=columns).to_csv(index=False, lineterminator="\n"))


def recall_at_1(
    recipe: Recipe,
    model: nn.Module,
    dataset,
    split: np.ndarray | None,
    batch_size: int,
    device: torch.device,
    num_workers: int = 0,
) -> float:
    """R@1 of the recipe's test-time embedding of ``dataset`` (query/gallery when ``split`` has them)."""
    embeddings = recipe.embed(model, dataset, batch_size, device, num_workers)
    query_gallery = split if split is not None and "query" in set(split) else None
    return recall_at_k(embeddings, dataset.labels, [1], split=query_gallery)[1]


class Trainer:
    """Trains one run. Use :func:`train_run` unless you need the pieces.

    Args:
        run: resolved run (:func:`dmlbench.config.resolve_run`); its settings are parsed once, by the recipe
            (:attr:`settings`), and the mapping is what the checkpoint records.
        data: its datasets.
        out_dir: where ``checkpoint.pt`` (selected weights) and ``log.csv`` go.
        scratch_dir: where the per-epoch resume checkpoint lives (not a workflow output).
        device: torch device.
        progress: show a progress bar with loss and throughput.
        manifest: the file ``data`` was read from: its path and SHA-256 go into the resume state and
            ``checkpoint.pt``, and a resume state from another manifest is refused. None (data built in
            memory): nothing is recorded or checked.
    """

    def __init__(
        self,
        run: Mapping[str, Any],
        data: RunData,
        out_dir: Path,
        scratch_dir: Path,
        device: torch.device,
        progress: bool = True,
        manifest: Path | None = None,
    ):
        self.run = dict(run)
        self.recipe: Recipe = build_recipe(self.run)
        self.settings: TrainingSettings = self.recipe.settings
        self.data = data
        self.out_dir = Path(out_dir)
        self.scratch = Path(scratch_dir) / "last.pt"
        self.device = device
        self.progress = progress
        self.digest = config_digest(self.run)
        self.manifest = manifest
        self.manifest_entries = manifest_entries(manifest) if manifest is not None else {}
        settings = self.settings
        if settings.selection == "val" and data.val is None:
            raise ValueError("training.selection is 'val' but training.val_fraction is 0: no validation split")
        self.selection = settings.selection

        configure_determinism(settings.deterministic, device)
        seed_everything(derive_seed(run["seed"], "init"))
        self.model = place_model(self.recipe.build_model(), settings.channels_last, device)
        self.loss = self.recipe.build_loss(data.num_classes).to(device)
        self.optimizer = build_optimizer(settings.optimizer, self.model, self.loss)
        self.scheduler = build_scheduler(settings.schedule, self.optimizer, settings.epochs)
        self.scaler = torch.amp.GradScaler(device.type, enabled=device.type == "cuda" and settings.amp)
        self.log: list[dict[str, float]] = []
        self.kernel_warnings = KernelWarnings()
        self.init_parity: dict[str, float] = {}
        self.best_score = -math.inf
        self.best_epoch = 0
        self.best_state: dict[str, torch.Tensor] = {}
        self.start_epoch = 1
        self.context = TrainContext(
            data=data, device=device, eval_batch_size=settings.eval_batch_size, num_workers=settings.num_workers
        )
        self._persistent_loader: DataLoader | None = None

    def set_batches_per_epoch(self, batches: int | None) -> None:
        """Train ``batches`` batches per epoch from the next epoch on (``training.sampler.batches_per_epoch``;
        None: the sampler's own count), for the trainer and its recipe alike: a benchmark times a fixed
        number of steps with a run's own trainer. The checkpoint and the digest still record the run as given."""
        sampler = dataclasses.replace(self.settings.sampler, batches_per_epoch=batches)
        self.settings = dataclasses.replace(self.settings, sampler=sampler)
        self.recipe.settings = self.settings

    # --- resume ---------------------------------------------------------------------------
    def _scratch_state(self, epoch: int) -> dict[str, Any]:
        return {
            "digest": self.digest,
            "epoch": epoch,
            "model": self.model.state_dict(),
            "loss": self.loss.state_dict(),
            "optimizer": self.optimizer.state_dict(),
            "scheduler": self.scheduler.state_dict(),
            "scaler": self.scaler.state_dict(),
            "log": self.log,
            "best_score": self.best_score,
            "best_epoch": self.best_epoch,
            "best_state": self.best_state,
            "recipe": self.recipe.state_dict(),
            "warnings": self.kernel_warnings.seen,
            "init_parity": self.init_parity,
            **self.manifest_entries,
        }

    def try_resume(self) -> bool:
        """Continue from the scratch checkpoint when it belongs to this exact configuration.

        Raises:
            ManifestMismatchError: the scratch checkpoint was trained on another manifest's data.
        """
        if not self.scratch.is_file():
            return False
        state = load_checkpoint(
            self.scratch,
            remedy="it is this run's resume checkpoint (a write cut short?): "
            "delete it to train the run from its first epoch",
            required=RESUME_CHECKPOINT_KEYS,
        )
        if state.get("digest") != self.digest:
            tqdm.write(f"[dmlbench] {self.scratch}: left by a different configuration; starting afresh")
            return False
        if self.manifest is not None:
            check_manifest(
                state,
                self.scratch,
                self.manifest,
                retry="resume",
                restart=f"delete {self.scratch} to train from epoch 1 on {self.manifest}",
            )
        self.model.load_state_dict(state["model"])
        self.loss.load_state_dict(state["loss"])
        self.optimizer.load_state_dict(state["optimizer"])
        self.scheduler.load_state_dict(state["scheduler"])
        self.scaler.load_state_dict(state["scaler"])
        self.log = list(state["log"])
        self.best_score, self.best_epoch = state["best_score"], state["best_epoch"]
        self.best_state = state["best_state"]
        self.recipe.load_state_dict(state.get("recipe", {}))
        self.kernel_warnings = KernelWarnings(state.get("warnings", []))
        self.init_parity = dict(state.get("init_parity", {}))
        self.start_epoch = state["epoch"] + 1
        tqdm.write(f"[dmlbench] resuming from {self.scratch} after epoch {state['epoch']}")
        return True

    # --- one epoch ------------------------------------------------------------------------
    def train_epoch(self, epoch: int) -> EpochStats:
        """One pass of the epoch's batches, after the recipe's epoch hook (not included in ``step_seconds``)."""
        seed = derive_seed(self.run["seed"], "epoch", epoch)
        seed_everything(seed)
        self.recipe.on_epoch_start(epoch, self.model, self.context)
        sampler = self.recipe.build_sampler(self.data.train.labels, torch.Generator().manual_seed(seed))
        train = self.data.train
        loader = self._epoch_loader(sampler, derive_seed(seed, "workers"))
        augment = torch.Generator().manual_seed(derive_seed(seed, "device_augment"))
        self.model.train()
        losses = LossTally(self.device)
        bar = tqdm(
            loader,
            desc=f"epoch {epoch}/{self.settings.epochs}",
            disable=not self.progress,
            leave=False,
            dynamic_ncols=True,
        )
        started = time.perf_counter()
        waits = WaitClock(bar)
        for images, labels, indices in waits:
            images = train.to_model_input(images.to(self.device, non_blocking=True), indices, augment)
            labels = labels.to(self.device, non_blocking=True)
            with torch.autocast(self.device.type, enabled=self.scaler.is_enabled()):
                loss = self.recipe.training_loss(self.model, self.loss, images, labels, indices)
            self.optimizer.zero_grad(set_to_none=True)
            self.scaler.scale(loss).backward()
            self.scaler.step(self.optimizer)
            self.scaler.update()
            losses.add(loss, len(labels))
            if self.progress:  # reading the running mean waits for the GPU: only for a watched bar
                bar.set_postfix(
                    loss=f"{losses.mean():.4f}", img_s=f"{losses.seen / (time.perf_counter() - started):.0f}"
                )
        mean_loss = losses.mean()  # the epoch's one wait for the GPU's queued steps
        step_seconds = time.perf_counter() - started
        first_bad = losses.first_non_finite()
        if first_bad is not None:
            step, value = first_bad
            raise NonFiniteLossError(
                f"{self.run['dataset']}/{self.run['method']}/seed{self.run['seed']}: loss is {value} "
                f"at epoch {epoch}, batch {step} (nothing of this epoch was saved). Lower training.optimizer.lr, "
                f"check the loss hyperparameters (methods.{self.run['method']}.loss), or the input images."
            )
        self.scheduler.step()
        return EpochStats(mean_loss, losses.seen, step_seconds, waits.seconds)

    def _epoch_loader(self, sampler: Iterable[list[int]], worker_seed: int) -> DataLoader:
        """The training loader over this epoch's ``sampler`` batches.

        A training set whose items draw nothing random in the workers (``random_in_workers`` false: the
        decoded_uint8 store, whose crops are drawn on the device) keeps one loader, and so its worker
        processes, for the whole run: only the batches change. Otherwise the workers start afresh every
        epoch, seeded from ``worker_seed``, so that their random transforms depend on the epoch alone.
        """
        train = self.data.train
        workers = self.settings.num_workers
        common: dict[str, Any] = dict(
            num_workers=workers, collate_fn=train.collate_fn, pin_memory=self.device.type == "cuda"
        )
        if workers == 0 or train.random_in_workers:
            generator = torch.Generator().manual_seed(worker_seed)
            return DataLoader(train, batch_sampler=sampler, generator=generator, **common)
        if self._persistent_loader is None:
            self._persistent_loader = DataLoader(train, batch_sampler=EpochBatches(), persistent_workers=True, **common)
        cast(EpochBatches, self._persistent_loader.batch_sampler).current = sampler
        return self._persistent_loader

    def _check_finite(self, epoch: int) -> None:
        """Stop before anything of a diverged epoch is saved: a finite loss (an L2-normalised one stays
        finite) does not show that the weights and BatchNorm statistics are."""
        bad = non_finite_tensors(self.model, self.loss)
        if bad:
            listed = ", ".join(bad[:5]) + (f" and {len(bad) - 5} more" if len(bad) > 5 else "")
            raise NonFiniteWeightsError(
                f"{self.run['dataset']}/{self.run['method']}/seed{self.run['seed']}: the run diverged in epoch "
                f"{epoch}: {listed} hold NaN or inf (nothing of this epoch was saved). Lower "
                f"training.optimizer.lr (now {self.settings.optimizer.lr}) or the method's lr multipliers."
            )

    def _train_recall1(self, batch: int) -> float:
        """R@1 on the training images with the test transform (``training.log_train_recall``), for
        train-vs-test curves; the training rows are the same every epoch."""
        # RunData's train and test are datasets of one class; mypy sees each as either class
        clean = self.data.train.evaluation_view(self.data.test)  # type: ignore[arg-type]
        return recall_at_1(self.recipe, self.model, clean, None, batch, self.device, self.settings.num_workers)

    def _score(self, val_r1: float, test_r1: float, epoch: int) -> float:
        return {"val": val_r1, "test": test_r1, "last": float(epoch)}[self.selection]

    def measure_init_parity(self) -> dict[str, float]:
        """Validation R@1 before the first step: the run's test-time embedding, the same backbone with the
        plain baselines' linear head (mean and lowest draw), the gap to the mean and the shortfall below
        the lowest draw (fractions; the report checks the shortfall).

        The reference is the mean R@1 over :data:`INIT_PARITY_HEAD_DRAWS` seeded draws of that head on
        the backbone's pooled validation features: one draw alone varies by ~0.7 points (std; CUB under
        cub_lite: 0.750–0.770 over 12 draws), so a single draw, the baseline's own included, can sit
        2 points from another by chance. The global RNG is reseeded at every epoch's start, so nothing
        here changes the training.
        """
        val = self.data.val
        if val is None:
            raise RuntimeError("the init parity is measured on the validation rows: training.val_fraction is 0")
        batch, workers = self.settings.eval_batch_size, self.settings.num_workers
        method_r1 = recall_at_1(self.recipe, self.model, val, None, batch, self.device, workers)
        seed_everything(derive_seed(self.run["seed"], "init"))  # the run's own backbone, also when not pretrained
        backbone = place_model(build_backbone(self.settings.backbone.section), self.settings.channels_last, self.device)
        pooled = torch.from_numpy(compute_embeddings(backbone, val, batch, self.device, workers))
        draws = []
        for draw in range(INIT_PARITY_HEAD_DRAWS):
            seed_everything(derive_seed(self.run["seed"], "init_parity_head", draw))
            head = LinearEmbedding(pooled.shape[1], self.settings.embedding_dim)
            with torch.no_grad():
                embedded = head(pooled).numpy()
            draws.append(recall_at_k(embedded, val.labels, [1])[1])
        reference_r1 = float(np.mean(draws))
        tqdm.write(
            f"[dmlbench] at init: val R@1 {method_r1:.4f}; the same backbone with a linear head "
            f"{reference_r1:.4f} (mean of {INIT_PARITY_HEAD_DRAWS} draws, {min(draws):.4f}–{max(draws):.4f})"
        )
        return {
            INIT_VAL_R1_KEY: method_r1,
            INIT_LINEAR_HEAD_VAL_R1_KEY: reference_r1,
            INIT_LINEAR_HEAD_LOWEST_KEY: min(draws),
            INIT_GAP_KEY: reference_r1 - method_r1,
            INIT_SHORTFALL_KEY: min(draws) - method_r1,
        }

    def fit(self, on_epoch_end: Callable[[int], None] | None = None) -> TrainResult:
        """Train the remaining epochs, then write ``checkpoint.pt`` and ``log.csv`` and clear the scratch file.

        Args:
            on_epoch_end: called with the epoch number after its scratch checkpoint is saved
                (tests use it to simulate an interruption).
        """
        batch = self.settings.eval_batch_size
        epochs = self.settings.epochs
        first = self.start_epoch
        if first == 1 and epochs > 0 and self.data.val is not None:
            self.init_parity = self.measure_init_parity()
        for epoch in range(first, epochs + 1):
            lr = self.optimizer.param_groups[0]["lr"]
            started = time.perf_counter()
            with self.kernel_warnings.watch(f"epoch {epoch}"):
                stats = self.train_epoch(epoch)
                seconds = time.perf_counter() - started
                self._check_finite(epoch)
                workers = self.settings.num_workers
                val_r1 = (
                    recall_at_1(self.recipe, self.model, self.data.val, None, batch, self.device, workers)
                    if self.data.val
                    else math.nan
                )
                test_r1 = (
                    recall_at_1(
                        self.recipe, self.model, self.data.test, self.data.test_split, batch, self.device, workers
                    )
                    if self.selection == "test" or self.settings.log_test_recall
                    else math.nan
                )
            row = {
                "epoch": epoch,
                "loss": stats.mean_loss,
                "val_R@1": val_r1,
                "test_R@1": test_r1,
                "lr": lr,
                "seconds": seconds,
                "images_per_s": stats.images / seconds,
                "loader_wait_share": stats.loader_wait_seconds / seconds,
            }
            if self.settings.log_train_recall:
                row["train_R@1"] = self._train_recall1(batch)
            self.log.append({**row, **self.recipe.epoch_log()})
            score = self._score(val_r1, test_r1, epoch)
            if score > self.best_score:
                self.best_score, self.best_epoch = score, epoch
                self.best_state = _snapshot(self.model)
            tqdm.write(
                f"[dmlbench] epoch {epoch}/{epochs} loss {stats.mean_loss:.4f} val R@1 {val_r1:.4f} "
                f"{stats.images / seconds:.0f} img/s, {stats.loader_wait_seconds / seconds:.0%} of it "
                f"waiting for the loader"
            )
            atomic_torch_save(self._scratch_state(epoch), self.scratch)
            if on_epoch_end is not None:
                on_epoch_end(epoch)
        self._persistent_loader = None  # stops its workers
        if epochs == 0:  # nothing to train (a reference row): the checkpoint holds the initial weights
            self.best_state = _snapshot(self.model)
        self._finish()
        return TrainResult(self.best_epoch, self.best_score, epochs + 1 - first)

    def _finish(self) -> None:
        self.out_dir.mkdir(parents=True, exist_ok=True)
        _write_log(self.log, self.out_dir / "log.csv")
        atomic_torch_save(
            {
                "run": self.run,
                "digest": self.digest,
                "model": self.best_state,
                "loss": self.loss.state_dict(),
                "num_classes": self.data.num_classes,
                "selected_epoch": self.best_epoch,
                "selection": self.selection,
                "selection_score": self.best_score,
                "summary": {**self.recipe.summary(), **self.init_parity, **paper_protocol_selection(self.log)},
                "device": str(self.device),
                "nondeterministic_ops": self.kernel_warnings.nondeterministic_ops(),
                **self.manifest_entries,
            },
            self.out_dir / "checkpoint.pt",
        )
        self.scratch.unlink(missing_ok=True)


def paper_protocol_selection(log: list[dict[str, float]]) -> dict[str, float]:
    """The papers' protocol beside ours: the best per-epoch test R@1 and its epoch (``test_selected/R@1``,
    ``test_selected/epoch``), from a log with ``test_R@1`` (``training.log_test_recall``); empty otherwise.

    The run's own checkpoint is still the validation-selected one; these two numbers say what picking the
    epoch on the test set would have reported instead (REFERENCE.md: what the papers' code does).

    >>> log = [{"epoch": 1, "test_R@1": 0.5}, {"epoch": 2, "test_R@1": 0.625}, {"epoch": 3, "test_R@1": 0.6}]
    >>> paper_protocol_selection(log)
    {'test_selected/R@1': 0.625, 'test_selected/epoch': 2.0}
    >>> paper_protocol_selection([{"epoch": 1, "test_R@1": float("nan")}])
    {}
    """
    logged = [row for row in log if not math.isnan(row.get("test_R@1", math.nan))]
    if not logged:
        return {}
    best = max(logged, key=lambda row: row["test_R@1"])  # the first of equal scores, as the selection keeps
    return {"test_selected/R@1": float(best["test_R@1"]), "test_selected/epoch": float(best["epoch"])}


def train_run(
    run: Mapping[str, Any],
    manifest_path: str | Path,
    out_dir: str | Path,
    scratch_dir: str | Path,
    progress: bool = True,
    on_epoch_end: Callable[[int], None] | None = None,
    configs: Sequence[str | Path] = (),
) -> TrainResult:
    """Train one run end to end (resuming from ``scratch_dir`` when possible). Once its data and model are
    built and its resume checkpoint read, before any step, the resolved run goes to ``scratch_dir/run.yaml``
    (``configs``: the parameter files it was resolved from, named in the file's header), and with the
    finished run's other files to ``out_dir/run.yaml``: the run folder holds only finished runs' files."""
    with claim_device(training_settings(run).device) as name:  # its own GPU slot when several GPUs are shared
        device = resolve_device(name)
        trainer = Trainer(
            run,
            load_run_data(run, manifest_path),
            Path(out_dir),
            Path(scratch_dir),
            device,
            progress,
            manifest=Path(manifest_path),
        )
        trainer.try_resume()
        settings = run_yaml_text(run, configs)
        write_text_atomic(Path(scratch_dir) / RUN_FILE, settings)
        result = trainer.fit(on_epoch_end)
        write_text_atomic(Path(out_dir) / RUN_FILE, settings)
        (Path(scratch_dir) / RUN_FILE).unlink()
        return result
