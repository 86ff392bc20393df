"""``dmlbench show``: a run's effective settings, or a method's ``base:`` chain, each with its source.

    dmlbench show run --dataset D --method M [--seed S] [--config YAML|KEY=VALUE ...]
    dmlbench show method M [--dataset D] [--config YAML|KEY=VALUE ...]

``show run`` prints one line per setting of the resolved run (what the run's ``run.yaml`` holds, and its
checkpoint), ``key = value  # file:line  parameter``: the file and line that set it and the parameter
(the dotted key of the merged configuration) it comes from — ``params.yaml``, an experiments file, an
overlay, a ``KEY=VALUE`` override (``command line``), through a method's ``base:`` chain, its
``per_dataset`` or a dataset's ``training``. Then the recipe options, loss hyperparameters and backbone
arguments that no file sets, with the line of code that gives their default (``default in code: …``).
Sources are found only here (:mod:`dmlbench.provenance`), so loading the parameters stays as fast as it was.
"""

from __future__ import annotations

import argparse
import ast
import dataclasses
import inspect
import textwrap
from collections.abc import Callable, Mapping, Sequence
from pathlib import Path
from typing import Any

import yaml

from dmlbench.config import (
    ConfigError,
    checkpoint_source,
    ensemble_spec,
    method_chain,
    resolve_method,
    resolve_run,
    section,
)
from dmlbench.params import validate_config
from dmlbench.provenance import (
    Layers,
    Setting,
    flow,
    format_settings,
    generated_from,
    method_settings,
    run_settings,
    shown_path,
)


def split_configs(items: Sequence[str] | None) -> tuple[list[str], dict[str, Any]]:
    """``--config`` values: parameter files (default ``params.yaml``) and ``KEY=VALUE`` overrides (an item with
    ``=`` that is not a file; a dotted KEY sets a nested key, VALUE is read as YAML), as one nested mapping.

    >>> split_configs(["params.yaml", "training.epochs=3", "seeds=[0, 1]"])
    (['params.yaml'], {'training': {'epochs': 3}, 'seeds': [0, 1]})
    """
    files: list[str] = []
    overrides: dict[str, Any] = {}
    for item in items or []:
        key, equals, text = item.partition("=")
        if not equals or Path(item).exists():
            files.append(item)
            continue
        if not key or any(not part for part in key.split(".")):
            raise ConfigError(
                f"--config {item!r}: expected a parameter file or KEY=VALUE with a dotted KEY such as training.epochs=3"
            )
        try:
            value = yaml.safe_load(text)
        except yaml.YAMLError as err:
            raise ConfigError(f"--config {item!r}: the value is not valid YAML ({err})") from err
        node = overrides
        *parents, last = key.split(".")
        for part in parents:
            if not isinstance(node.get(part), dict):
                node[part] = {}
            node = node[part]
        node[last] = value
    return files or ["params.yaml"], overrides


def load_layers(items: Sequence[str] | None) -> tuple[Layers, dict[str, Any], str]:
    """The layers of the ``--config`` items, their merged and validated configuration, and its name."""
    files, overrides = split_configs(items)
    layers = Layers.read(files, overrides)
    config = layers.merged()
    name = " + ".join(files) + (" + command line" if overrides else "")
    validate_config(config, source=name)
    return layers, config, name


# ------------------------------------------------------------------------------------------ defaults in code
def _plain(value: Any) -> Any:
    """A default as YAML can write it (tuples as lists; anything else that is not plain data as text)."""
    if isinstance(value, tuple | list):
        return [_plain(item) for item in value]
    if value is None or isinstance(value, bool | int | float | str):
        return value
    return str(value)


def code_source(obj: Callable[..., Any] | type, name: str, owner: str) -> str:
    """``default in code: FILE:LINE (owner.name)``: the line of the field or argument ``name`` in ``obj``'s source."""
    try:
        lines, start = inspect.getsourcelines(obj)
        file = inspect.getsourcefile(obj)
    except (OSError, TypeError):
        file = None
    if file is None:
        return f"default in code ({owner}.{name})"
    tree = ast.parse(textwrap.dedent("".join(lines)))
    line = next(
        (
            node.lineno
            for node in ast.walk(tree)
            if (isinstance(node, ast.AnnAssign) and isinstance(node.target, ast.Name) and node.target.id == name)
            or (isinstance(node, ast.arg) and node.arg == name)
        ),
        1,
    )
    return f"default in code: {shown_path(file)}:{start + line - 1} ({owner}.{name})"


