"""Search by photo: the indexed photos most like a given one (``Index.search_like``, ``vlmatch search --like``),
optionally with a sentence ("like this one, but at night").

Stage 1 ranks by the inner product of the photos' stage-1 vectors with the per-item extra columns of the query
zeroed (:func:`image_query`: the cosine of the unit embeddings); stage 2 by the model's image-image score where its
encoding is one global embedding (an attention model has none: its ranking stays stage 1's). With a text, the two
scores are standardised over the pooled candidates and mixed by ``text_weight``. The details: docs/search.md,
"Search by photo".
"""

from __future__ import annotations

import time
import weakref
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import torch

from ...errors import ConfigError
from ...evaluation.scoring import score_blocks
from ...models.base import ImageEncoding
from ..hits import ranked, shows_text, sizes

DEFAULT_TEXT_WEIGHT = 0.5

_WIDTHS: weakref.WeakKeyDictionary = weakref.WeakKeyDictionary()  # index -> embedding columns (or None)


@dataclass
class LikeQuery:
    """The query photo as search needs it: its stage-2 encoding (one row) and stage-1 vector (1, d)."""

    encoding: ImageEncoding
    vector: np.ndarray
    item_id: int | None = None  # when it is an indexed photo


def embedding_width(index) -> int | None:
    """How many leading columns of a stage-1 image vector are the image embedding (the rest: per-item extras such as
    a calibrated model's offsets); None when the vector is not laid out that way (it is used whole)."""
    if index in _WIDTHS:
        return _WIDTHS[index]
    source = index.stage1_source
    net = source.net
    gen = torch.Generator().manual_seed(0)
    with torch.no_grad():
        feats = torch.rand(2, index.n_regions, net.cfg.img_dim, generator=gen)
        vec = source.image_vectors(feats, index.model.encode_images(feats))
        emb = getattr(net.encode_images(feats), "embedding", None)
    width = None
    if emb is not None and emb.dim() == 2 and emb.shape[1] < vec.shape[1] and \
            torch.allclose(vec[:, :emb.shape[1]].float(), emb.float(), atol=1e-5):
        width = int(emb.shape[1])
    _WIDTHS[index] = width
    return width


def image_query(index, vectors: np.ndarray) -> np.ndarray:
    """Stage-1 image vectors (n, d) as image-image queries: the extra columns zeroed (see the module doc)."""
    q = np.array(vectors, dtype=np.float32, copy=True)
    width = embedding_width(index)
    if width is not None:
        q[:, width:] = 0
    return q


def like_query(index, like) -> LikeQuery:
    """``like``: an indexed id (an int), or a photo: a file path (in or outside the index), its bytes, a
    PIL image or an HxWx3 uint8 array."""
    coll = index._need("images")
    if isinstance(like, (int, np.integer)) and not isinstance(like, bool):
        key = coll.key_of(int(like))
        if key is None:
            raise ConfigError(f"like {like}: no image with that id in {index.root}")
        with torch.no_grad():
            enc = coll.take(np.array([key])).to(index.device)
        return LikeQuery(enc, coll.stage1_vectors([key]), int(like))
    if isinstance(like, (str, Path)) and not Path(like).is_file():
        raise ConfigError(f"like {like}: no such photo file")
    enc, vec = index.encode_image(like)
    return LikeQuery(enc, vec)


def image_scores(query: ImageEncoding, cands: ImageEncoding) -> np.ndarray | None:
    """The model's image-image score of each candidate: the cosine of the global embeddings; None for a
    model whose encoding has no global embedding (an attention model: see the module doc)."""
    a, b = getattr(query, "embedding", None), getattr(cands, "embedding", None)
    if a is None or b is None:
        return None
    a = torch.nn.functional.normalize(a.float(), dim=1)
    b = torch.nn.functional.normalize(b.float(), dim=1)
    return (b @ a.T)[:, 0].cpu().numpy()


