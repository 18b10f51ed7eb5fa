"""The explain routes: which image positions each word of a text matched in an indexed photo, as per-word
weights (``/explain/{id}``) or the heat-map PNG of the ``explain`` command (``/explain/{id}.png``)."""

import re
from functools import partial
from typing import Annotated

from fastapi import APIRouter, Query
from fastapi.responses import Response

from ...errors import DataError
from ...features.photo import PhotoTooLarge
from ...viz.words import is_content
from .context import Context, Ctx
from .errors import ApiError, photo_errors
from .photos import indexed_image
from .schema import ERRORS, METHOD_HELP, ExplainResponse, Method

router = APIRouter(tags=["explain"])
SPECIAL = re.compile(r"^(<.*>|\[CLS\]|\[SEP\])$")  # <start>, <end>, [CLS], [SEP]: tokens the page does not show


# registered before /explain/{id}, which would take "3.png" for its id
@router.get("/explain/{id}.png", responses={200: {"content": {"image/png": {}}}, **ERRORS})
async def explain_png(ctx: Ctx, id: int, text: str = Query(..., description="the sentence"),  # noqa: A002
                      method: Annotated[Method | None, Query(description=METHOD_HELP)] = None,
                      shared_scale: bool = Query(False, description="every word on one colour scale")):
    """The heat-map PNG of the ``explain`` command: one overlay per word, each on its own colour scale (its
    cells' shares of its part), or with ``shared_scale`` on one."""
    text = ctx.check_text(text)
    await indexed_image(ctx, id)  # deleted, overwritten, not an image: answered as /images answers
    draw = partial(ctx.backend.explain_png, shared_scale=True) if shared_scale else ctx.backend.explain_png
    png, _ = await ctx.run_model(_job(ctx, draw, id, text, method))
    return Response(png, media_type="image/png", headers={"Cache-Control": "public, max-age=3600"})


@router.get("/explain/{id}", response_model=ExplainResponse, responses=ERRORS)
async def explain(ctx: Ctx, id: int, text: str = Query(..., description="the sentence"),  # noqa: A002
                  method: Annotated[Method | None, Query(description=METHOD_HELP)] = None):
    """Per-word heat maps of the model for (image ``id``, ``text``), made by ``method``."""
    text = ctx.check_text(text)
    await indexed_image(ctx, id)  # deleted, overwritten, not an image: answered as /images answers
    out, _ = await ctx.run_model(_job(ctx, ctx.backend.explain, id, text, method))
    shown = [w for word, w in zip(out["words"], out["weights"], strict=True) if not SPECIAL.match(word)]
    vmax = max((max(w) for w in shown or out["weights"] if len(w)), default=0.0)
    content = [is_content(word) for word in out["words"]]
    return {"id": id, "text": text, "vmax": float(vmax), "grid": None, "boxes": None, "score": None,
            "content": content, **out}


def _job(ctx: Context, fn, image_id: int, text: str, method):
    """``fn(image_id, text, method)`` on a worker; a file that changed under it since the route's check
    is answered as ``/images`` answers it."""
    def job():
        try:
            with photo_errors(image_id):  # changed after the route's check
                return fn(image_id, text, method)
        except PhotoTooLarge as e:  # answered as /thumbs answers it
            raise ApiError(415, "image_too_large", f"the indexed file of id {image_id} {e.problem}") from None
        except DataError as e:
            if str(getattr(e, "path", "")) == str(ctx.backend.path_of(image_id)):
                raise ApiError(415, "bad_image", f"the indexed file of id {image_id} cannot be decoded") from None
            raise
    return job
