"""The HTTP API and web page over a search index (FastAPI).

``create_app(backend, limits)`` builds the app; ``vlmatch serve INDEX`` runs it with uvicorn. Every
error is JSON ``{"error": code, "detail": message}`` with a 4xx/5xx status. Model work (searches,
explanations) runs on a fixed pool of worker threads with a bounded queue: a full queue answers 503
with ``Retry-After`` rather than piling requests up. Files are served only by id, from the paths in
the index's own table; nothing in a request is ever used as a path.

What a client can get wrong is answered 4xx in our own words; a failure of the server itself is a
500 whose detail says only that (the traceback goes to the server log, logger ``vlmatch.search``),
never an exception's text. Bodies are capped before they are read (:class:`.middleware.BodyLimit`) and
uploaded images are decoded only on the model workers, after the request found a free place.
"""

import asyncio
import logging
import math
import os
import re
import time
from contextlib import asynccontextmanager
from functools import partial
from importlib.resources import files
from pathlib import Path
from typing import Annotated
from urllib.parse import unquote_to_bytes

from fastapi import Depends, FastAPI, File, Form, Query, Request, UploadFile
from fastapi.concurrency import run_in_threadpool
from fastapi.exceptions import RequestValidationError
from fastapi.responses import FileResponse, HTMLResponse, JSONResponse, Response
from starlette.exceptions import HTTPException as StarletteHTTPException
from starlette.routing import Match

from ...errors import ConfigError, DataError, VlmatchError
from ...features.photo import PhotoTooLarge, sniff
from ...io import printable
from ...version import __version__
from ...viz.words import is_content
from ..backends.milvus.client import RETRY_AFTER_S, Refused, Unavailable
from ..filters import Where
from ..hits import shows_text
from ..library.unchanged import PhotoChanged, PhotoMissing, kind_of
from ..open_vocab import no_match_line
from .errors import ApiError
from .middleware import LIKE_ROUTE, BodyLimit, MultipartSearch
from .schema import (
    ERRORS,
    FILTER_HELP,
    METHOD_HELP,
    NO_MATCH,
    ExplainResponse,
    Health,
    ImageSearchResponse,
    Method,
    SearchRequest,
    SearchResponse,
)
from .service import Busy, Limits, ModelPool, SearchBackend
from .thumbnails import BROWSER_FORMATS, ThumbCache, as_jpeg
from .uploads import IMAGE_TYPES, check_upload, release_memory

log = logging.getLogger("vlmatch.search")
INTERNAL = "the server failed to answer this request; the details are in the server's log"
SPECIAL = re.compile(r"^(<.*>|\[CLS\]|\[SEP\])$")  # <start>, <end>, [CLS], [SEP]: tokens the page does not show
# an id may name another file once the server follows a rebuild: clients revalidate (a 304 is cheap)
FILE_CACHE = "public, max-age=0, must-revalidate"


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



async def utf8_query(request: Request) -> None:
    """Refuse (400 bad_text) a query string whose values are not UTF-8 (see :func:`query_bytes_problem`)."""
    problem = query_bytes_problem(request.scope.get("query_string") or b"")
    if problem is not None:
        raise ApiError(400, "bad_text", problem)


