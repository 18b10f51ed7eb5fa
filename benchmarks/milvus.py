"""The folder index and the Milvus backend (milvus-lite) side by side on the same synthetic photos.

    python benchmarks/milvus.py --sizes 2000              # minutes on a small machine (the default)
    python benchmarks/milvus.py --sizes 100000            # the issue's size (#37): about 25 minutes and 14 GB

Each photo is a 7 x 7 x 512 stage-2 encoding (25,088 values: one Milvus row; today's grid) from the
search benchmark's generator (region vectors near shared random codes), stage 1 the mean of its
regions; the same arrays go into an index folder (EncodingWriter, FAISS) and into a milvus-lite
``.db`` (the backend's own row writer, its chunked layout, the manifest committed last). Then the
same synthetic queries (words drawn near one photo's regions, 8 words) are ranked on both through
``Index.rank_images`` (stage 1 top 100, stage 2 SCAN t-i re-scoring, top 10), and the figures are:
build seconds, disk MB, p50 / p99 ms of stage 1 + stage 2 per query, and how often both backends
return the same top-10 ids. Text encoding is the same on both and left out. Results go to
benchmarks/results/milvus.{json,md}.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import time
from pathlib import Path

import numpy as np
import search_default
import torch
from hostinfo import cpu_flags, cpu_model

HERE = Path(__file__).resolve().parent
CACHE = HERE / "cache" / "milvus"
RESULTS = HERE / "results"
GRID, D, STAGE1_D = 7, 512, 512


def _l2(x):
    return x / np.linalg.norm(x, axis=-1, keepdims=True)


def _size_mb(p: Path) -> float:
    if p.is_file():
        return p.stat().st_size / 2**20
    return sum(f.stat().st_size for f in p.rglob("*") if f.is_file()) / 2**20


def _models(root: Path):
    from vlmatch import create_model
    from vlmatch.data.vocab import Vocab

    vocab = Vocab.build(["a dog runs on the beach with a red ball near the water and a child"], 1)
    torch.manual_seed(0)
    model = create_model("scan_t2i_avg", img_dim=2048, embed_dim=D, word_dim=300, vocab_size=len(vocab))
    model.vocab = vocab
    return model, model.save(root / "ckpt")


def _photos(n: int, seed: int = 0):
    """Batches of (first id, regions (b, 49, 512) float32, stage-1 (b, 512)), and the codes that made them."""
    rng = np.random.default_rng(seed)
    codes = _l2(rng.standard_normal((4096, D)).astype(np.float32))
    noise = rng.standard_normal((8192, D)).astype(np.float32) * 0.03
    which = rng.integers(0, len(codes), (n, GRID * GRID))

    def batches(step=500):
        for a in range(0, n, step):
            b = min(n, a + step)
            v = _l2(codes[which[a:b]] + noise[rng.integers(0, len(noise), (b - a, GRID * GRID))])
            yield a, v, _l2(v.mean(axis=1))
    return codes, which, batches


def _manifest(model, ckpt, kind: str, n: int) -> dict:
    from vlmatch.search.build import versions
    from vlmatch.search.folder import checkpoint_digest
    from vlmatch.weights import sha256_file

    return {"model": {"name": model.name, "checkpoint": str(ckpt), "sha256": sha256_file(ckpt / "model.safetensors"),
                      "digest": checkpoint_digest(ckpt)},
            "retriever": None, "stage1": "synthetic: mean of regions / of words", "dtype": "float16", "backbone": None,
            "source": {"kind": "synthetic"}, "counts": {"images": n},
            "dims": {"stage1": STAGE1_D, "regions": GRID * GRID, "img_dim": 2048}, "versions": versions(),
            "score": "model", "kind": kind}


def build_folder(root: Path, n: int, model, ckpt) -> dict:
    from vlmatch.models.base import ImageEncoding
    from vlmatch.search.build import save_checkpoint, stage1_of, write_collection
    from vlmatch.search.folder import commit
    from vlmatch.search.store import EncodingWriter

    out = root / "folder"
    t0 = time.time()
    work = out / "build"
    w = EncodingWriter(work / "enc", n, "float16")
    s1 = np.lib.format.open_memmap(work / "stage1.npy", mode="w+", dtype=np.float32, shape=(n, STAGE1_D))
    for a, v, s in _photos(n)[2](step=200):
        w.write(a, ImageEncoding(regions=torch.from_numpy(v)))
        s1[a:a + len(v)] = s
    w.finish()
    s1.flush()
    del s1
    coll = write_collection(out / "images", work, [{"id": i, "path": f"synthetic/{i:06d}.jpg"} for i in range(n)],
                            stage1_of(work, "auto", None, 32))
    save_checkpoint(out / "model", model)
    m = _manifest(model, ckpt, "folder", n)
    m["model"] = {"name": model.name}
    commit(out, {**m, "collections": {"images": coll}})
    return {"build_s": time.time() - t0, "disk_mb": _size_mb(out), "stage1": coll["stage1"]["kind"]}


def build_milvus(root: Path, n: int, model, ckpt) -> dict:
    from vlmatch.models.base import ImageEncoding
    from vlmatch.search.folder import seal
    from vlmatch.search.milvus_build import write_rows
    from vlmatch.search.milvus_client import FORMAT, MANIFEST, connect, ensure_anchor, part_name, write_prop
    from vlmatch.search.milvus_layout import Layout, create_encodings, create_items, server_vector_type
    from vlmatch.search.stage1 import choose_kind

    db = root / "milvus.db"
    t0 = time.time()
    client = connect(str(db))
    ensure_anchor(client, "bench")
    kind = choose_kind("auto", n)
    layout = Layout.of(model.encode_images(torch.zeros(1, GRID * GRID, 2048)), "float16",
                       server_vector_type(client, "bench__g1_probe", "float16"))
    items, enc = part_name("bench", 1, "images"), part_name("bench", 1, "images", enc=True)
    create_items(client, items, STAGE1_D, kind, None, 32)
    create_encodings(client, enc, layout)
    for a, v, s in _photos(n)[2](step=200):
        ids = list(range(a, a + len(v)))
        write_rows(client, items, enc, layout, ids, [{"id": i, "path": f"synthetic/{i:06d}.jpg"} for i in ids],
                   torch.from_numpy(s), ImageEncoding(regions=torch.from_numpy(v)))
    for name in (items, enc):
        client.flush(name)
    m = _manifest(model, ckpt, "milvus", n)
    m.update(format=FORMAT, generation=1, next_id=n, collections={"images": {
        "count": n, "layout": layout.to_dict(),
        "stage1": {"kind": kind, "dim": STAGE1_D, "count": n, "requested": "auto", **({"M": 32} if kind == "hnsw" else {})}}})
    m["seal"] = seal(m)
    write_prop(client, "bench", MANIFEST, m)
    client.close()
    return {"build_s": time.time() - t0, "disk_mb": _size_mb(db), "stage1": kind, "vector": layout.vector,
            "rows_per_photo": layout.chunks}


def queries(n: int, count: int, seed: int = 1):
    from vlmatch.models.base import TextEncoding

    codes, which, _ = _photos(n)
    rng = np.random.default_rng(seed)
    out = []
    for _ in range(count):
        t = int(rng.integers(n))
        pick = rng.choice(GRID * GRID, 8, replace=False)
        words = _l2(codes[which[t, pick]] + rng.standard_normal((8, D)).astype(np.float32) * 0.03)
        out.append((TextEncoding(lengths=torch.tensor([8]), words=torch.from_numpy(words)[None]),
                    _l2(words.mean(axis=0))[None]))
    return out


def measure(idx, qs) -> tuple[dict, list]:
    for t, q in qs[:5]:  # warm-up
        idx.rank_images(t, q, k=10, candidates=100)
    secs, s1, s2, tops = [], [], [], []
    for t, q in qs:
        t0 = time.perf_counter()
        res = idx.rank_images(t, q, k=10, candidates=100)[0]
        secs.append(time.perf_counter() - t0)
        s1.append(idx.last_timings["stage1"])
        s2.append(idx.last_timings["stage2"])
        tops.append([r.id for r in res])
    return {**search_default.latency(secs), "stage1": search_default.latency(s1),
            "stage2": search_default.latency(s2)}, tops


def run_size(n: int, n_queries: int) -> dict:
    from vlmatch.search import Index

    torch.set_num_threads(int(os.environ.get("OMP_NUM_THREADS", "2")))
    root = CACHE / f"synth_{n}"
    if root.exists():
        shutil.rmtree(root)
    root.mkdir(parents=True)
    model, ckpt = _models(root)
    row = {"n": n, "folder": build_folder(root, n, model, ckpt), "milvus_lite": build_milvus(root, n, model, ckpt)}
    qs = queries(n, n_queries)
    folder = Index.open(root / "folder")
    t0 = time.time()
    lite = Index.open(milvus_uri=str(root / "milvus.db"), collection="bench")
    row["milvus_lite"]["open_s"] = time.time() - t0
    row["folder"]["query"], tops_f = measure(folder, qs)
    row["milvus_lite"]["query"], tops_m = measure(lite, qs)
    row["same_top10"] = float(np.mean([a == b for a, b in zip(tops_f, tops_m, strict=True)]))
    return row


def markdown(rows: list[dict], host: str) -> str:
    lines = ["# Folder index vs Milvus (milvus-lite), side by side", "",
             f"`python benchmarks/milvus.py --sizes {' '.join(str(r['n']) for r in rows)}` on {host}. Synthetic photos: "
             "7 x 7 x 512 float16 stage-2 encodings (one Milvus row each), 512-d stage 1; per query stage 1 (top 100) "
             "+ stage 2 (SCAN t-i re-scoring) to the top 10, text encoding left out (the same on both).", "",
             "| photos | backend | stage 1 | stage-2 rows | build s | disk MB | p50 ms | p99 ms | stage 1 p50 ms | "
             "stage 2 p50 ms | same top-10 |",
             "|---:|---|---|---|---:|---:|---:|---:|---:|---:|---:|"]
    for r in rows:
        for name, key in (("folder", "folder"), ("milvus-lite", "milvus_lite")):
            b = r[key]
            rows_kind = ("float16 store" if key == "folder" else
                         {"FLOAT16_PACKED": "float16 packed in FLOAT_VECTOR"}.get(b.get("vector"), "float32 FLOAT_VECTOR"))
            lines.append(f"| {r['n']:,} | {name} | {b['stage1']} | {rows_kind} | {b['build_s']:.1f} | {b['disk_mb']:.0f} | "
                         f"{b['query']['p50_ms']:.1f} | {b['query']['p99_ms']:.1f} | "
                         f"{b['query']['stage1']['p50_ms']:.1f} | {b['query']['stage2']['p50_ms']:.1f} | "
                         f"{r['same_top10']:.2f} |")
    lines += ["", "Same top-10: the share of queries whose ten ids are the same, in the same order, on both backends. "
              "milvus-lite has no FLOAT16_VECTOR: runs before 2026-11-26 widened the float16 values to float32 "
              "(FLOAT_VECTOR), later runs pack two float16 values to a FLOAT_VECTOR dimension (layout in each row); "
              "its stage 2 is the fetch of 100 rows of 25,088 floats through gRPC and pymilvus's Python lists."]
    return "\n".join(lines) + "\n"


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--sizes", type=int, nargs="+", default=[2000])
    p.add_argument("--queries", type=int, default=100)
    p.add_argument("--out", default=str(RESULTS / "milvus"))
    p.add_argument("--note", help="how the machine was used meanwhile (e.g. 'shared with a training job')")
    a = p.parse_args()
    host = f"{cpu_model()}, {os.cpu_count()} cores{f' ({a.note})' if a.note else ''}, OMP_NUM_THREADS=" \
           f"{os.environ.get('OMP_NUM_THREADS', 'unset')}, flags {' '.join(cpu_flags())}"
    rows = []
    for n in a.sizes:
        rows.append(run_size(n, a.queries))
        print(json.dumps(rows[-1]), flush=True)
    out = Path(a.out)
    out.with_suffix(".json").write_text(json.dumps({"host": host, "rows": rows}, indent=2) + "\n")
    out.with_suffix(".md").write_text(markdown(rows, host))
    print(markdown(rows, host))


if __name__ == "__main__":
    main()
