"""Scoring benchmark: µs per (image, caption) pair, SCAN t-i AVG (and CAAN, SMAN), side by side in one run.

    python benchmarks/scoring.py                 # k=36 regions, L=12 words, D=1024
    python benchmarks/scoring.py --captions 5000 # the full Flickr30K 1000 x 5000 shape
    python benchmarks/scoring.py --model sman --k 49 --d 512 --m 512 --modes gemm_fp32 fp32 pairwise profile

Modes (each in its own subprocess, so each peak memory is its own):
  official   the official SCAN evaluation (128 x 128 blocks, one caption at a time, float64)
  fp32       vlmatch's engine, float32
  fp32_compiled  the same with compile=True (torch.compile of score; compilation not timed)
  bf16       vlmatch's engine, bfloat16 region-word GEMM
  gemm_fp32  the bare region-word GEMM (every image region x every caption word), float32
  gemm_bf16  the same in bfloat16
  pairwise   the model's equations one (image, caption) pair per call (``--model caan``: the plain
             per-pair form CAAN's paper times), on --official-images x --official-captions
  profile    (SMAN) where the time of one engine block goes: torch.profiler's self time per operator
With a model that declares ``pair_flops`` (multiply-adds per pair), the report adds its compute
bound: those multiply-adds at the GEMM rate measured by gemm_fp32 in the same run.
``--model mtfn --modes gemm_fp32 fp32 pairwise``: MTFN's exact one-GEMM scoring against eq. 2-4 per pair.


``python benchmarks/scoring.py --roofline [...]`` runs benchmarks/roofline.py instead: every model's
µs/pair eager and compiled next to its compute bound (see that file).

Each is timed on the slice it runs (official: --official-images x --official-captions) and
reported per pair; totals for the 1000 x 5000 matrix are extrapolated from µs/pair when a slice is
smaller than that. Figures go to benchmarks/results/scoring.{json,md}.
"""

from __future__ import annotations

import argparse
import json
import platform
import resource
import subprocess
import sys
import time
from pathlib import Path

import numpy as np
import torch

HERE = Path(__file__).resolve().parent


def _inputs(n_img, n_cap, k, L, d, seed=0):
    g = torch.Generator().manual_seed(seed)
    v = torch.nn.functional.normalize(torch.randn(n_img, k, d, generator=g), dim=-1)
    e = torch.nn.functional.normalize(torch.randn(n_cap, L, d, generator=g), dim=-1)
    return v, e


def _peak_mb():
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024


