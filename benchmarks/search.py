"""Two-stage search benchmark: recall against exhaustive scoring on Flickr8k, and latency at scale.

    python benchmarks/search.py real  --model $VLMATCH_CACHE/runs/scan_f8k_search/best \
                                      --retriever $VLMATCH_CACHE/runs/vsepp_f8k_2ep/best
    python benchmarks/search.py scale --sizes 10000 100000

real: Flickr8k val (1000 images, 5000 captions). The exhaustive figures are the scoring engine's full
  matrix (float32 features); two-stage re-scores stage 1's top K (float16 index) for K in 20/100/256.
  Stage-1 recall@K (the ground-truth item among the K candidates) is the ceiling of stage 2.
scale: synthetic SCAN t-i encodings (k=49 regions, D=1024, the scoring benchmark's D), float16 store,
  stage 1 = the mean of each image's regions (and of each query's words), FAISS auto (flat <= 50k,
  HNSW above; its recall of the exact top 100 is measured).
  Queries are synthetic word vectors drawn near one image's regions (so stage 1 and
  stage 2 agree as for trained models); the text-encoding time is the model's real GRUs (SCAN's and
  a VSE++ retriever's) on a 12-word caption. Each size runs in its own process (its own peak RSS).
Figures go to benchmarks/results/search.{json,md}.
"""

from __future__ import annotations

import argparse
import json
import os
import resource
import shutil
import subprocess
import sys
import time
from pathlib import Path

import numpy as np
import search_default
import torch

from vlmatch_lab.caches import features_dir, features_of
from vlmatch_lab.host import cpu_flags, cpu_model
from vlmatch_lab.inputs import need_features, need_shared
from vlmatch_lab.paths import cache_root

HERE = Path(__file__).resolve().parent
CACHE = cache_root()  # $VLMATCH_CACHE
F8K = features_dir()  # the study's feature cache (Lite0, 224 px)
RESULTS = HERE / "results"
KS = (20, 100, 256)
BATCH = 32  # queries per batch for the throughput figure


def host() -> str:
    """The CPU model and its vector flags (figures differ by host: record them with every result)."""
    return f"{cpu_model()}, {os.cpu_count()} cores, flags {' '.join(cpu_flags())}, torch {torch.__version__}"


def _rss_mb() -> float:
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024


def _dir_mb(p: Path) -> float:
    return sum(f.stat().st_size for f in p.rglob("*") if f.is_file()) / 2**20


def _recalls(ranks: np.ndarray) -> dict:
    return {f"r{k}": float(100 * np.mean(ranks < k)) for k in (1, 5, 10)}


# --- real ----------------------------------------------------------------------------------------

