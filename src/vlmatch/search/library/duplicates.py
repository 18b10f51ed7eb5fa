"""Near-identical photos of an index (``vlmatch index duplicates``): resized, re-encoded, cropped or rotated copies
of one photo.

Each photo's image query (:func:`vlmatch.search.library.similar.image_query`) is searched against the index's own
stage 1 for its ``neighbours`` nearest; a pair is kept where the photos' copy signals
(:mod:`vlmatch.features.copyhash`) agree too (:func:`copy_filter`), and the connected components of two or more
photos are the groups. The rule, its limits and how they were chosen: docs/search.md, "Duplicate photos".
"""

from __future__ import annotations

import numpy as np

from ...errors import ConfigError
from ..filters import top_k_of

DEFAULT_THRESHOLD = 0.68
DEFAULT_NEIGHBOURS = 16
# the copy signal's limits for a model whose record has none: the signal is the model's no more than the photo's,
# so these are the shipped default's (benchmarks/duplicates_copies.py, chosen on its half A)
DEFAULT_COPY_BITS = 12
DEFAULT_STRONG_BITS = 0


def _find(parent: np.ndarray, i: int) -> int:
    root = i
    while parent[root] != root:
        root = parent[root]
    while parent[i] != root:  # path compression
        parent[i], i = root, parent[i]
    return root


def group_pairs(n: int, pairs) -> list[list[int]]:
    """Connected components with two or more members of ``n`` items joined by ``pairs`` (i, j); each
    group sorted, groups in order of their first member."""
    parent = np.arange(n)
    for i, j in pairs:
        a, b = _find(parent, int(i)), _find(parent, int(j))
        if a != b:
            parent[max(a, b)] = min(a, b)
    groups: dict[int, list[int]] = {}
    for i in range(n):
        groups.setdefault(_find(parent, i), []).append(i)
    return sorted((g for g in groups.values() if len(g) > 1), key=lambda g: g[0])


def shipped_threshold() -> float | None:
    """The threshold the shipped default search pair's stage-1 model records (its registry ``duplicates``
    record): the default of ``index duplicates`` on an index built with it; None where none ships or records one."""
    from ...pretrained import default_pair, get

    try:
        model, retriever = default_pair()
        return get(retriever or model).duplicates.get("threshold")
    except ConfigError:
        return None


def check_threshold(threshold: float) -> float:
    # a cosine similarity at or below 0 is no likeness at all: such a threshold joins every photo in one group
    if not np.isfinite(threshold) or not 0.0 < threshold <= 1.0:
        shipped = shipped_threshold()
        default = "the model's own" + (f" ({shipped} for the shipped default model)" if shipped else "")
        raise ConfigError(f"--threshold {threshold}: a duplicate's similarity is above 0 and at most 1 (the default, "
                          f"{default}, finds near copies; lower finds looser likeness)")
    return float(threshold)


def similar_pairs(vectors: np.ndarray, queries: np.ndarray, threshold: float, neighbours: int = DEFAULT_NEIGHBOURS,
                  search=None) -> list[tuple[int, int, float]]:
    """(i, j, similarity) with i < j for every pair at or above ``threshold`` among each row's ``neighbours``
    nearest by ``search(queries, k) -> (scores, rows)``, a stage-1 search (default: exact)."""
    n = len(vectors)
    if n < 2:
        return []
    k = min(n, neighbours + 1)  # the photo itself is among its own neighbours
    if search is None:  # exact inner products
        def search(q, k):
            return top_k_of(q, vectors, np.arange(n), k)
    found: dict[tuple[int, int], float] = {}
    for a in range(0, n, 1024):
        scores, rows = search(np.ascontiguousarray(queries[a:a + 1024]), k)
        for off, (srow, rrow) in enumerate(zip(scores, rows, strict=True)):
            i = a + off
            for s, j in zip(srow, rrow, strict=True):
                if j < 0 or j == i or s < threshold:
                    continue
                key = (min(i, int(j)), max(i, int(j)))
                found[key] = max(found.get(key, -np.inf), float(s))
    return sorted((i, j, s) for (i, j), s in found.items())


def copy_candidates(vectors, queries, rows: list[dict], threshold: float, strong_bits: int, *,
                    neighbours: int = DEFAULT_NEIGHBOURS, search=None) -> list[tuple[int, int, float]]:
    """The pairs worth judging: each photo's nearest at or above ``threshold`` (:func:`similar_pairs`) and every
    two photos whose copy signals are at most ``strong_bits`` apart (looked up), with their similarity."""
    from ...features.copyhash import near_pairs

    found = {(i, j): s for i, j, s in similar_pairs(vectors, queries, threshold, neighbours, search=search)}
    flat = [i for i, r in enumerate(rows) if r.get("copy_flat")]
    for i, j, _ in near_pairs([r.get("copy_hash") for r in rows], strong_bits, skip=flat):
        found.setdefault((i, j), float(np.asarray(queries[i], dtype=np.float32) @ np.asarray(vectors[j], np.float32)))
    return sorted((i, j, s) for (i, j), s in found.items())