def run_mode(mode, a) -> dict:
    from vlmatch import create_model
    from vlmatch.evaluation.scoring import BlockPlan, score_blocks
    from vlmatch.models.attention import cross_sim
    from vlmatch.models.base import ImageEncoding, TextEncoding

    torch.set_num_threads(a.threads)
    if mode == "official":
        from official_scan import shard_xattn_t2i

        v, e = _inputs(a.official_images, a.official_captions, a.k, a.L, a.d)
        vi, ei = v.double().numpy(), e.double().numpy()
        t0 = time.perf_counter()
        shard_xattn_t2i(vi, ei, [a.L] * len(ei))
        dt = time.perf_counter() - t0
        return {"seconds": dt, "pairs": len(vi) * len(ei), "peak_rss_mb": _peak_mb()}
    if a.model == "mtfn":
        return run_mtfn(mode, a)
    name = {"scan": "scan_t2i_avg", "caan": "caan", "sman": "sman"}[a.model]
    opts = {"img_dim": a.d, "embed_dim": a.d}
    if a.model in ("caan", "sman"):
        opts["attn_dim"] = a.m
    if a.model == "sman":  # d = Σ_k cos, the score the recorded figures measured (the default is now the concatenation)
        opts["score_mode"] = "sum"
    model = create_model(name, **opts).eval()
    if a.model == "sman":
        return run_sman(mode, a, model)
    if mode == "pairwise":
        v, e = _inputs(a.official_images, a.official_captions, a.k, a.L, a.d)
        with torch.no_grad():
            img = model.prepare_images(ImageEncoding(regions=v)) if a.model == "caan" else ImageEncoding(regions=v)
            txt = TextEncoding(lengths=torch.full((len(e),), a.L), words=e)
            txt = model.prepare_texts(txt) if a.model == "caan" else txt
            t0 = time.perf_counter()
            for i in range(len(v)):
                im = img.select(slice(i, i + 1))
                for j in range(len(e)):
                    model.score(im, txt.select(slice(j, j + 1)))
            dt = time.perf_counter() - t0
        return {"seconds": dt, "pairs": len(v) * len(e), "peak_rss_mb": _peak_mb()}
    v, e = _inputs(a.images, a.captions, a.k, a.L, a.d)
    if mode.endswith("bf16"):
        model.cfg.gemm_dtype = "bfloat16"
    lengths = torch.full((a.captions,), a.L)
    plan = BlockPlan(a.block_images, a.block_captions)
    img = ImageEncoding(regions=v)
    if a.model == "caan":
        img = model.prepare_images(img)
    txt_all = TextEncoding(lengths=lengths, words=e)
    if a.model == "caan":
        txt_all = model.prepare_texts(txt_all)
    chunks = [(np.arange(j, min(j + plan.captions, a.captions)), txt_all.select(slice(j, j + plan.captions)))
              for j in range(0, a.captions, plan.captions)]
    dtype = torch.bfloat16 if mode.endswith("bf16") else None
    with torch.no_grad():
        if mode.startswith("gemm"):
            t0 = time.perf_counter()
            for _, txt in chunks:
                for i in range(0, a.images, plan.images):
                    cross_sim(v[i:i + plan.images], txt.words, dtype)
            dt = time.perf_counter() - t0
        else:
            comp = mode.endswith("compiled")
            score_blocks(model, img, chunks[:1], a.captions, plan.images, progress=False, compile=comp)  # warm-up
            if comp and a.captions % plan.captions:
                score_blocks(model, img, chunks[-1:], a.captions, plan.images, progress=False, compile=comp)
            t0 = time.perf_counter()
            sims = score_blocks(model, img, chunks, a.captions, plan.images, progress=False, compile=comp)
            dt = time.perf_counter() - t0
            assert np.isfinite(sims).all()
    return {"seconds": dt, "pairs": a.images * a.captions, "peak_rss_mb": _peak_mb()}


def _sman_inputs(model, n_img, n_cap, a):
    """SMAN encodings of random grids (img_dim = D) and captions of L words (encoding not timed)."""
    from vlmatch.models.base import Encoding

    g = torch.Generator().manual_seed(0)
    feats = torch.randn(n_img, a.k, a.d, generator=g)
    tokens = torch.randint(1, model.cfg.vocab_size, (n_cap, a.L), generator=g)
    with torch.no_grad():
        img = Encoding.cat([model.encode_images(feats[i:i + 256]) for i in range(0, n_img, 256)])
        txt = Encoding.cat([model.encode_texts(tokens[i:i + 256], torch.full((len(tokens[i:i + 256]),), a.L))
                            for i in range(0, n_cap, 256)])
    return img, txt


def run_sman(mode, a, model) -> dict:
    from vlmatch.evaluation.scoring import score_blocks
    from vlmatch.models.attention import cross_sim

    if mode == "pairwise":  # the plain per-pair form: score called for one (image, caption) at a time
        img, txt = _sman_inputs(model, a.official_images, a.official_captions, a)
        with torch.no_grad():
            t0 = time.perf_counter()
            for i in range(len(img)):
                im = img.select(slice(i, i + 1))
                for j in range(len(txt)):
                    model.score(im, txt.select(slice(j, j + 1)))
            dt = time.perf_counter() - t0
        return {"seconds": dt, "pairs": len(img) * len(txt), "peak_rss_mb": _peak_mb()}
    if mode == "gemm_fp32":  # the bare region-word GEMM of the same block shape
        v, e = _inputs(a.images, a.captions, a.k, a.L, a.d)
        with torch.no_grad():
            t0 = time.perf_counter()
            for j in range(0, a.captions, a.block_captions):
                for i in range(0, a.images, a.block_images):
                    cross_sim(v[i:i + a.block_images], e[j:j + a.block_captions])
            dt = time.perf_counter() - t0
        return {"seconds": dt, "pairs": a.images * a.captions, "peak_rss_mb": _peak_mb(),
                "macs_per_pair": a.k * a.L * a.d}
    img, txt = _sman_inputs(model, a.images, a.captions, a)
    chunks = [(np.arange(j, min(j + a.block_captions, a.captions)), txt.select(slice(j, j + a.block_captions)))
              for j in range(0, a.captions, a.block_captions)]
    if mode == "profile":
        with torch.no_grad():
            blk_i, blk_t = img.select(slice(0, a.block_images)), chunks[0][1]
            model.score(blk_i, blk_t)
            with torch.profiler.profile(activities=[torch.profiler.ProfilerActivity.CPU]) as prof:
                for _ in range(3):
                    model.score(blk_i, blk_t)
        ops = sorted(((e.key, e.self_cpu_time_total) for e in prof.key_averages()), key=lambda x: -x[1])
        total = sum(t for _, t in ops)
        top = [{"op": k, "share": t / total} for k, t in ops[:8]]
        pairs = 3 * len(blk_i) * len(blk_t)
        return {"seconds": total / 1e6, "pairs": pairs, "peak_rss_mb": _peak_mb(), "ops": top}
    with torch.no_grad():
        score_blocks(model, img, chunks[:1], a.captions, a.block_images, progress=False)  # warm-up
        t0 = time.perf_counter()
        sims = score_blocks(model, img, chunks, a.captions, a.block_images, progress=False)
        dt = time.perf_counter() - t0
    assert np.isfinite(sims).all()
    return {"seconds": dt, "pairs": a.images * a.captions, "peak_rss_mb": _peak_mb(),
            "pair_flops": model.pair_flops(a.k, a.L)["macs"]}


