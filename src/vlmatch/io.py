"""Atomic file and directory writes: write to a temporary name, then rename.

A crash (or a kill) part-way never leaves a half-written file under the final name.
"""

from __future__ import annotations

import json
import os
import shutil
import tempfile
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

import numpy as np

_UMASK = os.umask(0)
os.umask(_UMASK)


@contextmanager
def atomic_path(path: str | os.PathLike) -> Iterator[Path]:
    """Yield a temporary path beside ``path``; on success rename it onto ``path``."""
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(prefix=f".{path.name}.", suffix=".tmp", dir=path.parent)
    os.close(fd)
    tmp = Path(tmp)
    try:
        yield tmp
        os.chmod(tmp, 0o666 & ~_UMASK)  # mkstemp makes 0600 files; give the usual permissions
        os.replace(tmp, path)
    finally:
        if tmp.exists():
            tmp.unlink()


def read_json(path, missing: str = "file not found"):
    """Parse a JSON file; a missing or malformed file is a DataError naming it."""
    from .errors import DataError

    path = Path(path)
    if not path.is_file():
        raise DataError(path, missing)
    try:
        return json.loads(path.read_text(encoding="utf-8"))
    except (UnicodeDecodeError, json.JSONDecodeError) as e:
        raise DataError(path, f"not valid JSON: {e}") from None


def write_text(path, text: str) -> None:
    with atomic_path(path) as tmp:
        tmp.write_text(text, encoding="utf-8")


def write_json(path, obj, indent: int | None = 2) -> None:
    write_text(path, json.dumps(obj, indent=indent, sort_keys=False) + "\n")


def save_npy(path, array: np.ndarray) -> None:
    path = Path(path)
    with atomic_path(path) as tmp:
        with open(tmp, "wb") as f:
            np.save(f, array)


def append_line(path, line: str) -> None:
    """Append one line (used for JSON-lines logs); a line is written in one call."""
    with open(path, "a", encoding="utf-8") as f:
        f.write(line.rstrip("\n") + "\n")
        f.flush()


@contextmanager
def atomic_dir(path: str | os.PathLike) -> Iterator[Path]:
    """Yield a fresh temporary directory; on success it replaces ``path`` whole.

    The old directory is first moved to ``path.prev`` and removed only after the new one is in
    place, so a reader always finds one complete version (``path`` or ``path.prev``).
    """
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = Path(tempfile.mkdtemp(prefix=f".{path.name}.", suffix=".tmp", dir=path.parent))
    try:
        yield tmp
        prev = path.with_name(path.name + ".prev")
        if prev.exists():
            shutil.rmtree(prev)
        if path.exists():
            os.replace(path, prev)
        os.replace(tmp, path)
        if prev.exists():
            shutil.rmtree(prev)
    finally:
        if tmp.exists():
            shutil.rmtree(tmp)


def complete_dir(path: str | os.PathLike) -> Path | None:
    """The complete version of a directory written by :func:`atomic_dir`, if any."""
    path = Path(path)
    if path.is_dir():
        return path
    prev = path.with_name(path.name + ".prev")
    return prev if prev.is_dir() else None
