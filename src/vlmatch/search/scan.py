"""The photos of a folder: what an index build and update read (every photo file, a RAW with the JPEG of the
same shot beside it left out for that JPEG)."""

from __future__ import annotations

from pathlib import Path

from ..errors import DataError
from ..features.photo import PHOTO_SUFFIXES, sniff
from ..features.raw import pair_raws


def scan_folder(root: Path, pairs: list | None = None) -> list[str]:
    """Image files under ``root`` (recursively), as sorted POSIX paths relative to it: every file with a
    photo suffix (:data:`~vlmatch.features.photo.PHOTO_SUFFIXES`; what it holds is read from its content
    when it is encoded) and every other file whose first bytes are an image's (a photo saved without its
    suffix). Hidden files (``.name``) are left out, and so is a camera RAW with a JPEG of the same shot
    beside it (:func:`~vlmatch.features.raw.pair_raws`; ``pairs`` gets those pairs)."""
    if not root.is_dir():
        raise DataError(root, "image folder not found")
    files = sorted(p.relative_to(root).as_posix() for p in root.rglob("*")
                   if not p.name.startswith(".") and p.is_file() and (p.suffix.lower() in PHOTO_SUFFIXES
                                                                     or _image_content(p)))
    if not files:
        raise DataError(root, f"no images ({', '.join(sorted(PHOTO_SUFFIXES))})")
    files, paired = pair_raws(files)
    if pairs is not None:
        pairs.extend(paired)
    return files


def _image_content(path: Path) -> bool:
    try:
        with open(path, "rb") as f:
            return sniff(f.read(32)) is not None
    except OSError:
        return False


def file_stat(root: Path, rel: str) -> dict:
    st = (root / rel).stat()
    return {"size": st.st_size, "mtime_ns": st.st_mtime_ns}
