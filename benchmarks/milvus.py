"""The folder index and the Milvus backend (milvus-lite) side by side on the same synthetic photos.

    python benchmarks/milvus.py --sizes 2000              # minutes on a small machine (the default)
    python benchmarks/milvus.py --sizes 100000 --shape global-1024   # the default model's shape at the issue's size

Two shapes (``--shape``). ``scan-7x7`` (the first shipped pair's): each photo is a 7 x 7 x 512 stage-2
encoding (25,088 values: one Milvus row) from the search benchmark's generator (region vectors near
shared random codes), stage 1 the mean of its regions, stage 2 SCAN t-i re-scoring; 100,000 photos
need more than this host's 24 GB in milvus-lite. ``global-1024`` (the default's shape,
vsepp-lite2-320-grounded-f8k): each photo is one 1024-d VSE++ embedding (near a mix of shared codes), stage 1
the same vector, stage 2 its float16 copy re-scored by the inner product. The same arrays go into an
index folder (EncodingWriter, FAISS) and into a milvus-lite ``.db`` (the backend's own row writer, its
chunked layout, the manifest committed last). Then the same synthetic queries (near one photo's codes)
are ranked on both through ``Index.rank_images`` (stage 1 top 100, stage 2, top 10), and the figures are:
build seconds, disk MB, p50 / p99 ms of stage 1 + stage 2 per query, and how often both backends
return the same top-10 ids. Text encoding is the same on both and left out. Results go to
benchmarks/results/milvus.{json,md}; a run replaces the rows of its own sizes and shape and keeps the others.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import time
from dataclasses import asdict
from pathlib import Path

import numpy as np
import search_default
import torch

from vlmatch_lab.host import cpu_flags, cpu_model
from vlmatch_lab.paths import cache_root

HERE = Path(__file__).resolve().parent
CACHE = cache_root() / "milvus"
RESULTS = HERE / "results"
GRID, D, STAGE1_D = 7, 512, 512
GLOBAL_D, MIX = 1024, 4  # global-1024: one embedding per photo, made from MIX shared codes
SHAPES = ("scan-7x7", "global-1024")


def _l2(x):
    return x / np.linalg.norm(x, axis=-1, keepdims=True)


def _size_mb(p: Path) -> float:
    if p.is_file():
        return p.stat().st_size / 2**20
    return sum(f.stat().st_size for f in p.rglob("*") if f.is_file()) / 2**20


def _models(root: Path, shape: str):
    from vlmatch import create_model
    from vlmatch.data.vocab import Vocab

    vocab = Vocab.build(["a dog runs on the beach with a red ball near the water and a child"], 1)
    torch.manual_seed(0)
    if shape == "scan-7x7":
        model = create_model("scan_t2i_avg", img_dim=2048, embed_dim=D, word_dim=300, vocab_size=len(vocab))
    else:
        model = create_model("vsepp", img_dim=2048, embed_dim=GLOBAL_D, word_dim=300, vocab_size=len(vocab))
    model.vocab = vocab
    return model, model.save(root / "ckpt")


def _dims(shape: str) -> tuple[int, int]:
    """(values per code, stage-1 dims) of a shape."""
    return (D, STAGE1_D) if shape == "scan-7x7" else (GLOBAL_D, GLOBAL_D)


def _photos(n: int, shape: str, seed: int = 0):
    """Batches of (first id, the photo's stage-2 encoding, stage-1 (b, d)), and the codes that made them:
    scan-7x7: 49 region vectors (b, 49, 512), each near one code; global-1024: one vector (b, 1024) near the
    mean of MIX codes."""
    d = _dims(shape)[0]
    per_photo = GRID * GRID if shape == "scan-7x7" else MIX
    rng = np.random.default_rng(seed)
    codes = _l2(rng.standard_normal((4096, d)).astype(np.float32))
    noise = rng.standard_normal((8192, d)).astype(np.float32) * 0.03
    which = rng.integers(0, len(codes), (n, per_photo))

    def batches(step=500):
        for a in range(0, n, step):
            b = min(n, a + step)
            v = _l2(codes[which[a:b]] + noise[rng.integers(0, len(noise), (b - a, per_photo))])
            if shape == "scan-7x7":
                yield a, v, _l2(v.mean(axis=1))
            else:
                e = _l2(v.mean(axis=1))
                yield a, e, e
    return codes, which, batches


def _encoding(shape: str, v: np.ndarray):
    from vlmatch.models.base import ImageEncoding

    t = torch.from_numpy(np.ascontiguousarray(v))
    return ImageEncoding(regions=t) if shape == "scan-7x7" else ImageEncoding(embedding=t)


def _manifest(model, ckpt, kind: str, n: int, shape: str) -> dict:
    from vlmatch.checkpoints.digest import checkpoint_digest
    from vlmatch.search.job import versions
    from vlmatch.weights import sha256_file

    return {"model": {"name": model.name, "checkpoint": str(ckpt), "sha256": sha256_file(ckpt / "model.safetensors"),
                      "digest": checkpoint_digest(ckpt)},
            "retriever": None, "stage1": f"synthetic ({shape})", "dtype": "float16", "backbone": None,
            "source": {"kind": "synthetic"}, "counts": {"images": n},
            "dims": {"stage1": _dims(shape)[1], "regions": GRID * GRID, "img_dim": 2048}, "versions": versions(),
            "score": "model", "kind": kind}


def build_folder(root: Path, n: int, model, ckpt, shape: str) -> dict:
    from vlmatch.search.backends.folder import commit
    from vlmatch.search.build import save_checkpoint, stage1_of, write_collection
    from vlmatch.search.store import EncodingWriter

    out = root / "folder"
    t0 = time.time()
    work = out / "build"
    w = EncodingWriter(work / "enc", n, "float16")
    s1 = np.lib.format.open_memmap(work / "stage1.npy", mode="w+", dtype=np.float32, shape=(n, _dims(shape)[1]))
    for a, v, s in _photos(n, shape)[2](step=200):
        w.write(a, _encoding(shape, v))
        s1[a:a + len(v)] = s
    w.finish()
    s1.flush()
    del s1
    coll = write_collection(out / "images", work, [search_default.synthetic_row(i) for i in range(n)],
                            stage1_of(work, "auto", None, 32))
    save_checkpoint(out / "model", model)
    m = _manifest(model, ckpt, "folder", n, shape)
    m["model"] = {"name": model.name}
    commit(out, {**m, "collections": {"images": coll}})
    return {"build_s": time.time() - t0, "disk_mb": _size_mb(out), "stage1": coll["stage1"]["kind"]}


def build_milvus(root: Path, n: int, model, ckpt, shape: str, uri: str | None = None) -> dict:
    """Into milvus-lite (``root/milvus.db``) or the server at ``uri`` (its collections dropped first)."""
    from vlmatch.search.backends.folder import seal
    from vlmatch.search.backends.milvus.build import Names, compact, wait_indexed, write_rows
    from vlmatch.search.backends.milvus.client import (
        FORMAT,
        MANIFEST,
        connect,
        ensure_anchor,
        last_write_ts,
        part_name,
        write_prop,
    )
    from vlmatch.search.backends.milvus.layout import Layout, create_encodings, create_items, vector_type
    from vlmatch.search.backends.milvus.probe import probe
    from vlmatch.search.stage1 import choose_kind

    db = root / "milvus.db"
    t0 = time.time()
    client = connect(uri or str(db))
    for name in client.list_collections() if uri else []:
        client.drop_collection(name)
    ensure_anchor(client, "bench")
    kind = choose_kind("auto", n)
    caps = probe(client, "bench", uri)
    layout = Layout.of(model.encode_images(torch.zeros(1, GRID * GRID, 2048)), "float16",
                       vector_type(caps["float16_vector"], "float16"))
    items, enc = part_name("bench", 1, "images"), part_name("bench", 1, "images", enc=True)
    stage1_d = _dims(shape)[1]
    create_items(client, items, stage1_d, kind, None, 32)
    create_encodings(client, enc, layout)
    for a, v, s in _photos(n, shape)[2](step=200):
        ids = list(range(a, a + len(v)))
        write_rows(client, Names(items, enc), layout, [search_default.synthetic_row(i) for i in ids],
                   vectors=torch.from_numpy(np.ascontiguousarray(s)), encodings=_encoding(shape, v))
    for name in (items, enc):
        client.flush(name)
    wait_indexed(client, items)
    compact_s = compact(client, uri or str(db), (items, enc), items)  # as vlmatch's own build and update do
    m = _manifest(model, ckpt, "milvus", n, shape)
    m.update(format=FORMAT, generation=1, next_id=n, capabilities=caps, read_ts=last_write_ts(client, [items, enc]),
             collections={"images": {
        "count": n, "layout": asdict(layout),
        "stage1": {"kind": kind, "dim": stage1_d, "count": n, "requested": "auto", **({"M": 32} if kind == "hnsw" else {})}}})
    m["seal"] = seal(m)
    write_prop(client, "bench", MANIFEST, m)
    if uri:  # the server builds its index and loads the collection when first opened: part of the build
        from vlmatch.search import Index

        Index.open(milvus_uri=uri, collection="bench")
    client.close()
    return {"build_s": time.time() - t0, "compact_s": compact_s, "disk_mb": None if uri else _size_mb(db), "stage1": kind,
            "vector": layout.vector, "rows_per_photo": layout.chunks}


def queries(n: int, count: int, shape: str, seed: int = 1):
    from vlmatch.models.base import TextEncoding

    codes, which, _ = _photos(n, shape)
    rng = np.random.default_rng(seed)
    out = []
    for _ in range(count):
        t = int(rng.integers(n))
        if shape == "scan-7x7":  # 8 words, each near one of the photo's region codes
            pick = rng.choice(GRID * GRID, 8, replace=False)
            words = _l2(codes[which[t, pick]] + rng.standard_normal((8, D)).astype(np.float32) * 0.03)
            out.append((TextEncoding(lengths=torch.tensor([8]), words=torch.from_numpy(words)[None]),
                        _l2(words.mean(axis=0))[None]))
        else:  # a sentence vector near the mean of 3 of the photo's 4 codes
            pick = rng.choice(MIX, 3, replace=False)
            e = _l2(codes[which[t, pick]].mean(axis=0) + rng.standard_normal(GLOBAL_D).astype(np.float32) * 0.03)
            out.append((TextEncoding(lengths=torch.tensor([8]), embedding=torch.from_numpy(e)[None]), e[None]))
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


def run_size(n: int, n_queries: int, shape: str, server=None, lite: bool = True) -> dict:
    from vlmatch.search import Index

    torch.set_num_threads(int(os.environ.get("OMP_NUM_THREADS", "2")))
    root = CACHE / f"synth_{shape}_{n}"
    if root.exists():
        shutil.rmtree(root)
    root.mkdir(parents=True)
    model, ckpt = _models(root, shape)
    row = {"n": n, "shape": shape, "folder": build_folder(root, n, model, ckpt, shape)}
    qs = queries(n, n_queries, shape)
    folder = Index.open(root / "folder")
    row["folder"]["query"], tops_f = measure(folder, qs)
    tops_m = tops_s = None
    if lite:
        row["milvus_lite"] = build_milvus(root, n, model, ckpt, shape)
        t0 = time.time()
        lite_idx = Index.open(milvus_uri=str(root / "milvus.db"), collection="bench")
        row["milvus_lite"]["open_s"] = time.time() - t0
        row["milvus_lite"]["query"], tops_m = measure(lite_idx, qs)
        row["same_top10"] = float(np.mean([a == b for a, b in zip(tops_f, tops_m, strict=True)]))
    if server is not None:  # the Milvus server process (benchmarks' own, started by main)
        row["milvus_server"] = build_milvus(root, n, model, ckpt, shape, uri=server.uri)
        t0 = time.time()
        srv = Index.open(milvus_uri=server.uri, collection="bench")
        row["milvus_server"]["open_s"] = time.time() - t0
        row["milvus_server"]["query"], tops_s = measure(srv, qs)
        row["milvus_server"]["same_top10"] = float(np.mean([a == b for a, b in zip(tops_f, tops_s, strict=True)]))
    if shape == "global-1024":  # where the two differ: each backend's top 10 against the exact top 10
        exact = exact_top10(n, qs)
        for key, tops in (("folder", tops_f), ("milvus_lite", tops_m), ("milvus_server", tops_s)):
            if tops is None:
                continue
            row[key]["recall10_vs_exact"] = float(np.mean([len(set(t) & set(e)) / 10 for t, e in
                                                           zip(tops, exact, strict=True)]))
    return row


def exact_top10(n: int, qs) -> list[list[int]]:
    """global-1024: the ten photos of largest inner product with each query over all n photos, from the same
    float16 values stage 2 re-scores (what an index without stage 1 would return)."""
    emb = np.concatenate([v for _, v, _ in _photos(n, "global-1024")[2](step=5000)]).astype(np.float16)
    emb = emb.astype(np.float32)
    out = []
    for _, q in qs:
        s = emb @ q[0]
        top = np.argpartition(-s, 10)[:10]
        out.append([int(i) for i in top[np.argsort(-s[top], kind="stable")]])
    return out


def markdown(rows: list[dict], oom_at: int | None = None) -> str:
    lines = ["# Folder index vs Milvus (milvus-lite and a Milvus 2.3.5 server process), side by side", "",
             "`python benchmarks/milvus.py --sizes N ... --shape SHAPE` (`OMP_NUM_THREADS=1`, nothing else running). "
             "Synthetic photos of two shapes: `scan-7x7`, the first shipped pair's (7 x 7 x 512 float16 stage-2 "
             "encodings, one Milvus row each, 512-d stage 1, stage 2 SCAN t-i re-scoring), and `global-1024`, "
             "the shipped default's (one 1024-d VSE++ embedding per photo, stage 1 the same vector, stage 2 its float16 "
             "copy; since 2026-11-27 a model whose score is its stage-1 inner product skips stage 2, so stage 2 is "
             "only the top 10's table rows). Per query stage 1 (top 100) + stage 2 to the top 10; text encoding left "
             "out (the same on both). A server's build ends with a compaction (in its build seconds). "
             "Hosts below the table.", "",
             "| photos | shape | backend | stage 1 | stage-2 rows | build s | disk MB | p50 ms | p99 ms | "
             "stage 1 p50 ms | stage 2 p50 ms | same top-10 | R@10 vs exact |",
             "|---:|---|---|---|---|---:|---:|---:|---:|---:|---:|---:|---:|"]
    hosts = []
    for r in rows:
        if r["host"] not in hosts:
            hosts.append(r["host"])
        for name, key in (("folder", "folder"), ("milvus-lite", "milvus_lite"), ("milvus server 2.3.5", "milvus_server")):
            if key not in r:
                continue
            b = r[key]
            rows_kind = ("float16 store" if key == "folder" else
                         {"FLOAT16_PACKED": "float16 packed in FLOAT_VECTOR"}.get(b.get("vector"), "float32 FLOAT_VECTOR"))
            if b.get("earlier"):
                name += " (an earlier run)"
            build = f"{b['build_s']:.1f}" + (f" (compaction {b['compact_s']:.0f})" if b.get("compact_s") else "")
            same = b.get("same_top10", r.get("same_top10"))
            lines.append(f"| {r['n']:,} | {r['shape']} | {name} | {b['stage1']} | {rows_kind} | {build} | "
                         f"{'-' if b['disk_mb'] is None else format(b['disk_mb'], '.0f')} | {b['query']['p50_ms']:.1f} | "
                         f"{b['query']['p99_ms']:.1f} | "
                         f"{b['query']['stage1']['p50_ms']:.1f} | {b['query']['stage2']['p50_ms']:.1f} | "
                         f"{'-' if key == 'folder' or same is None else format(same, '.2f')} | "
                         f"{_fmt(b.get('recall10_vs_exact'))} |")
    lines += ["", "Same top-10: the share of queries whose ten ids are the same, in the same order, on both backends. "
              "R@10 vs exact (global-1024): the share of the exact ten (all photos scored) in the backend's ten; "
              "where stage 1 is HNSW (100,000 photos) the two backends' graphs differ (FAISS's and Milvus's), "
              "and so do some of their candidates. "
              "milvus-lite has no FLOAT16_VECTOR: runs before 2026-11-26 widened the float16 values to float32 "
              "(FLOAT_VECTOR), later runs pack two float16 values to a FLOAT_VECTOR dimension (layout in each row); "
              "its stage 2 is the fetch of 100 rows through gRPC and pymilvus's Python lists. "
              "The server rows (`--server`): the embedded Milvus 2.3.5 standalone on the same host, reads at the "
              "commit's guarantee timestamp (not Strong); its build includes building the index and loading the "
              "collection; disk not measured (its folder holds its own logs and WAL)."]
    if oom_at:
        lines += ["", f"scan-7x7 at {oom_at:,} photos: milvus-lite holds a collection inside its process; it passed 13 GB "
                  "while loading and the kernel's OOM killer stopped it at 24 GB resident (float32 and packed rows alike)."]
    lines += ["", "Hosts:", ""]
    lines += [f"- {h}" for h in hosts]
    return "\n".join(lines) + "\n"


def _fmt(x) -> str:
    return "-" if x is None else f"{x:.3f}"


def merge(old: dict | None, rows: list[dict]) -> list[dict]:
    """The earlier file's rows (each given the file's host if it has none) with this run's replacing the same
    (size, shape); ordered by shape, then size."""
    kept = []
    for r in (old or {}).get("rows", []):
        r = {"shape": "scan-7x7", "host": old.get("host", "unknown"), **r}
        new = next((x for x in rows if (r["n"], r["shape"]) == (x["n"], x["shape"])), None)
        if new is None:
            kept.append(r)
        elif "milvus_lite" not in new and "milvus_lite" in r:  # a --no-lite run keeps the earlier milvus-lite figures
            new["milvus_lite"] = {**r["milvus_lite"], "earlier": True, "same_top10": r.get("same_top10")}
    return sorted(kept + rows, key=lambda r: (SHAPES.index(r["shape"]), r["n"]))


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--sizes", type=int, nargs="+", default=[2000])
    p.add_argument("--shape", choices=SHAPES, default="scan-7x7")
    p.add_argument("--queries", type=int, default=100)
    p.add_argument("--out", default=str(RESULTS / "milvus"))
    p.add_argument("--note", help="how the machine was used meanwhile (e.g. 'shared with a training job')")
    p.add_argument("--no-lite", action="store_true", help="leave milvus-lite out (the folder and, with --server, the "
                   "server only)")
    p.add_argument("--server", action="store_true", help="also a Milvus server process (the embedded Milvus "
                   "2.3.5 standalone of `pip install 'vlmatch[milvus-server]'`, started in a temporary folder)")
    a = p.parse_args()
    server = None
    if a.server:
        import tempfile

        from vlmatch_lab.milvus_server import MilvusTestServer  # finds the server package `milvus`, not this script

        server = MilvusTestServer(tempfile.mkdtemp(prefix="vlmatch-bench-milvus-"), test_timers=False).start()
    host = f"{cpu_model()}, {os.cpu_count()} cores{f' ({a.note})' if a.note else ''}, OMP_NUM_THREADS=" \
           f"{os.environ.get('OMP_NUM_THREADS', 'unset')}, flags {' '.join(cpu_flags())}"
    rows = []
    try:
        for n in a.sizes:
            rows.append({**run_size(n, a.queries, a.shape, server, lite=not a.no_lite), "host": host,
                         "command": f"python benchmarks/milvus.py --sizes {n} --shape {a.shape} --queries {a.queries}"
                                    + (" --no-lite" if a.no_lite else "") + (" --server" if server else "")})
            print(json.dumps(rows[-1]), flush=True)
    finally:
        if server is not None:
            server.stop()
            shutil.rmtree(server.base, ignore_errors=True)
    out = Path(a.out).with_suffix(".json")
    old = json.loads(out.read_text()) if out.is_file() else None
    rows = merge(old, rows)
    extra = {k: v for k, v in (old or {}).items() if k not in ("host", "rows", "command")}
    tmp = out.with_suffix(".json.tmp")
    tmp.write_text(json.dumps({**extra, "rows": rows}, indent=2) + "\n")
    tmp.replace(out)
    text = markdown(rows, extra.get("oom_at"))
    out.with_suffix(".md").write_text(text)
    print(text)


if __name__ == "__main__":
    main()
