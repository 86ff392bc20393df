"""What exists: methods, tables, figures, datasets, losses and backbones, one line each (``dmlbench list``)."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from dmlbench.config import ensemble_spec, resolve_method
from dmlbench.errors import did_you_mean

#: What ``dmlbench list`` can list.
KINDS: tuple[str, ...] = ("methods", "tables", "figures", "datasets", "losses", "backbones")


def _method_line(config: Mapping[str, Any], name: str) -> str:
    method = resolve_method(config, name)
    ensemble = ensemble_spec(config, name)
    if ensemble is not None:
        what = f"ensemble of {ensemble[1]} × {ensemble[0]}"
    elif method.get("recipe") == "reference":
        what = "reference row (not trained)"
    else:
        what = f"recipe {method['recipe']}, loss {method['loss']['name']}"
    if "checkpoint_of" in config["methods"][name]:
        what += f", re-embeds {config['methods'][name]['checkpoint_of']}'s checkpoint"
    return f"{method.get('label', name)}: {what}"


def _table_line(spec: Mapping[str, Any]) -> str:
    return f"{spec.get('title', '')} ({len(spec['methods'])} methods on {', '.join(spec['datasets'])})"


def _figure_line(spec: Mapping[str, Any]) -> str:
    return f"{spec.get('title', '')} ({spec['kind']} on {spec['dataset']})"


def _dataset_line(spec: Mapping[str, Any]) -> str:
    return f"{spec.get('label', '')} (kind {spec['kind']})"


def _first_line(doc: str | None) -> str:
    return plain_text((doc or "").strip().split("\n")[0])


def _backbone_lines() -> dict[str, str]:
    """The registered backbones, then the ``timm:<model>`` form (timm is imported here only, for its count)."""
    from dmlbench.models.backbones import BACKBONES
    from dmlbench.models.backbones.timm_backbone import timm_model_count

    lines = {name: _first_line(build.__doc__) for name, build in BACKBONES.items()}
    count = timm_model_count()
    available = (
        f"any of timm's {count} models, e.g. timm:resnet18, timm:resnet18.a1_in1k (a pretrained tag)"
        if count is not None
        else "timm is not installed: pip install 'dmlbench[timm]'"
    )
    lines["timm:<model>"] = (
        f"{available}; named stages where the model exposes them; weights from a local file "
        f"or timm's cache (pretrained: timm), never downloaded"
    )
    return lines


def _loss_lines() -> dict[str, str]:
    """The built-in losses, then the ``pml:<LossClass>`` and miner forms (pytorch-metric-learning imported here, and
    only when it is installed)."""
    from dmlbench.losses.pml_adapter import PML_INSTALL, pml_class_names, pml_installed
    from dmlbench.losses.registry import LOSS_CLASSES

    lines = {name: f"{_first_line(cls.__doc__)} (paper-exact default)" for name, cls in LOSS_CLASSES.items()}
    if not pml_installed():
        lines["pml:<LossClass>"] = f"pytorch-metric-learning is not installed: {PML_INSTALL}"
        return lines
    losses, miners = pml_class_names("loss"), pml_class_names("miner")
    lines["pml:<LossClass>"] = (
        f"a pytorch-metric-learning loss, keyword arguments beside name ({len(losses)}: {', '.join(losses)})"
    )
    lines["pml:<MinerClass>"] = (
        f"a pytorch-metric-learning miner, as a pml: loss's miner (a name, or "
        f"{{name, ...keyword arguments}}; {len(miners)}: {', '.join(miners)})"
    )
    return lines


def plain_text(text: str) -> str:
    """A docstring line without reStructuredText markup (double backticks), for the console.

    >>> plain_text("Stages ``stem, pool``.")
    'Stages stem, pool.'
    """
    return text.replace("``", "")


def catalog(config: Mapping[str, Any], kind: str) -> dict[str, str]:
    """``{name: one-line description}`` of every ``kind`` (one of :data:`KINDS`) in ``config``, in file order.

    Raises:
        ValueError: an unknown ``kind`` (with a suggestion).
    """
    if kind == "backbones":
        return _backbone_lines()
    if kind == "losses":
        return _loss_lines()
    describe = {
        "methods": lambda name: _method_line(config, name),
        "tables": lambda name: _table_line(config["tables"][name]),
        "figures": lambda name: _figure_line(config["figures"][name]),
        "datasets": lambda name: _dataset_line(config["datasets"][name]),
    }
    if kind not in describe:
        raise ValueError(f"cannot list {kind!r}{did_you_mean(kind, KINDS)}; choose one of {', '.join(KINDS)}")
    return {name: describe[kind](name) for name in config.get(kind, {})}
