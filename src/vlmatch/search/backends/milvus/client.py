"""Talking to Milvus for an index: the connection, the collections' names and schemas, the
state collection that holds the manifest, the pending work and the writers' lock.

A vlmatch collection NAME is the state collection ``NAME`` and, per generation G, ``NAME__g<G>_images``
and ``NAME__g<G>_images_enc`` (likewise captions); the layout and Milvus's limits that shape it are
in docs/milvus.md ("What is stored where"). A build commits by writing ``vlmatch.manifest`` last.
"""

from __future__ import annotations

import json
import logging
import os
import re
import socket
import time
from contextlib import contextmanager

from ....errors import ConfigError, DataError, VlmatchError

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
READ_TIMEOUT_S = 10  # a search or fetch gives up (pymilvus retries meanwhile) after this: the server is away
RETRY_AFTER_S = 5  # what a service tells its clients when the server is away
_NAME = re.compile(r"[A-Za-z_][A-Za-z0-9_]{0,179}")


class Unavailable(VlmatchError):
    """The Milvus server did not answer (stopped, restarting, unreachable): a service answers 503 with
    Retry-After and keeps its index open; answers resume when the server is back."""


class Refused(VlmatchError):
    """The Milvus server answered and refused a request (its words say what it refused): not a retry's
    matter, and not the client's (its input is checked before it reaches Milvus): a service answers 502."""


_UNLOADED = ("not loaded", "released", "call load()")  # Milvus 2.3-2.4 / milvus-lite 3.x say it differently
_AWAY = ("unavailable", "deadline", "timeout", "timed out", "connect", "not ready", "closed", "rpc error",
         "socket", "refused")


def loaded(call, client_of, names, timeout: float | None = None):
    """``call()``; when it finds a collection not loaded, ``names`` are loaded (on ``client_of()``) and it is
    tried once more."""
    try:
        return call()
    except pymilvus().MilvusException as e:
        if not any(w in str(e) for w in _UNLOADED):  # only "not loaded" (a restart, another process's release) is retried
            raise
        for name in names:
            load(client_of(), name, timeout)
        return call()


def unreachable(e: BaseException) -> bool:
    """Whether a Milvus error says the server did not answer (rather than answered and refused)."""
    pm = pymilvus()
    if isinstance(e, (pm.exceptions.ConnectError, pm.exceptions.MilvusUnavailableException)):
        return True
    if not isinstance(e, pm.MilvusException):  # gRPC's own error: the transport
        return True
    return getattr(e, "code", None) == 2 or any(w in str(e).lower() for w in _AWAY)


def load(client, name: str, timeout: float | None = None) -> None:
    """Load collection ``name`` for reads (idempotent: the process that wrote it may have released it). A load
    the server refuses (a user granted reads only) is left to the read, whose own error says what is wrong."""
    try:
        client.load_collection(name, timeout=timeout)
    except Exception as e:  # noqa: BLE001 -- pymilvus raises MilvusException, gRPC its own RpcError
        if "permission deny" not in str(e).lower() and "permission_denied" not in str(e).lower():
            raise


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


def is_lite(uri: str) -> bool:
    """Whether ``uri`` names a milvus-lite database (a ``.db`` path) rather than a server."""
    return str(uri).endswith(".db")


def connect(uri: str, create: bool = True):
    """A MilvusClient for ``uri`` (a milvus-lite ``.db`` path or a server URL), the token from
    ``$VLMATCH_MILVUS_TOKEN``; ``create=False``: a milvus-lite database that does not exist is an error."""
    pm = pymilvus()
    if not uri:
        raise ConfigError("--milvus-uri is empty: give a milvus-lite .db file or a server URL (http://host:19530)")
    lite = is_lite(uri)
    if lite:
        check_lite(uri, create)
    token = os.environ.get(TOKEN_ENV, "")
    try:
        with quiet("milvus_lite", "milvus_lite.server_manager"):  # its traceback: said in one line below
            return pm.MilvusClient(uri=uri, token=token)
    except Exception as e:  # noqa: BLE001 - pymilvus raises several kinds; one line names the server
        holder = lite_holder(uri) if lite else None
        if holder is not None:
            raise VlmatchError(f"{uri}: another process holds this milvus-lite database ({holder}); milvus-lite "
                               "opens a .db in one process at a time: wait for it to finish (a build or update "
                               "holds it to its end), or use a Milvus server for several processes") from None
        if not lite and _listening(uri):  # it answers, and refused us: the token
            raise VlmatchError(f"Milvus at {uri} refused the connection: a wrong or missing token (${TOKEN_ENV} "
                               f"{'is set, its value not shown' if token else 'is not set'}; a server with "
                               "authentication on takes user:password or an API key)") from None
        raise VlmatchError(f"cannot connect to Milvus at {uri}: {_short(e, token)}") from None


# --- milvus-lite: a .db is a folder, opened by one process at a time (an flock on its LOCK file) ----

