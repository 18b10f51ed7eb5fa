"""The HTTP API and web page over a search index (FastAPI).

``create_app(backend, limits)`` builds the app; ``vlmatch serve INDEX`` runs it with uvicorn. Every
error is JSON ``{"error": code, "detail": message}`` with a 4xx/5xx status. Model work (searches,
explanations) runs on a fixed pool of worker threads with a bounded queue: a full queue answers 503
with ``Retry-After`` rather than piling requests up. Files are served only by id, from the paths in
the index's own table; nothing in a request is ever used as a path.

What a client can get wrong is answered 4xx in our own words; a failure of the server itself is a
500 whose detail says only that (the traceback goes to the server log, logger ``vlmatch.search``),
never an exception's text. Bodies are capped before they are read (:class:`BodyLimit`) and
uploaded images are decoded only on the model workers, after the request found a free place.
"""

from __future__ import annotations

import asyncio
import io
import json
import logging
import math
import re
import threading
import time
import unicodedata
from collections import OrderedDict
from contextlib import asynccontextmanager
from importlib.resources import files
from pathlib import Path
from typing import Annotated, Literal
from urllib.parse import unquote_to_bytes

from fastapi import Depends, FastAPI, File, Form, Query, Request, UploadFile
from fastapi.concurrency import run_in_threadpool
from fastapi.exceptions import RequestValidationError
from fastapi.responses import FileResponse, HTMLResponse, JSONResponse, Response
from pydantic import BaseModel, Field
from starlette.exceptions import HTTPException as StarletteHTTPException
from starlette.routing import Match

from ..errors import ConfigError, DataError, VlmatchError
from ..features.photo import MissingDecoder, PhotoTooLarge, open_photo, sniff
from ..io import printable
from ..version import __version__
from ..viz.words import is_content
from .backends.milvus.client import RETRY_AFTER_S, Refused, Unavailable
from .filters import Where
from .open_vocab import no_match_line
from .service import Busy, Limits, ModelPool, SearchBackend

NO_MATCH = "no photo matches these filters"

log = logging.getLogger("vlmatch.search")
INTERNAL = "the server failed to answer this request; the details are in the server's log"

# photo format (vlmatch.features.photo.sniff) -> content type: what the service accepts as uploads
IMAGE_TYPES = {"JPEG": "image/jpeg", "PNG": "image/png", "GIF": "image/gif", "BMP": "image/bmp", "WEBP": "image/webp",
               "TIFF": "image/tiff", "HEIF": "image/heif", "AVIF": "image/avif"}
# the formats every browser shows as they are; /images/{id} converts the others (HEIC, TIFF, AVIF) to an upright JPEG
BROWSER_FORMATS = ("JPEG", "PNG", "GIF", "BMP", "WEBP")
UPLOAD_FORMATS = "a JPEG, PNG, GIF, BMP, WebP, TIFF, HEIC/HEIF or AVIF image"
SPECIAL = re.compile(r"^(<.*>|\[CLS\]|\[SEP\])$")  # <start>, <end>, [CLS], [SEP]: tokens the page does not show
Method = Literal["attention", "contribution", "gradient", "occlusion"]  # vlmatch.evaluation.explainers.METHODS
METHOD_HELP = ("how the maps are made: attention (the model's own weights), contribution (each position's exact "
               "share of the score), gradient (gradient x input), occlusion (score drop with the position masked); "
               "default: the model's best-grounding method")
# an id may name another file once the server follows a rebuild: clients revalidate (a 304 is cheap)
FILE_CACHE = "public, max-age=0, must-revalidate"
DRAIN_BYTES = 64 * 2**20  # a refused body up to this size is read and dropped (see BodyLimit)
LIKE_ROUTE = "/search/like"  # search by photo's multipart form; POST /search with a form body is served here


class ApiError(Exception):
    def __init__(self, status: int, code: str, detail: str, headers: dict | None = None):
        self.status, self.code, self.detail, self.headers = status, code, detail, headers


def visible(ch: str) -> bool:
    """A character that shows: not white space (NBSP included), not a control, and not a format character
    such as ZERO WIDTH SPACE/JOINER/NON-JOINER or the BOM (Unicode category Cf). A lone surrogate counts
    as visible here (it is refused as bad_text, not as empty)."""
    return not ch.isspace() and unicodedata.category(ch) not in ("Cf", "Cc")


async def _utf8_body(request: Request) -> bool:
    """The request's body is UTF-8 (or could not be read again: a body cut off at its cap)."""
    try:
        (await request.body()).decode("utf-8")
    except UnicodeDecodeError:
        return False
    except Exception:  # noqa: BLE001 -- ClientDisconnect and the like: not ours to judge
        return True
    return True


def query_bytes_problem(query_string: bytes) -> str | None:
    """Why a raw query string's values are not UTF-8 text (None: they all are): starlette decodes them
    with replacement, so ``?q=%FF%FE`` would otherwise search for U+FFFD where the same bytes in a JSON
    body are refused."""
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


def sniff_type(head: bytes) -> str | None:
    """The image content type from a file's first bytes (None: not an image type we take)."""
    return IMAGE_TYPES.get(sniff(head))


