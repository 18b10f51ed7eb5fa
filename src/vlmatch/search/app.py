"""The HTTP API and web page over a search index (FastAPI).

``create_app(backend, limits)`` builds the app; ``vlmatch serve INDEX`` runs it with uvicorn. Every
error is JSON ``{"error": code, "detail": message}`` with a 4xx/5xx status. Model work (searches,
explanations) runs on a fixed pool of worker threads with a bounded queue: a full queue answers 503
with ``Retry-After`` rather than piling requests up. Files are served only by id, from the paths in
the index's own table; nothing in a request is ever used as a path.
"""

from __future__ import annotations

import io
import re
import threading
import time
from collections import OrderedDict
from contextlib import asynccontextmanager
from importlib.resources import files
from pathlib import Path
from typing import Annotated

from fastapi import FastAPI, File, Form, Query, Request, UploadFile
from fastapi.concurrency import run_in_threadpool
from fastapi.exceptions import RequestValidationError
from fastapi.responses import HTMLResponse, JSONResponse, Response
from pydantic import BaseModel, Field
from starlette.exceptions import HTTPException as StarletteHTTPException

from .. import __version__
from ..errors import VlmatchError
from .service import Busy, Limits, ModelPool, SearchBackend

IMAGE_TYPES = {  # magic bytes -> content type; what the service serves and accepts
    b"\xff\xd8\xff": "image/jpeg",
    b"\x89PNG\r\n\x1a\n": "image/png",
    b"GIF87a": "image/gif",
    b"GIF89a": "image/gif",
    b"BM": "image/bmp",
}
SPECIAL = re.compile(r"^<.*>$")  # <start>, <end>: encoded tokens the page does not show as words
FILE_CACHE = "public, max-age=86400"  # indexed files change only when the index is rebuilt or updated


class ApiError(Exception):
    def __init__(self, status: int, code: str, detail: str, headers: dict | None = None):
        self.status, self.code, self.detail, self.headers = status, code, detail, headers


def sniff_type(head: bytes) -> str | None:
    """The image content type from a file's first bytes (None: not an image type we serve)."""
    for magic, ctype in IMAGE_TYPES.items():
        if head.startswith(magic):
            return ctype
    if head[:4] == b"RIFF" and head[8:12] == b"WEBP":
        return "image/webp"
    return None


def check_upload(data: bytes, limits: Limits) -> None:
    """Reject anything but a decodable image of sane size; the message says what is wrong."""
    if not data:
        raise ApiError(400, "empty_upload", "the uploaded file is empty")
    if len(data) > limits.max_upload_bytes:
        raise ApiError(413, "upload_too_large", f"the upload is larger than {limits.max_upload_bytes} bytes")
    if sniff_type(data[:16]) is None:
        raise ApiError(415, "not_an_image", "the upload is not a JPEG, PNG, GIF, BMP or WebP image")
    from PIL import Image

    try:
        with Image.open(io.BytesIO(data)) as im:
            w, h = im.size
            if w * h > limits.max_upload_pixels:
                raise ApiError(413, "image_too_large", f"the image has {w}x{h} pixels; the limit is "
                                                      f"{limits.max_upload_pixels} pixels")
            im.load()  # decode it all: a truncated or corrupt body fails here, not in a worker
    except ApiError:
        raise
    except Exception as e:  # PIL raises many types for broken files
        raise ApiError(415, "bad_image", f"the upload is not a readable image: {e}") from None


# --- request / response models (they document the OpenAPI schema) -----------------------------
class SearchRequest(BaseModel):
    text: str = Field(..., description="the query sentence", examples=["a dog runs on the beach"])
    k: int = Field(10, description="results to return (1 .. max_k)")
    candidates: int | None = Field(None, description="stage-1 candidates re-scored by the model (k .. max_candidates; "
                                                     "default 100, or k if larger, within the cap)")
    min_score: float | None = Field(None, description="drop results whose (stage-2) score is below this")


class SearchResult(BaseModel):
    id: int
    path: str
    score: float = Field(..., description="the model's own (stage-2) score; results are ranked by it")
    stage1_score: float | None = Field(None, description="the stage-1 (global vector) score that chose the candidate")


class SearchResponse(BaseModel):
    text: str
    k: int
    candidates: int
    results: list[SearchResult]
    timings: dict[str, float] = Field(..., description="milliseconds: queue (waiting for a worker), search, total")


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
    score: float | None
    words: list[str]
    weights: list[list[float]] = Field(..., description="one list per word: its weight on each image position")
    axis: str = Field(..., description='"regions": each word\'s weights sum to 1; "words": each region\'s do')
    grid: list[int] | None = Field(None, description="[rows, cols] when positions are a grid (row-major)")
    boxes: list[list[float]] | None = Field(None, description="[x0, y0, x1, y1] per position, as fractions of the image")
    vmax: float = Field(..., description="the top of the one colour scale shared by all words")


class Health(BaseModel):
    status: str
    model: str
    index_size: int
    captions: int
    version: str
    workers: int
    queue: int
    in_flight: int


