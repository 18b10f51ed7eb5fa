"""The search routes: photos by sentence (``POST``/``GET /search``), by photo (``POST /search/like``, and
``POST /search`` with ``like`` or an upload), and captions by image (``POST /search/image``).

An uploaded image is read and checked only on a model worker, after the pool admitted the request."""

from typing import Annotated

from fastapi import APIRouter, File, Form, Query, UploadFile

from ...errors import DataError
from ...io import printable
from ..open_vocab import no_match_line
from .context import Context, Ctx, finite, where_of
from .errors import ApiError
from .middleware import LIKE_ROUTE
from .schema import ERRORS, FILTER_HELP, NO_MATCH, ImageSearchResponse, SearchRequest, SearchResponse
from .uploads import check_upload, release_memory

router = APIRouter(tags=["search"])


@router.post("/search", response_model=SearchResponse, responses=ERRORS)
async def search(req: SearchRequest, ctx: Ctx):
    """Images ranked by the model's score for a sentence (two-stage search); with ``like`` (an indexed id),
    the photos most like that one (and matching the text, if given). A multipart body (an uploaded
    ``image``, or ``like``, with the same fields) is served by ``POST /search/like``."""
    return await by_text_or_photo(ctx, req, "text")


@router.get("/search", response_model=SearchResponse, responses=ERRORS)
async def search_get(ctx: Ctx, *,
                     q: str | None = Query(None, description="the query sentence (required unless like is given)"),
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
    req = SearchRequest.model_construct(text=q, like=like, text_weight=text_weight, k=k, candidates=candidates,
                                        min_score=min_score, after=after, before=before, camera=camera, under=under,
                                        near=near)
    return await by_text_or_photo(ctx, req, "q")


@router.post(LIKE_ROUTE, response_model=SearchResponse, responses=ERRORS)
async def search_like(ctx: Ctx, *,
                      image: Annotated[UploadFile | None, File(description="a photo (JPEG, PNG, HEIC, ...)")] = None,
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
    req = SearchRequest.model_construct(text=text, like=like, text_weight=text_weight, k=k, candidates=candidates,
                                        min_score=min_score, after=after, before=before, camera=camera, under=under,
                                        near=near)
    return await by_photo(ctx, req, image)


@router.post("/search/image", response_model=ImageSearchResponse, responses=ERRORS)
async def search_image(ctx: Ctx,
                       image: Annotated[UploadFile | None, File(description="an image (JPEG, PNG, HEIC, ...)")] = None,
                       id: Annotated[int | None, Form(description="or: an indexed image id")] = None,  # noqa: A002
                       k: Annotated[int, Form()] = 10):
    """Captions of the index's caption collection nearest to an uploaded image or an indexed one."""
    backend = ctx.backend
    if not backend.n_captions:
        raise ApiError(400, "no_captions", "this index has no caption collection (build it with --captions)")
    if (image is None) == (id is None):
        raise ApiError(400, "bad_request", "send exactly one of an 'image' file or an indexed 'id'")
    ctx.check_k(k)
    _check_image(ctx, image, id, ctx.check_file)  # an indexed photo is read again
    results, timings = await ctx.run_model(_upload_job(ctx, image, lambda data: backend.search_image(data, id, k)))
    return {"k": k, "results": [{**r, "text": printable(str(r["text"]))} for r in results], "timings": timings}


async def by_text_or_photo(ctx: Context, req: SearchRequest, text_field: str) -> dict:
    if req.like is not None:
        return await by_photo(ctx, req)
    if req.text is None:
        raise ApiError(422, "invalid_request", f"{text_field}: Field required (or like: an indexed image id)")
    return await by_text(ctx, req)


async def by_text(ctx: Context, req: SearchRequest) -> dict:
    """``POST /search`` with a text: the photos best matching it, among those the filters keep."""
    text = ctx.check_text(req.text)
    where = where_of({f: getattr(req, f) for f in FILTER_HELP})
    candidates = ctx.candidates(req.k, req.candidates)
    finite("min_score", req.min_score)
    kept = () if where is None else (where,)  # a backend without filters is asked without them
    results, timings = await ctx.run_model(lambda: ctx.backend.search(text, req.k, candidates, *kept))
    shown = _shown(results, req.min_score)
    return {"text": text, "k": req.k, "candidates": candidates, "results": shown, "no_match": no_match_line(shown),
            "relevance_note": getattr(ctx.backend, "relevance_note", None), "timings": timings,
            "message": NO_MATCH if where is not None and not shown else None}


async def by_photo(ctx: Context, req: SearchRequest, image: UploadFile | None = None) -> dict:
    """Search by photo: an indexed id (``req.like``) or an uploaded ``image``, optionally with a text."""
    like, text_weight = req.like, req.text_weight
    if (image is None) == (like is None):
        raise ApiError(400, "bad_request", "send exactly one of an 'image' file or an indexed id 'like'")
    where = where_of({f: getattr(req, f) for f in FILTER_HELP})
    text = None if req.text is None or not req.text.strip() else ctx.check_text(req.text)  # an empty form field
    candidates = ctx.candidates(req.k, req.candidates)
    finite("min_score", req.min_score)
    finite("text_weight", text_weight)
    if text_weight is not None and not 0 <= text_weight <= 1:
        raise ApiError(400, "bad_text_weight", f"text_weight is {text_weight}; it must be between 0 and 1")
    if text_weight is not None and text is None:
        raise ApiError(400, "bad_text_weight", "text_weight weighs a text against the photo: send a text too")
    _check_image(ctx, image, like, ctx.check_id)
    kept = {} if where is None else {"where": where}  # a backend without filters is asked without them

    def like_search(data):
        return ctx.backend.search_like(data, like, k=req.k, candidates=candidates, text=text,
                                       text_weight=text_weight, **kept)

    results, timings = await ctx.run_model(_upload_job(ctx, image, like_search))
    shown = _shown(results, req.min_score)
    return {"text": text, "like": like, "k": req.k, "candidates": candidates, "results": shown, "timings": timings,
            "message": NO_MATCH if where is not None and not shown else None}


def _shown(results: list[dict], min_score: float | None) -> list[dict]:
    """The results at or above ``min_score``, their paths as UTF-8 text."""
    return [{**r, "path": printable(str(r["path"]))} for r in results if min_score is None or r["score"] >= min_score]


def _check_image(ctx: Context, image: UploadFile | None, image_id: int | None, check) -> None:
    """The indexed ``image_id`` by ``check``, or the upload's declared size (before anything is read)."""
    if image is None:
        check(image_id)
    elif (getattr(image, "size", None) or 0) > ctx.limits.max_upload_bytes:
        raise ApiError(413, "upload_too_large", f"the upload is larger than {ctx.limits.max_upload_bytes} bytes")


def _upload_job(ctx: Context, image: UploadFile | None, call):
    """A model worker's job: read and check the upload (if any; nothing is read into memory or decoded
    before the pool admits the request), then ``call(data)`` (``data``: the upload's bytes, or None)."""
    def job():
        data = None
        if image is not None:
            data = image.file.read(ctx.limits.max_upload_bytes + 1)
            check_upload(data, ctx.limits)
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
