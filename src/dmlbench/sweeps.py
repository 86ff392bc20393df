"""Sweeps: a ``sweeps:`` entry expands a method into ordinary method entries, one per point of a grid.

An ablation grid (ABE's λ_div, DeML's I × J, MPN's steps × heads) is a family of entries that derive
from one method and differ in one or two settings. A sweep states the family once::

    sweeps:
      abe8_lambda:                          # the sweep's own name (not a method)
        base: abe8                          # every point derives from it (base:)
        name: "abe8_lambda{lambda}"         # each point's method name
        label: "ABE-8 λ {lambda}"           # each point's label
        axes:
          lambda: {key: options.divergence_weight, values: [0.01, 0.1, 0.3, 3.0]}

and :func:`expand_sweeps` adds ``abe8_lambda001``, ``abe8_lambda01``, ``abe8_lambda03`` and ``abe8_lambda3``
to ``methods``, each ``{base: abe8, label: "ABE-8 λ 0.01", options: {divergence_weight: 0.01}}`` and so
on: ordinary entries, named in tables, figures and claims like any other.

- **Points**: every combination of the axes' values (the grid, first axis outermost), minus the ones
  listed under ``skip`` (e.g. the base itself); or, with ``points``, exactly the listed combinations in
  their order (a list sweep).
- **Settings**: ``set`` (a partial method entry every point states), then each axis's value at its dotted
  ``key`` (``options.*``, ``loss.*``, ``training.*``). The key must name a setting that the
  base already has (its resolved entry, or the ``training`` defaults for ``training.*``), so a misspelt
  key is an error, not a silently ignored setting.
- **Names**: ``name`` is a template in which ``{axis}`` stands for the point's value written as a name
  (:func:`value_token`: ``0.1`` → ``01``, ``3.0`` → ``3``, ``1e-05`` → ``1em05``); the default is
  ``<sweep>_<axis>{axis}…``. Every generated name must match the name pattern and be new: a name that an
  entry of ``methods`` or another point already has is an error naming both.
- **Labels**: ``label`` is a template in which ``{axis}`` stands for the axis's ``label`` of the value (a
  list in the order of ``values``, e.g. ``["1 step", "2 steps"]``) or the value itself (:func:`value_text`);
  the default is the base's label followed by the values.

Sweeps are expanded after the parameter files and overlays are merged and before they are validated
(:func:`dmlbench.params.merge_params`); the ``sweeps`` section stays in the parameters, and the workflow
tracks a point's settings as its sweep's keys (:func:`sweep_keys`), since no parameter file writes them.
"""

from __future__ import annotations

import copy
import itertools
import re
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from dmlbench.config import ConfigError, check_section, deep_merge, defines, resolve_method
from dmlbench.errors import did_you_mean
from dmlbench.names import bad_name_message, is_name

#: the top-level section of the parameters that holds the sweeps.
SWEEPS_KEY = "sweeps"
#: the first part of an axis's dotted key: the method-entry sections a sweep may vary.
SWEEPABLE_SECTIONS = ("loss", "options", "training")
#: a placeholder of a name or label template: ``{axis}``.
_PLACEHOLDER = re.compile(r"\{([a-z0-9_]+)\}")


@dataclass(frozen=True)
class Point:
    """One generated method entry: its sweep and the axes' values (axis → value)."""

    sweep: str
    values: dict[str, Any]


def value_token(value: Any) -> str:
    """A value written as part of a name: numbers in their shortest form without the point (``g``
    format), ``-`` as ``m``; booleans ``true``/``false``; strings as they are.

    >>> [value_token(v) for v in (0.01, 0.1, 3.0, 16, 1e-05, -0.5, True, "kmeans")]
    ['001', '01', '3', '16', '1em05', 'm05', 'true', 'kmeans']
    """
    if isinstance(value, bool):
        return str(value).lower()
    if isinstance(value, int | float):
        return format(value, "g").replace(".", "").replace("-", "m").replace("+", "")
    return str(value)


def value_text(value: Any) -> str:
    """A value written in a label: numbers in their shortest form (``g`` format), the rest as they are.

    >>> [value_text(v) for v in (0.01, 3.0, 16, True, "kmeans")]
    ['0.01', '3', '16', 'True', 'kmeans']
    """
    if isinstance(value, int | float) and not isinstance(value, bool):
        return format(value, "g")
    return str(value)


