"""The photo routes: an indexed photo (``/images/{id}``) and its thumbnail (``/thumbs/{id}``), served only by id
from the paths in the index's own table (nothing in a request is ever used as a path), with ETags; and the
check every route that reads an indexed photo makes first (:func:`indexed_image`)."""

import os
from pathlib import Path

from fastapi import APIRouter, Request
from fastapi.concurrency import run_in_threadpool
from fastapi.responses import FileResponse, Response

from ...features.photo import sniff
from ..library.unchanged import kind_of
from .context import Context, Ctx
from .errors import ApiError, changed, file_missing
from .schema import ERRORS
from .thumbnails import BROWSER_FORMATS, as_jpeg
from .uploads import IMAGE_TYPES

router = APIRouter(tags=["files"])
# an id may name another file once the server follows a rebuild: clients revalidate (a 304 is cheap)
FILE_CACHE = "public, max-age=0, must-revalidate"
AS_IMAGE = {200: {"content": {"image/jpeg": {}}}, **ERRORS}


@router.get("/images/{id}", responses=AS_IMAGE)
async def image(id: int, request: Request, ctx: Ctx):  # noqa: A002
    """The indexed image file of ``id`` (its path comes from the index's table, never from the request)."""
    path = ctx.check_file(id)
    key, etag = _identity(path, id)
    if (r := _not_modified(request, etag)) is not None:
        return r
    fmt = await _image_format(path, id)
    headers = {"ETag": etag, "Cache-Control": FILE_CACHE}
    if fmt in BROWSER_FORMATS:  # as it is: browsers apply a JPEG's EXIF orientation themselves
        # streamed from disk in chunks: a large file is never held in memory whole
        return FileResponse(path, media_type=IMAGE_TYPES[fmt], headers=headers)
    data = ctx.views.lookup(key)
    if data is None:
        async with ctx.decoding:  # HEIC, TIFF, AVIF, RAW: an upright JPEG (at most `workers` decoded at once)
            data = ctx.views.keep(key, await run_in_threadpool(as_jpeg, path, id, ctx.limits.max_decode_pixels))
    return Response(data, media_type="image/jpeg", headers=headers)


@router.get("/thumbs/{id}", responses=AS_IMAGE)
async def thumb(id: int, request: Request, ctx: Ctx):  # noqa: A002
    """A JPEG thumbnail (at most thumb_size pixels a side) of the indexed image ``id``."""
    path = ctx.check_file(id)
    key, etag = _identity(path, id)
    etag = etag[:-1] + f'-t{ctx.limits.thumb_size}"'
    if (r := _not_modified(request, etag)) is not None:
        return r
    data = ctx.thumbs.lookup(key)
    if data is None:
        async with ctx.decoding:  # at most `workers` thumbnails are decoded at once
            try:
                data = await run_in_threadpool(ctx.thumbs.make, path, key, ctx.limits.max_decode_pixels)
            except ApiError:
                raise
            except Exception:  # PIL raises many types for broken files; its words are not ours
                raise ApiError(415, "bad_image", f"the indexed file of id {id} cannot be decoded") from None
    return Response(data, media_type="image/jpeg", headers={"ETag": etag, "Cache-Control": FILE_CACHE})


async def indexed_image(ctx: Context, image_id: int) -> Path:
    """The file of ``image_id`` checked as ``/images`` checks it, before a model works on it."""
    path = ctx.check_file(image_id)
    _identity(path, image_id)
    await _image_format(path, image_id)
    return path


def _identity(path: Path, image_id: int):
    """The file's cache key and ETag; 404 file_missing when it is gone."""
    try:
        st = path.stat()
    except OSError:
        raise file_missing() from None
    return (image_id, str(path), st.st_ino, st.st_mtime_ns, st.st_size), f'"{st.st_ino:x}-{st.st_mtime_ns:x}-{st.st_size:x}"'


def _not_modified(request: Request, etag: str) -> Response | None:
    if etag in {t.strip() for t in request.headers.get("if-none-match", "").split(",")}:
        return Response(status_code=304, headers={"ETag": etag, "Cache-Control": FILE_CACHE})
    return None


async def _image_format(path: Path, image_id: int) -> str:
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
        raise changed(image_id, head_or_kind)
    fmt = sniff(head_or_kind, path)
    if fmt is None:
        raise ApiError(415, "not_an_image", f"the indexed file of id {image_id} is not an image type the service serves")
    return fmt
