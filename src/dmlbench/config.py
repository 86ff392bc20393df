"""Parameters: the pieces that read, merge, check and resolve ``params.yaml``, its experiments files and overlays
(a file read, the JSON schema, deep merges, a method's ``base:`` chain, one run's settings); :mod:`dmlbench.params`
joins them into the whole configuration (``load_config``).

``params.yaml`` is the configuration of both Snakemake and DVC. Its ``experiments:`` list names
the experiments files (``workflow/experiments/<paper>.yaml``, paths relative to its folder): each
adds a paper's methods, tables and figures, and is merged right after ``params.yaml``, in the
listed order (:func:`dmlbench.params.params_sources`). An experiments file only adds entries: redefining an entry
of ``params.yaml`` or of another experiments file is a :class:`ConfigError` naming both files.
Overlays (``--configfile`` in Snakemake, ``--config`` here) are deep-merged on top of them
in order, and do override: mappings merge key by key, everything else (lists included) is
replaced.

A *run* is (dataset, method, seed). Its training settings are resolved as
``training`` ← ``datasets.<d>.training`` ← ``methods.<m>.training`` (later
wins), so a method section only states what differs from the defaults.

A method may derive from another with ``base: <method>``: its section is
deep-merged over the (resolved) base section, so an ablation states only what
it changes (e.g. ``abe8_nodiv: {base: abe8, options: {divergence_weight: 0}}``).

A method that changes only test-time behaviour states ``checkpoint_of: <method>``:
it is not trained, its runs re-embed that method's checkpoints with its own
options (so a table's "at test" rows and the trained method's row come from the
same networks). Its resolved section may differ from that method's only in
:data:`PRESENTATION_KEYS` and in the options its recipe declares test-time
(``Recipe.TEST_TIME_OPTIONS``); anything else is a :class:`ConfigError` naming
the key (:mod:`dmlbench.methods.checkpoint_reuse`). ``checkpoint_of`` is read from the method's own entry, never inherited.
"""

from __future__ import annotations

import copy
import math
import re
from collections.abc import Callable, Iterator, Mapping, Sequence
from pathlib import Path
from typing import Any

import jsonschema
import yaml

from dmlbench.errors import DmlbenchError, did_you_mean
from dmlbench.names import NAME_PATTERN, bad_name_message
from dmlbench.schema import schema

#: entries (of a method or a dataset) that only name things or steer the report; they never change a run.
PRESENTATION_KEYS = ("label", "recall_ks")
#: the top-level key of a parameter file that lists its experiments files (consumed by :func:`dmlbench.params.params_sources`).
EXPERIMENTS_KEY = "experiments"
#: the sections an experiments file may define; each entry of them is defined by one file only.
EXPERIMENT_SECTIONS = ("methods", "tables", "figures", "sweeps")
#: stands for a key that one of two compared mappings does not have (:func:`differing_keys`).
_ABSENT = object()
#: deepest nesting of mappings and lists a parameter file may have, aliases expanded (the project's files
#: need 8); it keeps every later walk of the parameters far from Python's recursion limit.
YAML_MAX_DEPTH = 32
#: most values (mappings, lists and scalars) a parameter file may hold, each alias counted as a copy of
#: what it names (the project's largest file holds 1,600): an alias bomb stops here, not in a walk.
YAML_MAX_NODES = 200_000
#: most values one batch's input tensor (images × 3 colours × crop²) may hold: torch's 32-bit-indexed kernels
#: (cuDNN's convolutions among them) address at most 2^31 − 1 elements of a tensor.
MAX_BATCH_VALUES = 2**31 - 1


class ConfigError(DmlbenchError, ValueError):
    """The parameters are missing, malformed or inconsistent."""


