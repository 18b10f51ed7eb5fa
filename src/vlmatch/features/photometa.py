"""When, where and with what a photo was taken, read from its EXIF without decoding pixels, robust to broken tags.

:func:`photo_meta` returns any of ``taken`` (ISO 8601 from ``DateTimeOriginal``, else ``DateTime``, with the EXIF
offset where there is one; never the file's mtime: :func:`mtime_taken`), ``camera`` (make and model, the make not
repeated), ``gps`` (``[lat, lon]``, south and west negative), ``size`` (``[w, h]`` as displayed) and ``notes``
(one line per tag that was there but unusable: that field is left out, the photo is indexed anyway).
"""

from __future__ import annotations

import math
import re
from contextlib import suppress
from datetime import datetime, timedelta, timezone

EXIF_IFD, GPS_IFD = 0x8769, 0x8825
MAKE, MODEL, ORIENTATION, DATETIME = 271, 272, 274, 306
DATETIME_ORIGINAL, OFFSET_TIME, OFFSET_TIME_ORIGINAL = 36867, 36880, 36881
GPS_LAT_REF, GPS_LAT, GPS_LON_REF, GPS_LON = 1, 2, 3, 4

MIN_YEAR, MAX_YEAR = 1826, 2200  # the first photograph; anything later than this is a broken clock
_DATE = re.compile(r"^\s*(\d{4})[:\-/](\d{2})[:\-/](\d{2})[ T](\d{2}):(\d{2}):(\d{2})")
_OFFSET = re.compile(r"^\s*([+-])(\d{2}):?(\d{2})\s*$")


def _text(v) -> str | None:
    """A tag's value as text (bytes decoded as UTF-8, else Latin-1; NULs and padding stripped); None when
    it is not text."""
    if isinstance(v, (bytes, bytearray)):
        try:
            v = bytes(v).decode("utf-8")
        except UnicodeDecodeError:
            v = bytes(v).decode("latin-1")
    if not isinstance(v, str):
        return None
    return v.replace("\x00", " ").strip()


def _date(v, offset, name: str, notes: list[str]) -> str | None:
    s = _text(v)
    if s is None:
        notes.append(f"{name}: not text ({type(v).__name__})")
        return None
    if not s:
        notes.append(f"{name}: empty")
        return None
    m = _DATE.match(s)
    if not m:
        notes.append(f"{name}: {s[:40]!r} is not a date (YYYY:MM:DD HH:MM:SS)")
        return None
    y, mo, d, h, mi, se = (int(x) for x in m.groups())
    try:
        if not MIN_YEAR <= y <= MAX_YEAR:
            raise ValueError
        t = datetime(y, mo, d, h, mi, se)
    except ValueError:
        notes.append(f"{name}: {s[:40]!r} is not a possible date")
        return None
    if offset is not None:
        o = _text(offset)
        om = _OFFSET.match(o) if o else None
        if om and int(om.group(2)) <= 14 and int(om.group(3)) < 60:
            sign = 1 if om.group(1) == "+" else -1
            t = t.replace(tzinfo=timezone(sign * timedelta(hours=int(om.group(2)), minutes=int(om.group(3)))))
        elif o:  # an empty offset tag (cameras write "   :  ") is no offset, not a note
            notes.append(f"offset of {name}: {o[:20]!r} is not +HH:MM")
    return t.isoformat()


def _degrees(v, name: str, notes: list[str]) -> float | None:
    """(deg, min, sec) rationals -> degrees; None with a note when broken."""
    try:
        parts = [float(x) for x in (v if isinstance(v, (tuple, list)) else [v])]
    except (TypeError, ValueError, ZeroDivisionError):
        notes.append(f"{name}: not numbers ({type(v).__name__})")
        return None
    if not 1 <= len(parts) <= 3 or not all(math.isfinite(p) and p >= 0 for p in parts):
        notes.append(f"{name}: {parts} is not degrees, minutes, seconds (a zero denominator?)")
        return None
    deg = sum(p / 60 ** i for i, p in enumerate(parts))
    return deg


