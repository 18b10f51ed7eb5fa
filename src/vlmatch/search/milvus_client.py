"""Talking to Milvus for an index: the connection, the collections' names and schemas, the
properties that hold the manifest, the pending work and the writers' lock.

A vlmatch collection NAME on a Milvus server is a set of Milvus collections:

    NAME                        a tiny anchor collection; its properties hold the index's state:
                                ``vlmatch.manifest`` (the committed manifest, sealed as the folder's),
                                ``vlmatch.pending`` (what an unfinished build or update has done),
                                ``vlmatch.lock`` (the one writer)
    NAME__g<G>_images           per image: ``id`` (primary key), ``item`` (its table row, JSON),
                                ``s1`` (the stage-1 vector, FLOAT_VECTOR with an IP index)
    NAME__g<G>_images_enc       per image and chunk of its stage-2 encoding: ``pk`` = id * 4096 + chunk,
                                ``id``, ``chunk``, ``enc`` (FLOAT16_VECTOR where the server has it,
                                else float16 pairs packed in FLOAT_VECTOR), ``extra`` (JSON: its
                                small non-float fields)
    NAME__g<G>_captions[_enc]   the same for an indexed caption file

A build writes a new generation G and commits by writing ``vlmatch.manifest`` last (it names G);
readers only ever open the generation the manifest names. Milvus's documented limits shape the
layout: a vector field holds at most 32,768 dimensions (a 7 x 7 x 512 encoding, 25,088 values, is one
row; a 14 x 14 x 512 one, 100,352, four FLOAT16_VECTOR rows or two packed ones), and one insert or
query RPC carries at most 64 MB (writes and reads are cut into RPCs of at most :data:`RPC_BYTES`).
"""

from __future__ import annotations

import json
import os
import re
import socket
import time

from ..errors import ConfigError, DataError, VlmatchError

TOKEN_ENV = "VLMATCH_MILVUS_TOKEN"
MAX_DIM = 32_768  # Milvus: dimensions of one vector field
RPC_BYTES = 48 * 2**20  # under Milvus's 64 MB per insert / query RPC, with room for the rest of the message
MAX_RESULTS = 16_384  # Milvus: rows one search (topk) or one query returns
CHUNK_SLOTS = 4096  # pk = id * CHUNK_SLOTS + chunk
MANIFEST = "vlmatch.manifest"
PENDING = "vlmatch.pending"
LOCK = "vlmatch.lock"
LOCK_STALE_S = 600  # a lock whose writer has not written for this long (on another host) is taken over
FORMAT = "milvus-1"
_NAME = re.compile(r"[A-Za-z_][A-Za-z0-9_]{0,179}")


def pymilvus():
    try:
        import pymilvus as pm
    except ImportError:
        raise VlmatchError("the Milvus backend needs pymilvus: pip install 'vlmatch[milvus]' (pymilvus, and "
                           "milvus-lite for a local .db file)") from None
    return pm


def check_name(name: str) -> str:
    if not isinstance(name, str) or not _NAME.fullmatch(name) or "__" in name:
        raise ConfigError(f"--collection {name!r}: a Milvus collection name is a letter or _ then letters, digits "
                          "and single underscores (at most 180 characters)")
    return name


def connect(uri: str, create: bool = True):
    """A MilvusClient for ``uri`` (a milvus-lite ``.db`` path or a server URL); the token, if any, from
    ``$VLMATCH_MILVUS_TOKEN`` (never from the command line). ``create=False`` (a search, an open): a
    milvus-lite database that does not exist is an error, never made."""
    pm = pymilvus()
    if not uri:
        raise ConfigError("--milvus-uri is empty: give a milvus-lite .db file or a server URL (http://host:19530)")
    lite = uri.endswith(".db")
    if lite:
        check_lite(uri, create)
    try:
        with _quiet_lite():
            return pm.MilvusClient(uri=uri, token=os.environ.get(TOKEN_ENV, ""))
    except Exception as e:  # noqa: BLE001 - pymilvus raises several kinds; one line names the server
        holder = lite_holder(uri) if lite else None
        if holder is not None:
            raise VlmatchError(f"{uri}: another process holds this milvus-lite database ({holder}); milvus-lite "
                               "opens a .db in one process at a time: wait for it to finish (a build or update "
                               "holds it to its end), or use a Milvus server for several processes") from None
        raise VlmatchError(f"cannot connect to Milvus at {uri}: {_short(e)}") from None


