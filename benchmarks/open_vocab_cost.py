"""What the open-vocabulary part (#58) costs the shipped default: index build speed and query latency, each
measured with and without it in one run, interleaved (A/B), on this host.

    python benchmarks/open_vocab_cost.py build --images 200 --runs 2       # Flickr8k val JPEGs, photos/s
    python benchmarks/open_vocab_cost.py latency --n 100000 --queries 200  # synthetic grids, text query latency

build: ``build_index`` of the same JPEG folder with ``open_vocab=False`` and ``True`` in turn (the concept vector
  comes from the same backbone pass; the name vectors are cached in $VLMATCH_CACHE before the timed runs, as after
  a user's first build).
latency: two indexes of ``n`` synthetic feature grids through the default's real image side (with and without the
  concept columns: float16 store, FAISS auto = HNSW above 50k), then the same real Flickr8k val captions through
  ``Index.search`` one at a time, alternating between the two indexes.
Writes benchmarks/results/open_vocab_cost.json and .md with the host's CPU flags.
"""

from __future__ import annotations

import argparse
import json
import shutil
import statistics
import sys
import time
from pathlib import Path

import numpy as np
import search_default as sd
import torch

from vlmatch_lab.caches import features_dir
from vlmatch_lab.host import cpu_flags, cpu_model
from vlmatch_lab.paths import cache_root

HERE = Path(__file__).resolve().parent
RESULTS = HERE / "results"
CACHE = cache_root() / "open_vocab"


def build(n_images: int, runs: int) -> dict:
    from vlmatch.models.registry import resolve_checkpoint
    from vlmatch.search.build import build_index

    data = json.loads((sd.SHARED / "dataset_flickr8k.json").read_text())
    names = [im["filename"] for im in data["images"] if im["split"] == "val"][:n_images]
    folder = CACHE / "jpegs"
    shutil.rmtree(folder, ignore_errors=True)
    folder.mkdir(parents=True)
    for name in names:
        (folder / name).symlink_to((sd.SHARED / "images" / name).resolve())
    model = resolve_checkpoint(sd._pair()[0])
    build_index(CACHE / "warm", model, images=folder, progress=False, open_vocab=True)  # name vectors cached
    times = {"without": [], "with": []}
    for _ in range(runs):
        for key, ov in (("without", False), ("with", True)):
            out = CACHE / f"build_{key}"
            shutil.rmtree(out, ignore_errors=True)
            t0 = time.perf_counter()
            build_index(out, model, images=folder, progress=False, open_vocab=ov)
            times[key].append(time.perf_counter() - t0)
    per_s = {k: [len(names) / t for t in v] for k, v in times.items()}
    return {"images": len(names), "runs": runs, "seconds": times, "images_per_s": per_s,
            "median_images_per_s": {k: statistics.median(v) for k, v in per_s.items()},
            "ratio_with_over_without": statistics.median(per_s["with"]) / statistics.median(per_s["without"])}


def synthetic_index(root: Path, n: int, open_vocab: bool):
    from vlmatch.models.registry import resolve_checkpoint
    from vlmatch.search.backends.folder import commit
    from vlmatch.search.build import save_checkpoint, stage1_of, write_collection
    from vlmatch.search.encode import encode_part
    from vlmatch.search.job import image_encoder, load_index_model, stage1_source, versions
    from vlmatch.search.open_vocab import OpenVocab

    ckpt = resolve_checkpoint(sd._pair()[0])
    model, rec = load_index_model(ckpt)
    ov = OpenVocab.for_model(ckpt, {"name": "efficientnet-lite2"}) if open_vocab else None
    s1 = stage1_source(model, None, ov)
    shutil.rmtree(root, ignore_errors=True)
    work = root / "build"
    prog = encode_part(work / "images", "synthetic", n, sd._synthetic_batches(n, model.cfg.img_dim, 100, 256),
                       image_encoder(model, s1), "float16", progress=True, desc="encode")
    coll = write_collection(root / "images", work / "images", [sd.synthetic_row(i) for i in range(prog["written"])],
                            stage1_of(work / "images", "auto", None, 32))
    save_checkpoint(root / "model", model)
    dim = int(np.load(work / "images" / "stage1.npy", mmap_mode="r").shape[1])
    commit(root, {"model": rec, "retriever": None, "stage1": s1.describe(), "dtype": "float16", "backbone": None,
                  "open_vocab": None if ov is None else ov.describe(),
                  "source": {"kind": "synthetic"}, "collections": {"images": coll}, "counts": {"images": n},
                  "dims": {"stage1": dim, "regions": 100, "img_dim": model.cfg.img_dim}, "versions": versions()})
    return root


