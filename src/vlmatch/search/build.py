"""``vlmatch index build`` / ``update``: encode a collection once into an index folder.

Layout of an index folder::

    manifest.json            model (name, sha256), retriever, backbone, dims, counts, versions, source
    model/, retriever/       copies of the checkpoints (the index is self-contained)
    images/                  items.json (id, path, size, mtime_ns, sha256 per row), stage1.npy,
                             stage1.faiss, enc/ (stage-2 encodings, memory-mapped)
    captions/                the same for an indexed caption collection (items hold the text)
    build/                   work area of an interrupted build (resumed by re-running the command)
    .vlmatch.lock            held by the one build or update writing the folder
    .vlmatch.read.lock       shared by readers while they open the index, held alone by a writer while
                             it swaps its parts in and commits (every encoding and FAISS index done first)

How parts are recorded and replaced so that a kill leaves one whole index: :mod:`vlmatch.search.backends.folder`.
Under ``torchrun`` each rank encodes a contiguous shard into ``build/<what>/part-<rank>-of-<world>`` and rank 0
merges them; collections take the parts' files as hard links, so ``build/`` stays whole until the commit.
"""

from __future__ import annotations

import os
import secrets
import shutil
import time
from contextlib import nullcontext
from pathlib import Path

import numpy as np
import torch

from .. import distributed as D
from ..errors import DataError
from ..features.photo import READER_VERSION
from ..io import atomic_dir, link_tree, read_json, save_npy, write_json
from ..models.base import MatchingModel
from .backends.base import MilvusLocation
from .backends.folder import (
    FORMAT,
    check_out,
    commit,
    open_parts,
    recover,
    require_manifest,
    swapping,
    writer_lock,
)
from .checks import read_items
from .encode import encode_part, fingerprint, read_meta
from .inputs import image_row, plan_changes
from .job import BuildOptions, Job, Part, UpdateOptions, now, photo_root, prepare, update_encoder, update_part, with_settings
from .open_vocab import OpenVocab
from .scan import scan_folder
from .stage1 import build_faiss, write_faiss
from .store import allocate_npy, open_arrays


def build_index(target, model_ckpt, options: BuildOptions | None = None, **settings) -> dict | None:
    """Build (or resume building) an index of the checkpoint folder ``model_ckpt``; returns the manifest (None
    on ranks > 0 under torchrun). ``target``: an index folder, or a Milvus collection
    (:class:`vlmatch.search.backends.base.MilvusLocation`). ``options``: a :class:`vlmatch.search.job.BuildOptions`,
    or its fields as keyword arguments (``build_index(out, ckpt, images="photos")``)."""
    opts = with_settings(BuildOptions, options, settings).check()
    if isinstance(target, MilvusLocation):
        from .backends.milvus.build import build_milvus

        return build_milvus(target, model_ckpt, opts)
    out = Path(target)
    if opts.images is not None and not Path(opts.images).is_dir():  # before out is made (it would hold a lock file)
        raise DataError(opts.images, "image folder not found")
    D.init_from_env(torch.device("cpu"))
    rank, world = D.world()
    check_out(out, opts.images, opts.overwrite)  # every rank, before any of them writes
    D.barrier()
    if rank == 0:
        out.mkdir(parents=True, exist_ok=True)
    with writer_lock(out, "vlmatch index build") if rank == 0 else nullcontext():
        if rank == 0:
            recover(out)
        D.barrier()  # the other ranks write into build/ only once rank 0 holds the folder
        return _write(out, prepare(model_ckpt, opts, fmt=FORMAT), rank, world)


