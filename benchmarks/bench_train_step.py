"""Benchmark: training images/s of every method of a table, one optimiser step at a time.

Builds each method of ``tables.<TABLE>`` exactly as a run would (params.yaml + overlays, the
method's options, its optimiser), feeds random P × K batches at the training crop size, and times
``recipe.training_loss`` + backward + optimiser step. Image decoding and augmentation are not
included (the image cache makes them small on CPU), nor are epoch hooks (D&C's re-clustering,
validation passes). This is the number that sizes a table's time budget and tells whether a speed
lever (``--set training.backbone.frozen_through=block3``, ``--set training.image.train_crop=112``,
``--set training.channels_last=false``) pays.

Usage::

    OMP_NUM_THREADS=1 python benchmarks/bench_train_step.py --config params.yaml \\
        --config workflow/overlays/cub_lite.yaml --dataset cub200 --threads 1 \\
        --set training.backbone.frozen_through=block3

Random backbone weights are used (``pretrained`` is unset): speed does not depend on them.
Epoch 1's hook runs first with a labels-only training set: D&C is timed in its warm-up phase
(full loss on the merged embedding; its learner phase runs the same network on one learner's
slice). On CUDA, ``training.amp`` applies as in the trainer.
"""

from __future__ import annotations

import argparse
import copy
import statistics
import time
from types import SimpleNamespace
from typing import Any

import numpy as np
import torch
import yaml

from dmlbench.config import deep_merge, resolve_run
from dmlbench.methods import build_recipe
from dmlbench.methods.base import TrainContext
from dmlbench.params import load_config
from dmlbench.training.optim import build_optimizer
from dmlbench.training.trainer import place_model


def parse_setting(text: str) -> dict[str, Any]:
    """``a.b.c=value`` → ``{"a": {"b": {"c": value}}}`` with ``value`` read as YAML."""
    key, sep, value = text.partition("=")
    if not sep:
        raise SystemExit(f"--set {text!r}: expected KEY.PATH=VALUE")
    nested: dict[str, Any] = {}
    node = nested
    parts = key.split(".")
    for part in parts[:-1]:
        node = node.setdefault(part, {})
    node[parts[-1]] = yaml.safe_load(value)
    return nested


def train_images_per_s(run: dict[str, Any], batches: int, warmup: int, device: torch.device) -> float:
    """Images/s of ``run``'s training step over ``batches`` steps after ``warmup`` ones (under ``training.amp``
    autocast on CUDA, as the trainer runs it).

    On the CPU: the median over the steps, each timed alone. On CUDA: the steps are queued back to back,
    as the trainer queues them, on batches already on the GPU, and timed as one window from a
    synchronisation to the next (a per-step synchronisation would add the GPU's idle time between steps).
    """
    run = copy.deepcopy(run)
    options = run["method_config"].get("options") or {}
    if options.get("warmup_epochs") == 0:  # D&C clusters the training images at epoch 1: time its warm-up
        options["warmup_epochs"] = 1  # phase instead, the same network and step (see the module doc)
    recipe = build_recipe(run)
    settings = recipe.settings
    classes, per_class = settings.sampler.classes_per_batch, settings.sampler.images_per_class
    crop = settings.image.train_crop
    labels = torch.arange(classes).repeat_interleave(per_class).to(device)
    model = place_model(recipe.build_model(), settings.channels_last, device)
    loss = recipe.build_loss(100).to(device)
    optimizer = build_optimizer(settings.optimizer, model, loss)
    labels_only = SimpleNamespace(train=SimpleNamespace(labels=np.arange(len(labels)) // per_class))
    recipe.on_epoch_start(1, model, TrainContext(data=labels_only, device=device, eval_batch_size=len(labels)))
    model.train()
    generator = torch.Generator().manual_seed(0)
    indices = torch.arange(len(labels))
    scaler = torch.amp.GradScaler(device.type, enabled=device.type == "cuda" and settings.amp)
    images = [torch.rand(len(labels), 3, crop, crop, generator=generator).to(device) for _ in range(warmup + batches)]

    def step(batch: torch.Tensor) -> None:
        with torch.autocast(device.type, enabled=scaler.is_enabled()):
            value = recipe.training_loss(model, loss, batch, labels, indices)
        optimizer.zero_grad(set_to_none=True)
        scaler.scale(value).backward()
        scaler.step(optimizer)
        scaler.update()

    for batch in images[:warmup]:
        step(batch)
    if device.type == "cuda":
        torch.cuda.synchronize(device)
        start = time.perf_counter()
        for batch in images[warmup:]:
            step(batch)
        torch.cuda.synchronize(device)
        return len(labels) * batches / (time.perf_counter() - start)
    times = []
    for batch in images[warmup:]:
        start = time.perf_counter()
        step(batch)
        times.append(time.perf_counter() - start)
    return len(labels) / statistics.median(times)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--config", action="append", help="params file(s); default params.yaml")
    parser.add_argument("--table", default="table1")
    parser.add_argument("--dataset", default=None, help="default: the table's first dataset")
    parser.add_argument("--methods", nargs="+", default=None, help="default: the table's trained methods")
    parser.add_argument(
        "--set",
        action="append",
        default=[],
        metavar="KEY.PATH=VALUE",
        help="override a config key for every method (YAML value)",
    )
    parser.add_argument("--batches", type=int, default=5)
    parser.add_argument("--warmup", type=int, default=2)
    parser.add_argument("--threads", type=int, default=None, help="torch.set_num_threads")
    parser.add_argument("--device", default="cpu", help="cpu, cuda, cuda:1, ...")
    args = parser.parse_args()
    if args.threads is not None:
        torch.set_num_threads(args.threads)
    config = load_config(args.config or ["params.yaml"])
    for setting in args.set:
        config = deep_merge(config, parse_setting(setting))
    spec = config["tables"][args.table]
    dataset = args.dataset or spec["datasets"][0]
    device = torch.device(args.device)
    if device.type == "cuda":
        torch.backends.cudnn.benchmark = True
    where = torch.cuda.get_device_name(device) if device.type == "cuda" else f"{torch.get_num_threads()} thread(s)"
    print(f"# {dataset}, {where}, settings: {args.set or 'as configured'}")
    print(f"{'method':22s} {'train img/s':>12s}")
    for method in args.methods or spec["methods"]:
        run = resolve_run(config, dataset, method, 0)
        run["training"]["backbone"]["pretrained"] = None
        if run["training"]["epochs"] == 0:
            continue
        print(f"{method:22s} {train_images_per_s(run, args.batches, args.warmup, device):12.1f}", flush=True)


if __name__ == "__main__":
    main()
