"""The indexed photos as the page shows them: thumbnails, and full views of the formats browsers do not show,
made once and kept in memory (:class:`ThumbCache`, keyed by the file's identity)."""

from __future__ import annotations

import io
import threading
from collections import OrderedDict
from pathlib import Path

from ...errors import DataError
from ...features.photo import PhotoTooLarge, open_photo
from .errors import ApiError

# the formats every browser shows as they are; /images/{id} converts the others (HEIC, TIFF, AVIF) to an upright JPEG
BROWSER_FORMATS = ("JPEG", "PNG", "GIF", "BMP", "WEBP")


def as_jpeg(path: Path, item_id: int, max_pixels: int, side: int = 4096) -> bytes:
    """An indexed photo in a format browsers do not show (HEIC, TIFF, AVIF, a RAW's preview) as an upright JPEG
    of at most ``side`` pixels a side (decoded once: the service keeps the last few, :class:`ThumbCache`)."""
    try:
        return _jpeg(path, side, max_pixels, 90)
    except PhotoTooLarge as e:
        raise ApiError(415, "image_too_large", f"the indexed file of id {item_id} {e.problem}") from None
    except DataError:
        raise ApiError(415, "bad_image", f"the indexed file of id {item_id} cannot be decoded") from None


def _jpeg(path: Path, side: int, max_pixels: int, quality: int) -> bytes:
    """The photo decoded upright (a JPEG at a reduced scale), shrunk to ``side`` pixels a side, as JPEG bytes."""
    im = open_photo(path, side, max_pixels=max_pixels)
    im.thumbnail((side, side))
    buf = io.BytesIO()
    im.save(buf, "JPEG", quality=quality)
    return buf.getvalue()


class ThumbCache:
    """Thumbnails (JPEG bytes) of recently asked ids, keyed by the file's identity."""

    def __init__(self, size: int, capacity: int):
        self.size, self.capacity = size, capacity  # a capacity of 0 keeps none
        self._items: OrderedDict = OrderedDict()
        self._lock = threading.Lock()

    def lookup(self, key) -> bytes | None:
        with self._lock:
            if key in self._items:
                self._items.move_to_end(key)
                return self._items[key]
        return None

    def make(self, path: Path, key, max_pixels: int) -> bytes:
        """Make and keep the thumbnail of ``path`` (stored upright: a JPEG keeps no EXIF orientation)."""
        try:
            return self.keep(key, _jpeg(path, self.size, max_pixels, 82))
        except PhotoTooLarge as e:
            raise ApiError(415, "image_too_large", f"the indexed file {e.problem}; thumbnails are made of images "
                                                   f"of up to {max_pixels} pixels") from None

    def keep(self, key, data: bytes) -> bytes:
        with self._lock:
            self._items[key] = data
            while len(self._items) > self.capacity:
                self._items.popitem(last=False)
        return data

