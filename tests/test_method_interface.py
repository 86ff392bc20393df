"""The recipe interface shared by all methods: options, `base:` inheritance, hooks the trainer and embed step call."""

from __future__ import annotations

import copy
import dataclasses
import json

import pandas as pd
import pytest
import torch

from dmlbench.evaluation import evaluate_file
from dmlbench.methods import OptionsError, Recipe, parse_options
from dmlbench.params import validate_config
from dmlbench.settings import OptimizerSettings
from dmlbench.training.checkpoint import load_checkpoint
from dmlbench.training.embed import embed_run
from dmlbench.training.trainer import train_run

from conftest import parameter_group_ids, tiny_run

from dmlbench.config import ConfigError, resolve_method, resolve_run


@dataclasses.dataclass(frozen=True)
class DemoOptions:
    learners: int = 2
    weight: float = 1.0
    stages: tuple[str, ...] = ("stage1",)
    mode: str | None = None


def test_options_defaults_overrides_and_lists_become_tuples():
    options = parse_options(DemoOptions, {"weight": 2, "stages": ["a", "b"]}, "methods.x.options")
    assert options == DemoOptions(learners=2, weight=2, stages=("a", "b"))
    assert parse_options(DemoOptions, None, "w") == DemoOptions()


@pytest.mark.parametrize(
    ("values", "message"),
    [
        ({"learner": 3}, r"methods\.x\.options\.learner is not an option.*known: learners, weight"),
        ({"learners": 2.5}, r"methods\.x\.options\.learners = 2\.5 does not have the expected type"),
        ({"learners": True}, r"learners = True"),
        ({"stages": ["a", 1]}, r"stages"),
    ],
)
def test_options_errors_name_the_key(values, message):
    with pytest.raises(OptionsError, match=message):
        parse_options(DemoOptions, values, "methods.x.options")


def test_baseline_recipe_rejects_options(params):
    run = resolve_run(params, "synthetic", "triplet", 0)
    run["method_config"]["options"] = {"x": 1}
    with pytest.raises(ValueError, match="methods.triplet.options: recipe 'baseline' takes no options"):
        Recipe(run)


def with_methods(params: dict, **methods: dict) -> dict:
    config = copy.deepcopy(params)
    config["methods"].update(methods)
    return config


def test_base_inheritance_merges_deeply_and_resolves_the_run(params):
    config = with_methods(
        params,
        margin_long={"base": "margin", "label": "Margin, long", "training": {"epochs": 3, "optimizer": {"lr": 0.1}}},
        margin_longer={"base": "margin_long", "loss": {"margin": 0.5}},
    )
    validate_config(config)
    method = resolve_method(config, "margin_longer")
    assert method["loss"] == {"name": "margin", "margin": 0.5, "beta": 1.2}
    assert method["label"] == "Margin, long" and "base" not in method
    run = resolve_run(config, "synthetic", "margin_longer", 0)
    assert run["training"]["epochs"] == 3
    assert run["training"]["optimizer"]["lr"] == 0.1
    assert run["training"]["optimizer"]["loss_lr_multiplier"] == 10.0  # from the base of the base


@pytest.mark.parametrize(
    ("methods", "message"),
    [
        ({"a": {"base": "b"}, "b": {"base": "a"}}, "makes a cycle"),
        ({"a": {"base": "nope"}}, "methods.a.base = 'nope' is not defined"),
        ({"a": {"label": "no recipe"}}, r"methods\.a \(with its bases\) defines no recipe or loss"),
    ],
)
def test_bad_bases_are_clear_errors(params, methods, message):
    with pytest.raises(ConfigError, match=message):
        validate_config(with_methods(params, **methods))


class LoggingRecipe(Recipe):
    """A baseline that counts epochs in its state and logs/summarises them (exercises every hook)."""

    def __init__(self, run):
        super().__init__(run)
        self.epochs_seen = 0
        self.batches = 0

    def on_epoch_start(self, epoch, model, context):
        assert context.data.train is not None and context.eval_batch_size == 16
        self.epochs_seen += 1

    def training_loss(self, model, loss, images, labels, indices):
        assert indices.shape == labels.shape and int(indices.max()) < 10_000
        self.batches += 1
        return super().training_loss(model, loss, images, labels, indices)

    def epoch_log(self):
        return {"epochs_seen": float(self.epochs_seen)}

    def summary(self):
        return {"batches_seen": float(self.batches)}

    def state_dict(self):
        return {"epochs_seen": self.epochs_seen, "batches": self.batches}

    def load_state_dict(self, state):
        self.epochs_seen, self.batches = state["epochs_seen"], state["batches"]

    def embedding_views(self, model):
        return {"first_half": (0, 4)}


