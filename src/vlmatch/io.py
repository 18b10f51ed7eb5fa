"""Atomic, durable file and directory writes: write to a temporary name, fsync, then rename.

A crash (or a kill) part-way never leaves a half-written file or folder under the final name.
Files and folders get the permissions the user's umask gives (``0o666`` / ``0o777`` masked, as
``open`` and ``mkdir`` do); this module never changes the process umask.

Folders (:func:`atomic_dir`, used for the ``last/`` and ``best/`` checkpoints and the parts of a
search index) are swapped in these steps; the name in brackets is the hook :data:`crash_hook` is
called with after each step (tests kill the process there; other multi-step writes name their own
steps with :func:`crash_point`):

1. stale temporaries ``.NAME.*.tmp`` left beside ``NAME`` by a killed writer are removed   [cleaned]
2. the new version is written into a fresh ``.NAME.<random>.tmp``; every file in it and the
   folder itself are fsynced, so it is complete and durable before anything old goes     [written]
3. if ``NAME`` exists, an older ``NAME.prev`` is moved to the trash (a temporary name, then
   removed) and ``NAME`` is renamed to ``NAME.prev``; if ``NAME`` does not exist, ``NAME.prev``
   is the only complete version and is kept as it is                                     [old-moved]
4. the new version is renamed to ``NAME`` and the parent folder fsynced                   [new-in]
5. ``NAME.prev`` is moved to the trash and removed                                        [done]
   (with ``keep_prev`` the caller does this later, once it has recorded the new version)

Renames are atomic, so after a kill at any point ``NAME`` is complete if it exists, and otherwise
``NAME.prev`` is (the documented fallback: :func:`complete_dir`, used by resume and ``load_model``).
One writer per folder at a time.
"""

from __future__ import annotations

import errno
import json
import os
import re
import secrets
import shutil
import tempfile
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from pathlib import Path

crash_hook: Callable[[str], None] | None = None  # tests: called with the name of each crash_point passed


def crash_point(name: str) -> None:
    """Call :data:`crash_hook` (tests kill the process there) at a named step of a multi-step write."""
    if crash_hook is not None:
        crash_hook(name)


def _temp_name(path: Path) -> Path:
    return path.with_name(f".{path.name}.{secrets.token_hex(6)}.tmp")


def fsync_path(path: str | os.PathLike) -> None:
    """fsync a file or a folder (a folder's fsync makes the renames in it durable)."""
    fd = os.open(path, os.O_RDONLY)
    try:
        os.fsync(fd)
    except OSError:  # some file systems cannot fsync a folder; nothing more can be done there
        pass
    finally:
        os.close(fd)


def is_special(path: str | os.PathLike) -> bool:
    """Whether ``path`` names something a rename must never replace, so it is written in place: a device, a FIFO
    or a socket (``/dev/full``, ``/dev/null``, a named pipe a reader waits on), or a link under ``/dev/`` or
    ``/proc/`` (``/dev/stdout``, ``/proc/self/fd/1``: the process's own output, whatever that output is; a regular
    file in ``/dev/shm`` is written as any other)."""
    import stat

    if os.path.islink(path) and str(Path(path).absolute()).startswith(("/dev/", "/proc/")):
        return True
    try:
        mode = os.stat(path).st_mode
    except OSError:  # not there (yet): a new regular file
        return False
    return not (stat.S_ISREG(mode) or stat.S_ISDIR(mode))


@contextmanager
def atomic_path(path: str | os.PathLike) -> Iterator[Path]:
    """Yield a temporary path beside ``path``; on success fsync it and rename it onto ``path``. A special file
    (:func:`is_special`: a device, a FIFO, ``/dev/stdout``) is yielded itself and written in place, never
    replaced; a link to a regular file keeps its link (its target is replaced). A write that fails (a full disk,
    ``/dev/full``) is a DataError naming ``path``; the old file is left as it was."""
    from .errors import DataError

    path = Path(path)
    if path.is_dir():
        raise DataError(path, "is a folder; give a file name")
    if is_special(path):
        try:
            yield path
        except OSError as e:
            raise DataError(path, f"could not be written: {e.strerror or e}") from None
        return
    if path.is_symlink():  # the link stays a link: its target is written
        path = Path(os.path.realpath(path))
    path.parent.mkdir(parents=True, exist_ok=True)
    while True:
        tmp = _temp_name(path)
        try:
            os.close(os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o666))  # the umask applies
            break
        except FileExistsError:  # pragma: no cover - 48 random bits
            continue
    try:
        try:
            yield tmp
            fsync_path(tmp)
            os.replace(tmp, path)
        except OSError as e:  # ENOSPC, EDQUOT, EIO: named, the old file untouched
            raise DataError(path, f"could not be written: {e.strerror or e}"
                                  + (" (the disk is full); the old file, if any, is as it was"
                                     if e.errno in (errno.ENOSPC, errno.EDQUOT) else "")) from None
        fsync_path(path.parent)
    finally:
        if tmp.exists():
            tmp.unlink()


