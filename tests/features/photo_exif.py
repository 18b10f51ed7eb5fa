"""Photos with EXIF written by the tests (PIL's Image.Exif): dates, offsets, camera, GPS, orientation."""

from __future__ import annotations

from pathlib import Path

import numpy as np
from PIL import Image
from PIL.TiffImagePlugin import IFDRational


def dms(deg: float) -> tuple:
    """Decimal degrees -> EXIF (degrees, minutes, seconds) rationals."""
    d = int(deg)
    m = int((deg - d) * 60)
    s = round((deg - d - m / 60) * 3600 * 1000)
    return IFDRational(d, 1), IFDRational(m, 1), IFDRational(s, 1000)


def exif_of(taken=None, offset=None, datetime_=None, make=None, model=None, gps=None, orientation=None,
            raw_gps=None) -> Image.Exif:
    ex = Image.Exif()
    if make is not None:
        ex[271] = make
    if model is not None:
        ex[272] = model
    if orientation is not None:
        ex[274] = orientation
    if datetime_ is not None:
        ex[306] = datetime_
    sub = ex.get_ifd(0x8769)
    if taken is not None:
        sub[36867] = taken
    if offset is not None:
        sub[36881] = offset
    if gps is not None:
        lat, lon = gps
        ex.get_ifd(0x8825).update({1: "N" if lat >= 0 else "S", 2: dms(abs(lat)), 3: "E" if lon >= 0 else "W",
                                   4: dms(abs(lon))})
    if raw_gps is not None:
        ex.get_ifd(0x8825).update(raw_gps)
    return ex


def save_photo(path: Path, size=(40, 30), seed: int = 0, **exif) -> Path:
    """A small JPEG of random pixels with the EXIF of :func:`exif_of`."""
    path.parent.mkdir(parents=True, exist_ok=True)
    rng = np.random.default_rng(seed)
    Image.fromarray(rng.integers(0, 255, (size[1], size[0], 3), dtype=np.uint8)).save(
        path, "JPEG", quality=90, exif=exif_of(**exif))
    return path
