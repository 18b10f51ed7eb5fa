"""Atomic, durable writes: a temporary name, fsync, then rename, so a kill never leaves a half-written file or
folder under the final name. Permissions follow the user's umask; the umask is never changed. A folder
(:func:`atomic_dir`) is swapped in with the old version kept as ``NAME.prev`` until the new one is in, so after a
kill ``NAME``, else ``NAME.prev``, is complete (:func:`complete_dir`). One writer per folder at a time.
"""

from __future__ import annotations

import errno
import json
import os
import re
import secrets
import shutil
import stat
import tempfile
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from pathlib import Path

try:
    import fcntl
except ImportError:  # pragma: no cover - not a POSIX system: nothing to lock with
    fcntl = None

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
    """Whether ``path`` is written in place, never replaced by a rename: a device, a FIFO, a socket, or a link under
    ``/dev/`` or ``/proc/`` (``/dev/stdout``: the process's own output)."""
    if os.path.islink(path) and str(Path(path).absolute()).startswith(("/dev/", "/proc/")):
        return True
    try:
        mode = os.stat(path).st_mode
    except OSError:  # not there (yet): a new regular file
        return False
    return not (stat.S_ISREG(mode) or stat.S_ISDIR(mode))


@contextmanager
def atomic_path(path: str | os.PathLike) -> Iterator[Path]:
    """Yield a temporary path beside ``path``; on success fsync it and rename it onto ``path`` (a special file is
    written in place; a link keeps its link). A failed write is a DataError naming ``path``; the old file stays."""
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
    """``text`` encodable as UTF-8: a non-UTF-8 name's raw bytes become ``\\xNN`` (as ``ls -b``), other lone
    surrogates ``\\uXXXX``; with ``controls``, control characters too (a table row stays one line)."""
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


def read_npy(path, what: str, mmap_mode=None):
    """One .npy array (never pickled objects), or a one-line error naming the file."""
    import numpy as np

    from .errors import DataError

    path = Path(path)
    if not path.is_file():
        raise DataError(path, f"{what} not found")
    try:
        arr = np.load(path, mmap_mode=mmap_mode, allow_pickle=False)
    except Exception as e:
        raise DataError(path, f"not a readable .npy array: {e}") from None
    if not isinstance(arr, np.ndarray):  # np.load opens a .npz archive as a dict of arrays
        names = list(arr.files)
        arr.close()
        raise DataError(path, f"a .npz archive of {len(names)} array(s) {names[:5]}, not one .npy {what}: "
                              "save it with numpy.save")
    return arr


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
    """``dst``: a copy of the file or folder ``src`` out of hard links (copies where there are none); only for
    files never written in place again."""
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
    """Yield a fresh temporary folder; on success it replaces ``path`` whole. Steps, each a :func:`crash_point`:
    stale temporaries removed (cleaned), the new version fsynced (written), ``NAME`` renamed to ``NAME.prev``
    (old-moved), the new one renamed to ``NAME`` (new-in), ``NAME.prev`` removed (done). ``keep_prev``: the
    caller removes ``NAME.prev`` (:func:`remove_dir`) once it has recorded the new version."""
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
    """Hold ``folder``'s writer lock (``flock`` on ``folder/.vlmatch.lock``, recording ``process PID (what)``);
    another writer is refused at once: ``FOLDER is being written by process PID (what); BUSY``. A killed
    holder's lock is dropped by the system."""
    from .errors import VlmatchError

    folder = Path(folder)
    if fcntl is None:  # pragma: no cover
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
    """Hold ``flock`` on ``path`` (made if missing and ``create``), shared or ``exclusive``; before a wait,
    :func:`crash_point` (``waiting``) then ``on_wait``; past ``timeout`` seconds a VlmatchError ``PATH: TIMED_OUT``.
    Yields True, or False where the file cannot be opened (then nobody can write there to need it)."""
    if fcntl is None:  # pragma: no cover
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
