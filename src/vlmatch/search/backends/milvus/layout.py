"""How a collection lies in Milvus: the schemas of its two Milvus collections and the layout of one
item's stage-2 encoding over rows (a vector cut into chunks of at most 32,768 values).

The float fields of an Encoding are flattened into one vector per item in the index's dtype and held as
``FLOAT16_VECTOR`` (where a probe finds it right), ``FLOAT16_PACKED`` (two float16 values bit for bit in
one FLOAT_VECTOR dimension: finite, so the server keeps them) or ``FLOAT_VECTOR`` (float32 values).
Other fields travel as JSON on the item's first chunk. See docs/milvus.md ("What is stored where").
"""

from __future__ import annotations

import json
import math
from dataclasses import dataclass

import numpy as np
import torch

from ....errors import DataError
from ....models.base import Encoding
from ...store import field_specs
from .client import CHUNK_SLOTS, MAX_DIM, RPC_BYTES, create_collection
from .filters import SCALAR_FIELDS

PACKED = "FLOAT16_PACKED"


@dataclass
class Layout:
    cls: str  # the Encoding class's name
    fields: dict  # name -> {"shape": [...], "dtype": numpy dtype name, "where": "vector" | "extra"}
    total: int  # vector values per item
    chunks: int
    chunk_dim: int
    vector: str  # FLOAT16_VECTOR, FLOAT16_PACKED or FLOAT_VECTOR (see the module doc)

    @classmethod
    def of(cls, enc: Encoding, dtype: str, vector: str, pad_to: int | None = None) -> Layout:
        full = type(enc).full_precision_fields
        if vector == PACKED and any(n in full and t.dtype.is_floating_point for n, t in enc.tensors().items()):
            vector = "FLOAT_VECTOR"  # float32 fields as whole values in the vector, not as JSON
        fields, total = field_specs(enc, dtype, pad_to), 0
        for f in fields.values():
            floating = np.dtype(f["dtype"]).kind == "f"
            f["where"] = "vector" if floating and (f["dtype"] == dtype or vector == "FLOAT_VECTOR") else "extra"
            if f["where"] == "vector":
                total += math.prod(f["shape"])
        per_dim = 2 if vector == PACKED else 1  # values per dimension of the Milvus field
        chunks = max(1, math.ceil(total / (MAX_DIM * per_dim)))
        if chunks > CHUNK_SLOTS:
            raise DataError(type(enc).__name__, f"{total} values per item need {chunks} rows, more than {CHUNK_SLOTS}")
        chunk_dim = per_dim * max(1, math.ceil(total / (chunks * per_dim)))
        return cls(type(enc).__name__, fields, total, chunks, chunk_dim, vector)

    @property
    def np_dtype(self):
        """The dtype of the values (not of the Milvus field)."""
        return np.float32 if self.vector == "FLOAT_VECTOR" else np.float16

    @property
    def field_type(self) -> str:
        """The Milvus type of the ``enc`` field."""
        return "FLOAT_VECTOR" if self.vector == PACKED else self.vector

    @property
    def field_dim(self) -> int:
        """The dimensions of the ``enc`` field (a packed row holds two values per dimension)."""
        return self.chunk_dim // 2 if self.vector == PACKED else self.chunk_dim

    def row_bytes(self) -> int:
        extra = sum(12 * math.prod(f["shape"]) for f in self.fields.values() if f["where"] == "extra")
        return self.chunk_dim * np.dtype(self.np_dtype).itemsize + extra + 64

    def rows_per_rpc(self) -> int:
        return max(1, min(RPC_BYTES // self.row_bytes(), 16_384))

    # --- writing --------------------------------------------------------------------------------
    def rows(self, ids, enc: Encoding, where: str = "encodings") -> list[dict]:
        """Milvus rows (``pk``, ``id``, ``chunk``, ``enc``, ``extra``) of the items ``ids`` encoded as ``enc``."""
        n = len(ids)
        vec = np.zeros((n, self.chunks * self.chunk_dim), dtype=self.np_dtype)
        extra = [{} for _ in range(n)]
        at = 0
        for name, spec in self.fields.items():
            a = getattr(enc, name).detach().cpu().numpy()
            if list(a.shape[1:]) != spec["shape"]:  # a word axis shorter than the padded width
                pad = np.zeros((n, *spec["shape"]), dtype=a.dtype)
                pad[:, :a.shape[1]] = a
                a = pad
            with np.errstate(over="ignore"):
                a = a.astype(spec["dtype"])
            if a.dtype.kind == "f" and not np.isfinite(a).all():
                raise DataError(where, f"NaN or inf in the {name} of items {int(ids[0])}..{int(ids[-1])} (as "
                                       f"{spec['dtype']}): the model's output cannot be stored")
            if spec["where"] == "vector":
                size = math.prod(spec["shape"])
                vec[:, at:at + size] = a.reshape(n, size)
                at += size
            else:
                for i in range(n):
                    extra[i][name] = a[i].tolist()
        vec = vec.reshape(n, self.chunks, self.chunk_dim)
        if self.vector == PACKED:
            vec = pack_float16(vec)
        return [{"pk": int(i) * CHUNK_SLOTS + c, "id": int(i), "chunk": c, "enc": vec[j, c],
                 "extra": extra[j] if c == 0 else {}} for j, i in enumerate(ids) for c in range(self.chunks)]

    # --- reading --------------------------------------------------------------------------------
    def pks(self, ids) -> list[int]:
        return [int(i) * CHUNK_SLOTS + c for i in ids for c in range(self.chunks)]

    def decode(self, ids, got: dict[int, dict], enc_cls, where: str) -> Encoding:
        """The Encoding of ``ids`` from their fetched rows (pk -> row), as float32 torch tensors."""
        n = len(ids)
        vec = np.empty((n, self.chunks * self.chunk_dim), dtype=np.float32)
        firsts = []
        for j, i in enumerate(ids):
            for c in range(self.chunks):
                row = got.get(int(i) * CHUNK_SLOTS + c)
                if row is None:
                    raise DataError(where, f"item {int(i)} lacks chunk {c} of its encoding: the collection is "
                                           "incomplete; build it again")
                vec[j, c * self.chunk_dim:(c + 1) * self.chunk_dim] = values_of(row["enc"], self.vector)
            firsts.append(got[int(i) * CHUNK_SLOTS]["extra"] or {})
        if not np.isfinite(vec).all():
            raise DataError(where, "NaN or inf in stored encodings: the collection is corrupt; build it again")
        out, at = {}, 0
        for name, spec in self.fields.items():
            if spec["where"] == "vector":
                size = math.prod(spec["shape"])
                a = torch.from_numpy(vec[:, at:at + size].reshape(n, *spec["shape"]).copy())
                at += size
            else:
                extra = [f[name] if isinstance(f, dict) else json.loads(f)[name] for f in firsts]
                a = torch.from_numpy(np.asarray(extra, dtype=spec["dtype"]).reshape(n, *spec["shape"]))
                if a.is_floating_point():
                    a = a.float()
            out[name] = a
        return enc_cls(**out)


def values_of(v, vector: str) -> np.ndarray:
    """One fetched vector field held as ``vector`` (see the module doc) as float32 values: float16
    bytes, packed float32s or float32s."""
    if isinstance(v, list) and len(v) == 1 and isinstance(v[0], (bytes, bytearray)):
        v = v[0]
    if isinstance(v, (bytes, bytearray)):  # little-endian float16s, or float32s (a FLOAT_VECTOR, packed or not)
        v = np.frombuffer(v, dtype="<f2" if vector == "FLOAT16_VECTOR" else "<f4")
    v = np.asarray(v, dtype=np.float32)
    return unpack_float16(v).astype(np.float32) if vector == PACKED else v


def pack_float16(a: np.ndarray) -> np.ndarray:
    """float16 values (an even number on the last axis) -> float32s holding two each, bit for bit: value
    2k's bits in the high half of float32 k, value 2k + 1's in the low half (the same on any host)."""
    bits = np.ascontiguousarray(a, dtype=np.float16).view(np.uint16).astype(np.uint32)
    return ((bits[..., 0::2] << 16) | bits[..., 1::2]).view(np.float32)


def unpack_float16(p: np.ndarray) -> np.ndarray:
    """The inverse of :func:`pack_float16`."""
    bits = np.ascontiguousarray(p, dtype=np.float32).view(np.uint32)
    out = np.empty((*bits.shape[:-1], 2 * bits.shape[-1]), dtype=np.uint16)
    out[..., 0::2] = bits >> 16
    out[..., 1::2] = bits & 0xFFFF
    return out.view(np.float16)


# --- schemas ----------------------------------------------------------------------------------------

def stage1_index(kind: str, nlist: int | None, hnsw_m: int) -> tuple[str, dict]:
    if kind == "hnsw":
        return "HNSW", {"M": hnsw_m, "efConstruction": 80}
    if kind == "ivf":
        return "IVF_FLAT", {"nlist": int(nlist)}
    return "FLAT", {}


def search_params(info: dict, k: int) -> dict:
    if info["kind"] == "hnsw":
        return {"ef": max(512, k)}
    if info["kind"] == "ivf":
        return {"nprobe": min(info["nlist"], 32)}
    return {}


def create_items(client, name: str, dim: int, kind: str, nlist: int | None, hnsw_m: int) -> None:
    """The table rows, stage-1 vectors and the fields a search filter reads (:mod:`.filters`)."""
    itype, params = stage1_index(kind, nlist, hnsw_m)
    create_collection(client, name, [("item", "JSON", {}), ("s1", "FLOAT_VECTOR", {"dim": dim}), *SCALAR_FIELDS],
                      ("s1", itype, "IP", params), key="id", consistency_level="Strong")


def create_encodings(client, name: str, layout: Layout) -> None:
    """The encodings' chunks: fetched by key, never searched, so mapped from the query nodes' disk (mmap); the
    FLAT index is there because Milvus loads only indexed vectors."""
    fields = [("id", "INT64", {}), ("chunk", "INT64", {}), ("enc", layout.field_type, {"dim": layout.field_dim}),
              ("extra", "JSON", {})]
    create_collection(client, name, fields, ("enc", "FLAT", "IP", {}), consistency_level="Strong",
                      properties={"mmap.enabled": True})


def vector_type(float16_ok: bool, dtype: str) -> str:
    """How the stage-2 values are held: FLOAT16_VECTOR where the index is float16 and the probe found the
    server's right, else FLOAT16_PACKED; FLOAT_VECTOR for a float32 index."""
    if dtype != "float16":
        return "FLOAT_VECTOR"
    return "FLOAT16_VECTOR" if float16_ok else PACKED