def _gps(g, notes: list[str]) -> list[float] | None:
    if not g or (GPS_LAT not in g and GPS_LON not in g):
        return None
    lat = _degrees(g.get(GPS_LAT), "GPSLatitude", notes)
    lon = _degrees(g.get(GPS_LON), "GPSLongitude", notes)
    if lat is None or lon is None:
        return None
    for ref, neg, name in ((GPS_LAT_REF, "S", "GPSLatitudeRef"), (GPS_LON_REF, "W", "GPSLongitudeRef")):
        r = _text(g.get(ref)) if ref in g else ""
        if r is None or r.upper() not in ("", "N", "S", "E", "W"):
            notes.append(f"{name}: {g.get(ref)!r} is not N/S/E/W")
            return None
        if r.upper() == neg:
            if ref == GPS_LAT_REF:
                lat = -lat
            else:
                lon = -lon
    if abs(lat) > 90 or abs(lon) > 180:
        notes.append(f"GPS: ({lat:.4f}, {lon:.4f}) is not on Earth")
        return None
    return [round(lat, 7), round(lon, 7)]


def _ifd(exif, tag: int, notes: list[str]) -> dict:
    try:
        got = exif.get_ifd(tag) if hasattr(exif, "get_ifd") else exif.get(tag)
    except Exception as e:  # noqa: BLE001 - Pillow raises what the bytes make it raise
        notes.append(f"{'GPS' if tag == GPS_IFD else 'Exif'} block unreadable ({type(e).__name__})")
        return {}
    return dict(got) if isinstance(got, dict) else {}


def meta_from_exif(exif, stored_size) -> dict:
    """:func:`photo_meta` from an EXIF mapping (a ``PIL.Image.Exif``, or a plain dict whose ``0x8769`` and
    ``0x8825`` entries are dicts) and the stored pixel size ``(w, h)``."""
    notes: list[str] = []
    exif = exif if exif is not None else {}
    sub = _ifd(exif, EXIF_IFD, notes)
    taken = None
    if DATETIME_ORIGINAL in sub:
        taken = _date(sub[DATETIME_ORIGINAL], sub.get(OFFSET_TIME_ORIGINAL), "DateTimeOriginal", notes)
    if taken is None and DATETIME in exif:
        taken = _date(exif[DATETIME], sub.get(OFFSET_TIME), "DateTime", notes)
    make, model = (_text(exif.get(t)) if t in exif else "" for t in (MAKE, MODEL))
    for tag, v in ((MAKE, make), (MODEL, model)):
        if v is None:
            notes.append(f"{'Make' if tag == MAKE else 'Model'}: not text ({type(exif.get(tag)).__name__})")
    make, model = make or "", model or ""
    camera = model if make and model.lower().startswith(make.lower()) else f"{make} {model}".strip()
    camera = "".join(ch for ch in camera if ch.isprintable())[:200]
    gps = _gps(_ifd(exif, GPS_IFD, notes), notes)
    out = {k: v for k, v in (("taken", taken), ("camera", camera), ("gps", gps)) if v}
    with suppress(TypeError, ValueError):
        w, h = (int(x) for x in stored_size)
        orient = exif.get(ORIENTATION, 1)
        out["size"] = [h, w] if isinstance(orient, int) and 5 <= orient <= 8 else [w, h]
    if ORIENTATION in exif and not (isinstance(exif[ORIENTATION], int) and 1 <= exif[ORIENTATION] <= 8):
        notes.append(f"Orientation: {str(exif[ORIENTATION])[:20]!r} is not 1..8; the photo is read upright, as stored")
    if notes:
        out["notes"] = notes
    return out


def photo_meta(image) -> dict:
    """When, where, what and how large: a PIL image as opened (nothing decoded) -> the dict above."""
    try:
        exif = image.getexif()
    except Exception as e:  # noqa: BLE001 - a damaged EXIF block: the photo has none
        return {"size": list(image.size), "notes": [f"EXIF unreadable ({type(e).__name__})"]}
    return meta_from_exif(exif, image.size)


def mtime_taken(mtime_ns: int) -> str:
    """``--date-from-mtime``: a file's modification time as a capture time (local time of this machine,
    with its offset)."""
    return datetime.fromtimestamp(mtime_ns / 1e9).astimezone().replace(microsecond=0).isoformat()