def _zscore(x: np.ndarray) -> np.ndarray:
    x = x.astype(np.float64)
    sd = x.std()
    return (x - x.mean()) / sd if sd > 1e-12 else np.zeros_like(x)


def _stage1(coll, q: np.ndarray, k: int, where) -> tuple[np.ndarray, np.ndarray]:
    s, rows = coll.search(q, k) if where is None else coll.search(q, k, where=where)
    ok = rows[0] >= 0
    return s[0][ok], rows[0][ok]


@torch.no_grad()
def search_like(index, like, k: int = 10, *, text: str | None = None, where=None, candidates: int | None = None,
                text_weight: float = DEFAULT_TEXT_WEIGHT):
    """The ``k`` indexed photos most like ``like`` (:func:`like_query`), optionally also matching ``text`` (weighted
    by ``text_weight``), as ``SearchHit`` s whose ``stage1_score`` is the photos' stage-1 similarity."""
    if not 0.0 <= text_weight <= 1.0 or not np.isfinite(text_weight):
        raise ConfigError(f"text weight must be between 0 and 1, not {text_weight}")
    if text is not None and not shows_text(text):
        raise ConfigError("a search query must be a non-empty text (not only spaces or invisible characters)")
    coll = index._need("images")
    n_hits, cand = sizes(k, candidates, len(coll))
    t0 = time.perf_counter()
    query = like_query(index, like)
    q = image_query(index, query.vector)
    t1 = time.perf_counter()
    stage1_scores, rows = _stage1(coll, q, cand, where)
    txt = None
    if text is not None:
        txt, tq = index.encode_queries([text])
        st, rows_t = _stage1(coll, tq, cand, where)
        extra = np.setdiff1d(rows_t, rows)
        if len(extra):  # their image similarity, exactly
            rows = np.concatenate([rows, extra])
            stage1_scores = np.concatenate([stage1_scores, coll.stage1_vectors(extra) @ q[0]])
        s1_text = dict(zip(rows_t.tolist(), st.tolist(), strict=True))
    order = np.argsort(rows, kind="stable")  # read the stored encodings in file order
    rows, stage1_scores = rows[order], stage1_scores[order]
    t2 = time.perf_counter()
    if len(rows) == 0:
        index.last_timings = {"image": t1 - t0, "stage1": t2 - t1, "stage2": 0.0, "queries": 1}
        return []
    enc = coll.take(rows).to(index.device)
    sim = image_scores(query.encoding, enc)
    if sim is None:
        sim = stage1_scores.astype(np.float32)
    score = sim
    if txt is not None:
        ts = score_blocks(index.model, enc, [(np.arange(1), txt)], 1, max(1, len(rows)), progress=False)[:, 0]
        ts = _text_scores(index, coll, rows, ts, s1_text, tq)
        score = (text_weight * _zscore(ts) + (1 - text_weight) * _zscore(sim)).astype(np.float32)
    hits = ranked(coll, rows, np.asarray(score, dtype=np.float32), stage1_scores, n_hits, "path", keep=index.photo_root.keep)
    index.last_timings = {"image": t1 - t0, "stage1": t2 - t1, "stage2": time.perf_counter() - t2, "queries": 1}
    return hits


def _text_scores(index, coll, rows, ts, s1_text: dict, tq: np.ndarray) -> np.ndarray:
    """The sentence's score of each candidate as ``Index.search`` gives it: the model's (``ts``), stage 1's exact one
    for a model ranked by it, or their mean for an index built with score "mean". A candidate outside the sentence's
    stage-1 list (``s1_text``) gets the inner product with its stored stage-1 vector."""
    if index.score_mode != "mean" and not index.stage1_is_score:
        return ts
    missing = [r for r in rows.tolist() if r not in s1_text]
    if missing:
        s1_text = {**s1_text, **dict(zip(missing, (coll.stage1_vectors(missing) @ tq[0]).tolist(), strict=True))}
    s1 = np.array([s1_text[r] for r in rows.tolist()], dtype=np.float32)
    return (ts + s1) / 2 if index.score_mode == "mean" else s1