def not_json(request: Request, errors) -> str | None:
    """How a JSON route's body was sent ("as text/plain", "without a content type") when that is not JSON and
    is why the body was refused (FastAPI then hands the model the raw bytes: "Input should be a valid
    dictionary"); else None."""
    kind = (request.headers.get("content-type") or "").split(";", 1)[0].strip().lower()
    if kind == "application/json" or (kind.startswith("application/") and kind.endswith("+json")):
        return None
    if not any(tuple(err.get("loc", ())) == ("body",) for err in errors):
        return None
    return f"as {printable(kind, controls=True)}" if kind else "without a content type"


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
        if (sent := not_json(request, e.errors())) is not None:
            return JSONResponse({"error": "unsupported_media_type", "detail": words(
                f"the body is sent {sent}; "
                f"{request.method} {request.url.path} takes a JSON object "
                "(content-type: application/json)")}, status_code=415)
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
        if not shows_text(text):  # "", spaces (NBSP too), zero-width characters only
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

    def check_file(image_id: int) -> Path:
        """:func:`check_id`, and the file checked against what its row recorded before anything reads it
        (``backend.file_of``): 404 file_missing when gone, 409 photo_changed when it changed since indexing
        or is no regular file (a FIFO: refused by its stat, never opened)."""
        file_of = getattr(backend, "file_of", None)
        if file_of is None:
            return check_id(image_id)
        try:
            path = file_of(image_id) if image_id >= 0 else None
        except PhotoMissing:
            raise ApiError(404, "file_missing", "the indexed file is no longer on disk (update the index)") from None
        except PhotoChanged as e:
            raise changed(image_id, e.problem) from None
        if path is None:
            raise ApiError(404, "unknown_id", f"no image with id {image_id} in the index")
        return path

    def changed(image_id: int, problem: str) -> ApiError:
        return ApiError(409, "photo_changed", f"the indexed file of id {image_id} {problem}")

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
                "relevance_note": getattr(backend, "relevance_note", None),
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
            check_file(id)  # the photo is read again
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
        def head() -> bytes | str:
            # opened without waiting: a FIFO put in its place since the check does not hold the thread
            fd = os.open(path, os.O_RDONLY | getattr(os, "O_NONBLOCK", 0))
            try:
                kind = kind_of(os.fstat(fd).st_mode)
                return f"is {kind} now, not the photo indexed; run vlmatch index update" if kind else os.read(fd, 16)
            finally:
                os.close(fd)

        try:
            head_or_kind = await run_in_threadpool(head)
        except OSError:
            raise ApiError(404, "file_missing", "the indexed file cannot be read (update the index)") from None
        if isinstance(head_or_kind, str):
            raise changed(id, head_or_kind)
        fmt = sniff(head_or_kind, path)
        if fmt is None:
            raise ApiError(415, "not_an_image", f"the indexed file of id {id} is not an image type the service serves")
        return fmt

    async def indexed_image(id: int) -> Path:  # noqa: A002
        """The file of ``id`` checked as ``/images`` checks it, before a model works on it."""
        path = check_file(id)
        file_identity(path)
        await image_format(path, id)
        return path

    def explain_job(fn, id: int, text: str, method):  # noqa: A002
        """``fn(id, text, method)`` on a worker; a file that changed under it since the check: as /images."""
        def job():
            try:
                return fn(id, text, method)
            except PhotoMissing:
                raise ApiError(404, "file_missing", "the indexed file is no longer on disk (update the index)") from None
            except PhotoChanged as e:  # changed after the route's check
                raise changed(id, e.problem) from None
            except PhotoTooLarge as e:  # answered as /thumbs answers it
                raise ApiError(415, "image_too_large", f"the indexed file of id {id} {e.problem}") from None
            except DataError as e:
                if str(getattr(e, "path", "")) == str(backend.path_of(id)):
                    raise ApiError(415, "bad_image", f"the indexed file of id {id} cannot be decoded") from None
                raise
        return job

    @app.get("/images/{id}", responses={200: {"content": {"image/jpeg": {}}}, **ERRORS}, tags=["files"])
    async def image(id: int, request: Request):  # noqa: A002
        """The indexed image file of ``id`` (its path comes from the index's table, never from the request)."""
        path = check_file(id)
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
        path = check_file(id)
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
                          method: Annotated[Method | None, Query(description=METHOD_HELP)] = None,
                          shared_scale: bool = Query(False, description="every word on one colour scale")):
        """The heat-map PNG of the ``explain`` command: one overlay per word, each on its own colour scale (its
        cells' shares of its part), or with ``shared_scale`` on one."""
        text = check_text(text)
        await indexed_image(id)  # deleted, overwritten, not an image: answered as /images answers
        draw = partial(backend.explain_png, shared_scale=True) if shared_scale else backend.explain_png
        png, _ = await run_model(explain_job(draw, id, text, method))
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

    page = files("vlmatch.search.service").joinpath("static/index.html").read_text(encoding="utf-8")

    @app.get("/", response_class=HTMLResponse, include_in_schema=False)
    async def index_page():
        return HTMLResponse(page, headers={"Cache-Control": "no-cache"})

    return app