def val_captions(n: int) -> list[str]:
    """The first ``n`` Flickr8k val captions (the default's feature cache holds them; else the Karpathy JSON)."""
    caps = features_dir(320, "efficientnet-lite2") / "dev_caps.txt"
    if caps.is_file():
        return caps.read_text(encoding="utf-8").splitlines()[:n]
    data = json.loads((sd.SHARED / "dataset_flickr8k.json").read_text())
    return [s["raw"] for im in data["images"] if im["split"] == "val" for s in im["sentences"]][:n]


def latency(n: int, queries: int) -> dict:
    from vlmatch.search import Index

    torch.set_num_threads(2)
    roots = {}
    for key in ("without", "with"):  # an index a killed run left whole is timed again, not rebuilt
        root = CACHE / f"synthetic_{key}_{n}"
        roots[key] = root if (root / "manifest.json").is_file() else synthetic_index(root, n, key == "with")
    idx = {key: Index.open(root) for key, root in roots.items()}
    caps = val_captions(queries + 10)
    for c in caps[:10]:
        for i in idx.values():
            i.search(c, k=10)
    t = {key: {"text": [], "stage1": [], "total": []} for key in idx}
    from vlmatch.encoders import hf

    for c in caps[10:]:
        for key, i in idx.items():  # alternating: the same moment of the machine for both
            hf._MEMO.clear()  # the other index's search of the same text must not hand this one its forward
            t0 = time.perf_counter()
            i.search(c, k=10)
            t[key]["total"].append(time.perf_counter() - t0)
            t[key]["text"].append(i.last_timings["text"])
            t[key]["stage1"].append(i.last_timings["stage1"])
    lat = {key: {p: sd.latency(v) for p, v in parts.items()} for key, parts in t.items()}
    for root in roots.values():
        shutil.rmtree(root, ignore_errors=True)
    return {"n": n, "queries": queries, "latency": lat,
            "ratio_p50_total": lat["with"]["total"]["p50_ms"] / lat["without"]["total"]["p50_ms"]}


def render(res: dict) -> str:
    lines = ["# The open-vocabulary part's cost (#58)", "",
             f"Host: {res['host']['cpu']}; flags {' '.join(res['host']['flags'])}.", ""]
    b = res.get("build")
    if b:
        lines += ["## Index build (Flickr8k val JPEGs, the shipped default)", "",
                  "| | images/s (median) | runs |", "|---|---:|---|"]
        for k in ("without", "with"):
            lines.append(f"| {k} the open-vocabulary part | {b['median_images_per_s'][k]:.1f} | "
                         f"{', '.join(f'{x:.1f}' for x in b['images_per_s'][k])} |")
        lines += ["", f"{b['images']} photos; with / without: **{b['ratio_with_over_without']:.3f}** (goal: within 5 %).",
                  ""]
    la = res.get("latency")
    if la:
        lines += [f"## Text query latency at {la['n']:,} photos", "",
                  "| | text p50/p99 ms | stage 1 p50/p99 ms | total p50/p99 ms |", "|---|---|---|---|"]
        for k in ("without", "with"):
            lat = la["latency"][k]
            lines.append(f"| {k} | " + " | ".join(f"{lat[p]['p50_ms']:.1f} / {lat[p]['p99_ms']:.1f}"
                                                  for p in ("text", "stage1", "total")) + " |")
        lines += ["", f"{la['queries']} Flickr8k val captions alternating between the two indexes (the text encoder's "
                      "in-memory memo emptied before each search); with / without "
                      f"(p50 total): **{la['ratio_p50_total']:.3f}** (goal: within 10 %).", ""]
    lines += [f"Commands: {'; '.join(f'`{c}`' for c in res.get('commands', []))}", ""]
    return "\n".join(lines)


def main(argv=None) -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    sub = ap.add_subparsers(dest="cmd", required=True)
    b = sub.add_parser("build")
    b.add_argument("--images", type=int, default=200)
    b.add_argument("--runs", type=int, default=2)
    la = sub.add_parser("latency")
    la.add_argument("--n", type=int, default=100000)
    la.add_argument("--queries", type=int, default=200)
    a = ap.parse_args(argv)
    path = RESULTS / "open_vocab_cost.json"
    res = json.loads(path.read_text()) if path.is_file() else {}
    res["host"] = {"cpu": cpu_model(), "flags": cpu_flags()}
    cmd = "python benchmarks/open_vocab_cost.py " + " ".join(argv if argv is not None else sys.argv[1:])
    res["commands"] = sorted({*res.get("commands", []), cmd})
    if a.cmd == "build":
        res["build"] = build(a.images, a.runs)
    else:
        res["latency"] = latency(a.n, a.queries)
    from vlmatch.io import write_json, write_text

    write_json(path, res)
    write_text(RESULTS / "open_vocab_cost.md", render(res))
    print(render(res))


if __name__ == "__main__":
    main()
