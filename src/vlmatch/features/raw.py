"""Camera RAW files (CR2, NEF, ARW, DNG, ORF, RW2, RAF): told apart from TIFF, read through their JPEG preview.

Most RAWs are TIFF containers, so the magic number alone would read a thumbnail or undemosaiced sensor data.
vlmatch does not demosaic: :func:`embedded_jpeg` finds the largest JPEG the file embeds (IFD preview tags or a
JPEG strip, SubIFDs and the EXIF IFD followed; RAF's header); without one the reader raises :class:`NoPreview`.
A RAW beside a JPEG of the same shot is one photo (:func:`pair_raws`).
"""

from __future__ import annotations

import struct
from pathlib import PurePosixPath

from ..errors import DataError

RAW_SUFFIXES = frozenset({".cr2", ".nef", ".nrw", ".arw", ".srf", ".sr2", ".dng", ".orf", ".rw2", ".raf", ".pef",
                          ".srw", ".rwl", ".3fr", ".erf", ".kdc", ".mrw", ".mef", ".iiq"})
_TIFF_MAGIC = (b"II*\x00", b"MM\x00*")
# RAW formats with a header of their own (not TIFF's magic): Olympus ORF, Panasonic RW2, Fujifilm RAF
_OWN_MAGIC = (b"IIRO", b"IIRS", b"MMOR", b"IIU\x00")
_RAF_MAGIC = b"FUJIFILMCCD-RAW"
JPEG_SUFFIXES = frozenset({".jpg", ".jpeg", ".jpe", ".jfif"})


class NoPreview(DataError):
    """A RAW file without an embedded JPEG preview: vlmatch does not decode sensor data."""


def is_raw(head: bytes, name=None) -> bool:
    """Whether a file is a camera RAW: a header only RAWs have (CR2's ``CR`` after the TIFF header, ORF, RW2,
    RAF), or a TIFF header under a RAW suffix (NEF, ARW, DNG ... are TIFFs by their bytes)."""
    if head.startswith(_RAF_MAGIC) or head[:4] in _OWN_MAGIC:
        return True
    if head[:4] in _TIFF_MAGIC:
        if head[8:10] == b"CR":  # Canon CR2: 'CR' and a version after the first IFD offset
            return True
        return name is not None and PurePosixPath(str(name)).suffix.lower() in RAW_SUFFIXES
    return False


def _ifd_walk(data: bytes, endian: str, first: int):
    """Every IFD reachable from ``first`` (the chain, SubIFDs and the EXIF IFD) as {tag: (type, count, value
    offset or inline value bytes)}; loops and offsets outside the file are ignored."""
    seen, todo = set(), [first]
    sizes = {1: 1, 2: 1, 3: 2, 4: 4, 5: 8, 6: 1, 7: 1, 8: 2, 9: 4, 10: 8, 11: 4, 12: 8, 13: 4}
    while todo and len(seen) < 64:
        off = todo.pop()
        if off in seen or off <= 0 or off + 2 > len(data):
            continue
        seen.add(off)
        (n,) = struct.unpack_from(endian + "H", data, off)
        if off + 2 + 12 * n + 4 > len(data) or n > 1000:
            continue
        tags = {}
        for i in range(n):
            tag, typ, count = struct.unpack_from(endian + "HHI", data, off + 2 + 12 * i)
            raw = data[off + 2 + 12 * i + 8:off + 2 + 12 * i + 12]
            tags[tag] = (typ, count, raw, sizes.get(typ, 1) * count)
        yield tags
        (nxt,) = struct.unpack_from(endian + "I", data, off + 2 + 12 * n)
        todo.append(nxt)
        for sub in (0x014A, 0x8769):  # SubIFDs, the EXIF IFD
            todo.extend(_values(data, endian, tags.get(sub)))


def _values(data: bytes, endian: str, entry) -> list[int]:
    """The integer values of one IFD entry (SHORT or LONG, inline or at their offset)."""
    if entry is None:
        return []
    typ, count, raw, nbytes = entry
    if typ not in (3, 4, 13) or count > 4096:
        return []
    fmt = "H" if typ == 3 else "I"
    if nbytes <= 4:
        buf, at = raw, 0
    else:
        (at,) = struct.unpack_from(endian + "I", raw)
        buf = data
        if at + nbytes > len(data):
            return []
    return list(struct.unpack_from(endian + fmt * count, buf, at))


def _is_jpeg(data: bytes, at: int, length: int) -> bool:
    return length > 2 and at + length <= len(data) and data[at:at + 3] == b"\xff\xd8\xff"


def embedded_jpeg(data: bytes) -> tuple[bytes, int] | None:
    """The largest JPEG embedded in a RAW file's bytes and the orientation (1..8) its first IFD records (the
    preview itself rarely carries one); None when there is none."""
    if data.startswith(_RAF_MAGIC):  # RAF: big-endian offset and length of the JPEG at bytes 84 and 88
        if len(data) < 92:
            return None
        at, length = struct.unpack_from(">II", data, 84)
        return (data[at:at + length], 1) if _is_jpeg(data, at, length) else None
    if data[:2] not in (b"II", b"MM"):
        return None
    endian = "<" if data[:2] == b"II" else ">"
    (first,) = struct.unpack_from(endian + "I", data, 4)
    found, orientation = [], 1
    for i, tags in enumerate(_ifd_walk(data, endian, first)):
        if i == 0 and (o := _values(data, endian, tags.get(0x0112))) and 1 <= o[0] <= 8:
            orientation = o[0]
        at, length = _values(data, endian, tags.get(0x0201)), _values(data, endian, tags.get(0x0202))
        if at and length and _is_jpeg(data, at[0], length[0]):
            found.append((length[0], at[0]))
        compression = _values(data, endian, tags.get(0x0103))
        strips, counts = _values(data, endian, tags.get(0x0111)), _values(data, endian, tags.get(0x0117))
        if compression and compression[0] in (6, 7) and len(strips) == 1 and len(counts) == 1 \
                and _is_jpeg(data, strips[0], counts[0]):
            found.append((counts[0], strips[0]))
    if not found:
        return None
    length, at = max(found)
    return data[at:at + length], orientation


def pair_raws(rels: list[str]) -> tuple[list[str], list[dict]]:
    """``rels`` (paths relative to the photo folder) without each RAW that has a JPEG of the same shot beside
    it (same folder, same name but for the suffix, in any case), and those pairs (``{"raw", "jpeg"}``)."""
    jpegs = {}
    for r in rels:
        p = PurePosixPath(r)
        if p.suffix.lower() in JPEG_SUFFIXES:
            jpegs.setdefault(str(p.with_suffix("")).lower(), r)
    kept, pairs = [], []
    for r in rels:
        p = PurePosixPath(r)
        twin = jpegs.get(str(p.with_suffix("")).lower()) if p.suffix.lower() in RAW_SUFFIXES else None
        if twin is not None:
            pairs.append({"raw": r, "jpeg": twin})
        else:
            kept.append(r)
    return kept, pairs
