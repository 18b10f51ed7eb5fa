"""``vlmatch index build|update --backend milvus``: encode a collection into Milvus, batch by batch,
with :func:`vlmatch.search.build.build_index`'s options, models and manifest (:mod:`vlmatch.search.job`).

A build records in ``vlmatch.pending`` what it builds and how far it got, resumes after a kill, and is
visible only once ``vlmatch.manifest`` names its generation; an update records its plan first and
changes the committed generation in place (docs/milvus.md, "Guarantees").
"""

from __future__ import annotations

import math
import os
import time
from dataclasses import asdict
from pathlib import Path
from typing import NamedTuple

import numpy as np
import torch
from tqdm.auto import tqdm

from .... import io
from ....checkpoints.digest import checkpoint_digest
from ....errors import ConfigError, DataError
from ....features.photo import READER_VERSION
from ...encode import template
from ...inputs import plan_changes
from ...job import BuildOptions, Job, Part, UpdateOptions, now, photo_root, prepare, update_encoder, update_part
from ...open_vocab import OpenVocab
from ...scan import scan_folder
from ...stage1 import choose_kind
from ..base import MilvusLocation
from ..folder import seal
from .client import (
    FORMAT,
    MANIFEST,
    MAX_DIM,
    PENDING,
    RPC_BYTES,
    WriterLock,
    check_name,
    connect,
    drop_generation,
    drop_prop,
    ensure_anchor,
    generations,
    is_lite,
    last_write_ts,
    part_name,
    pymilvus,
    read_prop,
    write_prop,
)
from .collection import checkpoints, read_manifest
from .filters import has_scalars, rows_of, scalars_of
from .layout import Layout, create_encodings, create_items, stage1_index, vector_type
from .probe import probe

FOLDER_ONLY = "is for the folder backend"


def _exif_dates(opts) -> None:
    if opts.date_from_mtime:
        raise ConfigError(f"--date-from-mtime {FOLDER_ONLY} (a Milvus index dates photos by EXIF only)")


def build_milvus(loc: MilvusLocation, model_ckpt, opts: BuildOptions) -> dict:
    """Build (or resume building) a Milvus index; returns its manifest."""
    _exif_dates(opts)
    if opts.overwrite:
        raise ConfigError(f"--overwrite {FOLDER_ONLY}; a Milvus index is --collection NAME")
    if int(os.environ.get("WORLD_SIZE", "1")) > 1:
        raise ConfigError("--backend milvus builds in one process (each batch goes straight to Milvus): run it without "
                          "torchrun")
    check_name(loc.collection)
    client = connect(loc.uri)
    ensure_anchor(client, loc.collection)
    with WriterLock(client, loc.collection, "vlmatch index build") as lock:
        job = prepare(model_ckpt, opts, fmt=FORMAT, extra_versions={"pymilvus": pymilvus().__version__})
        for key, ckpt in (("model", model_ckpt), ("retriever", opts.retriever_ckpt)):
            if ckpt is not None:  # what opening the index checks a checkpoint folder against
                job.manifest[key]["digest"] = checkpoint_digest(Path(ckpt))
        return _Writer(client, loc, lock).build(job)


