# evaluate: embeddings → metrics.json (Recall@K, NMI, MAP@R, R-precision; per learner too).


def recall_ks(wildcards):
    return ",".join(str(k) for k in config["datasets"][wildcards.dataset]["recall_ks"])


rule evaluate:
    input:
        f"{RUN_DIR}/embeddings.npz",
    output:
        f"{RUN_DIR}/metrics.json",
    params:
        tracked=tracked_params("evaluate", lambda w: [f"datasets.{w.dataset}.recall_ks", "evaluation"]),
        ks=recall_ks,
        kmeans=lambda w: config["evaluation"]["kmeans"],
        chunk=lambda w: config["evaluation"]["chunk_size"],
    threads: 1
    log:
        "results/logs/evaluate/{dataset}/{method}/seed{seed}.log",
    shell:
        "{DMLBENCH} evaluate {input} --out {output} --recall-ks {params.ks}"
        " --kmeans-seed {params.kmeans[seed]} --kmeans-niter {params.kmeans[niter]}"
        " --kmeans-nredo {params.kmeans[nredo]} --chunk-size {params.chunk} --threads {threads} > {log} 2>&1"
