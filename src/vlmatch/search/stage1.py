"""Stage 1: per-item global vectors in a FAISS inner-product index.

``flat`` (exact) by default; ``auto`` picks HNSW above :data:`AUTO_ANN_THRESHOLD` items (``efSearch`` 512: graphs
are weakest on unclustered vectors, so measure yours with ``benchmarks/search.py``); ``ivf`` on request. Single
queries search on one thread. The raw vectors stay beside the FAISS file (``stage1.npy``), so an update never
re-encodes and an exhaustive query scores every item exactly.
"""

from __future__ import annotations

import math
import os
from pathlib import Path

import numpy as np
import torch

from ..errors import ConfigError, DataError, VlmatchError
from ..io import atomic_path

AUTO_ANN_THRESHOLD = 50_000
KINDS = ("auto", "flat", "ivf", "hnsw")


def _faiss():
    try:
        import faiss
    except ImportError:
        raise VlmatchError("search needs faiss: pip install 'vlmatch[search]' (faiss-cpu)") from None
    return faiss


def choose_kind(kind: str, n: int) -> str:
    if kind not in KINDS:
        raise ConfigError(f"stage-1 index must be one of {KINDS}, not {kind!r}")
    if kind == "auto":
        return "hnsw" if n > AUTO_ANN_THRESHOLD else "flat"
    return kind