def deep_merge(base: Mapping[str, Any], override: Mapping[str, Any]) -> dict[str, Any]:
    """Merge ``override`` into a copy of ``base``; nested mappings merge, the rest is replaced.

    >>> deep_merge({"a": {"x": 1, "y": 2}, "b": [1]}, {"a": {"y": 3}, "b": [2]})
    {'a': {'x': 1, 'y': 3}, 'b': [2]}
    """
    merged = copy.deepcopy(dict(base))
    for key, value in override.items():
        if isinstance(value, Mapping) and isinstance(merged.get(key), Mapping):
            merged[key] = deep_merge(merged[key], value)
        else:
            merged[key] = copy.deepcopy(value)
    return merged


class YamlLimitError(yaml.YAMLError):
    """A parameter file nests deeper than :data:`YAML_MAX_DEPTH` or expands to more than :data:`YAML_MAX_NODES`
    values, or an alias names a mapping or list that contains it."""


class _UniqueKeyLoader(yaml.SafeLoader):
    """``yaml.SafeLoader`` that refuses a key repeated in one mapping (PyYAML keeps the last silently) and
    bounds the work a file can ask for: while composing, each node's expanded size and depth are computed
    once, from its children's (an alias adds the size of what it names without walking it again), so a
    file beyond :data:`YAML_MAX_DEPTH` or :data:`YAML_MAX_NODES` stops with a :class:`YamlLimitError`
    before anything walks the parsed tree. Anchors and aliases within the limits load as before."""

    def __init__(self, stream: Any):
        super().__init__(stream)
        self._nesting = 0
        self._expanded: dict[int, tuple[int, int]] = {}  # id(node) -> (values, depth) with aliases expanded

    def compose_node(self, parent: yaml.Node | None, index: Any) -> yaml.Node:
        event = self.peek_event()
        if (
            isinstance(event, yaml.AliasEvent)
            and event.anchor in self.anchors
            and id(self.anchors[event.anchor]) not in self._expanded
        ):
            raise YamlLimitError(
                f"alias *{event.anchor} (line {event.start_mark.line + 1}) names a mapping or "
                f"list that contains it, which would be infinite: write the values out"
            )
        if self._nesting >= YAML_MAX_DEPTH:
            raise YamlLimitError(
                f"nested deeper than {YAML_MAX_DEPTH} levels at line {event.start_mark.line + 1}: "
                f"flatten it (parameters need a few levels)"
            )
        self._nesting += 1
        try:
            node = super().compose_node(parent, index)
        finally:
            self._nesting -= 1
        if id(node) not in self._expanded:  # not an alias: its children are all counted already
            children = (
                node.value
                if isinstance(node, yaml.SequenceNode)
                else [child for pair in node.value for child in pair]
                if isinstance(node, yaml.MappingNode)
                else []
            )
            counts = [self._expanded[id(child)] for child in children]
            values = 1 + sum(count for count, _ in counts)
            depth = 1 + max((deep for _, deep in counts), default=0)
            if values > YAML_MAX_NODES or depth > YAML_MAX_DEPTH:
                raise YamlLimitError(
                    f"the value ending on line {node.end_mark.line + 1} expands (aliases copied) "
                    f"to {values:,} values nested {depth} deep, beyond the limits of "
                    f"{YAML_MAX_NODES:,} values and {YAML_MAX_DEPTH} levels: write it with fewer "
                    f"aliases (or split it)"
                )
            self._expanded[id(node)] = (values, depth)
        return node

    def construct_mapping(self, node: yaml.MappingNode, deep: bool = False) -> dict[Any, Any]:
        seen: dict[Any, int] = {}
        for key_node, _ in node.value:
            key = self.construct_object(key_node, deep=deep)
            if key in seen:
                raise yaml.constructor.ConstructorError(
                    None,
                    None,
                    f"key {key!r} appears twice in one mapping (first on line {seen[key] + 1}); "
                    f"PyYAML would keep only the last: delete one",
                    key_node.start_mark,
                )
            seen[key] = key_node.start_mark.line
        return super().construct_mapping(node, deep=deep)


