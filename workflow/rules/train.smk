# train: one run (dataset, method, seed) → the selected checkpoint and the per-epoch log.
# Resume checkpoints live under .scratch/ (not an output), so a killed job continues.


rule train:
    input:
        "data/prepared/{dataset}",
    output:
        checkpoint=f"{RUN_DIR}/checkpoint.pt",
        log=f"{RUN_DIR}/log.csv",
    params:
        tracked=tracked_params(
            "train",
            lambda w: [
                "training",
                *subkeys(f"datasets.{w.dataset}", [k for k in lookup(f"datasets.{w.dataset}") if k != "training"]),
                *method_keys(w.method, PRESENTATION_KEYS),
            ],
        ),
    threads: 1
    resources:
        gpu=1,
    log:
        "results/logs/train/{dataset}/{method}/seed{seed}.log",
    shell:
        "{DMLBENCH} train --dataset {wildcards.dataset} --method {wildcards.method} --seed {wildcards.seed}"
        " --manifest {input}/manifest.csv --out $(dirname {output.checkpoint}) --threads {threads} --no-progress"
        " {CONFIG_ARGS} > {log} 2>&1"


rule embed:
    input:
        checkpoint=f"{RUN_DIR}/checkpoint.pt",
        data="data/prepared/{dataset}",
    output:
        f"{RUN_DIR}/embeddings.npz",
    params:
        tracked=tracked_params("embed", lambda w: []),
    threads: 1
    log:
        "results/logs/embed/{dataset}/{method}/seed{seed}.log",
    shell:
        "{DMLBENCH} embed $(dirname {input.checkpoint}) --manifest {input.data}/manifest.csv --out {output}"
        " --threads {threads} > {log} 2>&1"