def _write(out: Path, job: Job, rank: int, world: int) -> dict | None:
    """Encode every part (each rank its shard), then on rank 0 build the stage-1 indexes, swap the parts in
    and commit."""
    started = time.monotonic()
    opts, manifest = job.options, job.manifest
    ready = {}  # collection -> (encoded rows' folder, rows, skipped): all the work, before any swap
    for part in job.parts:
        rec = encode_sharded(out / "build" / part.name, part, job.fingerprint([part]), opts.dtype, rank=rank,
                             world=world, progress=opts.progress, desc=f"index {part.name}")
        if rec is None:
            continue
        if rec["folder"] is None:
            raise DataError(opts.images or opts.features, "nothing to index: every image was skipped")
        rows = [part.row_of(key, i, meta) for i, (key, meta) in enumerate(zip(rec["keys"], rec["meta"], strict=True))]
        if opts.images is not None and part.name == "images":
            took = time.monotonic() - started  # this run's (a resumed build's: since it resumed)
            manifest["build"] = {"seconds": round(took, 2), "encoded": len(rows),
                                 "photos_per_s": round(len(rows) / took, 2) if took > 0 else None}
        ready[part.name] = rec["folder"], rows, rec["bad"]
    if rank != 0:
        return None
    # the stage-1 indexes only once every part is encoded: the other ranks wait at each part's barrier meanwhile
    stage1 = {name: stage1_of(folder, opts.ann, opts.nlist, opts.hnsw_m) for name, (folder, _, _) in ready.items()}
    images = ready.get("images")
    with swapping(out):  # readers opening the index meanwhile wait for these renames and the commit
        collections = {name: write_collection(out / name, folder, rows, stage1[name])
                       for name, (folder, rows, _) in ready.items()}
        save_checkpoint(out / "model", job.model)
        if job.retriever is not None:
            save_checkpoint(out / "retriever", job.retriever)
        return commit(out, job.finish(collections, images and images[2], images and len(images[1])))


# --- sharded encoding + merge ------------------------------------------------------------------

def encode_sharded(work: Path, part: Part, fp: str, dtype: str, *, rank: int = 0, world: int = 1,
                   progress: bool = True, desc: str = "encode") -> dict | None:
    """Each rank encodes its shard of ``part``; rank 0 returns the merged record (``keys``: kept inputs in row
    order, ``meta``, ``bad``, ``folder`` with stage1.npy and enc/, None when every input was skipped)."""
    keys = part.keys
    a, b = len(keys) * rank // world, len(keys) * (rank + 1) // world
    encode_part(work / f"part-{rank}-of-{world}", fingerprint(fp, a, b), b - a,
                lambda done: part.batches(keys[a:b], done), part.encode, dtype, pad_to=part.pad_to,
                desc=f"{desc} [{rank}/{world}]" if world > 1 else desc, progress=progress and rank == 0)
    D.barrier()
    if rank != 0:
        return None
    parts = [work / f"part-{r}-of-{world}" for r in range(world)]
    records = [read_json(p / "progress.json") for p in parts]
    bad = [x for r in records for x in r["bad"]]
    bad_keys = {x["key"] for x in bad}
    rec = {"keys": [k for k in keys if k not in bad_keys], "meta": [m for p in parts for m in read_meta(p)], "bad": bad}
    parts = [p for p, r in zip(parts, records, strict=True) if r["written"]]
    if len(parts) <= 1:
        return {**rec, "folder": parts[0] if parts else None}
    return {**rec, "folder": merge_parts(parts, work / "merged", dtype)}


def merge_parts(folders: list[Path], merged: Path, dtype: str, rows: list | None = None) -> Path:
    """The encoded rows of ``folders`` (``rows[i]``: those of folder i to keep, None = all) as one folder ``merged``;
    a folder none of whose rows is kept adds no stage-1 vectors (an older index's may be narrower)."""
    if merged.exists():
        shutil.rmtree(merged)
    rows = rows or [None] * len(folders)
    concat_stores([f / "enc" for f in folders], merged / "enc", dtype, rows)
    vectors = [np.load(f / "stage1.npy", mmap_mode="r") for f in folders]
    save_npy(merged / "stage1.npy", np.concatenate([v if r is None else v[r]
                                                    for v, r in zip(vectors, rows, strict=True) if r is None or r]))
    return merged


