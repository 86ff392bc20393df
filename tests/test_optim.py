"""Optimiser construction (``training.optimizer``): weight decay coupled to the gradient or decoupled."""

from __future__ import annotations

import copy

import jsonschema
import pytest
import torch

from dmlbench.schema import schema
from dmlbench.settings import OptimizerSettings
from dmlbench.training.optim import build_optimizer, parameter_groups

LR, DECAY = 0.1, 0.5


def steps_with_zero_loss_gradient(config: dict, steps: int) -> float:
    """The weight w (starting at 1) after ``steps`` optimiser steps on a loss whose gradient is 0, so that
    only the weight decay moves it."""
    model = torch.nn.Linear(1, 1, bias=False)
    model.backbone = torch.nn.Identity()  # no backbone parameters: every weight is in the head group
    torch.nn.init.ones_(model.weight)
    optimizer = build_optimizer(OptimizerSettings(lr=LR, weight_decay=DECAY, **config), model, torch.nn.Module())
    for _ in range(steps):
        optimizer.zero_grad()
        (0.0 * model.weight).sum().backward()
        optimizer.step()
    return model.weight.item()


@pytest.mark.parametrize("name", ["adam", "radam"])
def test_decoupled_weight_decay_shrinks_the_weights_by_lr_times_decay(name):
    """w ← w (1 − lr·λ) per step, whatever the (here zero) gradient: after 10 steps (1 − 0.05)^10."""
    assert steps_with_zero_loss_gradient({"name": name, "decoupled_weight_decay": True}, 10) == pytest.approx(
        (1 - LR * DECAY) ** 10, rel=1e-6
    )


def test_coupled_weight_decay_goes_through_the_adaptive_step():
    """Adam, coupled: g = λw = 0.5, m̂ = g, v̂ = g², so the first step is lr·g/(|g| + ε) ≈ lr = 0.1, not lr·λ·w."""
    coupled = steps_with_zero_loss_gradient({"name": "adam", "decoupled_weight_decay": False}, 1)
    assert coupled == pytest.approx(1 - LR, rel=1e-6)
    assert steps_with_zero_loss_gradient({"name": "adam"}, 1) == coupled  # torch's default for adam: coupled
    # RAdam, coupled: the first 5 steps are plain momentum steps (= lr·λ·w), but from step 6 on the
    # rectified step divides the decay by its own RMS, so 10 steps end far from (1 − lr·λ)^10 ≈ 0.599
    radam = steps_with_zero_loss_gradient({"name": "radam"}, 10)
    assert abs(radam - (1 - LR * DECAY) ** 10) > 0.1


def test_adam_with_decoupled_decay_is_adamw():
    adamw = steps_with_zero_loss_gradient({"name": "adamw"}, 3)
    assert adamw == pytest.approx((1 - LR * DECAY) ** 3, rel=1e-6)
    assert steps_with_zero_loss_gradient({"name": "adamw", "decoupled_weight_decay": True}, 3) == adamw
    assert steps_with_zero_loss_gradient({"name": "adam", "decoupled_weight_decay": True}, 3) == pytest.approx(
        adamw, rel=1e-6
    )


@pytest.mark.parametrize("name, decoupled, message", [("adamw", False, "use adam"), ("sgd", True, "only has coupled")])
def test_impossible_weight_decay_combinations_are_errors(name, decoupled, message):
    with pytest.raises(ValueError, match=message):
        steps_with_zero_loss_gradient({"name": name, "decoupled_weight_decay": decoupled}, 1)


def test_schema_accepts_only_a_boolean_decoupled_weight_decay(params):
    config = copy.deepcopy(params)
    config["training"]["optimizer"]["decoupled_weight_decay"] = True
    jsonschema.validate(config, schema())
    config["training"]["optimizer"]["decoupled_weight_decay"] = "yes"
    with pytest.raises(jsonschema.ValidationError):
        jsonschema.validate(config, schema())


class HookedModel(torch.nn.Module):
    """A backbone, a head and a part of the head (``part``) that asks for 10 × the head's lr."""

    def __init__(self):
        super().__init__()
        self.backbone = torch.nn.Linear(2, 2)
        self.head = torch.nn.Linear(2, 2)
        self.part = torch.nn.Linear(2, 2)

    def parameter_group_multipliers(self) -> dict[str, tuple[torch.nn.Module, float]]:
        return {"part": (self.part, 10.0)}


def group_ids(groups: list[dict]) -> dict[str, tuple[float, set[int]]]:
    return {g["name"]: (g["lr"], {id(p) for p in g["params"]}) for g in groups}


def test_parameter_group_multipliers_split_a_group_at_a_multiple_of_its_lr():
    """head lr = 0.1 × 3; the hooked part: 0.3 × 10 = 3, and it leaves the head group."""
    model = HookedModel()
    settings = OptimizerSettings(name="adam", lr=0.1, head_lr_multiplier=3.0)
    groups = group_ids(parameter_groups(settings, model, torch.nn.Module()))
    assert list(groups) == ["backbone", "head", "head/part"]
    assert groups["head"] == (pytest.approx(0.3), {id(p) for p in model.head.parameters()})
    assert groups["head/part"] == (pytest.approx(3.0), {id(p) for p in model.part.parameters()})
    assert groups["backbone"] == (0.1, {id(p) for p in model.backbone.parameters()})


def test_a_loss_may_split_its_group_too_and_models_without_the_hook_keep_three_groups():
    model, loss = HookedModel(), HookedModel()
    del loss.backbone
    groups = group_ids(parameter_groups(OptimizerSettings(name="adam", lr=1.0, loss_lr_multiplier=2.0), model, loss))
    assert groups["loss/part"] == (pytest.approx(20.0), {id(p) for p in loss.part.parameters()})
    plain = torch.nn.Linear(1, 1)
    plain.backbone = torch.nn.Identity()
    groups = parameter_groups(OptimizerSettings(name="adam", lr=1.0), plain, torch.nn.Linear(1, 1))
    assert [g["name"] for g in groups] == ["head", "loss"]


def test_a_non_positive_multiplier_is_an_error():
    model = HookedModel()
    model.parameter_group_multipliers = lambda: {"part": (model.part, 0.0)}
    with pytest.raises(ValueError, match="head/part"):
        parameter_groups(OptimizerSettings(name="adam", lr=1.0), model, torch.nn.Module())


def test_the_cpu_keeps_the_default_optimiser_implementation():
    """Fused kernels (one per step, AMP scaling inside) are for CUDA parameters only: on the CPU the default
    implementation, whose numbers are the reference ones, is kept."""
    model = torch.nn.Linear(3, 2)
    model.backbone = torch.nn.Identity()
    for name in ("sgd", "adam", "adamw"):
        assert not build_optimizer(OptimizerSettings(name=name, lr=0.1), model, torch.nn.Module()).defaults.get("fused")
