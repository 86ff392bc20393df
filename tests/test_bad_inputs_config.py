"""Cross-key and free-form settings (issue 28, "Wrong results accepted silently"): every setting that used to be
checked only when a job ran, or never, is refused when the parameters are read, so that the CLI and
``snakemake -n`` both report it, naming the key path that sets the value and the fix. Each class is exercised
on several members; the last tests check that both entry points report them and that near misses still pass."""

from __future__ import annotations

import re
import subprocess
import sys
from pathlib import Path

import pytest
import yaml
from conftest import REPO

from dmlbench.cli import main
from dmlbench.config import ConfigError
from dmlbench.methods.validation import check_planned_methods
from dmlbench.params import load_config


def _load(tmp_path: Path, overlay: dict) -> dict:
    """params.yaml with ``overlay`` on top, loaded (and validated) like the CLI does."""
    path = tmp_path / "overlay.yaml"
    path.write_text(yaml.safe_dump(overlay))
    return load_config([REPO / "params.yaml", path])


def _refused(tmp_path: Path, overlay: dict, message: str) -> None:
    with pytest.raises(ConfigError, match=message):
        _load(tmp_path, overlay)


def _image(**image) -> dict:
    return {"training": {"image": image}}


def _schedule(**schedule) -> dict:
    return {"training": {"schedule": schedule}}


# -------------------------------------------------------------------- ranges whose order matters
@pytest.mark.parametrize(
    ("overlay", "message"),
    [
        (
            _image(crop_scale=[0.9, 0.5]),
            r"training\.image\.crop_scale = \[0\.9, 0\.5\] \(run synthetic/\w+\) is not \[low, high\].*write \[0\.5, 0\.9\]",
        ),
        (
            {"methods": {"triplet": {"per_dataset": {"synthetic": _image(crop_scale=[1.0, 0.2])}}}},
            r"methods\.triplet\.per_dataset\.synthetic\.training\.image\.crop_scale = \[1\.0, 0\.2\] \(run synthetic/triplet\)",
        ),
        (
            {"methods": {"heads8": _image(crop_scale=[0.6, 0.3])}},
            r"methods\.heads8\.training\.image\.crop_scale = \[0\.6, 0\.3\] \(run synthetic/heads8\)",
        ),
        (
            {"training": {"val_split_seed": -1}},
            r"training\.val_split_seed: -1 is not valid.*-1 is less than the minimum of 0; 'seed' was expected",
        ),
        ({"evaluation": {"kmeans": {"seed": -1}}}, r"evaluation\.kmeans\.seed: -1 is less than the minimum of 0"),
    ],
)
def test_a_range_or_bound_out_of_order_names_the_key_that_sets_it(tmp_path: Path, overlay: dict, message: str):
    """A reversed crop_scale used to reach torchvision as a traceback in the first batch; a negative split or
    K-means seed, numpy's or faiss' ValueError in the job. The key named is the one that sets the run's value
    (a method's own or per-dataset training, or the defaults)."""
    _refused(tmp_path, overlay, message)


# -------------------------------------------------------------------- factors whose sign matters
@pytest.mark.parametrize(
    ("overlay", "message"),
    [
        (
            _schedule(name="step", milestones=[5], gamma=-0.1),
            r"training\.schedule\.gamma: -0\.1 is less than or equal to",
        ),
        (_schedule(name="step", milestones=[5], gamma=0), r"training\.schedule\.gamma: 0 is less than or equal to"),
        (
            _schedule(name="step", milestones=[5], gamma=10),
            r"training\.schedule\.gamma: 10 is greater than the maximum",
        ),
        (
            _schedule(name="step", milestones=[3, 3], gamma=0.1),
            r"training\.schedule\.milestones: \[3, 3\] has non-unique",
        ),
        (
            _schedule(name="step"),
            r"training\.schedule\.name = 'step' \(run synthetic/\w+\) needs training\.schedule\.milestones.*set them",
        ),
        (
            {"training": {"optimizer": {"name": "sgd", "momentum": -0.5}}},
            r"training\.optimizer\.momentum: -0\.5 is less",
        ),
        (
            {"training": {"optimizer": {"name": "sgd", "momentum": 1.0}}},
            r"training\.optimizer\.momentum: 1\.0 is greater than or equal to the maximum of 1",
        ),
    ],
)
def test_a_schedule_or_optimiser_factor_of_the_wrong_sign_is_refused(tmp_path: Path, overlay: dict, message: str):
    """gamma ≤ 0 zeroes or negates the lr at the first milestone and a repeated milestone decays it twice, both
    silently; a step schedule without milestones stopped the job on a KeyError; a negative momentum failed in
    torch's SGD, one of 1 or more diverges."""
    _refused(tmp_path, overlay, message)


