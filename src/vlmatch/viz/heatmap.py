"""Heat-map PNGs of one pair's maps: one panel per content word on the photo (384 px on its long side, the web
page's inferno scale and opacity). Grid weights are upsampled bilinearly; region boxes are shaded by their weight.
A cell reads as its per cent share of the word's map (:func:`cell_shares`), each panel on its own scale unless
``shared_scale``; labels in a font that has their glyphs (:mod:`vlmatch.viz.fonts`).
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


PANEL = 384  # px on a panel's long side: the photo as the web page shows it, not a stamp
CMAP = "inferno"  # the web page's scale (search/service/static/index.html: its STOPS are inferno's)


def overlay(rgb: np.ndarray, m: np.ndarray, vmax: float) -> np.ndarray:
    """The photo under one map as the web page lays it: inferno colour of ``m / vmax``, opacity 0.15 to 0.75."""
    from matplotlib import colormaps

    t = np.clip(m / vmax, 0.0, 1.0)[..., None]
    colour = colormaps[CMAP](t[..., 0])[..., :3] * 255.0
    alpha = 0.15 + 0.6 * t
    return np.clip(np.rint(rgb * (1 - alpha) + colour * alpha), 0, 255).astype(np.uint8)


def cell_shares(weights: np.ndarray) -> np.ndarray:
    """(k, n) each cell's per cent share of its word's map: a column over the sum of its positive entries (negative
    cells stay negative); a column with no positive entry stays as it is."""
    w = np.asarray(weights, dtype=np.float64)
    total = np.clip(w, 0.0, None).sum(axis=0, keepdims=True)
    return np.where(total > 0, 100.0 * w / np.where(total > 0, total, 1.0), w)


def share_unit(att: PairAttention) -> str:
    """What a cell's per cent is a share of, in words."""
    if att.axis == "score":  # contribution: the (cell, word) terms sum to the score
        return "the word's part of the score"
    if att.axis == "regions":
        return "the word's attention"
    return "the word's map"


def title_of(att: PairAttention) -> str:
    """The PNG's title: the score search shows, split into what the maps draw and what not, else the maps' score."""
    parts = att.parts or {}
    if parts.get("concepts") is not None:
        return (f"score {parts['score']:.4f} = ranking model {parts['ranker']:.4f} (the maps) + concepts "
                f"{parts['concepts']:.4f} (not drawn)")
    if parts:
        return f"{att.method} maps, score {parts['score']:.4f}"
    return f"{att.method} maps, score {att.score:.3f}"


def render(att: PairAttention, image, out=None, *, boxes=None, cols: int | None = None, display: int = PANEL,
           title: str | None = None, all_words: bool = False, shared_scale: bool = False) -> Path | bytes:
    """The PNG of ``image`` (a path or an HxWx3 uint8 array) with one overlay per content word (function words with
    ``all_words``) and a colour bar, written to ``out`` (returned), or returned as bytes when ``out`` is None."""
    from matplotlib.cm import ScalarMappable
    from matplotlib.colors import Normalize
    from matplotlib.figure import Figure  # not pyplot: no global figure state, and a third of the import time
    from PIL import Image

    from .fonts import label as word_label
    from .words import shown_columns

    if isinstance(image, (str, Path)):
        from ..features.photo import open_photo

        pil = open_photo(Path(image), display)  # as displayed: the maps were computed on the upright photo
    else:
        pil = Image.fromarray(np.asarray(image, dtype=np.uint8))
    w0, h0 = pil.size
    scale = display / max(w0, h0)
    if boxes is not None:
        boxes = np.asarray(boxes, dtype=np.float64) * scale
    pil = pil.resize((max(1, round(w0 * scale)), max(1, round(h0 * scale))), Image.BILINEAR)
    rgb = np.asarray(pil, dtype=np.float64)
    shown = shown_columns(att.words, all_words)
    shares = cell_shares(att.weights)
    maps = word_maps(PairAttention(att.words, shares, att.axis, att.score, grid=att.grid), pil.size, boxes)
    peaks = [float(shares[:, j].max()) for j in shown]
    vmax = max(peaks, default=0.0)
    if not vmax > 0:  # signed maps (contribution, gradient, occlusion) with no positive weight: nothing to light
        vmax = 1.0
    n = len(shown)
    cols = cols or min(max(n, 1), 3)
    rows = max(1, -(-n // cols))
    dpi = 100
    pw, ph = pil.size[0] / dpi, pil.size[1] / dpi  # a panel at the photo's own aspect ratio, one pixel per pixel
    label, head, bar = 0.32, 0.45, 0.8  # inches: a word under each panel, the title, the colour bar
    fig = Figure(figsize=(cols * (pw + 0.1) + 0.1, rows * (ph + label) + head + bar), dpi=dpi)
    W, H = fig.get_size_inches()
    for k, j in enumerate(shown):
        r, c = divmod(k, cols)
        left = (0.1 + c * (pw + 0.1)) / W
        bottom = (H - head - (r + 1) * (ph + label) + label) / H
        ax = fig.add_axes((left, bottom, pw / W, ph / H))
        ax.axis("off")
        own = peaks[k] if peaks[k] > 0 else 1.0
        ax.imshow(overlay(rgb, maps[j], vmax if shared_scale else own), interpolation="nearest")
        text, font = word_label(att.words[j])  # in a font that has its glyphs, else its code points (never boxes)
        word = text if shared_scale else f"{text}  (top cell {peaks[k]:.0f} %)"
        ax.text(0.5, -0.02, word, transform=ax.transAxes, ha="center", va="top", fontsize=13, **font)
    cax = fig.add_axes((0.2, 0.5 / H, 0.6, 0.14 / H))  # its ticks and label below it
    unit = share_unit(att)
    if shared_scale:
        bar = ScalarMappable(Normalize(0.0, vmax), CMAP)
        text = f"% of {unit} in a cell, one scale for every word"
    else:
        bar = ScalarMappable(Normalize(0.0, 100.0), CMAP)
        text = f"% of the word's top cell (each word on its own scale; shares of {unit})"
    fig.colorbar(bar, cax=cax, orientation="horizontal", label=text)
    fig.suptitle(title or title_of(att), fontsize=12, y=1 - 0.12 / H, va="top")
    if out is None:
        buf = io.BytesIO()
        fig.savefig(buf, format="png", dpi=dpi)
        return buf.getvalue()
    out = Path(out)
    with atomic_path(out) as tmp:
        fig.savefig(tmp, format="png", dpi=dpi)
    return out
