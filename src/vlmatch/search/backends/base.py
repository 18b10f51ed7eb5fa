"""Where an index's collections live: the interface :class:`vlmatch.Index` searches through.

Every collection answers the same five questions, whatever holds it; a candidate is named by a *key* the
backend chooses (the folder index's row, Milvus's item id). Keys are ordered: results that tie on score
keep key order.
"""

from __future__ import annotations

from typing import NamedTuple, Protocol

import numpy as np

from ...models.base import Encoding


class CollectionBackend(Protocol):
    """One indexed collection as search reads it."""

    def __len__(self) -> int: ...

    def search(self, queries: np.ndarray, k: int, where=None) -> tuple[np.ndarray, np.ndarray]:
        """Top ``k`` (scores, keys) per query row, best first (keys -1 where fewer were found; ``k >= len(self)``:
        every item, exactly), among the items that pass ``where`` (a :class:`vlmatch.search.filters.Where`)."""

    def take(self, keys: np.ndarray) -> Encoding:
        """The stage-2 encodings of ``keys`` (in that order), float32, in the model's Encoding class."""

    def items_of(self, keys) -> list[dict]:
        """The table rows (``id``, ``path`` or ``text``, ...) of ``keys``, in that order."""

    def key_of(self, item_id: int) -> int | None:
        """The key of the item with id ``item_id``; None when there is none."""

    def stage1_vectors(self, keys) -> np.ndarray:
        """(len(keys), d) float32: the stored stage-1 vectors of ``keys``, in that order."""


class MilvusLocation(NamedTuple):
    """A Milvus index: the server (``http://host:19530``, or a milvus-lite ``.db`` file) and the collection name."""

    uri: str
    collection: str

    def __str__(self) -> str:
        return f"milvus collection {self.collection} at {self.uri}"