# -------------------------------------------------------------------- epochs of a trained method
@pytest.mark.parametrize(
    ("overlay", "message"),
    [
        (
            {"training": {"epochs": 0}},
            r"training\.epochs = 0 \(run synthetic/\w+\), but recipe '\w+' is trained.*set epochs >= 1",
        ),
        (
            {"methods": {"mpn": {"training": {"epochs": 0}}}},
            r"methods\.mpn\.training\.epochs = 0 \(run synthetic/mpn\), but recipe 'mpn' is trained",
        ),
        (
            {"methods": {"margin": {"per_dataset": {"synthetic": {"training": {"epochs": 0}}}}}},
            r"methods\.margin\.per_dataset\.synthetic\.training\.epochs = 0 \(run synthetic/margin\)",
        ),
        (
            {"methods": {"untrained": {"training": {"epochs": 3}}}},
            r"methods\.untrained\.training\.epochs = 3 \(run synthetic/untrained\), but recipe 'reference' trains nothing",
        ),
    ],
)
def test_epochs_fit_the_recipe(tmp_path: Path, overlay: dict, message: str):
    """A trained recipe with 0 epochs used to save its untrained network and report it as the method's result
    (`snakemake -n` passed for mpn; for margin only D&C, which derives from it, happened to object)."""
    _refused(tmp_path, overlay, message)


@pytest.mark.parametrize(
    ("overlay", "message"),
    [
        (
            {"methods": {"abe8": {"options": {"divergence_warmup_epochs": 10}}}},
            r"methods\.abe8 on synthetic: methods\.abe8\.options\.divergence_warmup_epochs = 10 is not below "
            r"training\.epochs = 10: λ_div would never reach divergence_weight",
        ),
        (
            {"methods": {"abe2": {"options": {"divergence_warmup_epochs": 40.5}}}},
            r"methods\.abe2 on synthetic: .*divergence_warmup_epochs = 40\.5 is not below training\.epochs",
        ),
        (
            {"methods": {"dnc": {"options": {"finetune_epoch": 50}}}},
            r"methods\.dnc on synthetic: methods\.dnc\.options\.finetune_epoch = 50 is after the last epoch",
        ),
    ],
)
def test_method_option_epochs_fit_the_training_epochs(tmp_path: Path, overlay: dict, message: str):
    """ABE's λ_div warm-up longer than the training never applied the weight the table reports (accepted
    silently); D&C's epochs were checked already. Both surface before any job (`snakemake -n`)."""
    with pytest.raises(ConfigError, match=message):
        check_planned_methods(_load(tmp_path, overlay))


# -------------------------------------------------------------------- listed twice, nothing to show
@pytest.mark.parametrize(
    ("overlay", "message"),
    [
        (
            {"tables": {"table1": {"methods": ["triplet", "margin", "triplet"]}}},
            r"tables\.table1\.methods: \['triplet', 'margin', 'triplet'\] has non-unique elements",
        ),
        (
            {"tables": {"table1": {"datasets": ["synthetic", "synthetic"]}}},
            r"tables\.table1\.datasets: \['synthetic', 'synthetic'\] has non-unique elements",
        ),
        ({"tables": {"table1": {"metrics": ["R@1", "NMI", "R@1"]}}}, r"tables\.table1\.metrics: .* has non-unique"),
        (
            {"figures": {"retrieval_grid_best": {"seeds": [0, 0]}}},
            r"figures\.retrieval_grid_best\.seeds: \[0, 0\] has non-unique elements",
        ),
        (
            {
                "figures": {
                    "hist": {"kind": "similarity_histogram", "dataset": "synthetic", "methods": ["abe8", "abe8"]}
                }
            },
            r"figures\.hist\.methods: lists \['abe8'\] more than once; name each method once",
        ),
        (
            {
                "figures": {
                    "curves": {
                        "kind": "training_curves",
                        "dataset": "synthetic",
                        "methods": ["triplet"],
                        "columns": ["loss", "loss"],
                    }
                }
            },
            r"figures\.curves\.columns must list log\.csv column names, each once",
        ),
        ({"claims": {"seeds": [1, 1]}}, r"claims\.seeds: \[1, 1\] has non-unique elements"),
    ],
)
def test_an_entry_listed_twice_is_refused(tmp_path: Path, overlay: dict, message: str):
    """A table's repeated row, column or metric failed in the report job, after every run had trained; a figure's
    repeated method or seed drew the same curve twice."""
    _refused(tmp_path, overlay, message)