LITE_LOCK = "LOCK"


def check_lite(uri: str, create: bool) -> None:
    """Refuse, in one line, a milvus-lite path that is not (and cannot become) a milvus-lite database."""
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
    """``process PID (its command)`` of another process that holds the milvus-lite database ``uri`` open (its
    LOCK file flocked), "another process" where the system does not say which; None when it is free."""
    import fcntl

    lock = os.path.join(os.path.abspath(uri), LITE_LOCK)
    try:
        fd = os.open(lock, os.O_RDONLY)
    except OSError:
        return None
    try:
        fcntl.flock(fd, fcntl.LOCK_SH | fcntl.LOCK_NB)  # free (or held by this process): not another's
        return None  # closing the descriptor below drops the lock just taken
    except BlockingIOError:
        inode = os.fstat(fd).st_ino
    finally:
        os.close(fd)
    pid = _flock_pid(inode)
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


@contextmanager
def quiet(*names: str, level: int = logging.CRITICAL):
    """Loggers ``names`` (none: every logger) silent at ``level`` and below meanwhile: a refusal that is an
    answer (a probe), a warning that does not apply, a traceback said in one line instead."""
    logs = [logging.getLogger(n) for n in names]
    was = [g.level for g in logs]
    for g in logs:
        g.setLevel(level + 1)
    if not names:
        logging.disable(level)
    try:
        yield
    finally:
        if not names:
            logging.disable(logging.NOTSET)
        for g, w in zip(logs, was, strict=True):
            g.setLevel(w)


def _listening(uri: str) -> bool:
    """Whether something accepts TCP connections at the URI's host and port."""
    from urllib.parse import urlsplit

    try:
        u = urlsplit(uri if "://" in uri else f"tcp://{uri}")
        with socket.create_connection((u.hostname or "localhost", u.port or 19530), timeout=3):
            return True
    except (OSError, ValueError):
        return False


def _short(e: Exception, token: str = "") -> str:
    msg = " ".join(str(getattr(e, "message", None) or str(e)).split())
    token = token or os.environ.get(TOKEN_ENV, "")
    if token:  # never the token's value in a message (a server may echo what it was sent)
        msg = msg.replace(token, "***")
    return msg[:300]


def part_name(name: str, gen: int, coll: str, enc: bool = False) -> str:
    return f"{name}__g{gen}_{coll}" + ("_enc" if enc else "")


def field_of(client, name: str, field: str) -> tuple[str, int | None]:
    """(Milvus type name, dim) of a field of a Milvus collection ("missing", None: no such field)."""
    for f in client.describe_collection(name).get("fields", []):
        if f.get("name") == field:
            t, dim = f.get("type"), (f.get("params") or {}).get("dim")
            return getattr(t, "name", str(t)), None if dim is None else int(dim)
    return "missing", None


def create_collection(client, name: str, fields, index=None, key: str = "pk", **kw) -> None:
    """Create ``name``: the INT64 primary key ``key``, ``fields`` (name, DataType name, add_field's keywords)
    and ``index`` (vector field, index type, metric, params) if any."""
    pm = pymilvus()
    schema = pm.MilvusClient.create_schema(auto_id=False, enable_dynamic_field=False)
    schema.add_field(key, pm.DataType.INT64, is_primary=True)
    for field, kind, opts in fields:
        schema.add_field(field, getattr(pm.DataType, kind), **opts)
    ip = None
    if index is not None:
        ip = client.prepare_index_params()
        ip.add_index(index[0], index_type=index[1], metric_type=index[2], params=index[3])
    client.create_collection(name, schema=schema, index_params=ip, **kw)


def generations(client, name: str) -> set[int]:
    """Generations with a Milvus collection on the server (committed, pending or left over)."""
    pat = re.compile(re.escape(name) + r"__g(\d+)_")
    return {int(m.group(1)) for c in client.list_collections() if (m := pat.match(c))}


def drop_generation(client, name: str, gen: int) -> None:
    for c in client.list_collections():
        if c.startswith(f"{name}__g{gen}_"):
            client.drop_collection(c)


# --- the state collection: manifest, pending work, lock ------------------------------------------

STATE_SLOTS = {MANIFEST: 1, PENDING: 2, LOCK: 3}  # the head row of each key
PART_CHARS = 60_000  # JSON characters per row (the VARCHAR field holds 65,535 bytes; the JSON is ASCII)
_BANK = 10**8  # a long value's rows: slot * 10 * _BANK + bank * _BANK + part


def ensure_anchor(client, name: str) -> None:
    """The state collection ``name``: one row per key (``pk`` its slot, ``value`` its JSON), in rows rather
    than properties (a 2.3 server may refuse to alter those); ``v``: a collection needs a vector field."""
    if client.has_collection(name):
        if not _legacy(client, name):
            load(client, name)  # released by the process that wrote it last (milvus-lite)
        return
    create_collection(client, name, [("value", "VARCHAR", {"max_length": 65_535}), ("v", "FLOAT_VECTOR", {"dim": 2})],
                      ("v", "FLAT", "IP", {}), consistency_level="Strong")


