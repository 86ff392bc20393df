"""`dmlbench show run` / `show method`: every effective setting with the file and line that set it, and a
run folder's run.yaml, written before training."""

from __future__ import annotations

import re
from pathlib import Path

import pytest
import yaml
from conftest import REPO, write_tiny_dataset

from dmlbench.cli import main
from dmlbench.config import resolve_run
from dmlbench.params import load_config
from dmlbench.provenance import Layers, run_settings

PARAMS = str(REPO / "params.yaml")
OVERLAY = """\
training:
  epochs: 4
methods:
  dnc:
    per_dataset:
      synthetic:
        options: {warmup_epochs: 2}
"""


def shown(capsys: pytest.CaptureFixture, argv: list[str]) -> dict[str, tuple[str, str]]:
    """`dmlbench ARGV`'s lines as key → (value, comment)."""
    assert main(argv) == 0
    out = capsys.readouterr().out
    rows = [re.fullmatch(r"(\S+) = (.*?)\s+# (.*)", line) for line in out.splitlines() if not line.startswith("#")]
    assert all(rows), out
    return {row[1]: (row[2], row[3]) for row in rows}


def line_of(path: Path, pattern: str) -> int:
    """The 1-based number of the first line of ``path`` that matches ``pattern``."""
    return next(i for i, line in enumerate(path.read_text().splitlines(), 1) if re.search(pattern, line))


@pytest.fixture
def settings(tmp_path: Path, capsys: pytest.CaptureFixture, monkeypatch: pytest.MonkeyPatch) -> dict:
    monkeypatch.chdir(REPO)
    overlay = tmp_path / "overlay.yaml"
    overlay.write_text(OVERLAY)
    return shown(
        capsys,
        [
            "show",
            "run",
            "--dataset",
            "synthetic",
            "--method",
            "dnc_nosplit",
            "--seed",
            "1",
            "--config",
            "params.yaml",
            "--config",
            str(overlay),
            "--config",
            "training.optimizer.lr=0.5",
        ],
    ) | {"overlay": ("", str(overlay))}


def test_a_key_of_params_yaml_names_its_line(settings: dict):
    assert settings["training.embedding_dim"] == (
        "64",
        f"params.yaml:{line_of(REPO / 'params.yaml', r'^  embedding_dim:')}  training.embedding_dim",
    )


def test_an_overlay_wins_and_is_named(settings: dict):
    assert settings["training.epochs"] == ("4", f"{settings['overlay'][1]}:2  training.epochs")


def test_a_setting_inherited_through_base_names_the_base_entry(settings: dict):
    """dnc_nosplit → dnc → margin: the loss comes from margin's entry in params.yaml, the grouping from
    dnc_nosplit's own entry in the D&C experiments file."""
    margin = line_of(REPO / "params.yaml", r"^    loss: \{name: margin")
    assert settings["method_config.loss.margin"] == ("0.2", f"params.yaml:{margin}  methods.margin.loss.margin")
    dnc = REPO / "workflow/experiments/dnc.yaml"
    lines = dnc.read_text().splitlines()
    grouping = next(i for i in range(line_of(dnc, r"^  dnc_nosplit:"), len(lines)) if "grouping:" in lines[i]) + 1
    assert settings["method_config.options.grouping"] == (
        "kmeans_no_split",
        f"workflow/experiments/dnc.yaml:{grouping}  methods.dnc_nosplit.options.grouping",
    )


def test_a_per_dataset_setting_of_a_base_names_it(settings: dict):
    assert settings["method_config.options.warmup_epochs"] == (
        "2",
        f"{settings['overlay'][1]}:7  methods.dnc.per_dataset.synthetic.options.warmup_epochs",
    )


def test_a_default_in_code_names_the_line_of_the_field(settings: dict):
    from dmlbench.methods.dnc import DivideAndConquerOptions

    value, source = settings["method_config.options.kmeans_niter"]
    match = re.fullmatch(r"default in code: (\S+):(\d+) \(DivideAndConquerOptions\.kmeans_niter\)", source)
    assert match and match[1] == "src/dmlbench/methods/dnc.py", source
    assert re.match(r"\s*kmeans_niter: int = ", (REPO / match[1]).read_text().splitlines()[int(match[2]) - 1])
    assert value == str(DivideAndConquerOptions().kmeans_niter)


def test_a_command_line_override_is_named_and_the_run_arguments_too(settings: dict):
    assert settings["training.optimizer.lr"] == ("0.5", "command line  training.optimizer.lr")
    assert settings["seed"] == ("1", "the run's --seed")
    assert settings["method"] == ("dnc_nosplit", "the run's --method")


def test_every_setting_of_every_run_has_a_source_on_a_line_that_names_its_key(monkeypatch: pytest.MonkeyPatch):
    """All methods on the embedded and the cub_lite datasets: each source's line holds the setting's last key
    (run_settings itself checks that the value there is the run's value)."""
    monkeypatch.chdir(REPO)
    files = ["params.yaml", "workflow/overlays/cub_lite.yaml"]
    layers = Layers.read(files)
    config = load_config(files)
    texts: dict[str, list[str]] = {}
    for dataset in ("synthetic", "cub200"):
        for method in config["methods"]:
            for setting in run_settings(layers, config, resolve_run(config, dataset, method, 0)):
                if not setting.parameter or setting.source.startswith("generated"):
                    continue
                file, line = setting.source.rsplit(":", 1)
                text = texts.setdefault(file, (REPO / file).read_text().splitlines())[int(line) - 1]
                assert re.search(rf"\b{re.escape(setting.path[-1])}\b", text), (dataset, method, setting)