def check_writable(path: str | os.PathLike) -> None:
    """Refuse, before any work, an output path that cannot be created (a DataError naming it)."""
    from .errors import DataError

    path = Path(path)
    if path.is_dir():
        raise DataError(path, "is a folder; give a file name")
    if is_special(path) and os.path.exists(path):  # written in place: it must take writes, nothing else
        if not os.access(path, os.W_OK):
            raise DataError(path, "cannot be written: no permission")
        return
    parent = path.parent
    while not parent.exists():
        parent = parent.parent
    if not parent.is_dir():
        raise DataError(path, f"cannot be created: {parent} is a file, not a folder")
    if not os.access(parent, os.W_OK | os.X_OK):
        raise DataError(path, f"cannot be created: no permission to write in {parent}")
    try:  # a folder the permissions allow may still refuse files (/proc, /sys, a read-only mount): try one
        fd, probe = tempfile.mkstemp(prefix=".vlmatch-probe-", dir=parent)
    except OSError as e:
        raise DataError(path, f"cannot be created: {parent} takes no new files ({e.strerror})") from None
    os.close(fd)
    os.unlink(probe)


_SURROGATE = re.compile("[\ud800-\udfff]")
_CONTROL = re.compile("[\x00-\x1f\x7f-\x9f]")
_NAMED = {"\n": "\\n", "\r": "\\r", "\t": "\\t"}


def _escape(m: re.Match) -> str:
    o = ord(m.group())
    if m.group() in _NAMED:
        return _NAMED[m.group()]
    if 0xDC80 <= o <= 0xDCFF:  # a byte of a file name that is not UTF-8 (Python's surrogateescape)
        return f"\\x{o - 0xDC00:02x}"
    return f"\\x{o:02x}" if o < 0x100 else f"\\u{o:04x}"


def printable(text: str, controls: bool = False) -> str:
    """``text`` as characters that encode to UTF-8: the raw bytes of a name that is not UTF-8 become
    ``\\xNN`` (as ``ls -b`` shows them), other lone surrogates ``\\uXXXX``; with ``controls``,
    line breaks, tabs and other control characters too (one table row stays one line)."""
    text = _SURROGATE.sub(_escape, text)
    return _CONTROL.sub(_escape, text) if controls else text


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


def write_bytes(path, data: bytes) -> None:
    with atomic_path(path) as tmp:
        tmp.write_bytes(data)


def write_json(path, obj, indent: int | None = 2) -> None:
    write_text(path, json.dumps(obj, indent=indent, sort_keys=False) + "\n")


def save_npy(path, array) -> None:
    import numpy as np

    path = Path(path)
    with atomic_path(path) as tmp:
        with open(tmp, "wb") as f:
            np.save(f, array)


def append_line(path, line: str) -> None:
    """Append one line (used for JSON-lines logs); a line is written in one call."""
    with open(path, "a", encoding="utf-8") as f:
        f.write(line.rstrip("\n") + "\n")
        f.flush()


def remove_dir(path: str | os.PathLike) -> None:
    """Remove a folder without ever leaving a half-removed one under its name: rename, then delete."""
    path = Path(path)
    if path.exists():
        trash = _temp_name(path)
        os.replace(path, trash)
        shutil.rmtree(trash)


def link_tree(src: str | os.PathLike, dst: str | os.PathLike) -> None:
    """Make ``dst`` a copy of the file or folder ``src`` out of hard links (no data copied, ``src``
    left whole), or of copies where the file system has no hard links. Only for files that are never
    written in place again (both names share one content)."""
    src, dst = Path(src), Path(dst)
    if src.is_dir():
        os.mkdir(dst, 0o777)
        for p in src.iterdir():
            link_tree(p, dst / p.name)
        return
    try:
        os.link(src, dst)
    except OSError:
        shutil.copy2(src, dst)


def _fsync_tree(root: Path) -> None:
    for folder, _, files in os.walk(root):
        for f in files:
            fsync_path(os.path.join(folder, f))
        fsync_path(folder)


def clean_stale(path: str | os.PathLike) -> list[Path]:
    """Remove the temporaries a killed :func:`atomic_dir` left beside ``path``; returns them."""
    path = Path(path)
    stale = sorted(path.parent.glob(f".{path.name}.*.tmp"))  # also matches the trash of NAME.prev
    for p in stale:
        shutil.rmtree(p) if p.is_dir() and not p.is_symlink() else p.unlink()
    return stale


