# download: one official archive of a real dataset → data/raw/<kind>/<filename> (checksummed).
# The archives are the outputs (DVC-tracked under dvc.yaml); prepare extracts them into the
# cache data/raw/<kind>/extracted/, which is not an output (see dmlbench.data.download).

localrules:
    download,


rule download:
    output:
        "data/raw/{kind}/{filename}",
    wildcard_constraints:
        kind="[a-z0-9_]+",
        filename="[^/]+",
    params:
        tracked=tracked_params("download", lambda w: []),
    log:
        "results/logs/download/{kind}/{filename}.log",
    shell:
        "{DMLBENCH} download {wildcards.kind} --archive {wildcards.filename} --raw-dir data/raw > {log} 2>&1"
