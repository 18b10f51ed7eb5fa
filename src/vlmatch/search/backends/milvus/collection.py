"""Opening a Milvus index for search: the committed manifest checked (format, seal, the models'
digests, each Milvus collection's vector type and size), and each collection read through
:class:`vlmatch.search.backends.base.CollectionBackend` with item ids as keys. The checkpoints are not
in Milvus: the manifest records their folders and digests. Searches and fetches read at the manifest's
``read_ts`` (Customized), the state at Strong (docs/milvus.md, "Consistency").
"""

from __future__ import annotations

import functools
from pathlib import Path

import numpy as np

from ....checkpoints.digest import checkpoint_digest
from ....errors import ConfigError, DataError, VlmatchError
from ....models.base import Encoding
from ...encode import template
from ...filters import Where, top_k_of
from ...store import check_fields
from ..base import MilvusLocation
from ..folder import check_seal
from .client import (
    FORMAT,
    MANIFEST,
    MAX_RESULTS,
    PENDING,
    READ_TIMEOUT_S,
    Refused,
    Unavailable,
    _short,
    check_name,
    connect,
    field_of,
    load,
    loaded,
    part_name,
    pymilvus,
    read_prop,
    unreachable,
)
from .filters import filtered_search, rows_of
from .layout import Layout, search_params
from .probe import require


def _unanswered() -> tuple[type[BaseException], ...]:
    """What a read raises when the server does not answer: pymilvus's exception, and the raw gRPC error of
    pymilvus's own transport that it lets through when its connection recovery fails."""
    import grpc

    return pymilvus().MilvusException, grpc.RpcError


def _answers(method):
    """A read the server does not answer (after READ_TIMEOUT_S) raises :class:`Unavailable` (a service's 503),
    one it refuses :class:`Refused` with its words (502), never pymilvus's or gRPC's own error; a collection not
    loaded is loaded, once."""

    @functools.wraps(method)
    def wrapped(self, *args, **kwargs):
        try:
            return loaded(lambda: method(self, *args, **kwargs), lambda: self.client, (self.items_name, self.enc_name),
                          READ_TIMEOUT_S)
        except _unanswered() as e:  # evaluated only when a read raised: no import on the answered path
            if not unreachable(e):
                raise Refused(f"{self.loc}: the Milvus server refused the request: {_short(e)[:200]}") from None
            raise Unavailable(f"{self.loc}: the Milvus server did not answer ({_short(e)[:160]}); retry in a few "
                              "seconds") from None

    return wrapped


