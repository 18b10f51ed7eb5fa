"""``GET /health``: what is served (model, index size and version, captions) and the model pool's state."""

from fastapi import APIRouter

from ...version import __version__
from .context import Ctx
from .schema import Health

router = APIRouter(tags=["service"])


@router.get("/health", response_model=Health)
async def health(ctx: Ctx):
    """Model, index size, caption count, version and the worker pool's state."""
    backend, pool = ctx.backend, ctx.pool
    return {"status": "ok", "model": backend.model_name, "index_size": backend.size, "captions": backend.n_captions,
            "index_version": getattr(backend, "version", None), "version": __version__, "workers": pool.workers,
            "queue": pool.queue, "in_flight": pool.in_flight}