def fill_template(template: str, values: Mapping[str, str], where: str) -> str:
    """``template`` with each ``{axis}`` replaced by ``values[axis]``.

    Raises:
        ConfigError: a placeholder that names no axis, or a brace that is not part of a placeholder.

    >>> fill_template("mpn_l{steps}_h{heads}", {"steps": "2", "heads": "4"}, "x")
    'mpn_l2_h4'
    """
    unknown = sorted(set(_PLACEHOLDER.findall(template)) - set(values))
    if unknown:
        raise ConfigError(
            f"{where} = {template!r} names {unknown}, which are not axes of the sweep (axes: "
            f"{sorted(values)}){did_you_mean(unknown[0], values)}"
        )
    literal = _PLACEHOLDER.sub("", template)
    if "{" in literal or "}" in literal:
        raise ConfigError(f"{where} = {template!r}: braces only surround an axis name ({{axis}})")
    return _PLACEHOLDER.sub(lambda match: values[match.group(1)], template)


def nested(key: str, value: Any) -> dict[str, Any]:
    """A dotted key and its value as nested mappings.

    >>> nested("training.optimizer.lr", 0.1)
    {'training': {'optimizer': {'lr': 0.1}}}
    """
    node: Any = value
    for part in reversed(key.split(".")):
        node = {part: node}
    return node


def _check_axis_key(config: Mapping[str, Any], sweep: str, spec: Mapping[str, Any], axis: str) -> None:
    """The axis's dotted key names a setting that the sweep's base has (after ``set``).

    Raises:
        ConfigError: naming the key path, the sweep and what the base has at that level.
    """
    key = spec["axes"][axis]["key"]
    where = f"{SWEEPS_KEY}.{sweep}.axes.{axis}.key = {key!r}"
    section = key.split(".")[0]
    if section not in SWEEPABLE_SECTIONS:
        raise ConfigError(f"{where}: a sweep varies {list(SWEEPABLE_SECTIONS)} settings only")
    entry = deep_merge(resolve_method(config, spec["base"]), spec.get("set") or {})
    known = {**entry, "training": deep_merge(config.get("training") or {}, entry.get("training") or {})}
    if defines(known, key):
        return
    parts = key.split(".")
    depth = next(i for i in range(1, len(parts) + 1) if not defines(known, ".".join(parts[:i])))
    parent = known
    for part in parts[: depth - 1]:
        parent = parent[part]
    siblings = sorted(parent) if isinstance(parent, Mapping) else []
    raise ConfigError(
        f"{where}: {spec['base']} (the sweep's base, with its bases and 'set') has no setting "
        f"{'.'.join(parts[:depth])!r}{did_you_mean(parts[depth - 1], siblings)}; it has "
        f"{siblings} there. A sweep varies a setting the base already states: correct the key, or "
        f"state the setting in the base (or in 'set')"
    )


def _combination(spec: Mapping[str, Any], sweep: str, listed: Any, where: str) -> tuple[Any, ...]:
    """A ``points``/``skip`` item ``{axis: value}`` as a tuple in the axes' order.

    Raises:
        ConfigError: an item that misses an axis, names another, or gives a value its axis does not list.
    """
    axes = spec["axes"]
    if not isinstance(listed, Mapping) or set(listed) != set(axes):
        given = sorted(listed) if isinstance(listed, Mapping) else listed
        example = ", ".join(f"{axis}: {spec_['values'][0]!r}" for axis, spec_ in axes.items())
        raise ConfigError(
            f"{SWEEPS_KEY}.{sweep}.{where} = {given!r}: give one value of each axis {sorted(axes)}, e.g. {{{example}}}"
        )
    for axis, value in listed.items():
        if not any(value == v and type(value) is type(v) for v in axes[axis]["values"]):
            raise ConfigError(
                f"{SWEEPS_KEY}.{sweep}.{where}: {axis} = {value!r} is not one of "
                f"axes.{axis}.values {axes[axis]['values']}"
            )
    return tuple(listed[axis] for axis in axes)