def concat_stores(folders: list[Path], out: Path, dtype: str, rows: list | None = None) -> None:
    """Concatenate stores (``rows[i]``: the rows of store i to keep, None = all), chunk by chunk;
    word-axis fields are padded to the widest store."""
    opened = [open_arrays(f) for f in folders]
    metas, arrays = [m["fields"] for m, _ in opened], [a for _, a in opened]
    rows = rows or [None] * len(folders)
    idxs = [np.arange(len(next(iter(a.values())))) if r is None else np.asarray(r, dtype=np.int64)
            for a, r in zip(arrays, rows, strict=True)]
    total = sum(len(i) for i in idxs)
    out.mkdir(parents=True, exist_ok=True)
    fields = {}
    for name, spec in metas[0].items():
        shape = list(spec["shape"])
        if shape:
            shape[0] = max(m[name]["shape"][0] for m in metas)
        # the widest dtype of the parts: an update of an index built before a field became full
        # precision widens the old rows instead of rounding the new ones
        dt = np.result_type(*(np.dtype(m[name]["dtype"]) for m in metas))
        dst = allocate_npy(out / f"{name}.npy.partial", dt, (total, *shape))  # a full disk: named, not SIGBUS
        at = 0
        for arrs, idx in zip(arrays, idxs, strict=True):
            for c in range(0, len(idx), 4096):
                chunk = np.asarray(arrs[name][idx[c:c + 4096]])
                if chunk.ndim > 1:
                    dst[at:at + len(chunk), :chunk.shape[1]] = chunk
                else:
                    dst[at:at + len(chunk)] = chunk
                at += len(chunk)
        dst.flush()
        del dst
        os.replace(out / f"{name}.npy.partial", out / f"{name}.npy")
        fields[name] = {**spec, "shape": shape, "dtype": dt.name}
    write_json(out / "fields.json", {"fields": fields, "class": opened[0][0]["class"]})


# --- writing the index -------------------------------------------------------------------------

def stage1_of(folder: Path, ann: str, nlist: int | None, hnsw_m: int):
    """The FAISS index (and its description) of the stage-1 vectors in ``folder``: built before the
    parts are swapped, so that readers wait only for renames (:func:`vlmatch.search.backends.folder.swapping`)."""
    vectors = np.load(folder / "stage1.npy", mmap_mode="r")
    index, info = build_faiss(np.asarray(vectors), ann, nlist=nlist, hnsw_m=hnsw_m)
    return index, {**info, "requested": ann}


def write_collection(dest: Path, folder: Path, items: list[dict], stage1) -> dict:
    """Make the collection folder ``dest`` (the old one kept as ``dest.prev`` until the commit) of the encoded rows
    in ``folder`` (hard links), ``items`` and ``stage1`` (:func:`stage1_of`), holding
    :func:`vlmatch.search.backends.folder.swapping`; returns the collection's entry of the manifest."""
    index, info = stage1
    with atomic_dir(dest, keep_prev=True) as tmp:
        link_tree(folder / "enc", tmp / "enc")
        link_tree(folder / "stage1.npy", tmp / "stage1.npy")
        fields = read_json(tmp / "enc" / "fields.json")
        # a new file (not the linked one): its id tells this collection's encodings from any other's
        write_json(tmp / "enc" / "fields.json", {**fields, "id": secrets.token_hex(8)})
        write_faiss(index, tmp / "stage1.faiss")
        write_json(tmp / "items.json", items, indent=None)
    return {"count": len(items), "stage1": info, "fields": fields["fields"]}


def save_checkpoint(dest: Path, model: MatchingModel) -> None:
    """A copy of ``model`` as the part ``dest`` (the old one kept as ``dest.prev`` until the commit)."""
    with atomic_dir(dest, keep_prev=True) as tmp:
        model.save(tmp)


# --- update ------------------------------------------------------------------------------------