class MilvusCollection:
    """One collection of a Milvus index (keys are item ids)."""

    def __init__(self, client, loc: MilvusLocation, gen: int, coll: str, info: dict, template: Encoding, *,
                 read: dict | None = None):
        self.client, self.loc, self.info = client, loc, info
        self.read = {**(read or {"consistency_level": "Strong"}), "timeout": READ_TIMEOUT_S}  # see the module's note
        self.items_name = part_name(loc.collection, gen, coll)
        self.enc_name = part_name(loc.collection, gen, coll, enc=True)
        self.count = int(info["count"])
        self.layout = Layout(**info["layout"])
        self.cls = type(template)
        self.scalars = None  # whether the items carry the filter's scalar fields (asked at the first filter)
        self.infix = None  # whether the server's `like` takes a leading % (asked at the first filter)
        check_fields(template, self.layout.fields, self.enc_name)

    def __len__(self) -> int:
        return self.count

    @_answers
    def search(self, queries: np.ndarray, k: int, where=None) -> tuple[np.ndarray, np.ndarray]:
        q = np.ascontiguousarray(queries, dtype=np.float32)
        where = Where.of(where)
        if where is not None:
            return filtered_search(self, q, k, where)
        if k >= self.count and self.info["stage1"]["kind"] != "flat":
            return self._exhaustive(q)
        return self.ann_search(q, k)

    def ann_search(self, q: np.ndarray, k: int, expr: str = "") -> tuple[np.ndarray, np.ndarray]:
        """Milvus's search of the stage-1 vectors among the items that pass ``expr`` (a boolean expression)."""
        if k > MAX_RESULTS:
            raise ConfigError(f"candidates {k}: Milvus returns at most {MAX_RESULTS} per search")
        res = self.client.search(self.items_name, data=[v.tolist() for v in q], limit=k, anns_field="s1",
                                 output_fields=["id"], filter=expr, **self.read,
                                 search_params={"metric_type": "IP", "params": search_params(self.info["stage1"], k)})
        scores = np.full((len(q), k), -np.inf, dtype=np.float32)
        keys = np.full((len(q), k), -1, dtype=np.int64)
        for i, hits in enumerate(res):
            for j, h in enumerate(hits):
                scores[i, j], keys[i, j] = h["distance"], h["id"]
        return scores, keys

    def _exhaustive(self, q: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        rows = sorted(rows_of(self.client, self.items_name, ["id", "s1"], batch_size=1000), key=lambda r: r["id"])
        ids = np.asarray([r["id"] for r in rows], dtype=np.int64)
        scores, pos = top_k_of(q, np.asarray([r["s1"] for r in rows], dtype=np.float32), np.arange(len(ids)), len(ids))
        return scores, ids[pos]

    @_answers
    def take(self, keys) -> Encoding:
        ids = [int(i) for i in np.asarray(keys).reshape(-1)]
        pks = self.layout.pks(ids)
        got = {}
        step = self.layout.rows_per_rpc()
        for a in range(0, len(pks), step):
            for row in self.client.get(self.enc_name, ids=pks[a:a + step], output_fields=["pk", "enc", "extra"],
                                       **self.read):
                got[int(row["pk"])] = row
        return self.layout.decode(ids, got, self.cls, self.enc_name)

    @_answers
    def items_of(self, keys) -> list[dict]:
        return self._field_of(keys, "item")

    def _field_of(self, keys, field: str) -> list:
        """``field`` of the items ``keys``, in that order."""
        ids = [int(i) for i in np.asarray(keys).reshape(-1)]
        got = {}
        for a in range(0, len(ids), MAX_RESULTS):
            got.update({int(r["id"]): r[field] for r in self.client.get(self.items_name, ids=ids[a:a + MAX_RESULTS],
                                                                        output_fields=["id", field], **self.read)})
        missing = [i for i in ids if i not in got]
        if missing:
            raise DataError(self.items_name, f"no row for item(s) {missing[:5]}: the collection is incomplete")
        return [got[i] for i in ids]

    @_answers
    def key_of(self, item_id: int) -> int | None:
        if not isinstance(item_id, (int, np.integer)) or item_id < 0:
            return None
        got = self.client.get(self.items_name, ids=[int(item_id)], output_fields=["id"], **self.read)
        return int(item_id) if got else None

    @_answers
    def stage1_vectors(self, keys) -> np.ndarray:
        vecs = self._field_of(keys, "s1")
        return np.asarray(vecs, dtype=np.float32).reshape(len(vecs), -1)

    @property
    def items(self) -> list[dict]:
        """The whole table in id order (one pass over the collection: for tests and small indexes)."""
        out = [r["item"] for r in rows_of(self.client, self.items_name, ["item"], batch_size=1000)]
        return sorted(out, key=lambda r: r["id"])


_CLIENTS: dict[str, object] = {}


def client_for(uri: str):
    """One MilvusClient per URI in a process (opening, reloads and the collections share it)."""
    if uri not in _CLIENTS:
        _CLIENTS[uri] = connect(uri, create=False)  # a reader never creates a milvus-lite .db
    return _CLIENTS[uri]


def committed_seal(loc: MilvusLocation) -> str | None:
    """The seal of the committed manifest (None: none, or the server cannot be read now), polled by a server."""
    try:
        m = read_prop(client_for(loc.uri), loc.collection, MANIFEST)
    except Exception:  # noqa: BLE001 - a server briefly away: no new version seen, the served one stays
        return None
    return m.get("seal") if isinstance(m, dict) else None


def read_manifest(client, loc: MilvusLocation) -> dict:
    """The committed manifest, refused when absent, of another format or edited. The state collection is
    loaded first: the process that wrote it last may have released it (milvus-lite does at its exit)."""
    if client.has_collection(loc.collection):
        load(client, loc.collection)
    m = read_prop(client, loc.collection, MANIFEST)
    if m is None:
        if read_prop(client, loc.collection, PENDING) is not None:
            raise VlmatchError(f"{loc}: the index build was interrupted; run the same `vlmatch index build` again "
                               "to resume it")
        raise DataError(str(loc), "holds no vlmatch index (build one with vlmatch index build --backend milvus)")
    return check_seal(m, f"{loc}: {MANIFEST}", FORMAT, FORMAT)


def checkpoints(loc: MilvusLocation, manifest: dict, model=None, retriever=None) -> dict[str, Path]:
    """Part -> the checkpoint folder to load, each checked against the digest the collection records."""
    out = {}
    for part, given in (("model", model), ("retriever", retriever)):
        rec = manifest.get(part)
        if not rec:
            if given is not None:
                raise ConfigError(f"{loc} was built without a {part}: drop --{part}")
            continue
        folder = Path(given if given is not None else rec["checkpoint"])
        if not (folder / "config.json").is_file():
            raise DataError(folder, f"the {part} checkpoint {loc} was built with is not here; pass its folder")
        if checkpoint_digest(folder) != rec["digest"]:
            raise ConfigError(f"{folder} is not the {part} {loc} was built with ({rec['name']}, digest "
                              f"{rec['digest'][:12]}): open it with that checkpoint or build the index again")
        out[part] = folder
    return out


def open_milvus(loc: MilvusLocation, model=None, retriever=None):
    """(manifest, part -> checkpoint folder, make) of a Milvus index; ``make(coll, model, n_regions)``
    opens collection ``coll`` (None when the index has none) for the loaded model."""
    check_name(loc.collection)
    client = client_for(loc.uri)
    manifest = read_manifest(client, loc)
    ckpts = checkpoints(loc, manifest, model, retriever)
    require(client, loc.collection, loc.uri, manifest)
    ts = int(manifest.get("read_ts") or 0)  # searches and fetches of the committed generation (the module's note)
    read = {"consistency_level": "Customized", "guarantee_timestamp": ts} if ts else {"consistency_level": "Strong"}
    gen = int(manifest["generation"])
    updating = read_prop(client, loc.collection, PENDING) is not None
    for coll, info in manifest["collections"].items():
        items, enc = part_name(loc.collection, gen, coll), part_name(loc.collection, gen, coll, enc=True)
        for name in (items, enc):
            if not client.has_collection(name):
                raise DataError(name, f"missing from {loc.uri} (dropped by hand?): build the index again")
            load(client, name)
        layout = Layout(**info["layout"])
        got = field_of(client, enc, "enc")
        if got != (layout.field_type, layout.field_dim):
            raise DataError(enc, f"its enc field is {got[0]} of {got[1]} values but the manifest records "
                                 f"{layout.field_type} of {layout.field_dim}: build the index again")
        dim = manifest["dims"]["stage1"]
        if field_of(client, items, "s1") != ("FLOAT_VECTOR", dim):
            raise DataError(items, f"its s1 field is not FLOAT_VECTOR of {dim} values as the manifest records")
        n = client.query(items, filter="", output_fields=["count(*)"], **read)[0]["count(*)"]
        if n != info["count"] and not updating:  # during an update, photos come and go one batch at a time
            raise DataError(items, f"holds {n} items but the manifest records {info['count']}: an update was "
                                   "interrupted; run `vlmatch index update` again to finish it")

    def make(coll: str, model, n_regions: int):
        if coll not in manifest["collections"]:
            return None
        return MilvusCollection(client, loc, gen, coll, manifest["collections"][coll], template(model, coll, n_regions),
                                read=read)

    return manifest, ckpts, make
