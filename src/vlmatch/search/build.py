"""``vlmatch index build`` / ``update``: encode a collection once into an index folder.

Layout of an index folder::

    manifest.json            model (name, sha256), retriever, backbone, dims, counts, versions, source
    model/, retriever/       copies of the checkpoints (the index is self-contained)
    images/                  items.json (id, path, size, mtime_ns, sha1 per row), stage1.npy,
                             stage1.faiss, enc/ (stage-2 encodings, memory-mapped)
    captions/                the same for an indexed caption collection (items hold the text)
    build/                   work area of an interrupted build (resumed by re-running the command)
    .vlmatch.lock            held by the one build or update writing the folder
    .vlmatch.read.lock       shared by readers while they open the index, held alone by a writer while
                             it swaps its parts in and commits (every encoding and FAISS index done first)

What belongs to an index, what the manifest records of each part, and how a build or an update
replaces parts so that a kill at any point leaves one complete index: :mod:`vlmatch.search.backends.folder`.

Under ``torchrun`` every rank encodes one contiguous shard of the inputs into
``build/<what>/part-<rank>-of-<world>`` and rank 0 merges the parts (one process: one part). The
collections take their files from the parts as hard links, so ``build/`` stays whole, and a build
killed in its final phase resumes, until the commit.
"""

from __future__ import annotations

import hashlib
import io
import os
import platform
import shutil
import time
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from contextlib import nullcontext
from pathlib import Path

import numpy as np
import torch

from .. import distributed as D
from ..checkpoints.digest import checkpoint_fingerprint
from ..errors import ConfigError, DataError
from ..features.copyhash import copy_signal
from ..features.photo import READER_VERSION, load_image, preview_pixels
from ..features.photometa import mtime_taken, photo_meta
from ..features.provenance import check_backbone, checkpoint_backbone, resolve_backbone
from ..features.raw import is_raw
from ..io import atomic_dir, link_tree, read_json, save_npy, write_json
from ..models.base import MatchingModel
from ..weights import sha256_file
from .backends.folder import (
    FORMAT,
    check_out,
    commit,
    new_collection_id,
    open_parts,
    recover,
    require_manifest,
    swapping,
    writer_lock,
)
from .changes import plan_changes
from .checks import read_captions, read_items
from .encode import Batch, Stage1Source, encode_part, fingerprint, read_meta
from .open_vocab import check_pins, concepts_fix, open_vocab_of
from .scan import file_stat, scan_folder  # noqa: F401 (scan_folder: imported from here by the Milvus build)
from .stage1 import build_faiss, write_faiss
from .store import allocate_npy, open_arrays


class _Bytes(io.BytesIO):
    """A file's bytes in memory that PIL's messages name by the file's path."""

    def __init__(self, data: bytes, path: Path):
        super().__init__(data)
        self.path = path

    def __repr__(self) -> str:
        return repr(str(self.path))


def read_image(root: Path, rel: str, size: int, date_from_mtime: bool = False) -> tuple[np.ndarray, dict]:
    """An image file's pixels and what its table row records (size, mtime, SHA-256, its copy signal
    (:mod:`vlmatch.features.copyhash`), and when, where, with
    what and how large it was taken: :func:`photo_row`), all from one read of its bytes: the hash is of
    the content encoded, whatever happens to the file meanwhile (its mtime is taken before the read, so a
    later change shows as a later mtime)."""
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
    """What a table row records of a photo's EXIF (:func:`vlmatch.features.photometa.photo_meta`): ``taken``
    (ISO 8601), ``camera``, ``gps`` [lat, lon], ``pixels`` [w, h] as displayed (``size`` is the file's bytes),
    ``notes`` on tags that were there but unusable. ``mtime_ns``: ``--date-from-mtime``, the file's mtime
    is the capture time of a photo without one (``taken_from``: ``"mtime"``). Never raises: the pixels
    were read already, and a photo whose EXIF cannot be read is indexed without it."""
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


# --- loading models ----------------------------------------------------------------------------

