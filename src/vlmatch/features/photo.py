"""Reading a photo as it is displayed: the one image reader of the package.

Every place that turns an image file into pixels -- index build and update, ``features extract``,
``explain``, ``grounding`` on photo folders, the service's uploads, thumbnails and heat-map overlays --
goes through :func:`open_photo` (a PIL image) or :func:`load_image` (the model's square input), so a
photo is encoded, thumbnailed and explained the way a browser or a photo viewer shows it:

1. the format is read from the content, not the name (:func:`sniff`): a ``.jpg`` that is really a
   HEIC is a HEIC; HEIC/HEIF decode through pillow-heif (the ``vision`` extra), AVIF through Pillow's
   own plugin where it was built with one; a missing decoder is a one-line error naming the extra;
2. a JPEG larger than needed decodes at 1/2, 1/4 or 1/8 scale (PIL's draft: the DCT scaled inside the
   decoder, still at least the requested size on both sides);
   a HEIC that embeds a thumbnail covering the requested size on both sides decodes that thumbnail instead
   (a 12 MP HEIC's HEVC decode is most of its cost); for the model's square input (:func:`load_image`)
   a thumbnail covering :data:`MODEL_THUMB_COVER` of it suffices: the 320 x 240 thumbnail an iPhone writes
   serves a 320 px backbone (the input is squashed to a square anyway; the embedding's cosine to the
   full decode's is in benchmarks/results/heic_speed.md, the recall in benchmarks/results/phone_library.md);
3. the first frame of an animated GIF / WebP / multi-page TIFF;
4. the EXIF orientation applied (all eight values: :data:`ORIENTATION_OPS`); HEIF files carry their
   rotation in the container and pillow-heif applies it while decoding;
5. a camera RAW (:mod:`vlmatch.features.raw`: CR2, NEF, ARW, DNG, ORF, RW2, RAF, told apart from TIFF by
   its header or its suffix) read through the full-size JPEG preview it embeds (:class:`~.raw.NoPreview`
   when it has none);
6. no file-size guard: the limit is on the pixels that will be *decoded* (:data:`MAX_DECODE_PIXELS`, after a
   JPEG's reduced decode), which is what costs memory, so a 200-megapixel JPEG reads at 1/8 scale while a PNG of
   as many pixels is refused. vlmatch's reads pass by Pillow's decompression-bomb check (:func:`open_image`),
   which would refuse that JPEG before it could decode at a reduced scale; ``PIL.Image.MAX_IMAGE_PIXELS`` stays
   as the application set it, for every other read in the process;
7. a JPEG whose header claims more pixels than its data holds is refused, naming the file (:mod:`.jpeg_data`:
   the decoder would fill the rest with flat grey), a RAW's preview alike;
8. colour normalised to 8-bit RGB: CMYK, YCbCr, palette, 1-bit, greyscale; 16- and 32-bit greyscale
   scaled (not clipped) to 8 bits; transparency (RGBA, LA, PA, palette with a transparent index)
   composited on white, as a viewer shows it on a light page.

:data:`READER_VERSION` names this behaviour: an index records the version that encoded its photos
(``reader`` in its manifest). Version 1 read the stored pixels and ignored the EXIF orientation. Version 2 covers
the HEIC thumbnail read too (:data:`MODEL_THUMB_COVER`, added later without a new version): a HEIC encoded from its
full decode and one encoded from its thumbnail are the same photo to the model (embedding cosine 0.96-0.99), so an
index holding both needs no re-encoding.
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
# the most pixels a photo may decode to (after a JPEG's reduced decode): 256 M RGB pixels are 768 MB
MAX_DECODE_PIXELS = 256_000_000
# the share of the model's input side an embedded HEIC thumbnail must cover on both sides to be read instead of
# the full HEVC decode (0.75: a 4:3 iPhone thumbnail, 320 x 240, for a 320 x 320 input)
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


def sniff(head: bytes, name=None) -> str | None:
    """The image format of a file from its first 32 bytes: ``JPEG``, ``PNG``, ``GIF``, ``BMP``, ``WEBP``,
    ``TIFF``, ``HEIF``, ``AVIF`` or ``RAW`` (a camera RAW: by its own header, or a TIFF header under a RAW
    suffix of ``name``, the file's name when known); None for anything else (a video, a sidecar, a text file)."""
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
    """Whether this installation decodes ``fmt`` (HEIF through pillow-heif; AVIF through Pillow's plugin,
    else pillow-heif's where its libheif has an AVIF decoder). Registers pillow-heif's opener once."""
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
    """``PIL.Image.open`` for vlmatch's own reads (a path or a binary file object; lazy, as Image.open is), without
    Pillow's decompression-bomb check: Pillow refuses an image over 2 x ``Image.MAX_IMAGE_PIXELS`` (179 M by
    default) when it *opens* it, before a JPEG could decode at a reduced scale, so :func:`open_photo` checks the
    pixels it will decode instead (``max_pixels``). The format's own opener is called, as Image.open calls it once
    it has identified the file, so nothing process-wide changes: an application's other reads keep its limit,
    whatever thread they run on. A file sniff() does not know, or that its format's opener refuses, goes through
    Image.open itself (its check included, and its error for a file no format opens)."""
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
    """The photo ``src`` (a path, the file's bytes or a binary file object) as an upright 8-bit RGB PIL
    image, as a viewer displays it. ``size``: the side the caller will shrink it to -- a JPEG then decodes
    at the smallest 1/2..1/8 scale that still covers ``size`` x ``size``. Any problem is a
    :class:`~vlmatch.errors.DataError` naming the file (``name``, else the path) and what is wrong;
    ``max_pixels``: a photo that would decode to more pixels (a JPEG: at the reduced scale) is refused
    before it is decoded (:class:`PhotoTooLarge`; default :data:`MAX_DECODE_PIXELS`, None: no limit);
    ``cover``: the share of ``size`` an embedded HEIC thumbnail must reach on both sides to be decoded
    instead of the photo (1: all of it, for what a person sees; :func:`load_image` passes
    :data:`MODEL_THUMB_COVER`)."""
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
    if isinstance(src, (str, Path)):
        try:
            data = Path(src).read_bytes()
        except OSError as e:
            raise DataError(where, f"unreadable image ({type(e).__name__}: {e.strerror or e})") from None
    elif isinstance(src, (bytes, bytearray, memoryview)):
        data = bytes(src)
    else:
        pos = src.tell()
        data = src.read()
        src.seek(pos)
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
    """A RAW's size as displayed, [w, h]: its embedded preview's (what vlmatch reads of it), turned a quarter
    where the preview's own orientation, else the RAW's, says so; None without a preview. The RAW's first IFD
    often describes a thumbnail or the sensor, not what is shown."""
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
    """A photo's RGB pixels as displayed (:func:`open_photo`), resized to ``size`` x ``size`` (bilinear):
    the backbone's input. ``path``: a path, the file's bytes or a binary file object."""
    from PIL import Image

    im = open_photo(path, size, cover=MODEL_THUMB_COVER)
    return np.asarray(im.resize((size, size), Image.BILINEAR), dtype=np.uint8)


def orientation_of(im) -> int:
    """The EXIF orientation (1..8) of an open PIL image; 1 when it has none or it is unreadable
    (a broken EXIF block never stops a photo from being read)."""
    try:
        v = im.getexif().get(EXIF_ORIENTATION, 1)
    except Exception:  # corrupt EXIF: PIL raises assorted types
        return 1
    return v if isinstance(v, int) and v in ORIENTATION_OPS else 1


def file_orientation(path) -> int:
    """The EXIF orientation of an image file without decoding its pixels (1 when none or unreadable, and
    for HEIF / AVIF, whose rotation lives in the container and is applied by the decoder)."""
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
