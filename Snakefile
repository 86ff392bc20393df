# dmlbench workflow: prepare → pretrain → train → embed → evaluate → report.
# The single source of truth of the pipeline; dvc.yaml is generated from it
# (workflow/scripts/make_dvc_yaml.py). Parameters: params.yaml (+ --configfile overlays).

from snakemake.utils import min_version

min_version("9.0")


configfile: "params.yaml"


report: "workflow/report/workflow.rst"


include: "workflow/rules/common.smk"
include: "workflow/rules/download.smk"
include: "workflow/rules/prepare.smk"
include: "workflow/rules/pretrain.smk"
include: "workflow/rules/train.smk"
include: "workflow/rules/tune.smk"
include: "workflow/rules/evaluate.smk"
include: "workflow/rules/report.smk"
include: "workflow/rules/figure.smk"
include: "workflow/rules/claims.smk"


rule all:
    input:
        expand("results/tables/{table}.tex", table=list(config["tables"])),
        expand("results/plots/{figure}.png", figure=list(config.get("figures", {}))),
        ["results/tables/claims.tex"] if config.get("claims") else [],
    default_target: True
