"""Where an index's collections live: the interface :class:`vlmatch.Index` searches through, and its
folder implementation.

An index is a manifest (models and their digests, backbone, dims, store dtype, counts, format) and
one or two collections (images, captions). Every collection answers the same five questions,
whatever holds it: how many items, stage 1's top candidates of query vectors, the stage-2 encodings
of some candidates, the table rows (id, path or text) of some candidates, and which candidate an item
id is. A candidate is named by a *key* the backend chooses: the folder index's row, Milvus's item id
(:mod:`vlmatch.search.backends.milvus.collection`). Keys are ordered: results that tie on score keep key order.

Two backends: the index folder (:mod:`vlmatch.search.backends.folder`, the default: FAISS + memory-mapped
store) and a Milvus collection set (``--backend milvus``; :mod:`vlmatch.search.milvus_build`).
"""

from __future__ import annotations

import threading
from pathlib import Path
from typing import NamedTuple, Protocol

import numpy as np

from ...errors import DataError
from ...models.base import Encoding
from ..checks import COLLECTIONS, read_items
from ..filters import Columns, Where
from ..stage1 import Stage1
from ..store import EncodingStore

BACKENDS = ("folder", "milvus")


class CollectionBackend(Protocol):
    """One indexed collection as search reads it."""

    def __len__(self) -> int: ...

    def search(self, queries: np.ndarray, k: int, where=None) -> tuple[np.ndarray, np.ndarray]:
        """Top ``k`` (scores, keys) per query row, best first; keys are -1 where fewer were found.
        ``k >= len(self)``: every item, scored exactly. ``where``: only the items that pass this filter
        (a :class:`vlmatch.search.filters.Where`, a dict of its fields, or None), applied in the search
        itself, so the top ``k`` are the best matching items."""

    def take(self, keys: np.ndarray) -> Encoding:
        """The stage-2 encodings of ``keys`` (in that order), float32, in the model's Encoding class."""

    def items_of(self, keys) -> list[dict]:
        """The table rows (``id``, ``path`` or ``text``, ...) of ``keys``, in that order."""

    def key_of(self, item_id: int) -> int | None:
        """The key of the item with id ``item_id``; None when there is none."""


class MilvusLocation(NamedTuple):
    """A Milvus index: the server (a pymilvus URI: ``http://host:19530``, or a milvus-lite ``.db`` file)
    and the vlmatch collection name. Its text names it in messages, never with a token."""

    uri: str
    collection: str

    def __str__(self) -> str:
        return f"milvus collection {self.collection} at {self.uri}"


class FolderCollection:
    """One collection of an index folder: ``items.json``, the FAISS stage 1, the stage-2 store.
    Keys are rows."""

    def __init__(self, folder: Path, info: dict, template):
        self.folder = folder
        self.items = read_items(folder / "items.json", COLLECTIONS.get(folder.name.removesuffix(".prev"), "path"))
        self.stage1 = Stage1(folder, info["stage1"])
        self.store = EncodingStore(folder / "enc", template)
        if not (len(self.items) == len(self.stage1) == len(self.store)):
            raise DataError(folder, f"inconsistent index: {len(self.items)} items, {len(self.stage1)} stage-1 vectors, "
                                    f"{len(self.store)} encodings")
        self.row_of = {it["id"]: r for r, it in enumerate(self.items)}
        self._columns = None
        self._masks: dict = {}
        self._lock = threading.Lock()

    def __len__(self) -> int:
        return len(self.items)

    def search(self, queries: np.ndarray, k: int, where=None) -> tuple[np.ndarray, np.ndarray]:
        where = Where.of(where)
        if where is None:
            return self.stage1.search(queries, k)
        with self._lock:  # the service searches from several threads
            if self._columns is None:  # the filterable columns of the table, built at the first filtered query
                self._columns = Columns(self.items)
            mask = self._masks.pop(where, None)
            if mask is None:
                mask = where.mask(self._columns)
            self._masks[where] = mask  # the latest few filters' rows (a page asks for the same filter again)
            while len(self._masks) > 8:
                self._masks.pop(next(iter(self._masks)))
        return self.stage1.search_subset(queries, k, mask)

    def take(self, keys) -> Encoding:
        return self.store.take(keys)

    def items_of(self, keys) -> list[dict]:
        return [self.items[int(r)] for r in keys]

    def key_of(self, item_id: int) -> int | None:
        return self.row_of.get(item_id)
