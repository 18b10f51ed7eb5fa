"""A search filter (:class:`vlmatch.search.filters.Where`) on a Milvus index: scalar fields of the items
collection (``taken``, ``camera``, ``rel``, ``lat``, ``lon``) and the boolean expression over them that
stage 1's search takes (``filter=``). Where the expression is wider than the filter, the matching ids are
found by a query and the exact test in Python (docs/milvus.md, "What is stored where").
"""

from __future__ import annotations

import logging
import math

import numpy as np

from ...filters import EARTH_KM, Columns, Where, taken_seconds, top_k_of
from .client import field_of, quiet

NO_DATE = -(2 ** 62)
NO_GPS = 999.0
MAX_TEXT = 4096


# the filterable fields of an items collection: taken (NO_DATE: none), lat and lon (NO_GPS: none)
SCALAR_FIELDS = [("taken", "INT64", {}), ("camera", "VARCHAR", {"max_length": MAX_TEXT}),
                 ("rel", "VARCHAR", {"max_length": MAX_TEXT}), ("lat", "DOUBLE", {}), ("lon", "DOUBLE", {})]


def scalars_of(item: dict) -> dict:
    """The scalar fields of one table row (a caption's row: all empty)."""
    t = taken_seconds(item.get("taken"))
    gps = item.get("gps")
    ok = isinstance(gps, (list, tuple)) and len(gps) == 2
    return {"taken": NO_DATE if math.isnan(t) else int(t),
            "camera": str(item.get("camera") or "").lower()[:MAX_TEXT // 4],
            "rel": str(item.get("rel") or "")[:MAX_TEXT // 4],
            "lat": float(gps[0]) if ok else NO_GPS, "lon": float(gps[1]) if ok else NO_GPS}


def _like(text: str) -> tuple[str, bool]:
    """``text`` as a literal inside a ``like`` pattern: (pattern text, exact)."""
    out = "".join("_" if ch in '%_\\"\'' or not ch.isprintable() else ch for ch in text)
    return out, out == text


def expression(where: Where, infix: bool = True) -> tuple[str, bool]:
    """(Milvus boolean expression, whether it is exactly the filter or wider). ``infix=False``: a server
    whose ``like`` takes prefix patterns only (Milvus 2.3): the camera is left to the exact test."""
    parts, exact = [], True
    after, before = where.seconds
    if after is not None or before is not None:
        parts.append(f"taken >= {after if after is not None else NO_DATE + 1}")
        if before is not None:
            parts.append(f"taken <= {before}")
    if where.camera is not None and not infix:
        exact = False
    elif where.camera is not None:
        pat, ok = _like(where.camera)
        parts.append(f'camera like "%{pat}%"')
        exact &= ok
    if where.under is not None:
        pat, ok = _like(where.under)
        parts.append(f'rel like "{pat}/%"')
        exact &= ok
    if where.near is not None:
        lat, lon, km = where.near
        dlat = math.degrees(km / EARTH_KM) * 1.001 + 1e-9
        parts.append(f"lat >= {lat - dlat!r} && lat <= {lat + dlat!r}")
        lat_edge = min(90.0, abs(lat) + dlat)
        if lat_edge < 89.9:
            dlon = dlat / math.cos(math.radians(lat_edge))
            if lon - dlon >= -180 and lon + dlon <= 180:
                parts.append(f"lon >= {lon - dlon!r} && lon <= {lon + dlon!r}")
        exact = False
    return " && ".join(f"({p})" for p in parts), exact


def rows_of(client, name: str, fields: list[str], expr: str = "", batch_size: int = 4096) -> list[dict]:
    """Every row of collection ``name`` that passes ``expr`` (a query iterator: no 16,384-row cap)."""
    out = []
    # pymilvus warns 'failed to get mvccTs' where the server gives no session timestamp (milvus-lite never does);
    # it then reads at the client's latest write, which is what these reads need
    with quiet("pymilvus.client.iterator.query_iterator", level=logging.WARNING):
        it = client.query_iterator(name, batch_size=batch_size, filter=expr, output_fields=fields)
        while batch := it.next():
            out += batch
        it.close()
    return out


def has_scalars(client, name: str) -> bool:
    """Whether the items collection ``name`` has the filter fields (written since they exist)."""
    return field_of(client, name, "taken")[0] == "INT64"


def filtered_search(coll, q: np.ndarray, k: int, where: Where) -> tuple[np.ndarray, np.ndarray]:
    """Stage 1 of a Milvus collection (:class:`vlmatch.search.backends.milvus.collection.MilvusCollection`) among
    the items that pass ``where``: (scores, ids) as its ``search`` returns them."""
    client, name = coll.client, coll.items_name
    if coll.scalars is None:
        coll.scalars = has_scalars(client, name)
    if getattr(coll, "infix", None) is None:
        coll.infix = infix_like(client)
    try:
        return _filtered(coll, q, k, where)
    except Exception as e:  # noqa: BLE001 - pymilvus's exception; any other goes on as it was
        if "unsupported pattern" not in str(e) or not coll.infix:
            raise
    coll.infix = False  # Milvus 2.3: `like` takes prefixes only; the camera is tested in Python
    return _filtered(coll, q, k, where)


def infix_like(client) -> bool:
    """Whether the server's ``like`` takes a pattern with a leading ``%`` (milvus-lite, Milvus 2.4 on);
    Milvus 2.3 takes prefix patterns only."""
    import re

    try:
        v = str(client.get_server_version())
    except Exception:  # noqa: BLE001 - unknown: the expression without it is always right
        return False
    if v.startswith("milvus_lite"):
        return True
    m = re.match(r"v?(\d+)\.(\d+)", v)
    return bool(m) and (int(m.group(1)), int(m.group(2))) >= (2, 4)


def _filtered(coll, q: np.ndarray, k: int, where: Where) -> tuple[np.ndarray, np.ndarray]:
    client, name = coll.client, coll.items_name
    expr, exact = expression(where, coll.infix) if coll.scalars else ("", False)
    if exact:  # the expression is the filter: count the matches, search on it when there are many
        n = client.query(name, filter=expr, output_fields=["count(*)"], **coll.read)[0]["count(*)"]
        if n > k:
            return coll.ann_search(q, k, expr)
    if coll.scalars:
        rows = rows_of(client, name, ["id", "taken", "camera", "rel", "lat", "lon"], expr)
        cols = _columns_of_scalars(rows)
    else:
        rows = rows_of(client, name, ["id", "item"])
        cols = Columns([r["item"] for r in rows])
    ids = np.asarray([int(r["id"]) for r in rows], dtype=np.int64)
    ids = np.sort(ids[where.mask(cols)])
    scores, pos = top_k_of(q, coll.stage1_vectors(ids) if len(ids) else None, np.arange(len(ids)), k)
    return scores, np.append(ids, -1)[pos]  # pos -1 (fewer than k ids) picks the -1 appended


def _columns_of_scalars(rows: list[dict]) -> Columns:
    cols = Columns([{} for _ in rows])
    cols.taken = np.array([math.nan if r["taken"] == NO_DATE else float(r["taken"]) for r in rows], dtype=np.float64)
    cols.camera, cols.rel = [r["camera"] for r in rows], [r["rel"] for r in rows]
    for f in ("lat", "lon"):
        setattr(cols, f, np.array([math.nan if r["lat"] == NO_GPS else r[f] for r in rows], dtype=np.float64))
    return cols
