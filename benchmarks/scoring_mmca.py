"""MMCA scoring benchmark: µs per (image, caption) pair of the engine's vectorised ``score`` next to
the plain form (one pair per call) and the cross unit's compute bound, all measured in one run.

    python benchmarks/scoring_mmca.py                  # k=36 regions, n=12 tokens, d=256, 16 heads
    python benchmarks/scoring_mmca.py --threads 2 --images 64 --captions 256

- engine: ``score`` on (--images x --captions) blocks sized by ``bytes_per_pair`` (vlmatch.evaluation.scoring),
  per-item work (``encode_*``) excluded: it runs once per item, not per pair.
- plain: the same equations one (image, caption) pair per ``score`` call (the layout of a per-pair
  loop), on --plain-pairs pairs.
- bound: ``model.pair_flops(k, n)`` multiply-adds per pair (the pair-dependent cross unit + c1 head)
  at the float32 GEMM peak measured here (a square matmul), i.e. the time if every multiply-add ran
  at GEMM speed; the engine's gap to it is the elementwise / softmax / LayerNorm / copy work.
Figures go to benchmarks/results/scoring_mmca.{json,md}.
"""

from __future__ import annotations

import argparse
import json
import platform
import time
from pathlib import Path

import torch

HERE = Path(__file__).resolve().parent


def gemm_peak(threads: int, n: int = 1024, reps: int = 10) -> float:
    """Multiply-adds per second of an n x n x n float32 matmul (best of ``reps``)."""
    a, b = torch.randn(n, n), torch.randn(n, n)
    a @ b
    best = min(_timed(lambda: a @ b) for _ in range(reps))
    return n ** 3 / best


def _timed(fn) -> float:
    t = time.perf_counter()
    fn()
    return time.perf_counter() - t


def main(argv=None) -> dict:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--k", type=int, default=36)
    ap.add_argument("--n", type=int, default=12, help="WordPiece tokens per caption ([CLS], [SEP] included)")
    ap.add_argument("--d", type=int, default=256)
    ap.add_argument("--heads", type=int, default=16)
    ap.add_argument("--images", type=int, default=32)
    ap.add_argument("--captions", type=int, default=160)
    ap.add_argument("--plain-pairs", type=int, default=200)
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--out", default=str(HERE / "results" / "scoring_mmca"))
    a = ap.parse_args(argv)
    from vlmatch import create_model
    from vlmatch.evaluation.scoring import BlockPlan
    from vlmatch.models.mmca import MMCAImages, MMCATexts

    torch.set_num_threads(a.threads)
    torch.manual_seed(0)
    model = create_model("mmca", img_dim=a.d, embed_dim=a.d, heads=a.heads, text_cache=False).eval()
    d = a.d
    with torch.no_grad():
        img = model.encode_images(torch.randn(a.images, a.k, d))
        # captions of exactly n tokens: encoder outputs stand in for BERT's (per-item work, not timed)
        w = torch.randn(a.captions, a.n, d)
        q, kk, v = model.cross_unit.qkv(w)
        txt = MMCATexts(lengths=torch.full((a.captions,), a.n), words=w, q=q, k=kk, v=v,
                        embedding=torch.nn.functional.normalize(torch.randn(a.captions, d), dim=-1))
        assert isinstance(img, MMCAImages)
        plan = BlockPlan.for_budget(model, a.images, a.captions, a.k, a.n)

        def engine():
            for c in range(0, a.captions, plan.captions):
                for i in range(0, a.images, plan.images):
                    model.score(img.select(slice(i, i + plan.images)), txt.select(slice(c, c + plan.captions)))

        engine()
        t_engine = min(_timed(engine) for _ in range(3)) / (a.images * a.captions)
        pairs = [(i % a.images, j % a.captions) for i, j in zip(range(a.plain_pairs), range(7, 7 + a.plain_pairs),
                                                                  strict=True)]
        singles = [(img.select([i]), txt.select([j])) for i, j in pairs]

        def plain():
            for x, y in singles:
                model.score(x, y)

        plain()
        t_plain = min(_timed(plain) for _ in range(3)) / len(pairs)
    peak = gemm_peak(a.threads)
    flops = model.pair_flops(a.k, a.n)["macs"]
    bound = flops / peak
    r = {"shape": {"k": a.k, "n": a.n, "d": d, "heads": a.heads, "ffn": d, "cnn_filters": model.cfg.cnn_filters},
         "threads": a.threads, "block": {"images": plan.images, "captions": plan.captions},
         "engine_us_per_pair": t_engine * 1e6, "plain_us_per_pair": t_plain * 1e6,
         "pair_multiply_adds": flops, "gemm_peak_gmacs": peak / 1e9, "bound_us_per_pair": bound * 1e6,
         "engine_vs_bound": t_engine / bound, "plain_vs_engine": t_plain / t_engine,
         "machine": f"{platform.processor() or platform.machine()}, torch {torch.__version__}"}
    print(json.dumps(r, indent=2))
    out = Path(a.out)
    out.parent.mkdir(parents=True, exist_ok=True)
    out.with_suffix(".json").write_text(json.dumps(r, indent=2) + "\n")
    out.with_suffix(".md").write_text(render(r))
    print(render(r))
    return r


def render(r: dict) -> str:
    s = r["shape"]
    return (f"# MMCA scoring: µs per (image, caption) pair\n\n"
            f"k={s['k']} regions, n={s['n']} tokens, d={s['d']}, {s['heads']} heads, FFN {s['ffn']}, "
            f"CNN {s['cnn_filters']} filters x 3 windows; {r['threads']} threads; {r['machine']}.\n\n"
            f"| form | µs/pair | vs bound |\n|---|---:|---:|\n"
            f"| bound: {r['pair_multiply_adds'] / 1e6:.2f} M multiply-adds at the measured GEMM peak "
            f"({r['gemm_peak_gmacs']:.1f} G/s) | {r['bound_us_per_pair']:.1f} | 1.0x |\n"
            f"| engine (vectorised blocks of {r['block']['images']} x {r['block']['captions']}) | "
            f"{r['engine_us_per_pair']:.1f} | {r['engine_vs_bound']:.1f}x |\n"
            f"| plain (one pair per call) | {r['plain_us_per_pair']:.1f} | "
            f"{r['plain_us_per_pair'] / r['bound_us_per_pair']:.1f}x |\n\n"
            f"The pair-dependent part is the cross Transformer unit over k + n = {s['k'] + s['n']} tokens "
            f"(attention over all of them, W^O, FFN, two LayerNorms) and the c1 head (1-D CNN, FC, "
            f"LayerNorm); per-item work (self unit, i0, c0, per-token Q/K/V) is excluded.\n")


if __name__ == "__main__":
    main()