def load_yaml(path: str | Path) -> dict[str, Any]:
    """Read one YAML mapping; errors name the file (and the line of a syntax error, a repeated key, or
    nesting or aliases beyond the limits of :class:`_UniqueKeyLoader`)."""
    path = Path(path)
    if not path.is_file():
        raise ConfigError(f"{path}: parameter file not found")
    try:
        with open(path, encoding="utf-8") as stream:  # a file object: YAML's error marks name the file
            data = yaml.load(stream, Loader=_UniqueKeyLoader)  # noqa: S506 (a SafeLoader)
    except UnicodeDecodeError as err:
        raise ConfigError(f"{path}: not UTF-8 text ({err.reason} at byte {err.start}); save it as UTF-8") from err
    except YamlLimitError as err:
        raise ConfigError(f"{path}: {err}") from err
    except yaml.YAMLError as err:
        raise ConfigError(f"{path}: not valid YAML ({err})") from err
    if not isinstance(data, Mapping):
        raise ConfigError(f"{path}: the top level must be a mapping of sections")
    return dict(data)


#: a ``$`` that ends a schema pattern (not an escaped ``\\$``).
_END_ANCHOR = re.compile(r"(?<!\\)\$$")


def _whole_text_pattern(
    validator: jsonschema.protocols.Validator, pattern: str, instance: Any, _schema: Mapping[str, Any]
) -> Iterator[jsonschema.ValidationError]:
    """The schema keyword ``pattern`` with JSON schema's (ECMA-262's) ``$``, the end of the text: Python's
    ``$`` also matches before a final newline, so ``"x\\n"`` would pass ``^[a-z0-9_]+$``. A name that fails
    the name pattern (``$defs/name``) gets :func:`dmlbench.names.bad_name_message`."""
    if validator.is_type(instance, "string") and re.search(_END_ANCHOR.sub(r"\\Z", pattern), instance) is None:
        yield jsonschema.ValidationError(
            bad_name_message(instance) if pattern == NAME_PATTERN else f"{instance!r} does not match {pattern!r}"
        )


#: the schema's validator, with :func:`_whole_text_pattern` for ``pattern``.
SchemaValidator = jsonschema.validators.extend(jsonschema.Draft202012Validator, {"pattern": _whole_text_pattern})


def non_finite_values(node: Any, path: str = "") -> list[tuple[str, float]]:
    """``(key.path, value)`` of every NaN or infinite float in a parsed YAML tree (jsonschema's
    bounds are false for NaN, so the schema alone lets ``lr: .nan`` through).

    >>> non_finite_values({"training": {"optimizer": {"lr": float("nan")}}, "seeds": [0, float("inf")]})
    [('training.optimizer.lr', nan), ('seeds.1', inf)]
    """
    if isinstance(node, float):
        return [] if math.isfinite(node) else [(path, node)]
    if isinstance(node, Mapping):
        children = ((f"{path}.{key}" if path else str(key), value) for key, value in node.items())
    elif isinstance(node, list):
        children = ((f"{path}.{i}" if path else str(i), value) for i, value in enumerate(node))
    else:
        return []
    return [found for child_path, value in children for found in non_finite_values(value, child_path)]


def _suggestion(error: jsonschema.ValidationError) -> str:
    """For an unexpected key: the closest allowed key of its section; for a value that fits none of a ``oneOf``
    or ``anyOf``: why it fails each (``-1 is less than the minimum of 0; 'seed' was expected``); else ``""``."""
    if error.context:
        return f" ({'; '.join(dict.fromkeys(sub.message for sub in error.context))})"
    if error.validator != "additionalProperties" or not isinstance(error.instance, Mapping):
        return ""
    allowed = error.schema.get("properties", {})
    unexpected = [key for key in error.instance if key not in allowed]
    return did_you_mean(str(unexpected[0]), allowed) if unexpected else ""