# --- milvus-lite: a .db is a folder, opened by one process at a time (an flock on its LOCK file) ----

LITE_LOCK = "LOCK"


def check_lite(uri: str, create: bool) -> None:
    """Refuse, in one line, a milvus-lite path that is not (and cannot become) a milvus-lite database: a
    missing folder above it, a file (milvus-lite keeps a .db as a folder), a folder of other files, or,
    with ``create=False``, nothing there at all."""
    path = os.path.abspath(uri)
    parent = os.path.dirname(path)
    if not os.path.isdir(parent):
        raise DataError(parent, "folder of the milvus-lite .db file not found")
    if not os.path.exists(path):
        if not create:
            raise DataError(uri, "no milvus-lite database there (a search or an open creates nothing): build the "
                                 "index first with `vlmatch index build --backend milvus --milvus-uri ...`")
        return
    if not os.path.isdir(path):
        raise DataError(uri, "is a file, not a milvus-lite database (milvus-lite keeps a .db as a folder it made): "
                             "give another --milvus-uri")
    if os.listdir(path) and not os.path.isfile(os.path.join(path, LITE_LOCK)):
        raise DataError(uri, "is a folder of other files, not a milvus-lite database: give another --milvus-uri")


def lite_holder(uri: str) -> str | None:
    """``process PID (its command)`` of another process that holds the milvus-lite database ``uri`` open
    (its LOCK file flocked), "another process" where the system does not say which; None when it is free."""
    import fcntl

    lock = os.path.join(os.path.abspath(uri), LITE_LOCK)
    try:
        fd = os.open(lock, os.O_RDONLY)
    except OSError:
        return None
    try:
        try:
            fcntl.flock(fd, fcntl.LOCK_SH | fcntl.LOCK_NB)  # free (or held by this process): not another's
            fcntl.flock(fd, fcntl.LOCK_UN)
            return None
        except BlockingIOError:
            pass
        st = os.fstat(fd)
    finally:
        os.close(fd)
    pid = _flock_pid(st.st_ino)
    if pid is None:
        return "another process"
    try:
        with open(f"/proc/{pid}/cmdline", "rb") as f:
            cmd = " ".join(a.decode("utf-8", "replace") for a in f.read().split(b"\0") if a)
    except OSError:
        cmd = ""
    return f"process {pid}" + (f" ({' '.join(cmd.split())[:80]})" if cmd else "")


def _flock_pid(inode: int) -> int | None:
    """The process holding an flock on the file with ``inode`` (Linux's /proc/locks), None if unknown."""
    try:
        with open("/proc/locks", encoding="ascii", errors="replace") as f:
            for line in f:
                parts = line.split()
                if len(parts) >= 6 and parts[1] == "FLOCK" and parts[5].rsplit(":", 1)[-1] == str(inode):
                    pid = int(parts[4])
                    if pid != os.getpid():
                        return pid
    except (OSError, ValueError):
        return None
    return None


class _quiet_lite:
    """milvus-lite logs a full traceback when it cannot open a .db (another process holds it): the error
    is said in one line instead, so its logger is silenced while connecting."""

    def __enter__(self):
        import logging

        self.loggers = [logging.getLogger(n) for n in ("milvus_lite", "milvus_lite.server_manager")]
        self.was = [g.disabled for g in self.loggers]
        for g in self.loggers:
            g.disabled = True

    def __exit__(self, *exc):
        for g, was in zip(self.loggers, self.was, strict=True):
            g.disabled = was