def copy_filter(pairs, rows: list[dict], threshold: float, copy_bits: int, strong_bits: int):
    """The pairs (i, j, similarity) that are copies by the rule of the module docstring, given each photo's table
    row (``copy_hash``, ``copy_flat``, ``sha256``); (kept, number of photos without a copy signal)."""
    from ...features.copyhash import distances, hash_table

    hashes = [r.get("copy_hash") for r in rows]
    missing = sum(h is None for h in hashes)
    if not pairs:
        return [], missing
    i = np.array([p[0] for p in pairs])
    j = np.array([p[1] for p in pairs])
    bits = distances(hash_table(hashes), i, j)
    kept = []
    for (a, b, s), d in zip(pairs, bits, strict=True):
        ra, rb = rows[a], rows[b]
        if ra.get("copy_hash") is None or rb.get("copy_hash") is None:
            ok = s >= threshold  # built before the signal: similarity alone
        elif ra.get("copy_flat") or rb.get("copy_flat"):
            ok = bool(ra.get("copy_flat") and rb.get("copy_flat") and ra.get("sha256")
                      and ra.get("sha256") == rb.get("sha256"))
        else:
            ok = (s >= threshold and d <= copy_bits) or d <= strong_bits
        if ok:
            kept.append((a, b, s))
    return kept, missing


def model_threshold(index) -> tuple[float, dict | None]:
    """(threshold, record) of the model that made an index's stage-1 vectors: its shipped registry record's
    (:func:`vlmatch.pretrained.duplicates_record`), else (:data:`DEFAULT_THRESHOLD`, None)."""
    from ...pretrained import duplicates_record

    m = index.manifest
    stage1 = m.get("retriever") or m.get("model") or {}
    rec = duplicates_record(stage1.get("sha256"))
    return (float(rec["threshold"]), rec) if rec else (DEFAULT_THRESHOLD, None)


def find_duplicates(index, threshold: float | None = None, neighbours: int = DEFAULT_NEIGHBOURS,
                    copies: bool = True) -> dict:
    """Groups of near-identical photos of an opened ``Index``: ``{"threshold", "photos", "groups": [{"ids",
    "paths", "similarity": the lowest similarity of the pairs that joined it}], "pairs", "copy_signal": the limits
    used or None, "without_copy_signal": photos judged by similarity alone}``. ``threshold``: None for the model's
    own (:func:`model_threshold`); ``copies``: False groups by similarity alone (look-alikes too)."""
    from .similar import image_query

    own, rec = model_threshold(index)
    threshold, rec = check_threshold(own if threshold is None else threshold), rec or {}
    coll = index._need("images")
    stage1 = getattr(coll, "stage1", None)
    if stage1 is None:
        raise ConfigError("index duplicates reads the stage-1 vectors of an index folder (not a Milvus collection)")
    vectors = np.asarray(stage1.vectors, dtype=np.float32)
    queries = image_query(index, vectors)
    signal, missing = None, 0
    if copies:
        signal = {"copy_bits": int(rec.get("copy_bits", DEFAULT_COPY_BITS)),
                  "strong_bits": int(rec.get("strong_bits", DEFAULT_STRONG_BITS))}
        found = copy_candidates(vectors, queries, coll.items, threshold, signal["strong_bits"], neighbours=neighbours,
                                search=stage1.search)
        pairs, missing = copy_filter(found, coll.items, threshold, signal["copy_bits"], signal["strong_bits"])
    else:
        pairs = similar_pairs(vectors, queries, threshold, neighbours, search=stage1.search)
    groups = group_pairs(len(vectors), [(i, j) for i, j, _ in pairs])
    member = {i: g for g, rows in enumerate(groups) for i in rows}
    low = [1.0] * len(groups)
    for i, _, s in pairs:
        low[member[i]] = min(low[member[i]], s)
    out = []
    for rows, s in zip(groups, low, strict=True):
        items = coll.items_of(rows)
        out.append({"ids": [int(it["id"]) for it in items], "paths": [str(it["path"]) for it in items],
                    "similarity": round(float(s), 6)})
    return {"threshold": threshold, "photos": len(vectors), "groups": out, "copy_signal": signal,
            "without_copy_signal": missing,
            "pairs": [{"ids": [int(coll.items[i]["id"]), int(coll.items[j]["id"])], "similarity": round(s, 6)}
                      for i, j, s in pairs]}
