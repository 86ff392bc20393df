# pretrain: the backbone trained by classification on a dataset's pretraining classes (params
# `pretraining.<dataset>`), which every run with `training.backbone.pretrained: <dataset>` starts from.
# Its weights file is an input of those runs, so editing the pretraining settings reruns them.

from dmlbench.config import resolve_run
from dmlbench.models.backbones import BACKBONES
from dmlbench.layout import pretrained_path, pretraining_run_dir
from dmlbench.models.backbones.weights import PRETRAINING_SOURCES

# a pretraining stage's weights file and its run folder (wildcards dataset, backbone)
PRETRAINED_WEIGHTS = pretrained_path("{dataset}", "{backbone}").as_posix()
PRETRAINING_RUN_DIR = pretraining_run_dir(PRETRAINED_WEIGHTS).as_posix()


def run_backbone(dataset, method):
    """The `training.backbone` section of the method's runs on the dataset (any seed: seeds do not change it)."""
    return resolve_run(config, dataset, method, 0)["training"]["backbone"]


def pretraining_method(dataset):
    """The method entry that `pretraining.<dataset>` trains (a clear error when there is none)."""
    stages = config.get("pretraining", {})
    if dataset not in stages:
        raise ValueError(f"params: no pretraining.{dataset} section; known pretraining stages: {sorted(stages)}")
    return stages[dataset]["method"]


def pretraining_backbone_matches(wildcards):
    """No inputs; raises when the requested file's backbone is not the one the stage trains."""
    name = run_backbone(wildcards.dataset, pretraining_method(wildcards.dataset))["name"]
    if name != wildcards.backbone:
        raise ValueError(f"{pretrained_path(wildcards.dataset, wildcards.backbone)}: pretraining.{wildcards.dataset} "
                         f"trains a {name!r} backbone, not {wildcards.backbone!r}")
    return []


def pretrained_weights(wildcards):
    """The pretraining stage's weights file when the run's backbone says `pretrained: <stage>`."""
    backbone = run_backbone(wildcards.dataset, wildcards.method)
    source = backbone.get("pretrained")
    if isinstance(source, str) and source in PRETRAINING_SOURCES:
        return [str(pretrained_path(source, backbone["name"]))]
    return []


rule pretrain:
    wildcard_constraints:
        backbone=one_of(BACKBONES),
    input:
        data=PREPARED,
        check=pretraining_backbone_matches,
    output:
        weights=PRETRAINED_WEIGHTS,
        checksum=f"{PRETRAINED_WEIGHTS}.sha256",
        checkpoint=f"{PRETRAINING_RUN_DIR}/{CHECKPOINT_FILE}",
        log=f"{PRETRAINING_RUN_DIR}/{LOG_FILE}",
    params:
        tracked=tracked_params(
            "pretrain",
            lambda w: [
                f"pretraining.{w.dataset}",
                "training",
                *subkeys(f"datasets.{w.dataset}", [k for k in config_at(f"datasets.{w.dataset}") if k != "training"]),
                *method_keys(pretraining_method(w.dataset), PRESENTATION_KEYS),
            ],
        ),
    threads: 1
    resources:
        gpu=1,
    log:
        "results/logs/pretrain/{dataset}_{backbone}.log",
    shell:
        "{DMLBENCH} pretrain --dataset {wildcards.dataset:q} --prepared {input.data:q} --no-progress"
        " --threads {threads} {CONFIG_ARGS} > {log:q} 2>&1"