@pytest.fixture
def logging_recipe(monkeypatch):
    monkeypatch.setitem(
        __import__("dmlbench.methods", fromlist=["RECIPES"]).RECIPES, "logging", f"{__name__}:LoggingRecipe"
    )


def test_recipe_hooks_reach_log_checkpoint_embeddings_and_metrics(params, tiny_manifest, tmp_path, logging_recipe):
    run = tiny_run(params, "triplet", epochs=3)
    run["method_config"]["recipe"] = "logging"
    run["training"]["log_train_recall"] = True
    train_run(run, tiny_manifest, tmp_path / "out", tmp_path / "scratch", progress=False)
    log = pd.read_csv(tmp_path / "out" / "log.csv")
    assert log["epochs_seen"].tolist() == [1.0, 2.0, 3.0]
    assert log["train_R@1"].between(0, 1).all()
    summary = load_checkpoint(tmp_path / "out" / "checkpoint.pt")["summary"]
    assert summary["batches_seen"] == 6.0  # the recipe's summary, beside the trainer's init-parity numbers
    assert set(summary) == {
        "batches_seen",
        "health/init_val_r1",
        "health/init_val_r1_linear_head",
        "health/init_val_r1_linear_head_lowest",
        "health/init_gap",
        "health/init_shortfall",
    }
    embed_run(tmp_path / "out" / "checkpoint.pt", tiny_manifest, tmp_path / "emb.npz")
    metrics = evaluate_file(tmp_path / "emb.npz", tmp_path / "metrics.json", [1, 2])
    assert metrics["batches_seen"] == 6.0
    width, dim = run["training"]["backbone"]["width"], run["training"]["embedding_dim"]
    convs = [
        (3, width),
        (width, width),
        (width, width),
        (width, 2 * width),
        (2 * width, 2 * width),
        (2 * width, 4 * width),
        (4 * width, 4 * width),
        (4 * width, 8 * width),
        (8 * width, 8 * width),
    ]
    by_hand = sum(9 * c_in * c_out + 2 * c_out for c_in, c_out in convs) + (8 * width + 1) * dim  # conv + BN + linear
    assert metrics["num_parameters"] == by_hand
    assert metrics["gflops"] > 0
    assert 0 <= metrics["first_half/R@1"] <= 1
    assert json.loads((tmp_path / "metrics.json").read_text())["first_half/R@1"] == metrics["first_half/R@1"]


def test_recipe_state_survives_an_interruption(params, tiny_manifest, tmp_path, logging_recipe):
    run = tiny_run(params, "triplet", epochs=3)
    run["method_config"]["recipe"] = "logging"

    class Stop(Exception):
        pass

    def stop(epoch: int) -> None:
        if epoch == 2:
            raise Stop

    with pytest.raises(Stop):
        train_run(run, tiny_manifest, tmp_path / "out", tmp_path / "scratch", progress=False, on_epoch_end=stop)
    train_run(run, tiny_manifest, tmp_path / "out", tmp_path / "scratch", progress=False)
    assert pd.read_csv(tmp_path / "out" / "log.csv")["epochs_seen"].tolist() == [1.0, 2.0, 3.0]
    summary = load_checkpoint(tmp_path / "out" / "checkpoint.pt")["summary"]
    assert summary["batches_seen"] == 6.0  # the recipe's summary, beside the trainer's init-parity numbers
    assert set(summary) == {
        "batches_seen",
        "health/init_val_r1",
        "health/init_val_r1_linear_head",
        "health/init_val_r1_linear_head_lowest",
        "health/init_gap",
        "health/init_shortfall",
    }


def test_optimizer_puts_every_non_backbone_parameter_in_the_head_group(params):
    from dmlbench.training.optim import parameter_groups

    run = tiny_run(params, "triplet")
    model = Recipe(run).build_model()
    model.extra = torch.nn.Linear(2, 2)  # e.g. an attention module outside the backbone
    groups = {g["name"]: g for g in parameter_groups(Recipe(run).settings.optimizer, model, torch.nn.Module())}
    head_ids = {id(p) for p in groups["head"]["params"]}
    assert id(model.extra.weight) in head_ids and id(model.head.linear.weight) in head_ids
    assert not head_ids & {id(p) for p in groups["backbone"]["params"]}
    total = sum(len(g["params"]) for g in groups.values())
    assert total == len([p for p in model.parameters() if p.requires_grad])