def check_upload(data: bytes, limits: Limits) -> None:
    """Reject anything but a decodable image of sane size; the message says what is wrong.

    It decodes the image: call it on a model worker only (see ``search_image``)."""
    if not data:
        raise ApiError(400, "empty_upload", "the uploaded file is empty")
    if len(data) > limits.max_upload_bytes:
        raise ApiError(413, "upload_too_large", f"the upload is larger than {limits.max_upload_bytes} bytes")
    if sniff_type(data[:32]) is None:
        raise ApiError(415, "not_an_image", f"the upload is not {UPLOAD_FORMATS}")
    try:
        # decoded whole, as the model will read it (a truncated or corrupt body fails here, not in the model);
        # a JPEG at a reduced scale (all the data is still read)
        open_photo(data, 1024, name="upload", max_pixels=limits.max_upload_pixels)
    except PhotoTooLarge as e:
        raise ApiError(413, "image_too_large", f"the image {e.problem}") from None
    except MissingDecoder as e:  # a HEIC / AVIF upload to a server without the decoder
        raise ApiError(415, "no_decoder", e.problem) from None
    except DataError:
        raise ApiError(415, "bad_image", "the upload is not a readable image (truncated or corrupt)") from None


def _libc_trim():
    try:
        import ctypes

        return ctypes.CDLL("libc.so.6").malloc_trim
    except (OSError, AttributeError):  # not glibc: nothing to do
        return None


_TRIM = _libc_trim()


def release_memory() -> None:
    """Hand freed heap memory back to the system (glibc keeps the pages of a decoded image otherwise,
    and the server's idle size would stay at its peak)."""
    if _TRIM is not None:
        _TRIM(0)


class BodyLimit:
    """ASGI middleware: refuse a request body above its cap (413) before the app reads it.

    A declared ``Content-Length`` over the cap is refused at once; a body without one (chunked) is
    counted as it arrives and cut off at the cap. ``cap(scope)`` gives the cap of a request.
    """

    def __init__(self, app, cap):
        self.app, self.cap = app, cap

    async def __call__(self, scope, receive, send):
        if scope["type"] != "http":
            return await self.app(scope, receive, send)
        cap = self.cap(scope)
        length = dict(scope.get("headers") or ()).get(b"content-length")
        if length is not None and (not length.strip().isdigit() or int(length) > cap):
            # up to DRAIN_BYTES the server reads the rest and drops it, so that the client (which sends
            # its whole body before it reads) gets the 413; a larger body closes the connection instead
            return await _refuse(send, cap, close=not length.strip().isdigit() or int(length) > DRAIN_BYTES)
        seen, refused, started = 0, False, False

        async def receive_capped():
            nonlocal seen, refused
            if refused:
                return {"type": "http.disconnect"}
            message = await receive()
            if message["type"] == "http.request":
                seen += len(message.get("body", b""))
                if seen > cap:
                    refused = True
                    if not started:
                        await _refuse(send, cap, close=True)  # a chunked body has no known end
                    return {"type": "http.disconnect"}  # the app stops reading; its answer is dropped
            return message

        async def send_unless_refused(message):
            nonlocal started
            if refused:
                return
            started = started or message["type"] == "http.response.start"
            await send(message)

        await self.app(scope, receive_capped, send_unless_refused)


class MultipartSearch:
    """ASGI middleware: ``POST /search`` with a ``multipart/form-data`` body (an uploaded photo) is served by
    :data:`LIKE_ROUTE`; a JSON body stays with ``POST /search``. One path, two body types, each route with its
    own validated schema."""

    def __init__(self, app):
        self.app = app

    async def __call__(self, scope, receive, send):
        if scope["type"] == "http" and scope.get("method") == "POST" and scope.get("path") == "/search":
            ctype = dict(scope.get("headers") or ()).get(b"content-type", b"")
            if ctype.split(b";")[0].strip().lower() == b"multipart/form-data":
                scope = {**scope, "path": LIKE_ROUTE, "raw_path": LIKE_ROUTE.encode()}
        return await self.app(scope, receive, send)


async def _refuse(send, cap: int, close: bool) -> None:
    body = json.dumps({"error": "body_too_large", "detail": f"the request body is larger than {cap} bytes"}).encode()
    headers = [(b"content-type", b"application/json"), (b"content-length", str(len(body)).encode())]
    await send({"type": "http.response.start", "status": 413, "headers": headers + [(b"connection", b"close")] * close})
    await send({"type": "http.response.body", "body": body})


# --- request / response models (they document the OpenAPI schema) -----------------------------
FILTER_HELP = {  # the filters of a photo search (vlmatch.search.filters), applied in stage 1
    "after": "only photos taken on or after this date (YYYY-MM-DD or ISO 8601 time); undated photos are left out",
    "before": "only photos taken on or before this date (YYYY-MM-DD: the whole day)",
    "camera": "only photos whose camera make and model contain this text (any case)",
    "under": "only photos in this subfolder of the indexed photo folder (any depth)",
    "near": "only photos whose GPS position is within KM kilometres of LAT,LON: 'LAT,LON,KM'",
}


