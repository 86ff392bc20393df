# report: every run of a table → results/tables/<table>.tex and its plots.


def report_keys(table):
    """The table spec, the seeds, and the labels of its datasets and methods."""
    spec = config["tables"][table]
    labels = [f"datasets.{d}.label" for d in spec["datasets"] if "label" in config["datasets"][d]]
    labels += [key for m in spec["methods"] for key in method_keys(m) if key.endswith(".label")]
    return [f"tables.{table}", "seeds", *labels]


rule report:
    wildcard_constraints:
        # only the table specs (results/tables/claims.tex is rule claims')
        table="|".join(config["tables"]),
    input:
        metrics=lambda w: table_runs(w.table, "metrics.json"),
        logs=lambda w: table_runs(w.table, "log.csv", trained_only=True),
    output:
        table="results/tables/{table}.tex",
        curves="results/plots/{table}_training_curves.png",
        recall="results/plots/{table}_recall_at_k.png",
    params:
        tracked=tracked_params("report", lambda w: report_keys(w.table)),
    log:
        "results/logs/report/{table}.log",
    shell:
        "{DMLBENCH} report {wildcards.table} --tables-dir results/tables --plots-dir results/plots"
        " {CONFIG_ARGS} > {log} 2>&1"
