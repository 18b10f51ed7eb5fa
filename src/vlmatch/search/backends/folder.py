"""The index folder on disk: what belongs to it, one writer at a time, one consistent version of every
part after a kill at any point, and its collections as search reads them (:class:`FolderCollection`).

The manifest records a digest of each part and is sealed with the hash of its own content; a build or
update swaps parts in keeping ``PART.prev`` and commits by replacing ``manifest.json``; readers share
``.vlmatch.read.lock`` while opening, a writer holds it alone to swap (writer preference through
``.vlmatch.swap.lock``). The guarantees are listed in docs/search.md. Crash points, for tests:
``"commit:parts"`` (every part in place, the manifest not yet) and ``"commit:manifest"``.
"""

from __future__ import annotations

import functools
import hashlib
import json
import os
import re
import shutil
import sys
import threading
import time
from contextlib import contextmanager
from pathlib import Path

import numpy as np

from ... import io
from ...checkpoints.digest import checkpoint_digest
from ...errors import ConfigError, DataError, VlmatchError
from ...io import read_json, remove_dir, write_json
from ...models.base import Encoding
from ...weights import sha256_file, verify_sha256
from ..checks import COLLECTIONS as ITEM_FIELD  # collection -> the field its items carry (path, text)
from ..checks import read_items
from ..filters import Columns, Where
from ..stage1 import Stage1
from ..store import EncodingStore, open_arrays

FORMAT = 2
MANIFEST = "manifest.json"
LOCK = io.LOCK
READ_LOCK = ".vlmatch.read.lock"  # readers share it while opening; a writer takes it alone to swap parts
SWAP_LOCK = ".vlmatch.swap.lock"  # a writer waiting to swap holds it; readers pass through it before opening
CHECKPOINTS = ("model", "retriever")
COLLECTIONS = ("images", "captions")
PARTS = CHECKPOINTS + COLLECTIONS
# the files a collection's hashes cover: the first two tell two versions apart cheaply
COLLECTION_FILES = ("items.json", "enc/fields.json", "stage1.npy", "stage1.faiss")
# an index's own entries: its parts, manifest and work area, their .prev versions, the temporaries
# of vlmatch.io (".NAME.<12 hex>.tmp") and the lock
_OWNED = re.compile(r"\.?(manifest\.json|build|model|retriever|images|captions)(\.prev)?(\.[0-9a-f]{12}\.tmp)?")


# --- what belongs to an index --------------------------------------------------------------------

def _vlmatch_manifest(m) -> bool:
    return isinstance(m, dict) and isinstance(m.get("versions"), dict) and "vlmatch" in m["versions"]


def is_index_folder(path) -> bool:
    """``path`` holds a vlmatch index (of any format), or the start of one (a build took its lock there)."""
    path = Path(path)
    if (path / LOCK).is_file():
        return True
    try:
        return _vlmatch_manifest(read_json(path / MANIFEST))
    except DataError:
        return False


def _owned(p: Path) -> bool:
    return not p.is_symlink() and (p.name in (LOCK, READ_LOCK, SWAP_LOCK) or _OWNED.fullmatch(p.name) is not None)