def load_index_model(path) -> tuple[MatchingModel, dict]:
    """The checkpoint an index is built with, and what the manifest records of it."""
    from ..models.registry import load_checkpoint

    path = Path(path)
    if not (path / "model.safetensors").is_file():
        raise DataError(path, "not a checkpoint folder (no model.safetensors)")
    model = load_checkpoint(path)
    # checkpoint_sha256: the whole folder (its checksums.json: weights, calibration, adapters, tokenizer ...),
    # which fingerprints a resumable build; sha256: the weights alone
    return model, {"name": model.name, "checkpoint": str(path.resolve()),
                   "sha256": sha256_file(path / "model.safetensors"), "checkpoint_sha256": checkpoint_fingerprint(path),
                   "config": model.config_dict()["config"]}


def _stage1_source(model, retriever, open_vocab=None) -> Stage1Source:
    if retriever is not None and retriever.cfg.img_dim != model.cfg.img_dim:
        raise ConfigError(f"retriever {retriever.name} takes {retriever.cfg.img_dim}-d features, the model "
                          f"{model.cfg.img_dim}-d: they must be trained on the same features")
    return Stage1Source(model, retriever, open_vocab)


def open_vocab_for(checkpoint, backbone: dict | None, want: bool | None = None, weights_sha256: str | None = None):
    """The open-vocabulary part an index of ``checkpoint`` gets (:mod:`vlmatch.search.open_vocab`), or None.
    ``want`` None: where the model ships with a fusion record (the default does) and its photos come from an
    EfficientNet-Lite backbone; True: required (an error where it cannot be); False: never. ``weights_sha256``:
    the model's weights digest as a manifest records it (an index's own copy of a model is stored otherwise)."""
    from ..pretrained import open_vocab_of_weights, open_vocab_record
    from .open_vocab import Fusion, OpenVocab

    if want is False:
        return None
    record = open_vocab_of_weights(weights_sha256) if weights_sha256 else open_vocab_record(checkpoint)
    name = (backbone or {}).get("name") or ""
    if record is None or not name.startswith("efficientnet-lite"):
        if want:
            why = (f"{checkpoint} records no fusion (a shipped model's registry entry holds one: the default's)"
                   if record is None else f"its backbone {name or 'is unknown'} has no ImageNet head vlmatch reads")
            raise ConfigError(f"--open-vocab: {why}")
        return None
    return OpenVocab(name, Fusion.of(record))


# --- inputs ------------------------------------------------------------------------------------

def image_batches(root: Path, rels: list[str], backbone, batch_size: int, skip_bad: bool,
                  date_from_mtime: bool = False):
    from .decoding import decoder_pool, read_one

    size = backbone.info.input_size
    procs = None  # the decoding processes of this build (vlmatch.search.decoding), when it has some

    def read_batch(a: int):
        names, arrays, bad, meta = [], [], [], []
        jobs = [(read_image, str(root), rel, size, date_from_mtime) for rel in rels[a:a + batch_size]]
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

    def gen(done: int) -> Iterator[Batch]:
        nonlocal procs
        starts = list(range(done, len(rels), batch_size))
        # the next batch's files are read and decoded (in worker processes, or in a thread: the decoders release
        # the GIL) while the backbone encodes this one; a batch's problems still surface in batch order
        with decoder_pool(len(rels) - done) as procs, ThreadPoolExecutor(1, thread_name_prefix="vlmatch-read") as pool:
            ahead = pool.submit(read_batch, starts[0]) if starts else None
            for i, a in enumerate(starts):
                names, arrays, bad, meta = ahead.result()
                ahead = pool.submit(read_batch, starts[i + 1]) if i + 1 < len(starts) else None
                feats = None
                if arrays:
                    with torch.inference_mode():
                        feats = backbone(backbone.preprocess(arrays)).clone()
                yield Batch(len(rels[a:a + batch_size]), names, features=feats, bad=bad, meta=meta)
    return gen


def feature_batches(features: np.ndarray, keys: list, batch_size: int):
    def gen(done: int) -> Iterator[Batch]:
        for a in range(done, len(keys), batch_size):
            f = torch.from_numpy(np.array(features[a:a + batch_size], dtype=np.float32))
            if not torch.isfinite(f).all():
                raise DataError("features", f"NaN or inf in the features of rows {a}..{a + len(f) - 1}")
            yield Batch(len(f), keys[a:a + batch_size], features=f)
    return gen


