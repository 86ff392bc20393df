# Shared helpers of the rules: config validation, the dmlbench command line, run paths.

import os
import shlex
import sys
from pathlib import Path

from dmlbench.config import (
    PRESENTATION_KEYS,
    checkpoint_source,
    deep_merge,
    ensemble_spec,
    logs_epochs,
    method_chain,
    resolve_method,
)
from dmlbench.evaluation.ensemble import member_seeds
from dmlbench.generated import origin_keys
from dmlbench.layout import (
    CHECKPOINT_FILE,
    EMBEDDINGS_FILE,
    LOG_FILE,
    MANIFEST_FILE,
    METRICS_FILE,
    PER_QUERY_FILE,
    RUN_DIR_PATTERN,
    RUNS_DIR,
    prepared_dir,
    run_file,
    run_of,
)
from dmlbench.methods.validation import check_planned_methods
from dmlbench.names import one_of
from dmlbench.params import merge_params, validate_config
from dmlbench.workflow_checks import check_no_future_dated_files, check_one_configfile_option, overrides_overlay
from dmlbench.workflow_params import PARAM_KEYS

# Every rule calls the same CLI with the same parameter files Snakemake read, from the
# environment that runs Snakemake (so `.venv/bin/snakemake` works without activating it).
os.environ["PATH"] = f"{Path(sys.executable).parent}{os.pathsep}{os.environ.get('PATH', '')}"
# Snakemake keeps only the last of several --configfile options: refuse them rather than drop overlays.
check_one_configfile_option(sys.argv)
# Snakemake lists the Snakefile's `configfile:` (params.yaml) AFTER the --configfile overlays, but
# overlays must win: pass params.yaml first, then the overlays in their command-line order.
BASE_CONFIG = "params.yaml"
OVERLAYS = [path for path in workflow.configfiles if Path(path).resolve() != Path(BASE_CONFIG).resolve()]
# the command line's `--config KEY=VALUE` only (Snakemake's overwrite_config also holds the overlays' raw
# content, without their experiments files: merge_params reads those)
OVERRIDES = dict(workflow.config_settings.config)
CONFIG_SOURCE = "snakemake config (params.yaml + experiments + overlays" + (" + --config)" if OVERRIDES else ")")

# Snakemake merged params.yaml and the overlays but knows nothing of params.yaml's experiments files:
# `config` becomes what the CLI reads (params.yaml, its experiments files, the overlays), with the
# command line's `--config KEY=VALUE` last as before. In place: the rules hold this very mapping.
_merged = deep_merge(merge_params([BASE_CONFIG, *OVERLAYS]), OVERRIDES)
config.clear()
config.update(_merged)
validate_config(config, source=CONFIG_SOURCE)
# every planned run's recipe, options, loss and backbone name, so that `snakemake -n` catches them
check_planned_methods(config, source=CONFIG_SOURCE)
# The commands read files only: the `--config KEY=VALUE` overrides become a generated overlay, passed last,
# so that the jobs run with the very configuration Snakemake planned (and decided reruns) with.
OVERRIDES_OVERLAY = overrides_overlay(OVERRIDES)
# shell-quoted: an overlay path with a space or a quote must not split (the shell would fail the job
# after Snakemake has already removed its old outputs)
CONFIG_ARGS = " ".join(f"--config {shlex.quote(str(path))}"
                       for path in [BASE_CONFIG, *OVERLAYS, *([OVERRIDES_OVERLAY] if OVERRIDES_OVERLAY else [])])
# a file dated in the future would make finished outputs look out of date: stop before any job runs
check_no_future_dated_files()
DMLBENCH = "dmlbench"
RUN_DIR = RUN_DIR_PATTERN
# a prepared dataset's folder (wildcard dataset)
PREPARED = prepared_dir("{dataset}").as_posix()


# Two kinds of methods are not trained: ensembles (`ensemble_members: E`; rule ensemble concatenates
# member runs) and methods that change only test-time behaviour (`checkpoint_of: M`; rule reembed
# embeds M's checkpoint with their options).
ENSEMBLES = {m: ensemble_spec(config, m) for m in config["methods"] if ensemble_spec(config, m)}
REEMBEDDED = {m: checkpoint_source(config, m) for m in config["methods"] if checkpoint_source(config, m)}


# Every wildcard accepts only the names the parameters define (dmlbench.names.one_of: each name
# re.escape-d), so a requested path with any other name, e.g. `data/raw/cub200/x$(touch PWNED)`, matches no
# rule; the names themselves match the schema's name pattern. Shell commands quote every word built from
# a wildcard or a path with Snakemake's `{...:q}` (shlex.quote); CONFIG_ARGS is quoted above.
TRAINED_METHOD = one_of(m for m in config["methods"] if m not in ENSEMBLES and m not in REEMBEDDED)
ENSEMBLE_METHOD = one_of(ENSEMBLES)
REEMBEDDED_METHOD = one_of(REEMBEDDED)


wildcard_constraints:
    dataset=one_of(config["datasets"]),
    method=one_of(config["methods"]),
    seed="[0-9]+",
    table=one_of(config["tables"]),
    figure=one_of(config.get("figures", {})),


def table_runs(table, filename, trained_only=False):
    """Paths of `filename` in every run (dataset × method × seed) of tables.<table>; with
    `trained_only`, the methods without training epochs (ensembles, test-time variants, reference rows:
    no or an empty training log) are left out."""
    spec = config["tables"][table]
    return expand(
        f"{RUN_DIR}/{filename}",
        dataset=spec["datasets"],
        method=[m for m in spec["methods"] if not (trained_only and not logs_epochs(config, m))],
        seed=spec.get("seeds", config["seeds"]),
    )


# rule name → function(wildcards) → the dotted params keys the rule reads. Each rule
# declares them through tracked_params(), which makes them Snakemake params (so an edit
# reruns the job) and lets make_dvc_yaml.py declare the same keys as the DVC stage's params
# (it reads them from dmlbench.workflow_params after its dry run).
PARAM_KEYS.clear()


def config_at(key):
    """config value at a dotted key such as 'methods.triplet' (named so as not to shadow Snakemake's own
    `lookup`, which Snakefiles may use)."""
    node = config
    for part in key.split("."):
        node = node[part]
    return node


def subkeys(key, exclude=()):
    """Dotted keys of the entries of the mapping at `key`, minus `exclude`."""
    return [f"{key}.{name}" for name in config_at(key) if name not in exclude]


def method_keys(method, exclude=()):
    """Dotted keys of a method's section and of its bases' sections (`base:` inheritance); a generated
    section (a sweep's point, a tuned entry) counts as the keys that generate it, and a search space
    (`tuning`, read by the tune job only) is not a key of the method's runs (dmlbench.generated)."""
    return [key for name in method_chain(config, method) for key in origin_keys(config, "methods", name, exclude)]


def tracked_params(rule_name, keys):
    """Register `keys(wildcards)` for `rule_name`; return a params function giving their values."""
    PARAM_KEYS[rule_name] = keys
    return lambda wildcards: {key: config_at(key) for key in keys(wildcards)}


def dataset_labels(datasets):
    """The display labels of `datasets`, comma-separated: the report's subcategory of an output about them."""
    return ", ".join(config["datasets"][d].get("label", d) for d in datasets)
