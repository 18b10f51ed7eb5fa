"""What the routes of one app share (:class:`Context`: the backend, the limits, the model pool, the photo caches)
and the checks a request passes before any model work, each answered as an :class:`.errors.ApiError`. A route
takes the context as the dependency ``ctx: Ctx``."""

import asyncio
import math
import re
import time
from pathlib import Path
from typing import Annotated
from urllib.parse import unquote_to_bytes

from fastapi import Depends, Request

from ...errors import ConfigError
from ..filters import Where
from ..hits import shows_text
from .errors import ApiError, photo_errors
from .service import Busy, Limits, ModelPool, SearchBackend
from .thumbnails import ThumbCache


class Context:
    def __init__(self, backend: SearchBackend, limits: Limits):
        self.backend, self.limits = backend, limits
        self.pool = ModelPool(limits.workers, limits.queue)
        self.thumbs = ThumbCache(limits.thumb_size, limits.thumb_cache)
        self.views = ThumbCache(4096, limits.view_cache)  # full views of the photos browsers do not show, converted once
        self.decoding = asyncio.Semaphore(limits.workers)  # thumbnails and views decoded at once

    async def run_model(self, fn) -> tuple:
        """``fn()`` on a model worker: (its result, timings in ms: queue, search, total); 503 busy when the
        pool and its queue are full."""
        t0 = time.perf_counter()
        try:
            result, waited = await self.pool.run(fn)
        except Busy:
            raise ApiError(503, "busy", f"all {self.pool.workers} workers are busy and {self.pool.queue} requests "
                                        "are waiting; retry shortly", {"Retry-After": "1"}) from None
        total = time.perf_counter() - t0
        return result, {"queue_ms": waited * 1e3, "search_ms": (total - waited) * 1e3, "total_ms": total * 1e3}

    def check_text(self, text: str, name: str = "text") -> str:
        text = text.strip()
        if not shows_text(text):  # "", spaces (NBSP too), zero-width characters only
            raise ApiError(400, "empty_text", f"{name} is empty" + (" (it holds only invisible characters)"
                                                                     if text else ""))
        bad = re.search("[\ud800-\udfff]", text)
        if bad:  # JSON can carry a lone surrogate ("\ud800"); no text is made of one
            raise ApiError(400, "bad_text", f"{name} holds a lone surrogate (\\u{ord(bad.group()):04x}) at character "
                                            f"{bad.start()}: it is not Unicode text")
        if len(text) > self.limits.max_text_chars:
            raise ApiError(400, "text_too_long", f"{name} has {len(text)} characters; the limit is "
                                                 f"{self.limits.max_text_chars}")
        return text

    def check_k(self, k: int) -> None:
        if not 1 <= k <= self.limits.max_k:
            raise ApiError(400, "bad_k", f"k is {k}; it must be between 1 and {self.limits.max_k}")

    def candidates(self, k: int, candidates: int | None) -> int:
        """``candidates`` (default: 100, or k if larger, within the cap), checked with ``k``."""
        if candidates is None:
            candidates = max(k, min(100, self.limits.max_candidates))
        self.check_k(k)
        if not k <= candidates <= self.limits.max_candidates:
            raise ApiError(400, "bad_candidates", f"candidates is {candidates}; it must be between k ({k}) and "
                                                  f"{self.limits.max_candidates}")
        return candidates

    def check_id(self, image_id: int, lookup=None) -> Path:
        """The file of ``image_id`` by ``lookup`` (default ``backend.path_of``); 404 unknown_id when none."""
        with photo_errors(image_id):
            path = (lookup or self.backend.path_of)(image_id) if image_id >= 0 else None
        if path is None:
            raise ApiError(404, "unknown_id", f"no image with id {image_id} in the index")
        return path

    def check_file(self, image_id: int) -> Path:
        """:meth:`check_id`, and the file checked against what its row recorded before anything reads it
        (``backend.file_of``, where the backend has it): 404 file_missing, 409 photo_changed (a FIFO too)."""
        return self.check_id(image_id, getattr(self.backend, "file_of", None))


def context(request: Request) -> Context:
    return request.app.state.context


Ctx = Annotated[Context, Depends(context)]


def finite(name: str, value: float | None) -> None:
    if value is not None and not math.isfinite(value):
        raise ApiError(400, f"bad_{name}", f"{name} is {value}; it must be a finite number")


def where_of(filters: dict):
    """The photo filters sent (a :class:`vlmatch.search.filters.Where`, or None for none); 400 bad_filter."""
    try:
        return Where.of({f: v for f, v in filters.items() if v is not None})
    except ConfigError as e:
        raise ApiError(400, "bad_filter", str(e)) from None


def query_bytes_problem(query_string: bytes) -> str | None:
    """Why a raw query string's values are not UTF-8 text (None: they all are; starlette would decode them with
    replacement)."""
    for pair in query_string.split(b"&"):
        name, _, value = pair.partition(b"=")
        raw = unquote_to_bytes(value.replace(b"+", b" "))
        try:
            raw.decode("utf-8")
        except UnicodeDecodeError as e:
            key = unquote_to_bytes(name).decode("utf-8", "replace")
            return (f"{key} is not UTF-8 text (byte \\x{raw[e.start]:02x} at byte {e.start} of the decoded value): "
                    "send the text percent-encoded as UTF-8")
    return None


async def utf8_query(request: Request) -> None:
    """Refuse (400 bad_text) a query string whose values are not UTF-8: a dependency of every route."""
    problem = query_bytes_problem(request.scope.get("query_string") or b"")
    if problem is not None:
        raise ApiError(400, "bad_text", problem)
