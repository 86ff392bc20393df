# prepare: a dataset (generated, a local copy, the official archives, or your own image folder or CSV:
# kind folder / manifest) → data/prepared/<dataset>/ with manifest.csv. A local copy or your own files are
# not inputs (Snakemake does not watch them): after changing them, `--forcerun data/prepared/<dataset>`.


def dataset_archives(wildcards):
    """The archive files of a dataset with `download: true` (outputs of rule download), else none.

    `prepare` extracts them into <raw_dir>/<kind>/extracted/ (a cache, not an output). With a
    `raw_dir` other than data/raw, no rule makes them: they must already be there.
    """
    spec = config["datasets"][wildcards.dataset]
    if not spec.get("download"):
        return []
    if spec.get("root"):  # fail before fetching anything
        raise ValueError(f"datasets.{wildcards.dataset}: `download: true` and `root` are both set; choose one")
    raw_dir = spec.get("raw_dir") or "data/raw"
    # an unknown kind has none: `dmlbench prepare` says so
    return [f"{raw_dir}/{spec['kind']}/{filename}" for filename in DOWNLOADS.get(spec["kind"], [])]


rule prepare:
    input:
        dataset_archives,
    output:
        directory(PREPARED),
    params:
        tracked=tracked_params(
            "prepare", lambda w: subkeys(f"datasets.{w.dataset}", (*PRESENTATION_KEYS, "training"))
        ),
    log:
        "results/logs/prepare/{dataset}.log",
    shell:
        "{DMLBENCH} prepare {wildcards.dataset:q} --out {output:q} {CONFIG_ARGS} > {log:q} 2>&1"