def caption_batches(captions: list[str], batch_size: int):
    def gen(done: int) -> Iterator[Batch]:
        for a in range(done, len(captions), batch_size):
            yield Batch(len(captions[a:a + batch_size]), list(range(a, a + len(captions[a:a + batch_size]))),
                        captions=captions[a:a + batch_size])
    return gen


def image_encoder(model: MatchingModel, s1: Stage1Source):
    @torch.no_grad()
    def enc(b: Batch):
        img = model.encode_images(b.features)
        return img, s1.image_vectors(b.features, img)
    return enc


def caption_encoder(model: MatchingModel, s1: Stage1Source, n_regions: int):
    @torch.no_grad()
    def enc(b: Batch):
        tokens, lengths = model.tokenize(b.captions)
        txt = model.encode_texts(tokens, lengths)
        return txt, s1.text_vectors(b.captions, txt, n_regions)
    return enc


# --- sharded encoding + merge ------------------------------------------------------------------

def _shard(n: int, rank: int, world: int) -> tuple[int, int]:
    return n * rank // world, n * (rank + 1) // world


def encode_sharded(work: Path, keys: list, make_batches, encode, dtype: str, fp: str, pad_to=None,
                   rank: int = 0, world: int = 1, progress: bool = True, desc: str = "encode") -> dict | None:
    """Each rank encodes its contiguous shard; rank 0 merges and returns the merged record
    (``keys``: kept inputs in row order, ``meta``: their Batch.meta, ``bad``, ``folder`` with
    stage1.npy and enc/, None when every input was skipped); others None."""
    a, b = _shard(len(keys), rank, world)
    part = work / f"part-{rank}-of-{world}"
    encode_part(part, fingerprint(fp, a, b), b - a, lambda done: make_batches(keys[a:b], done), encode, dtype,
                pad_to, desc=f"{desc} [{rank}/{world}]" if world > 1 else desc, progress=progress and rank == 0)
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
    merged = work / "merged"
    if merged.exists():
        shutil.rmtree(merged)
    concat_stores([p / "enc" for p in parts], merged / "enc", dtype)
    save_npy(merged / "stage1.npy", np.concatenate([np.load(p / "stage1.npy", mmap_mode="r") for p in parts]))
    return {**rec, "folder": merged}


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


def photo_folder(images, model_ckpt, backbone, weights, model, trained, manifest: dict):
    """A photo folder checked against the model it is indexed with: (its resolved root, the photos' relative
    paths, the backbone, regions per photo); the manifest gets the backbone and the source. The folder build
    and the Milvus build read it so."""
    from ..features.backbones import backbone_for
    from .report import found_kinds

    root = Path(images).resolve()
    pairs: list = []
    rels = scan_folder(root, pairs)
    bb = backbone_for(resolve_backbone(model_ckpt, backbone), weights)
    check_backbone(trained, bb.describe(), model.cfg.img_dim, root)
    manifest["backbone"] = bb.describe()
    manifest["source"] = {"kind": "images", "root": str(root)}
    manifest["found"] = found_kinds(root, rels + [p["raw"] for p in pairs])
    manifest["raw_pairs"] = pairs
    return root, rels, bb, bb.info.grid ** 2


def precomp_features(features, split: str, model, trained, manifest: dict):
    """A precomp split checked against the model it is indexed with: (regions, item names, images folder, the
    features); the manifest gets its source and backbone. The folder build and the Milvus build read it so."""
    from ..data.precomp import open_features, read_caption_lines
    from ..data.resolve import resolve_data
    from ..features.provenance import check_backbone
    from ..io import read_json

    froot = resolve_data(features).resolve()
    feats = open_features(froot / f"{split}_ims.npy")
    fj = froot / "features.json"
    used = read_json(fj).get("backbone") if fj.is_file() else None
    if used is not None:
        check_backbone(trained, used, model.cfg.img_dim, fj)
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
    img_dir = read_json(fj).get("images_dir") if fj.is_file() else None
    manifest["source"] = {"kind": "features", "root": str(froot), "split": split, "images_dir": img_dir}
    return feats.shape[1], names, img_dir, feats


