"""Cross-modal re-ranking (MTFN-RR, Wang et al. ACM MM 2019, §3.2) on ANY score matrix.

``sims[i, t]`` scores image i against caption t; positions are 0-based; a "ranking" is the stable descending
sort of a row or column (equal scores keep index order).

* I2T (eq. 8-12): for query image I take its top-K captions T_1..T_K; p(T_j) = the position of I in
  T_j's own ranking of all images; reorder the K candidates by p. Captions beyond K keep their order.
* T2I (eq. 13-15): for query caption T take its top-K images I_1..I_K; p(I_j) = the first position k in
  I_j's ranking of all captions whose caption T_k has T in G(T_k, K'); reorder the K by p.
* G(T_k, K') = {T_k} ∪ the K' nearest *other* captions of T_k by S_TT(T_k, ·) (ties to the lower index). T is
  its own neighbour, so p is always defined and K' = 0 is the paper's "w/o S_TT"; S_TT only moves a candidate
  earlier. Ties in p are stable, and candidates tied in p and score stay tied for the protocol's tie rule.

The re-ranked lists come back as score matrices (candidates lifted above the rest in p's order), one for I2T
(rows), one for T2I (columns), so :mod:`vlmatch.evaluation.metrics` evaluates them. The decisions and where
S_TT comes from: docs/evaluation.md.
"""

from __future__ import annotations

from collections.abc import Callable

import numpy as np
from tqdm.auto import tqdm

from ..errors import DataError, VlmatchError
from ..io import read_npy
from .metrics import captions_per_image, evaluate_protocol, fold_slices

DEFAULT_K_TEXT = 5


def default_k(protocol: str) -> int:
    """The paper's K: 15 for Flickr30K (and Flickr8k, the same 1000-image shape), 7 for MS-COCO."""
    return 7 if protocol.startswith("coco") else 15


def stable_topk(x: np.ndarray, k: int) -> np.ndarray:
    """Indices (rows, k) of the k largest entries of each row, ordered by (-value, index)."""
    n = x.shape[1]
    k = min(k, n)
    if k == n:
        return np.argsort(-x, axis=1, kind="stable")
    thr = -np.partition(-x, k - 1, axis=1)[:, k - 1:k]  # the k-th largest value of each row
    gt = x > thr
    need = k - gt.sum(axis=1, keepdims=True)
    eq = x == thr
    take = gt | (eq & (np.cumsum(eq, axis=1) <= need))  # equal to the threshold: lowest indices first
    rows, cols = np.nonzero(take)
    cols = cols.reshape(len(x), k)
    vals = np.take_along_axis(x, cols, axis=1)
    return np.take_along_axis(cols, np.argsort(-vals, axis=1, kind="stable"), axis=1)


def stable_positions(rows: np.ndarray) -> np.ndarray:
    """positions[r, t] = position of item t in row r's ranking (stable descending), int32."""
    order = np.argsort(-rows, axis=1, kind="stable")
    pos = np.empty(rows.shape, dtype=np.int32)
    np.put_along_axis(pos, order, np.arange(rows.shape[1], dtype=np.int32)[None].repeat(len(rows), 0), axis=1)
    return pos


def _lift(values: np.ndarray, keys_p: np.ndarray, scores: np.ndarray) -> np.ndarray:
    """New scores for the K candidates of each query (rows of ``keys_p`` / ``scores``): above every item of
    the query (the max of each row of ``values``), ordered by p, equal p by the original score; candidates
    with equal p and equal score get equal new scores (a dense rank)."""
    o1 = np.argsort(-scores, axis=1, kind="stable")
    order = np.take_along_axis(o1, np.argsort(np.take_along_axis(keys_p, o1, axis=1), axis=1, kind="stable"), axis=1)
    ps, ss = np.take_along_axis(keys_p, order, axis=1), np.take_along_axis(scores, order, axis=1)
    new = np.ones(ps.shape, dtype=bool)
    new[:, 1:] = (ps[:, 1:] != ps[:, :-1]) | (ss[:, 1:] != ss[:, :-1])
    rank = np.empty(ps.shape, dtype=np.int64)
    np.put_along_axis(rank, order, np.cumsum(new, axis=1) - 1, axis=1)
    top = values.max(axis=1, keepdims=True).astype(np.float64)
    step = np.maximum(1.0, np.abs(top) * 2.0 ** -16)
    return top + step * (keys_p.shape[1] - rank)


