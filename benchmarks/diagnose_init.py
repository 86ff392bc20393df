"""Diagnose methods at initialisation on real data: what they do to the features before training.

For each method, built exactly as its run would be (params.yaml + overlays) with its pretrained
weights, this prints:

- ``health/init_val_r1``: R@1 of the method's test-time embedding on the validation classes
  *before any step*, ``health/init_val_r1_linear_head`` that of the same backbone with the plain
  baselines' linear head, and ``health/init_gap`` their difference — a method whose new modules
  (attention, masks, crops) destroy the pretrained features starts below; a run records the same
  three numbers in metrics.json, and the report marks a gap above 0.02;
- the loss terms of a few training batches (the recipe's ``epoch_log``), e.g. ABE's metric
  and divergence losses, so their scales at init can be compared;
- the gradient norm of each optimiser parameter group (backbone, head, loss, method-specific groups)
  after those batches, i.e. who the first updates move.

It is the first check to run when a method lands below its baseline (docs/results.md). Usage::

    OMP_NUM_THREADS=1 python benchmarks/diagnose_init.py --config params.yaml \\
        --config workflow/overlays/cub_lite.yaml --dataset cub200 --methods margin abe8 --threads 1
"""

from __future__ import annotations

import argparse
import tempfile
from collections.abc import Mapping
from pathlib import Path
from typing import Any

import torch

from dmlbench.config import resolve_run
from dmlbench.layout import manifest_path
from dmlbench.params import load_config
from dmlbench.training.data import load_run_data
from dmlbench.training.trainer import Trainer


def diagnose(run: Mapping[str, Any], manifest: str, batches: int) -> dict[str, float]:
    """Validation R@1 at init, the recipe's loss terms and each parameter group's gradient norm.

    The recipe, model, loss and optimiser are the :class:`Trainer`'s own (built exactly as the run
    builds them); nothing is written.
    """
    data = load_run_data(run, manifest)
    with tempfile.TemporaryDirectory() as scratch:
        trainer = Trainer(run, data, Path(scratch) / "out", Path(scratch), torch.device("cpu"), progress=False)
    recipe, model = trainer.recipe, trainer.model
    row: dict[str, float] = {}
    if data.val is not None:  # the numbers the run records as health/init_* (the same function)
        row.update(trainer.measure_init_parity())
    recipe.on_epoch_start(1, model, trainer.context)
    model.train()
    sampler = recipe.build_sampler(data.train.labels, torch.Generator().manual_seed(run["seed"]))
    trainer.optimizer.zero_grad(set_to_none=True)
    total = 0.0
    for step, rows in enumerate(sampler):
        if step == batches:
            break
        items = [data.train[i] for i in rows]
        images = torch.stack([image for image, _, _ in items])
        labels = torch.stack([label for _, label, _ in items])
        value = recipe.training_loss(model, trainer.loss, images, labels, torch.as_tensor(rows))
        (value / batches).backward()
        total += value.item() / batches
    row["loss"] = total
    row.update({k: v for k, v in recipe.epoch_log().items() if not k.startswith("health/")})
    for group in trainer.optimizer.param_groups:
        grads = [p.grad.norm() ** 2 for p in group["params"] if p.grad is not None]
        row[f"grad_norm/{group.get('name', '?')}"] = float(torch.stack(grads).sum().sqrt()) if grads else 0.0
    return row


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--config", action="append", help="params file(s); default params.yaml")
    parser.add_argument("--dataset", required=True)
    parser.add_argument("--manifest", default=None, help="default data/prepared/DATASET/manifest.csv")
    parser.add_argument("--methods", nargs="+", required=True)
    parser.add_argument("--batches", type=int, default=4, help="training batches whose gradients are summed")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--threads", type=int, default=None, help="torch.set_num_threads")
    args = parser.parse_args()
    if args.threads is not None:
        torch.set_num_threads(args.threads)
    config = load_config(args.config or ["params.yaml"])
    manifest = args.manifest or manifest_path(args.dataset)
    for method in args.methods:
        row = diagnose(resolve_run(config, args.dataset, method, args.seed), manifest, args.batches)
        print(f"{method}: " + ", ".join(f"{k} {v:.4g}" for k, v in row.items()), flush=True)


if __name__ == "__main__":
    main()