def check_out(out, images=None, overwrite: bool = False) -> None:
    """Refuse, before anything is written, an ``--out`` inside or above the image folder, or holding anything
    but an index (unless ``overwrite``; even then, entries under an index's names that no index made)."""
    out = Path(out)
    if out.exists() and not out.is_dir():
        raise DataError(out, "is a file; --out must be a folder for the index")
    if images is not None:
        o, i = out.resolve(), Path(images).resolve()
        if o == i or i in o.parents:
            raise ConfigError(f"--out {out} is inside the image folder {images}: put the index outside it")
        if o in i.parents:
            raise ConfigError(f"--out {out} holds the image folder {images}: an index writes images/, model/, build/ "
                              f"... into its folder; put it outside {out}")
    if not out.is_dir():
        return
    ours = is_index_folder(out)
    foreign = sorted(p for p in out.iterdir() if not (ours and _owned(p)))
    if not foreign:
        return
    names = ", ".join(p.name + ("/" if p.is_dir() else "") for p in foreign[:4]) + (" ..." if len(foreign) > 4 else "")
    if not overwrite:
        raise ConfigError(f"--out {out} holds files that are not a vlmatch index ({names}); choose a new or empty "
                          "folder, or pass --overwrite to build there (only an index's own entries are replaced)")
    clash = [p.name for p in foreign if _owned(p)]
    if clash:
        raise ConfigError(f"--out {out}: {', '.join(clash)} did not come from a vlmatch index, and --overwrite replaces "
                          "only an index's own entries: move them away or choose another folder")


def writer_lock(out, what: str):
    """Hold the index folder's writer lock (:func:`vlmatch.io.writer_lock`); another writer is refused at once."""
    return io.writer_lock(out, what, "wait for it to finish (one build or update of an index at a time)")


SWAP_WAIT_S = 120.0  # the longest a writer waits for readers still opening the index before its swap


@contextmanager
def swapping(out):
    """Held by a writer while it changes parts in place (:func:`recover`, the swaps, :func:`commit`): no reader
    is opening meanwhile. It first takes ``.vlmatch.swap.lock`` (no new reader starts), then waits, at most
    :data:`SWAP_WAIT_S`, for the readers already opening."""
    out = Path(out)
    t0 = time.monotonic()

    def note():
        print(f"vlmatch: note: {out}: waiting for the readers opening the index to finish (new ones wait for this "
              f"swap; at most {SWAP_WAIT_S:g} s)", file=sys.stderr)

    with io.shared_lock(out / SWAP_LOCK, exclusive=True, waiting="swap:intent"), \
            io.shared_lock(out / READ_LOCK, exclusive=True, waiting="swap:wait", timeout=SWAP_WAIT_S, on_wait=note,
                           timed_out=f"readers kept the index open for {SWAP_WAIT_S:g} s, so its new version was not "
                                     "swapped in (nothing changed; the work done is kept in build/): run the same "
                                     "command again"):
        waited = time.monotonic() - t0
        if waited > 1:
            print(f"vlmatch: note: {out}: waited {waited:.1f} s for readers before the swap", file=sys.stderr)
        yield


@contextmanager
def reading(out):
    """Held by a reader from reading the manifest until every part is loaded: waits while a writer swaps parts
    or waits to swap (``.vlmatch.swap.lock``: a writer is never starved by readers)."""
    out = Path(out)  # the lock files are made only in an index folder (one with a manifest)
    create = (out / MANIFEST).is_file()
    with io.shared_lock(out / SWAP_LOCK, exclusive=False, waiting="open:wait", create=create):
        pass  # through the turnstile: a writer holding it is served first
    with io.shared_lock(out / READ_LOCK, exclusive=False, waiting="open:wait", create=create) as ok:
        yield ok


# --- integrity records ---------------------------------------------------------------------------

def seal(manifest: dict) -> str:
    body = {k: v for k, v in manifest.items() if k != "seal"}
    return hashlib.sha256(json.dumps(body, sort_keys=True, separators=(",", ":")).encode()).hexdigest()


def _records(manifest: dict) -> dict:
    """Part -> what the manifest recorded of it (a checkpoint digest, a collection's file hashes)."""
    out = {p: manifest[p]["digest"] for p in CHECKPOINTS if manifest.get(p)}
    out.update({c: info["files"] for c, info in manifest.get("collections", {}).items()})
    return out


