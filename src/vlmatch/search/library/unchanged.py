"""An indexed photo's file checked against what its row recorded (``size``, ``mtime_ns``, ``sha256``) before it is
explained, thumbnailed or served: the photo that was encoded is shown, or the error says it changed.

:func:`check_unchanged` stats the file and never opens one that is not a regular file (opening a FIFO waits for a
writer); a file whose mtime alone changed is hashed, through a descriptor opened without waiting, and the verdict is
kept per identity (path, device, inode, size, mtime, ctime). A row that records none of these (an index of
precomputed features) is not checked.
"""

from __future__ import annotations

import functools
import hashlib
import os
import stat

from ...errors import DataError

UPDATE = "run vlmatch index update"
_KINDS = ((stat.S_ISFIFO, "a FIFO (named pipe)"), (stat.S_ISSOCK, "a socket"), (stat.S_ISCHR, "a character device"),
          (stat.S_ISBLK, "a block device"), (stat.S_ISDIR, "a folder"))


class PhotoMissing(DataError):
    """The file of an indexed photo is gone."""


class PhotoChanged(DataError):
    """The file of an indexed photo is no longer the one indexed (another content, or not a regular file)."""


def kind_of(mode: int) -> str | None:
    """What a file of this ``st_mode`` is when it is not a regular file (None: a regular file)."""
    if stat.S_ISREG(mode):
        return None
    return next((name for test, name in _KINDS if test(mode)), "not a regular file")


def check_unchanged(row: dict, path) -> os.stat_result:
    """``path``'s stat when it is the file ``row`` recorded; else :class:`PhotoMissing` or :class:`PhotoChanged`
    naming the file and what changed (the file is opened only when its mtime alone changed)."""
    try:
        st = os.stat(path)
    except OSError as e:
        raise PhotoMissing(path, f"is no longer on disk ({e.strerror or type(e).__name__}); {UPDATE}") from None
    kind = kind_of(st.st_mode)
    if kind is not None:
        raise PhotoChanged(path, f"is {kind} now, not the photo indexed: refused unopened; {UPDATE}")
    size, mtime, digest = row.get("size"), row.get("mtime_ns"), row.get("sha256")
    if isinstance(size, int) and st.st_size != size:
        raise PhotoChanged(path, f"changed since indexing ({st.st_size} bytes, indexed {size}); {UPDATE}")
    if not isinstance(mtime, int) or st.st_mtime_ns == mtime:
        return st
    identity = (os.fspath(path), st.st_dev, st.st_ino, st.st_size, st.st_mtime_ns, st.st_ctime_ns)
    if not isinstance(digest, str) or not _same_content(identity, digest):
        raise PhotoChanged(path, f"changed since indexing (modified after it was encoded); {UPDATE}")
    return st


@functools.lru_cache(maxsize=4096)  # the verdict per file identity (path, device, inode, size, mtime, ctime)
def _same_content(identity: tuple, digest: str) -> bool:
    return _sha256(identity[0]) == digest


def _sha256(path) -> str | None:
    """The SHA-256 of a regular file's content; None when it cannot be read or is no longer a regular file
    (opened without waiting: a FIFO put in its place meanwhile does not block)."""
    try:
        fd = os.open(path, os.O_RDONLY | getattr(os, "O_NONBLOCK", 0) | getattr(os, "O_CLOEXEC", 0))
    except OSError:
        return None
    try:
        if not stat.S_ISREG(os.fstat(fd).st_mode):
            return None
        with open(fd, "rb", closefd=False) as f:
            return hashlib.file_digest(f, "sha256").hexdigest()
    except OSError:
        return None
    finally:
        os.close(fd)
