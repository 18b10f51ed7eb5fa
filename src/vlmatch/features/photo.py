"""Reading a photo as it is displayed: the one image reader of the package.

Every place that turns an image file into pixels goes through :func:`open_photo` (a PIL image) or
:func:`load_image` (the model's square input), so a photo is encoded, thumbnailed and explained the way a
viewer shows it: format read from the content, EXIF orientation applied, a JPEG decoded at a reduced scale,
a HEIC through its embedded thumbnail where it covers the size, a camera RAW through its JPEG preview, colour
made 8-bit RGB, and a limit on the pixels *decoded* rather than Pillow's bomb check (docs/search.md,
"Photos as they are displayed"). :data:`READER_VERSION` names this behaviour in an index's manifest.
"""

from __future__ import annotations

import io
import math
import struct
from pathlib import Path

import numpy as np

from ..errors import DataError
from . import jpeg_data
from .raw import RAW_SUFFIXES, NoPreview, embedded_jpeg, is_raw

READER_VERSION = 2  # 1: stored pixels, EXIF orientation ignored (vlmatch <= 0.1 indexes)
MAX_DECODE_PIXELS = 256_000_000  # after a JPEG's reduced decode: 256 M RGB pixels are 768 MB
# the share of the model's input an embedded HEIC thumbnail must cover on both sides (a 320 x 240 iPhone one)
MODEL_THUMB_COVER = 0.75

# suffixes listed as photos when a folder is scanned (the content decides what each file is)
PHOTO_SUFFIXES = frozenset({".jpg", ".jpeg", ".jpe", ".jfif", ".png", ".bmp", ".webp", ".gif", ".tif", ".tiff",
                            ".heic", ".heif", ".hif", ".avif"}) | RAW_SUFFIXES

# EXIF orientation -> the PIL transpose that shows the stored pixels upright (None: as stored)
ORIENTATION_OPS = {1: None, 2: "FLIP_LEFT_RIGHT", 3: "ROTATE_180", 4: "FLIP_TOP_BOTTOM", 5: "TRANSPOSE",
                   6: "ROTATE_270", 7: "TRANSVERSE", 8: "ROTATE_90"}
EXIF_ORIENTATION = 0x0112

_HEIF_BRANDS = {b"heic", b"heix", b"hevc", b"hevx", b"heim", b"heis", b"hevm", b"hevs", b"mif1", b"msf1", b"mif2"}
_AVIF_BRANDS = {b"avif", b"avis"}
VISION_EXTRA = "pip install 'vlmatch[vision]'"


def file_head(path: Path) -> bytes | None:
    """A file's first 32 bytes, what :func:`sniff` reads; None where it cannot be read."""
    try:
        return _head(path)
    except OSError:
        return None


def sniff(head: bytes, name=None) -> str | None:
    """The Pillow format id of a file from its first 32 bytes, or ``RAW`` (a camera RAW: by its header, or a
    TIFF header under a RAW suffix of ``name``); None for anything else (a video, a sidecar, a text file)."""
    if is_raw(head, name):
        return "RAW"
    if head.startswith(b"\xff\xd8\xff"):
        return "JPEG"
    if head.startswith(b"\x89PNG\r\n\x1a\n"):
        return "PNG"
    if head[:6] in (b"GIF87a", b"GIF89a"):
        return "GIF"
    if head.startswith(b"BM") and len(head) >= 14:
        return "BMP"
    if head[:4] == b"RIFF" and head[8:12] == b"WEBP":
        return "WEBP"
    if head[:4] in (b"II*\x00", b"MM\x00*"):
        return "TIFF"
    if head[4:8] == b"ftyp":
        brands = {head[8:12]} | {head[i:i + 4] for i in range(16, min(len(head), 32) - 3, 4)}
        if brands & _AVIF_BRANDS and head[8:12] in _AVIF_BRANDS | {b"mif1", b"msf1"}:
            return "AVIF"
        if brands & _HEIF_BRANDS:
            return "HEIF"
        if brands & _AVIF_BRANDS:
            return "AVIF"
    return None


class PhotoTooLarge(DataError):
    """A photo over a caller's pixel limit (:func:`open_photo`'s ``max_pixels``)."""


class MissingDecoder(DataError):
    """A photo in a format this installation cannot decode (HEIF / AVIF without their plugin)."""


_registered: dict[str, bool] = {}


def decoder_available(fmt: str) -> bool:
    """Whether this installation decodes ``fmt`` (HEIF: pillow-heif, registered once; AVIF: Pillow's or its)."""
    if fmt not in ("HEIF", "AVIF"):
        return True
    if "heif" not in _registered:
        try:
            import pillow_heif

            pillow_heif.register_heif_opener()
            _registered["heif"] = True
            _registered["heif_avif"] = bool(pillow_heif.libheif_info().get("AVIF"))
        except ImportError:
            _registered["heif"] = _registered["heif_avif"] = False
    if fmt == "HEIF":
        return _registered["heif"]
    from PIL import features

    return bool(features.check("avif")) or _registered["heif_avif"]


