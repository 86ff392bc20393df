"""A method's search space: ``methods.<m>.tuning.space``, dotted setting → range.

::

    tuning:
      space:
        training.optimizer.lr: {type: float, low: 2.0e-5, high: 2.0e-3, log: true}
        loss.margin: {type: float, low: 0.05, high: 0.5}
        options.num_clusters: {type: categorical, choices: [2, 4, 8]}

A key names a setting of the tuned run: ``training.optimizer.*``, ``training.schedule.*`` or
``training.sampler.*`` (the run's resolved ``training``), ``loss.*`` or ``options.*`` (the method's
resolved entry). It must be a setting the run already has, so that a misspelt key is an error rather
than a setting no recipe reads. The space is read from the method's own entry, never inherited through
``base:`` (an ablation that switched a knob off must not tune it back on), and never becomes a setting
of the method's own runs (:func:`dmlbench.config.resolve_method` drops it).
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from dmlbench.config import ConfigError, deep_merge, section
from dmlbench.sweeps import nested, value_text

if TYPE_CHECKING:  # optuna is imported by the tune job only
    import optuna

#: the key of a method entry that holds its tuning, and of the space inside it.
TUNING_KEY = "tuning"
SPACE_KEY = "space"


@dataclass(frozen=True)
class Range:
    """One setting's range: ``kind`` float or int in ``[low, high]`` (``log``: sampled on a log scale), or
    categorical ``choices``."""

    key: str
    kind: str
    low: float | int | None = None
    high: float | int | None = None
    log: bool = False
    choices: tuple[Any, ...] = ()

    def suggest(self, trial: optuna.Trial) -> Any:
        """The trial's value of this setting (Optuna's parameter name is the dotted key)."""
        if self.kind == "categorical":
            return trial.suggest_categorical(self.key, list(self.choices))
        if self.low is None or self.high is None:
            raise ValueError(f"{self.key}: a {self.kind} range needs low and high (parse_range sets them)")
        if self.kind == "float":
            return trial.suggest_float(self.key, self.low, self.high, log=self.log)
        return trial.suggest_int(self.key, int(self.low), int(self.high), log=self.log)

    def contains(self, value: Any) -> bool:
        """Whether ``value`` is one this range can give (the same type: ``True`` is not the int 1).

        >>> Range("loss.margin", "float", 0.1, 0.5).contains(0.2), Range("x", "int", 1, 4).contains(2.0)
        (True, False)
        """
        if self.kind == "categorical":
            return any(value == choice and type(value) is type(choice) for choice in self.choices)
        if isinstance(value, bool) or not isinstance(value, int | float):
            return False
        if self.kind == "int" and not isinstance(value, int):
            return False
        return math.isfinite(value) and self.low <= value <= self.high

    def describe(self) -> str:
        """The range in a caption: ``[2e-05, 0.002] log``, ``{2, 4, 8}``.

        >>> Range("training.optimizer.lr", "float", 2e-5, 2e-3, log=True).describe()
        '[2e-05, 0.002] log'
        """
        if self.kind == "categorical":
            return "{" + ", ".join(value_text(choice) for choice in self.choices) + "}"
        return f"[{value_text(self.low)}, {value_text(self.high)}]" + (" log" if self.log else "")


def parse_range(key: str, spec: Mapping[str, Any], where: str) -> Range:
    """A schema-checked range entry as a :class:`Range`.

    Raises:
        ConfigError: ``low`` not below ``high``, or a log scale that reaches 0 or below.
    """
    if spec["type"] == "categorical":
        return Range(key, "categorical", choices=tuple(spec["choices"]))
    low, high, log = spec["low"], spec["high"], bool(spec.get("log", False))
    if not low < high:
        raise ConfigError(
            f"{where}: low = {low} is not below high = {high}; write [low, high] with low < high "
            f"(a fixed value is not tuned: set it in the method's entry instead)"
        )
    if log and low <= 0:
        raise ConfigError(f"{where}: log: true needs low > 0 (got {low}): a log scale cannot reach 0")
    return Range(key, spec["type"], low, high, log)


def method_space(config: Mapping[str, Any], method: str) -> dict[str, Range]:
    """``methods.<method>.tuning.space`` as ranges, in the written order (the method's own entry only).

    Raises:
        ConfigError: the method has no space, or a range is malformed (:func:`parse_range`).
    """
    entry = section(config, "methods", method)
    space = (entry.get(TUNING_KEY) or {}).get(SPACE_KEY)
    if not space:
        raise ConfigError(
            f"methods.{method} has no {TUNING_KEY}.{SPACE_KEY}, but a table of tuning.tables lists it: "
            f"give it the settings to search (e.g. {TUNING_KEY}: {{{SPACE_KEY}: {{training.optimizer.lr: "
            f"{{type: float, low: 2.0e-5, high: 2.0e-3, log: true}}}}}}; docs/tuning.md), or leave that "
            f"table out of tuning.tables"
        )
    return {
        key: parse_range(key, spec, f"methods.{method}.{TUNING_KEY}.{SPACE_KEY}.{key}") for key, spec in space.items()
    }


def _setting(run: Mapping[str, Any], key: str) -> tuple[bool, Any]:
    """Whether the resolved run has the dotted setting ``key`` (``training.*`` in its training, ``loss.*`` and
    ``options.*`` in its method), and its value."""
    root, rest = key.split(".", 1)
    node: Any = run["training"] if root == "training" else run["method_config"].get(root, {})
    for part in rest.split("."):
        if not isinstance(node, Mapping) or part not in node:
            return False, None
        node = node[part]
    return True, node


def check_space_keys(space: Mapping[str, Range], run: Mapping[str, Any], where: str) -> None:
    """Every key of ``space`` names a setting that the resolved ``run`` already has.

    Raises:
        ConfigError: naming the key and what the run has at its level.
    """
    for key in space:
        found, _ = _setting(run, key)
        if not found:
            root = key.rsplit(".", 1)[0]
            _, parent = _setting(run, root) if "." in root else (True, run["method_config"].get(root, {}))
            known = sorted(parent) if isinstance(parent, Mapping) else []
            raise ConfigError(
                f"{where}.{key}: the tuned run has no setting {key!r} (it has {known} under {root}); "
                f"tune a setting the method states (state it in the method's entry first)"
            )


def check_values(space: Mapping[str, Range], values: Mapping[str, Any], where: str) -> None:
    """``values`` (dotted key → value) set exactly the space's keys, each within its range.

    Raises:
        ConfigError: a key outside the space, a missing key, or a value outside its range.
    """
    extra = sorted(set(values) - set(space))
    missing = sorted(set(space) - set(values))
    if extra or missing:
        raise ConfigError(
            f"{where} sets {sorted(values)}, but the search space is {list(space)} (outside it: "
            f"{extra}, missing: {missing}): tuned settings come from `dmlbench tune` for this space; "
            f"rerun it"
        )
    for key, value in values.items():
        if not space[key].contains(value):
            raise ConfigError(
                f"{where}: {key} = {value!r} lies outside its search range "
                f"{space[key].describe()}: tuned settings come from `dmlbench tune` for this space "
                f"(edited by hand, or written for another space?); rerun it"
            )


def flat_values(node: Mapping[str, Any], prefix: str = "") -> dict[str, Any]:
    """Nested settings as dotted key → value.

    >>> flat_values({"loss": {"margin": 0.2}, "training": {"optimizer": {"lr": 0.1}}})
    {'loss.margin': 0.2, 'training.optimizer.lr': 0.1}
    """
    flat: dict[str, Any] = {}
    for key, value in node.items():
        if isinstance(value, Mapping):
            flat.update(flat_values(value, f"{prefix}{key}."))
        else:
            flat[f"{prefix}{key}"] = value
    return flat


def nested_values(values: Mapping[str, Any]) -> dict[str, Any]:
    """Dotted key → value as nested settings (the inverse of :func:`flat_values`).

    >>> nested_values({"loss.margin": 0.2, "training.optimizer.lr": 0.1})
    {'loss': {'margin': 0.2}, 'training': {'optimizer': {'lr': 0.1}}}
    """
    merged: dict[str, Any] = {}
    for key, value in values.items():
        merged = deep_merge(merged, nested(key, value))
    return merged
