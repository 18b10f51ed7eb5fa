"""Uploaded images: what the service accepts (:data:`IMAGE_TYPES`), the check every upload passes on a model
worker before a model reads it (:func:`check_upload`), and handing the decoded pixels' memory back afterwards."""

from __future__ import annotations

from ...errors import DataError
from ...features.photo import MissingDecoder, PhotoTooLarge, open_photo, sniff
from .errors import ApiError
from .service import Limits

# photo format (vlmatch.features.photo.sniff) -> content type: what the service accepts as uploads
IMAGE_TYPES = {"JPEG": "image/jpeg", "PNG": "image/png", "GIF": "image/gif", "BMP": "image/bmp", "WEBP": "image/webp",
               "TIFF": "image/tiff", "HEIF": "image/heif", "AVIF": "image/avif"}
UPLOAD_FORMATS = "a JPEG, PNG, GIF, BMP, WebP, TIFF, HEIC/HEIF or AVIF image"


def check_upload(data: bytes, limits: Limits) -> None:
    """Reject anything but a decodable image of sane size (it decodes it: call it on a model worker only)."""
    if not data:
        raise ApiError(400, "empty_upload", "the uploaded file is empty")
    if len(data) > limits.max_upload_bytes:
        raise ApiError(413, "upload_too_large", f"the upload is larger than {limits.max_upload_bytes} bytes")
    if sniff(data[:32]) not in IMAGE_TYPES:
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