def _head(src) -> bytes:
    if isinstance(src, (bytes, bytearray, memoryview)):
        return bytes(src[:32])
    if isinstance(src, (str, Path)):
        with open(src, "rb") as f:
            return f.read(32)
    pos = src.tell()
    head = src.read(32)
    src.seek(pos)
    return head


def _name(src, name) -> str | Path:
    if name is not None:
        return name
    if isinstance(src, (str, Path)):
        return src
    return getattr(src, "path", None) or "image"


_PIL_FORMATS = ("JPEG", "PNG", "GIF", "BMP", "WEBP", "TIFF", "HEIF", "AVIF")  # sniff()'s names are Pillow's ids


def open_image(src):
    """``PIL.Image.open`` without Pillow's decompression-bomb check, which refuses a large JPEG before it could
    decode at a reduced scale (:func:`open_photo` limits the decoded pixels instead). It calls the format's own
    opener, so nothing process-wide changes; a file sniff() does not know goes through Image.open itself."""
    from PIL import Image

    head = _head(src)
    fmt = sniff(head)
    if fmt in _PIL_FORMATS:
        Image.preinit()
        if fmt not in Image.OPEN:
            Image.init()
        factory, accept = Image.OPEN.get(fmt, (None, None))
        accepted = accept(head[:16]) if accept is not None else True  # a text: why the plugin cannot (Image.open's)
        if factory is not None and accepted and not isinstance(accepted, str):
            if not isinstance(src, (str, Path)):
                src.seek(0)
            try:
                return factory(src, "")
            except (SyntaxError, IndexError, TypeError, struct.error):  # as Image.open goes on to the next format
                if not isinstance(src, (str, Path)):
                    src.seek(0)
    return Image.open(src)


def open_photo(src, size: int | None = None, *, name=None, max_pixels: int | None = MAX_DECODE_PIXELS,
               cover: float = 1.0):
    """The photo ``src`` (a path, bytes or a binary file) as an upright 8-bit RGB PIL image; any problem is a
    DataError naming the file. ``size``: the side the caller shrinks it to (a JPEG decodes at the smallest scale
    covering it); ``max_pixels``: more decoded pixels are refused (:class:`PhotoTooLarge`; None: no limit);
    ``cover``: the share of ``size`` an embedded HEIC thumbnail must reach to be decoded instead."""
    where = _name(src, name)
    try:
        head = _head(src)
    except OSError as e:
        raise DataError(where, f"unreadable image ({type(e).__name__}: {e.strerror or e})") from None
    fmt = sniff(head, where)
    if fmt == "RAW":
        return _open_raw(src, size, where, max_pixels)
    if fmt in ("HEIF", "AVIF") and not decoder_available(fmt):
        raise MissingDecoder(where, f"a {fmt} photo, and no {fmt} decoder is installed: {VISION_EXTRA} (pillow-heif)")
    fp = io.BytesIO(bytes(src)) if isinstance(src, (bytes, bytearray, memoryview)) else src
    try:
        with open_image(fp) as im:
            if getattr(im, "n_frames", 1) > 1:
                im.seek(0)  # the first frame of an animation or a multi-page file
            drafted = bool(size and im.format == "JPEG" and im.mode in ("RGB", "L", "CMYK", "YCbCr"))
            if drafted:
                im.draft(im.mode, (size, size))
            elif size and im.format == "HEIF":
                # pillow-heif's draft: the smallest embedded thumbnail that covers size x size and is a scaled
                # copy of the photo (same aspect, crop, rotation, colour profile), else the full decode
                side = max(1, math.ceil(size * cover))
                im.draft(im.mode, (side, side))
            # the pixels that will be decoded (a JPEG's at the draft's scale)
            if max_pixels is not None and im.size[0] * im.size[1] > max_pixels:
                raise PhotoTooLarge(where, f"has {im.size[0]}x{im.size[1]} pixels; the limit is {max_pixels} pixels")
            jpeg = _jpeg_claim(src, where) if im.format == "JPEG" else None  # its data checked against its size
            orientation = orientation_of(im)
            im.load()
            if jpeg is not None:
                _check_jpeg_data(im, jpeg, size if drafted else None, where)
            return to_rgb(upright(im, orientation))
    except DataError:
        raise
    except Exception as e:  # PIL raises many types (OSError, DecompressionBombError, SyntaxError, ...)
        raise DataError(where, f"unreadable image ({type(e).__name__}: {e})") from None


def _all_bytes(src) -> bytes:
    if isinstance(src, (str, Path)):
        return Path(src).read_bytes()
    if isinstance(src, (bytes, bytearray, memoryview)):
        return bytes(src)
    if hasattr(src, "getvalue"):
        return src.getvalue()
    pos = src.tell()
    src.seek(0)
    data = src.read()
    src.seek(pos)
    return data


def _jpeg_claim(src, where) -> tuple[bytes, jpeg_data.Layout] | None:
    """A JPEG's bytes and header, its claimed size refused at once when the bytes cannot hold it
    (:func:`.jpeg_data.claim_problem`: before a buffer of that size is allocated)."""
    data = _all_bytes(src)
    lay = jpeg_data.layout(data, scans=False)
    if lay is None:
        return None
    if (problem := jpeg_data.claim_problem(data, lay)) is not None:
        raise DataError(where, problem)
    return data, lay


