"""``vlmatch index build|update --backend milvus``: encode a collection into Milvus
(layout: :mod:`vlmatch.search.backends.milvus.client`).

Encoding is the folder build's (the same backbone, batches, models and stage-1 source); each batch is
written straight to Milvus, so no machine holds the whole stage-2 store. **Crash safety.** Before
its first write a build records in ``vlmatch.pending`` what it builds (a fingerprint of its inputs,
models and options) and into which generation; after each batch it records how far it got. Re-run
after a kill, the same build resumes after the last recorded batch: rows are upserted by primary key
(item id, and item id x chunk), so a batch written twice leaves no duplicates. A different build drops
the unfinished generation and starts a new one. Nothing of a build is visible to readers until
``vlmatch.manifest`` -- written last -- names its generation; the previous generation is then dropped.
An update changes the committed generation in place (copying a collection of 100M photos per update
is not an option): it records its plan (files to encode, ids to drop) in ``vlmatch.pending`` first,
then upserts and deletes, then rewrites the manifest; re-run after a kill it finishes the recorded
plan. Readers see its photos appear one batch at a time, all encoded by the index's own models.
"""

from __future__ import annotations

import math
import os
import time
from pathlib import Path

import numpy as np
import torch

from .. import io
from ..checkpoints.digest import checkpoint_digest
from ..errors import ConfigError, DataError
from ..features.photo import READER_VERSION, file_orientation
from ..weights import sha256_file
from .backends.base import MilvusLocation
from .backends.folder import seal
from .backends.milvus.client import (
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
from .backends.milvus.collection import read_manifest
from .backends.milvus.filters import has_scalars, rows_of, scalars_of
from .backends.milvus.layout import Layout, create_encodings, create_items, stage1_index, vector_type
from .backends.milvus.probe import probe
from .build import (
    SCORES,
    _stage1_source,
    file_stat,
    image_batches,
    image_encoder,
    image_row,
    load_index_model,
    open_vocab_for,
    photo_folder,
    precomp_features,
    scan_folder,
    versions,
)
from .checks import read_captions
from .encode import fingerprint
from .open_vocab import check_pins, concepts_fix, open_vocab_of
from .stage1 import choose_kind


def _model_record(ckpt) -> tuple:
    model, info = load_index_model(ckpt)
    return model, {**info, "digest": checkpoint_digest(Path(ckpt))}


def build_milvus(loc: MilvusLocation, model_ckpt, images=None, features=None, split: str = "test", captions=None,
                 retriever_ckpt=None, backbone: str | None = None, dtype: str = "float16", ann: str = "auto",
                 nlist: int | None = None, hnsw_m: int = 32, skip_bad: bool = False, batch_size: int = 64,
                 progress: bool = True, weights=None, score: str = "model", open_vocab: bool | None = None) -> dict:
    """Build (or resume building) a Milvus index; returns its manifest. The options are
    :func:`vlmatch.search.build.build_index`'s."""
    if images is None and features is None and captions is None:
        raise ConfigError("index build needs --images DIR, --features DIR or --captions FILE")
    if images is not None and features is not None:
        raise ConfigError("index build takes --images or --features, not both")
    if score not in SCORES:
        raise ConfigError(f"--score {score!r}: expected one of {', '.join(SCORES)}")
    if score == "mean" and retriever_ckpt is None:
        raise ConfigError("--score mean averages the model's and the retriever's scores: give --retriever too")
    if int(os.environ.get("WORLD_SIZE", "1")) > 1:
        raise ConfigError("--backend milvus builds in one process (each batch goes straight to Milvus): run it without "
                          "torchrun")
    check_name(loc.collection)
    client = connect(loc.uri)
    ensure_anchor(client, loc.collection)
    with WriterLock(client, loc.collection, "vlmatch index build") as lock:
        return _Build(client, loc, lock, progress).run(model_ckpt, images, features, split, captions, retriever_ckpt,
                                                       backbone, dtype, ann, nlist, hnsw_m, skip_bad, batch_size,
                                                       weights, score, open_vocab)


class _Build:
    def __init__(self, client, loc: MilvusLocation, lock: WriterLock, progress: bool):
        self.client, self.loc, self.lock, self.progress = client, loc, lock, progress
        self.name = loc.collection

    def run(self, model_ckpt, images, features, split, captions, retriever_ckpt, backbone, dtype, ann, nlist, hnsw_m,
            skip_bad, batch_size, weights, score, open_vocab=None) -> dict:
        from ..features.provenance import checkpoint_backbone

        model, model_info = _model_record(model_ckpt)
        retriever, retriever_info = (None, None) if retriever_ckpt is None else _model_record(retriever_ckpt)
        caption_rows = None if captions is None else read_captions(model, captions, ann, nlist)
        trained = checkpoint_backbone(model_ckpt)
        ov = open_vocab_for(retriever_ckpt or model_ckpt, trained, open_vocab)
        s1 = _stage1_source(model, retriever, ov)
        manifest = {"format": FORMAT, "created": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()),
                    "reader": READER_VERSION, "model": model_info, "retriever": retriever_info, "stage1": s1.describe(),
                    "score": score, "open_vocab": None if ov is None else ov.describe(),
                    "dtype": dtype, "backbone": trained, "source": {}, "collections": {},
                    "versions": {**versions(), "pymilvus": pymilvus().__version__}}
        jobs = []  # (collection, keys, batches(done) -> Batch iterator, encode, item row, n_regions, pad_to)
        n_regions = 1
        if images is not None:
            root, rels, bb, n_regions = photo_folder(images, model_ckpt, backbone, weights, model, trained, manifest)
            sizes = [file_stat(root, r)["size"] for r in rels]
            jobs.append(("images", rels, lambda done: image_batches(root, rels, bb, batch_size, skip_bad)(done),
                         image_encoder(model, s1), lambda rel, i, meta: image_row(root, rel, i, meta), None,
                         ("images", rels, sizes, bb.describe())))
        elif features is not None:
            from .build import feature_batches

            n_regions, names, img_dir, fsrc = precomp_features(features, split, model, trained, manifest)
            feats, rows = fsrc, list(range(len(fsrc)))
            jobs.append(("images", rows, lambda done: feature_batches(feats, rows, batch_size)(done),
                         image_encoder(model, s1),
                         lambda row, i, meta: {"id": i, "path": str(Path(img_dir) / names[row]) if img_dir else names[row],
                                               "rel": names[row]}, None,
                         ("features", manifest["source"]["root"], split, feats.shape)))
        dim = s1.check(n_regions)
        if dim > MAX_DIM:
            raise ConfigError(f"stage-1 vectors of {dim} values: a Milvus vector field holds at most {MAX_DIM}")
        manifest["dims"] = {"stage1": dim, "regions": n_regions if jobs else None, "img_dim": model.cfg.img_dim}
        if captions is not None:
            from .build import caption_batches, caption_encoder

            caps, width = caption_rows
            manifest["source"]["captions"] = str(Path(captions).resolve())
            jobs.append(("captions", caps, caption_batches(caps, batch_size), caption_encoder(model, s1, n_regions),
                         lambda row, i, meta: {"id": i, "text": caps[row]}, width, ("captions", caps)))
        manifest["capabilities"] = can = probe(self.client, self.name, self.loc.uri)
        for kind in {choose_kind(ann, len(j[1])) for j in jobs}:
            itype = stage1_index(kind, 1, hnsw_m)[0]
            if itype not in can["index_types"]:
                raise ConfigError(f"--ann {kind}: the Milvus server at {self.loc.uri} does not build {itype} indexes "
                                  f"(it builds {', '.join(can['index_types']) or 'none of those probed'})")
        fp = fingerprint("milvus-build", [j[-1] for j in jobs], model_info["checkpoint_sha256"],
                         retriever_info and retriever_info["checkpoint_sha256"], dtype, ann, nlist, hnsw_m, score, skip_bad)
        pending = self._start(fp)
        gen = pending["generation"]
        for coll, keys, batches, encode, row_of, pad_to, _ in jobs:
            state = pending["collections"].setdefault(coll, {"done": 0, "next_id": 0, "bad": []})
            if not state.get("finished"):
                self._fill(pending, coll, keys, batches, encode, row_of, pad_to, model, n_regions, dtype, dim,
                           choose_kind(ann, len(keys)), nlist, hnsw_m)
            info = pending["collections"][coll]
            kind = choose_kind(ann, len(keys))
            manifest["collections"][coll] = {
                "count": info["next_id"], "layout": info["layout"],
                "stage1": {"kind": kind, "dim": dim, "count": info["next_id"], "requested": ann,
                           **({"nlist": info["nlist"]} if kind == "ivf" else {"M": hnsw_m} if kind == "hnsw" else {})}}
        if "images" in pending["collections"]:
            manifest["skipped"] = pending["collections"]["images"]["bad"]
            manifest["next_id"] = pending["collections"]["images"]["next_id"]
        manifest["counts"] = {k: v["count"] for k, v in manifest["collections"].items()}
        manifest["generation"] = gen
        write_prop(self.client, self.name, PENDING, pending)  # a write after every row: its time is the guarantee
        manifest["read_ts"] = last_write_ts(self.client, [self.name])
        manifest["seal"] = seal(manifest)
        io.crash_point("milvus:commit")
        write_prop(self.client, self.name, MANIFEST, manifest)  # the commit
        drop_prop(self.client, self.name, PENDING)
        for g in generations(self.client, self.name) - {gen}:
            drop_generation(self.client, self.name, g)
        return manifest

    def _start(self, fp: str) -> dict:
        """The pending record of this build: the interrupted one with the same fingerprint, resumed, or a
        new generation (what another unfinished build left is dropped)."""
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

    def _fill(self, pending, coll, keys, batches, encode, row_of, pad_to, model, n_regions, dtype, dim, kind, nlist,
              hnsw_m) -> None:
        gen = pending["generation"]
        state = pending["collections"][coll]
        items_name, enc_name = part_name(self.name, gen, coll), part_name(self.name, gen, coll, enc=True)
        if "layout" not in state:
            with torch.no_grad():
                tmpl = (model.encode_images(torch.zeros(1, n_regions, model.cfg.img_dim)) if coll == "images"
                        else model.encode_texts(*model.tokenize(["a"])))
            vector = vector_type(probe(self.client, self.name, self.loc.uri)["float16_vector"], dtype)
            layout = Layout.of(tmpl, dtype, vector, pad_to)
            if kind == "ivf":
                state["nlist"] = int(nlist or max(1, min(len(keys) // 39, int(4 * math.sqrt(len(keys))))))
            for name in (items_name, enc_name):
                if self.client.has_collection(name):
                    self.client.drop_collection(name)
            create_items(self.client, items_name, dim, kind, state.get("nlist"), hnsw_m)
            create_encodings(self.client, enc_name, layout)
            state["layout"] = layout.to_dict()
            write_prop(self.client, self.name, PENDING, pending)
        layout = Layout.from_dict(state["layout"])
        bar = None
        if self.progress:
            from tqdm import tqdm

            bar = tqdm(total=len(keys), initial=state["done"], desc=f"index {coll} into milvus", unit="item")
        for b in batches(state["done"]):
            if b.keys:
                enc, vecs = encode(b)
                ids = list(range(state["next_id"], state["next_id"] + len(b.keys)))
                metas = b.meta or [{}] * len(b.keys)
                write_rows(self.client, items_name, enc_name, layout, ids,
                           [row_of(k, i, m) for k, i, m in zip(b.keys, ids, metas, strict=True)], vecs, enc)
                state["next_id"] += len(b.keys)
            state["done"] += b.consumed
            state["bad"] += b.bad
            write_prop(self.client, self.name, PENDING, pending)
            self.lock.beat()
            io.crash_point("milvus:batch")
            if bar is not None:
                bar.update(b.consumed)
        if bar is not None:
            bar.close()
        if state["next_id"] == 0 and coll == "images":
            raise DataError(self.loc.uri, "nothing to index: every image was skipped")
        for name in (items_name, enc_name):
            self.client.flush(name)
        wait_indexed(self.client, items_name)
        compact(self.client, self.loc.uri, (items_name, enc_name), items_name)
        state["finished"] = True
        write_prop(self.client, self.name, PENDING, pending)


INDEX_WAIT_S = 6 * 3600  # an index of 100M vectors takes hours to build


def wait_indexed(client, items_name: str, field: str = "s1", timeout: float = INDEX_WAIT_S) -> None:
    """Wait until the server has built the stage-1 index over every flushed row. Until then a server
    searches segments without it through a temporary index of its own (Milvus 2.3: IVF, 16 of 128 lists
    probed) whatever the search parameters say: committed before, a 100,000-photo index found 37 % of
    the exact top ten instead of 100 %."""
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
    """On a server, merge the segments of ``names`` and purge the delete records each upsert leaves, then wait for
    the stage-1 index of the merged segments; returns the seconds it took. A collection written in batches lies in
    several segments, each searched on its own: 100,000 photos lay in 3 and a stage-1 search took 28.2 ms (p50),
    18.3 ms once compacted into 2 (benchmarks/results/milvus.md). A server compacts on its own only when its
    thresholds say so; this asks at once. milvus-lite (a ``.db``) has no segments to merge: nothing is done."""
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


def write_rows(client, items_name: str, enc_name: str, layout: Layout, ids: list[int], items: list[dict],
               vecs: torch.Tensor, enc) -> None:
    """Upsert items (table row + stage-1 vector) and their encodings' chunks, in RPCs under the size limit."""
    v = vecs.float().cpu().numpy()
    scalars = has_scalars(client, items_name)  # not in collections written before the filters' fields
    rows = [{"id": i, "item": it, "s1": v[j], **(scalars_of(it) if scalars else {})}
            for j, (i, it) in enumerate(zip(ids, items, strict=True))]
    step = max(1, RPC_BYTES // (4 * v.shape[1] + 1024))
    for a in range(0, len(rows), step):
        client.upsert(items_name, rows[a:a + step])
    chunks = layout.rows(np.asarray(ids), enc, enc_name)
    step = layout.rows_per_rpc()
    for a in range(0, len(chunks), step):
        client.upsert(enc_name, chunks[a:a + step])


# --- update ------------------------------------------------------------------------------------------

def update_milvus(loc: MilvusLocation, skip_bad: bool = False, batch_size: int = 64, progress: bool = True,
                  weights=None) -> dict:
    """Re-scan the image folder of a Milvus index: encode new and changed files, drop deleted ones."""
    check_name(loc.collection)
    client = connect(loc.uri, create=False)  # an update of a .db that does not exist creates nothing
    manifest = read_manifest(client, loc)
    with WriterLock(client, loc.collection, "vlmatch index update") as lock:
        manifest = read_manifest(client, loc)
        kind = (manifest.get("source") or {}).get("kind")
        if kind != "images":
            raise ConfigError(f"{loc}: only an index of an image folder can be updated (this one indexes {kind}); "
                              "build it again instead")
        return _update(client, loc, lock, manifest, skip_bad, batch_size, progress, weights)


def _all_items(client, name: str) -> list[dict]:
    return [r["item"] for r in rows_of(client, name, ["item"], batch_size=1000)]


def _plan(client, items_name: str, root: Path, manifest: dict) -> dict:
    old = _all_items(client, items_name)
    by_rel = {it["rel"]: it for it in old}
    rels = scan_folder(root)
    # an index encoded by an older photo reader holds its EXIF-rotated photos sideways: encoded again, upright
    stale_reader = manifest.get("reader", 1) < READER_VERSION
    todo, changed, kept, reoriented = [], {}, 0, 0
    for rel in rels:
        st = file_stat(root, rel)
        it = by_rel.get(rel)
        if it is not None:
            same = (it["size"], it["mtime_ns"]) == (st["size"], st["mtime_ns"])
            if not same and it.get("sha256") and it["size"] == st["size"]:
                same = sha256_file(root / rel) == it["sha256"]
            if same and stale_reader and file_orientation(root / rel) != 1:
                same, reoriented = False, reoriented + 1
            if same:
                kept += 1
                continue
            changed[rel] = it["id"]
        todo.append(rel)
    present = set(rels)
    delete = [it["id"] for it in old if it["rel"] not in present]
    report = {"kept": kept, "new": len(todo) - len(changed), "changed": len(changed) - reoriented, "deleted": len(delete)}
    if stale_reader:
        report["reoriented"] = reoriented
    return {"op": "update", "base": manifest["seal"], "todo": todo, "changed": changed, "delete": delete, "done": 0,
            "next_id": manifest.get("next_id", len(old)), "bad": [], "report": report}


def _update(client, loc: MilvusLocation, lock: WriterLock, manifest: dict, skip_bad, batch_size, progress,
            weights) -> dict:
    from ..features.backbones import backbone_for
    from ..models.registry import load_model
    from .backends.milvus.collection import checkpoints

    name, gen = loc.collection, int(manifest["generation"])
    items_name, enc_name = part_name(name, gen, "images"), part_name(name, gen, "images", enc=True)
    root = Path(manifest["source"]["root"])
    ckpts = checkpoints(loc, manifest)
    model = load_model(ckpts["model"], note_unsealed=False).eval()  # checked against the manifest's digest
    retriever = load_model(ckpts["retriever"], note_unsealed=False).eval() if "retriever" in ckpts else None
    # an index built before the open-vocabulary part keeps its layout (a collection's vector width is fixed):
    # `index build` again adds the concept vectors (docs/open-vocabulary.md)
    ov = open_vocab_of(manifest)
    s1 = _stage1_source(model, retriever, ov)
    # new photos' concept columns must pair with the kept ones: refused before anything is written
    check_pins(ov, manifest.get("open_vocab"), loc, concepts_fix(loc))
    pending = read_prop(client, name, PENDING)
    if not (pending and pending.get("op") == "update" and pending.get("base") == manifest["seal"]):
        if pending:  # an unfinished build (or an update of another version): its generation goes
            for g in generations(client, name) - {gen}:
                drop_generation(client, name, g)
        client.load_collection(items_name)
        pending = _plan(client, items_name, root, manifest)
        if not pending["todo"] and not pending["delete"]:
            drop_prop(client, name, PENDING)
            if manifest.get("reader", 1) < READER_VERSION:  # nothing was sideways: as the current reader encodes
                manifest["reader"] = READER_VERSION
                manifest["seal"] = seal(manifest)
                write_prop(client, name, MANIFEST, manifest)
            return {**pending["report"], "skipped": []}
        write_prop(client, name, PENDING, pending)
    encode = image_encoder(model, s1)
    bb = backbone_for(manifest["backbone"], weights)
    layout = Layout.from_dict(manifest["collections"]["images"]["layout"])
    todo = pending["todo"]
    for b in image_batches(root, todo, bb, batch_size, skip_bad)(pending["done"]):
        if b.keys:
            enc, vecs = encode(b)
            ids = []
            for rel in b.keys:
                if rel in pending["changed"]:
                    ids.append(pending["changed"][rel])
                else:
                    ids.append(pending["next_id"])
                    pending["next_id"] += 1
            write_rows(client, items_name, enc_name, layout, ids,
                       [image_row(root, rel, i, m) for rel, i, m in zip(b.keys, ids, b.meta, strict=True)], vecs, enc)
        for bad in b.bad:  # a changed file that no longer reads leaves the index, as the folder's update does
            if bad["key"] in pending["changed"]:
                pending["delete"].append(pending["changed"][bad["key"]])
        pending["done"] += b.consumed
        pending["bad"] += b.bad
        write_prop(client, name, PENDING, pending)
        lock.beat()
        io.crash_point("milvus:batch")
    for a in range(0, len(pending["delete"]), 1000):
        ids = pending["delete"][a:a + 1000]
        client.delete(items_name, ids=ids)
        client.delete(enc_name, filter=f"id in {ids}")
    for n in (items_name, enc_name):
        client.flush(n)
    wait_indexed(client, items_name)
    compact(client, loc.uri, (items_name, enc_name), items_name)
    client.load_collection(items_name)
    count = int(client.query(items_name, filter="", output_fields=["count(*)"])[0]["count(*)"])
    if count == 0:
        raise DataError(root, "nothing left to index: every image was deleted or skipped")
    manifest["collections"]["images"]["count"] = count
    manifest["collections"]["images"]["stage1"]["count"] = count
    manifest["counts"]["images"] = count
    manifest["next_id"] = pending["next_id"]
    manifest["reader"] = READER_VERSION
    manifest["skipped"] = pending["bad"]
    manifest["updated"] = time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime())
    write_prop(client, name, PENDING, pending)  # a write after every row: its time is the readers' guarantee
    manifest["read_ts"] = last_write_ts(client, [name])
    manifest["seal"] = seal(manifest)
    io.crash_point("milvus:commit")
    write_prop(client, name, MANIFEST, manifest)
    drop_prop(client, name, PENDING)
    return {**pending["report"], "skipped": pending["bad"]}
