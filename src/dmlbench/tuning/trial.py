"""A trial's evaluation: for each fold, train the tuned entry with the trial's values on the other folds'
classes and score the held-out fold; the trial's score is the mean (:class:`~.study.TrialOutcome`).

Each fold's run is an ordinary training (:class:`~dmlbench.training.trainer.Trainer`) of the run that the
tuned table will train, ``<method>_tuned`` with the trial's values as its per-dataset settings
(:func:`trial_run`), seeded by ``tuning.seed``. It keeps its last epoch, as the tuned run will, and is then
scored by ``tuning.metric`` on the held-out fold. Its resume checkpoint and its finished score live in
``<scratch>/<values digest>/fold<f>/``, so a killed job loses at most the epoch it was in: the interrupted
trial is queued again with the same values (:func:`~.study.requeue_interrupted`), its finished folds are
read back and its running fold resumes. The folder is removed once the trial is scored.
"""

from __future__ import annotations

import json
import shutil
import time
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
import pandas as pd
import torch

from dmlbench.atomic import write_text_atomic
from dmlbench.config import deep_merge, resolve_run
from dmlbench.evaluation.retrieval import build_task, retrieval_metrics
from dmlbench.evaluation.validation import check_embeddings
from dmlbench.settings import evaluation_settings, training_settings
from dmlbench.training.checkpoint import config_digest
from dmlbench.training.data import RunData
from dmlbench.training.trainer import NonFiniteLossError, NonFiniteWeightsError, Trainer
from dmlbench.tuning.entries import tuned_name, tuned_overlay
from dmlbench.tuning.folds import fold_data
from dmlbench.tuning.study import TrialOutcome, TuneSetup

#: a finished fold's score, beside its run (read back when an interrupted trial is evaluated again).
SCORE_FILE = "score.json"


def trial_run(config: Mapping[str, Any], setup: TuneSetup, values: Mapping[str, Any]) -> dict[str, Any]:
    """The resolved run of ``<method>_tuned`` on the dataset with the trial's ``values`` (dotted key → value)
    as its per-dataset settings, seeded by ``tuning.seed``; ``config`` holds no best settings for it."""
    overlaid = deep_merge(config, tuned_overlay(setup.dataset, setup.method, values))
    return resolve_run(overlaid, setup.dataset, tuned_name(setup.method), setup.seed)


def fold_score(trainer: Trainer, data: RunData, metric: str) -> float:
    """``metric`` (``R@1`` or ``MAP@R``) of the trained model's test-time embedding of the held-out fold (the
    data's evaluation slot), each image querying all the others."""
    settings = trainer.settings
    embeddings = trainer.recipe.embed(
        trainer.model, data.test, settings.eval_batch_size, trainer.device, settings.num_workers
    )
    task = build_task(np.asarray(data.test.labels), None)
    metrics = retrieval_metrics(
        check_embeddings(embeddings),
        task,
        [1],
        evaluation_settings(trainer.run).chunk_size,
        with_map_at_r=metric != "R@1",
    )
    return float(metrics[metric])


@dataclass
class FoldEvaluation:
    """Evaluates trials of ``setup`` on the class-disjoint ``folds`` of the training ``rows``.

    Attributes:
        config: the expanded parameters, without best settings for the tuned entry.
        setup: what is tuned.
        rows: the manifest's training rows (:func:`~.folds.training_rows`), all a trial may read.
        folds: the folds' classes (:func:`~.folds.class_folds`).
        manifest: the manifest file (its bytes are recorded in and checked against resume checkpoints).
        scratch: the folder of the trials' resume checkpoints and finished fold scores.
        device: the torch device the runs train on.
        progress: show the training's progress bars.
    """

    config: Mapping[str, Any]
    setup: TuneSetup
    rows: pd.DataFrame
    folds: Sequence[np.ndarray]
    manifest: Path
    scratch: Path
    device: torch.device
    progress: bool = False

    def __call__(self, values: dict[str, Any]) -> TrialOutcome:
        """Train and score every fold (:class:`TrialOutcome`); a run that diverges ends the trial."""
        started = time.perf_counter()
        run = trial_run(self.config, self.setup, values)
        folder = self.scratch / config_digest({"run": run, "values": values})[:16]
        scores: list[float] = []
        for fold in range(len(self.folds)):
            fold_dir = folder / f"fold{fold}"
            score = self._finished_score(fold_dir, run)
            if score is None:
                try:
                    score = self._train_fold(run, fold, fold_dir)
                except (NonFiniteLossError, NonFiniteWeightsError) as err:
                    shutil.rmtree(folder, ignore_errors=True)
                    return TrialOutcome(scores, diverged=str(err), seconds=time.perf_counter() - started)
            scores.append(score)
        shutil.rmtree(folder, ignore_errors=True)
        return TrialOutcome(scores, seconds=time.perf_counter() - started)

    def _train_fold(self, run: Mapping[str, Any], fold: int, fold_dir: Path) -> float:
        """Train fold ``fold``'s run (resuming its checkpoint), score it and record the score."""
        data = fold_data(self.rows, training_settings(run), self.folds, fold)
        trainer = Trainer(
            run, data, fold_dir / "run", fold_dir / "resume", self.device, self.progress, manifest=self.manifest
        )
        trainer.try_resume()
        trainer.fit()
        score = fold_score(trainer, data, self.setup.metric)
        write_text_atomic(fold_dir / SCORE_FILE, json.dumps({"run": config_digest(run), "score": score}))
        return score

    @staticmethod
    def _finished_score(fold_dir: Path, run: Mapping[str, Any]) -> float | None:
        """The recorded score of a fold that finished for this very run, else None."""
        path = fold_dir / SCORE_FILE
        if not path.is_file():
            return None
        recorded = json.loads(path.read_text())
        return float(recorded["score"]) if recorded.get("run") == config_digest(run) else None
