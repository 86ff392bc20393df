"""One tune job, ``dmlbench tune --dataset D --method M``: the study of M on D, resumed if it exists, run to the
budget, then ``best.yaml`` and ``trials.csv`` written (atomically, together) beside its journal.

    results/tuning/<dataset>/<method>/
        study.journal   the Optuna study (every trial, as it happens; a killed job resumes from it)
        best.yaml       the best trial's values: a parameter overlay for <method>_tuned on <dataset>
        trials.csv      every trial: number, state, score, each fold's score, values, seconds

The job reads the manifest's training rows only (:func:`~.folds.training_rows`).
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from dmlbench.atomic import atomic_outputs, exclusive_lock
from dmlbench.config import resolve_run
from dmlbench.models.backbones.weights import sha256_of
from dmlbench.placement import claim_device
from dmlbench.settings import training_settings
from dmlbench.training.trainer import resolve_device
from dmlbench.tuning.entries import tuned_name, untuned
from dmlbench.tuning.folds import class_folds, training_rows
from dmlbench.tuning.study import (
    BEST_FILE,
    STUDY_FILE,
    TRIALS_FILE,
    TuneSetup,
    best_trial,
    best_yaml_text,
    completed_trials,
    open_study,
    requeue_interrupted,
    run_study,
    trials_frame,
)
from dmlbench.tuning.trial import FoldEvaluation

#: held while a job works on a study: a second job of the same (dataset, method) waits.
LOCK_FILE = "study.lock"


@dataclass(frozen=True)
class TuneResult:
    """A finished tune job: its outputs, the number of completed trials and the best score."""

    best: Path
    trials: Path
    completed: int
    best_score: float


def tune(
    config: Mapping[str, Any],
    dataset: str,
    method: str,
    manifest: str | Path,
    out_dir: str | Path,
    scratch_dir: str | Path,
    progress: bool = False,
    report: Callable[[str], None] = print,
) -> TuneResult:
    """Run (or resume) the study of ``method`` on ``dataset`` to ``tuning.trials`` completed trials.

    Args:
        config: the expanded parameters (:func:`dmlbench.params.load_config`).
        manifest: the dataset's manifest; only its ``train`` rows are read.
        out_dir: the job's folder (``results/tuning/<dataset>/<method>``).
        scratch_dir: the trials' resume checkpoints (not an output).
        progress: show the trainings' progress bars.
        report: where progress lines go.

    Raises:
        ConfigError: the method is not tuned by any table, or its space does not fit the run.
    """
    setup = TuneSetup.from_config(config, dataset, method)
    twin = tuned_name(method)
    base_config = untuned(config, twin)
    base_run = resolve_run(base_config, dataset, twin, setup.seed)
    manifest, out_dir = Path(manifest), Path(out_dir)
    rows = training_rows(manifest)
    folds = class_folds(rows["label"].unique(), setup.folds, setup.seed)
    with exclusive_lock(out_dir / LOCK_FILE), claim_device(training_settings(base_run).device) as device_name:
        study = open_study(out_dir / STUDY_FILE, setup.digest(base_run, sha256_of(manifest)), report)
        for number in requeue_interrupted(study):
            report(f"[dmlbench] trial {number} was interrupted: evaluating its values again first")
        evaluate = FoldEvaluation(
            base_config, setup, rows, folds, manifest, Path(scratch_dir), resolve_device(device_name), progress
        )
        run_study(study, setup, evaluate, report)
        outputs = {"best": out_dir / BEST_FILE, "trials": out_dir / TRIALS_FILE}
        with atomic_outputs(outputs) as tmp:
            tmp["best"].write_text(best_yaml_text(setup, study), encoding="utf-8")
            trials_frame(setup, study).to_csv(tmp["trials"], index=False, lineterminator="\n")
        best = best_trial(study).value
        assert best is not None  # a completed trial has its value
        return TuneResult(outputs["best"], outputs["trials"], len(completed_trials(study)), float(best))
