# claims: the papers' claims, re-measured on the runs the tables already need → results/tables/claims.*


def claim_metrics(wildcards):
    claims = config.get("claims") or {}
    items = claims.get("items", [])
    return sorted({
        f"results/runs/{claims['dataset']}/{method}/seed{seed}/metrics.json"
        for item in items
        for method in (item["higher"], item["lower"])
        for seed in item.get("seeds", config["seeds"])
    })


rule claims:
    input:
        claim_metrics,
    output:
        table="results/tables/claims.tex",
        markdown="results/tables/claims.md",
        html=report(
            "results/tables/claims.html",
            caption="../report/claims.rst",
            category="Tables",
            subcategory=lambda w: dataset_labels([config["claims"]["dataset"]]),
            labels={"table": "claims", "shows": "table"},
        ),
        csv="results/tables/claims.csv",
    params:
        tracked=tracked_params("claims", lambda w: ["claims", "seeds"]),
    log:
        "results/logs/claims.log",
    shell:
        "{DMLBENCH} claims --tables-dir results/tables {CONFIG_ARGS} > {log} 2>&1"