def build_faiss(vectors: np.ndarray, kind: str = "auto", nlist: int | None = None, hnsw_m: int = 32,
                seed: int = 0) -> tuple[object, dict]:
    """A FAISS inner-product index over ``vectors`` (n, d) and its description for the manifest."""
    faiss = _faiss()
    x = np.ascontiguousarray(vectors, dtype=np.float32)
    n, d = x.shape
    kind = choose_kind(kind, n)
    if kind == "flat":
        index, info = faiss.IndexFlatIP(d), {}
    elif kind == "ivf":
        from .checks import check_nlist

        check_nlist(nlist, n, "items")
        nlist = nlist or max(1, min(n // 39, int(4 * math.sqrt(n))))  # faiss wants >= 39 points per list
        quant = faiss.IndexFlatIP(d)
        index = faiss.IndexIVFFlat(quant, d, nlist, faiss.METRIC_INNER_PRODUCT)
        index.cp.seed = seed
        index.train(x)
        info = {"nlist": nlist}
    else:
        index = faiss.IndexHNSWFlat(d, hnsw_m, faiss.METRIC_INNER_PRODUCT)
        index.hnsw.efConstruction = 80
        info = {"M": hnsw_m}
    index.add(x)
    return index, {"kind": kind, "dim": d, "count": n, **info}


def default_search_params(info: dict) -> dict:
    if info["kind"] == "ivf":
        return {"nprobe": min(info["nlist"], 32)}
    if info["kind"] == "hnsw":
        return {"efSearch": 512}
    return {}


def write_faiss(index, path) -> None:
    faiss = _faiss()
    with atomic_path(path) as tmp:
        faiss.write_index(index, str(tmp))


REBUILD = "build the index again"


def _read_vectors(path: Path) -> np.ndarray:
    if not path.is_file():
        raise DataError(path, "missing (incomplete index?)")
    try:
        vectors = np.load(path, mmap_mode="r", allow_pickle=False)
    except (OSError, ValueError, EOFError):
        raise DataError(path, f"not a readable .npy array (truncated or damaged); {REBUILD}") from None
    if vectors.ndim != 2 or vectors.dtype != np.float32:
        raise DataError(path, f"stage-1 vectors are a 2-d float32 array, this one is {vectors.ndim}-d {vectors.dtype}; "
                              f"{REBUILD}")
    return vectors


def _read_index(path: Path):
    faiss = _faiss()
    if not path.is_file():
        raise DataError(path, "missing (incomplete index?)")
    if path.stat().st_size == 0:
        raise DataError(path, f"empty file; {REBUILD}")
    try:
        return faiss.read_index(str(path))
    except (RuntimeError, MemoryError):  # faiss's C++ exceptions arrive as RuntimeError
        raise DataError(path, f"not a readable FAISS index (truncated or damaged); {REBUILD}") from None


def _check_index(folder: Path, info: dict, index, vectors: np.ndarray) -> dict:
    """The manifest's stage-1 description of ``folder``, checked against the FAISS file and the vectors."""
    faiss = _faiss()
    path = folder / "stage1.faiss"
    kind = next((name for name, cls in (("hnsw", faiss.IndexHNSW), ("ivf", faiss.IndexIVF), ("flat", faiss.IndexFlat))
                 if isinstance(index, cls)), None)
    if kind is None or index.metric_type != faiss.METRIC_INNER_PRODUCT:
        raise DataError(path, f"holds a {type(index).__name__} index, not one vlmatch writes (inner-product flat, IVF "
                              f"or HNSW); {REBUILD}")
    if info.get("kind") != kind:
        raise DataError(path, f"holds a {kind} index but the manifest says {info.get('kind')!r}: the manifest was "
                              f"edited or the file replaced; {REBUILD}")
    if index.ntotal != len(vectors) or index.d != vectors.shape[1]:
        raise DataError(path, f"holds {index.ntotal} vectors of dimension {index.d} but stage1.npy beside it holds "
                              f"{len(vectors)} of dimension {vectors.shape[1]}; {REBUILD}")
    if kind == "ivf":
        info = {**info, "nlist": int(faiss.extract_index_ivf(index).nlist)}  # the file's, not an edited number
    return info


class Stage1:
    """Open side: FAISS search with the exact fallback when every item is asked for."""

    def __init__(self, folder, info: dict, params: dict | None = None):
        folder = Path(folder)
        self.vectors = _read_vectors(folder / "stage1.npy")
        self.index = _read_index(folder / "stage1.faiss")
        self.info = _check_index(folder, info, self.index, self.vectors)
        self.set_params(params or default_search_params(self.info))

    def set_params(self, params: dict) -> None:
        self.params = dict(params)
        if "nprobe" in params:
            _faiss().extract_index_ivf(self.index).nprobe = int(params["nprobe"])
        if "efSearch" in params:
            self.index.hnsw.efSearch = int(params["efSearch"])

    def __len__(self) -> int:
        return len(self.vectors)

    def search(self, queries: np.ndarray, k: int) -> tuple[np.ndarray, np.ndarray]:
        """Top ``k`` (scores, rows) per query; rows are -1 where an ANN index found fewer. ``k >= len(self)``: every
        item, scored exactly from the stored vectors."""
        q = np.ascontiguousarray(queries, dtype=np.float32)
        n = len(self)
        if k >= n:
            scores = q @ np.asarray(self.vectors).T
            rows = np.argsort(-scores, axis=1, kind="stable")
            return np.take_along_axis(scores, rows, axis=1), rows
        return _search(self.index, q, k)

    def search_subset(self, queries: np.ndarray, k: int, mask: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        """:meth:`search` among the rows where ``mask`` is true (a filter). Few rows (at most ``EXACT_BELOW``, or
        ``k``) are scored exactly by a flat scan with an id selector (the HNSW graph's own flat storage: none
        copied); more go through the graph or the IVF lists with the selector."""
        from .filters import EXACT_BELOW, top_k_of

        q = np.ascontiguousarray(queries, dtype=np.float32)
        kind = self.info["kind"]
        n_rows = int(np.count_nonzero(mask))
        exact = n_rows <= max(k, EXACT_BELOW) or kind == "flat"
        if exact and kind == "ivf":  # no flat storage beside the lists: the matching rows gathered and scored
            return top_k_of(q, self.vectors, np.flatnonzero(mask), k)
        faiss = _faiss()
        bits = np.packbits(np.asarray(mask, dtype=bool), bitorder="little")
        sel = faiss.IDSelectorBitmap(len(mask), faiss.swig_ptr(bits))
        index = self.index if kind == "flat" or not exact else faiss.downcast_index(self.index.storage)
        if exact:
            params = faiss.SearchParameters(sel=sel)
        elif kind == "hnsw":
            params = faiss.SearchParametersHNSW(sel=sel, efSearch=max(int(self.params.get("efSearch", 512)), k))
        else:
            params = faiss.SearchParametersIVF(sel=sel, nprobe=int(self.params.get("nprobe", 32)))
        scores, rows = _search(index, q, k, params=params)  # bits stays referenced until the search returns
        return np.where(rows >= 0, scores, -np.inf).astype(np.float32), rows


def _search(index, q: np.ndarray, k: int, **params):
    """``index.search`` on one thread for a few queries, on every core for a batch. FAISS and torch share one OpenMP
    runtime, so torch's thread count is put back after (else every later query ran its text and stage 2 on one)."""
    torch_threads = torch.get_num_threads()
    _faiss().omp_set_num_threads(1 if len(q) < 8 else max(1, os.cpu_count() or 1))
    try:
        return index.search(q, k, **params)
    finally:
        torch.set_num_threads(torch_threads)
