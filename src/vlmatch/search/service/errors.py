"""Every error the service answers, in one shape: JSON ``{"error": code, "detail": message}`` with a 4xx/5xx status.
A failure of the server itself is a 500 that says only that (the traceback goes to the log); messages name the
index, never its folder (:func:`index_words`)."""

import logging
import re
from contextlib import contextmanager
from pathlib import Path

from fastapi import Request
from fastapi.exceptions import RequestValidationError
from fastapi.responses import JSONResponse
from starlette.exceptions import HTTPException as StarletteHTTPException
from starlette.routing import Match

from ...errors import DataError, VlmatchError
from ...io import printable
from ..backends.milvus.client import RETRY_AFTER_S, Refused, Unavailable
from ..library.unchanged import PhotoChanged, PhotoMissing

log = logging.getLogger("vlmatch.search")
INTERNAL = "the server failed to answer this request; the details are in the server's log"


class ApiError(Exception):
    def __init__(self, status: int, code: str, detail: str, headers: dict | None = None):
        self.status, self.code, self.detail, self.headers = status, code, detail, headers


def file_missing() -> ApiError:
    return ApiError(404, "file_missing", "the indexed file is no longer on disk (update the index)")


def changed(image_id: int, problem: str) -> ApiError:
    return ApiError(409, "photo_changed", f"the indexed file of id {image_id} {problem}")


@contextmanager
def photo_errors(image_id: int):
    """A photo found gone or changed since it was indexed, answered 404 file_missing or 409 photo_changed."""
    try:
        yield
    except PhotoMissing:
        raise file_missing() from None
    except PhotoChanged as e:
        raise changed(image_id, e.problem) from None


def index_words(backend):
    """``words(message)``: a message as the client may see it: UTF-8, "the index" for the index's folder or URI."""
    root = getattr(backend, "root", None)
    names = set() if root is None else ({str(root), root.uri} if hasattr(root, "uri") else
                                        {str(Path(root)), str(Path(root).resolve())})
    folder = None if not names else re.compile(
        "|".join(rf"(?<![\w./-]){re.escape(r)}(?=[/:\s;,)]|$)" for r in sorted(names, key=len, reverse=True) if r))
    return lambda message: printable(message if folder is None else folder.sub("the index", message))


def error_answers(backend, routes: list) -> dict:
    """The app's exception handlers, by exception type: every error in the one JSON shape. ``routes``: every
    route of the app (a 405 names the methods of those that answer its path)."""
    words = index_words(backend)

    def answer(status: int, code: str, detail: str, headers: dict | None = None) -> JSONResponse:
        return JSONResponse({"error": code, "detail": words(detail)}, status_code=status, headers=headers)

    async def internal(request: Request, e: BaseException) -> JSONResponse:  # never the exception's text
        log.error("internal error (%s %s)", request.method, request.url.path, exc_info=(type(e), e, e.__traceback__))
        return JSONResponse({"error": "internal_error", "detail": INTERNAL}, status_code=500)

    async def http_error(request: Request, e: StarletteHTTPException):
        code = {404: "not_found", 405: "method_not_allowed", 413: "body_too_large"}.get(e.status_code, "http_error")
        headers = dict(getattr(e, "headers", None) or {})
        if e.status_code == 400 and "json" in request.headers.get("content-type", "") and not await _utf8_body(request):
            # FastAPI's words for a JSON body that is not UTF-8: the same rule as a query string's bytes
            return answer(400, "bad_text", "the JSON body is not UTF-8 text: send it encoded as UTF-8")
        if e.status_code == 405:  # every method some route of this path answers (RFC 9110: a 405 names them)
            headers["Allow"] = _allowed_methods(routes, request)
        return answer(e.status_code, code, str(e.detail), headers or None)

    async def validation_error(request: Request, e: RequestValidationError):
        if (sent := not_json(request, e.errors())) is not None:
            return answer(415, "unsupported_media_type", f"the body is sent {sent}; {request.method} {request.url.path} "
                                                         "takes a JSON object (content-type: application/json)")
        parts = []
        for err in e.errors():
            where = ".".join(str(x) for x in err.get("loc", ()) if x not in ("body", "query", "path"))
            parts.append(f"{where or 'request'}: {err.get('msg')}")
        return answer(422, "invalid_request", "; ".join(parts))

    async def vlmatch_error(request: Request, e: VlmatchError):
        if isinstance(e, DataError):  # a file of the index itself is unreadable: not the client's doing
            return await internal(request, e)
        return answer(400, "bad_request", str(e))

    async def api_error(request, e: ApiError):
        return answer(e.status, e.code, e.detail, e.headers)

    async def unavailable(request, e):  # the Milvus server is away: the index stays open, answers resume
        return answer(503, "index_unavailable", str(e), {"Retry-After": str(RETRY_AFTER_S)})

    async def refused(request, e):  # the Milvus server answered and refused: its words, not a retry's matter
        return answer(502, "index_refused", str(e))

    return {ApiError: api_error, StarletteHTTPException: http_error, RequestValidationError: validation_error,
            Unavailable: unavailable, Refused: refused, VlmatchError: vlmatch_error, Exception: internal}


async def _utf8_body(request: Request) -> bool:
    """The request's body is UTF-8 (or could not be read again: a body cut off at its cap)."""
    try:
        (await request.body()).decode("utf-8")
    except UnicodeDecodeError:
        return False
    except Exception:  # noqa: BLE001 -- ClientDisconnect and the like: not ours to judge
        return True
    return True


def _allowed_methods(routes: list, request: Request) -> str:
    methods = set()
    for route in routes:  # PARTIAL: the path is the route's, the method is not
        if route.matches(request.scope)[0] != Match.NONE and getattr(route, "methods", None):
            methods |= set(route.methods)
    return ", ".join(sorted(methods))


def not_json(request: Request, errors) -> str | None:
    """How a JSON route's body was sent ("as text/plain", "without a content type") when that is not JSON and
    is why the body was refused; else None."""
    kind = (request.headers.get("content-type") or "").split(";", 1)[0].strip().lower()
    if kind == "application/json" or (kind.startswith("application/") and kind.endswith("+json")):
        return None
    if not any(tuple(err.get("loc", ())) == ("body",) for err in errors):
        return None
    return f"as {printable(kind, controls=True)}" if kind else "without a content type"
