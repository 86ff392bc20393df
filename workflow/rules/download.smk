# download: one official archive of a real dataset → data/raw/<kind>/<filename> (checksummed).
# The archives are the outputs (DVC-tracked under dvc.yaml); prepare extracts them into the
# cache data/raw/<kind>/extracted/, which is not an output (see dmlbench.data.download).

from dmlbench.data.download import archive_filenames

# {kind: its archive file names} of the datasets with `download: true`: the only targets of rule download
DOWNLOADS = {
    spec["kind"]: archive_filenames(spec["kind"]) for spec in config["datasets"].values() if spec.get("download")
}


localrules:
    download,


rule download:
    output:
        "data/raw/{kind}/{filename}",
    wildcard_constraints:
        kind=one_of(DOWNLOADS),
        filename=one_of(sorted({name for names in DOWNLOADS.values() for name in names})),
    params:
        tracked=tracked_params("download", lambda w: []),
    log:
        "results/logs/download/{kind}/{filename}.log",
    shell:
        "{DMLBENCH} download {wildcards.kind:q} --archive {wildcards.filename:q} --raw-dir data/raw > {log:q} 2>&1"
