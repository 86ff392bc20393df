# prepare: a dataset (generated or a local copy) → data/prepared/<dataset>/ with manifest.csv.


rule prepare:
    output:
        directory("data/prepared/{dataset}"),
    params:
        tracked=tracked_params(
            "prepare", lambda w: subkeys(f"datasets.{w.dataset}", (*PRESENTATION_KEYS, "training"))
        ),
    log:
        "results/logs/prepare/{dataset}.log",
    shell:
        "{DMLBENCH} prepare {wildcards.dataset} --out {output} {CONFIG_ARGS} > {log} 2>&1"