def code_defaults(run: Mapping[str, Any]) -> list[Setting]:
    """The settings of a resolved run that no parameter sets and code gives a default: the recipe's options
    (its options dataclass), the loss's hyperparameters (its keyword-only arguments), the backbone builder's
    arguments (also those set to null, which leaves them to the builder). Imports the recipe (and torch)."""
    from dmlbench.losses import registry
    from dmlbench.methods import RECIPES, recipe_class
    from dmlbench.models.backbones import BACKBONES, MODEL_KEYS

    found = []
    method = run["method_config"]
    options_class = recipe_class(method["recipe"]).options_class if method.get("recipe") in RECIPES else None
    if options_class is not None:
        given = method.get("options") or {}
        for field in dataclasses.fields(options_class):
            if field.name not in given:
                default = field.default if field.default_factory is dataclasses.MISSING else field.default_factory()
                found.append(
                    Setting(
                        ("method_config", "options", field.name),
                        _plain(default),
                        "",
                        code_source(options_class, field.name, options_class.__name__),
                    )
                )
    loss = method.get("loss")
    loss_name = loss.get("name") if isinstance(loss, Mapping) else None
    loss_class = registry.LOSS_CLASSES.get(loss_name) if isinstance(loss_name, str) else None
    if loss_class is not None:
        for key, default in registry.loss_defaults(loss["name"]).items():
            if key not in loss:
                found.append(
                    Setting(
                        ("method_config", "loss", key),
                        _plain(default),
                        "",
                        code_source(loss_class.__init__, key, loss_class.__name__),
                    )
                )
    backbone = run["training"]["backbone"]
    builder = BACKBONES.get(backbone.get("name"))
    if builder is not None:
        for parameter in inspect.signature(builder).parameters.values():
            if (
                parameter.default is not parameter.empty
                and parameter.name not in MODEL_KEYS
                and backbone.get(parameter.name) is None
            ):
                found.append(
                    Setting(
                        ("training", "backbone", parameter.name),
                        _plain(parameter.default),
                        "",
                        code_source(builder, parameter.name, builder.__name__),
                    )
                )
    return found


def with_defaults(settings: list[Setting], defaults: list[Setting]) -> list[Setting]:
    """``settings`` with each default after the settings of its mapping; a default replaces a null setting
    (null leaves a backbone argument to the builder), its source naming where the null was set."""
    by_path = {setting.path: i for i, setting in enumerate(settings)}
    result: list[Setting] = list(settings)
    after: dict[int, list[Setting]] = {}
    for default in defaults:
        if default.path in by_path:
            null = settings[by_path[default.path]]
            result[by_path[default.path]] = dataclasses.replace(
                default, source=f"{default.source}; null in {null.source} leaves it to the code"
            )
            continue
        parent = default.path[:-1]
        anchor = max(
            (i for i, setting in enumerate(settings) if setting.path[: len(parent)] == parent),
            default=max((i for i, s in enumerate(settings) if s.path[0] == parent[0]), default=len(settings)),
        )
        after.setdefault(anchor, []).append(default)
    merged: list[Setting] = []
    for i, setting in enumerate(result):
        merged.append(setting)
        merged.extend(after.get(i, []))
    merged.extend(after.get(len(settings), []))
    return merged


# ------------------------------------------------------------------------------------------ the commands
def _method_note(config: Mapping[str, Any], method: str) -> str:
    ensemble = ensemble_spec(config, method)
    if ensemble is not None:
        return (
            f"# {method} is an ensemble: it is not trained; its seed s concatenates {ensemble[1]} runs of "
            f"{ensemble[0]} (the settings below are those of each member)\n"
        )
    trained = checkpoint_source(config, method)
    if trained is not None:
        return (
            f"# {method} is not trained: it re-embeds {trained}'s checkpoints with its own test-time options "
            f"(checkpoint_of)\n"
        )
    return ""


def show_run(args: argparse.Namespace) -> str:
    layers, config, name = load_layers(args.config)
    seed = args.seed if args.seed is not None else section(config, "seeds")[0]
    run = resolve_run(config, args.dataset, args.method, seed)
    settings = with_defaults(run_settings(layers, config, run), code_defaults(run))
    if args.seed is None:
        settings = [
            dataclasses.replace(setting, parameter="seeds", source=f"the first of {layers.where(('seeds',))}")
            if setting.path == ("seed",)
            else setting
            for setting in settings
        ]
    return (
        f"# run {args.dataset}/{args.method}/seed{seed} from {name}: each effective setting, then where it is "
        f"set (file:line) and the parameter that sets it\n{_method_note(config, args.method)}"
        + format_settings(settings)
    )


def show_method(args: argparse.Namespace) -> str:
    layers, config, name = load_layers(args.config)
    if args.dataset is not None:
        section(config, "datasets", args.dataset)
    chain = method_chain(config, args.method)
    rows = []
    for depth, member in enumerate(chain):
        entry = config["methods"][member]
        where = ", ".join(
            layer.where(("methods", member))
            for layer in layers.layers
            if "methods" in layer.data and member in (layer.data["methods"] or {})
        )
        where = where or generated_from(config, layers, ("methods", member))
        keys = ", ".join(key for key in entry if key != "base")
        rows.append((f"{'  ' * depth}{'base: ' if depth else ''}{member}", where, keys))
    width = max(len(row[0]) for row in rows)
    on = f" on dataset {args.dataset}" if args.dataset else ""
    lines = [
        (
            f"# the base chain of {args.method} from {name}: each entry is merged over its base (its own keys "
            f"win{', then its per_dataset' if args.dataset else ''})\n"
        )
    ]
    lines += [f"{text:<{width}}  # {where}  sets {keys or 'nothing'}\n" for text, where, keys in rows]
    resolved = resolve_method(config, args.method, args.dataset)
    lines.append(f"# methods.{args.method} resolved{on}:\n{_method_note(config, args.method)}")
    return "".join(lines) + format_settings(method_settings(layers, config, args.method, resolved, args.dataset))


def show(args: argparse.Namespace) -> str:
    """The text that ``dmlbench show run|method`` prints."""
    return {"run": show_run, "method": show_method}[args.what](args)


__all__ = ["code_defaults", "flow", "load_layers", "show", "show_method", "show_run", "split_configs"]