def _mismatch(folder: Path, part: str, want, files=COLLECTION_FILES[:2]) -> DataError | None:
    """Why ``folder`` is not the version of ``part`` the manifest recorded (None: it is); a collection by ``files``."""
    if not folder.is_dir():
        return DataError(folder, "missing (an incomplete index)")
    if part in CHECKPOINTS:
        try:
            ok = checkpoint_digest(folder) == want
        except DataError as e:
            return e
        return None if ok else DataError(folder, f"not the checkpoint this index was built with (its files do not "
                                                 f"match the digest in {MANIFEST}): swapped or edited")
    for name in files:
        try:
            verify_sha256(folder / name, want[name], MANIFEST)
        except DataError as e:
            return e
    return None


def resolve(out, manifest: dict) -> dict[str, Path]:
    """Part -> the folder holding the version the manifest recorded: ``PART``, else ``PART.prev`` (a kill
    before the commit), told apart cheaply, then checked whole. A part with no matching version: DataError."""
    out = Path(out)
    found = {}
    for part, want in _records(manifest).items():
        first = None
        for folder in (out / part, out / f"{part}.prev"):
            problem = _mismatch(folder, part, want)
            if problem is None:
                if part in COLLECTIONS:
                    problem = _mismatch(folder, part, want, COLLECTION_FILES[2:])
                    if problem is not None:
                        raise DataError(problem.path, f"{problem.problem}; build the index again")
                    open_arrays(folder / "enc")  # the arrays fields.json describes (not hashed: too large)
                found[part] = folder
                break
            first = first or problem
        else:
            raise DataError(first.path, f"{first.problem}; build the index again")
    return found


def read_manifest(out) -> dict:
    """The manifest of an index folder, refused when it is not sealed by this format or was edited."""
    path = Path(out) / MANIFEST
    from ..checks import check_manifest

    m = check_manifest(path, read_json(path, "not an index folder (no manifest.json)"))  # its shape first
    if not _vlmatch_manifest(m):
        raise DataError(path, "not the manifest of a vlmatch index")
    return check_seal(m, path, FORMAT, f"format {FORMAT}, which records the hashes of every part")


def check_seal(m, where, fmt, reads: str) -> dict:
    """``m`` when it is a manifest of format ``fmt`` (this vlmatch ``reads`` it) whose seal matches its content."""
    if not isinstance(m, dict) or m.get("format") != fmt:
        raise DataError(where, f"an index of format {m.get('format') if isinstance(m, dict) else '?'} (this vlmatch "
                               f"reads {reads}): build it again")
    if m.get("seal") != seal(m):
        raise DataError(where, "edited after the index was written (its content does not match its seal): build the "
                               "index again")
    return m


def require_manifest(out) -> None:
    """Refuse a folder without ``manifest.json``, saying what it is instead."""
    out = Path(out)
    if not (out / MANIFEST).is_file():
        if (out / "build").is_dir():
            raise VlmatchError(f"{out}: the index build was interrupted; run the same `vlmatch index build` again "
                               "to resume it")
        raise DataError(out, "not an index folder (no manifest.json)")


def open_parts(out) -> tuple[dict, dict[str, Path]]:
    """(manifest, part -> folder) of an index folder, every record checked (see the module doc)."""
    require_manifest(out)
    manifest = read_manifest(out)
    return manifest, resolve(out, manifest)


def manifest_stamp(out):
    """Changes whenever the manifest is replaced (a reader that lost a race with a commit tries again)."""
    try:
        st = (Path(out) / MANIFEST).stat()
    except OSError:
        return None
    return st.st_ino, st.st_mtime_ns, st.st_size


# --- writing ---------------------------------------------------------------------------------------

def recover(out) -> None:
    """Before a build or update writes (under the lock): put each part's version the manifest records back
    under its own name and drop what a killed writer left (other versions, temporaries)."""
    out = Path(out)
    if not (out / MANIFEST).is_file():  # no index a reader could open: temporaries to clean at most
        return _recover(out)
    with swapping(out):  # parts move back under their names: no reader may resolve them meanwhile
        _recover(out)


