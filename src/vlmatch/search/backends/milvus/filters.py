"""A search filter (:class:`vlmatch.search.filters.Where`) on a Milvus index: scalar fields of the items
collection (``taken``, ``camera``, ``rel``, ``lat``, ``lon``) and the boolean expression over them that
stage 1's search takes (``filter=``). Where the expression is wider than the filter, the matching ids are
found by a query and the exact test in Python (docs/milvus.md, "What is stored where").
"""

from __future__ import annotations

import math

import numpy as np

from ...filters import EARTH_KM, Columns, Where, taken_seconds, top_k_of

NO_DATE = -(2 ** 62)
NO_GPS = 999.0
MAX_TEXT = 4096


def add_scalar_fields(schema, pm) -> None:
    """The filterable fields of an items collection (see the module's text)."""
    schema.add_field("taken", pm.DataType.INT64)
    schema.add_field("camera", pm.DataType.VARCHAR, max_length=MAX_TEXT)
    schema.add_field("rel", pm.DataType.VARCHAR, max_length=MAX_TEXT)
    schema.add_field("lat", pm.DataType.DOUBLE)
    schema.add_field("lon", pm.DataType.DOUBLE)


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
    with quiet_iterator():
        it = client.query_iterator(name, batch_size=batch_size, filter=expr, output_fields=fields)
        while batch := it.next():
            out += batch
        it.close()
    return out


def _rows(client, name: str, expr: str, fields: list[str]) -> list[dict]:
    return rows_of(client, name, fields, expr)


class quiet_iterator:
    """pymilvus's query iterator warns 'failed to get mvccTs from milvus server' on every iterator where the
    server gives it no session timestamp (milvus-lite never does); it then reads at the client's latest
    write's time, which is what these reads need: the warning is silenced while one runs."""

    NAME = "pymilvus.client.iterator.query_iterator"

    def __enter__(self):
        import logging

        self.log = logging.getLogger(self.NAME)
        self.was = self.log.level
        self.log.setLevel(logging.ERROR)

    def __exit__(self, *exc):
        self.log.setLevel(self.was)


def _vectors(client, name: str, ids: list[int], read: dict) -> np.ndarray:
    got = {}
    for a in range(0, len(ids), 4096):
        for r in client.query(name, filter=f"id in {ids[a:a + 4096]}", output_fields=["id", "s1"], **read):
            got[int(r["id"])] = r["s1"]
    return np.asarray([got[i] for i in ids], dtype=np.float32)


def has_scalars(client, name: str) -> bool:
    """Whether the items collection ``name`` has the filter fields (written since they exist): its
    ``taken`` field is an INT64 (this module sits below the layout module, so it reads the schema itself)."""
    for f in client.describe_collection(name).get("fields", []):
        if f.get("name") == "taken":
            return getattr(f.get("type"), "name", str(f.get("type"))) == "INT64"
    return False


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
    if coll.scalars:
        expr, exact = expression(where, coll.infix)
    else:
        expr, exact = "", False
    if exact:  # the expression is the filter: count the matches, search on it when there are many
        n = client.query(name, filter=expr, output_fields=["count(*)"], **coll.read)[0]["count(*)"]
        if n > k:
            return coll.ann_search(q, k, expr)
    if coll.scalars:
        rows = _rows(client, name, expr, ["id", "taken", "camera", "rel", "lat", "lon"])
        table = [{"taken": r["taken"], "camera": r["camera"], "rel": r["rel"],
                  "gps": None if r["lat"] == NO_GPS else [r["lat"], r["lon"]]} for r in rows]
        cols = _columns_of_scalars(table)
    else:
        rows = _rows(client, name, "", ["id", "item"])
        cols = Columns([r["item"] for r in rows])
    ids = np.asarray([int(r["id"]) for r in rows], dtype=np.int64)
    ids = np.sort(ids[where.mask(cols)])
    if not len(ids):
        return top_k_of(q, np.zeros((0, q.shape[1]), dtype=np.float32), ids, k)
    vecs = _vectors(client, name, ids.tolist(), coll.read)
    scores, pos = top_k_of(q, vecs, np.arange(len(ids)), k)
    return scores, np.where(pos >= 0, ids[np.maximum(pos, 0)], -1)


def _columns_of_scalars(table: list[dict]) -> Columns:
    cols = Columns([{} for _ in table])
    cols.taken = np.array([math.nan if t["taken"] == NO_DATE else float(t["taken"]) for t in table], dtype=np.float64)
    cols.camera = [t["camera"] for t in table]
    cols.rel = [t["rel"] for t in table]
    cols.lat = np.array([t["gps"][0] if t["gps"] else math.nan for t in table], dtype=np.float64)
    cols.lon = np.array([t["gps"][1] if t["gps"] else math.nan for t in table], dtype=np.float64)
    return cols