def run_mtfn(mode, a) -> dict:
    """MTFN (R = --rank, d = d_f = --d): the engine's one-GEMM scoring (``fp32``), the bare GEMM of the
    per-item vectors (``gemm_fp32``), and eq. 2-4 one pair at a time (``pairwise``: R rank-1 products,
    W_m, sigmoid per pair) on --official-images x --official-captions."""
    from vlmatch import create_model
    from vlmatch.evaluation.scoring import score_blocks
    from vlmatch.models.base import ImageEncoding
    from vlmatch.models.mtfn import MTFNText

    model = create_model("mtfn", img_dim=a.d, embed_dim=a.d, fusion_dim=a.d, rank=a.rank, vocab_size=10).eval()
    g = torch.Generator().manual_seed(0)
    pairwise = mode == "pairwise"
    n_img, n_cap = (a.official_images, a.official_captions) if pairwise else (a.images, a.captions)
    img = ImageEncoding(embedding=torch.randn(n_img, a.d, generator=g))
    txt = MTFNText(lengths=torch.full((n_cap,), a.L), embedding=torch.randn(n_cap, a.d, generator=g),
                   pair=torch.randn(n_cap, a.d, generator=g))
    with torch.no_grad():
        if pairwise:
            A = model.it.a.weight.reshape(a.rank, a.d, a.d)
            B = model.it.b.weight.reshape(a.rank, a.d, a.d)
            w, c = model.it.out.weight[0], model.it.out.bias[0]
            t0 = time.perf_counter()
            for i in range(n_img):
                v = img.embedding[i]
                for j in range(n_cap):
                    f = ((A @ v) * (B @ txt.embedding[j])).sum(0)  # eq. 3
                    torch.sigmoid(w @ f + c)  # eq. 4
            dt = time.perf_counter() - t0
        elif mode == "gemm_fp32":
            va, tb = model.global_embeddings(img, txt)
            t0 = time.perf_counter()
            va @ tb.T
            dt = time.perf_counter() - t0
        else:
            chunks = [(np.arange(n_cap), txt)]
            score_blocks(model, img, [(np.arange(min(64, n_cap)), txt.select(slice(0, 64)))], n_cap, n_img,
                         progress=False)  # warm-up (folds G once)
            t0 = time.perf_counter()
            sims = score_blocks(model, img, chunks, n_cap, n_img, progress=False)
            dt = time.perf_counter() - t0
            assert np.isfinite(sims).all()
    return {"seconds": dt, "pairs": n_img * n_cap, "peak_rss_mb": _peak_mb()}