def _raise_schema_errors(validator: jsonschema.protocols.Validator, instance: Any, prefix: str, source: str) -> None:
    """Raise a :class:`ConfigError` listing the first 10 schema errors of ``instance``, each at its key path
    (after ``prefix``), with :func:`_suggestion`; nothing when it is valid."""
    errors = sorted(validator.iter_errors(instance), key=lambda e: list(e.absolute_path))
    if errors:
        lines = [
            f"  {'.'.join(filter(None, [prefix, *map(str, err.absolute_path)])) or '<top>'}: "
            f"{err.message}{_suggestion(err)}"
            for err in errors[:10]
        ]
        raise ConfigError(f"{source}: invalid parameters:\n" + "\n".join(lines))


def check_schema(config: Mapping[str, Any], source: str = "params") -> None:
    """Validate the merged parameters against the schema, after refusing NaN and infinities (the schema's bounds
    let them through); the checks across sections come after (:func:`dmlbench.params.validate_config`).

    Raises:
        ConfigError: naming the key path (e.g. ``methods.triplet.loss.margin``) and the problem.
    """
    non_finite = non_finite_values(config)
    if non_finite:
        listed = ", ".join(f"{path} = {value}" for path, value in non_finite[:10])
        raise ConfigError(
            f"{source}: parameters must be finite numbers; {listed}. Write a number "
            f"(YAML reads .nan, .inf and -.inf as NaN and infinities)."
        )
    _raise_schema_errors(SchemaValidator(schema()), config, "", source)


def conforms(config: Mapping[str, Any]) -> bool:
    """Whether ``config`` passes the schema (not yet the cross-key checks of
    :func:`dmlbench.params.validate_config`)."""
    return SchemaValidator(schema()).is_valid(config)


def check_section(config: Mapping[str, Any], key: str, source: str = "params") -> None:
    """Validate the top-level section ``key`` alone against its part of the schema (nothing when absent): the
    expansions of :mod:`dmlbench.generated` read ``sweeps`` and ``tuning`` before the whole is validated.

    Raises:
        ConfigError: as :func:`check_schema`, naming the key paths.
    """
    if key in config:
        full = schema()
        _raise_schema_errors(
            SchemaValidator({**full["properties"][key], "$defs": full["$defs"]}), config[key], key, source
        )


def defines(data: Mapping[str, Any], key: str) -> bool:
    """Whether a parameter file's own content ``data`` sets the dotted ``key`` (or a part of it).

    >>> defines({"methods": {"mpn": {"loss": {"name": "x"}}}}, "methods.mpn.loss"), defines({"seeds": [0]}, "training")
    (True, False)
    """
    node: Any = data
    for part in key.split("."):
        if not isinstance(node, Mapping) or part not in node:
            return False
        node = node[part]
    return True


def section(config: Mapping[str, Any], *keys: str) -> Any:
    """``config[k1][k2]...`` with an error that names the missing key path."""
    node: Any = config
    for depth, key in enumerate(keys):
        if not isinstance(node, Mapping) or key not in node:
            hint = did_you_mean(key, node) if isinstance(node, Mapping) else ""
            raise ConfigError(f"parameter '{'.'.join(keys[: depth + 1])}' is not defined{hint}")
        node = node[key]
    return node


def method_chain(config: Mapping[str, Any], method: str) -> list[str]:
    """``[method, its base, the base's base, ...]``.

    Raises:
        ConfigError: an unknown method or base, or a cycle of bases.

    >>> method_chain({"methods": {"a": {}, "b": {"base": "a"}, "c": {"base": "b"}}}, "c")
    ['c', 'b', 'a']
    """
    chain = [method]
    node = section(config, "methods", method)
    while "base" in node:
        base = node["base"]
        if base in chain:
            raise ConfigError(f"methods.{chain[-1]}.base = {base!r} makes a cycle: {' -> '.join([*chain, base])}")
        if base not in config["methods"]:
            raise ConfigError(f"methods.{chain[-1]}.base = {base!r} is not defined under 'methods'")
        chain.append(base)
        node = config["methods"][base]
    return chain