def _combinations(spec: Mapping[str, Any], sweep: str) -> list[tuple[Any, ...]]:
    """The sweep's points as value tuples in the axes' order: its ``points``, or the grid minus ``skip``.

    Raises:
        ConfigError: a malformed item, a ``skip`` item that is not in the grid twice listed, or no point left.
    """
    if "points" in spec:
        combos = [_combination(spec, sweep, item, f"points.{i}") for i, item in enumerate(spec["points"])]
        repeated = sorted({str(c) for c in combos if combos.count(c) > 1})
        if repeated:
            raise ConfigError(f"{SWEEPS_KEY}.{sweep}.points lists {repeated} more than once")
        return combos
    grid = list(itertools.product(*(axis["values"] for axis in spec["axes"].values())))
    skipped = [_combination(spec, sweep, item, f"skip.{i}") for i, item in enumerate(spec.get("skip") or [])]
    combos = [combo for combo in grid if combo not in skipped]
    if not combos:
        raise ConfigError(
            f"{SWEEPS_KEY}.{sweep}: 'skip' removes every point of the grid; the sweep generates "
            f"no method (drop the sweep, or skip fewer points)"
        )
    return combos


def _label_texts(spec: Mapping[str, Any], sweep: str, axis: str) -> list[str]:
    """What each value of ``axis`` writes in a label: its ``label`` list, else the values (:func:`value_text`)."""
    values, labels = spec["axes"][axis]["values"], spec["axes"][axis].get("label")
    if labels is None:
        return [value_text(v) for v in values]
    if len(labels) != len(values):
        raise ConfigError(
            f"{SWEEPS_KEY}.{sweep}.axes.{axis}.label has {len(labels)} texts for {len(values)} "
            f"values: give one per value, in the order of values"
        )
    return list(labels)


def _point_name(sweep: str, spec: Mapping[str, Any], combo: Sequence[Any]) -> str:
    """The method name of one point of a sweep (its ``name`` template filled with the values as names).

    Raises:
        ConfigError: a template naming no axis, or a result that is not a valid name.
    """
    axes = list(spec["axes"])
    tokens = {axis: value_token(value) for axis, value in zip(axes, combo, strict=True)}
    template = spec.get("name", sweep + "".join(f"_{axis}{{{axis}}}" for axis in axes))
    name = fill_template(template, tokens, f"{SWEEPS_KEY}.{sweep}.name")
    if not is_name(name):
        raise ConfigError(
            f"{SWEEPS_KEY}.{sweep}.name gives {bad_name_message(name, 'method name')}: write the "
            f"template (and string values) with lower-case letters, digits and _ only"
        )
    return name


def point_names(sweep: str, spec: Mapping[str, Any]) -> list[str]:
    """The method names a (schema-checked) sweep generates, in order; no other parameter is needed.

    >>> point_names("s", {"base": "a", "name": "a_n{n}", "axes": {"n": {"key": "options.n", "values": [2, 4]}}})
    ['a_n2', 'a_n4']
    """
    return [_point_name(sweep, spec, combo) for combo in _combinations(spec, sweep)]


def _entry(config: Mapping[str, Any], sweep: str, spec: Mapping[str, Any], combo: Sequence[Any]) -> dict[str, Any]:
    """The method entry of one point of a sweep."""
    axes = list(spec["axes"])
    texts = {
        axis: _label_texts(spec, sweep, axis)[spec["axes"][axis]["values"].index(value)]
        for axis, value in zip(axes, combo, strict=True)
    }
    base_label = resolve_method(config, spec["base"]).get("label", spec["base"])
    label_template = spec.get("label", base_label + " (" + ", ".join(f"{axis} = {{{axis}}}" for axis in axes) + ")")
    entry: dict[str, Any] = {
        "base": spec["base"],
        "label": fill_template(label_template, texts, f"{SWEEPS_KEY}.{sweep}.label"),
    }
    entry = deep_merge(entry, spec.get("set") or {})
    for axis, value in zip(axes, combo, strict=True):
        entry = deep_merge(entry, nested(spec["axes"][axis]["key"], value))
    return entry


def sweep_points(config: Mapping[str, Any]) -> dict[str, Point]:
    """Every point of the parameters' sweeps: generated method name → :class:`Point`, in sweep order.

    Raises:
        ConfigError: a malformed sweep (schema), an unknown base or key, an unknown axis in a template, a
            bad or repeated name, or a sweep without points.
    """
    sweeps = config.get(SWEEPS_KEY) or {}
    check_section(config, SWEEPS_KEY)
    points: dict[str, Point] = {}
    for sweep, spec in sweeps.items():
        if spec["base"] not in (config.get("methods") or {}):
            raise ConfigError(
                f"{SWEEPS_KEY}.{sweep}.base = {spec['base']!r} is not defined under 'methods'"
                f"{did_you_mean(spec['base'], config.get('methods') or {})}"
            )
        for axis in spec["axes"]:
            _check_axis_key(config, sweep, spec, axis)
        for combo in _combinations(spec, sweep):
            name = _point_name(sweep, spec, combo)
            if name in points:
                other = points[name].sweep
                raise ConfigError(
                    f"{SWEEPS_KEY}.{sweep} generates {name!r} twice (also from sweep {other!r}); "
                    f"make the 'name' templates tell the points apart (name every axis)"
                )
            points[name] = Point(sweep, dict(zip(spec["axes"], combo, strict=True)))
    return points


