# claims: the papers' claims, re-measured on the runs the tables already need → results/tables/claims.*

from dmlbench.report.claims import claim_runs


def claim_inputs(wildcards):
    """metrics.json and per_query.npz of every run the claims read (dmlbench.report.claims.claim_runs:
    the claims' dataset and seeds, `claims.seeds` of an overlay included)."""
    return sorted(str(run.path / name) for run in claim_runs(config, RUNS_DIR) for name in (METRICS_FILE, PER_QUERY_FILE))


rule claims:
    input:
        claim_inputs,
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
        "{DMLBENCH} claims --tables-dir results/tables {CONFIG_ARGS} > {log:q} 2>&1"