class CopyingModel(torch.nn.Module):
    """A backbone, a copy of one of its layers (``backbone_copies``) and a head."""

    def __init__(self):
        super().__init__()
        self.backbone = torch.nn.Sequential(torch.nn.Linear(3, 3), torch.nn.Linear(3, 3))
        self.copy = copy.deepcopy(self.backbone[1])
        self.head = torch.nn.Linear(3, 2)

    def backbone_copies(self) -> list[torch.nn.Module]:
        return [self.copy]


def test_optimizer_trains_backbone_copies_at_the_backbone_lr():
    from dmlbench.training.optim import parameter_groups

    model = CopyingModel()
    config = OptimizerSettings(name="adam", lr=0.1, head_lr_multiplier=10.0)
    groups = {g["name"]: g for g in parameter_groups(config, model, torch.nn.Module())}
    assert groups["backbone"]["lr"] == 0.1 and groups["head"]["lr"] == pytest.approx(1.0)
    ids = parameter_group_ids(model)
    assert ids["backbone"] == {id(p) for part in (model.backbone, model.copy) for p in part.parameters()}
    assert ids["head"] == {id(p) for p in model.head.parameters()}


def test_val_split_seed_seed_gives_one_class_split_per_run(params, tiny_manifest):
    from dmlbench.training.data import load_run_data

    def val_classes(seed: int, split_seed) -> set[int]:
        run = tiny_run(params, "triplet", seed=seed)
        run["training"].update(val_fraction=0.5, val_split_seed=split_seed)
        return set(load_run_data(run, tiny_manifest).val.labels.tolist())

    assert val_classes(0, 0) == val_classes(1, 0)
    per_run = [val_classes(s, "seed") for s in range(4)]
    assert per_run[0] == val_classes(0, 0)  # 'seed' with seed 0 is split seed 0
    assert len({frozenset(c) for c in per_run}) > 1


@pytest.mark.parametrize(
    ("methods", "message"),
    [
        ({"ens": {"ensemble_members": 2}}, "needs a 'base'"),
        ({"ens": {"base": "margin", "ensemble_members": 2, "options": {}}}, r"may set only 'label'"),
        (
            {"ens": {"base": "margin", "ensemble_members": 2}, "ens2": {"base": "ens", "ensemble_members": 2}},
            "is itself an ensemble",
        ),
    ],
)
def test_ensemble_methods_only_name_their_members(params, methods, message):
    with pytest.raises(ConfigError, match=message):
        validate_config(with_methods(params, **methods))


def test_ensemble_jobs_concatenate_member_runs(tmp_path):
    import subprocess
    import sys

    from conftest import REPO

    out = subprocess.run(
        [
            sys.executable,
            "-m",
            "snakemake",
            "-n",
            "-p",
            "--forceall",
            "results/runs/synthetic/mpn_ens2/seed1/metrics.json",
        ],
        cwd=REPO,
        capture_output=True,
        text=True,
        check=True,
    ).stdout
    command = next(line for line in out.splitlines() if "dmlbench ensemble" in line)
    members = [f"results/runs/synthetic/mpn/seed{s}/embeddings.npz" for s in (2, 3)]
    assert all(m in command for m in members)
    assert "method=mpn_ens2" not in out.split("rule train")[-1].split("rule ")[0]  # ensembles are not trained


@pytest.mark.parametrize(
    ("value", "passes"),
    [
        (211 / 400 - 203 / 400, True),  # 0.020000000000000018: on the bound up to float rounding
        (0.02, True),
        (0.0201, False),  # 0.01 points over: a real shortfall
        (0.0, True),
    ],
)
def test_a_value_on_the_bound_up_to_rounding_passes_its_health_check(value: float, passes: bool) -> None:
    """A D&C run whose init shortfall was 8 of 400 validation queries (0.02) was marked failing (got 0.02)."""
    from dmlbench.methods.health import failed_checks, init_parity_check

    assert (failed_checks([init_parity_check()], {"health/init_shortfall": value}) == []) is passes


def test_a_value_on_a_lower_bound_up_to_rounding_passes() -> None:
    from dmlbench.methods.health import HealthCheck

    check = HealthCheck("health/mask_std", minimum=0.03)
    assert check.passes(0.29 - 0.26) and not check.passes(0.0299)  # 0.02999999999999997 is on the bound
