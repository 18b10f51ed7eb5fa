"""What a search returns: :class:`SearchHit`, and the ranking of re-scored candidates into hits (shared by
text search, :mod:`vlmatch.search.index`, and search by photo, :mod:`vlmatch.search.library.similar`)."""

from __future__ import annotations

import unicodedata
from dataclasses import asdict, dataclass

import numpy as np

from ..errors import ConfigError
from .backends.base import CollectionBackend

DEFAULT_CANDIDATES = 100


@dataclass
class SearchHit:
    """One ranked item: ``id`` (stable across updates), ``path`` (images) or ``text`` (captions). (The HTTP
    API's result row is :class:`vlmatch.search.service.schema.SearchResult`.)"""

    rank: int
    id: int
    score: float  # stage-2 score: the model's own, or its mean with stage 1's (an index built with score "mean")
    stage1_score: float
    path: str | None = None
    text: str | None = None
    taken: str | None = None  # capture time, ISO 8601 (EXIF; absent when the photo records none)
    camera: str | None = None  # make and model
    gps: list[float] | None = None  # [lat, lon], decimal degrees
    size: list[int] | None = None  # [w, h] in pixels, as displayed (EXIF orientation applied)
    # the probability that the photo matches the query (vlmatch.search.open_vocab.Relevance; None: the index has no
    # relevance scale), and whether it is under the index's "nothing matches" threshold
    relevance: float | None = None
    no_match: bool | None = None

    def to_dict(self) -> dict:
        return {k: v for k, v in asdict(self).items() if v is not None}


def with_relevance(hits: list[SearchHit], relevance) -> list[SearchHit]:
    """``hits`` with their relevance (``relevance``: a :class:`vlmatch.search.open_vocab.Relevance`, or None)."""
    if relevance is None:
        return hits
    for h, p in zip(hits, relevance([h.score for h in hits]), strict=True):
        h.relevance = round(float(p), 4)
        h.no_match = bool(p < relevance.threshold)
    return hits


def sizes(k: int, candidates: int | None, n: int) -> tuple[int, int]:
    if k < 1:
        raise ConfigError(f"k must be at least 1, not {k}")
    cand = DEFAULT_CANDIDATES if candidates is None else candidates
    if cand < 1:
        raise ConfigError(f"candidates must be at least 1, not {cand}")
    cand = max(cand, k)
    return min(k, n), min(cand, n)


def ranked(coll: CollectionBackend, rows: np.ndarray, scores: np.ndarray, stage1_scores: np.ndarray, k: int, field: str, *,
           keep=None):
    """The best ``k`` of re-scored candidates as hits, by score descending (ties by key). ``keep(row)`` False leaves
    a row out (:mod:`vlmatch.search.library.trust`) and the next candidate takes its place."""
    order = np.lexsort((rows, -scores.astype(np.float64)))
    out = []
    for a in range(0, len(order), max(k, 1)):
        part = order[a:a + max(k, 1)] if keep is not None else order[:k]
        for j, it in zip(part, coll.items_of(rows[part]), strict=True):
            if len(out) < k and (keep is None or keep(it)):
                out.append(SearchHit(len(out) + 1, int(it["id"]), float(scores[j]), float(stage1_scores[j]),
                                     **{field: it[field]}, **(photo_fields(it) if field == "path" else {})))
        if len(out) >= k or keep is None:
            break
    return out


def photo_fields(row: dict) -> dict:
    """A table row's photo metadata as :class:`SearchHit` fields (its ``pixels`` are the hit's ``size``)."""
    return {"taken": row.get("taken"), "camera": row.get("camera"), "gps": row.get("gps"), "size": row.get("pixels")}


def shows_text(text) -> bool:
    """A query that shows something: a string with a character that is not white space (NBSP included), a control
    or a format character such as ZERO WIDTH SPACE (a text of only those reads as an empty one)."""
    return isinstance(text, str) and any(not ch.isspace() and unicodedata.category(ch) not in ("Cf", "Cc")
                                         for ch in text)