def _recover(out: Path) -> None:
    for name in (*PARTS, MANIFEST):
        io.clean_stale(out / name)
    try:
        manifest = read_manifest(out)
    except DataError:
        return
    records = _records(manifest)
    for part in PARTS:
        main, prev = out / part, out / f"{part}.prev"
        if part not in records:  # added by a build killed before its commit
            remove_dir(main)
            remove_dir(prev)
        elif _mismatch(main, part, records[part]) is None:
            remove_dir(prev)
        elif prev.is_dir() and _mismatch(prev, part, records[part]) is None:
            remove_dir(main)
            os.replace(prev, main)
            io.fsync_path(out)


def commit(out, manifest: dict, written=PARTS) -> dict:
    """Record the ``written`` parts in ``manifest``, seal it, replace ``manifest.json`` (the commit), then remove
    the old versions, the parts it does not name and ``build/``; returns the manifest. Call it in :func:`swapping`."""
    out = Path(out)
    for p in CHECKPOINTS:
        if p in written and manifest.get(p):
            manifest[p]["digest"] = checkpoint_digest(out / p)
    for c, info in manifest.get("collections", {}).items():
        if c in written:
            info["files"] = {name: sha256_file(out / c / name) for name in COLLECTION_FILES}
    manifest["format"] = FORMAT
    manifest["seal"] = seal(manifest)
    io.crash_point("commit:parts")
    write_json(out / MANIFEST, manifest)
    io.crash_point("commit:manifest")
    records = _records(manifest)
    for part in PARTS:
        remove_dir(out / f"{part}.prev")
        if part not in records:
            remove_dir(out / part)
    shutil.rmtree(out / "build", ignore_errors=True)
    return manifest


# --- reading a collection -------------------------------------------------------------------------

class FolderCollection:
    """One collection of an index folder: ``items.json``, the FAISS stage 1, the stage-2 store; keys are rows."""

    def __init__(self, folder: Path, info: dict, template):
        self.folder = folder
        self.items = read_items(folder / "items.json", ITEM_FIELD.get(folder.name.removesuffix(".prev"), "path"))
        self.stage1 = Stage1(folder, info["stage1"])
        self.store = EncodingStore(folder / "enc", template)
        if not (len(self.items) == len(self.stage1) == len(self.store)):
            raise DataError(folder, f"inconsistent index: {len(self.items)} items, {len(self.stage1)} stage-1 vectors, "
                                    f"{len(self.store)} encodings")
        self.row_of = {it["id"]: r for r, it in enumerate(self.items)}
        self._columns = None
        # the latest few filters' rows (a page asks for the same filter again)
        self._mask = functools.lru_cache(maxsize=8)(Where.mask)
        self._lock = threading.Lock()

    def __len__(self) -> int:
        return len(self.items)

    def search(self, queries: np.ndarray, k: int, where=None) -> tuple[np.ndarray, np.ndarray]:
        where = Where.of(where)
        if where is None:
            return self.stage1.search(queries, k)
        with self._lock:  # the service searches from several threads
            if self._columns is None:  # the filterable columns of the table, built at the first filtered query
                self._columns = Columns(self.items)
            mask = self._mask(where, self._columns)
        return self.stage1.search_subset(queries, k, mask)

    def take(self, keys) -> Encoding:
        return self.store.take(keys)

    def items_of(self, keys) -> list[dict]:
        return [self.items[int(r)] for r in keys]

    def key_of(self, item_id: int) -> int | None:
        return self.row_of.get(item_id)

    def stage1_vectors(self, keys) -> np.ndarray:
        keys = np.asarray(keys, dtype=np.int64).reshape(-1)
        order = np.argsort(keys, kind="stable")  # read the memory map in file order
        out = np.empty((len(keys), self.stage1.vectors.shape[1]), dtype=np.float32)
        out[order] = np.asarray(self.stage1.vectors[keys[order]], dtype=np.float32)
        return out
