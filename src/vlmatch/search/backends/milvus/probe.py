"""What a Milvus server does correctly, found by trying it, not guessed from its version: a build
probes (:func:`probe`) and records the answers; opening checks again what the layout relies on
(:func:`require`). What was found is in docs/milvus.md ("Capability checks").
"""

from __future__ import annotations

import logging
import os
from contextlib import contextmanager

import numpy as np

from ....errors import VlmatchError
from .client import create_collection, pymilvus, quiet
from .layout import values_of

INDEX_TYPES = {  # type -> build params tried on an empty FLOAT_VECTOR field of 16 dimensions
    "FLAT": {}, "IVF_FLAT": {"nlist": 4}, "HNSW": {"M": 8, "efConstruction": 16},
    "IVF_PQ": {"nlist": 4, "m": 4, "nbits": 8}, "DISKANN": {},
}
PROBE_DIMS = (8, 12, 100)  # a float16 probe's dimensions (the wrong ones found on 2.3.5 first)
_CACHE: dict[tuple, dict] = {}


def _drop(client, name: str) -> None:
    with quiet(level=logging.ERROR):  # pymilvus logs every refusal with a traceback: in a probe it is an answer
        if client.has_collection(name):
            client.drop_collection(name)


@contextmanager
def _scratch(client, name: str):
    """The scratch collection ``name``, dropped before and after (whatever the probe raised)."""
    _drop(client, name)
    try:
        yield
    finally:
        _drop(client, name)


def float16_vector(client, name: str) -> bool:
    """A FLOAT16_VECTOR field takes rows, gives back their bytes unchanged, and a search finds each row
    nearest to itself at distance ~0 (L2), at each of :data:`PROBE_DIMS` and 1, 3 and 16 queries at once."""
    return all(_float16_at(client, name, dim) for dim in PROBE_DIMS)


def _float16_at(client, name: str, dim: int) -> bool:
    vecs = np.random.default_rng(0).standard_normal((16, dim)).astype(np.float16)
    try:
        with _scratch(client, name), quiet(level=logging.ERROR):
            create_collection(client, name, [("v", "FLOAT16_VECTOR", {"dim": dim})], ("v", "FLAT", "L2", {}))
            client.insert(name, [{"pk": i, "v": vecs[i]} for i in range(len(vecs))])
            got = client.query(name, filter="pk >= 0", output_fields=["pk", "v"], consistency_level="Strong")
            back = {int(r["pk"]): values_of(r["v"], "FLOAT16_VECTOR").astype(np.float16) for r in got}
            if len(back) != len(vecs) or any(not np.array_equal(back[i], vecs[i]) for i in range(len(vecs))):
                return False
            for nq in (1, 3, len(vecs)):  # 2.3.5 answers 16 queries of 8 dimensions right, and 3 wrong
                hits = client.search(name, data=list(vecs[:nq]), limit=1, anns_field="v",
                                     search_params={"metric_type": "L2"}, consistency_level="Strong")
                if len(hits) != nq or not all(len(h) > 0 and int(h[0]["id"]) == i and abs(float(h[0]["distance"])) < 1e-3
                                              for i, h in enumerate(hits)):
                    return False
            return True
    except pymilvus().MilvusException:
        return False


def vector_fields(client, name: str) -> int:
    """1 or 2: whether a collection takes a second vector field (2.3 servers do not, 2.4+ and lite do)."""
    try:
        with _scratch(client, name), quiet(level=logging.ERROR):
            create_collection(client, name, [("a", "FLOAT_VECTOR", {"dim": 8}), ("b", "FLOAT_VECTOR", {"dim": 8})])
        return 2
    except pymilvus().MilvusException:
        return 1


def index_types(client, name: str) -> list[str]:
    """The index types of :data:`INDEX_TYPES` the server builds on a FLOAT_VECTOR field (IP metric)."""
    out = []
    with _scratch(client, name):
        create_collection(client, name, [("v", "FLOAT_VECTOR", {"dim": 16})])
        for kind, params in INDEX_TYPES.items():
            ip = client.prepare_index_params()
            ip.add_index("v", index_type=kind, metric_type="IP", params=params)
            try:
                with quiet(level=logging.ERROR):
                    client.create_index(name, ip)
                    client.release_collection(name)  # milvus-lite loads it: an index is dropped unloaded
                    client.drop_index(name, "v")
                out.append(kind)
            except pymilvus().MilvusException:
                continue
    return out


def probe(client, name: str, uri: str | None = None) -> dict:
    """What the server at ``uri`` does, tried with scratch collections ``name__probe*`` (dropped at once);
    cached per server in this process."""
    key = (uri or id(client), "all")
    if key not in _CACHE:
        scratch = f"{name}__probe{os.getpid()}"  # two processes probing at once do not drop each other's
        _CACHE[key] = {"float16_vector": float16_vector(client, f"{scratch}_f16"),
                       "vector_fields": vector_fields(client, f"{scratch}_vf"),
                       "index_types": index_types(client, f"{scratch}_ix")}
    return dict(_CACHE[key])


def require(client, name: str, uri: str, manifest: dict) -> None:
    """Refuse (one line) to open an index whose layout relies on what this server does not do right."""
    needs_f16 = any(c.get("layout", {}).get("vector") == "FLOAT16_VECTOR"
                    for c in manifest.get("collections", {}).values())
    if not needs_f16:
        return
    key = (uri, "float16_vector")
    if key not in _CACHE:
        _CACHE[key] = {"ok": float16_vector(client, f"{name}__probe{os.getpid()}_f16")}
    if not _CACHE[key]["ok"]:
        raise VlmatchError(f"milvus collection {name} at {uri} keeps its encodings in FLOAT16_VECTOR fields, which "
                           "this server does not return or search correctly (probed): build the index again on "
                           "this server")
