"""The rooms' caches under :func:`~vlmatch_lab.paths.cache_root`: the Flickr8k feature caches that
``experiments/flickr8k.py`` extracts (``flickr8k-<backbone>[-<size>]``) and the run folders it trains into
(``runs/<run>/``), which benchmarks/ and release/ read too."""

from __future__ import annotations

from pathlib import Path

from .paths import cache_root

BACKBONE = "efficientnet-lite0"  # the study's backbone, at 224 px: its 7 x 7 grid
EXTRACT = "python experiments/flickr8k.py --extract-only"  # the command that makes the study's feature cache


def features_dir(input_size: int = 224, backbone: str = BACKBONE) -> Path:
    """The feature cache of ``backbone`` at ``input_size`` px (224 px, the backbone's own size, has no suffix)."""
    return cache_root() / (f"flickr8k-{backbone}" + ("" if input_size == 224 else f"-{input_size}"))


def features_of(checkpoint) -> Path:
    """The feature cache of the backbone and input size a checkpoint was trained on (Lite0 224 px when its
    checkpoint folder does not say): ``experiments/flickr8k.py --extract-only [--backbone B --input-size S]``
    makes it."""
    from vlmatch.features.provenance import checkpoint_backbone

    bb = checkpoint_backbone(checkpoint) or {}
    return features_dir(bb.get("input_size", 224), bb.get("name", BACKBONE))


def runs_dir() -> Path:
    """The run folders: ``runs/<run>/best`` is a run's best checkpoint."""
    return cache_root() / "runs"
