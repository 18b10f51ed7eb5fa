"""Search figures of the shipped default pair (issue "Trained models that ship"), run by benchmarks/search.py:

    python benchmarks/search.py default-build --images 1000     # index build from JPEGs, images/s
    python benchmarks/search.py default-scale --sizes 100000    # text query latency at scale
    python benchmarks/search.py real --pair default             # two-stage R@10 vs exhaustive, Flickr8k val

default-build: ``build_index`` on a folder of Flickr8k val JPEGs with the default pair (decode, resize,
  EfficientNet-Lite0 features, both models' encodings, the FAISS index, the commit): what
  ``vlmatch index build --images DIR --out IDX`` does without --model.
default-scale: n synthetic images (feature grids drawn near a codebook of 4096 random cells) go
  through the pair's real image encoders into a real index (float16 store, FAISS auto: HNSW above
  50k); each timed query is a real Flickr8k val caption through ``Index.search`` -- the text
  transformer, each model's text side, stage 1, stage 2 re-scoring of K = 100 -- batch 1.
"""

from __future__ import annotations

import json
import os
import shutil
import statistics
import time
from pathlib import Path

import numpy as np
import torch

from vlmatch_lab.caches import features_dir
from vlmatch_lab.paths import cache_root, data_root

HERE = Path(__file__).resolve().parent
CACHE = cache_root()  # $VLMATCH_CACHE
F8K = features_dir()  # the study's feature cache (Lite0, 224 px): its val captions are the queries
SHARED = data_root(check=False) / "flickr8k"  # $VLMATCH_DATA/flickr8k: the photos and Karpathy captions


def _pair():
    from vlmatch import pretrained

    model, retriever = pretrained.default_pair()
    return f"pretrained:{model}", (f"pretrained:{retriever}" if retriever else None)


def _val_captions(n: int) -> list[str]:
    caps = (F8K / "dev_caps.txt").read_text(encoding="utf-8").splitlines()
    rng = np.random.default_rng(0)
    return [caps[i] for i in rng.choice(len(caps), min(n, len(caps)), replace=False)]


def latency(values) -> dict:
    """p50 / p99 / mean in ms of per-query seconds."""
    v = np.asarray(values)
    return {"p50_ms": 1e3 * float(np.percentile(v, 50)), "p99_ms": 1e3 * float(np.percentile(v, 99)),
            "mean_ms": 1e3 * float(v.mean())}


def default_build(n_images: int) -> dict:
    """Index build from a folder of ``n_images`` Flickr8k val JPEGs with the default pair."""
    from vlmatch.search.build import build_index

    data = json.loads((SHARED / "dataset_flickr8k.json").read_text())
    names = [im["filename"] for im in data["images"] if im["split"] == "val"][:n_images]
    folder = CACHE / "search" / "default_jpegs"
    shutil.rmtree(folder, ignore_errors=True)
    folder.mkdir(parents=True)
    for name in names:
        (folder / name).symlink_to((SHARED / "images" / name).resolve())
    out = CACHE / "search" / "default_build"
    shutil.rmtree(out, ignore_errors=True)
    from vlmatch.models.registry import resolve_checkpoint

    model, retriever = _pair()
    t0 = time.time()
    build_index(out, resolve_checkpoint(model), images=folder,
                retriever_ckpt=retriever and resolve_checkpoint(retriever), progress=False)
    secs = time.time() - t0
    held = {k: os.environ[k] for k in ("ATEN_CPU_CAPABILITY", "ONEDNN_MAX_CPU_ISA", "MKL_ENABLE_INSTRUCTIONS")
            if k in os.environ}  # kernels held below the host's own (an AVX2 estimate on an AVX-512 host)
    return {"model": model, "retriever": retriever, "images": len(names), "seconds": secs,
            "images_per_s": len(names) / secs, "threads": torch.get_num_threads(),
            "kernels": " ".join(f"{k}={v}" for k, v in held.items()) or "the host's own"}


def _synthetic_batches(n: int, img_dim: int, k: int, batch: int, seed: int = 0):
    from vlmatch.search.encode import Batch

    rng = np.random.default_rng(seed)
    codes = np.maximum(rng.standard_normal((4096, img_dim)).astype(np.float32), 0)  # post-ReLU-like cells

    def gen(done: int):
        for a in range(done, n, batch):
            b = min(n, a + batch)
            cells = codes[rng.integers(0, len(codes), (b - a, k))]
            cells += 0.1 * rng.standard_normal(cells.shape).astype(np.float32)
            yield Batch(b - a, list(range(a, b)), features=torch.from_numpy(cells))
    return gen