def rerank_i2t(sims: np.ndarray, k: int, chunk: int = 256, progress: bool = False) -> np.ndarray:
    """I2T re-ranking (eq. 8-12): a copy of ``sims`` whose rows rank each image's top-K captions by p."""
    captions_per_image(sims)
    n_img, n_cap = sims.shape
    out = np.array(sims, dtype=np.float64 if sims.dtype == np.float64 else np.float32)
    for a in tqdm(range(0, n_img, chunk), desc="I2T re-ranking", disable=not progress, leave=False):
        rows = np.asarray(sims[a:a + chunk])
        cand = stable_topk(rows, k)  # (r, K) caption indices
        own = np.take_along_axis(rows, cand, axis=1)  # S(I, T_j)
        img = np.arange(a, a + len(rows))[:, None]
        # position of I in T_j's ranking of all images: higher scores, plus equal scores at lower index
        p = np.empty(cand.shape, dtype=np.int64)
        for j in range(cand.shape[1]):
            col = np.asarray(sims[:, cand[:, j]])  # (n_img, r): column T_j of each query
            s = own[:, j][None]
            p[:, j] = (col > s).sum(axis=0) + ((col == s) & (np.arange(n_img)[:, None] < img.T)).sum(axis=0)
        np.put_along_axis(out[a:a + len(rows)], cand, _lift(rows, p, own), axis=1)
    return out


def rerank_t2i(sims: np.ndarray, k: int, neighbors: np.ndarray | None = None, chunk: int = 256,
               progress: bool = False) -> np.ndarray:
    """T2I re-ranking (eq. 13-15): a copy of ``sims`` whose columns rank each caption's top-K images by p.

    ``neighbors`` (n_cap, K') holds G(T, K') \\ {T} for every caption (see :func:`text_neighbors`);
    None = the paper's "w/o S_TT" (G = {T})."""
    captions_per_image(sims)
    n_img, n_cap = sims.shape
    pos = np.empty((n_img, n_cap), dtype=np.int32)  # position of caption t in image i's ranking
    for a in tqdm(range(0, n_img, chunk), desc="T2I positions", disable=not progress, leave=False):
        pos[a:a + chunk] = stable_positions(np.asarray(sims[a:a + chunk]))
    cand = np.empty((n_cap, min(k, n_img)), dtype=np.int64)
    own = np.empty(cand.shape, dtype=np.float64)
    for a in range(0, n_cap, 4 * chunk):
        cols = np.asarray(sims[:, a:a + 4 * chunk]).T
        cand[a:a + len(cols)] = stable_topk(cols, k)
        own[a:a + len(cols)] = np.take_along_axis(cols, cand[a:a + len(cols)], axis=1)
    # p(I_j) = min over T_k with T in G(T_k, K') of pos[I_j, T_k]; T_k = T always qualifies
    p = pos[cand, np.arange(n_cap)[:, None]].astype(np.int64)
    if neighbors is not None and neighbors.size:
        neighbors = np.asarray(neighbors, dtype=np.int64)
        if neighbors.shape[0] != n_cap or neighbors.min() < 0 or neighbors.max() >= n_cap:
            raise VlmatchError(f"text neighbours must be ({n_cap}, K') caption indices, got shape {neighbors.shape}")
        src = np.repeat(np.arange(n_cap), neighbors.shape[1])  # T_k
        tgt = neighbors.reshape(-1)  # T, with T in G(T_k)
        for a in range(0, len(src), 65536):
            s, t = src[a:a + 65536], tgt[a:a + 65536]
            np.minimum.at(p, t, pos[cand[t], s[:, None]])
    out = np.array(sims, dtype=np.float64 if sims.dtype == np.float64 else np.float32)
    for a in range(0, n_cap, 4 * chunk):
        b = min(a + 4 * chunk, n_cap)
        out[cand[a:b], np.arange(a, b)[:, None]] = _lift(np.asarray(sims[:, a:b]).T, p[a:b], own[a:b])
    return out