class SearchRequest(BaseModel):
    text: str | None = Field(None, description="the query sentence (required unless like is given)",
                             examples=["a dog runs on the beach"])
    like: int | None = Field(None, description="search by photo: the indexed image id whose look-alikes to return; "
                                               "with a text too, look-alikes that also match the text")
    text_weight: float | None = Field(None, description="with like and a text: the text's share (0..1) of the "
                                                        "combined score (default 0.5; see docs/search.md)")
    k: int = Field(10, description="results to return (1 .. max_k)")
    candidates: int | None = Field(None, description="stage-1 candidates re-scored by the model (k .. max_candidates; "
                                                     "default 100, or k if larger, within the cap)")
    min_score: float | None = Field(None, description="drop results whose (stage-2) score is below this")
    after: str | None = Field(None, description=FILTER_HELP["after"], examples=["2023-06-01"])
    before: str | None = Field(None, description=FILTER_HELP["before"], examples=["2023-08-31"])
    camera: str | None = Field(None, description=FILTER_HELP["camera"])
    under: str | None = Field(None, description=FILTER_HELP["under"])
    near: str | list[float] | None = Field(None, description=FILTER_HELP["near"] + " (or [LAT, LON, KM])",
                                           examples=["48.8566,2.3522,25"])


class SearchResult(BaseModel):
    id: int
    path: str = Field(..., description="the file's path inside the photo folder the index was built from")
    score: float = Field(..., description="the model's own (stage-2) score; results are ranked by it")
    stage1_score: float | None = Field(None, description="the stage-1 (global vector) score that chose the candidate")
    taken: str | None = Field(None, description="capture time, ISO 8601 (EXIF; absent when the photo records none)")
    camera: str | None = Field(None, description="camera make and model (EXIF)")
    gps: list[float] | None = Field(None, description="[latitude, longitude] in decimal degrees (EXIF GPS)")
    size: list[int] | None = Field(None, description="[width, height] in pixels, as the photo is displayed")
    relevance: float | None = Field(None, description="the probability that the photo matches the text, 0 to 1 "
                                    "(fitted on Flickr8k val; absent for an index without a relevance scale)")
    no_match: bool | None = Field(None, description="true when the relevance is under the index's 'nothing "
                                  "matches' threshold")


class SearchResponse(BaseModel):
    text: str | None
    like: int | None = Field(None, description="the indexed image id searched by (a search by photo)")
    k: int
    candidates: int
    results: list[SearchResult]
    no_match: str | None = Field(None, description="one line when even the best photo is unlikely to match: "
                                 "'no photo matches this well (best relevance R); closest: PATH'")
    timings: dict[str, float] = Field(..., description="milliseconds: queue (waiting for a worker), search, total")
    message: str | None = Field(None, description=f"'{NO_MATCH}' when filters leave no photo (results empty)")


class CaptionResult(BaseModel):
    id: int
    text: str
    score: float


class ImageSearchResponse(BaseModel):
    k: int
    results: list[CaptionResult]
    timings: dict[str, float]


class ExplainResponse(BaseModel):
    id: int
    text: str
    method: str = Field("attention", description="the explanation method that made the maps: attention, "
                                                 "contribution, gradient or occlusion")
    model: str | None = Field(None, description="the checkpoint whose maps these are: one of the index's two models, "
                                               "or the shipped default explainer when it points better")
    score: float | None
    mirrored: bool = Field(False, description="each map is the mean of the photo's and its mirror image's, mirrored "
                                              "back (the explainer's shipped record says so; a text naming left or "
                                              "right keeps the photo's alone); score stays the photo's")
    shows: str | None = Field(None, description="what the maps split: the model's score, or the ranking model's "
                                               "part of an open-vocabulary index's fused score")
    words: list[str]
    weights: list[list[float]] = Field(..., description="one list per word: its weight on each image position")
    axis: str = Field(..., description='attention: "regions" (each word\'s weights sum to 1), "words" (each '
                                       'region\'s do) or "pair"; contribution: "score" (all weights sum to the score); '
                                       'gradient: "gradient"; occlusion: "drop"')
    grid: list[int] | None = Field(None, description="[rows, cols] when positions are a grid (row-major)")
    boxes: list[list[float]] | None = Field(None, description="[x0, y0, x1, y1] per position, as fractions of the image")
    vmax: float = Field(..., description="the top of the one colour scale shared by all words")
    content: list[bool] = Field(default_factory=list, description="per word: a content word (the page opens on the "
                                                                  "first; special tokens and function words are not)")


class Health(BaseModel):
    status: str
    model: str
    index_size: int
    captions: int
    index_version: str | None = Field(None, description="the committed version of the index served (the start of "
                                                        "its manifest's seal): it changes with every build and update")
    version: str
    workers: int
    queue: int
    in_flight: int


class ErrorBody(BaseModel):
    error: str
    detail: str


ERRORS = {s: {"model": ErrorBody} for s in (400, 404, 413, 415, 422, 503)}