def recall_change(a) -> dict:
    """Recalls of a trained model with the region-word GEMM in float32 and in bfloat16."""
    from vlmatch import load_model
    from vlmatch.data.precomp import PrecompSplit
    from vlmatch.data.resolve import resolve_data
    from vlmatch.evaluation.metrics import evaluate_protocol
    from vlmatch.evaluation.scoring import model_scores

    torch.set_num_threads(a.threads)
    model = load_model(a.recall_checkpoint)
    split = PrecompSplit(resolve_data(a.recall_data), a.recall_split)
    out = {"checkpoint": a.recall_checkpoint, "data": a.recall_data, "split": a.recall_split}
    for dt in ("float32", "bfloat16"):
        model.cfg.gemm_dtype = dt
        sims = model_scores(model, split, model.vocab, progress=False)
        out[dt] = {k: v for k, v in evaluate_protocol(sims, "single").items() if k in ("rsum", "i2t_r1", "t2i_r1")}
    out["rsum_change"] = out["bfloat16"]["rsum"] - out["float32"]["rsum"]
    print(f"recall fp32 -> bf16: rsum {out['float32']['rsum']:.1f} -> {out['bfloat16']['rsum']:.1f}")
    return out


def main(argv=None):
    argv = sys.argv[1:] if argv is None else argv
    if argv[:1] == ["--roofline"]:  # the every-model roofline table lives in its own script
        import roofline

        return roofline.main(argv[1:])
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--images", type=int, default=1000)
    ap.add_argument("--captions", type=int, default=1000)
    ap.add_argument("--official-images", type=int, default=128)
    ap.add_argument("--official-captions", type=int, default=128)
    ap.add_argument("--k", type=int, default=36)
    ap.add_argument("--L", type=int, default=12)
    ap.add_argument("--d", type=int, default=1024)
    ap.add_argument("--block-images", type=int, default=64)
    ap.add_argument("--block-captions", type=int, default=64)
    ap.add_argument("--m", type=int, default=256, help="CAAN / SMAN attention size")
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--model", default="scan", choices=["scan", "caan", "sman", "mtfn"])
    ap.add_argument("--rank", type=int, default=20, help="MTFN's R")
    ap.add_argument("--modes", nargs="+", default=["official", "gemm_fp32", "fp32", "fp32_compiled", "gemm_bf16", "bf16"])
    ap.add_argument("--recall-checkpoint", help="also report the recall change fp32 -> bf16 of this trained model")
    ap.add_argument("--recall-data", default="toyworld", help="precomp folder for --recall-checkpoint")
    ap.add_argument("--recall-split", default="test")
    ap.add_argument("--mode", help=argparse.SUPPRESS)
    ap.add_argument("--out", default=str(HERE / "results" / "scoring"))
    a = ap.parse_args(argv)
    if a.mode:  # child
        print(json.dumps(run_mode(a.mode, a)))
        return
    res = {}
    for mode in a.modes:
        cmd = [sys.executable, __file__, "--mode", mode] + [x for x in (argv or sys.argv[1:])]
        out = subprocess.run(cmd, capture_output=True, text=True)
        if out.returncode:
            sys.exit(f"mode {mode} failed:\n{out.stderr[-2000:]}")
        r = json.loads(out.stdout.strip().splitlines()[-1])
        r["us_per_pair"] = 1e6 * r["seconds"] / r["pairs"]
        r["extrapolated_seconds_1000x5000"] = r["us_per_pair"] * 5e6 / 1e6
        res[mode] = r
        print(f"{mode:10s} {r['us_per_pair']:9.3f} µs/pair  ({r['pairs']} pairs in {r['seconds']:.2f}s, "
              f"peak RSS {r['peak_rss_mb']:.0f} MB)", flush=True)
    ratios = {}
    if "fp32" in res and "gemm_fp32" in res:
        ratios["fp32_over_gemm_fp32"] = res["fp32"]["us_per_pair"] / res["gemm_fp32"]["us_per_pair"]
    if "fp32_compiled" in res and "gemm_fp32" in res:
        ratios["fp32_compiled_over_gemm_fp32"] = res["fp32_compiled"]["us_per_pair"] / res["gemm_fp32"]["us_per_pair"]
        if "official" in res:
            ratios["official_over_fp32_compiled"] = res["official"]["us_per_pair"] / res["fp32_compiled"]["us_per_pair"]
    if "bf16" in res and "gemm_bf16" in res:
        ratios["bf16_over_gemm_bf16"] = res["bf16"]["us_per_pair"] / res["gemm_bf16"]["us_per_pair"]
    if "official" in res and "fp32" in res:
        ratios["official_over_fp32"] = res["official"]["us_per_pair"] / res["fp32"]["us_per_pair"]
    if "pairwise" in res and "fp32" in res:
        ratios["pairwise_over_fp32"] = res["pairwise"]["us_per_pair"] / res["fp32"]["us_per_pair"]
    if "bf16" in res and "fp32" in res:
        ratios["bf16_over_fp32"] = res["bf16"]["us_per_pair"] / res["fp32"]["us_per_pair"]
    if "pair_flops" in res.get("fp32", {}) and "macs_per_pair" in res.get("gemm_fp32", {}):
        g = res["gemm_fp32"]
        rate = g["macs_per_pair"] / (g["us_per_pair"] * 1e-6)  # multiply-adds per second of the GEMM
        res["fp32"]["gemm_macs_per_s"] = rate
        res["fp32"]["compute_bound_us_per_pair"] = 1e6 * res["fp32"]["pair_flops"] / rate
        ratios["fp32_over_compute_bound"] = res["fp32"]["us_per_pair"] / res["fp32"]["compute_bound_us_per_pair"]
        ratios["gemm_fp32_over_fp32"] = g["us_per_pair"] / res["fp32"]["us_per_pair"]
    for k, v in ratios.items():
        print(f"{k:22s} {v:8.2f}x")
    recall = recall_change(a) if a.recall_checkpoint else None
    shape = {"k": a.k, "L": a.L, "D": a.d, "images": a.images, "captions": a.captions,
             "official_slice": [a.official_images, a.official_captions], "block": [a.block_images, a.block_captions]}
    from harness import write_report

    from vlmatch_lab.host import host

    report = {"model": a.model, "recall_fp32_vs_bf16": recall, "shape": shape,
              "threads": a.threads, "torch": torch.__version__, "cpu": platform.processor() or platform.machine(),
              "host": host(), "modes": res, "ratios": ratios,
              "command": "python benchmarks/scoring.py " + " ".join(argv or sys.argv[1:])}
    write_report(a.out + ("" if a.model == "scan" else f"_{a.model}"), report, render)