def _check_jpeg_data(im, jpeg, draft: int | None, where) -> None:
    """Refuse a decoded JPEG whose data ran out before the size its header claims (:func:`.jpeg_data.ran_out`;
    looked at only when its last pixel is the grey such a decode ends with)."""
    data, _ = jpeg
    if not jpeg_data.looks_filled(im):
        return

    def decode(fp) -> bytes:
        with open_image(fp) as again:
            if draft:
                again.draft(again.mode, (draft, draft))
            again.load()
            return again.tobytes()

    lay = jpeg_data.layout(data)
    if lay is not None and jpeg_data.ran_out(data, lay, im.tobytes(), decode):
        raise DataError(where, jpeg_data.ran_out_problem(lay))


def _open_raw(src, size, where, max_pixels):
    """A camera RAW as displayed: its embedded JPEG preview, turned by the RAW's own orientation tag."""
    try:
        data = _all_bytes(src)
    except OSError as e:
        raise DataError(where, f"unreadable image ({type(e).__name__}: {e.strerror or e})") from None
    found = embedded_jpeg(data)
    if found is None:
        raise NoPreview(where, "a camera RAW with no embedded JPEG preview (vlmatch does not decode RAW sensor data: "
                               "export a JPEG beside it, same name)")
    jpeg, orientation = found
    im = open_photo(jpeg, size, name=where, max_pixels=max_pixels)
    if orientation != 1:
        with open_image(io.BytesIO(jpeg)) as probe:
            own = orientation_of(probe)
        if own == 1:  # the preview records no orientation of its own: the RAW's applies
            im = upright(im, orientation)
    return im


def preview_pixels(data: bytes) -> list[int] | None:
    """A RAW's size as displayed, [w, h]: its embedded preview's, turned as :func:`_open_raw` turns it; None
    without a preview (the RAW's first IFD often describes a thumbnail or the sensor, not what is shown)."""
    found = embedded_jpeg(data)
    if found is None:
        return None
    jpeg, orientation = found
    try:
        with open_image(io.BytesIO(jpeg)) as im:
            w, h = im.size
            own = orientation_of(im)
    except Exception:  # noqa: BLE001 - an unreadable preview: no size (the pixel read reports the problem)
        return None
    turn = own if own != 1 else orientation  # as photo._open_raw turns it: the preview's own tag, else the RAW's
    return [h, w] if turn in (5, 6, 7, 8) else [w, h]


def load_image(path, size: int) -> np.ndarray:
    """A photo's RGB pixels as displayed (:func:`open_photo`), resized to ``size`` x ``size`` (bilinear)."""
    from PIL import Image

    im = open_photo(path, size, cover=MODEL_THUMB_COVER)
    return np.asarray(im.resize((size, size), Image.BILINEAR), dtype=np.uint8)


def orientation_of(im) -> int:
    """The EXIF orientation (1..8) of an open PIL image; 1 when it has none or it is unreadable."""
    try:
        v = im.getexif().get(EXIF_ORIENTATION, 1)
    except Exception:  # corrupt EXIF: PIL raises assorted types
        return 1
    return v if isinstance(v, int) and v in ORIENTATION_OPS else 1


def file_orientation(path) -> int:
    """The EXIF orientation of an image file without decoding it (1 for HEIF / AVIF: their decoder turns them)."""
    try:
        if sniff(_head(path), path) in ("HEIF", "AVIF", "RAW", None):
            return 1
        with open_image(path) as im:
            return orientation_of(im)
    except Exception:  # unreadable: the reader says why when the photo is read
        return 1


def upright(im, orientation: int):
    """``im`` turned the way its EXIF ``orientation`` says it is displayed."""
    from PIL import Image

    op = ORIENTATION_OPS.get(orientation)
    return im if op is None else im.transpose(getattr(Image.Transpose, op))


def to_rgb(im):
    """8-bit RGB: 16/32-bit greyscale scaled to 8 bits (PIL's convert would clip at 255), transparency
    composited on white, every other mode converted by PIL."""
    from PIL import Image

    if im.mode in ("I;16", "I;16B", "I;16L", "I;16N", "I", "F"):
        a = np.asarray(im).astype(np.float64)
        top = 65535.0 if im.mode.startswith("I;16") or (a.size and a.max() > 255) else 255.0
        if im.mode in ("I", "F") and a.size and a.max() > 65535:
            top = float(a.max())
        a = np.clip(np.rint(a * (255.0 / top)), 0, 255).astype(np.uint8)
        return Image.fromarray(a, "L").convert("RGB")
    if im.mode == "P" and "transparency" in im.info or im.mode == "PA":
        im = im.convert("RGBA")
    if im.mode in ("RGBA", "LA", "RGBa", "La"):
        rgba = im.convert("RGBA")
        white = Image.new("RGBA", rgba.size, (255, 255, 255, 255))
        return Image.alpha_composite(white, rgba).convert("RGB")
    return im if im.mode == "RGB" else im.convert("RGB")
