# tune: equal-budget tuning (docs/tuning.md). For every trained method of a table listed under
# `tuning.tables`, `dmlbench tune` runs its Optuna study on class-disjoint folds of the dataset's training
# classes (never its test split) until `tuning.trials` trials are complete, and writes best.yaml (a params
# overlay for <method>_tuned) and trials.csv. The study itself, results/tuning/<dataset>/<method>/study.journal,
# is not an output, so Snakemake never deletes it: a killed job resumes its study when rerun. The runs of
# <method>_tuned (rule train_tuned, rule train's command with one more --config) and the report of
# <table>_tuned (rule report) take the best.yaml files as inputs and as more --config overlays.

from dmlbench.tuning.entries import tuned_methods, tuned_name
from dmlbench.tuning.space import TUNING_KEY

TUNING_DIR = "results/tuning/{dataset}/{method}"
# <method>_tuned → <method>, for every table of tuning.tables
TUNED = {twin: method for table in config.get(TUNING_KEY, {}).get("tables", [])
         for method, twin in tuned_methods(config, table).items()}


def tuned_settings(dataset, method):
    """The best.yaml that gives a tuned entry its settings on `dataset` ([] for any other method)."""
    return [f"results/tuning/{dataset}/{TUNED[method]}/best.yaml"] if method in TUNED else []


def table_tuned_settings(table):
    """The best.yaml files of a table's tuned entries on its datasets ([] for a table without any)."""
    spec = config["tables"][table]
    return [path for dataset in spec["datasets"] for method in spec["methods"]
            for path in tuned_settings(dataset, method)]


def config_options(paths):
    """` --config <path>` for each path, shell-quoted (appended to CONFIG_ARGS: the later overlays)."""
    return "".join(f" --config {shlex.quote(path)}" for path in paths)


def tune_keys(wildcards):
    """A tune job's params: the tuned run's (as rule train's for <method>_tuned), the method's own search
    space and the tuning budget and protocol (not `tuning.tables`, which only says which tables are tuned)."""
    twin = tuned_name(wildcards.method)
    space = [f"methods.{wildcards.method}.{TUNING_KEY}"] if TUNING_KEY in config["methods"][wildcards.method] else []
    return [*train_keys(wildcards.dataset, twin), *space, *subkeys(TUNING_KEY, ["tables"])]


ruleorder: train_tuned > train


rule train_tuned:
    wildcard_constraints:
        method=one_of(TUNED),
    input:
        data=PREPARED,
        options=option_files,
        pretrained=pretrained_weights,
        best=lambda w: tuned_settings(w.dataset, w.method),
    output:
        checkpoint=f"{RUN_DIR}/{CHECKPOINT_FILE}",
        log=f"{RUN_DIR}/{LOG_FILE}",
    params:
        tracked=tracked_params("train_tuned", lambda w: train_keys(w.dataset, w.method)),
    threads: 1
    resources:
        gpu=1,
    log:
        "results/logs/train/{dataset}/{method}/seed{seed}.log",
    shell:
        TRAIN_COMMAND + " --config {input.best:q} > {log:q} 2>&1"


rule tune:
    wildcard_constraints:
        method=one_of(sorted(set(TUNED.values()))),
    input:
        data=PREPARED,
        pretrained=pretrained_weights,  # <method>'s backbone: <method>_tuned does not change it
    output:
        best=f"{TUNING_DIR}/best.yaml",
        trials=f"{TUNING_DIR}/trials.csv",
    params:
        tracked=tracked_params("tune", tune_keys),
    threads: 1
    resources:
        gpu=1,
    log:
        "results/logs/tune/{dataset}/{method}.log",
    shell:
        "{DMLBENCH} tune --dataset {wildcards.dataset:q} --method {wildcards.method:q}"
        " --manifest {input.data:q}/" + MANIFEST_FILE + " --out \"$(dirname {output.best:q})\" --threads {threads}"
        " --no-progress {CONFIG_ARGS} > {log:q} 2>&1"