def update_index(target, options: UpdateOptions | None = None, **settings) -> dict:
    """Re-scan the photo folder of an index: encode new and changed files, drop deleted ones, keep the rest;
    returns what changed. ``target``: an index folder or a :class:`vlmatch.search.backends.base.MilvusLocation`;
    ``options``: an :class:`vlmatch.search.job.UpdateOptions`, or its fields as keyword arguments."""
    opts = with_settings(UpdateOptions, options, settings)
    if isinstance(target, MilvusLocation):
        from .backends.milvus.build import update_milvus

        return update_milvus(target, opts)
    out = Path(target)
    require_manifest(out)  # before the lock file is made in a folder that holds no index
    with writer_lock(out, "vlmatch index update"):
        recover(out)
        return _update(out, *open_parts(out), opts)


def _update(out: Path, manifest: dict, parts: dict, opts: UpdateOptions) -> dict:
    root = photo_root(manifest, out)
    old_items = read_items(parts["images"] / "items.json", "path")
    ids = {it["rel"]: it["id"] for it in old_items}  # a changed file keeps its id
    rels = scan_folder(root)
    # an index encoded by an older photo reader holds its EXIF-rotated photos as stored (sideways): those
    # are encoded again, as displayed (vlmatch.features.photo.READER_VERSION)
    stale_reader = manifest.get("reader", 1) < READER_VERSION
    open_vocab, add_concepts = OpenVocab.for_update(manifest, opts.concepts)
    # an index whose columns are to be encoded again is not pinned (nor left, unsearchable, as if up to date)
    source, encode = update_encoder(parts, manifest, open_vocab, out, pinned=not add_concepts)
    keep_rows, keep_items, todo, report = plan_changes(root, rels, old_items, stale_reader, add_concepts)
    if not todo and len(keep_rows) == len(old_items) and not add_concepts:
        shutil.rmtree(out / "build", ignore_errors=True)  # what an update killed before its commit left
        if stale_reader:  # nothing was sideways: the index is as the current reader would encode it
            with swapping(out):
                commit(out, {**manifest, "reader": READER_VERSION}, ())
        return {**report, "skipped": []}
    dtype = manifest["dtype"]
    rec = {"keys": [], "meta": [], "bad": [], "folder": None}
    if todo:
        if opts.date_from_mtime:
            manifest["source"]["date_from_mtime"] = True
        part = update_part(manifest, todo, encode, opts)
        rec = encode_sharded(out / "build" / "update", part, fingerprint(part.what, manifest["model"]["sha256"],
                                                                         manifest["created"]), dtype,
                             progress=opts.progress, desc="index new images")
    next_id = manifest.get("next_id", len(old_items))
    new_items = []
    for rel, meta in zip(rec["keys"], rec["meta"], strict=True):
        if rel not in ids:
            ids[rel], next_id = next_id, next_id + 1
        new_items.append(image_row(root, rel, ids[rel], meta))
    items = keep_items + new_items
    if not items:
        raise DataError(root, "nothing left to index: every image was deleted or skipped")
    written = ()
    if new_items or len(keep_rows) < len(old_items):  # else only unreadable new files: the collection stands
        merged = merge_parts([parts["images"], *([rec["folder"]] if new_items else [])], out / "build" / "merged", dtype,
                             [keep_rows, *([None] if new_items else [])])
        info = manifest["collections"]["images"]["stage1"]
        stage1 = stage1_of(merged, info.get("requested", "auto"), info.get("nlist") if info["kind"] == "ivf" else None,
                           info.get("M", 32))
        written = ("images",)
    manifest.update(next_id=next_id, reader=READER_VERSION, updated=now(), skipped=rec["bad"],
                    open_vocab=None if open_vocab is None else open_vocab.describe())
    if open_vocab is not None:
        manifest["stage1"] = source.describe()
    manifest["counts"]["images"] = len(items)
    with swapping(out):  # readers opening the index meanwhile wait for the swap and the commit
        if written:
            manifest["collections"]["images"] = write_collection(out / "images", merged, items, stage1)
        commit(out, manifest, written)
    return {**report, "skipped": rec["bad"]}