def as_jpeg(path: Path, item_id: int, max_pixels: int, side: int = 4096) -> bytes:
    """An indexed photo in a format browsers do not show (HEIC, TIFF, AVIF, a RAW's preview) as an upright JPEG
    of at most ``side`` pixels a side (decoded once: the service keeps the last few, :class:`ThumbCache`)."""
    try:
        im = open_photo(path, side, max_pixels=max_pixels)
    except PhotoTooLarge as e:
        raise ApiError(415, "image_too_large", f"the indexed file of id {item_id} {e.problem}") from None
    except DataError:
        raise ApiError(415, "bad_image", f"the indexed file of id {item_id} cannot be decoded") from None
    im.thumbnail((side, side))
    buf = io.BytesIO()
    im.save(buf, "JPEG", quality=90)
    return buf.getvalue()


class ThumbCache:
    """Thumbnails (JPEG bytes) of recently asked ids, keyed by the file's identity."""

    def __init__(self, size: int, capacity: int):
        self.size, self.capacity = size, capacity  # a capacity of 0 keeps none
        self._items: OrderedDict = OrderedDict()
        self._lock = threading.Lock()

    def lookup(self, key) -> bytes | None:
        with self._lock:
            if key in self._items:
                self._items.move_to_end(key)
                return self._items[key]
        return None

    def make(self, path: Path, key, max_pixels: int) -> bytes:
        """Decode (upright, as displayed; JPEG files at a reduced scale), shrink and keep the thumbnail of
        ``path``: a JPEG, which keeps no EXIF orientation, so it is stored the right way up."""
        try:
            im = open_photo(path, self.size, max_pixels=max_pixels)
        except PhotoTooLarge as e:
            raise ApiError(415, "image_too_large", f"the indexed file {e.problem}; thumbnails are made of images "
                                                   f"of up to {max_pixels} pixels") from None
        im.thumbnail((self.size, self.size))
        buf = io.BytesIO()
        im.save(buf, "JPEG", quality=82)
        return self.keep(key, buf.getvalue())

    def keep(self, key, data: bytes) -> bytes:
        with self._lock:
            self._items[key] = data
            while len(self._items) > self.capacity:
                self._items.popitem(last=False)
        return data


async def utf8_query(request: Request) -> None:
    """Refuse (400 bad_text) a query string whose values are not UTF-8 (see :func:`query_bytes_problem`)."""
    problem = query_bytes_problem(request.scope.get("query_string") or b"")
    if problem is not None:
        raise ApiError(400, "bad_text", problem)