class _Writer:
    def __init__(self, client, loc: MilvusLocation, lock: WriterLock):
        self.client, self.loc, self.lock = client, loc, lock
        self.name = loc.collection

    def build(self, job: Job) -> dict:
        manifest, opts = job.manifest, job.options
        dim = manifest["dims"]["stage1"]
        if dim > MAX_DIM:
            raise ConfigError(f"stage-1 vectors of {dim} values: a Milvus vector field holds at most {MAX_DIM}")
        manifest["capabilities"] = can = probe(self.client, self.name, self.loc.uri)
        for kind in {choose_kind(opts.ann, len(p.keys)) for p in job.parts}:
            index_type = stage1_index(kind, 1, opts.hnsw_m)[0]
            if index_type not in can["index_types"]:
                raise ConfigError(f"--ann {kind}: the Milvus server at {self.loc.uri} does not build {index_type} "
                                  f"indexes (it builds {', '.join(can['index_types']) or 'none of those probed'})")
        pending = self._start(job.fingerprint(job.parts, "milvus", opts.ann, opts.nlist, opts.hnsw_m, opts.skip_bad))
        collections = {}
        for part in job.parts:
            state = pending["collections"].setdefault(part.name, {"done": 0, "next_id": 0, "bad": []})
            kind = choose_kind(opts.ann, len(part.keys))
            if not state.get("finished"):
                self._fill(pending, part, job, kind)
            collections[part.name] = {
                "count": state["next_id"], "layout": state["layout"],
                "stage1": {"kind": kind, "dim": dim, "count": state["next_id"], "requested": opts.ann,
                           **({"nlist": state["nlist"]} if kind == "ivf" else {"M": opts.hnsw_m} if kind == "hnsw"
                              else {})}}
        images = pending["collections"].get("images")
        job.finish(collections, images and images["bad"], images and images["next_id"])
        manifest["generation"] = pending["generation"]
        return self._commit(manifest, pending, keep=pending["generation"])

    def _commit(self, manifest: dict, pending: dict, keep: int | None = None) -> dict:
        """Seal and write the manifest (the commit), drop the pending record and every generation but ``keep``."""
        write_prop(self.client, self.name, PENDING, pending)  # a write after every row: its time is the guarantee
        manifest["read_ts"] = last_write_ts(self.client, [self.name])
        manifest["seal"] = seal(manifest)
        io.crash_point("milvus:commit")
        write_prop(self.client, self.name, MANIFEST, manifest)  # the commit
        drop_prop(self.client, self.name, PENDING)
        for g in generations(self.client, self.name) - {keep} if keep is not None else ():
            drop_generation(self.client, self.name, g)
        return manifest

    def _start(self, fp: str) -> dict:
        """The pending record of this build: the interrupted one with the same fingerprint, or a new generation."""
        pending = read_prop(self.client, self.name, PENDING)
        if pending and pending.get("op") == "build" and pending.get("fingerprint") == fp:
            return pending
        committed = read_prop(self.client, self.name, MANIFEST)
        keep = {int(committed["generation"])} if isinstance(committed, dict) and "generation" in committed else set()
        for g in generations(self.client, self.name) - keep:
            drop_generation(self.client, self.name, g)
        gen = max(keep | generations(self.client, self.name) | {0}) + 1
        pending = {"op": "build", "fingerprint": fp, "generation": gen, "collections": {}}
        write_prop(self.client, self.name, PENDING, pending)
        return pending

    def _create(self, pending: dict, part: Part, job: Job, kind: str) -> None:
        """Create a part's two collections (drops what an earlier try left) and record their layout."""
        state, opts = pending["collections"][part.name], job.options
        vector = vector_type(probe(self.client, self.name, self.loc.uri)["float16_vector"], opts.dtype)
        layout = Layout.of(template(job.model, part.name, job.manifest["dims"]["regions"]), opts.dtype, vector, part.pad_to)
        n = len(part.keys)
        if kind == "ivf":
            state["nlist"] = int(opts.nlist or max(1, min(n // 39, int(4 * math.sqrt(n)))))
        names = Names.of(self.name, pending["generation"], part.name)
        for name in names:
            if self.client.has_collection(name):
                self.client.drop_collection(name)
        create_items(self.client, names.items, job.manifest["dims"]["stage1"], kind, state.get("nlist"), opts.hnsw_m)
        create_encodings(self.client, names.enc, layout)
        state["layout"] = asdict(layout)
        write_prop(self.client, self.name, PENDING, pending)

    def _fill(self, pending: dict, part: Part, job: Job, kind: str) -> None:
        state = pending["collections"][part.name]
        if "layout" not in state:
            self._create(pending, part, job, kind)
        names = Names.of(self.name, pending["generation"], part.name)
        self._encode(pending, state, part, names, Layout(**state["layout"]),
                     desc=f"index {part.name} into milvus", progress=job.options.progress)
        if state["next_id"] == 0 and part.name == "images":
            raise DataError(self.loc.uri, "nothing to index: every image was skipped")
        settle(self.client, self.loc.uri, names)
        state["finished"] = True
        write_prop(self.client, self.name, PENDING, pending)

    def _encode(self, pending: dict, state: dict, part: Part, names: Names, layout: Layout, *, desc: str,
                progress: bool) -> None:
        """Encode ``part`` into ``names`` from ``state["done"]`` on, each batch recorded in ``pending``. New files
        take ids from ``state["next_id"]``; a changed one (``state["changed"]``: rel -> id) keeps its id, and
        leaves the index (``state["delete"]``) when it no longer reads, as the folder's update does."""
        changed = state.get("changed", {})
        bar = tqdm(total=len(part.keys), initial=state["done"], desc=desc, unit="item", disable=not progress)
        for b in part.batches(part.keys, state["done"]):
            if b.keys:
                enc, vecs = part.encode(b)
                ids = [changed.get(k) for k in b.keys]
                for j, i in enumerate(ids):
                    if i is None:
                        ids[j], state["next_id"] = state["next_id"], state["next_id"] + 1
                write_rows(self.client, names, layout, [part.row_of(k, i, m) for k, i, m in
                                                        zip(b.keys, ids, b.meta or [{}] * len(b.keys), strict=True)],
                           vectors=vecs, encodings=enc)
            if gone := [changed[x["key"]] for x in b.bad if x["key"] in changed]:
                state["delete"] += gone
            state["done"] += b.consumed
            state["bad"] += b.bad
            self._beat(pending)
            bar.update(b.consumed)
        bar.close()

    def _beat(self, pending: dict) -> None:
        """Record a batch done (the lock's heartbeat with it)."""
        write_prop(self.client, self.name, PENDING, pending)
        self.lock.beat()
        io.crash_point("milvus:batch")


class Names(NamedTuple):
    """The two Milvus collections of one part of a generation: its items and its encodings' chunks."""

    items: str
    enc: str

    @classmethod
    def of(cls, name: str, generation: int, part: str) -> Names:
        return cls(part_name(name, generation, part), part_name(name, generation, part, enc=True))


INDEX_WAIT_S = 6 * 3600  # an index of 100M vectors takes hours to build


def wait_indexed(client, items_name: str, field: str = "s1", timeout: float = INDEX_WAIT_S) -> None:
    """Wait until the server has built the stage-1 index over every flushed row (until then it searches through
    a temporary index of its own, whatever the search parameters say)."""
    t0 = time.time()
    while True:
        info = client.describe_index(items_name, field) or {}
        total, done = int(info.get("total_rows", 0) or 0), int(info.get("indexed_rows", 0) or 0)
        if info.get("state", "Finished") == "Finished" and done >= total and not info.get("pending_index_rows"):
            return
        if info.get("state") == "Failed":
            raise DataError(items_name, f"the server failed to build its {info.get('index_type')} index: "
                                        f"{info.get('fail_reason') or 'no reason given'}")
        if time.time() - t0 > timeout:
            raise DataError(items_name, f"the server has indexed {done} of {total} rows after {timeout:.0f} s")
        time.sleep(1)


def compact(client, uri: str, names, items_name: str, timeout: float = INDEX_WAIT_S) -> float:
    """On a server, merge the segments of ``names`` (each is searched on its own: benchmarks/results/milvus.md) and
    purge the upserts' delete records, then wait for the stage-1 index; returns the seconds. milvus-lite: nothing."""
    if is_lite(uri):
        return 0.0
    t0 = time.time()
    for name in names:
        job = client.compact(name)
        while (state := str(client.get_compaction_state(job))) != "Completed":
            if "fail" in state.lower():
                raise DataError(name, f"the server's compaction ended {state}")
            if time.time() - t0 > timeout:
                raise DataError(name, f"the server's compaction has not completed after {timeout:.0f} s ({state})")
            time.sleep(1)
    wait_indexed(client, items_name, timeout=timeout)
    return time.time() - t0


def settle(client, uri: str, names: Names) -> None:
    """Flush a part's collections, wait for the stage-1 index and compact (:func:`compact`)."""
    for name in names:
        client.flush(name)
    wait_indexed(client, names.items)
    compact(client, uri, names, names.items)


def write_rows(client, names: Names, layout: Layout, items: list[dict], *, vectors: torch.Tensor, encodings) -> None:
    """Upsert items (table row + stage-1 vector, keyed by ``id``) and their encodings' chunks, in RPCs under the limit."""
    v = vectors.float().cpu().numpy()
    scalars = has_scalars(client, names.items)  # not in collections written before the filters' fields
    rows = [{"id": it["id"], "item": it, "s1": v[j], **(scalars_of(it) if scalars else {})}
            for j, it in enumerate(items)]
    step = max(1, RPC_BYTES // (4 * v.shape[1] + 1024))
    for a in range(0, len(rows), step):
        client.upsert(names.items, rows[a:a + step])
    chunks = layout.rows(np.asarray([it["id"] for it in items]), encodings, names.enc)
    step = layout.rows_per_rpc()
    for a in range(0, len(chunks), step):
        client.upsert(names.enc, chunks[a:a + step])


# --- update ------------------------------------------------------------------------------------------

def update_milvus(loc: MilvusLocation, opts: UpdateOptions) -> dict:
    """Re-scan the image folder of a Milvus index: encode new and changed files, drop deleted ones."""
    _exif_dates(opts)
    if opts.concepts:
        raise ConfigError(f"--concepts {FOLDER_ONLY}: a Milvus index's concept columns are written once; build the "
                          "collection again")
    check_name(loc.collection)
    client = connect(loc.uri, create=False)  # an update of a .db that does not exist creates nothing
    manifest = read_manifest(client, loc)
    with WriterLock(client, loc.collection, "vlmatch index update") as lock:
        manifest = read_manifest(client, loc)
        return _update(_Writer(client, loc, lock), manifest, photo_root(manifest, loc), opts)


def _plan(client, items_name: str, root: Path, manifest: dict) -> dict:
    """An update's plan, recorded before its first write: the files to encode, the ids of the changed and removed."""
    old = [r["item"] for r in rows_of(client, items_name, ["item"], batch_size=1000)]
    rels = scan_folder(root)
    _, _, todo, report = plan_changes(root, rels, old, manifest.get("reader", 1) < READER_VERSION)
    by_rel, present = {it["rel"]: it["id"] for it in old}, set(rels)
    return {"op": "update", "base": manifest["seal"], "todo": todo,
            "changed": {rel: by_rel[rel] for rel in todo if rel in by_rel},
            "delete": [it["id"] for it in old if it["rel"] not in present], "done": 0,
            "next_id": manifest.get("next_id", len(old)), "bad": [], "report": report}


def _update(writer: _Writer, manifest: dict, root: Path, opts: UpdateOptions) -> dict:
    """Encode the new and changed photos into the committed generation and drop the deleted ones, by a recorded plan."""
    client, name, gen = writer.client, writer.name, int(manifest["generation"])
    names = Names.of(name, gen, "images")
    # an index built before the open-vocabulary part keeps its layout (a collection's vector width is fixed):
    # `index build` again adds the concept vectors (docs/open-vocabulary.md)
    _, encode = update_encoder(checkpoints(writer.loc, manifest), manifest, OpenVocab.from_manifest(manifest), writer.loc)
    pending = read_prop(client, name, PENDING)
    if not (pending and pending.get("op") == "update" and pending.get("base") == manifest["seal"]):
        if pending:  # an unfinished build (or an update of another version): its generation goes
            for g in generations(client, name) - {gen}:
                drop_generation(client, name, g)
        client.load_collection(names.items)
        pending = _plan(client, names.items, root, manifest)
        if not pending["todo"] and not pending["delete"]:
            drop_prop(client, name, PENDING)
            if manifest.get("reader", 1) < READER_VERSION:  # nothing was sideways: as the current reader encodes
                manifest["reader"] = READER_VERSION
                manifest["seal"] = seal(manifest)
                write_prop(client, name, MANIFEST, manifest)
            return {**pending["report"], "skipped": []}
        write_prop(client, name, PENDING, pending)
    part = update_part(manifest, pending["todo"], encode, opts)
    writer._encode(pending, pending, part, names, Layout(**manifest["collections"]["images"]["layout"]),
                   desc="index new images into milvus", progress=opts.progress)
    for a in range(0, len(pending["delete"]), 1000):
        ids = pending["delete"][a:a + 1000]
        client.delete(names.items, ids=ids)
        client.delete(names.enc, filter=f"id in {ids}")
    settle(client, writer.loc.uri, names)
    client.load_collection(names.items)
    count = int(client.query(names.items, filter="", output_fields=["count(*)"])[0]["count(*)"])
    if count == 0:
        raise DataError(root, "nothing left to index: every image was deleted or skipped")
    images = manifest["collections"]["images"]
    images["count"] = images["stage1"]["count"] = manifest["counts"]["images"] = count
    manifest.update(next_id=pending["next_id"], reader=READER_VERSION, skipped=pending["bad"], updated=now())
    writer._commit(manifest, pending)
    return {**pending["report"], "skipped": pending["bad"]}