def write_collection(dest: Path, folder: Path, items: list[dict], stage1) -> dict:
    """Make the collection folder ``dest`` of the encoded rows in ``folder`` (hard links: ``folder``
    stays whole), ``items`` and ``stage1`` (:func:`stage1_of`); the old version stays as ``dest.prev``
    until the commit (:func:`vlmatch.search.backends.folder.commit`). Returns the collection's entry of the
    manifest. Call it holding :func:`vlmatch.search.backends.folder.swapping`."""
    index, info = stage1
    with atomic_dir(dest, keep_prev=True) as tmp:
        link_tree(folder / "enc", tmp / "enc")
        link_tree(folder / "stage1.npy", tmp / "stage1.npy")
        fields = read_json(tmp / "enc" / "fields.json")
        # a new file (not the linked one): its id tells this collection's encodings from any other's
        write_json(tmp / "enc" / "fields.json", {**fields, "id": new_collection_id()})
        write_faiss(index, tmp / "stage1.faiss")
        write_json(tmp / "items.json", items, indent=None)
    return {"count": len(items), "stage1": info, "fields": fields["fields"]}


def versions() -> dict:
    import faiss

    from ..version import __version__

    return {"vlmatch": __version__, "torch": torch.__version__, "numpy": np.__version__, "faiss": faiss.__version__,
            "python": platform.python_version()}


def save_checkpoint(dest: Path, model: MatchingModel) -> None:
    """A copy of ``model`` as the part ``dest`` (the old one kept as ``dest.prev`` until the commit)."""
    with atomic_dir(dest, keep_prev=True) as tmp:
        model.save(tmp)


SCORES = ("model", "mean")  # stage 2's ranking score (see build_index)


def build_index(out, model_ckpt, images=None, features=None, split: str = "test", captions=None,
                retriever_ckpt=None, backbone: str | None = None, dtype: str = "float16", ann: str = "auto",
                nlist: int | None = None, hnsw_m: int = 32, skip_bad: bool = False, batch_size: int = 64,
                progress: bool = True, weights=None, overwrite: bool = False, score: str = "model",
                date_from_mtime: bool = False, open_vocab: bool | None = None) -> dict | None:
    """Build (or resume building) an index folder; returns the manifest (None on ranks > 0).

    ``open_vocab``: fuse the ranker's score with the zero-shot concept score (:mod:`vlmatch.search.open_vocab`);
    None: where the model ships with a fusion (the default does), True: required, False: never.

    ``score``: how stage 2 ranks the candidates: ``"model"`` (the model's own score) or ``"mean"`` (the
    mean of the model's and the retriever's scores: the two-model ensemble that ``vlmatch evaluate
    --checkpoint A B`` measures; needs a retriever).
    ``out`` must be new, empty or an index (or an interrupted build) of its own, and lie outside the
    image folder; ``overwrite`` lets it hold other files too, which are kept (see
    :func:`vlmatch.search.backends.folder.check_out`). One build or update of a folder at a time.
    ``date_from_mtime``: a photo without an EXIF capture time is dated by its file's mtime (recorded in the
    manifest's source, so updates do the same)."""
    if images is None and features is None and captions is None:
        raise ConfigError("index build needs --images DIR, --features DIR or --captions FILE")
    if images is not None and features is not None:
        raise ConfigError("index build takes --images or --features, not both")
    if score not in SCORES:
        raise ConfigError(f"--score {score!r}: expected one of {', '.join(SCORES)}")
    if score == "mean" and retriever_ckpt is None:
        raise ConfigError("--score mean averages the model's and the retriever's scores: give --retriever too")
    out = Path(out)
    if images is not None and not Path(images).is_dir():  # before --out is made (it would hold only a lock file)
        raise DataError(images, "image folder not found")
    D.init_from_env(torch.device("cpu"))
    rank, world = D.world()
    check_out(out, images, overwrite)  # every rank, before any of them writes
    D.barrier()
    if rank == 0:
        out.mkdir(parents=True, exist_ok=True)
    with writer_lock(out, "vlmatch index build") if rank == 0 else nullcontext():
        if rank == 0:
            recover(out)
        D.barrier()  # the other ranks write into build/ only once rank 0 holds the folder
        return _build(out, model_ckpt, images, features, split, captions, retriever_ckpt, backbone, dtype, ann, nlist,
                      hnsw_m, skip_bad, batch_size, progress, weights, rank, world, score, date_from_mtime, open_vocab)


