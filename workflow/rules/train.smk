# train: one run (dataset, method, seed) → the selected checkpoint and the per-epoch log; embed: its test
# embeddings. A method that changes only test-time behaviour (checkpoint_of) is not trained: reembed
# embeds its trained method's checkpoint with its options. An ensemble concatenates member runs.
# Resume checkpoints live under .scratch/ (not an output), so a killed job continues.


def option_files(wildcards):
    """Files named by the run's method options (keys ending in `_file`, e.g. D&C's class_groups_file):
    inputs of the run, so editing one reruns it. A file that `prepare` writes into the dataset's
    folder (SOP's super_classes.csv) comes with that folder, already an input."""
    options = resolve_method(config, wildcards.method, wildcards.dataset).get("options", {})
    prepared = prepared_dir(wildcards.dataset)
    return [
        value
        for key, value in options.items()
        if key.endswith("_file") and value and prepared not in Path(value).parents
    ]


def train_keys(dataset, method):
    """The params a run of `method` on `dataset` reads: the training defaults, the dataset's training
    section and the method's keys (with its bases', no labels)."""
    return [
        "training",
        *subkeys(f"datasets.{dataset}", [k for k in config_at(f"datasets.{dataset}") if k != "training"]),
        *method_keys(method, PRESENTATION_KEYS),
    ]


# a run's command up to its log; rule train_tuned (tune.smk) adds the run's best.yaml
TRAIN_COMMAND = (
    "{DMLBENCH} train --dataset {wildcards.dataset:q} --method {wildcards.method:q} --seed {wildcards.seed:q}"
    " --manifest {input.data:q}/" + MANIFEST_FILE + " --out \"$(dirname {output.checkpoint:q})\" --threads {threads}"
    " --no-progress {CONFIG_ARGS}"
)


rule train:
    wildcard_constraints:
        method=TRAINED_METHOD,
    input:
        data=PREPARED,
        options=option_files,
        pretrained=pretrained_weights,
    output:
        checkpoint=f"{RUN_DIR}/{CHECKPOINT_FILE}",
        log=f"{RUN_DIR}/{LOG_FILE}",
    params:
        tracked=tracked_params("train", lambda w: train_keys(w.dataset, w.method)),
    threads: 1
    resources:
        gpu=1,
    log:
        "results/logs/train/{dataset}/{method}/seed{seed}.log",
    shell:
        TRAIN_COMMAND + " > {log:q} 2>&1"


rule embed:
    wildcard_constraints:
        method=TRAINED_METHOD,
    input:
        checkpoint=f"{RUN_DIR}/{CHECKPOINT_FILE}",
        data=PREPARED,
    output:
        f"{RUN_DIR}/{EMBEDDINGS_FILE}",
    params:
        tracked=tracked_params("embed", lambda w: []),
    threads: 1
    resources:
        gpu=1,  # its own GPU slot, as train's (src/dmlbench/placement.py)
    log:
        "results/logs/embed/{dataset}/{method}/seed{seed}.log",
    shell:
        "{DMLBENCH} embed \"$(dirname {input.checkpoint:q})\" --manifest {input.data:q}/" + MANIFEST_FILE + " --out {output:q}"
        " --threads {threads} > {log:q} 2>&1"


rule reembed:
    wildcard_constraints:
        method=REEMBEDDED_METHOD,
    input:
        checkpoint=lambda w: run_file(w.dataset, REEMBEDDED[w.method], w.seed, CHECKPOINT_FILE),
        data=PREPARED,
    output:
        f"{RUN_DIR}/{EMBEDDINGS_FILE}",
    params:
        tracked=tracked_params("reembed", lambda w: method_keys(w.method, PRESENTATION_KEYS)),
    threads: 1
    resources:
        gpu=1,  # its own GPU slot, as train's (src/dmlbench/placement.py)
    log:
        "results/logs/reembed/{dataset}/{method}/seed{seed}.log",
    shell:
        "{DMLBENCH} embed \"$(dirname {input.checkpoint:q})\" --method {wildcards.method:q}"
        " --manifest {input.data:q}/" + MANIFEST_FILE + " --out {output:q} --threads {threads} {CONFIG_ARGS} > {log:q} 2>&1"


def ensemble_members(wildcards):
    member, count = ENSEMBLES[wildcards.method]
    return [run_file(wildcards.dataset, member, s, EMBEDDINGS_FILE) for s in member_seeds(int(wildcards.seed), count)]


rule ensemble:
    wildcard_constraints:
        method=ENSEMBLE_METHOD,
    input:
        ensemble_members,
    output:
        f"{RUN_DIR}/{EMBEDDINGS_FILE}",
    params:
        tracked=tracked_params("ensemble", lambda w: [f"methods.{w.method}.base", f"methods.{w.method}.ensemble_members"]),
    threads: 1
    log:
        "results/logs/ensemble/{dataset}/{method}/seed{seed}.log",
    shell:
        "{DMLBENCH} ensemble {input:q} --out {output:q} > {log:q} 2>&1"