def expand_sweeps(config: Mapping[str, Any]) -> dict[str, Any]:
    """A copy of ``config`` with every sweep's points added to ``methods`` (after the written entries). An
    entry of ``methods`` with a point's name, which only an overlay may give (:func:`check_written_points`),
    is merged over the point, as an overlay's entry over a written one.

    Raises:
        ConfigError: as :func:`sweep_points`.
    """
    entries = generated_entries(config)
    if not entries:
        return dict(config)
    expanded = copy.deepcopy(dict(config))
    methods = expanded.setdefault("methods", {})
    for name, entry in entries.items():
        methods[name] = deep_merge(entry, methods.pop(name, {}))
    return expanded


def generated_entries(config: Mapping[str, Any]) -> dict[str, dict[str, Any]]:
    """Every sweep point's method entry as its sweep generates it (name → entry, in sweep order).

    Raises:
        ConfigError: as :func:`sweep_points`.
    """
    entries = {}
    for name, point in sweep_points(config).items():
        spec = config[SWEEPS_KEY][point.sweep]
        entries[name] = _entry(config, point.sweep, spec, [point.values[axis] for axis in spec["axes"]])
    return entries


def check_written_points(sources: Sequence[tuple[Path, Mapping[str, Any]]]) -> None:
    """No method that a sweep of ``sources`` (a parameter file and its experiments files) generates is also
    written under ``methods`` in one of them: the entry would silently change the point. (An overlay, a file
    of its own, may override a point like any entry; an entry identical to the point, as a dump of merged
    parameters holds it, changes nothing and is accepted.)

    Raises:
        ConfigError: naming the sweep's file and the entry's file.
    """
    written = {name: path for path, data in sources for name in data.get("methods") or {}}
    merged: dict[str, Any] | None = None  # with its generated entries, only once a point is found written
    generated: dict[str, dict[str, Any]] = {}
    for path, data in sources:
        check_section(data, SWEEPS_KEY, str(path))
        for sweep, spec in (data.get(SWEEPS_KEY) or {}).items():
            for name in point_names(sweep, spec):
                if name not in written:
                    continue
                if merged is None:
                    merged = {}
                    for _, part in sources:
                        merged = deep_merge(merged, part)
                    generated = generated_entries(merged)
                if merged["methods"][name] != generated.get(name):  # equal: a dump of merged params read back
                    raise ConfigError(
                        f"{path}: {SWEEPS_KEY}.{sweep} generates method {name!r}, which "
                        f"{written[name]} writes under 'methods' too: remove that entry (the sweep "
                        f"replaces it) or rename one of them (an overlay may override a point)"
                    )


def sweep_keys(config: Mapping[str, Any], method: str, exclude: Sequence[str] = ()) -> list[str] | None:
    """The dotted parameter keys that define a generated method: its sweep's entries (an axis's ``key``,
    ``values`` and ``label`` one by one), minus those whose last part is in ``exclude`` (``label`` also
    drops the axes' labels); None for a method that no sweep generates.

    >>> config = {"methods": {"a": {"recipe": "x", "options": {"k": 1}}},
    ...           "sweeps": {"s": {"base": "a", "axes": {"k": {"key": "options.k", "values": [2, 3]}}}}}
    >>> sweep_keys(config, "s_k2", exclude=["label"]), sweep_keys(config, "a")
    (['sweeps.s.base', 'sweeps.s.axes.k.key', 'sweeps.s.axes.k.values'], None)
    """
    sweep = next(
        (name for name, spec in (config.get(SWEEPS_KEY) or {}).items() if method in point_names(name, spec)), None
    )  # the names alone: the workflow asks this for every job, and expansion checked the rest
    if sweep is None:
        return None
    prefix = f"{SWEEPS_KEY}.{sweep}"
    spec = config[SWEEPS_KEY][sweep]
    keys = [f"{prefix}.{key}" for key in spec if key != "axes" and key not in exclude]
    for axis, axis_spec in spec["axes"].items():
        keys += [f"{prefix}.axes.{axis}.{key}" for key in axis_spec if key not in exclude]
    return keys
