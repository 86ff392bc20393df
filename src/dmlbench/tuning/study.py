"""The Optuna study of one (dataset, method): TPE, seeded, in a journal file that a killed job resumes.

- **Storage**: ``<out>/study.journal`` (Optuna's append-only journal file). Every suggested value and every
  finished trial is in it the moment it happens. A study is bound to its setup (:attr:`TuneSetup.digest`:
  the run it tunes, the space, the folds, the metric, the seeds and the manifest's bytes, not the budget);
  a journal of another setup is set aside and the study starts afresh, while a larger budget continues it.
- **Resume**: a trial that was running when the job was killed is marked failed and its values are queued
  again (:func:`requeue_interrupted`), so the next run evaluates the same point first; completed trials are
  kept and never rerun.
- **Seeded sampling**: the sampler of the ``i``-th evaluated trial is a fresh ``TPESampler`` seeded from
  ``(tuning.seed, i)`` (:func:`sampler_for`), so its values depend only on the seed and the completed
  trials: a resumed study draws what the uninterrupted one would have drawn. The first
  ``tuning.startup_trials`` values are drawn at random, the rest by TPE.
- **Budget**: trials run until ``tuning.trials`` are complete. A trial whose training diverged (NaN/inf)
  is complete with score 0 (:data:`DIVERGED_SCORE`): a setting that breaks the training is the worst
  possible, and it spends budget like any other.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import optuna
import pandas as pd
import yaml
from optuna.storages.journal import JournalFileBackend, JournalStorage
from optuna.trial import FrozenTrial, TrialState

from dmlbench.config import ConfigError, section
from dmlbench.training.checkpoint import config_digest
from dmlbench.seeding import derive_seed
from dmlbench.tuning.entries import (
    tuned_methods,
    tuned_name,
    tuned_overlay,
    tuning_settings,
)
from dmlbench.tuning.space import Range, method_space

#: the study's name inside its journal (one study per file).
STUDY_NAME = "dmlbench"
#: the journal file, the best settings and the trial history, in a tune job's folder.
STUDY_FILE = "study.journal"
BEST_FILE = "best.yaml"
TRIALS_FILE = "trials.csv"
#: bumped when the protocol (folds, scoring, sampling) changes, so that older studies are not continued.
PROTOCOL_VERSION = 1
#: the score of a trial whose training diverged: no metric is lower.
DIVERGED_SCORE = 0.0
#: the study attribute that binds a journal to its setup.
SETUP_ATTR = "setup_digest"
#: a numpy/Optuna seed is below 2**32.
_SEED_RANGE = 2**32


@dataclass(frozen=True)
class TuneSetup:
    """What a tune job searches: ``method`` on ``dataset``, its space and ``tuning``'s budget and protocol."""

    dataset: str
    method: str
    space: dict[str, Range]
    trials: int
    folds: int
    metric: str
    seed: int
    startup_trials: int

    @classmethod
    def from_config(cls, config: Mapping[str, Any], dataset: str, method: str) -> TuneSetup:
        """The setup of ``method`` on ``dataset``.

        Raises:
            ConfigError: an unknown dataset, or a method that no tuned table tunes.
        """
        section(config, "datasets", dataset)
        settings = tuning_settings(config)
        tuned = {m for table in settings.get("tables") or [] for m in tuned_methods(config, table)}
        if method not in tuned:
            raise ConfigError(
                f"method {method!r} is tuned by no table of tuning.tables (tuned: {sorted(tuned)}): "
                f"add a table that lists it to tuning.tables (its reference rows, ensembles and "
                f"re-embedded entries are not tuned)"
            )
        return cls(
            dataset,
            method,
            method_space(config, method),
            settings["trials"],
            settings["folds"],
            settings["metric"],
            settings["seed"],
            settings["startup_trials"],
        )

    def digest(self, base_run: Mapping[str, Any], manifest_sha256: str) -> str:
        """SHA-256 of everything a trial's score depends on: the protocol version, the untuned run
        (``base_run``), the space, folds, metric, seeds and the manifest's bytes. Not the budget: raising
        ``tuning.trials`` continues a study."""
        return config_digest(
            {
                "version": PROTOCOL_VERSION,
                "run": base_run,
                "manifest": manifest_sha256,
                "folds": self.folds,
                "metric": self.metric,
                "seed": self.seed,
                "startup_trials": self.startup_trials,
                "space": {key: [r.kind, r.low, r.high, r.log, list(r.choices)] for key, r in self.space.items()},
            }
        )


@dataclass(frozen=True)
class TrialOutcome:
    """A trial's evaluation: the held-out folds' scores, or why its training diverged."""

    scores: list[float]
    diverged: str = ""
    seconds: float = field(default=0.0, compare=False)

    @property
    def value(self) -> float:
        """The trial's score: the mean over the folds, or :data:`DIVERGED_SCORE`."""
        return DIVERGED_SCORE if self.diverged else float(sum(self.scores) / len(self.scores))


#: evaluates a trial's values (dotted key → value).
Evaluate = Callable[[dict[str, Any]], TrialOutcome]


def _storage(path: Path) -> JournalStorage:
    return JournalStorage(JournalFileBackend(str(path)))