def create_app(backend: SearchBackend, limits: Limits | None = None) -> FastAPI:
    limits = limits or Limits()
    pool = ModelPool(limits.workers, limits.queue)
    thumbs = ThumbCache(limits.thumb_size, limits.thumb_cache)
    views = ThumbCache(4096, limits.view_cache)  # full views of the photos browsers do not show, converted once
    decoding = asyncio.Semaphore(limits.workers)

    @asynccontextmanager
    async def lifespan(app):
        yield
        pool.shutdown()
        if hasattr(backend, "stop"):  # the watcher of an IndexBackend (vlmatch serve)
            backend.stop()

    app = FastAPI(
        title="vlmatch search",
        version=__version__,
        description="Search an image collection by sentence (two-stage: global vectors, then the model's own "
                    "cross-attention score), search captions by image, and see which image positions each word "
                    f"matched. Limits: text <= {limits.max_text_chars} characters, k <= {limits.max_k}, "
                    f"candidates <= {limits.max_candidates}, uploads <= {limits.max_upload_bytes} bytes; "
                    f"{limits.workers} model workers with {limits.queue} queued requests, then 503.",
        docs_url=None, redoc_url=None,  # both load their scripts from a CDN; the schema is at /openapi.json
        lifespan=lifespan,
        dependencies=[Depends(utf8_query)],  # every route: query text is UTF-8, as in a JSON body
    )
    app.state.pool, app.state.limits, app.state.backend = pool, limits, backend

    def upload_route(scope) -> bool:
        return scope.get("path") in ("/search/image", LIKE_ROUTE) and scope.get("method") == "POST"

    app.add_middleware(BodyLimit, cap=lambda scope: limits.max_body_bytes +
                       (limits.max_upload_bytes if upload_route(scope) else 0))
    app.add_middleware(MultipartSearch)  # outermost: POST /search with a form goes to /search/like first

    root = getattr(backend, "root", None)
    # the index folder as our messages write it (as given, or resolved), where it stands as a whole path;
    # a Milvus index (vlmatch.search.backends.base.MilvusLocation): its name and its server's URI
    names = set() if root is None else ({str(root), root.uri} if hasattr(root, "uri") else
                                        {str(Path(root)), str(Path(root).resolve())})
    folder = None if not names else re.compile(
        "|".join(rf"(?<![\w./-]){re.escape(r)}(?=[/:\s;,)]|$)" for r in sorted(names, key=len, reverse=True) if r))

    def words(message: str) -> str:
        """A message of ours as the client may see it: UTF-8, and the index named, not its folder."""
        if folder is not None:
            message = folder.sub("the index", message)
        return printable(message)

    def internal(e: BaseException, request: Request | None = None) -> JSONResponse:
        where = f" ({request.method} {request.url.path})" if request is not None else ""
        log.error("internal error%s", where, exc_info=(type(e), e, e.__traceback__))
        return JSONResponse({"error": "internal_error", "detail": INTERNAL}, status_code=500)

    # --- errors: one JSON shape for everything ------------------------------------------------
    @app.exception_handler(ApiError)
    async def _api_error(request, e: ApiError):
        return JSONResponse({"error": e.code, "detail": words(e.detail)}, status_code=e.status, headers=e.headers)

    @app.exception_handler(StarletteHTTPException)
    async def _http_error(request, e):
        code = {404: "not_found", 405: "method_not_allowed", 413: "body_too_large"}.get(e.status_code, "http_error")
        headers = dict(getattr(e, "headers", None) or {})
        if e.status_code == 400 and "json" in request.headers.get("content-type", "") and not await _utf8_body(request):
            # FastAPI's words for a JSON body that is not UTF-8: the same rule as a query string's bytes
            return JSONResponse({"error": "bad_text", "detail": "the JSON body is not UTF-8 text: send it encoded as "
                                                                "UTF-8"}, status_code=400)
        if e.status_code == 405:  # every method some route of this path answers (RFC 9110: a 405 names them)
            headers["Allow"] = allowed_methods(request.scope)
        return JSONResponse({"error": code, "detail": words(str(e.detail))}, status_code=e.status_code,
                            headers=headers or None)

    def allowed_methods(scope) -> str:
        methods = set()
        for route in app.router.routes:  # PARTIAL: the path is the route's, the method is not
            if route.matches(scope)[0] != Match.NONE and getattr(route, "methods", None):
                methods |= set(route.methods)
        return ", ".join(sorted(methods))

    @app.exception_handler(RequestValidationError)
    async def _validation_error(request, e):
        parts = []
        for err in e.errors():
            where = ".".join(str(x) for x in err.get("loc", ()) if x not in ("body", "query", "path"))
            parts.append(f"{where or 'request'}: {err.get('msg')}")
        return JSONResponse({"error": "invalid_request", "detail": words("; ".join(parts))}, status_code=422)

    @app.exception_handler(Unavailable)
    async def _unavailable(request, e):  # the Milvus server is away: the index stays open, answers resume
        return JSONResponse({"error": "index_unavailable", "detail": words(str(e))}, status_code=503,
                            headers={"Retry-After": str(RETRY_AFTER_S)})

    @app.exception_handler(Refused)
    async def _refused(request, e):  # the Milvus server answered and refused: its words, not a retry's matter
        return JSONResponse({"error": "index_refused", "detail": words(str(e))}, status_code=502)

    @app.exception_handler(VlmatchError)
    async def _vlmatch_error(request, e):
        if isinstance(e, DataError):  # a file of the index itself is unreadable: not the client's doing
            return internal(e, request)
        return JSONResponse({"error": "bad_request", "detail": words(str(e))}, status_code=400)

    @app.exception_handler(Exception)
    async def _internal_error(request, e):  # never the exception's text: the traceback goes to the server log
        return internal(e, request)

    async def run_model(fn, *args):
        try:
            return await pool.run(fn, *args)
        except Busy:
            raise ApiError(503, "busy", f"all {pool.workers} workers are busy and {pool.queue} requests are waiting; "
                                        "retry shortly", {"Retry-After": "1"}) from None

    def check_text(text: str, name: str = "text") -> str:
        text = text.strip()
        if not any(visible(ch) for ch in text):  # "", spaces (NBSP too), zero-width characters only
            raise ApiError(400, "empty_text", f"{name} is empty" + (" (it holds only invisible characters)"
                                                                     if text else ""))
        bad = re.search("[\ud800-\udfff]", text)
        if bad:  # JSON can carry a lone surrogate ("\ud800"); no text is made of one
            raise ApiError(400, "bad_text", f"{name} holds a lone surrogate (\\u{ord(bad.group()):04x}) at character "
                                            f"{bad.start()}: it is not Unicode text")
        if len(text) > limits.max_text_chars:
            raise ApiError(400, "text_too_long", f"{name} has {len(text)} characters; the limit is {limits.max_text_chars}")
        return text

    def check_k(k: int, candidates: int | None = None) -> None:
        if not 1 <= k <= limits.max_k:
            raise ApiError(400, "bad_k", f"k is {k}; it must be between 1 and {limits.max_k}")
        if candidates is not None and not k <= candidates <= limits.max_candidates:
            raise ApiError(400, "bad_candidates", f"candidates is {candidates}; it must be between k ({k}) and "
                                                  f"{limits.max_candidates}")

    def check_id(image_id: int) -> Path:
        path = backend.path_of(image_id) if image_id >= 0 else None
        if path is None:
            raise ApiError(404, "unknown_id", f"no image with id {image_id} in the index")
        return path

    # --- search ----------------------------------------------------------------------------------
    async def do_search(text: str, k: int, candidates: int | None, min_score: float | None,
                        filters: dict | None = None) -> dict:
        text = check_text(text)
        where = where_of(filters)
        if candidates is None:
            candidates = max(k, min(100, limits.max_candidates))
        check_k(k, candidates)
        if min_score is not None and not math.isfinite(min_score):
            raise ApiError(400, "bad_min_score", f"min_score is {min_score}; it must be a finite number")
        t0 = time.perf_counter()
        if where is None:
            results, waited = await run_model(backend.search, text, k, candidates)
        else:
            results, waited = await run_model(backend.search, text, k, candidates, where)
        total = time.perf_counter() - t0
        if min_score is not None:
            results = [r for r in results if r["score"] >= min_score]
        shown = [{**r, "path": printable(str(r["path"]))} for r in results]
        return {"text": text, "k": k, "candidates": candidates, "results": shown, "no_match": no_match_line(shown),
                "timings": {"queue_ms": waited * 1e3, "search_ms": (total - waited) * 1e3, "total_ms": total * 1e3},
                "message": NO_MATCH if where is not None and not results else None}

    @app.post("/search", response_model=SearchResponse, responses=ERRORS, tags=["search"])
    async def search(req: SearchRequest):
        """Images ranked by the model's score for a sentence (two-stage search); with ``like`` (an indexed id),
        the photos most like that one (and matching the text, if given). A multipart body (an uploaded
        ``image``, or ``like``, with the same fields) is served by ``POST /search/like``."""
        filters = {f: getattr(req, f) for f in FILTER_HELP}
        if req.like is not None:
            return await do_like(req.text, req.like, None, req.k, req.candidates, req.min_score, req.text_weight,
                                 filters)
        if req.text is None:
            raise ApiError(422, "invalid_request", "text: Field required (or like: an indexed image id)")
        return await do_search(req.text, req.k, req.candidates, req.min_score, filters)

    @app.get("/search", response_model=SearchResponse, responses=ERRORS, tags=["search"])
    async def search_get(q: str | None = Query(None, description="the query sentence (required unless like is given)"),
                         k: int = 10, candidates: int | None = None, min_score: float | None = None,
                         like: int | None = Query(None, description="search by photo: an indexed image id"),
                         text_weight: float | None = Query(None, description="with like and q: the text's share"),
                         after: Annotated[str | None, Query(description=FILTER_HELP["after"])] = None,
                         before: Annotated[str | None, Query(description=FILTER_HELP["before"])] = None,
                         camera: Annotated[str | None, Query(description=FILTER_HELP["camera"])] = None,
                         under: Annotated[str | None, Query(description=FILTER_HELP["under"])] = None,
                         near: Annotated[str | None, Query(description=FILTER_HELP["near"])] = None):
        """The same as ``POST /search``, for links: ``/search?q=a+dog+on+the+beach&k=20&after=2023-06-01``,
        ``/search?like=12``."""
        filters = {"after": after, "before": before, "camera": camera, "under": under, "near": near}
        if like is not None:
            return await do_like(q, like, None, k, candidates, min_score, text_weight, filters)
        if q is None:
            raise ApiError(422, "invalid_request", "q: Field required (or like: an indexed image id)")
        return await do_search(q, k, candidates, min_score, filters)

    def where_of(filters: dict | None):
        try:
            return Where.of({f: v for f, v in (filters or {}).items() if v is not None})
        except ConfigError as e:
            raise ApiError(400, "bad_filter", words(str(e))) from None

    def upload_job(image: UploadFile | None, call):
        """A model worker's job: read and check the upload (if any; nothing is read into memory or decoded
        before the pool admits the request), then ``call(data)`` (``data``: the upload's bytes, or None)."""
        def job():
            data = None
            if image is not None:
                data = image.file.read(limits.max_upload_bytes + 1)
                check_upload(data, limits)
            try:
                return call(data)
            except DataError as e:
                if data is not None and e.path == "image":  # the backend's decoder refused what PIL's check passed
                    raise ApiError(415, "bad_image", "the upload is not a readable image") from None
                raise
            finally:
                if data is not None:
                    release_memory()
        return job

    async def do_like(text: str | None, like: int | None, image: UploadFile | None, k: int, candidates: int | None,
                      min_score: float | None, text_weight: float | None, filters: dict | None = None) -> dict:
        """Search by photo: an indexed id (``like``) or an uploaded image, optionally with a text, among the
        photos the filters keep."""
        if (image is None) == (like is None):
            raise ApiError(400, "bad_request", "send exactly one of an 'image' file or an indexed id 'like'")
        where = where_of(filters)
        text = None if text is None or not text.strip() else check_text(text)  # an empty form field: no text
        if candidates is None:
            candidates = max(k, min(100, limits.max_candidates))
        check_k(k, candidates)
        for name, value in (("min_score", min_score), ("text_weight", text_weight)):
            if value is not None and not math.isfinite(value):
                raise ApiError(400, f"bad_{name}", f"{name} is {value}; it must be a finite number")
        if text_weight is not None and not 0 <= text_weight <= 1:
            raise ApiError(400, "bad_text_weight", f"text_weight is {text_weight}; it must be between 0 and 1")
        if text_weight is not None and text is None:
            raise ApiError(400, "bad_text_weight", "text_weight weighs a text against the photo: send a text too")
        if like is not None:
            check_id(like)
        elif (getattr(image, "size", None) or 0) > limits.max_upload_bytes:
            raise ApiError(413, "upload_too_large", f"the upload is larger than {limits.max_upload_bytes} bytes")

        def like_search(data):
            if where is None:
                return backend.search_like(data, like, k, candidates, text, text_weight)
            return backend.search_like(data, like, k, candidates, text, text_weight, where)

        t0 = time.perf_counter()
        results, waited = await run_model(upload_job(image, like_search))
        total = time.perf_counter() - t0
        if min_score is not None:
            results = [r for r in results if r["score"] >= min_score]
        return {"text": text, "like": like, "k": k, "candidates": candidates,
                "results": [{**r, "path": printable(str(r["path"]))} for r in results],
                "timings": {"queue_ms": waited * 1e3, "search_ms": (total - waited) * 1e3, "total_ms": total * 1e3},
                "message": NO_MATCH if where is not None and not results else None}

    @app.post(LIKE_ROUTE, response_model=SearchResponse, responses=ERRORS, tags=["search"])
    async def search_like(image: Annotated[UploadFile | None, File(description="a photo (JPEG, PNG, HEIC, ...)")] = None,
                          like: Annotated[int | None, Form(description="or: an indexed image id")] = None,
                          text: Annotated[str | None, Form(description="optional: a sentence the photos should "
                                                                       "also match")] = None,
                          k: Annotated[int, Form()] = 10, candidates: Annotated[int | None, Form()] = None,
                          min_score: Annotated[float | None, Form()] = None,
                          text_weight: Annotated[float | None, Form(description="with a text: its share, 0..1 "
                                                                                "(default 0.5)")] = None,
                          after: Annotated[str | None, Form(description=FILTER_HELP["after"])] = None,
                          before: Annotated[str | None, Form(description=FILTER_HELP["before"])] = None,
                          camera: Annotated[str | None, Form(description=FILTER_HELP["camera"])] = None,
                          under: Annotated[str | None, Form(description=FILTER_HELP["under"])] = None,
                          near: Annotated[str | None, Form(description=FILTER_HELP["near"])] = None):
        """Search by photo (multipart form): the indexed photos most like an uploaded ``image`` or the indexed
        photo ``like``, by the model's image-image similarity; with ``text``, ranked by both (each score
        standardised over the candidates, weighted by ``text_weight``); the filters as for ``POST /search``.
        ``POST /search`` with a multipart body is served here."""
        filters = {"after": after, "before": before, "camera": camera, "under": under, "near": near}
        return await do_like(text, like, image, k, candidates, min_score, text_weight, filters)

    @app.post("/search/image", response_model=ImageSearchResponse, responses=ERRORS, tags=["search"])
    async def search_image(image: Annotated[UploadFile | None, File(description="an image (JPEG, PNG, HEIC, ...)")] = None,
                           id: Annotated[int | None, Form(description="or: an indexed image id")] = None,  # noqa: A002
                           k: Annotated[int, Form()] = 10):
        """Captions of the index's caption collection nearest to an uploaded image or an indexed one."""
        if not backend.n_captions:
            raise ApiError(400, "no_captions", "this index has no caption collection (build it with --captions)")
        if (image is None) == (id is None):
            raise ApiError(400, "bad_request", "send exactly one of an 'image' file or an indexed 'id'")
        check_k(k)
        if image is None:
            check_id(id)
        elif (getattr(image, "size", None) or 0) > limits.max_upload_bytes:
            raise ApiError(413, "upload_too_large", f"the upload is larger than {limits.max_upload_bytes} bytes")

        t0 = time.perf_counter()
        results, waited = await run_model(upload_job(image, lambda data: backend.search_image(data, id, k)))
        total = time.perf_counter() - t0
        results = [{**r, "text": printable(str(r["text"]))} for r in results]
        return {"k": k, "results": results,
                "timings": {"queue_ms": waited * 1e3, "search_ms": (total - waited) * 1e3, "total_ms": total * 1e3}}

    # --- files ------------------------------------------------------------------------------------
    def file_identity(path: Path):
        try:
            st = path.stat()
        except OSError:
            raise ApiError(404, "file_missing", "the indexed file is no longer on disk (update the index)") from None
        return st, f'"{st.st_ino:x}-{st.st_mtime_ns:x}-{st.st_size:x}"'

    def not_modified(request: Request, etag: str) -> Response | None:
        if etag in {t.strip() for t in request.headers.get("if-none-match", "").split(",")}:
            return Response(status_code=304, headers={"ETag": etag, "Cache-Control": FILE_CACHE})
        return None

    async def image_format(path: Path, id: int) -> str:  # noqa: A002
        """The image type of the indexed file (its first bytes): 404 file_missing when it cannot be read,
        415 not_an_image when it is not an image (deleted, overwritten, replaced since it was indexed)."""
        def head() -> bytes:
            with open(path, "rb") as f:
                return f.read(16)

        try:
            fmt = sniff(await run_in_threadpool(head), path)
        except OSError:
            raise ApiError(404, "file_missing", "the indexed file cannot be read (update the index)") from None
        if fmt is None:
            raise ApiError(415, "not_an_image", f"the indexed file of id {id} is not an image type the service serves")
        return fmt

    async def indexed_image(id: int) -> Path:  # noqa: A002
        """The file of ``id`` checked as ``/images`` checks it, before a model works on it."""
        path = check_id(id)
        file_identity(path)
        await image_format(path, id)
        return path

    def explain_job(fn, id: int, text: str, method):  # noqa: A002
        """``fn(id, text, method)`` on a worker; a file that changed under it since the check: as /images."""
        def job():
            try:
                return fn(id, text, method)
            except DataError as e:
                if str(getattr(e, "path", "")) == str(backend.path_of(id)):
                    raise ApiError(415, "bad_image", f"the indexed file of id {id} cannot be decoded") from None
                raise
        return job

    @app.get("/images/{id}", responses={200: {"content": {"image/jpeg": {}}}, **ERRORS}, tags=["files"])
    async def image(id: int, request: Request):  # noqa: A002
        """The indexed image file of ``id`` (its path comes from the index's table, never from the request)."""
        path = check_id(id)
        st, etag = file_identity(path)
        if (r := not_modified(request, etag)) is not None:
            return r
        fmt = await image_format(path, id)
        headers = {"ETag": etag, "Cache-Control": FILE_CACHE}
        if fmt in BROWSER_FORMATS:  # as it is: browsers apply a JPEG's EXIF orientation themselves
            # streamed from disk in chunks: a large file is never held in memory whole
            return FileResponse(path, media_type=IMAGE_TYPES[fmt], headers=headers)
        key = (id, str(path), st.st_ino, st.st_mtime_ns, st.st_size)
        data = views.lookup(key)
        if data is None:
            async with decoding:  # HEIC, TIFF, AVIF, RAW: an upright JPEG (at most `workers` decoded at once)
                data = views.keep(key, await run_in_threadpool(as_jpeg, path, id, limits.max_decode_pixels))
        return Response(data, media_type="image/jpeg", headers=headers)

    @app.get("/thumbs/{id}", responses={200: {"content": {"image/jpeg": {}}}, **ERRORS}, tags=["files"])
    async def thumb(id: int, request: Request):  # noqa: A002
        """A JPEG thumbnail (at most thumb_size pixels a side) of the indexed image ``id``."""
        path = check_id(id)
        st, etag = file_identity(path)
        etag = etag[:-1] + f'-t{limits.thumb_size}"'
        if (r := not_modified(request, etag)) is not None:
            return r
        key = (id, str(path), st.st_ino, st.st_mtime_ns, st.st_size)
        data = thumbs.lookup(key)
        if data is None:
            async with decoding:  # at most `workers` thumbnails are decoded at once
                try:
                    data = await run_in_threadpool(thumbs.make, path, key, limits.max_decode_pixels)
                except ApiError:
                    raise
                except Exception:  # PIL raises many types for broken files; its words are not ours
                    raise ApiError(415, "bad_image", f"the indexed file of id {id} cannot be decoded") from None
        return Response(data, media_type="image/jpeg", headers={"ETag": etag, "Cache-Control": FILE_CACHE})

    # --- explain ----------------------------------------------------------------------------------
    @app.get("/explain/{id}.png", responses={200: {"content": {"image/png": {}}}, **ERRORS}, tags=["explain"])
    async def explain_png(id: int, text: str = Query(..., description="the sentence"),  # noqa: A002
                          method: Annotated[Method | None, Query(description=METHOD_HELP)] = None):
        """The heat-map PNG of the ``explain`` command: one overlay per word on one shared colour scale."""
        text = check_text(text)
        await indexed_image(id)  # deleted, overwritten, not an image: answered as /images answers
        png, _ = await run_model(explain_job(backend.explain_png, id, text, method))
        return Response(png, media_type="image/png", headers={"Cache-Control": "public, max-age=3600"})

    @app.get("/explain/{id}", response_model=ExplainResponse, responses=ERRORS, tags=["explain"])
    async def explain(id: int, text: str = Query(..., description="the sentence"),  # noqa: A002
                      method: Annotated[Method | None, Query(description=METHOD_HELP)] = None):
        """Per-word heat maps of the model for (image ``id``, ``text``), made by ``method``."""
        text = check_text(text)
        await indexed_image(id)  # deleted, overwritten, not an image: answered as /images answers
        out, _ = await run_model(explain_job(backend.explain, id, text, method))
        shown = [w for word, w in zip(out["words"], out["weights"], strict=True) if not SPECIAL.match(word)]
        vmax = max((max(w) for w in shown or out["weights"] if len(w)), default=0.0)
        content = [is_content(word) for word in out["words"]]
        return {"id": id, "text": text, "vmax": float(vmax), "grid": None, "boxes": None, "score": None,
                "content": content, **out}

    # --- health and page --------------------------------------------------------------------------
    @app.get("/health", response_model=Health, tags=["service"])
    async def health():
        """Model, index size, caption count, version and the worker pool's state."""
        return {"status": "ok", "model": backend.model_name, "index_size": backend.size, "captions": backend.n_captions,
                "index_version": getattr(backend, "version", None), "version": __version__, "workers": pool.workers,
                "queue": pool.queue, "in_flight": pool.in_flight}

    page = files("vlmatch.search").joinpath("static/index.html").read_text(encoding="utf-8")

    @app.get("/", response_class=HTMLResponse, include_in_schema=False)
    async def index_page():
        return HTMLResponse(page, headers={"Cache-Control": "no-cache"})

    return app