def resolve_method(config: Mapping[str, Any], method: str, dataset: str | None = None) -> dict[str, Any]:
    """The method section merged over its bases (``base``, ``per_dataset`` and ``tuning`` removed).

    With ``dataset``, each section's ``per_dataset.<dataset>`` is merged right after that section,
    so a derived method's own settings still win over its base's per-dataset ones (an ablation
    ``{base: mpn, options: {heads: 8}}`` keeps 8 heads on every dataset).

    >>> methods = {"a": {"recipe": "abe", "options": {"m": 8, "w": 1}}, "b": {"base": "a", "options": {"w": 0}}}
    >>> resolve_method({"methods": methods}, "b")
    {'recipe': 'abe', 'options': {'m': 8, 'w': 0}}
    >>> methods["a"]["per_dataset"] = {"cub": {"options": {"m": 2, "w": 5}}}
    >>> resolve_method({"methods": methods}, "b", "cub")
    {'recipe': 'abe', 'options': {'m': 2, 'w': 0}}
    """
    merged: dict[str, Any] = {}
    for name in reversed(method_chain(config, method)):
        node = dict(config["methods"][name])
        per_dataset = node.pop("per_dataset", {})
        merged = deep_merge(merged, node)
        if dataset is not None:
            merged = deep_merge(merged, per_dataset.get(dataset, {}))
    merged.pop("base", None)
    merged.pop("checkpoint_of", None)
    merged.pop("tuning", None)  # the tune job's search space (dmlbench.tuning), never a setting of the runs
    return merged


def ensemble_spec(config: Mapping[str, Any], method: str) -> tuple[str, int] | None:
    """``(member method, E)`` of an ensemble method (``ensemble_members: E``), None for a trained method.

    An ensemble is not trained: its seed s concatenates the test embeddings of the member method's
    runs with seeds s·E … s·E + E − 1 (:func:`dmlbench.evaluation.ensemble.member_seeds`).
    """
    node = section(config, "methods", method)
    return (node["base"], int(node["ensemble_members"])) if "ensemble_members" in node else None


def checkpoint_source(config: Mapping[str, Any], method: str) -> str | None:
    """The method whose checkpoints ``method`` re-embeds (its own ``checkpoint_of``), None for the others."""
    return section(config, "methods", method).get("checkpoint_of")


def has_training(config: Mapping[str, Any], method: str) -> bool:
    """Whether the workflow trains ``method`` itself: neither an ensemble of other runs
    (``ensemble_members``) nor a re-embedding of another method's checkpoints (``checkpoint_of``)."""
    return ensemble_spec(config, method) is None and checkpoint_source(config, method) is None


def logs_epochs(config: Mapping[str, Any], method: str) -> bool:
    """Whether ``method``'s runs log training epochs (a non-empty ``log.csv``): trained by the workflow
    (:func:`has_training`) and not a reference row (``recipe: reference``, ``epochs: 0``)."""
    return has_training(config, method) and resolve_method(config, method).get("recipe") != "reference"


def differing_keys(left: Mapping[str, Any], right: Mapping[str, Any], prefix: str = "") -> list[str]:
    """Dotted keys of the leaves where two nested mappings differ; a key on one side only differs.

    >>> differing_keys({"a": {"x": 1, "y": 2}, "b": 1}, {"a": {"x": 1, "y": 3}, "c": {"z": 0}})
    ['a.y', 'b', 'c.z']
    """
    keys = []
    for key in sorted(set(left) | set(right)):
        a, b = left.get(key, _ABSENT), right.get(key, _ABSENT)
        if isinstance(a, Mapping) or isinstance(b, Mapping):
            if all(isinstance(v, Mapping) or v is _ABSENT for v in (a, b)):
                keys += differing_keys({} if a is _ABSENT else a, {} if b is _ABSENT else b, f"{prefix}{key}.")
                continue
        if a != b:
            keys.append(f"{prefix}{key}")
    return keys