def _timed_queries(idx, caps: list[str], candidates: int) -> dict:
    t = {"text": [], "stage1": [], "stage2": [], "total": []}
    for c in caps:
        t0 = time.perf_counter()
        idx.search(c, k=10, candidates=candidates)
        t["total"].append(time.perf_counter() - t0)
        for part in ("text", "stage1", "stage2"):
            t[part].append(idx.last_timings[part])
    return {p: latency(v) for p, v in t.items()}


def default_scale(n: int, queries: int, k: int = 49, candidates: int = 100, keep: bool = False) -> dict:
    """Text-query latency of the default pair on an index of ``n`` synthetic images (see the docstring).
    ``keep``: leave the index in $VLMATCH_CACHE/search/ and time an index kept there by an earlier run
    instead of building one (its build figures are then absent)."""
    import resource

    from vlmatch.search import Index
    from vlmatch.search.job import load_index_model, stage1_source

    torch.set_num_threads(2)
    model_ckpt, retriever_ckpt = _pair()
    from vlmatch.models.registry import resolve_checkpoint

    model, rec = load_index_model(resolve_checkpoint(model_ckpt))
    retriever, rrec = (load_index_model(resolve_checkpoint(retriever_ckpt)) if retriever_ckpt else (None, None))
    s1 = stage1_source(model, retriever)
    root = CACHE / "search" / f"default_{n}"
    manifest = json.loads((root / "manifest.json").read_text()) if (root / "manifest.json").is_file() else {}
    def same(kept, want):  # the commit adds a digest to each model record
        return (kept is None) == (want is None) and (want is None or all(kept.get(f) == v for f, v in want.items()))

    built = not (keep and same(manifest.get("model"), rec) and same(manifest.get("retriever"), rrec))  # same pair
    if built:
        build = _build_synthetic(root, n, k, model, retriever, rec, rrec, s1)
    else:
        build = {"encode_s": None, "faiss_s": None, "stage1": manifest["collections"]["images"]["stage1"]}
    disk_mb = sum(f.stat().st_size for f in root.rglob("*") if f.is_file()) / 2**20
    for f in sorted((root / "images").rglob("*")):  # a served index is hot: read it into the page cache once
        if f.is_file():
            with open(f, "rb") as fh:
                while fh.read(64 << 20):
                    pass
    from vlmatch.encoders.hf import HFTextEncoder

    idx = Index.open(root)
    caps = _val_captions(queries + 10)
    for c in caps[:10]:  # warm-up
        idx.search(c, k=10, candidates=candidates)
    lat = _timed_queries(idx, caps[10:], candidates)
    for m in (idx.model, idx.retriever):  # the same queries through the Hugging Face forward (A/B, one run)
        for mod in m.modules() if m is not None else ():
            if isinstance(mod, HFTextEncoder):
                mod.lean = False
    for c in caps[:10]:
        idx.search(c, k=10, candidates=candidates)
    lat_hf = _timed_queries(idx, caps[10:], candidates)
    out = {"n": n, "k": k, "candidates": candidates, "queries": queries, "model": model_ckpt,
           "retriever": retriever_ckpt, "built": built, "encode_s": build["encode_s"], "faiss_s": build["faiss_s"],
           "disk_mb": disk_mb, "stage1": build["stage1"], "latency": lat, "latency_hf_forward": lat_hf,
           "peak_rss_mb": resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024, "threads": torch.get_num_threads()}
    if not keep:
        shutil.rmtree(root, ignore_errors=True)
    return out


