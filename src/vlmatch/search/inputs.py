"""What an index build reads: photo files, precomp features or caption lines, as batches of :class:`Batch`.

Both backends' builds and updates read through these (:mod:`vlmatch.search.job`), so a photo is decoded, dated
and hashed the same way whichever backend stores it."""

from __future__ import annotations

import hashlib
import io
import os
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import numpy as np
import torch

from ..errors import DataError
from ..features.copyhash import copy_signal
from ..features.photo import file_orientation, load_image, preview_pixels
from ..features.photometa import mtime_taken, photo_meta
from ..features.provenance import check_backbone, resolve_backbone
from ..features.raw import is_raw
from ..weights import sha256_file
from .encode import Batch
from .scan import file_stat, scan_folder


class _Bytes(io.BytesIO):
    """A file's bytes in memory that PIL's messages name by the file's path."""

    def __init__(self, data: bytes, path: Path):
        super().__init__(data)
        self.path = path

    def __repr__(self) -> str:
        return repr(str(self.path))


def read_image(root: Path, rel: str, size: int, date_from_mtime: bool = False) -> tuple[np.ndarray, dict]:
    """An image file's pixels and what its table row records (size, mtime, SHA-256, its copy signal
    (:mod:`vlmatch.features.copyhash`) and :func:`photo_row`), all from one read of its bytes: the hash is of the
    content encoded, and the mtime, taken before the read, shows any later change."""
    path = root / rel
    try:
        with open(path, "rb") as f:
            st = os.fstat(f.fileno())
            data = f.read()
    except OSError as e:
        raise DataError(path, f"unreadable image ({type(e).__name__}: {e.strerror or e})") from None
    try:
        pixels = load_image(_Bytes(data, path), size)
    except DataError as e:
        raise type(e)(path, e.problem) from None
    row = {"size": len(data), "mtime_ns": st.st_mtime_ns, "sha256": hashlib.sha256(data).hexdigest(),
           **copy_signal(pixels)}  # what tells this photo's copies from look-alikes (index duplicates)
    return pixels, {**row, **photo_row(data, path, st.st_mtime_ns if date_from_mtime else None)}


def photo_row(data: bytes, path: Path, mtime_ns: int | None = None) -> dict:
    """What a table row records of a photo's EXIF (:func:`vlmatch.features.photometa.photo_meta`; ``pixels`` as
    displayed), never raising: a photo whose EXIF cannot be read is indexed without it. ``mtime_ns``: the capture
    time of a photo without one (``--date-from-mtime``; ``taken_from``: ``"mtime"``)."""
    from ..features.photo import open_image

    try:
        with open_image(_Bytes(data, path)) as im:  # the header only: nothing is decoded
            meta = photo_meta(im)
    except Exception as e:  # noqa: BLE001 - whatever the decoder raises, the photo indexes without EXIF
        meta = {"notes": [f"EXIF not read ({type(e).__name__})"]}
    if "size" in meta:
        meta["pixels"] = meta.pop("size")
    if is_raw(data[:16], path) and (shown := preview_pixels(data)) is not None:
        meta["pixels"] = shown  # a RAW is read through its preview: its first IFD's size is not what is shown
    if mtime_ns is not None and "taken" not in meta:
        meta["taken"], meta["taken_from"] = mtime_taken(mtime_ns), "mtime"
    return meta


def image_row(root: Path, rel: str, item_id: int, meta: dict) -> dict:
    """The table row of an indexed image file (``meta``: what :func:`read_image` recorded)."""
    return {"id": item_id, "path": str((root / rel).resolve()), "rel": rel, **meta}


def image_batches(root: Path, backbone, *, batch_size: int, skip_bad: bool, date_from_mtime: bool = False):
    """``batches(rels, done)``: the photos ``rels[done:]`` as backbone features, a batch at a time; the next batch is
    read and decoded (:mod:`vlmatch.search.decoding`, or a thread) while the backbone encodes this one."""
    from .decoding import decoder_pool, read_one

    size = backbone.info.input_size

    def read_batch(procs, rels: list[str]):
        names, arrays, bad, meta = [], [], [], []
        jobs = [(read_image, str(root), rel, size, date_from_mtime) for rel in rels]
        for rel, pixels, m, err, no_preview in (procs.map(read_one, jobs) if procs else map(read_one, jobs)):
            if err is not None:
                if not skip_bad and not no_preview:  # a RAW without a preview: always listed, never a stop
                    raise DataError(err[0], f"{err[1]}; pass --skip-bad to index the rest without it")
                bad.append({"key": rel, "error": err[1]})
                continue
            arrays.append(pixels)
            names.append(rel)
            meta.append(m)
        return names, arrays, bad, meta

    def batches(rels: list[str], done: int) -> Iterator[Batch]:
        starts = list(range(done, len(rels), batch_size))
        with decoder_pool(len(rels) - done) as procs, ThreadPoolExecutor(1, thread_name_prefix="vlmatch-read") as pool:
            ahead = pool.submit(read_batch, procs, rels[starts[0]:starts[0] + batch_size]) if starts else None
            for i, a in enumerate(starts):
                names, arrays, bad, meta = ahead.result()
                if i + 1 < len(starts):
                    ahead = pool.submit(read_batch, procs, rels[starts[i + 1]:starts[i + 1] + batch_size])
                feats = None
                if arrays:
                    with torch.inference_mode():
                        feats = backbone(backbone.preprocess(arrays)).clone()
                yield Batch(len(rels[a:a + batch_size]), names, features=feats, bad=bad, meta=meta)
    return batches