def training_origin(config: Mapping[str, Any], dataset: str, method: str, key: str) -> str:
    """The dotted parameter that sets run (``dataset``, ``method``)'s ``training.<key>``: the first that
    defines it of the method's (then each base's) ``per_dataset.<dataset>.training`` and ``training``, then
    ``datasets.<dataset>.training``, then the top-level ``training`` (the precedence of :func:`resolve_run`).

    >>> config = {"methods": {"a": {}, "b": {"base": "a", "training": {"epochs": 0}}}, "datasets": {"d": {}}}
    >>> training_origin(config, "d", "b", "epochs"), training_origin(config, "d", "b", "image.resize")
    ('methods.b.training.epochs', 'training.image.resize')
    """
    candidates = [
        f"methods.{name}.{part}training.{key}"
        for name in method_chain(config, method)
        for part in (f"per_dataset.{dataset}.", "")
    ]
    candidates.append(f"datasets.{dataset}.training.{key}")
    return next((candidate for candidate in candidates if defines(config, candidate)), f"training.{key}")


def _check_image(image: Mapping[str, Any], origin: Callable[[str], str], run: str) -> None:
    """The test-time centre crop fits in the resized image (a larger one would pad it with black), and the
    training crops' area range ``crop_scale`` is ``[low, high]``."""
    if image["test_crop"] > image["resize"]:
        raise ConfigError(
            f"{origin('image.test_crop')} = {image['test_crop']} px exceeds {origin('image.resize')} "
            f"= {image['resize']} px ({run}), so the centre crop would pad the image with black "
            f"borders; set test_crop <= resize"
        )
    low, high = image["crop_scale"]
    if low > high:
        raise ConfigError(
            f"{origin('image.crop_scale')} = {[low, high]} ({run}) is not [low, high]: the training "
            f"crops' share of the image area runs from low to high; write {[high, low]}"
        )


def _check_epochs(training: Mapping[str, Any], recipe: str | None, origin: Callable[[str], str], run: str) -> None:
    """A trained recipe trains at least one epoch (0 would save its untrained network as the result), a
    reference row none."""
    epochs = training["epochs"]
    if recipe == "reference" and epochs != 0:
        raise ConfigError(
            f"{origin('epochs')} = {epochs} ({run}), but recipe 'reference' trains nothing; set "
            f"training.epochs: 0 in that method's entry"
        )
    if recipe != "reference" and epochs < 1:
        raise ConfigError(
            f"{origin('epochs')} = {epochs} ({run}), but recipe {recipe!r} is trained: 0 epochs would "
            f"evaluate its untrained network as the method's result; set epochs >= 1 (only recipe: "
            f"reference rows have 0)"
        )


def _check_schedule(training: Mapping[str, Any], origin: Callable[[str], str], run: str) -> None:
    """A step schedule names its milestones (the trainer would stop on the missing key)."""
    if training["schedule"]["name"] == "step" and not training["schedule"].get("milestones"):
        raise ConfigError(
            f"{origin('schedule.name')} = 'step' ({run}) needs training.schedule.milestones, the "
            f"epochs after which the lr is multiplied by gamma: set them (e.g. "
            f"[{max(1, training['epochs'] // 2)}]) or use schedule cosine or constant"
        )


def _refuse_large_batch(images: int, side: int, what: Callable[[], str], run: str) -> None:
    """Refuse a batch of ``images`` RGB images of ``side``² px beyond :data:`MAX_BATCH_VALUES` input values;
    ``what()`` names the keys that set it (built only then)."""
    values = images * 3 * side * side
    if values > MAX_BATCH_VALUES:
        raise ConfigError(
            f"{what()} ({run}) make a batch of {values:,} input values, beyond the {MAX_BATCH_VALUES:,} "
            f"that one tensor may hold (torch's 32-bit-indexed kernels): lower the batch or the image "
            f"size"
        )


