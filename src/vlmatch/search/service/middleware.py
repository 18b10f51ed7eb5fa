"""ASGI middleware of the service: request bodies capped before they are read (:class:`BodyLimit`), and
``POST /search`` with an uploaded photo sent on to the search-by-photo route (:class:`MultipartSearch`)."""

from __future__ import annotations

import json

DRAIN_BYTES = 64 * 2**20  # a refused body up to this size is read and dropped (see BodyLimit)
LIKE_ROUTE = "/search/like"  # search by photo's multipart form; POST /search with a form body is served here


class BodyLimit:
    """ASGI middleware: refuse a request body above ``cap(scope)`` (413) before the app reads it: a declared
    ``Content-Length`` at once, a chunked body when its count passes the cap."""

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
    :data:`LIKE_ROUTE`; a JSON body stays with ``POST /search``."""

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

