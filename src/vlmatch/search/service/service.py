"""What the HTTP service needs from an index (:class:`SearchBackend`; :class:`IndexBackend` adapts
``vlmatch.Index``, tests may pass any object with the same methods), its limits, and the bounded worker pool.
"""

from __future__ import annotations

import asyncio
import logging
import threading
import time
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, fields
from pathlib import Path
from typing import Any, Protocol

from ...errors import ConfigError

log = logging.getLogger("vlmatch.search")


class SearchBackend(Protocol):
    model_name: str
    size: int  # number of indexed images
    n_captions: int  # size of the indexed caption collection (0: none, image -> text search is off)

    def search(self, text: str, k: int, candidates: int, where=None) -> list[dict]:
        """Ranked results ``{id, path, score, stage1_score}`` (and ``taken``, ``camera``, ``gps``, ``size`` where
        known), best first; ``path`` inside the photo folder. ``where``: a :class:`vlmatch.search.filters.Where`."""

    def search_image(self, image: bytes | None, image_id: int | None, k: int) -> list[dict]:
        """Nearest captions ``{id, text, score}`` to an uploaded image (encoded bytes) or an indexed image id."""

    def search_like(self, image: bytes | None, image_id: int | None, *, k: int, candidates: int,
                    text: str | None = None, text_weight: float | None = None, where=None) -> list[dict]:
        """Results as :meth:`search` gives them for an uploaded image or an indexed image id, optionally with a
        text (``vlmatch.Index.search_like``)."""

    def path_of(self, image_id: int) -> Path | None:
        """The file the index's table holds for ``image_id`` (None when there is no such id)."""

    def file_of(self, image_id: int) -> Path | None:
        """:meth:`path_of`, checked to be the file indexed (optional): ``PhotoMissing`` or ``PhotoChanged`` when not."""

    def explain(self, image_id: int, text: str, method: str | None = None) -> dict:
        """The fields of :class:`.schema.ExplainResponse` but ``id``, ``text``, ``vmax`` and ``content``."""

    def explain_png(self, image_id: int, text: str, method: str | None = None) -> bytes:
        """The heat-map PNG of the ``explain`` command for this pair."""


@dataclass(frozen=True)
class Limits:
    """Caps on every request; the defaults suit a laptop serving one person or a small team. An upload's body cap
    is ``max_upload_bytes`` plus ``max_body_bytes``; uploads are decoded only on the ``workers`` model threads."""

    max_text_chars: int = 500
    max_k: int = 100
    max_candidates: int = 1000
    max_upload_bytes: int = 8 * 1024 * 1024
    max_upload_pixels: int = 40_000_000
    # an indexed photo's thumbnail or full view: the most pixels it may decode to (a JPEG at its reduced scale);
    # vlmatch.features.photo.MAX_DECODE_PIXELS, spelled out so the service's limits import no PIL
    max_decode_pixels: int = 256_000_000
    view_cache: int = 16  # full views of HEIC / TIFF / RAW ... photos (JPEG, up to 4096 px a side) kept in memory
    max_body_bytes: int = 64 * 1024  # a JSON body, a query form: far more than any valid request needs
    workers: int = 2  # threads doing model work (and image decoding)
    queue: int = 16  # requests allowed to wait for a worker; one more is answered 503
    thumb_size: int = 256
    thumb_cache: int = 2048  # thumbnails kept in memory

    def __post_init__(self):
        for name in (f.name for f in fields(self)):  # every limit is a count
            value = getattr(self, name)
            least = 0 if name == "queue" else 1
            if isinstance(value, bool) or not isinstance(value, int) or value < least:
                raise ConfigError(f"service limit {name} must be an integer >= {least}, not {value!r}")


class Busy(Exception):
    """Every worker is busy and the queue is full."""