def _check_batch_sizes(training: Mapping[str, Any], origin: Callable[[str], str], run: str) -> None:
    """A training batch (P × K images of ``train_crop``²) and an embedding batch (``eval_batch_size`` images of
    ``test_crop``²) fit in one tensor (:func:`_refuse_large_batch`)."""
    sampler, image = training["sampler"], training["image"]
    _refuse_large_batch(
        sampler["classes_per_batch"] * sampler["images_per_class"],
        image["train_crop"],
        lambda: (
            f"{origin('sampler.classes_per_batch')} × {origin('sampler.images_per_class')} = "
            f"{sampler['classes_per_batch']} × {sampler['images_per_class']} images of {origin('image.train_crop')} = "
            f"{image['train_crop']} px"
        ),
        run,
    )
    _refuse_large_batch(
        training["eval_batch_size"],
        image["test_crop"],
        lambda: (
            f"{origin('eval_batch_size')} = {training['eval_batch_size']} images of {origin('image.test_crop')} = "
            f"{image['test_crop']} px"
        ),
        run,
    )


def check_run_training(
    config: Mapping[str, Any], dataset: str, method: str, recipe: str | None, training: Mapping[str, Any]
) -> None:
    """The cross-key rules of one run's resolved ``training`` (the schema checks each key alone): image sizes
    and crop range, epochs for the recipe, the step schedule's milestones, batch sizes.

    Raises:
        ConfigError: naming the parameter that sets the value (:func:`training_origin`), the run and the fix.
    """

    def origin(key: str) -> str:
        return training_origin(config, dataset, method, key)

    run = f"run {dataset}/{method}"
    _check_image(training["image"], origin, run)
    if has_training(config, method):
        _check_epochs(training, recipe, origin, run)
    _check_schedule(training, origin, run)
    _check_batch_sizes(training, origin, run)


def resolve_run(config: Mapping[str, Any], dataset: str, method: str, seed: int) -> dict[str, Any]:
    """Everything one run needs, self-contained (stored in its checkpoint).

    Returns:
        ``{"dataset": name, "dataset_config": ..., "method": name, "method_config": ...,
        "training": merged training settings, "evaluation": ..., "seed": seed}``.

    Precedence: ``training`` ← ``datasets.<d>.training`` ← the method's ``training`` with its
    ``per_dataset.<d>.training`` (see :func:`resolve_method`); later wins.
    """
    dataset_config = section(config, "datasets", dataset)
    method_config = resolve_method(config, method, dataset)
    training = deep_merge(section(config, "training"), dataset_config.get("training", {}))
    training = deep_merge(training, method_config.get("training", {}))
    check_run_training(config, dataset, method, method_config.get("recipe"), training)
    return {
        "dataset": dataset,
        "dataset_config": {k: v for k, v in dataset_config.items() if k != "training"},
        "method": method,
        "method_config": {k: v for k, v in method_config.items() if k != "training"},
        "training": training,
        "evaluation": dict(section(config, "evaluation")),
        "seed": int(seed),
    }


def run_yaml_text(run: Mapping[str, Any], configs: Sequence[str | Path]) -> str:
    """The text of a run folder's ``run.yaml`` (:data:`dmlbench.layout.RUN_FILE`): the resolved run
    (:func:`resolve_run`, what the checkpoint stores as ``run``), headed by the command that shows where each
    setting comes from."""
    command = f"dmlbench show run --dataset {run['dataset']} --method {run['method']} --seed {run['seed']} " + " ".join(
        f"--config {config}" for config in configs
    )
    return (
        f"# The resolved settings of this run, written before training (the checkpoint stores the same).\n"
        f"# From: {', '.join(map(str, configs))}. Where each setting comes from, and the defaults in code:\n"
        f"#   {command}\n" + yaml.safe_dump(dict(run), sort_keys=False, allow_unicode=True, width=120)
    )