@contextmanager
def atomic_dir(path: str | os.PathLike, keep_prev: bool = False) -> Iterator[Path]:
    """Yield a fresh temporary folder; on success it replaces ``path`` whole (steps in the module doc).

    ``keep_prev``: stop after step 4, leaving the old version as ``NAME.prev`` until the caller has
    recorded the new one elsewhere (an index's manifest) and removes it with :func:`remove_dir`."""
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    clean_stale(path)
    crash_point("cleaned")
    tmp = _temp_name(path)
    os.mkdir(tmp, 0o777)  # the umask applies (tempfile.mkdtemp would make it 0700)
    try:
        yield tmp
        _fsync_tree(tmp)
        crash_point("written")
        prev = path.with_name(path.name + ".prev")
        if path.exists():
            remove_dir(prev)
            os.replace(path, prev)
        fsync_path(path.parent)
        crash_point("old-moved")
        os.replace(tmp, path)
        fsync_path(path.parent)
        crash_point("new-in")
        if not keep_prev:
            remove_dir(prev)
            crash_point("done")
    finally:
        if tmp.exists():
            shutil.rmtree(tmp)


def complete_dir(path: str | os.PathLike) -> Path | None:
    """The complete version of a folder written by :func:`atomic_dir`: ``path``, else ``path.prev``."""
    path = Path(path)
    if path.is_dir():
        return path
    prev = path.with_name(path.name + ".prev")
    return prev if prev.is_dir() else None


LOCK = ".vlmatch.lock"


@contextmanager
def writer_lock(folder: str | os.PathLike, what: str, busy: str) -> Iterator[None]:
    """Hold ``folder``'s writer lock (``flock`` on ``folder/.vlmatch.lock``, which records ``process PID
    (what)``) for the duration; another writer is refused at once with a VlmatchError: ``FOLDER is being
    written by process PID (what); BUSY``. The system drops the lock when its holder dies, so a killed
    writer never leaves the folder locked. Used by index builds and updates and by training runs."""
    from .errors import VlmatchError

    folder = Path(folder)
    try:
        import fcntl
    except ImportError:  # pragma: no cover - not a POSIX system: nothing to lock with
        yield
        return
    fd = os.open(folder / LOCK, os.O_RDWR | os.O_CREAT, 0o666)
    try:
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            holder = os.pread(fd, 200, 0).decode("utf-8", "replace").strip() or "another process"
            raise VlmatchError(f"{folder} is being written by {holder}; {busy}") from None
        os.ftruncate(fd, 0)
        os.pwrite(fd, f"process {os.getpid()} ({what})\n".encode(), 0)
        yield
    finally:
        os.close(fd)  # closing drops the lock


@contextmanager
def shared_lock(path: str | os.PathLike, exclusive: bool, waiting: str, *, create: bool = True,
                timeout: float | None = None, on_wait: Callable[[], None] | None = None,
                timed_out: str = "") -> Iterator[bool]:
    """Hold ``flock`` on the file ``path`` (made if missing and ``create``), shared or ``exclusive``,
    waiting for it; :func:`crash_point` is called with ``waiting`` just before a wait (tests see who
    waits), then ``on_wait`` (to say so). With ``timeout``, a wait longer than that many seconds is a
    VlmatchError ``PATH: TIMED_OUT``. Yields True, or False where the file cannot be opened (missing, or
    in a folder this user may only read): nothing to lock with, and nobody can write there to need it."""
    try:
        import fcntl
    except ImportError:  # pragma: no cover - not a POSIX system
        yield False
        return
    try:
        fd = os.open(path, os.O_RDWR | (os.O_CREAT if create else 0), 0o666)
    except OSError:
        try:
            fd = os.open(path, os.O_RDONLY)
        except OSError:
            yield False
            return
    mode = fcntl.LOCK_EX if exclusive else fcntl.LOCK_SH
    try:
        try:
            fcntl.flock(fd, mode | fcntl.LOCK_NB)
        except BlockingIOError:
            crash_point(waiting)
            if on_wait is not None:
                on_wait()
            if timeout is None:
                fcntl.flock(fd, mode)
            else:
                _poll_lock(fd, mode, timeout, path, timed_out)
        yield True
    finally:
        os.close(fd)


def _poll_lock(fd: int, mode: int, timeout: float, path, timed_out: str) -> None:
    import fcntl
    import time

    from .errors import VlmatchError

    deadline = time.monotonic() + timeout
    while True:
        time.sleep(0.02)
        try:
            fcntl.flock(fd, mode | fcntl.LOCK_NB)
            return
        except BlockingIOError:
            if time.monotonic() >= deadline:
                raise VlmatchError(f"{path}: {timed_out or f'still locked after {timeout:g} s'}") from None
