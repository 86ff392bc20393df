# figure: an experiment's figure (figures.<name> in params) → results/plots/<name>.png, from the
# finished runs it needs (metrics, logs, embeddings or a checkpoint, depending on its kind).

from dmlbench.report.figures import figure_inputs

FIGURES = list(config.get("figures", {}))


def figure_keys(figure):
    """The figure spec, the seeds, the dataset label and the labels of the methods it shows."""
    spec = config["figures"][figure]
    methods = {run.method for run in map(run_of, figure_inputs(config, figure)) if run is not None}
    labels = [key for m in sorted(methods) for key in method_keys(m) if key.endswith(".label")]
    if "label" in config["datasets"][spec["dataset"]]:
        labels.append(f"datasets.{spec['dataset']}.label")
    return [f"figures.{figure}", "seeds", *labels]


if FIGURES:

    rule figure:
        input:
            lambda w: figure_inputs(config, w.figure),
        output:
            report(
                "results/plots/{figure}.png",
                caption="../report/figure.rst",
                category="Figures",
                subcategory=lambda w: dataset_labels([config["figures"][w.figure]["dataset"]]),
                labels={"figure": "{figure}"},
            ),
        params:
            tracked=tracked_params("figure", lambda w: figure_keys(w.figure)),
        log:
            "results/logs/figure/{figure}.log",
        shell:
            "{DMLBENCH} figure {wildcards.figure:q} --out {output:q} {CONFIG_ARGS} > {log:q} 2>&1"