def open_study(path: Path, digest: str, report: Callable[[str], None] = print) -> optuna.Study:
    """The study in the journal ``path`` (created with its folder), bound to ``digest``; a journal bound to
    another digest is renamed to ``<path>.stale`` and a new study starts."""
    path.parent.mkdir(parents=True, exist_ok=True)
    optuna.logging.set_verbosity(optuna.logging.WARNING)
    study = optuna.create_study(
        storage=_storage(path), study_name=STUDY_NAME, direction="maximize", load_if_exists=True
    )
    if study.user_attrs.get(SETUP_ATTR) not in (None, digest):
        stale = path.with_name(path.name + ".stale")
        path.replace(stale)
        report(
            f"[dmlbench] {path}: a study of another setup (run, space, folds, metric, seeds or data); moved "
            f"to {stale}, starting afresh"
        )
        study = optuna.create_study(storage=_storage(path), study_name=STUDY_NAME, direction="maximize")
    study.set_user_attr(SETUP_ATTR, digest)
    return study


def requeue_interrupted(study: optuna.Study) -> list[int]:
    """Mark every trial still running (its job was killed: one job per study holds its lock) failed and queue
    its values again, to be evaluated first; returns the failed trials' numbers."""
    interrupted = study.get_trials(deepcopy=False, states=(TrialState.RUNNING,))
    for trial in interrupted:
        study.tell(trial.number, state=TrialState.FAIL)
        study.enqueue_trial(dict(trial.params), user_attrs={"retry_of": trial.number})
    return [trial.number for trial in interrupted]


def completed_trials(study: optuna.Study) -> list[FrozenTrial]:
    """The study's completed trials, in order."""
    return study.get_trials(deepcopy=False, states=(TrialState.COMPLETE,))


def sampler_for(seed: int, index: int, startup_trials: int) -> optuna.samplers.TPESampler:
    """The sampler of the ``index``-th evaluated trial (0-based): TPE seeded from ``(seed, index)``."""
    return optuna.samplers.TPESampler(
        seed=derive_seed(seed, "tpe", index) % _SEED_RANGE, n_startup_trials=startup_trials
    )


def run_study(study: optuna.Study, setup: TuneSetup, evaluate: Evaluate, report: Callable[[str], None] = print) -> None:
    """Evaluate trials until ``setup.trials`` are complete (module doc). An exception out of ``evaluate``
    leaves its trial running, to be queued again when the job is rerun."""
    while (done := len(completed_trials(study))) < setup.trials:
        study.sampler = sampler_for(setup.seed, done, setup.startup_trials)
        trial = study.ask()
        values = {key: spec.suggest(trial) for key, spec in setup.space.items()}
        outcome = evaluate(values)
        trial.set_user_attr("fold_scores", list(outcome.scores))
        trial.set_user_attr("seconds", outcome.seconds)
        if outcome.diverged:
            trial.set_user_attr("diverged", outcome.diverged)
        study.tell(trial, outcome.value)
        report(
            f"[dmlbench] trial {trial.number} ({done + 1}/{setup.trials}): {setup.metric} {outcome.value:.4f} "
            f"{'(diverged) ' if outcome.diverged else ''}with {values}"
        )


def best_trial(study: optuna.Study) -> FrozenTrial:
    """The completed trial with the highest score (the first of equal ones)."""
    trials = completed_trials(study)
    if not trials:
        raise ConfigError("the study has no completed trial (tuning.trials is at least 1)")
    return max(trials, key=lambda trial: (trial.value, -trial.number))


def best_yaml_text(setup: TuneSetup, study: optuna.Study) -> str:
    """best.yaml: a parameter overlay giving ``<method>_tuned`` the best trial's values on the dataset, under a
    comment that states how they were found."""
    best = best_trial(study)
    folds = ", ".join(f"{score:.4f}" for score in best.user_attrs.get("fold_scores", []))
    header = (
        f"# Equal-budget tuning of {setup.method} on {setup.dataset} (`dmlbench tune`, docs/tuning.md): the\n"
        f"# best of {len(completed_trials(study))} trials (Optuna TPE, seed {setup.seed}, the first "
        f"{setup.startup_trials} at random), each scored by\n"
        f"# the mean {setup.metric} on the held-out fold over {setup.folds} class-disjoint folds of the "
        f"training classes (the test split is never read).\n"
        f"# Best: trial {best.number}, {setup.metric} {best.value:.4f} (folds: {folds or 'diverged'}).\n"
        f"# A parameter overlay: the runs of {tuned_name(setup.method)} train with it "
        f"(`dmlbench train ... --config <this file>`).\n"
    )
    values = {key: best.params[key] for key in setup.space}
    return header + yaml.safe_dump(tuned_overlay(setup.dataset, setup.method, values), sort_keys=False)


def trials_frame(setup: TuneSetup, study: optuna.Study) -> pd.DataFrame:
    """One row per trial: number, state, score, each fold's score, the values, seconds, divergence, retry."""
    rows = []
    for trial in study.get_trials(deepcopy=False):
        scores = trial.user_attrs.get("fold_scores", [])
        rows.append(
            {
                "trial": trial.number,
                "state": trial.state.name,
                "score": trial.value if trial.value is not None else math.nan,
                **{f"fold{i}": scores[i] if i < len(scores) else math.nan for i in range(setup.folds)},
                **{key: trial.params.get(key) for key in setup.space},
                "seconds": trial.user_attrs.get("seconds", math.nan),
                "diverged": trial.user_attrs.get("diverged", ""),
                "retry_of": trial.user_attrs.get("retry_of", ""),
            }
        )
    return pd.DataFrame(rows)