def text_neighbors(text_sims, k_text: int, chunk: int = 1024, progress: bool = False,
                   group: int | None = None) -> np.ndarray:
    """G(T, K') \\ {T} for every caption from a caption-caption matrix (rows T; may be a memmap, read in
    row chunks): the K' highest-scored other captions of each row, ties to the lower index; with ``group``
    among the captions of T's own group only (see :func:`neighbors_from_blocks`)."""
    n = text_sims.shape[0]
    if text_sims.ndim != 2 or text_sims.shape[1] != n:
        raise DataError("<text sims>", f"a caption-caption matrix must be square, got shape {text_sims.shape}")
    return neighbors_from_blocks(lambda r, c: np.asarray(text_sims[r, c], dtype=np.float64), n, k_text, chunk,
                                 progress, group)


def neighbors_from_blocks(block_fn: Callable[[slice, slice], np.ndarray], n: int, k_text: int, chunk: int = 1024,
                          progress: bool = False, group: int | None = None) -> np.ndarray:
    """G(T, K') \\ {T} (global caption indices) from ``block_fn(rows, cols)`` = the S_TT block of those
    caption slices, a row chunk at a time (the n x n matrix is never held).

    ``group``: the captions fall into consecutive groups of this many (COCO 1K's 5 folds: 5000 captions
    each) and each caption's neighbours are sought in its own group only -- the S_TT of the fold's
    captions, as when the fold is re-ranked on its own. None: one group of all n."""
    group = n if group is None else group
    if group < 1 or n % group:
        raise VlmatchError(f"{n} captions do not fall into groups of {group}")
    out = np.empty((n, min(k_text, group - 1)), dtype=np.int64)
    if out.shape[1] == 0:
        return out
    starts = [(g, a) for g in range(0, n, group) for a in range(g, g + group, chunk)]
    for g, a in tqdm(starts, desc="text neighbours", disable=not progress, leave=False):
        b = min(a + chunk, g + group)
        rows = np.array(block_fn(slice(a, b), slice(g, g + group)), dtype=np.float64)
        if not np.isfinite(rows).all():
            raise DataError("<text sims>", f"caption-caption scores of rows {a}..{b - 1} hold NaN or inf")
        rows[np.arange(b - a), np.arange(a - g, b - g)] = -np.inf  # T is not among its K' others
        out[a:b] = stable_topk(rows, out.shape[1]) + g
    return out


def neighbors_from_vectors(a: np.ndarray, b: np.ndarray, k_text: int, chunk: int = 1024,
                           progress: bool = False, group: int | None = None) -> np.ndarray:
    """Neighbours for S_TT(T, T') = f(⟨a_T, b_T'⟩) with f increasing (cosine of normalised sentence
    vectors, or MTFN's sigmoid of its text-text vectors): ranks by the inner product, block by block."""
    a, b = np.asarray(a, dtype=np.float32), np.asarray(b, dtype=np.float32)
    return neighbors_from_blocks(lambda r, c: a[r] @ b[c].T, len(a), k_text, chunk, progress, group)


