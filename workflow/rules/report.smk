# report: every run of a table → results/tables/<table>.{tex,csv,md,html} and its plots; a run that
# (re)built tables ends by printing them (onsuccess below).

import time

from dmlbench.report import read_cells_csv, render_text
from dmlbench.tuning.entries import tuned_keys

WORKFLOW_START = time.time()


def report_keys(table):
    """The table spec, the seeds, and the labels of its datasets and methods."""
    spec = config["tables"][table]
    labels = [f"datasets.{d}.label" for d in spec["datasets"] if "label" in config["datasets"][d]]
    labels += [key for m in spec["methods"] for key in method_keys(m) if key.endswith(".label")]
    # a generated table (<table>_tuned) is tracked as the keys that generate it (dmlbench.generated)
    return [*(tuned_keys(config, "tables", table) or [f"tables.{table}"]), "seeds", *labels]


def table_report(path, caption, shows):
    """`path` flagged for `snakemake --report`: under Tables, by the table's datasets, with its caption
    (workflow/report/<caption>) and labels table = the table's name, shows = `shows`."""
    return report(
        path,
        caption=f"../report/{caption}",
        category="Tables",
        subcategory=lambda w: dataset_labels(config["tables"][w.table]["datasets"]),
        labels={"table": "{table}", "shows": shows},
    )


rule report:
    input:
        metrics=lambda w: table_runs(w.table, METRICS_FILE),
        per_query=lambda w: table_runs(w.table, PER_QUERY_FILE),
        logs=lambda w: table_runs(w.table, LOG_FILE, trained_only=True),
        tuned=lambda w: table_tuned_settings(w.table),  # a tuned table's best.yaml files (tune.smk)
    output:
        table="results/tables/{table}.tex",
        csv="results/tables/{table}.csv",
        markdown="results/tables/{table}.md",
        html=table_report("results/tables/{table}.html", "table.rst", "table"),
        curves=table_report("results/plots/{table}_training_curves.png", "training_curves.rst", "training curves"),
        recall=table_report("results/plots/{table}_recall_at_k.png", "recall_at_k.rst", "Recall@K"),
    params:
        tracked=tracked_params("report", lambda w: report_keys(w.table)),
        tuned=lambda w: config_options(table_tuned_settings(w.table)),
    log:
        "results/logs/report/{table}.log",
    shell:
        "{DMLBENCH} report {wildcards.table:q} --tables-dir results/tables --plots-dir results/plots"
        " {CONFIG_ARGS}{params.tuned} > {log:q} 2>&1"


onsuccess:
    # the tables this run (re)wrote, as text, after Snakemake's last line ("N of N steps done")
    for _table in config["tables"]:
        _csv = Path(f"results/tables/{_table}.csv")
        if _csv.is_file() and _csv.stat().st_mtime >= WORKFLOW_START:
            print(f"\nresults/tables/{_table}.tex (also .csv, .md, .html):\n{render_text(read_cells_csv(_csv))}")
