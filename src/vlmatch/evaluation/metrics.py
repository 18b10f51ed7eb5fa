"""Retrieval metrics and protocols on a score matrix ``sims`` (n_images x n_captions, caption j of image j // per).

R@K = % of queries with rank < K, medr = floor(median rank) + 1, meanr = mean rank + 1, rsum = the six recalls'
sum. Ties count against the ground truth (its rank counts the wrong items scored >= it), so a constant matrix
gets the worst ranks. Protocols and the 5-fold mean: docs/evaluation.md.
"""

from __future__ import annotations

import numpy as np

from ..errors import DataError
from ..io import read_npy

KS = (1, 5, 10)
PROTOCOLS = ("single", "coco1k5fold", "coco5k")
METRIC_KEYS = ("rsum", "i2t_r1", "i2t_r5", "i2t_r10", "i2t_medr", "i2t_meanr",
               "t2i_r1", "t2i_r5", "t2i_r10", "t2i_medr", "t2i_meanr")


def captions_per_image(sims: np.ndarray, source="<scores>") -> int:
    if sims.ndim != 2:
        raise DataError(source, f"score matrix must be 2-D (n_images, n_captions), got shape {sims.shape}")
    n_img, n_cap = sims.shape
    if n_img == 0 or n_cap == 0 or n_cap % n_img:
        raise DataError(source, f"score matrix shape {sims.shape}: the caption count must be a positive "
                                f"multiple of the image count")
    if not np.isfinite(sims).all():
        raise DataError(source, "score matrix holds NaN or inf")
    return n_cap // n_img


def i2t_ranks(sims: np.ndarray, chunk: int = 1024) -> np.ndarray:
    """0-based rank of the best ground-truth caption of each image (ties count against it)."""
    per = captions_per_image(sims)
    ranks = []
    for a in range(0, sims.shape[0], chunk):
        block = sims[a:a + chunk]
        gt = block.reshape(len(block), -1, per)[np.arange(len(block)), np.arange(a, a + len(block))]  # (b, per)
        best = gt.max(axis=1, keepdims=True)
        ranks.append((block >= best).sum(axis=1) - (gt >= best).sum(axis=1))  # the gt captions do not count
    return np.concatenate(ranks).astype(np.int64)


def t2i_ranks(sims: np.ndarray, chunk: int = 4096) -> np.ndarray:
    """0-based rank of each caption's image (ties count against it)."""
    per = captions_per_image(sims)
    ranks = []
    for a in range(0, sims.shape[1], chunk):
        block = sims[:, a:a + chunk]
        cols = np.arange(a, a + block.shape[1])
        ranks.append((block >= block[cols // per, cols - a]).sum(axis=0) - 1)
    return np.concatenate(ranks).astype(np.int64)


def _summary(ranks: np.ndarray) -> dict:
    out = {f"r{k}": 100.0 * float(np.mean(ranks < k)) for k in KS}
    out["medr"] = float(np.floor(np.median(ranks)) + 1)
    out["meanr"] = float(ranks.mean() + 1)
    return out


def recall_metrics(sims: np.ndarray, t2i_sims: np.ndarray | None = None) -> dict:
    """All eleven numbers for one score matrix (``t2i_sims``, if given, is ranked for text -> image
    instead of ``sims``: e.g. a re-ranking that reorders rows and columns differently)."""
    sims = np.asarray(sims)
    i2t = _summary(i2t_ranks(sims))
    t2i = _summary(t2i_ranks(sims if t2i_sims is None else np.asarray(t2i_sims)))
    out = {"rsum": sum(i2t[f"r{k}"] + t2i[f"r{k}"] for k in KS)}
    out.update({f"i2t_{k}": v for k, v in i2t.items()})
    out.update({f"t2i_{k}": v for k, v in t2i.items()})
    return out


def evaluate_protocol(sims: np.ndarray, protocol: str = "single", source="<scores>",
                      fold_images: int = 1000, t2i_sims: np.ndarray | None = None) -> dict:
    """Metrics under a protocol; 5-fold returns the mean plus each fold under ``folds``.

    ``t2i_sims`` (same shape) is ranked for text -> image instead of ``sims`` when given."""
    if protocol not in PROTOCOLS:
        raise DataError(source, f"unknown protocol {protocol!r}; choose from {PROTOCOLS}")
    sims = np.asarray(sims)
    per = captions_per_image(sims, source)
    n_img = sims.shape[0]
    if t2i_sims is not None and np.shape(t2i_sims) != sims.shape:
        raise DataError(source, f"text -> image matrix {np.shape(t2i_sims)} differs from {sims.shape}")
    head = {"protocol": protocol, "n_images": n_img, "n_captions": sims.shape[1]}
    if protocol != "single" and n_img != 5 * fold_images:
        raise DataError(source, f"protocol {protocol} needs {5 * fold_images} images (COCO testall), "
                                f"the score matrix has {n_img} x {sims.shape[1]}")
    if protocol != "coco1k5fold":  # single, coco5k: one matrix
        return {**head, **recall_metrics(sims, t2i_sims)}
    folds = [recall_metrics(sims[fi, fc], None if t2i_sims is None else t2i_sims[fi, fc])
             for fi, fc in fold_slices(fold_images, per)]
    return {**head, **{k: float(np.mean([f[k] for f in folds])) for k in METRIC_KEYS}, "folds": folds}


def fold_slices(fold_images: int, per: int) -> list[tuple[slice, slice]]:
    """The images and captions of each of COCO 1K's 5 folds."""
    return [(slice(i * fold_images, (i + 1) * fold_images), slice(i * fold_images * per, (i + 1) * fold_images * per))
            for i in range(5)]


def format_table(results: dict[str, dict]) -> str:
    """The field's usual table: one row per model/run, rsum then i2t and t2i R@1/5/10 medr meanr."""
    w = max([len(n) for n in results] + [5])
    head = "  ".join(f"{h:>6}" for h in ("R@1", "R@5", "R@10", "medr", "meanr") * 2)
    lines = [f"{'':<{w}}  {'':>7}  {'image -> text':^38}  {'text -> image':^38}", f"{'':<{w}}  {'rsum':>7}  {head}"]
    for name, m in results.items():
        cells = [m[f"{d}_{k}"] for d in ("i2t", "t2i") for k in ("r1", "r5", "r10", "medr", "meanr")]
        lines.append(f"{name:<{w}}  {m['rsum']:7.1f}  " + "  ".join(f"{c:6.1f}" for c in cells))
    return "\n".join(lines)


def load_sims(path) -> np.ndarray:
    """Load a saved score matrix (.npy), with a clear error naming the file."""
    sims = read_npy(path, "score matrix")
    if sims.dtype.kind not in "fiu":  # strings, structured records, complex numbers, booleans, ...
        raise DataError(path, f"a score matrix holds real numbers; this one holds dtype {sims.dtype}")
    captions_per_image(sims, path)
    return sims.astype(np.float64, copy=False) if sims.dtype.kind != "f" else sims


def ensemble(matrices: list[np.ndarray], sources: list = None) -> np.ndarray:
    """Average several score matrices of the same shape (SCAN's t-i + i-t ensembles)."""
    shapes = {m.shape for m in matrices}
    if len(shapes) != 1:
        names = sources or [f"#{i}" for i in range(len(matrices))]
        detail = ", ".join(f"{n}: {m.shape}" for n, m in zip(names, matrices, strict=False))
        raise DataError(names[0], f"score matrices to ensemble differ in shape ({detail})")
    return np.mean(np.stack([np.asarray(m, dtype=np.float64) for m in matrices]), axis=0)