def fold_captions(protocol: str, n_captions: int, n_images: int, fold_images: int = 1000) -> int | None:
    """The caption group S_TT neighbours must stay in under ``protocol``: a fold's captions for COCO 1K
    (5-fold), where each fold is re-ranked alone; None (all captions) otherwise."""
    if protocol != "coco1k5fold":
        return None
    if n_images != 5 * fold_images:
        raise VlmatchError(f"protocol {protocol} needs {5 * fold_images} images (5 folds of {fold_images}); "
                           f"the score matrix has {n_images}")
    return fold_images * (n_captions // n_images)


def rerank(sims: np.ndarray, k: int, k_text: int = DEFAULT_K_TEXT, text_sims=None,
           neighbors: np.ndarray | None = None, progress: bool = False) -> tuple[np.ndarray, np.ndarray]:
    """Both re-rankings of ``sims``: (I2T matrix, T2I matrix). T2I uses S_TT given as ``text_sims``
    (n_cap x n_cap) or as precomputed ``neighbors``; neither = without S_TT."""
    if text_sims is not None and neighbors is None and k_text > 0:
        neighbors = text_neighbors(text_sims, k_text, progress=progress)
    if neighbors is not None:
        neighbors = neighbors[:, :k_text]
    return rerank_i2t(sims, k, progress=progress), rerank_t2i(sims, k, neighbors, progress=progress)


def evaluate_reranked(sims: np.ndarray, protocol: str = "single", k: int | None = None, *,
                      k_text: int = DEFAULT_K_TEXT, text_sims=None, neighbors: np.ndarray | None = None,
                      source="<scores>", progress: bool = False, fold_images: int = 1000) -> dict:
    """Recalls before and after re-ranking, both directions, under ``protocol`` (5-fold COCO re-ranks
    within each fold). Returns ``{"before": ..., "after": ..., "k": K, "k_text": K', "text": ...}``."""
    k = default_k(protocol) if k is None else k
    if k < 1 or k_text < 0:
        raise VlmatchError(f"re-ranking needs K >= 1 and K' >= 0, got K={k}, K'={k_text}")
    before = evaluate_protocol(sims, protocol, source=source, fold_images=fold_images)
    per = captions_per_image(sims, source)
    group = fold_captions(protocol, sims.shape[1], sims.shape[0], fold_images)
    if text_sims is not None and neighbors is None and k_text > 0:
        if text_sims.shape != (sims.shape[1], sims.shape[1]):
            raise DataError(source, f"caption-caption matrix {text_sims.shape} does not fit {sims.shape[1]} captions")
        neighbors = text_neighbors(text_sims, k_text, progress=progress, group=group)
    if protocol == "coco1k5fold":
        i2t, t2i = np.zeros_like(sims), np.zeros_like(sims)  # off-fold entries: never ranked, but finite
        for fi, fc in fold_slices(fold_images, per):
            nb = None if neighbors is None else fold_neighbors(neighbors, fc, source)
            a, b = rerank(np.asarray(sims[fi, fc]), k, k_text, neighbors=nb, progress=progress)
            i2t[fi, fc], t2i[fi, fc] = a, b
    else:
        i2t, t2i = rerank(sims, k, k_text, neighbors=neighbors, progress=progress)
    after = evaluate_protocol(i2t, protocol, source=source, t2i_sims=t2i, fold_images=fold_images)
    text = "none" if neighbors is None or k_text == 0 else "S_TT"
    return {"protocol": protocol, "k": k, "k_text": k_text if text != "none" else 0, "text": text,
            "before": before, "after": after}


def fold_neighbors(neighbors: np.ndarray, fc: slice, source="<scores>") -> np.ndarray:
    """One fold's rows of ``neighbors``, as indices into the fold's captions. They must have been sought
    within the fold (``group`` = the fold's captions, :func:`fold_captions`): a fold is re-ranked alone."""
    nb = np.asarray(neighbors[fc], dtype=np.int64)
    if nb.size and (nb.min() < fc.start or nb.max() >= fc.stop):
        raise DataError(source, f"5-fold re-ranking: the S_TT neighbours of captions {fc.start}..{fc.stop - 1} "
                                "reach outside their fold; find them within each fold (group=fold_captions(...))")
    return nb - fc.start


def model_text_neighbors(model, split, k_text: int, *, device="cpu", chunk: int = 1024, progress: bool = False,
                         group: int | None = None) -> np.ndarray:
    """G(T, K') \\ {T} of every caption of ``split`` from a model's learned S_TT (``model.caption_scores``,
    e.g. MTFN's text-text branch), computed in row blocks (the n_cap x n_cap matrix is never held); with
    ``group``, within each group of that many consecutive captions (a COCO 1K fold)."""
    import torch

    from .scoring import encode_all_captions

    with model.evaluating(), torch.no_grad():
        txt = encode_all_captions(model, split, device=device, progress=progress)
        return neighbors_from_blocks(
            lambda r, c: model.caption_scores(txt.select(r), txt.select(c)).double().cpu().numpy(),
            len(txt), k_text, chunk, progress, group)


def sentence_vectors(folder, captions: list[str], device="cpu", batch_size: int = 256,
                     progress: bool = False) -> np.ndarray:
    """l2-normalised mean-pooled token vectors of a frozen local Hugging Face sentence encoder
    (all-MiniLM-L6-v2's own pooling), one row per caption. Nothing is downloaded."""
    import torch

    from ..encoders.hf import HFTextEncoder

    enc = HFTextEncoder(folder).to(device)
    out = []
    with torch.no_grad():
        for a in tqdm(range(0, len(captions), batch_size), desc="sentence encoder", disable=not progress, leave=False):
            tokens, lengths = enc.tokenize(list(captions[a:a + batch_size]))
            words = enc(tokens.to(device), lengths.to(device))  # padded positions are zero
            mean = words.sum(dim=1) / lengths.to(device)[:, None].clamp(min=1)
            out.append(torch.nn.functional.normalize(mean.float(), dim=-1).cpu().numpy())
    return np.concatenate(out)


def sentence_neighbors(folder, captions: list[str], k_text: int, device="cpu", progress: bool = False,
                       group: int | None = None) -> np.ndarray:
    """G(T, K') \\ {T} by the cosine of an offline sentence encoder (makes T2I re-ranking with a text
    similarity available to every model); ``group`` as in :func:`neighbors_from_blocks`."""
    vec = sentence_vectors(folder, captions, device=device, progress=progress)
    return neighbors_from_vectors(vec, vec, k_text, progress=progress, group=group)


# --- where S_TT comes from -----------------------------------------------------------------------

def load_text_sims(path, n_captions: int) -> np.ndarray:
    """A saved caption-caption similarity S_TT (an n_captions x n_captions .npy, memory-mapped)."""
    tt = read_npy(path, "caption-caption matrix", mmap_mode="r")
    if tt.shape != (n_captions, n_captions):
        raise DataError(path, f"caption-caption matrix has shape {tt.shape}, expected ({n_captions}, {n_captions}) "
                              "for this score matrix")
    return tt


def is_vlmatch_checkpoint(folder) -> bool:
    """Whether ``folder`` holds a vlmatch checkpoint (model.safetensors and a config.json naming a model),
    not a Hugging Face model; an unreadable config.json is left to the loader that reports it."""
    import json
    from pathlib import Path

    folder = Path(folder)
    if not (folder / "model.safetensors").is_file():
        return False
    try:
        cfg = json.loads((folder / "config.json").read_text(encoding="utf-8"))
    except (OSError, ValueError):
        return False
    return isinstance(cfg, dict) and "name" in cfg


def model_neighbors(folder, data, split_name: str, n_captions: int, k_text: int, *, max_images: int | None = None,
                    device="auto", required: bool = True, group: int | None = None,
                    progress: bool = False) -> tuple[np.ndarray | None, str]:
    """G(T, K') of the captions of ``data``/``split_name`` from a checkpoint's text-text branch or an offline
    sentence encoder in ``folder`` (with ``group``, within each group of that many consecutive captions: a
    COCO 1K fold); returns (neighbours, their source). A checkpoint without S_TT gives (None, "none"), or
    an error when ``required``."""
    from ..data.precomp import PrecompSplit
    from ..data.resolve import resolve_data
    from ..distributed import pick_device
    from ..models.registry import load_model

    split = PrecompSplit(resolve_data(data), split_name, max_images=max_images)
    if len(split.captions) != n_captions:
        raise DataError(split.captions_path, f"{len(split.captions)} captions, the score matrix has {n_captions}")
    dev = pick_device(device)
    if is_vlmatch_checkpoint(folder):
        model = load_model(folder, map_location=dev)
        if not model.has_text_similarity():
            if required:
                raise VlmatchError(f"{folder}: model {model.name} has no text-text similarity (S_TT)")
            return None, "none"
        return model_text_neighbors(model, split, k_text, device=dev, progress=progress, group=group), str(folder)
    return sentence_neighbors(folder, split.captions, k_text, device=dev, progress=progress, group=group), str(folder)