def _build(out: Path, model_ckpt, images, features, split, captions, retriever_ckpt, backbone, dtype, ann, nlist,
           hnsw_m, skip_bad, batch_size, progress, weights, rank, world, score="model",
           date_from_mtime=False, open_vocab=None) -> dict | None:
    started = time.monotonic()
    model, model_info = load_index_model(model_ckpt)
    retriever, retriever_info = (None, None) if retriever_ckpt is None else load_index_model(retriever_ckpt)
    # a bad caption file is refused before any encoding (the image collection is written first)
    caption_rows = None if captions is None else read_captions(model, captions, ann, nlist)
    trained = checkpoint_backbone(model_ckpt)
    ov = open_vocab_for(retriever_ckpt or model_ckpt, trained, open_vocab)
    s1 = _stage1_source(model, retriever, ov)
    manifest = {"format": FORMAT, "created": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()),
                "reader": READER_VERSION, "model": model_info, "retriever": retriever_info, "stage1": s1.describe(),
                "score": score, "open_vocab": None if ov is None else ov.describe(),
                "dtype": dtype, "backbone": trained, "source": {}, "collections": {}, "versions": versions()}
    work = out / "build"
    bb = None
    n_regions = None
    if images is not None:
        root, rels, bb, n_regions = photo_folder(images, model_ckpt, backbone, weights, model, trained, manifest)
        dim = s1.check(n_regions)
        fp = fingerprint("images", rels, [file_stat(root, r)["size"] for r in rels], model_info["checkpoint_sha256"],
                         retriever_info and retriever_info["checkpoint_sha256"], bb.describe(), dtype,
                         *(["date-from-mtime"] if date_from_mtime else []),
                         *([manifest["open_vocab"]] if ov is not None else []))
        if date_from_mtime:
            manifest["source"]["date_from_mtime"] = True
        rec = encode_sharded(work / "images", rels,
                             lambda ks, done: image_batches(root, ks, bb, batch_size, skip_bad, date_from_mtime)(done),
                             image_encoder(model, s1), dtype, fp, rank=rank, world=world, progress=progress,
                             desc="index images")
        if rec is not None:
            items = [image_row(root, rel, i, meta) for i, (rel, meta) in enumerate(zip(rec["keys"], rec["meta"],
                                                                                         strict=True))]
            manifest["skipped"] = rec["bad"]
            manifest["next_id"] = len(items)
            took = time.monotonic() - started  # this run's (a resumed build's: since it resumed)
            manifest["build"] = {"seconds": round(took, 2), "encoded": len(items),
                                 "photos_per_s": round(len(items) / took, 2) if took > 0 else None}
    elif features is not None:
        n_regions, names, img_dir, feats = precomp_features(features, split, model, trained, manifest)
        froot = Path(manifest["source"]["root"])
        dim = s1.check(n_regions)
        rows = list(range(len(feats)))
        fp = fingerprint("features", str(froot), split, feats.shape, model_info["checkpoint_sha256"],
                         retriever_info and retriever_info["checkpoint_sha256"], dtype)
        rec = encode_sharded(work / "images", rows,
                             lambda ks, done: feature_batches(feats[ks[0]:ks[-1] + 1], ks, batch_size)(done),
                             image_encoder(model, s1), dtype, fp, rank=rank, world=world, progress=progress,
                             desc="index images")
        if rec is not None:
            items = [{"id": i, "path": str(Path(img_dir) / names[i]) if img_dir else names[i], "rel": names[i]}
                     for i in rec["keys"]]
            manifest["next_id"] = len(items)
    if rank != 0:
        return None
    if n_regions is None:  # a caption-only index: the placeholder image needs some region count
        n_regions = 1
    ready = {}  # collection -> (encoded rows' folder, items, stage-1 index): all the work, before any swap
    if images is not None or features is not None:
        if rec["folder"] is None:
            raise DataError(images or features, "nothing to index: every image was skipped")
        ready["images"] = rec["folder"], items, stage1_of(rec["folder"], ann, nlist, hnsw_m)
    if captions is not None:
        folder, cap_items = _encode_captions(work, model, s1, caption_rows, dtype, n_regions, batch_size, progress,
                                             model_info["checkpoint_sha256"])
        ready["captions"] = folder, cap_items, stage1_of(folder, ann, nlist, hnsw_m)
    with swapping(out):  # readers opening the index meanwhile wait for these renames and the commit
        for name, (folder, rows, stage1) in ready.items():
            manifest["collections"][name] = write_collection(out / name, folder, rows, stage1)
        if "images" in ready:
            manifest["dims"] = {"stage1": dim, "regions": n_regions, "img_dim": model.cfg.img_dim}
        if captions is not None:
            manifest.setdefault("dims", {"stage1": s1.check(n_regions), "regions": None, "img_dim": model.cfg.img_dim})
            manifest["source"]["captions"] = str(Path(captions).resolve())
        manifest["counts"] = {k: v["count"] for k, v in manifest["collections"].items()}
        save_checkpoint(out / "model", model)
        if retriever is not None:
            save_checkpoint(out / "retriever", retriever)
        return commit(out, manifest)


