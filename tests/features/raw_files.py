"""Minimal camera RAW files made here: a TIFF structure (or RAF's header) holding a small sensor-like
strip and, where asked, a JPEG preview behind the tags a camera writes (JPEGInterchangeFormat in IFD1 or a
SubIFD, or a JPEG-compressed strip)."""

from __future__ import annotations

import io
import struct

from PIL import Image


def jpeg_bytes(size=(96, 64), colour=(200, 40, 40), orientation: int | None = None) -> bytes:
    im = Image.new("RGB", size, colour)
    im.paste((20, 20, 200), (0, 0, size[0] // 2, size[1] // 2))  # a blue top-left quarter: shows turns
    buf = io.BytesIO()
    kw = {}
    if orientation is not None:
        exif = Image.Exif()
        exif[0x0112] = orientation
        kw["exif"] = exif.tobytes()
    im.save(buf, "JPEG", quality=92, **kw)
    return buf.getvalue()


def tiff_raw(preview: bytes | None, how: str = "ifd1", orientation: int = 1, magic: bytes = b"II*\x00",
             canon: bool = False) -> bytes:
    """A little-endian TIFF-based RAW: IFD0 (a 4 x 4 'sensor' strip, make, orientation) and the preview
    behind ``how``: ``ifd1`` (JPEGInterchangeFormat tags of the next IFD, as CR2/NEF), ``subifd`` (a SubIFD's
    JPEG tags), ``strip`` (a SubIFD whose one strip is JPEG-compressed, as DNG)."""
    out = bytearray(magic + struct.pack("<I", 16))
    out += b"CR\x02\x00\x00\x00\x00\x00" if canon else b"\x00" * 8  # CR2 writes 'CR' at byte 8
    sensor_at = len(out)
    out += bytes(16)
    preview_at = len(out)
    if preview:
        out += preview
    make_at = len(out)
    out += b"Cam\x00"

    def ifd(entries, next_ifd=0):
        b = struct.pack("<H", len(entries))
        for tag, typ, count, value in sorted(entries):
            b += struct.pack("<HHII", tag, typ, count, value)
        return b + struct.pack("<I", next_ifd)

    ifd0_at = len(out)
    e0 = [(0x0100, 4, 1, 4), (0x0101, 4, 1, 4), (0x0103, 3, 1, 1), (0x0111, 4, 1, sensor_at), (0x0117, 4, 1, 16),
          (0x010F, 2, 4, make_at), (0x0112, 3, 1, orientation)]
    n0 = 2 + 12 * (len(e0) + (how in ("subifd", "strip"))) + 4
    second_at = ifd0_at + n0
    jpeg_tags = [(0x0201, 4, 1, preview_at), (0x0202, 4, 1, len(preview or b""))]
    strip_tags = [(0x0103, 3, 1, 7), (0x0111, 4, 1, preview_at), (0x0117, 4, 1, len(preview or b""))]
    if preview is None:
        out += ifd(e0)
    elif how == "ifd1":
        out += ifd(e0, second_at) + ifd(jpeg_tags)
    else:
        out += ifd(e0 + [(0x014A, 4, 1, second_at)]) + ifd(jpeg_tags if how == "subifd" else strip_tags)
    out[4:8] = struct.pack("<I", ifd0_at)
    return bytes(out)


def raf(preview: bytes) -> bytes:
    head = bytearray(b"FUJIFILMCCD-RAW 0201FF383501" + bytes(100 - 28))
    head[84:92] = struct.pack(">II", 100, len(preview))
    return bytes(head) + preview