def real(a) -> dict:
    from vlmatch.data.precomp import PrecompSplit
    from vlmatch.evaluation.metrics import evaluate_protocol
    from vlmatch.evaluation.scoring import model_scores
    from vlmatch.models.registry import load_model, resolve_checkpoint
    from vlmatch.search import Index
    from vlmatch.search.build import build_index

    feats = features_of(resolve_checkpoint(a.model))
    split = PrecompSplit(feats, "dev")
    score = getattr(a, "score", "model")
    out = {"model": str(a.model), "retriever": str(a.retriever), "host": host(), "score": score, "images": split.n_images,
           "captions": len(split.captions)}
    idx_dir = CACHE / "search" / "f8k_dev"
    t0 = time.time()
    build_index(idx_dir, resolve_checkpoint(a.model), features=feats, split="dev",
                retriever_ckpt=a.retriever and resolve_checkpoint(a.retriever), score=score,
                captions=feats / "dev_caps.txt", progress=False)
    out["build_s"] = time.time() - t0
    out["index_mb"] = _dir_mb(idx_dir)
    idx = Index.open(idx_dir)
    t0 = time.time()
    sims = model_scores(load_model(a.model), split, progress=False)  # the engine, float32
    if score == "mean":  # the pair's ranking: the ensemble of the two models' matrices
        from vlmatch.evaluation.metrics import ensemble

        sims = ensemble([sims, model_scores(load_model(a.retriever), split, progress=False)])
    out["exhaustive_s"] = time.time() - t0
    ex = evaluate_protocol(sims, "single")
    out["exhaustive"] = {"t2i": {f"r{k}": ex[f"t2i_r{k}"] for k in (1, 5, 10)},
                         "i2t": {f"r{k}": ex[f"i2t_r{k}"] for k in (1, 5, 10)}}
    gt_img = np.arange(len(split.captions)) // split.per_image

    # text -> image
    txt, q = idx.encode_queries(split.captions)
    s1_all = q @ np.asarray(idx.images.stage1.vectors).T  # exact stage-1 scores (flat index)
    s1_rank = (s1_all > s1_all[np.arange(len(q)), gt_img][:, None]).sum(axis=1)  # ties count for the truth
    out["stage1_t2i"] = {**_recalls(s1_rank), **{f"recall@{k}": float(100 * np.mean(s1_rank < k)) for k in KS}}
    out["two_stage_t2i"] = {}
    row_id = np.array([it["id"] for it in idx.items])
    for k in KS:
        t0 = time.time()
        res = idx.rank_images(txt, q, k=10, candidates=k)
        secs = time.time() - t0
        ranks = np.array([next((r.rank - 1 for r in rr if r.id == row_id[gt_img[j]]), 10) for j, rr in enumerate(res)])
        out["two_stage_t2i"][k] = {**_recalls(ranks), "seconds": secs}
    # float16 store vs the engine's float32 scores, on exhaustive re-scoring of 100 queries
    diffs = []
    for j in range(0, len(q), 50):
        rr = idx.rank_images(txt.select(slice(j, j + 1)), q[j:j + 1], k=len(idx), candidates=len(idx))[0]
        diffs.append(max(abs(r.score - sims[idx.images.row_of[r.id], j]) for r in rr))
    out["float16_max_abs_score_diff"] = float(max(diffs))
    out["score_range"] = [float(sims.min()), float(sims.max())]

    # image -> text
    feats = split.features
    out["two_stage_i2t"] = {}
    for k in KS:
        t0 = time.time()
        ranks = []
        for i in range(split.n_images):
            rr = idx.search_image(np.asarray(feats[i], dtype=np.float32), k=10, candidates=k)
            ranks.append(min((r.rank - 1 for r in rr if r.id // split.per_image == i), default=10))
        out["two_stage_i2t"][k] = {**_recalls(np.array(ranks)), "seconds": time.time() - t0}
    return out


# --- scale ---------------------------------------------------------------------------------------

def _l2(x):
    return x / (np.linalg.norm(x, axis=-1, keepdims=True) + 1e-8)


@torch.no_grad()
def recurrent_floor(models, steps: int, reps: int) -> np.ndarray:
    """Seconds per query of the text encoders' recurrent products alone: h @ W_hh^T for every word,
    direction and encoder, batch 1 -- work any exact float32 GRU must do one step after another (no
    gates, no input projections): a floor for an exact query encoding through torch's products."""
    mats = [w for m in models for n, w in m.txt_enc.rnn.named_parameters() if n.startswith("weight_hh")]
    hs = [torch.randn(1, w.shape[1]) for w in mats]  # the encoders' hidden sizes may differ
    for h, w in zip(hs, mats, strict=True):  # warm-up
        torch.nn.functional.linear(h, w)
    out = []
    for _ in range(reps):
        t0 = time.perf_counter()
        for h, w in zip(hs, mats, strict=True):
            for _ in range(steps):
                torch.nn.functional.linear(h, w)
        out.append(time.perf_counter() - t0)
    return np.array(out)


def scale_one(n: int, queries: int, agree_queries: int, k: int = 49, d: int = 1024, seed: int = 0) -> dict:
    from vlmatch import create_model
    from vlmatch.data.vocab import Vocab
    from vlmatch.models.base import TextEncoding
    from vlmatch.search import Index
    from vlmatch.search.backends.folder import commit
    from vlmatch.search.build import save_checkpoint, stage1_of, write_collection
    from vlmatch.search.job import versions
    from vlmatch.search.store import EncodingWriter

    torch.set_num_threads(2)
    rng = np.random.default_rng(seed)
    root = CACHE / "search" / f"synth_{n}"
    if root.exists():
        shutil.rmtree(root)
    work = root / "build"
    codes = _l2(rng.standard_normal((4096, d)).astype(np.float32))
    noise = rng.standard_normal((8192, d)).astype(np.float32) * 0.03
    t0 = time.time()
    w = EncodingWriter(work / "enc", n, "float16")
    s1 = np.lib.format.open_memmap(work / "stage1.npy", mode="w+", dtype=np.float32, shape=(n, d))
    which = np.empty((n, k), dtype=np.int32)
    from vlmatch.models.base import ImageEncoding

    for a in range(0, n, 1000):
        b = min(n, a + 1000)
        which[a:b] = rng.integers(0, len(codes), (b - a, k))
        v = _l2(codes[which[a:b]] + noise[rng.integers(0, len(noise), (b - a, k))])
        w.write(a, ImageEncoding(regions=torch.from_numpy(v)))
        s1[a:b] = _l2(v.mean(axis=1))
    w.finish()
    s1.flush()
    del s1
    write_secs = time.time() - t0
    vocab = Vocab.build(["a dog runs on the beach with a red ball near the water and a child"], 1)
    torch.manual_seed(0)
    model = create_model("scan_t2i_avg", img_dim=2048, embed_dim=d, word_dim=300, vocab_size=len(vocab))
    retriever = create_model("vsepp", img_dim=2048, embed_dim=d, word_dim=300, vocab_size=len(vocab))
    model.vocab = retriever.vocab = vocab
    t1 = time.time()
    coll = write_collection(root / "images", work, [search_default.synthetic_row(i) for i in range(n)],
                            stage1_of(work, "auto", None, 32))
    faiss_secs = time.time() - t1
    save_checkpoint(root / "model", model)
    save_checkpoint(root / "retriever", retriever)
    commit(root, {"model": {"name": model.name}, "retriever": {"name": "vsepp"},  # records the hashes, removes build/
                  "stage1": "synthetic: mean of regions / of words", "dtype": "float16",
                  "backbone": None, "source": {"kind": "synthetic"},
                  "collections": {"images": coll}, "counts": {"images": n},
                  "dims": {"stage1": d, "regions": k, "img_dim": 2048}, "versions": versions()})
    build = {"write_encodings_s": write_secs, "faiss_s": faiss_secs, "build_s": write_secs + faiss_secs,
             "disk_mb": _dir_mb(root), "stage1": coll["stage1"], "build_peak_rss_mb": _rss_mb()}

    t2 = time.time()
    for f in sorted((root / "images").rglob("*")):  # a served index is hot: read it into the page cache once
        if f.is_file():
            with open(f, "rb") as fh:
                while fh.read(64 << 20):
                    pass
    warm_secs = time.time() - t2
    idx = Index.open(root)
    caption = "a dog runs on the beach with a red ball near the water"

    def synthetic_query(t: int):
        pick = rng.choice(k, 8, replace=False)
        words = _l2(codes[which[t, pick]] + rng.standard_normal((8, d)).astype(np.float32) * 0.03)
        txt = TextEncoding(lengths=torch.tensor([8]), words=torch.from_numpy(words)[None])
        return txt, _l2(words.mean(axis=0))[None]

    times = {"text": [], "stage1": [], "stage2": []}
    for _ in range(5):  # warm-up
        idx.rank_images(*synthetic_query(int(rng.integers(n))), k=10, candidates=100)
    for _ in range(queries):
        t0 = time.perf_counter()
        idx.encode_queries([caption])
        times["text"].append(time.perf_counter() - t0)
        idx.rank_images(*synthetic_query(int(rng.integers(n))), k=10, candidates=100)
        times["stage1"].append(idx.last_timings["stage1"])
        times["stage2"].append(idx.last_timings["stage2"])
    search = np.array(times["stage1"]) + np.array(times["stage2"])
    total = np.array(times["text"]) + search
    floor = recurrent_floor([model, retriever], int(model.tokenize([caption])[1][0]), queries)
    # throughput: a batch of BATCH queries (what a server that groups concurrent requests would run):
    # one GRU pass and one stage-1 search for the batch, stage 2 per query
    batch = [synthetic_query(int(rng.integers(n))) for _ in range(BATCH)]
    btxt, bq = TextEncoding.cat([t for t, _ in batch]), np.concatenate([q for _, q in batch])
    per_query = []
    for _ in range(5):
        t0 = time.perf_counter()
        idx.encode_queries([caption] * BATCH)
        idx.rank_images(btxt, bq, k=10, candidates=100)
        per_query.append((time.perf_counter() - t0) / BATCH)
    lat = {s: search_default.latency(v)
           for s, v in {**times, "search": search, "total": total, "text_floor": floor,
                        "total_floor": floor + search}.items()}
    agree = None
    if agree_queries:
        from vlmatch.evaluation.scoring import score_blocks

        qs = [synthetic_query(int(rng.integers(n))) for _ in range(agree_queries)]
        two = [idx.rank_images(t, q, k=10, candidates=100)[0] for t, q in qs]
        txt = TextEncoding.cat([t for t, _ in qs])
        sims = np.empty((n, len(qs)), dtype=np.float32)
        for a in range(0, n, 500):  # exhaustive: every image, through the engine's block code
            sims[a:a + 500] = score_blocks(idx.model, idx.images.store.take(slice(a, a + 500)),
                                           [(np.arange(len(qs)), txt)], len(qs), 500, progress=False)
        overlaps = []
        for j, res in enumerate(two):
            top = set(np.argsort(-sims[:, j], kind="stable")[:10].tolist())
            overlaps.append(len(top & {r.id for r in res}) / 10)
        agree = {"queries": len(qs), "mean_top10_overlap": float(np.mean(overlaps)),
                 "min_top10_overlap": float(np.min(overlaps))}
    vec = np.asarray(idx.images.stage1.vectors)
    hits, src_ann, src_exact = [], [], []
    for _ in range(100):  # the ANN's candidates against the exact top 100 of stage 1
        t = int(rng.integers(n))
        _, q = synthetic_query(t)
        exact = np.argsort(-(vec @ q[0]))[:100]
        _, rows = idx.images.stage1.search(q, 100)
        hits.append(len(set(exact.tolist()) & set(rows[0].tolist())) / 100)
        src_ann.append(t in set(rows[0].tolist()))
        src_exact.append(t in set(exact.tolist()))
    return {"ann_recall_at_100": float(np.mean(hits)), "source_in_ann_top100": float(np.mean(src_ann)),
            "source_in_exact_top100": float(np.mean(src_exact)), "warm_s": warm_secs,
            "n": n, "k": k, "d": d, "queries": queries, "candidates": 100,
            "build": build, "latency": lat, "batched": {"batch": BATCH, "per_query_ms": 1e3 * float(np.median(per_query))},
            "top10_agreement": agree, "search_peak_rss_mb": _rss_mb(), "threads": torch.get_num_threads()}


# --- report --------------------------------------------------------------------------------------

def _run_name(model: str) -> str:
    return model if model.startswith("pretrained:") else Path(model).parent.name


def render(res: dict) -> str:
    lines = ["# Two-stage search", ""]
    runs = res.get("real") or []
    for r in [runs] if isinstance(runs, dict) else runs:
        lines += [f"## Flickr8k val ({r['images']} images, {r['captions']} captions): {_run_name(r['model'])}", "",
                  f"Model `{r['model']}`, stage 1 from the retriever `{r['retriever']}`; index float16 (the model's "
                  f"full-precision fields, if any, float32) "
                  f"({r['index_mb']:.0f} MB, built in {r['build_s']:.0f} s). "
                  + ("Stage 2 ranks by the mean of the model's and the retriever's scores (`index build --score mean`); "
                     "exhaustive = the mean of both models' full matrices from the scoring engine "
                     if r.get("score") == "mean" else "Exhaustive = the scoring engine's full matrix ")
                  + f"({r['exhaustive_s']:.0f} s).", "",
                  "| text -> image | R@1 | R@5 | R@10 | stage-1 recall@K | seconds (5000 queries) |",
                  "|---|---|---|---|---|---|"]
        e = r["exhaustive"]["t2i"]
        lines.append(f"| exhaustive | {e['r1']:.2f} | {e['r5']:.2f} | {e['r10']:.2f} | | {r['exhaustive_s']:.0f} |")
        s = r["stage1_t2i"]
        lines.append(f"| stage 1 alone | {s['r1']:.2f} | {s['r5']:.2f} | {s['r10']:.2f} | | |")
        for k, v in r["two_stage_t2i"].items():
            lines.append(f"| two-stage K={k} | {v['r1']:.2f} | {v['r5']:.2f} | {v['r10']:.2f} | "
                         f"{s[f'recall@{k}']:.2f} | {v['seconds']:.0f} |")
        if "100" in r["two_stage_t2i"] or 100 in r["two_stage_t2i"]:
            d = r["two_stage_t2i"].get("100", r["two_stage_t2i"].get(100))["r10"] - e["r10"]
            lines += ["", f"Goal (two-stage R@10 within 1 point of exhaustive at K=100): {d:+.2f} points, "
                          + ("met." if d >= -1 else "not met.")]
        lines += ["", "| image -> text | R@1 | R@5 | R@10 | seconds (1000 queries) |", "|---|---|---|---|---|"]
        e = r["exhaustive"]["i2t"]
        lines.append(f"| exhaustive | {e['r1']:.2f} | {e['r5']:.2f} | {e['r10']:.2f} | |")
        for k, v in r["two_stage_i2t"].items():
            lines.append(f"| two-stage K={k} | {v['r1']:.2f} | {v['r5']:.2f} | {v['r10']:.2f} | {v['seconds']:.0f} |")
        lines += ["", f"float16 store: largest |score - engine float32 score| over 100 exhaustive queries "
                      f"{r['float16_max_abs_score_diff']:.2e} (scores span {r['score_range'][0]:.3f} .. "
                      f"{r['score_range'][1]:.3f}).", ""]
    sc = res.get("scale")
    if sc:
        lines += ["## Scale (synthetic SCAN t-i encodings, k=49, float16, K=100)", "",
                  "| images | D | stage 1 | build s | disk MB | build peak RSS MB | search peak RSS MB | text p50/p99 ms | "
                  "stage 1 p50/p99 ms | stage 2 p50/p99 ms | stage 1+2 p50/p99 ms | total p50/p99 ms | "
                  "source image in stage-1 top 100 (ANN / exact) | top-10 agreement | "
                  "floor p50 ms: recurrent products / + stage 1+2 | batched: ms per query (32 at once) |",
                  "|---|---|---|---|---|---|---|---|---|---|---|---|---|---|---|---|"]
        for s in sc:
            b, lat = s["build"], s["latency"]
            ef = b["stage1"].get("efSearch", 512)
            kind = b["stage1"]["kind"] + (f" (M {b['stage1']['M']}, efSearch {ef}; recall@100 of exact "
                                          f"{s['ann_recall_at_100']:.3f})" if b["stage1"]["kind"] == "hnsw" else "")
            ag = s["top10_agreement"]
            agree = f"{ag['mean_top10_overlap']:.3f} (min {ag['min_top10_overlap']:.1f}, {ag['queries']} q)" if ag else "-"
            src = (f"{s['source_in_ann_top100']:.2f} / {s['source_in_exact_top100']:.2f}"
                   if "source_in_ann_top100" in s else "-")
            lines.append(f"| {s['n']} | {s['d']} | {kind} | {b['build_s']:.0f} | {b['disk_mb']:.0f} | "
                         f"{b['build_peak_rss_mb']:.0f} | {s['search_peak_rss_mb']:.0f} | "
                         + " | ".join(f"{lat[x]['p50_ms']:.1f} / {lat[x]['p99_ms']:.1f}"
                                      for x in ("text", "stage1", "stage2", "search", "total") if x in lat)
                         + f" | {src} | {agree} | " + (f"{lat['text_floor']['p50_ms']:.1f} / {lat['total_floor']['p50_ms']:.1f}"
                                                      if "text_floor" in lat else "-")
                         + (f" | {s['batched']['per_query_ms']:.1f} |" if "batched" in s else " | - |"))
        lines += ["", "Build = writing the encodings (synthetic, so no feature extraction) + the FAISS index. "
                      "Before timing, the index files are read once (a served index is hot in the page cache). "
                      "Stage 1+2 = the index's own work for a query already encoded; total adds the text encoding "
                      "(the model's and the retriever's GRUs, batch 1). "
                      "Peak RSS counts the memory-mapped pages a process touched. Top-10 agreement: overlap of the "
                      "two-stage top 10 with the exhaustive top 10 (every image scored by the engine). Floor: the text "
                      "encoders' recurrent matrix-vector products alone (h @ W_hh^T for every word, direction and "
                      "encoder, batch 1), which any exact float32 GRU must run one after another; adding stage 1+2 "
                      "gives the lowest total an exact query encoding could reach on this machine. Batched: 32 queries "
                      "encoded and searched together (one GRU pass, one stage-1 search, stage 2 per query), wall time / 32: "
                      "the cost per query of a server that groups concurrent requests, not a single query's latency."]
    lines += ["", *search_default.render(res)]
    lines += ["", f"Machine: {os.cpu_count()} CPU cores (timed with the training queue paused), torch {torch.__version__}.",
              "", "Commands: " + "; ".join(f"`{c}`" for c in res.get("commands", []))]
    return "\n".join(lines) + "\n"


def main(argv=None):
    ap = argparse.ArgumentParser()
    sub = ap.add_subparsers(dest="cmd", required=True)
    r = sub.add_parser("real")
    r.add_argument("--model")
    r.add_argument("--retriever")
    r.add_argument("--pair", choices=["default"], help="the shipped default pair instead of --model/--retriever")
    db = sub.add_parser("default-build", help="index build from Flickr8k val JPEGs with the shipped default pair")
    db.add_argument("--images", type=int, default=1000)
    db.add_argument("--runs", type=int, default=3, help="builds one after another; the figures keep every run's speed")
    ds = sub.add_parser("default-scale", help="text query latency of the shipped default pair at scale")
    ds.add_argument("--sizes", type=int, nargs="+", default=[100000])
    ds.add_argument("--queries", type=int, default=200)
    ds.add_argument("--keep", action="store_true", help="keep the index in $VLMATCH_CACHE/search/ and time one "
                    "an earlier --keep run left there (same pair) instead of building it again")
    do = sub.add_parser("default-scale-one")
    do.add_argument("--n", type=int, required=True)
    do.add_argument("--queries", type=int, default=200)
    do.add_argument("--keep", action="store_true")
    s = sub.add_parser("scale")
    s.add_argument("--sizes", type=int, nargs="+", default=[10000, 100000])
    s.add_argument("--queries", type=int, default=200)
    s.add_argument("--agree-queries", type=int, default=20, help="exhaustive comparison (sizes <= 20000 only)")
    s.add_argument("--d", type=int, nargs="+", default=[1024], help="embedding sizes D (1024: the scoring bench's; "
                   "512: the Flickr8k SCAN configs')")
    o = sub.add_parser("scale-one")
    o.add_argument("--n", type=int, required=True)
    o.add_argument("--queries", type=int, default=200)
    o.add_argument("--agree-queries", type=int, default=0)
    o.add_argument("--d", type=int, default=1024)
    a = ap.parse_args(argv)
    # what a command reads that another makes, before its first expensive step (a 100k index takes minutes)
    if a.cmd in ("real", "default-scale", "default-scale-one"):
        need_features(F8K)  # real: the dev split; default-scale: its captions are the timed queries
    elif a.cmd == "default-build":
        need_shared(search_default.SHARED)
    if a.cmd == "scale-one":
        print(json.dumps(scale_one(a.n, a.queries, a.agree_queries, d=a.d)))
        return
    if a.cmd == "default-scale-one":
        print(json.dumps(search_default.default_scale(a.n, a.queries, keep=a.keep)))
        return
    if a.cmd == "real":
        if a.pair:
            from vlmatch.pretrained import default_score

            a.model, a.retriever = search_default._pair()
            a.score = default_score()
        elif not (a.model and a.retriever):
            ap.error("real needs --model and --retriever, or --pair default")
    from vlmatch.io import write_json, write_text

    path = RESULTS / "search.json"
    res = json.loads(path.read_text()) if path.is_file() else {}
    cmd = "python benchmarks/search.py " + " ".join(argv if argv is not None else sys.argv[1:])
    if a.cmd.startswith("default-"):
        pair = res.setdefault("default_pair", {})
        pair["host"] = host()
        if a.cmd == "default-build":
            runs = [search_default.default_build(a.images) for _ in range(a.runs)]
            pair["build"] = {**runs[-1], "runs_images_per_s": [round(r["images_per_s"], 1) for r in runs],
                             "runs_note": f"{a.runs} runs of this command one after another "
                                          f"({', '.join(format(r['seconds'], '.1f') for r in runs)} s for "
                                          f"{a.images:,} JPEGs); "
                                          "images_per_s and seconds are the last run's"}
        else:
            pair["scale"] = []
            for n in a.sizes:  # each size in its own process: its own peak RSS
                p = subprocess.run([sys.executable, __file__, "default-scale-one", "--n", str(n),
                                    "--queries", str(a.queries)] + (["--keep"] if a.keep else []),
                                   capture_output=True, text=True)
                if p.returncode:
                    sys.exit(p.stderr[-3000:])
                pair["scale"].append(json.loads(p.stdout.strip().splitlines()[-1]))
    elif a.cmd == "real":  # one entry per model: a re-run replaces its own
        runs = res.get("real") or []
        runs = [runs] if isinstance(runs, dict) else runs
        new = real(a)
        res["real"] = [r for r in runs if r["model"] != new["model"]] + [new]
    else:
        res["scale"] = []
        for d in a.d:
            for n in a.sizes:
                agree = a.agree_queries if n <= 20000 else 0
                p = subprocess.run([sys.executable, __file__, "scale-one", "--n", str(n), "--queries", str(a.queries),
                                    "--agree-queries", str(agree), "--d", str(d)], capture_output=True, text=True)
                if p.returncode:
                    sys.exit(p.stderr[-3000:])
                res["scale"].append(json.loads(p.stdout.strip().splitlines()[-1]))
                shutil.rmtree(CACHE / "search" / f"synth_{n}", ignore_errors=True)  # 10 GB at 100k, D=1024
    res["commands"] = sorted({*res.get("commands", []), cmd})
    write_json(path, res)
    write_text(RESULTS / "search.md", render(res))
    print(render(res))


if __name__ == "__main__":
    main()
