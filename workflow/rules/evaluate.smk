# evaluate: embeddings → metrics.json (Recall@K, NMI, MAP@R, R-precision; per learner too) and
# per_query.npz (each query's first-hit rank, AP@R and R-precision: the report's bootstrap resamples them).


rule evaluate:
    input:
        f"{RUN_DIR}/{EMBEDDINGS_FILE}",
    output:
        metrics=f"{RUN_DIR}/{METRICS_FILE}",
        per_query=f"{RUN_DIR}/{PER_QUERY_FILE}",
    params:
        tracked=tracked_params("evaluate", lambda w: [f"datasets.{w.dataset}.recall_ks", "evaluation"]),
    threads: 1
    log:
        "results/logs/evaluate/{dataset}/{method}/seed{seed}.log",
    shell:
        # the settings come from the params files at run time (--dataset), not from this command line, so
        # the DVC stage made from it stays right after `dvc exp run -S evaluation.…`
        "{DMLBENCH} evaluate {input:q} --out {output.metrics:q} --per-query {output.per_query:q}"
        " --dataset {wildcards.dataset:q} {CONFIG_ARGS} --threads {threads} > {log:q} 2>&1"