class ModelPool:
    """A fixed pool of ``workers`` threads for model work, with at most ``queue`` requests waiting: one more is
    refused at once (:class:`Busy`). ``run`` is called from the event loop only: the counter needs no lock."""

    def __init__(self, workers: int, queue: int):
        self.workers, self.queue = workers, queue
        self.limit = workers + queue
        self.in_flight = 0
        self.rejected = 0
        self._pool = ThreadPoolExecutor(max_workers=workers, thread_name_prefix="vlmatch-model")

    async def run(self, fn, *args) -> tuple[Any, float]:
        """``fn(*args)`` on a worker; returns (result, seconds spent waiting for a worker)."""
        if self.in_flight >= self.limit:
            self.rejected += 1
            raise Busy
        self.in_flight += 1
        queued = time.perf_counter()
        waited = 0.0

        def job():
            nonlocal waited
            waited = time.perf_counter() - queued
            return fn(*args)

        try:
            return await asyncio.get_running_loop().run_in_executor(self._pool, job), waited
        finally:
            self.in_flight -= 1

    def shutdown(self) -> None:
        self._pool.shutdown(wait=False, cancel_futures=True)


class Served:
    """One committed version of an index, opened, with what the service answers from it."""

    def __init__(self, index, stamp=None):
        self.index, self.stamp = index, stamp
        self.version = str(index.manifest.get("seal") or "")[:12]  # its short name: the start of its manifest's seal
        self.model_name = index.manifest["model"]["name"]
        self.size = len(index)
        self.n_captions = len(index.captions) if index.captions is not None else 0

    def rows(self, ids) -> dict[int, dict]:
        """Image id -> its table row, for the ids the index holds (looked up per request, not all held)."""
        coll = self.index.images
        if coll is None:
            return {}
        keys = [(int(i), coll.key_of(int(i))) for i in ids]
        found = [(i, k) for i, k in keys if k is not None]
        return dict(zip([i for i, _ in found], coll.items_of([k for _, k in found]), strict=True))

    def path(self, image_id: int, checked: bool = False) -> Path | None:
        """The file of image ``image_id``; None when there is none, or its row names a file outside the indexed
        photo folder (never read). ``checked``: checked to be the file indexed (``PhotoRoot.current``)."""
        row, root = self.rows([image_id]).get(int(image_id)), self.index.photo_root
        return None if row is None or not root.keep(row) else Path(root.current(row) if checked else row["path"])

    def shown(self, ids) -> dict[int, str]:
        """What a result shows: the path inside the photo folder."""
        return {i: r.get("rel") or Path(r["path"]).name for i, r in self.rows(ids).items()
                if self.index.photo_root.keep(r)}


def index_stamp(root):
    """Changes whenever a new version of the index is committed (the manifest replaced or rewritten)."""
    from ..backends.base import MilvusLocation
    from ..backends.folder import manifest_stamp

    if isinstance(root, MilvusLocation):
        from ..backends.milvus.collection import committed_seal

        return committed_seal(root)
    return manifest_stamp(root)


