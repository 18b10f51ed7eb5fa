"""Feature extraction for a folder of images, with or without Karpathy annotations.

With annotations each split is written in the precomp layout (``{split}_ims.npy``, ``{split}_caps.txt``,
``{split}_ids.txt``); without, a gallery (``ims.npy``, ``ids.txt``); ``features.json`` describes the backbone
and dtype. Features stream into a memory-mapped ``*.partial`` with a ``*.progress.json``, so an interrupted run
continues where it stopped.
"""

from __future__ import annotations

import hashlib
import json
import os
import time
from dataclasses import dataclass, field, replace
from pathlib import Path

import numpy as np
import torch
from tqdm.auto import tqdm

from ..data.karpathy import read_karpathy
from ..data.resolve import source_hint
from ..errors import DataError, VlmatchError
from ..io import fsync_path, write_json, write_text
from .backbones import Backbone, create_backbone
from .photo import PHOTO_SUFFIXES, load_image
from .views import mirror_pixels


@dataclass(frozen=True)
class ExtractOptions:
    """How features are extracted: ``vlmatch features extract``'s flags (see its help)."""

    dtype: str = "float32"
    batch_size: int = 32
    input_size: int | None = None
    weights: str | Path | None = None
    skip_bad: bool = False
    global_features: bool = False
    mirror: bool = False
    limit: int | None = None
    progress: bool = True


@dataclass
class Job:
    """One output array: its images (relative paths), captions (or None) and output prefix."""

    prefix: str  # "train_" / "dev_" / "" for a gallery
    images: list[str]
    captions: list[list[str]] | None = None
    skipped: list[dict] = field(default_factory=list)


def name_problem(name: str) -> str | None:
    """Why an image's name cannot be one line of ids.txt (None if it can)."""
    if "\n" in name or "\r" in name:
        return "its name contains a line break"
    try:
        name.encode("utf-8")
    except UnicodeEncodeError:
        return "its name is not valid UTF-8"
    return None


def check_names(job: Job, images_dir: Path, skip_bad: bool) -> None:
    """Names that cannot be written to ids.txt stop the run up front (or are skipped with skip_bad)."""
    keep = [i for i, rel in enumerate(job.images) if name_problem(rel) is None]
    if len(keep) == len(job.images):
        return
    bad = [rel for rel in job.images if name_problem(rel) is not None]
    if not skip_bad:
        raise DataError(images_dir / bad[0], f"{name_problem(bad[0])}, so it cannot be listed in ids.txt "
                                             f"({len(bad)} such names in all); rename it or use --skip-bad")
    job.skipped += [{"image": rel, "error": name_problem(rel)} for rel in bad]
    job.images = [job.images[i] for i in keep]
    job.captions = None if job.captions is None else [job.captions[i] for i in keep]


def plan_jobs(images_dir: Path, annotations=None) -> list[Job]:
    if not images_dir.is_dir():
        raise DataError(images_dir, "image folder not found" + source_hint(images_dir))
    if annotations is not None and not Path(annotations).is_file():
        raise DataError(annotations, "annotation file not found" + source_hint(annotations))
    if annotations is None:
        files = sorted(p.name for p in images_dir.iterdir() if p.suffix.lower() in PHOTO_SUFFIXES)
        if not files:
            raise DataError(images_dir, f"no images ({', '.join(sorted(PHOTO_SUFFIXES))})")
        return [Job("", files)]
    splits = read_karpathy(annotations)
    jobs = []
    for split in ("train", "dev", "test"):
        if split in splits:
            items = splits[split]
            missing = [it.path for it in items if not (images_dir / it.path).is_file()]
            if missing:
                raise DataError(images_dir / missing[0], f"image listed in {annotations} not found "
                                                         f"({len(missing)} missing in all)")
            jobs.append(Job(f"{split}_", [it.path for it in items], [it.captions for it in items]))
    return jobs


def drop_bad(job: Job, images_dir: Path, size: int) -> None:
    """--skip-bad: find unreadable images up front and drop them (and their captions)."""
    keep, caps = [], []
    for i, rel in enumerate(tqdm(job.images, desc=f"checking {job.prefix or 'gallery'} images", leave=False)):
        try:
            load_image(images_dir / rel, size)
        except DataError as e:
            job.skipped.append({"image": rel, "error": e.problem})
            continue
        keep.append(rel)
        if job.captions is not None:
            caps.append(job.captions[i])
    job.images = keep
    job.captions = caps if job.captions is not None else None


def _fingerprint(job: Job, backbone: Backbone, dtype: str, with_global: bool, view: str = "") -> str:
    h = hashlib.sha256(json.dumps([job.images, backbone.describe(), dtype, with_global] + ([view] if view else [])).encode())
    return h.hexdigest()


def _captions_digest(job: Job) -> str | None:
    return None if job.captions is None else hashlib.sha256(json.dumps(job.captions).encode()).hexdigest()


def _read_progress(path: Path) -> dict:
    try:
        return json.loads(path.read_text())
    except (OSError, ValueError):
        return {}