def _encode_captions(work, model, s1, caption_rows, dtype, n_regions, batch_size, progress, model_fp=None):
    caps, width = caption_rows  # read_captions: the lines and their longest token count
    fp = fingerprint("captions", caps, model.name, model_fp, dtype)
    folder = work / "captions"
    encode_part(folder, fp, len(caps), caption_batches(caps, batch_size), caption_encoder(model, s1, n_regions), dtype,
                pad_to=width, desc="index captions", progress=progress)
    return folder, [{"id": i, "text": c} for i, c in enumerate(caps)]


def update_index(path, skip_bad: bool = False, batch_size: int = 64, progress: bool = True, weights=None,
                 date_from_mtime: bool = False, concepts: bool = False) -> dict:
    """Re-scan an image-folder index: encode new and changed files, drop deleted ones, keep the rest.
    ``date_from_mtime`` (or a build that asked for it): new and changed photos without an EXIF capture
    time are dated by their file's mtime. ``concepts``: also encode every photo's concept columns again, with this
    vlmatch's lexicon, text encoder and basis (an index whose pins differ from them is refused until then)."""
    out = Path(path)
    require_manifest(out)  # before the lock file is made in a folder that holds no index
    with writer_lock(out, "vlmatch index update"):
        recover(out)
        return _update(out, *open_parts(out), skip_bad, batch_size, progress, weights, date_from_mtime, concepts)


def open_vocab_to_update(manifest: dict, concepts: bool = False):
    """(the open-vocabulary part an update encodes with, whether every photo must be encoded again to add it).
    An index built with the part keeps it (``concepts``: every photo's concept columns encoded again); one built
    with --no-open-vocab stays without; one built before the part existed (no ``open_vocab`` key) gets it where its
    model ships with a fusion: one more backbone pass per photo."""
    if manifest.get("open_vocab"):
        return open_vocab_of(manifest), concepts
    if "open_vocab" in manifest:
        if concepts:
            raise ConfigError("--concepts: this index was built without the open-vocabulary part (--no-open-vocab); "
                              "it has no concept columns to encode")
        return None, False
    ov = open_vocab_for(None, manifest.get("backbone"),
                        weights_sha256=(manifest.get("retriever") or manifest["model"]).get("sha256"))
    return ov, ov is not None