class IndexBackend:
    """:class:`SearchBackend` over a ``vlmatch.Index`` that follows it: :meth:`reload` (every ``watch`` seconds)
    opens a version committed since beside the one served, then swaps it in whole; each request finishes on
    the version it started with."""

    def __init__(self, index, opener=None):
        self.root = index.root  # error messages name it "the index", never by its path
        # how a reload opens the index again (a Milvus index: with the checkpoints it was opened with)
        self._opener = opener
        self._served = Served(index, index_stamp(index.root))
        self._draw = threading.Lock()  # matplotlib's pyplot state is global: one drawing at a time
        self._reloading = threading.Lock()
        self._failed = None  # the stamp of a version that failed to open (tried again when it changes)
        self._stop = threading.Event()
        self.watcher: threading.Thread | None = None
        self.reloads = 0

    @classmethod
    def open(cls, folder=None, **milvus) -> IndexBackend:
        """``folder``, or a Milvus index: ``milvus_uri=``, ``collection=`` (see ``Index.open``)."""
        from ..index import Index

        return cls(Index.open(folder, **milvus), lambda: Index.open(folder, **milvus))

    # what /health reports: the version served now
    index = property(lambda self: self._served.index)
    version = property(lambda self: self._served.version)
    model_name = property(lambda self: self._served.model_name)
    size = property(lambda self: self._served.size)
    n_captions = property(lambda self: self._served.n_captions)
    # why the results carry no relevance although the index records a scale (vlmatch.Index.relevance_note)
    relevance_note = property(lambda self: self._served.index.relevance_note)

    def reload(self) -> bool:
        """Serve the version committed if it is not the one served; True if it swapped. One that cannot be opened
        is logged and the served one kept (tried again once the manifest changes again)."""
        from ..index import Index

        with self._reloading:
            stamp = index_stamp(self.root)
            if stamp is None or stamp == self._served.stamp or stamp == self._failed:
                return False
            try:
                new = Served(self._opener() if self._opener is not None else Index.open(self.root), stamp)
            except Exception as e:  # noqa: BLE001 -- keep serving what works; the log says why
                self._failed = stamp
                log.warning("vlmatch serve: the index changed but cannot be opened (%s); still serving version %s",
                            str(e).splitlines()[0] if str(e) else type(e).__name__, self._served.version)
                return False
            if new.version == self._served.version:  # the same commit (the manifest was only touched)
                self._served.stamp = stamp
                return False
            old, self._served = self._served, new
            self.reloads += 1
            log.info("vlmatch serve: now serving index version %s (%d images; was %s, %d images)", new.version,
                     new.size, old.version, old.size)
            return True

    def watch(self, every: float = 2.0) -> threading.Thread:
        """Call :meth:`reload` every ``every`` seconds on a daemon thread until :meth:`stop`."""
        def loop():
            while not self._stop.wait(every):
                try:
                    self.reload()
                except Exception:  # noqa: BLE001 -- the watcher never dies of one bad look
                    log.exception("vlmatch serve: checking the index for a new version failed")

        self.watcher = threading.Thread(target=loop, name="vlmatch-index-watch", daemon=True)
        self.watcher.start()
        return self.watcher

    def stop(self) -> None:
        self._stop.set()

    def path_of(self, image_id: int) -> Path | None:
        return self._served.path(image_id)

    def file_of(self, image_id: int) -> Path | None:
        return self._served.path(image_id, checked=True)

    def search(self, text: str, k: int, candidates: int, where=None) -> list[dict]:
        s = self._served  # this request's version, whatever a reload does meanwhile
        return self._rows(s, s.index.search(text, k=k, candidates=candidates, where=where))

    def search_like(self, image: bytes | None, image_id: int | None, *, k: int, candidates: int,
                    text: str | None = None, text_weight: float | None = None, where=None) -> list[dict]:
        s = self._served
        return self._rows(s, s.index.search_like(image if image is not None else int(image_id), k=k, text=text,
                                                 where=where, candidates=candidates, text_weight=text_weight))

    @staticmethod
    def _rows(s, hits) -> list[dict]:
        shown = s.shown([r.id for r in hits])
        meta = ("taken", "camera", "gps", "size", "relevance", "no_match")
        return [{"id": r.id, "path": shown[r.id], "score": r.score, "stage1_score": r.stage1_score,
                 **{f: getattr(r, f) for f in meta if getattr(r, f) is not None}} for r in hits]

    def search_image(self, image: bytes | None, image_id: int | None, k: int) -> list[dict]:
        s = self._served
        found = s.index.search_image(image if image is not None else s.path(image_id, checked=True), k=k)
        return [{"id": r.id, "text": r.text, "score": r.score} for r in found]

    def explain(self, image_id: int, text: str, method: str | None = None) -> dict:
        att = self._served.index.explain(image_id, text, method=method)
        parts = {"parts": {"ranker": att.parts["ranker"], "concepts": att.parts["concepts"]}} if att.parts else {}
        return {"method": att.method, "model": att.model, "words": att.words,
                "weights": att.weights.T.tolist(),  # (k positions, n words) -> a row per word
                "axis": att.axis, "score": att.shown_score, "maps_score": att.score, **parts,
                "mirrored": att.mirror_score is not None,
                "grid": [att.grid, att.grid] if att.grid else None, "shows": att.shows}

    def explain_png(self, image_id: int, text: str, method: str | None = None, shared_scale: bool = False) -> bytes:
        index = self._served.index
        with self._draw:
            return index.explain_png(image_id, text, method=method, shared_scale=shared_scale)