def render(r: dict) -> str:
    sh = r["shape"]
    lines = [f"# Scoring benchmark: {r['model']}", "",
             f"k={sh['k']} regions, L={sh['L']} words, D={sh['D']}; engine slice {sh['images']} x {sh['captions']} "
             f"(blocks {sh['block'][0]} x {sh['block'][1]}), official/pairwise slice {sh['official_slice'][0]} x "
             f"{sh['official_slice'][1]}; {r['threads']} threads, torch {r['torch']}. All modes in one run, each in its "
             "own process. Totals for 1000 x 5000 are extrapolated from µs/pair.", "",
             "| mode | µs/pair | 1000x5000 (s, extrapolated) | peak RSS (MB) |", "|---|---|---|---|"]
    for k, v in r["modes"].items():
        lines.append(f"| {k} | {v['us_per_pair']:.3f} | {v['extrapolated_seconds_1000x5000']:.1f} | {v['peak_rss_mb']:.0f} |")
    lines += ["", "| ratio | value |", "|---|---|"] + [f"| {k} | {v:.2f}x |" for k, v in r["ratios"].items()]
    fp = r["modes"].get("fp32", {})
    if "compute_bound_us_per_pair" in fp:
        lines += ["", f"Compute bound: {fp['pair_flops']:,} multiply-adds per pair (``model.pair_flops``) at the "
                      f"GEMM rate measured by gemm_fp32 ({fp['gemm_macs_per_s'] / 1e9:.1f} G multiply-adds/s) = "
                      f"{fp['compute_bound_us_per_pair']:.3f} µs/pair."]
    if "profile" in r["modes"]:
        lines += ["", "Where the time of one engine block goes (torch.profiler, self time):", "",
                  "| operator | share |", "|---|---|"] + [f"| {o['op']} | {100 * o['share']:.1f}% |"
                                                           for o in r["modes"]["profile"]["ops"]]
    if r.get("recall_fp32_vs_bf16"):
        rc = r["recall_fp32_vs_bf16"]
        lines += ["", f"Recall of a trained model ({rc['checkpoint']}, {rc['data']}/{rc['split']}): "
                      f"rsum fp32 {rc['float32']['rsum']:.2f} -> bf16 {rc['bfloat16']['rsum']:.2f} "
                      f"(change {rc['rsum_change']:+.2f})."]
    lines += ["", f"Command: `{r['command']}`", ""]
    return "\n".join(lines)


if __name__ == "__main__":
    main()