def _update(out: Path, manifest: dict, parts: dict, skip_bad, batch_size, progress, weights,
            date_from_mtime=False, concepts=False) -> dict:
    from ..features.backbones import backbone_for
    from ..models.registry import load_model

    kind = (manifest.get("source") or {}).get("kind")
    if kind != "images":
        raise ConfigError(f"{out}: only an index of an image folder can be updated (this one indexes "
                          f"{kind}); build it again instead")
    root = Path(manifest["source"]["root"])
    old_items = read_items(parts["images"] / "items.json", "path")
    by_rel = {it["rel"]: (row, it) for row, it in enumerate(old_items)}
    rels = scan_folder(root)
    # an index encoded by an older photo reader holds its EXIF-rotated photos as stored (sideways): those
    # are encoded again, as displayed (vlmatch.features.photo.READER_VERSION)
    stale_reader = manifest.get("reader", 1) < READER_VERSION
    ov, add_concepts = open_vocab_to_update(manifest, concepts)
    model = load_model(parts["model"], note_unsealed=False).eval()  # sealed by the index's manifest
    retriever = load_model(parts["retriever"], note_unsealed=False).eval() if "retriever" in parts else None
    s1 = _stage1_source(model, retriever, ov)
    if not add_concepts:  # new photos' concept columns must pair with the kept ones (and an index that would not
        check_pins(ov, manifest.get("open_vocab"), out, concepts_fix(out))  # search is not left as if up to date)
    keep_rows, keep_items, todo, report = plan_changes(root, rels, old_items, stale_reader, add_concepts)
    if not todo and len(keep_rows) == len(old_items) and not add_concepts:
        shutil.rmtree(out / "build", ignore_errors=True)  # what an update killed before its commit left
        if stale_reader:  # nothing was sideways: the index is as the current reader would encode it
            with swapping(out):
                commit(out, {**manifest, "reader": READER_VERSION}, ())
        return {**report, "skipped": []}
    bb = backbone_for(manifest["backbone"], weights)
    dtype = manifest["dtype"]
    work = out / "build" / "update"
    rec = {"keys": [], "meta": [], "bad": [], "folder": None}
    if todo:
        fp = fingerprint("update", todo, manifest["model"]["sha256"], manifest["created"])
        dfm = date_from_mtime or bool(manifest["source"].get("date_from_mtime"))
        if dfm:
            manifest["source"]["date_from_mtime"] = True
        rec = encode_sharded(work, todo, lambda ks, done: image_batches(root, ks, bb, batch_size, skip_bad, dfm)(done),
                             image_encoder(model, s1), dtype, fp, progress=progress, desc="index new images")
    next_id = manifest.get("next_id", len(old_items))
    new_items = []
    for rel, meta in zip(rec["keys"], rec["meta"], strict=True):
        if rel in by_rel:  # a changed file keeps its id
            new_items.append(image_row(root, rel, by_rel[rel][1]["id"], meta))
        else:
            new_items.append(image_row(root, rel, next_id, meta))
            next_id += 1
    items = keep_items + new_items
    if not items:
        raise DataError(root, "nothing left to index: every image was deleted or skipped")
    written = ()
    if new_items or len(keep_rows) < len(old_items):  # else only unreadable new files: the collection stands
        merged = out / "build" / "merged"
        if merged.exists():
            shutil.rmtree(merged)
        coll = parts["images"]
        folders, rows = [coll / "enc"], [keep_rows]
        # (none kept when every photo is encoded again: an old index getting its concept vectors is wider now)
        s1_parts = [np.load(coll / "stage1.npy", mmap_mode="r")[keep_rows]] if keep_rows else []
        if new_items:
            folders.append(rec["folder"] / "enc")
            rows.append(None)
            s1_parts.append(np.load(rec["folder"] / "stage1.npy"))
        concat_stores(folders, merged / "enc", dtype, rows)
        save_npy(merged / "stage1.npy", np.concatenate(s1_parts))
        info = manifest["collections"]["images"]["stage1"]
        stage1 = stage1_of(merged, info.get("requested", "auto"), info.get("nlist") if info["kind"] == "ivf" else None,
                           info.get("M", 32))
        written = ("images",)
    manifest["next_id"] = next_id
    manifest["reader"] = READER_VERSION
    manifest["open_vocab"] = None if ov is None else ov.describe()
    if ov is not None:
        manifest["stage1"] = s1.describe()
    manifest["counts"]["images"] = len(items)
    manifest["updated"] = time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime())
    manifest["skipped"] = rec["bad"]
    with swapping(out):  # readers opening the index meanwhile wait for the swap and the commit
        if written:
            manifest["collections"]["images"] = write_collection(out / "images", merged, items, stage1)
        commit(out, manifest, written)
    return {**report, "skipped": rec["bad"]}