def test_show_run_of_cub_lite_mpn_names_a_file_for_every_setting(
    capsys: pytest.CaptureFixture, monkeypatch: pytest.MonkeyPatch
):
    monkeypatch.chdir(REPO)
    rows = shown(
        capsys,
        [
            "show",
            "run",
            "--dataset",
            "cub200",
            "--method",
            "mpn",
            "--config",
            "params.yaml",
            "--config",
            "workflow/overlays/cub_lite.yaml",
        ],
    )
    assert rows["training.optimizer.lr"][1].startswith("workflow/overlays/cub_lite.yaml:")
    assert rows["training.optimizer.lr"][1].endswith("  methods.mpn.training.optimizer.lr")
    assert rows["seed"] == ("0", f"the first of params.yaml:{line_of(REPO / 'params.yaml', r'^seeds:')}  seeds")
    sources = re.compile(
        r"(params\.yaml|workflow/\S+\.yaml):\d+  \S+|default in code: src/dmlbench/\S+\.py:\d+ .*"
        r"|the run's --(dataset|method)|the first of .*"
    )
    assert all(sources.fullmatch(comment) for _, comment in rows.values()), rows


def test_show_method_prints_the_base_chain(capsys: pytest.CaptureFixture, monkeypatch: pytest.MonkeyPatch):
    monkeypatch.chdir(REPO)
    assert main(["show", "method", "dnc_nosplit"]) == 0
    lines = capsys.readouterr().out.splitlines()
    chain = [line.split("#")[0].strip() for line in lines[1:4]]
    assert chain == ["dnc_nosplit", "base: dnc", "base: margin"]
    assert lines[3].split("#")[1].strip().startswith(f"params.yaml:{line_of(REPO / 'params.yaml', r'^  margin:')}")
    assert any(line.startswith("loss.name = margin ") and "methods.margin.loss.name" in line for line in lines)


@pytest.mark.parametrize(
    ("argv", "message"),
    [
        (
            ["show", "run", "--dataset", "synthetic", "--method", "tripplet"],
            "'methods.tripplet' is not defined (did you mean 'triplet'?)",
        ),
        (["show", "run", "--dataset", "synthetc", "--method", "triplet"], "(did you mean 'synthetic'?)"),
        (["show", "method", "dnc_nosplt"], "'methods.dnc_nosplt' is not defined (did you mean 'dnc_nosplit'?)"),
        (["show", "run", "--dataset", "synthetic", "--method", "triplet", "--config", "=3"], "KEY=VALUE"),
    ],
)
def test_an_unknown_name_gets_a_suggestion(
    capsys: pytest.CaptureFixture, monkeypatch: pytest.MonkeyPatch, argv: list[str], message: str
):
    monkeypatch.chdir(REPO)
    assert main(argv) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and message in err, err


def test_run_yaml_is_written_before_training_starts(tmp_path: Path, monkeypatch: pytest.MonkeyPatch):
    """A run that stops in its first step has its run.yaml already, in its scratch folder (the run folder
    holds only a finished run's files): the resolved run, as the checkpoint stores it."""
    from dmlbench.training.trainer import Trainer

    manifest = write_tiny_dataset(tmp_path / "tiny", num_classes=12)
    overlay = tmp_path / "overlay.yaml"
    overlay.write_text(
        yaml.safe_dump(
            {
                "training": {
                    "epochs": 1,
                    "val_fraction": 0.34,
                    "device": "cpu",
                    "embedding_dim": 8,
                    "eval_batch_size": 16,
                    "backbone": {"width": 4, "pretrained": None, "freeze_bn": False},
                    "image": {"resize": 24, "test_crop": 20, "train_crop": 20},
                    "sampler": {"classes_per_batch": 3, "images_per_class": 3, "batches_per_epoch": 2},
                }
            }
        )
    )

    def stop(self, *args, **kwargs):
        raise RuntimeError("stopped in the first step")

    monkeypatch.setattr(Trainer, "fit", stop)
    out = tmp_path / "run"
    assert (
        main(
            [
                "train",
                "--dataset",
                "synthetic",
                "--method",
                "triplet",
                "--seed",
                "2",
                "--manifest",
                str(manifest),
                "--out",
                str(out),
                "--scratch-dir",
                str(tmp_path / "scratch"),
                "--no-progress",
                "--config",
                PARAMS,
                "--config",
                str(overlay),
            ]
        )
        == 2
    )
    text = (tmp_path / "scratch" / "run.yaml").read_text()
    assert yaml.safe_load(text) == resolve_run(load_config([PARAMS, overlay]), "synthetic", "triplet", 2)
    assert "dmlbench show run --dataset synthetic --method triplet --seed 2" in text
    assert not out.exists()
