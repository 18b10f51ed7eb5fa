"""Feature extraction for a folder of images, with or without Karpathy annotations.

With annotations, each split is written in the precomp layout (``{split}_ims.npy``,
``{split}_caps.txt``, ``{split}_ids.txt``) so the existing loader reads it; without, a gallery
(``ims.npy`` + ``ids.txt``). ``features.json`` describes backbone, input size, normalisation, grid
and dtype. Features stream into a preallocated memory-mapped ``.npy`` (``*.partial`` until done);
``*.progress.json`` records how many images are finished, so an interrupted run continues where
it stopped. ``global_features=True`` also writes one pooled vector per image (``*_global.npy``).
"""

from __future__ import annotations

import hashlib
import json
import os
import time
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np
import torch
from tqdm.auto import tqdm

from ..data.karpathy import read_karpathy
from ..errors import DataError, VlmatchError
from ..io import write_json, write_text
from .backbones import Backbone, create_backbone

IMAGE_SUFFIXES = {".jpg", ".jpeg", ".png", ".bmp", ".webp", ".gif"}


@dataclass
class Job:
    """One output array: its images (relative paths), captions (or None) and output prefix."""

    prefix: str  # "train_" / "dev_" / "" for a gallery
    images: list[str]
    captions: list[list[str]] | None = None
    skipped: list[dict] = field(default_factory=list)


def load_image(path: Path, size: int) -> np.ndarray:
    from PIL import Image, UnidentifiedImageError

    try:
        with Image.open(path) as im:
            im = im.convert("RGB").resize((size, size), Image.BILINEAR)
            return np.asarray(im, dtype=np.uint8)
    except (OSError, UnidentifiedImageError, ValueError) as e:
        raise DataError(path, f"unreadable image ({e})") from None


def plan_jobs(images_dir: Path, annotations=None) -> list[Job]:
    if annotations is None:
        if not images_dir.is_dir():
            raise DataError(images_dir, "image folder not found")
        files = sorted(p.name for p in images_dir.iterdir() if p.suffix.lower() in IMAGE_SUFFIXES)
        if not files:
            raise DataError(images_dir, f"no images ({', '.join(sorted(IMAGE_SUFFIXES))})")
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


def _fingerprint(job: Job, backbone: Backbone, dtype: str, with_global: bool) -> str:
    h = hashlib.sha256(json.dumps([job.images, backbone.describe(), dtype, with_global]).encode())
    return h.hexdigest()


def run_job(job: Job, images_dir: Path, out: Path, backbone: Backbone, dtype: str, batch_size: int,
            with_global: bool, progress: bool = True) -> dict:
    """Extract one job, resuming a matching partial run; returns timing figures."""
    info = backbone.info
    n, regions = len(job.images), info.grid * info.grid
    final = out / f"{job.prefix}ims.npy"
    partial = out / f"{job.prefix}ims.npy.partial"
    gfinal, gpartial = out / f"{job.prefix}global.npy", out / f"{job.prefix}global.npy.partial"
    prog_path = out / f"{job.prefix}progress.json"
    fp = _fingerprint(job, backbone, dtype, with_global)
    done = 0
    if final.is_file() and prog_path.is_file() and json.loads(prog_path.read_text()).get("fingerprint") == fp \
            and json.loads(prog_path.read_text()).get("done") == n:
        return {"images": n, "seconds": 0.0, "resumed_from": n}
    if partial.is_file() and prog_path.is_file():
        prog = json.loads(prog_path.read_text())
        if prog.get("fingerprint") == fp:
            done = int(prog["done"])
    if done == 0:
        arr = np.lib.format.open_memmap(partial, mode="w+", dtype=dtype, shape=(n, regions, info.dim))
        garr = np.lib.format.open_memmap(gpartial, mode="w+", dtype=dtype, shape=(n, info.dim)) if with_global else None
    else:
        arr = np.load(partial, mmap_mode="r+")
        garr = np.load(gpartial, mmap_mode="r+") if with_global else None
    resumed_from = done
    t0 = time.time()
    bar = tqdm(total=n, initial=done, desc=f"extract {job.prefix or 'gallery'}", unit="img", disable=not progress)
    with torch.inference_mode():
        for a in range(done, n, batch_size):
            names = job.images[a:a + batch_size]
            x = backbone.preprocess([load_image(images_dir / p, info.input_size) for p in names])
            feats = backbone(x)
            arr[a:a + len(names)] = feats.numpy().astype(dtype)
            if garr is not None:
                garr[a:a + len(names)] = feats.mean(dim=1).numpy().astype(dtype)
            arr.flush()
            if garr is not None:
                garr.flush()
            write_json(prog_path, {"fingerprint": fp, "done": a + len(names), "total": n})
            bar.update(len(names))
            bar.set_postfix(img_per_s=f"{(a + len(names) - resumed_from) / max(time.time() - t0, 1e-9):.1f}")
    bar.close()
    seconds = time.time() - t0
    del arr, garr
    os.replace(partial, final)
    if with_global:
        os.replace(gpartial, gfinal)
    if job.captions is not None:
        write_text(out / f"{job.prefix}caps.txt", "".join(c.replace("\n", " ") + "\n" for cs in job.captions for c in cs))
    write_text(out / f"{job.prefix}ids.txt", "".join(p + "\n" for p in job.images))
    return {"images": n, "seconds": seconds, "resumed_from": resumed_from,
            "images_per_second": (n - resumed_from) / seconds if seconds > 0 else None}


def extract(images_dir, out, annotations=None, backbone: str | Backbone = "efficientnet-lite0", dtype="float32",
            batch_size: int = 32, skip_bad: bool = False, global_features: bool = False, weights=None,
            progress: bool = True, limit: int | None = None) -> dict:
    """Extract features for every image; returns (and writes) the ``features.json`` description."""
    if dtype not in ("float32", "float16"):
        raise VlmatchError(f"dtype must be float32 or float16, not {dtype!r}")
    images_dir, out = Path(images_dir), Path(out)
    bb = backbone if isinstance(backbone, Backbone) else create_backbone(backbone, weights)
    jobs = plan_jobs(images_dir, annotations)
    if limit:  # keep the first images of each split (smoke tests, quick looks)
        for j in jobs:
            j.images = j.images[:limit]
            j.captions = None if j.captions is None else j.captions[:limit]
    out.mkdir(parents=True, exist_ok=True)
    report = {"backbone": bb.describe(), "dtype": dtype, "regions": bb.info.grid ** 2,
              "global_features": global_features, "images_dir": str(images_dir),
              "annotations": None if annotations is None else str(annotations), "splits": {}}
    for job in jobs:
        if skip_bad:
            drop_bad(job, images_dir, bb.info.input_size)
        if not job.images:
            raise DataError(images_dir, f"no readable images left for {job.prefix or 'the gallery'}")
        stats = run_job(job, images_dir, out, bb, dtype, batch_size, global_features, progress)
        report["splits"][job.prefix.rstrip("_") or "gallery"] = {**stats, "skipped": job.skipped}
    write_json(out / "features.json", report)
    return report