def _short(e: Exception) -> str:
    msg = getattr(e, "message", None) or str(e)
    return " ".join(str(msg).split())[:300]


def part_name(name: str, gen: int, coll: str, enc: bool = False) -> str:
    return f"{name}__g{gen}_{coll}" + ("_enc" if enc else "")


def generations(client, name: str) -> set[int]:
    """Generations with a Milvus collection on the server (committed, pending or left over)."""
    pat = re.compile(re.escape(name) + r"__g(\d+)_")
    return {int(m.group(1)) for c in client.list_collections() if (m := pat.match(c))}


def drop_generation(client, name: str, gen: int) -> None:
    for c in client.list_collections():
        if c.startswith(f"{name}__g{gen}_"):
            client.drop_collection(c)


# --- the anchor collection and its properties ---------------------------------------------------

def ensure_anchor(client, name: str) -> None:
    pm = pymilvus()
    if client.has_collection(name):
        return
    schema = pm.MilvusClient.create_schema(auto_id=False, enable_dynamic_field=False)
    schema.add_field("pk", pm.DataType.INT64, is_primary=True)
    schema.add_field("v", pm.DataType.FLOAT_VECTOR, dim=2)
    ip = client.prepare_index_params()
    ip.add_index("v", index_type="FLAT", metric_type="IP")
    client.create_collection(name, schema=schema, index_params=ip, consistency_level="Strong")


def read_props(client, name: str) -> dict:
    if not client.has_collection(name):
        return {}
    return dict(client.describe_collection(name).get("properties") or {})


def read_prop(client, name: str, key: str):
    raw = read_props(client, name).get(key)
    if raw is None or raw == "":
        return None
    try:
        return json.loads(raw)
    except ValueError:
        raise DataError(f"{name}:{key}", "not JSON (edited by hand?): drop the collection and build it again") from None


def write_prop(client, name: str, key: str, value) -> None:
    client.alter_collection_properties(name, properties={key: json.dumps(value, sort_keys=True)})


def drop_prop(client, name: str, key: str) -> None:
    if key in read_props(client, name):
        client.drop_collection_properties(name, property_keys=[key])


# --- one writer at a time --------------------------------------------------------------------------

def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    return True


class WriterLock:
    """The ``vlmatch.lock`` property: taken before a build or update writes, refreshed as it goes,
    dropped at its end. Another live writer is refused at once; the lock of a dead process on this
    host, or of a writer silent for :data:`LOCK_STALE_S`, is taken over. (Milvus has no compare-and-
    set: the lock is written, then read back, so two writers starting in the same instant are told
    apart by its token.)"""

    def __init__(self, client, name: str, what: str):
        self.client, self.name, self.what = client, name, what
        self.me = {"host": socket.gethostname(), "pid": os.getpid(), "what": what, "token": os.urandom(8).hex()}

    def _free(self, held: dict | None) -> bool:
        if not held:
            return True
        if held.get("host") == self.me["host"]:
            return not _alive(int(held.get("pid", -1)))
        return time.time() - float(held.get("beat", 0)) > LOCK_STALE_S

    def __enter__(self) -> WriterLock:
        held = read_prop(self.client, self.name, LOCK)
        if not self._free(held):
            raise VlmatchError(f"milvus collection {self.name} is being written by process {held.get('pid')} on "
                               f"{held.get('host')} ({held.get('what')}); wait for it to finish (one build or update "
                               "at a time)")
        self.beat()
        if (read_prop(self.client, self.name, LOCK) or {}).get("token") != self.me["token"]:
            raise VlmatchError(f"milvus collection {self.name}: another writer took the lock at the same time; "
                               "wait for it to finish")
        return self

    def beat(self) -> None:
        write_prop(self.client, self.name, LOCK, {**self.me, "beat": time.time()})

    def __exit__(self, *exc) -> None:
        if (read_prop(self.client, self.name, LOCK) or {}).get("token") == self.me["token"]:
            drop_prop(self.client, self.name, LOCK)