def _legacy(client, name: str, timeout: float | None = None) -> bool:
    """An anchor written by an earlier vlmatch (milvus-lite only): its state lives in its properties."""
    fields = {f.get("name") for f in client.describe_collection(name, timeout=timeout).get("fields", [])}
    return "value" not in fields


def _get(client, name: str, pks: list[int], consistency: str, timeout: float | None = None) -> dict[int, str]:
    rows = loaded(lambda: client.get(name, ids=pks, output_fields=["pk", "value"], consistency_level=consistency,
                                     timeout=timeout), lambda: client, [name], timeout)
    return {int(r["pk"]): r["value"] for r in rows}


def read_prop(client, name: str, key: str, consistency: str = "Strong", timeout: float | None = None):
    """The value of ``key`` (None when unset); Strong by default: it sees every other process's writes."""
    if not client.has_collection(name, timeout=timeout):
        return None
    if _legacy(client, name, timeout):
        raw = (client.describe_collection(name).get("properties") or {}).get(key)
    else:
        slot = STATE_SLOTS[key]
        head = _get(client, name, [slot], consistency, timeout).get(slot, "")
        if head.startswith("p:"):  # p:BANK:PARTS -- a long value over several rows, written before its head
            bank, parts = (int(x) for x in head[2:].split(":"))
            base = slot * 10 * _BANK + bank * _BANK
            got = _get(client, name, [base + i for i in range(parts)], consistency, timeout)
            if len(got) != parts:
                raise DataError(f"{name}:{key}", f"{parts - len(got)} of its {parts} rows are missing: drop the "
                                                 "collection and build it again")
            raw = "".join(got[base + i] for i in range(parts))
        else:
            raw = head[2:]
    if raw is None or raw == "":
        return None
    try:
        return json.loads(raw)
    except ValueError:
        raise DataError(f"{name}:{key}", "not JSON (edited by hand?): drop the collection and build it again") from None


def write_prop(client, name: str, key: str, value) -> None:
    """Set ``key``: a short value is its head row; a long one is written whole to the bank of rows the head
    does not name, then the head is switched to it (a reader sees the old value or the new one)."""
    raw = json.dumps(value, sort_keys=True)
    if _legacy(client, name):
        client.alter_collection_properties(name, properties={key: raw})
        return
    slot = STATE_SLOTS[key]
    if len(raw) <= PART_CHARS:
        head = "v:" + raw
    else:
        old = _get(client, name, [slot], "Strong").get(slot, "")
        bank = 1 - int(old.split(":")[1]) if old.startswith("p:") else 0
        base = slot * 10 * _BANK + bank * _BANK
        parts = [raw[a:a + PART_CHARS] for a in range(0, len(raw), PART_CHARS)]
        for a in range(0, len(parts), 500):  # under the RPC size limit
            client.upsert(name, [{"pk": base + a + i, "value": p, "v": [0.0, 0.0]}
                                 for i, p in enumerate(parts[a:a + 500])])
        head = f"p:{bank}:{len(parts)}"
    client.upsert(name, [{"pk": slot, "value": head, "v": [0.0, 0.0]}])


def drop_prop(client, name: str, key: str, timeout: float | None = None) -> None:
    if _legacy(client, name, timeout):
        if key in (client.describe_collection(name).get("properties") or {}):
            client.drop_collection_properties(name, property_keys=[key])
        return
    client.upsert(name, [{"pk": STATE_SLOTS[key], "value": "", "v": [0.0, 0.0]}], timeout=timeout)


def last_write_ts(client, names) -> int:
    """The server's timestamp of this process's last write to any of ``names`` (0: unknown, e.g. milvus-lite),
    from pymilvus's session-consistency record."""
    try:
        from pymilvus.client import ts_utils

        addr = client._get_connection().server_address
        return max(int(ts_utils.get_collection_ts(n, addr, "") or 0) for n in names)
    except Exception:  # noqa: BLE001 - another pymilvus: readers fall back to Strong
        return 0


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
    """The ``vlmatch.lock`` row, held by a build or update: another live writer is refused; the lock of a dead
    process on this host, or of a writer silent for :data:`LOCK_STALE_S`, is taken over. No compare-and-set
    in Milvus: it is written, then read back (its token tells two writers apart)."""

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
        try:  # after a failure, a server that does not answer keeps the lock: it is taken over later
            if (read_prop(self.client, self.name, LOCK, timeout=5 if exc[0] else None) or {}).get("token") == \
                    self.me["token"]:
                drop_prop(self.client, self.name, LOCK, timeout=5 if exc[0] else None)
        except pymilvus().MilvusException:
            if exc[0] is None:
                raise