def feature_batches(features: np.ndarray, *, batch_size: int):
    """``batches(rows, done)``: precomp feature rows (consecutive) ``rows[done:]``, a batch at a time."""
    def batches(rows: list[int], done: int) -> Iterator[Batch]:
        for a in range(done, len(rows), batch_size):
            keys = rows[a:a + batch_size]
            f = torch.from_numpy(np.array(features[keys[0]:keys[-1] + 1], dtype=np.float32))
            if not torch.isfinite(f).all():
                raise DataError("features", f"NaN or inf in the features of rows {keys[0]}..{keys[-1]}")
            yield Batch(len(f), keys, features=f)
    return batches


def caption_batches(captions: list[str], *, batch_size: int):
    """``batches(rows, done)``: the captions of line numbers ``rows[done:]``, a batch at a time."""
    def batches(rows: list[int], done: int) -> Iterator[Batch]:
        for a in range(done, len(rows), batch_size):
            keys = rows[a:a + batch_size]
            yield Batch(len(keys), keys, captions=[captions[i] for i in keys])
    return batches


def photo_folder(images, model_ckpt, model, *, backbone: str | None, weights, manifest: dict):
    """A photo folder checked against the model it is indexed with: (its resolved root, the photos' relative
    paths, the backbone, regions per photo); the manifest gets the backbone, the source and what was found."""
    from ..features.backbones import backbone_for
    from .report import found_kinds

    root = Path(images).resolve()
    pairs: list = []
    rels = scan_folder(root, pairs)
    bb = backbone_for(resolve_backbone(model_ckpt, backbone), weights)
    check_backbone(manifest["backbone"], bb.describe(), model.cfg.img_dim, root)
    manifest["backbone"] = bb.describe()
    manifest["source"] = {"kind": "images", "root": str(root)}
    manifest["found"] = found_kinds(root, rels + [p["raw"] for p in pairs])
    manifest["raw_pairs"] = pairs
    return root, rels, bb, bb.info.grid ** 2


def precomp_features(features, split: str, model, manifest: dict):
    """A precomp split checked against the model it is indexed with: (regions, item names, images folder, the
    features); the manifest gets its source and backbone."""
    from ..data.precomp import open_features, read_caption_lines
    from ..data.resolve import resolve_data
    from ..io import read_json

    froot = resolve_data(features).resolve()
    feats = open_features(froot / f"{split}_ims.npy")
    fj = froot / "features.json"
    info = read_json(fj) if fj.is_file() else {}
    used = info.get("backbone")
    if used is not None:
        check_backbone(manifest["backbone"], used, model.cfg.img_dim, fj)
        manifest["backbone"] = used
    if feats.shape[2] != model.cfg.img_dim:
        raise DataError(froot / f"{split}_ims.npy", f"{feats.shape[2]}-d features but the model expects "
                                                   f"img_dim={model.cfg.img_dim}")
    ids_path = froot / f"{split}_ids.txt"
    names = read_caption_lines(ids_path) if ids_path.is_file() else [f"{split}_{i}" for i in range(len(feats))]
    if len(names) != len(feats):
        names = names[:: len(names) // len(feats)] if len(names) % len(feats) == 0 else names
    if len(names) != len(feats):
        raise DataError(ids_path, f"{len(names)} ids for {len(feats)} images")
    img_dir = info.get("images_dir")
    manifest["source"] = {"kind": "features", "root": str(froot), "split": split, "images_dir": img_dir}
    return feats.shape[1], names, img_dir, feats


def plan_changes(root: Path, rels: list[str], old_items: list[dict], stale_reader: bool, add_concepts: bool = False):
    """(rows kept, their items, the files to encode, report) for the folder's files ``rels`` against the index's
    rows ``old_items``: a file is kept when its size and mtime, or its SHA-256, are the row's. Also encoded again:
    with ``stale_reader`` a photo with an EXIF orientation (``reoriented``), with ``add_concepts`` every photo."""
    by_rel = {it["rel"]: (row, it) for row, it in enumerate(old_items)}
    keep_rows, keep_items, todo, reoriented, concept_only = [], [], [], 0, 0
    for rel in rels:
        st = file_stat(root, rel)
        if rel in by_rel:
            row, it = by_rel[rel]
            same = (it["size"], it["mtime_ns"]) == (st["size"], st["mtime_ns"])
            if not same and it.get("sha256") and it["size"] == st["size"]:
                same = sha256_file(root / rel) == it["sha256"]
            if same and stale_reader and file_orientation(root / rel) != 1:
                same, reoriented = False, reoriented + 1
            if same and add_concepts:
                same, concept_only = False, concept_only + 1
            if same:
                keep_rows.append(row)
                keep_items.append(it)
                continue
        todo.append(rel)
    deleted = len(old_items) - len(keep_rows) - sum(r in by_rel for r in todo)
    report = {"kept": len(keep_rows), "new": sum(r not in by_rel for r in todo),
              "changed": sum(r in by_rel for r in todo) - reoriented - concept_only, "deleted": deleted}
    if stale_reader:  # encoded by an older photo reader: how many were turned upright
        report["reoriented"] = reoriented
    if add_concepts:  # the unchanged photos encoded again for their concept vectors
        report["concepts_added"] = concept_only
    return keep_rows, keep_items, todo, report