@pytest.mark.parametrize(
    ("overlay", "message"),
    [
        ({"tables": {"table1": {"metrics": []}}}, r"tables\.table1\.metrics: \[\] should be non-empty"),
        (
            {"tables": {"extra": {"datasets": ["synthetic"], "methods": []}}},
            r"tables\.extra\.methods: \[\] should be non-empty",
        ),
        (
            {"figures": {"hist": {"kind": "cluster_distances", "dataset": "synthetic", "methods": [], "clusters": 4}}},
            r"figures\.hist\.methods: names no method",
        ),
        (
            {
                "figures": {
                    "curves": {
                        "kind": "training_curves",
                        "dataset": "synthetic",
                        "methods": ["triplet", "margin"],
                        "columns": ["val_R@1", "train_R@1"],
                    }
                }
            },
            r"figures\.curves\.columns names 'train_R@1', but \['triplet', 'margin'\] do not log it on synthetic.*set "
            r"training\.log_train_recall: true for them, or drop the column",
        ),
        (
            {"methods": {"deml_i1j8": {"training": {"log_test_recall": False}}}},
            r"figures\.deml_fig5\.columns names 'test_R@1', but \['deml_i1j8'\] do not log it on synthetic",
        ),
    ],
)
def test_a_table_or_figure_with_nothing_to_show_is_refused(tmp_path: Path, overlay: dict, message: str):
    """An empty metrics list was read as "the default columns" (omitting the key says that); a training-curve
    column that the runs do not log failed in the figure job after training, or drew a panel without the curves
    of the methods that did not log it."""
    _refused(tmp_path, overlay, message)


# -------------------------------------------------------------------- sizes that cannot be allocated
@pytest.mark.parametrize(
    ("overlay", "message"),
    [
        (
            {"training": {"embedding_dim": 10**9}},
            r"training\.embedding_dim: 1000000000 is greater than the maximum of 65536",
        ),
        (_image(resize=100_000), r"training\.image\.resize: 100000 is greater than the maximum of 4096"),
        (
            {"methods": {"margin": {"training": {"image": {"train_crop": 5000}}}}},
            r"methods\.margin\.training\.image\.train_crop: 5000 is greater than the maximum of 4096",
        ),
        ({"training": {"num_workers": 100_000}}, r"training\.num_workers: 100000 is greater than the maximum of 256"),
        (
            {"training": {"sampler": {"classes_per_batch": 4096, "images_per_class": 4096}}},
            r"training\.sampler\.classes_per_batch × training\.sampler\.images_per_class = 4096 × 4096 images of "
            r"training\.image\.train_crop = 56 px \(run synthetic/\w+\) make a batch of 157,840,048,128 input values, "
            r"beyond the 2,147,483,647 .*lower the batch or the image size",
        ),
        (
            {"training": {"eval_batch_size": 65536, "image": {"resize": 256, "test_crop": 224}}},
            r"training\.eval_batch_size = 65536 images of training\.image\.test_crop = 224 px .* 9,865,003,008 input values",
        ),
    ],
)
def test_a_size_that_cannot_be_allocated_is_refused(tmp_path: Path, overlay: dict, message: str):
    """embedding_dim 10⁹ used to pass the parameters and exhaust the memory of `snakemake -n` itself (the method
    checks built a loss of that width); the others failed in the job, or never ended."""
    _refused(tmp_path, overlay, message)


# -------------------------------------------------------------------- both entry points, and near misses
def test_the_cli_refuses_a_cross_key_setting_before_it_writes_anything(tmp_path: Path, capsys):
    path = tmp_path / "overlay.yaml"
    path.write_text(yaml.safe_dump({"methods": {"triplet": {"training": {"epochs": 0}}}}))
    out = tmp_path / "run"
    code = main(
        [
            "train",
            "--dataset",
            "synthetic",
            "--method",
            "triplet",
            "--seed",
            "0",
            "--out",
            str(out),
            "--config",
            str(REPO / "params.yaml"),
            "--config",
            str(path),
        ]
    )
    assert code == 2 and "methods.triplet.training.epochs = 0" in capsys.readouterr().err
    assert not out.exists()


def test_snakemake_dry_run_reports_a_cross_key_setting(tmp_path: Path):
    path = tmp_path / "overlay.yaml"
    path.write_text(yaml.safe_dump({"tables": {"table1": {"methods": ["triplet", "triplet"]}}}))
    result = subprocess.run(
        [
            sys.executable,
            "-m",
            "snakemake",
            "-n",
            "--cores",
            "1",
            "results/tables/table1.tex",
            "--configfile",
            str(path),
        ],
        check=False,
        cwd=REPO,
        capture_output=True,
        text=True,
    )
    assert result.returncode != 0
    assert re.search(r"tables\.table1\.methods: .* has non-unique elements", result.stdout + result.stderr)


@pytest.mark.parametrize(
    "overlay",
    [
        _image(crop_scale=[0.766, 0.766]),  # a fixed crop area (the paper overlay's D&C)
        _schedule(name="step", milestones=[30], gamma=0.1),  # a milestone beyond a run's epochs never applies: allowed
        {"training": {"optimizer": {"name": "sgd", "momentum": 0.0}}},
        {"methods": {"abe8": {"options": {"divergence_warmup_epochs": 9.5}}}},
        {"training": {"eval_batch_size": 65536}},  # 65,536 images of 56 px: 617 M values
    ],
)
def test_near_misses_still_load(tmp_path: Path, overlay: dict):
    check_planned_methods(_load(tmp_path, overlay))
