"""The photos of a folder: what an index build and update read (every photo file, a RAW with the JPEG of the
same shot beside it left out for that JPEG)."""

from __future__ import annotations

from pathlib import Path

from ..errors import DataError
from ..features.photo import PHOTO_SUFFIXES, file_head, sniff
from ..features.raw import pair_raws


def scan_folder(root: Path, pairs: list | None = None) -> list[str]:
    """Image files under ``root`` (recursively), as sorted POSIX paths relative to it: a photo suffix, or an image's
    first bytes. Hidden files are left out, and so is a camera RAW with a JPEG of the same shot beside it
    (:func:`~vlmatch.features.raw.pair_raws`; ``pairs`` gets those pairs)."""
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
    return sniff(file_head(path) or b"") is not None


def file_stat(root: Path, rel: str) -> dict:
    st = (root / rel).stat()
    return {"size": st.st_size, "mtime_ns": st.st_mtime_ns}