def run_job(job: Job, images_dir: Path, out: Path, backbone: Backbone, opts: ExtractOptions, *, view: str = "") -> dict:
    """Extract one job, resuming a matching partial run; returns timing figures. ``{prefix}ims.npy`` renamed into
    place last marks the split complete; what an earlier run left under the final names is removed first, so
    features never pair with another run's captions. ``view="mirror"``: the mirror images, ``{prefix}mirror_ims.npy``."""
    info, dtype, batch_size = backbone.info, opts.dtype, opts.batch_size
    with_global = opts.global_features and not view
    n, regions = len(job.images), info.grid * info.grid
    tag = f"{job.prefix}{view + '_' if view else ''}"
    final = out / f"{tag}ims.npy"
    partial = out / f"{tag}ims.npy.partial"
    gfinal, gpartial = out / f"{job.prefix}global.npy", out / f"{job.prefix}global.npy.partial"
    caps_path, ids_path = out / f"{job.prefix}caps.txt", out / f"{job.prefix}ids.txt"
    prog_path = out / f"{tag}progress.json"
    fp = _fingerprint(job, backbone, dtype, with_global, view)
    prog = _read_progress(prog_path)
    matches = prog.get("fingerprint") == fp
    same_captions = prog.get("captions_sha256", _captions_digest(job)) == _captions_digest(job)
    if matches and prog.get("done") == n and same_captions and final.is_file() and ids_path.is_file() \
            and (job.captions is None or caps_path.is_file()) and (not with_global or gfinal.is_file()):
        return {"images": n, "seconds": 0.0, "resumed_from": n}
    for stale in (final,) if view else (final, gfinal, caps_path, ids_path):  # never mixed with what this run writes
        if stale.exists():
            stale.unlink()
    done = int(prog.get("done", 0)) if matches and partial.is_file() and (not with_global or gpartial.is_file()) else 0
    if done == 0:
        arr = np.lib.format.open_memmap(partial, mode="w+", dtype=dtype, shape=(n, regions, info.dim))
        garr = np.lib.format.open_memmap(gpartial, mode="w+", dtype=dtype, shape=(n, info.dim)) if with_global else None
    else:
        arr = np.load(partial, mmap_mode="r+")
        garr = np.load(gpartial, mmap_mode="r+") if with_global else None
    resumed_from = done
    t0 = time.time()
    bar = tqdm(total=n, initial=done, desc=f"extract {tag.rstrip('_') or 'gallery'}", unit="img",
               disable=not opts.progress)
    look = mirror_pixels if view == "mirror" else (lambda px: px)
    with torch.inference_mode():
        for a in range(done, n, batch_size):
            names = job.images[a:a + batch_size]
            x = backbone.preprocess([look(load_image(images_dir / p, info.input_size)) for p in names])
            feats = backbone(x)
            arr[a:a + len(names)] = feats.numpy().astype(dtype)
            arr.flush()
            if garr is not None:
                garr[a:a + len(names)] = feats.mean(dim=1).numpy().astype(dtype)
                garr.flush()
            write_json(prog_path, {"fingerprint": fp, "done": a + len(names), "total": n})
            bar.update(len(names))
            bar.set_postfix(img_per_s=f"{(a + len(names) - resumed_from) / max(time.time() - t0, 1e-9):.1f}")
    bar.close()
    seconds = time.time() - t0
    del arr, garr
    if job.captions is not None and not view:
        write_text(caps_path, "".join(c.replace("\n", " ").replace("\r", " ") + "\n" for cs in job.captions for c in cs))
    if not view:
        write_text(ids_path, "".join(p + "\n" for p in job.images))  # names were checked by check_names
    for path in (partial, gpartial) if with_global else (partial,):
        fsync_path(path)
    if with_global:
        os.replace(gpartial, gfinal)
    os.replace(partial, final)  # last: the split is complete once its features carry the final name
    fsync_path(out)
    write_json(prog_path, {"fingerprint": fp, "done": n, "total": n, "captions_sha256": _captions_digest(job)})
    return {"images": n, "seconds": seconds, "resumed_from": resumed_from,
            "images_per_second": (n - resumed_from) / seconds if seconds > 0 else None}


def extract(images_dir, out, annotations=None, backbone: str | Backbone = "efficientnet-lite0",
            options: ExtractOptions | None = None, **settings) -> dict:
    """Extract features for every image; returns (and writes) the ``features.json`` description. ``options``: an
    :class:`ExtractOptions`, or its fields as keyword arguments (``extract(images, out, dtype="float16")``)."""
    opts = replace(options or ExtractOptions(), **settings)
    if opts.dtype not in ("float32", "float16"):
        raise VlmatchError(f"dtype must be float32 or float16, not {opts.dtype!r}")
    images_dir, out = Path(images_dir), Path(out)
    bb = backbone if isinstance(backbone, Backbone) else create_backbone(backbone, opts.weights, opts.input_size)
    jobs = plan_jobs(images_dir, annotations)
    if opts.limit:
        for j in jobs:
            j.images = j.images[:opts.limit]
            j.captions = None if j.captions is None else j.captions[:opts.limit]
    for job in jobs:  # before anything is written
        check_names(job, images_dir, opts.skip_bad)
    out.mkdir(parents=True, exist_ok=True)
    report = {"backbone": bb.describe(), "dtype": opts.dtype, "regions": bb.info.grid ** 2,
              "global_features": opts.global_features, "images_dir": str(images_dir),
              "annotations": None if annotations is None else str(annotations), "splits": {}}
    before = _read_progress(out / "features.json").get("splits", {})  # a split found complete keeps its figures
    for job in jobs:
        if opts.skip_bad:
            drop_bad(job, images_dir, bb.info.input_size)
        if not job.images:
            raise DataError(images_dir, f"no readable images left for {job.prefix or 'the gallery'}")
        stats = run_job(job, images_dir, out, bb, opts)
        name = job.prefix.rstrip("_") or "gallery"
        if stats["resumed_from"] == stats["images"] and name in before:
            stats = {k: v for k, v in before[name].items() if k not in ("skipped", "mirror")}
        if opts.mirror:
            stats["mirror"] = run_job(job, images_dir, out, bb, opts, view="mirror")
        report["splits"][name] = {**stats, "skipped": job.skipped}
    write_json(out / "features.json", report)
    return report