def _build_synthetic(root: Path, n: int, k: int, model, retriever, rec, rrec, s1) -> dict:
    from vlmatch.search.backends.folder import commit
    from vlmatch.search.build import save_checkpoint, stage1_of, write_collection
    from vlmatch.search.encode import encode_part
    from vlmatch.search.job import image_encoder, versions

    shutil.rmtree(root, ignore_errors=True)
    work = root / "build"
    t0 = time.time()
    prog = encode_part(work / "images", "synthetic", n, _synthetic_batches(n, model.cfg.img_dim, k, 256),
                       image_encoder(model, s1), "float16", progress=True, desc="encode")
    enc_secs = time.time() - t0
    t1 = time.time()
    coll = write_collection(root / "images", work / "images",
                            [synthetic_row(i) for i in range(prog["written"])],
                            stage1_of(work / "images", "auto", None, 32))
    faiss_secs = time.time() - t1
    save_checkpoint(root / "model", model)
    if retriever is not None:
        save_checkpoint(root / "retriever", retriever)
    dim = int(np.load(work / "images" / "stage1.npy", mmap_mode="r").shape[1])
    commit(root, {"model": rec, "retriever": rrec, "stage1": s1.describe(), "dtype": "float16", "backbone": None,
                  "source": {"kind": "synthetic"}, "collections": {"images": coll}, "counts": {"images": n},
                  "dims": {"stage1": dim, "regions": k, "img_dim": model.cfg.img_dim}, "versions": versions()})
    return {"encode_s": enc_secs, "faiss_s": faiss_secs, "stage1": coll["stage1"]}


def render(res: dict) -> list[str]:
    d = res.get("default_pair") or {}
    if not d:
        return []
    lines = ["## The shipped default pair", ""]
    b = d.get("build")
    if b:
        lines += [f"Index build from JPEGs (`index build --images` without --model: {b['model']}"
                  + (f" with stage 1 from {b['retriever']}" if b["retriever"] else "") + f"): {b['images']} Flickr8k val "
                  f"JPEGs in {b['seconds']:.1f} s, {b['images_per_s']:.1f} images/s (goal >= 20 on 2 cores of an "
                  f"AVX2-only host); kernels: {b.get('kernels', 'not recorded')}.", ""]
        runs = b.get("runs_images_per_s")
        if runs and len(runs) > 1:  # what the registry quotes: the median and range of the runs, not the best
            lines += [f"Over {len(runs)} runs: median **{statistics.median(runs):.1f} images/s**, range "
                      f"{min(runs):.1f}-{max(runs):.1f} ({b.get('runs_note', '')}).", ""]
        if b.get("isa"):
            lines += [f"- {b['isa']}", ""]
    sc = d.get("scale") or []
    if sc:
        lines += ["| images | stage 1 | disk MB | peak RSS MB | text p50/p99 ms | stage 1 p50/p99 ms | "
                  "stage 2 (K=100) p50/p99 ms | total p50/p99 ms |", "|---|---|---|---|---|---|---|---|"]
        for s in sc:
            lat = s["latency"]
            lines.append(f"| {s['n']} | {s['stage1']['kind']} | {s['disk_mb']:.0f} | {s['peak_rss_mb']:.0f} | "
                         + " | ".join(f"{lat[p]['p50_ms']:.1f} / {lat[p]['p99_ms']:.1f}"
                                      for p in ("text", "stage1", "stage2", "total")) + " |")
        lines += ["", f"{sc[-1]['queries']} real Flickr8k val captions, one at a time through `Index.search` (goal at 100k: "
                      "p50 < 20 ms, p99 < 60 ms). Images: synthetic feature grids through the pair's real image "
                      "encoders (the latency does not depend on what the photos show). Text: MiniLM through the "
                      "lean TorchScript forward that `Index.open` prepares (`vlmatch.encoders.bert_lean`)."]
        for s in sc:
            hf = s.get("latency_hf_forward")
            if hf:
                lines += ["", f"The same {s['queries']} queries at {s['n']} images in the same run through the Hugging Face "
                              f"forward instead: text p50 / p99 {hf['text']['p50_ms']:.1f} / {hf['text']['p99_ms']:.1f} ms "
                              f"(lean: {s['latency']['text']['p50_ms']:.1f} / {s['latency']['text']['p99_ms']:.1f}), total "
                              f"{hf['total']['p50_ms']:.1f} / {hf['total']['p99_ms']:.1f} ms."]
    if d.get("host"):
        lines += ["", f"Host: {d['host']}."]
    return lines + [""]


def synthetic_row(i: int) -> dict:
    """The table row of synthetic photo ``i``: no photo folder, so its path is its name in the index, the
    same as its ``rel`` (vlmatch.search.library.trust keeps such rows)."""
    name = f"synthetic/{i:06d}.jpg"
    return {"id": i, "path": name, "rel": name}
