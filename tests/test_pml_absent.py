"""Without pytorch-metric-learning: every built-in loss trains, the catalog still lists the losses, and a ``pml:``
loss is an error naming the loss, the method and how to install the package; dead schema keys are refused."""

from __future__ import annotations

import sys

import pytest
import torch
import torch.nn.functional as F

from dmlbench.catalog import catalog
from dmlbench.config import ConfigError
from dmlbench.losses.registry import LOSS_NAMES, build_loss
from dmlbench.methods.validation import check_planned_methods
from dmlbench.params import validate_config

PML_LOSS = {"name": "pml:MultiSimilarityLoss", "miner": "pml:MultiSimilarityMiner"}


@pytest.fixture
def without_pml(monkeypatch: pytest.MonkeyPatch) -> None:
    """pytorch_metric_learning as if not installed: a None entry in sys.modules makes it unfindable and unimportable."""
    monkeypatch.setitem(sys.modules, "pytorch_metric_learning", None)


def test_the_loss_catalog_works_without_pml(params: dict, without_pml: None) -> None:
    lines = catalog(params, "losses")
    assert list(lines)[: len(LOSS_NAMES)] == list(LOSS_NAMES)
    assert lines["pml:<LossClass>"].startswith("pytorch-metric-learning is not installed: pip install -e '.[pml]'")
    assert "pml:<MinerClass>" not in lines


@pytest.mark.parametrize("name", LOSS_NAMES)
def test_every_built_in_loss_trains_without_pml(name: str, without_pml: None) -> None:
    """pytorch-metric-learning is an extra: no built-in loss may import it (margin and norm_softmax once did)."""
    torch.manual_seed(0)
    loss_fn = build_loss({"name": name}, num_classes=4, embedding_dim=8)
    embeddings = F.normalize(torch.randn(8, 8), dim=1).requires_grad_()
    loss = loss_fn(embeddings, torch.tensor([0, 0, 1, 1, 2, 2, 3, 3]))
    loss.backward()
    assert torch.isfinite(loss) and embeddings.grad is not None


def test_the_loss_catalog_lists_pml_classes_when_installed(params: dict) -> None:
    assert "MultiSimilarityLoss" in catalog(params, "losses")["pml:<LossClass>"]


def test_a_pml_loss_without_pml_names_the_loss_and_the_fix(without_pml: None) -> None:
    expected = (
        r"^loss\.name = 'pml:MultiSimilarityLoss': a pytorch-metric-learning loss needs the package "
        r"pytorch_metric_learning, which is not installed: pip install -e '\.\[pml\]'"
    )
    with pytest.raises(ValueError, match=expected):
        build_loss(PML_LOSS, num_classes=4, embedding_dim=8)


def test_a_config_naming_a_pml_loss_without_pml_names_the_method(params: dict, without_pml: None) -> None:
    """The planning check (Snakemake runs it before any job) builds every planned loss."""
    params["methods"]["ms_pml"] = {"label": "MS (PML)", "recipe": "baseline", "loss": PML_LOSS}
    with pytest.raises(
        ConfigError,
        match=r"methods\.ms_pml on \w+: loss\.name = 'pml:MultiSimilarityLoss': .* not "
        r"installed: pip install -e '\.\[pml\]'",
    ):
        check_planned_methods(params)


def test_the_dead_head_key_is_refused(params: dict) -> None:
    """``methods.<m>.head`` was accepted and read by nothing; now the schema refuses it, naming it."""
    params["methods"]["triplet"]["head"] = {}
    with pytest.raises(ConfigError, match=r"methods\.triplet.*'head'"):
        validate_config(params)
