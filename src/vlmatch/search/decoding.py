"""Decoding photos in worker processes beside the backbone (a 12-megapixel HEIC takes about half a second of one
core to decode): the build's reader thread hands each batch's files to a forked pool, which returns only the shrunk
pixels (:func:`vlmatch.search.inputs.read_image`) while the backbone encodes the previous batch; a file's problem
travels back as its one-line message.

A forked worker inherits the parent's open files, ``flock`` s included: left behind by a ``kill -9`` of the build,
it would keep ``.vlmatch.lock`` held. So each worker first drops its copies of the lock files and ends itself within
:data:`WATCH_S` of its parent's death (:func:`_worker_start`).
"""

from __future__ import annotations

import multiprocessing as mp
import os
import threading
import time
from concurrent.futures import ProcessPoolExecutor
from contextlib import contextmanager
from pathlib import Path

MIN_FILES = 16  # fewer photos than this: forking would cost more than it saves
WATCH_S = 0.2  # how often a worker checks that its parent lives


def decode_workers(n_files: int) -> int:
    """How many decoding processes a build of ``n_files`` photos gets (0: none, decode in the reader thread)."""
    raw = os.environ.get("VLMATCH_DECODE_WORKERS")
    if "fork" not in mp.get_all_start_methods():
        return 0
    if raw is not None:
        try:
            n = int(raw)
        except ValueError:
            return 0
        return n if n > 1 else 0
    return (os.cpu_count() or 1) if n_files >= MIN_FILES and (os.cpu_count() or 1) > 1 else 0


@contextmanager
def decoder_pool(n_files: int):
    """A process pool decoding photos (or None where :func:`decode_workers` says none)."""
    n = decode_workers(n_files)
    if not n:
        yield None
        return
    pool = ProcessPoolExecutor(n, mp_context=mp.get_context("fork"), initializer=_worker_start,
                               initargs=(os.getpid(),))
    try:
        yield pool
    finally:
        pool.shutdown(wait=True, cancel_futures=True)


def _worker_start(parent: int) -> None:
    """In each worker, first: drop the inherited lock files, and end the worker when ``parent`` is gone."""
    _drop_inherited_locks()
    if os.getppid() != parent:  # the parent died while this worker started
        os._exit(1)

    def watch():
        while os.getppid() == parent:  # a dead parent's children are handed to another (init, a subreaper)
            time.sleep(WATCH_S)
        os._exit(1)

    threading.Thread(target=watch, name="vlmatch-parent-watch", daemon=True).start()


def _drop_inherited_locks() -> None:
    """Point each inherited descriptor of a lock file (``.vlmatch.lock``, a Milvus-lite ``LOCK``...) at /dev/null,
    so that the lock is the parent's alone; its number stays valid for whatever owns it. Without /proc, nothing is
    dropped and the parent watch alone ends the worker."""
    try:
        entries = list(Path("/proc/self/fd").iterdir())
    except OSError:
        return
    null = os.open(os.devnull, os.O_RDWR)
    try:
        for entry in entries:
            try:
                target = os.readlink(entry)
            except OSError:  # the listing's own descriptor, closed since
                continue
            fd = int(entry.name)
            if fd > 2 and fd != null and target.startswith("/") and os.path.basename(target).lower().endswith("lock"):
                os.dup2(null, fd, inheritable=False)
    finally:
        os.close(null)


def read_one(args: tuple):
    """In a worker: ``(rel, pixels, row meta, None, False)``, or ``(rel, None, None, (path, problem), no_preview)``
    for a file that cannot be read (the error's class does not survive pickling; its words do)."""
    from ..errors import DataError
    from ..features.raw import NoPreview
    read_image, root, rel, size, date_from_mtime = args  # read_image: vlmatch.search.inputs' (pickled by name)
    try:
        pixels, meta = read_image(Path(root), rel, size, date_from_mtime)
    except DataError as e:
        return rel, None, None, (e.path, e.problem), isinstance(e, NoPreview)
    return rel, pixels, meta, None, False