class ErrorBody(BaseModel):
    error: str
    detail: str


ERRORS = {s: {"model": ErrorBody} for s in (400, 404, 413, 415, 422, 503)}


class ThumbCache:
    """Thumbnails (JPEG bytes) of recently asked ids, keyed by the file's identity."""

    def __init__(self, size: int, capacity: int):
        self.size, self.capacity = size, capacity
        self._items: OrderedDict = OrderedDict()
        self._lock = threading.Lock()

    def get(self, path: Path, key) -> bytes:
        with self._lock:
            if key in self._items:
                self._items.move_to_end(key)
                return self._items[key]
        from PIL import Image

        with Image.open(path) as im:
            im = im.convert("RGB")
            im.thumbnail((self.size, self.size))
            buf = io.BytesIO()
            im.save(buf, "JPEG", quality=82)
        data = buf.getvalue()
        with self._lock:
            self._items[key] = data
            while len(self._items) > self.capacity:
                self._items.popitem(last=False)
        return data


def create_app(backend: SearchBackend, limits: Limits | None = None) -> FastAPI:
    limits = limits or Limits()
    pool = ModelPool(limits.workers, limits.queue)
    thumbs = ThumbCache(limits.thumb_size, limits.thumb_cache)

    @asynccontextmanager
    async def lifespan(app):
        yield
        pool.shutdown()

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
    )
    app.state.pool, app.state.limits, app.state.backend = pool, limits, backend

    # --- errors: one JSON shape for everything ------------------------------------------------
    @app.exception_handler(ApiError)
    async def _api_error(request, e: ApiError):
        return JSONResponse({"error": e.code, "detail": e.detail}, status_code=e.status, headers=e.headers)

    @app.exception_handler(StarletteHTTPException)
    async def _http_error(request, e):
        code = {404: "not_found", 405: "method_not_allowed"}.get(e.status_code, "http_error")
        return JSONResponse({"error": code, "detail": str(e.detail)}, status_code=e.status_code)

    @app.exception_handler(RequestValidationError)
    async def _validation_error(request, e):
        parts = []
        for err in e.errors():
            where = ".".join(str(x) for x in err.get("loc", ()) if x not in ("body", "query", "path"))
            parts.append(f"{where or 'request'}: {err.get('msg')}")
        return JSONResponse({"error": "invalid_request", "detail": "; ".join(parts)}, status_code=422)

    @app.exception_handler(VlmatchError)
    async def _vlmatch_error(request, e):
        return JSONResponse({"error": "bad_request", "detail": str(e)}, status_code=400)

    @app.exception_handler(Exception)
    async def _internal_error(request, e):  # still JSON; the traceback goes to the server log
        return JSONResponse({"error": "internal_error", "detail": f"{type(e).__name__}: {e}"}, status_code=500)

    async def run_model(fn, *args):
        try:
            return await pool.run(fn, *args)
        except Busy:
            raise ApiError(503, "busy", f"all {pool.workers} workers are busy and {pool.queue} requests are waiting; "
                                        "retry shortly", {"Retry-After": "1"}) from None

    def check_text(text: str, name: str = "text") -> str:
        text = text.strip()
        if not text:
            raise ApiError(400, "empty_text", f"{name} is empty")
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
    async def do_search(text: str, k: int, candidates: int | None, min_score: float | None) -> dict:
        text = check_text(text)
        if candidates is None:
            candidates = max(k, min(100, limits.max_candidates))
        check_k(k, candidates)
        t0 = time.perf_counter()
        results, waited = await run_model(backend.search, text, k, candidates)
        total = time.perf_counter() - t0
        if min_score is not None:
            results = [r for r in results if r["score"] >= min_score]
        return {"text": text, "k": k, "candidates": candidates,
                "results": [{**r, "path": str(r["path"])} for r in results],
                "timings": {"queue_ms": waited * 1e3, "search_ms": (total - waited) * 1e3, "total_ms": total * 1e3}}

    @app.post("/search", response_model=SearchResponse, responses=ERRORS, tags=["search"])
    async def search(req: SearchRequest):
        """Images ranked by the model's score for a sentence (two-stage search)."""
        return await do_search(req.text, req.k, req.candidates, req.min_score)

    @app.get("/search", response_model=SearchResponse, responses=ERRORS, tags=["search"])
    async def search_get(q: str = Query(..., description="the query sentence"), k: int = 10, candidates: int | None = None,
                         min_score: float | None = None):
        """The same as ``POST /search``, for links: ``/search?q=a+dog+on+the+beach&k=20``."""
        return await do_search(q, k, candidates, min_score)

    @app.post("/search/image", response_model=ImageSearchResponse, responses=ERRORS, tags=["search"])
    async def search_image(image: Annotated[UploadFile | None, File(description="a JPEG/PNG/GIF/BMP/WebP image")] = None,
                           id: Annotated[int | None, Form(description="or: an indexed image id")] = None,  # noqa: A002
                           k: Annotated[int, Form()] = 10):
        """Captions of the index's caption collection nearest to an uploaded image or an indexed one."""
        if not backend.n_captions:
            raise ApiError(400, "no_captions", "this index has no caption collection (build it with --captions)")
        if (image is None) == (id is None):
            raise ApiError(400, "bad_request", "send exactly one of an 'image' file or an indexed 'id'")
        check_k(k)
        data = None
        if image is not None:
            data = await image.read(limits.max_upload_bytes + 1)
            await run_in_threadpool(check_upload, data, limits)
        else:
            check_id(id)
        t0 = time.perf_counter()
        results, waited = await run_model(backend.search_image, data, id, k)
        total = time.perf_counter() - t0
        return {"k": k, "results": results,
                "timings": {"queue_ms": waited * 1e3, "search_ms": (total - waited) * 1e3, "total_ms": total * 1e3}}

    # --- files ------------------------------------------------------------------------------------
    def file_identity(path: Path):
        try:
            st = path.stat()
        except OSError:
            raise ApiError(404, "file_missing", "the indexed file is no longer on disk (update the index)") from None
        return st, f'"{st.st_mtime_ns:x}-{st.st_size:x}"'

    def not_modified(request: Request, etag: str) -> Response | None:
        if etag in {t.strip() for t in request.headers.get("if-none-match", "").split(",")}:
            return Response(status_code=304, headers={"ETag": etag, "Cache-Control": FILE_CACHE})
        return None

    @app.get("/images/{id}", responses={200: {"content": {"image/jpeg": {}}}, **ERRORS}, tags=["files"])
    async def image(id: int, request: Request):  # noqa: A002
        """The indexed image file of ``id`` (its path comes from the index's table, never from the request)."""
        path = check_id(id)
        _, etag = file_identity(path)
        if (r := not_modified(request, etag)) is not None:
            return r
        data = await run_in_threadpool(path.read_bytes)
        ctype = sniff_type(data[:16])
        if ctype is None:
            raise ApiError(415, "not_an_image", f"the indexed file of id {id} is not an image type the service serves")
        return Response(data, media_type=ctype, headers={"ETag": etag, "Cache-Control": FILE_CACHE})

    @app.get("/thumbs/{id}", responses={200: {"content": {"image/jpeg": {}}}, **ERRORS}, tags=["files"])
    async def thumb(id: int, request: Request):  # noqa: A002
        """A JPEG thumbnail (at most thumb_size pixels a side) of the indexed image ``id``."""
        path = check_id(id)
        st, etag = file_identity(path)
        etag = etag[:-1] + f'-t{limits.thumb_size}"'
        if (r := not_modified(request, etag)) is not None:
            return r
        try:
            data = await run_in_threadpool(thumbs.get, path, (id, st.st_mtime_ns, st.st_size))
        except OSError as e:
            raise ApiError(415, "bad_image", f"the indexed file of id {id} cannot be decoded: {e}") from None
        return Response(data, media_type="image/jpeg", headers={"ETag": etag, "Cache-Control": FILE_CACHE})

    # --- explain ----------------------------------------------------------------------------------
    @app.get("/explain/{id}.png", responses={200: {"content": {"image/png": {}}}, **ERRORS}, tags=["explain"])
    async def explain_png(id: int, text: str = Query(..., description="the sentence")):  # noqa: A002
        """The heat-map PNG of the ``explain`` command: one overlay per word on one shared colour scale."""
        text = check_text(text)
        check_id(id)
        png, _ = await run_model(backend.explain_png, id, text)
        return Response(png, media_type="image/png", headers={"Cache-Control": "public, max-age=3600"})

    @app.get("/explain/{id}", response_model=ExplainResponse, responses=ERRORS, tags=["explain"])
    async def explain(id: int, text: str = Query(..., description="the sentence")):  # noqa: A002
        """Per-word attention weights of the model for (image ``id``, ``text``)."""
        text = check_text(text)
        check_id(id)
        out, _ = await run_model(backend.explain, id, text)
        shown = [w for word, w in zip(out["words"], out["weights"], strict=True) if not SPECIAL.match(word)]
        vmax = max((max(w) for w in shown or out["weights"] if len(w)), default=0.0)
        return {"id": id, "text": text, "vmax": float(vmax), "grid": None, "boxes": None, "score": None, **out}

    # --- health and page --------------------------------------------------------------------------
    @app.get("/health", response_model=Health, tags=["service"])
    async def health():
        """Model, index size, caption count, version and the worker pool's state."""
        return {"status": "ok", "model": backend.model_name, "index_size": backend.size, "captions": backend.n_captions,
                "version": __version__, "workers": pool.workers, "queue": pool.queue, "in_flight": pool.in_flight}

    page = files("vlmatch.search").joinpath("static/index.html").read_text(encoding="utf-8")

    @app.get("/", response_class=HTMLResponse, include_in_schema=False)
    async def index_page():
        return HTMLResponse(page, headers={"Cache-Control": "no-cache"})

    return app
