"""Views of a photo for the backbone: the photo itself, or its mirror image (left and right swapped).

A mirror view's features are what the explainers average a map with (:mod:`vlmatch.evaluation.mirror`)."""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path

import numpy as np
import torch

from ..errors import DataError


def mirror_pixels(pixels: np.ndarray) -> np.ndarray:
    """uint8 (H, W, 3) pixels with their columns reversed (a horizontal mirror image)."""
    return np.ascontiguousarray(np.asarray(pixels)[:, ::-1])


def photo_features(backbone, paths: Sequence[Path], mirror: bool = False, batch_size: int = 16,
                   progress: bool = False, desc: str = "features") -> np.ndarray:
    """(N, k, dim) float32 grid features of photo files with ``backbone``, each file read as displayed
    (:func:`vlmatch.features.photo.load_image`), of its mirror image when ``mirror``. A missing file: a one-line
    :class:`DataError` naming it."""
    from tqdm.auto import tqdm

    from .photo import load_image

    size = backbone.info.input_size
    out = []
    with torch.inference_mode():
        for a in tqdm(range(0, len(paths), batch_size), desc=desc, unit="batch", leave=False, disable=not progress):
            batch = []
            for p in paths[a:a + batch_size]:
                if not Path(p).is_file():
                    raise DataError(p, "image not found")
                px = load_image(Path(p), size)
                batch.append(mirror_pixels(px) if mirror else px)
            out.append(backbone(backbone.preprocess(batch)).float().numpy())
    return np.concatenate(out) if out else np.zeros((0, backbone.info.grid ** 2, backbone.info.dim), np.float32)
