"""Heat-map PNGs of one pair's attention: one panel per word on the image.

Grid features (a g x g feature map, e.g. EfficientNet's 7 x 7): each word's k = g² weights are
laid out on the grid, upsampled bilinearly to the image and blended over it. Region features with
stored boxes (x1, y1, x2, y2 in image pixels): each box is shaded by its weight (overlaps keep the
largest). Every panel uses one colour scale (0 to the largest weight of the whole pair), so panels
compare; the word is written under its panel.
"""

from __future__ import annotations

import io
import math
from pathlib import Path

import numpy as np

from ..errors import ConfigError, DataError
from ..io import atomic_path
from .attention import PairAttention


def word_maps(att: PairAttention, size: tuple[int, int], boxes: np.ndarray | None = None) -> np.ndarray:
    """(n_words, H, W) maps of each word's weights over the image (``size`` = (W, H))."""
    import torch
    import torch.nn.functional as F

    w_img, h_img = size
    k, n = att.weights.shape
    if boxes is not None:
        boxes = np.asarray(boxes, dtype=np.float64)
        if boxes.shape != (k, 4):
            raise DataError("boxes", f"expected ({k}, 4) boxes for {k} regions, got {boxes.shape}")
        out = np.zeros((n, h_img, w_img), dtype=np.float32)
        for i, (x1, y1, x2, y2) in enumerate(boxes):
            xa, xb = int(max(0, math.floor(x1))), int(min(w_img, math.ceil(x2)))
            ya, yb = int(max(0, math.floor(y1))), int(min(h_img, math.ceil(y2)))
            for j in range(n):
                out[j, ya:yb, xa:xb] = np.maximum(out[j, ya:yb, xa:xb], att.weights[i, j])
        return out
    g = att.grid or math.isqrt(k)
    if g * g != k:
        raise ConfigError(f"{k} image positions are not a square grid and no boxes were given: cannot place them")
    grid = torch.as_tensor(att.weights.T.reshape(n, 1, g, g), dtype=torch.float32)
    up = F.interpolate(grid, size=(h_img, w_img), mode="bilinear", align_corners=False)
    return up[:, 0].numpy()


def render(att: PairAttention, image, out=None, boxes=None, cols: int | None = None, display: int = 224,
           title: str | None = None) -> Path | bytes:
    """The PNG: the image (a path or an HxWx3 uint8 array) with one overlay per word, written to
    ``out`` (returned), or returned as bytes when ``out`` is None."""
    from matplotlib.figure import Figure  # not pyplot: no global figure state, and a third of the import time
    from PIL import Image

    if isinstance(image, (str, Path)):
        from ..features.photo import open_photo

        pil = open_photo(Path(image))  # as displayed: the maps were computed on the upright photo
    else:
        pil = Image.fromarray(np.asarray(image, dtype=np.uint8))
    scale = display / max(pil.size)
    if boxes is not None:
        boxes = np.asarray(boxes, dtype=np.float64) * scale
    pil = pil.resize((max(1, round(pil.size[0] * scale)), max(1, round(pil.size[1] * scale))), Image.BILINEAR)
    rgb = np.asarray(pil)
    maps = word_maps(att, pil.size, boxes)
    vmax = float(att.weights.max())
    if not vmax > 0:  # signed maps (contribution, gradient, occlusion) with no positive weight: nothing to light
        vmax = 1.0
    n = len(att.words)
    cols = cols or min(n, 6)
    rows = -(-n // cols)
    fig = Figure(figsize=(2.2 * cols, 2.5 * rows + 0.6))
    axes = fig.subplots(rows, cols, squeeze=False)
    mappable = None
    for j, ax in enumerate(axes.flat):
        ax.axis("off")
        if j >= n:
            continue
        ax.imshow(rgb)
        mappable = ax.imshow(maps[j], cmap="jet", alpha=0.5, vmin=0.0, vmax=vmax)
        ax.set_title(att.words[j], y=-0.14, fontsize=11)
    fig.colorbar(mappable, ax=axes.ravel().tolist(), fraction=0.02, pad=0.02, label=f"{att.method} ({att.axis})")
    fig.suptitle(title or f"{att.method} maps, score {att.score:.3f}", fontsize=10)
    if out is None:
        buf = io.BytesIO()
        fig.savefig(buf, format="png", dpi=80)
        return buf.getvalue()
    out = Path(out)
    with atomic_path(out) as tmp:
        fig.savefig(tmp, format="png", dpi=80)
    return out
