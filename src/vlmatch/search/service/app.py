"""The HTTP API and web page over a search index: :func:`create_app`; ``vlmatch serve INDEX`` runs it with uvicorn.
Model work runs on a bounded pool (a full queue answers 503); bodies are capped before they are read."""

from contextlib import asynccontextmanager

from fastapi import Depends, FastAPI

from ...version import __version__
from . import explain, health, page, photos, search
from .context import Context, utf8_query
from .errors import error_answers
from .middleware import LIKE_ROUTE, BodyLimit, MultipartSearch
from .service import Limits, SearchBackend


def create_app(backend: SearchBackend, limits: Limits | None = None) -> FastAPI:
    ctx = Context(backend, limits or Limits())
    limits = ctx.limits

    @asynccontextmanager
    async def lifespan(app):
        yield
        ctx.pool.shutdown()
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
    app.state.context = ctx
    app.state.pool, app.state.limits, app.state.backend = ctx.pool, limits, backend

    def upload_route(scope) -> bool:
        return scope.get("path") in ("/search/image", LIKE_ROUTE) and scope.get("method") == "POST"

    app.add_middleware(BodyLimit, cap=lambda scope: limits.max_body_bytes +
                       (limits.max_upload_bytes if upload_route(scope) else 0))
    app.add_middleware(MultipartSearch)  # outermost: POST /search with a form goes to /search/like first
    routers = [part.router for part in (search, photos, explain, health, page)]
    for router in routers:
        app.include_router(router)
    # the routes as declared: FastAPI may keep an included router's routes inside one entry of app.routes
    routes = [*app.routes, *(route for router in routers for route in router.routes)]
    for kind, answer in error_answers(backend, routes).items():
        app.add_exception_handler(kind, answer)
    return app
