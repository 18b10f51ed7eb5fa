"""Re-ranking benchmark: MTFN-RR (vlmatch.evaluation.rerank) on random score matrices of the benchmark shapes.

    python benchmarks/rerank.py                    # COCO 5K (5000 x 25000, K=7) and Flickr30K (1000 x 5000, K=15)
    python benchmarks/rerank.py --shapes coco5k

Each shape runs in its own process (so each peak memory is its own): a random float32 score matrix
with ties, K' = 5 caption neighbours from random 384-d caption vectors (the offline sentence-encoder
path: S_TT block by block, the n_cap x n_cap matrix is never held), then I2T and T2I re-ranking and the
protocol's recalls before and after. Goal: under 2 minutes and 4 GB per shape. Figures go to
benchmarks/results/rerank.{json,md}.
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

HERE = Path(__file__).resolve().parent
SHAPES = {"coco5k": (5000, 25000, 7, "coco5k"), "f30k": (1000, 5000, 15, "single")}


def run_shape(name: str, threads: int, k_text: int) -> dict:
    import torch

    torch.set_num_threads(threads)
    from vlmatch.evaluation.rerank import evaluate_reranked, neighbors_from_vectors

    n_img, n_cap, k, protocol = SHAPES[name]
    rng = np.random.default_rng(0)
    sims = rng.standard_normal((n_img, n_cap), dtype=np.float32)
    sims = np.round(sims, 2)  # ties, as real matrices have
    per = n_cap // n_img
    sims[np.arange(n_cap) // per, np.arange(n_cap)] += 1.5  # some signal, so recalls are not all ~0
    vec = rng.standard_normal((n_cap, 384), dtype=np.float32)
    vec /= np.linalg.norm(vec, axis=1, keepdims=True)
    base_mb = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024
    t0 = time.perf_counter()
    nb = neighbors_from_vectors(vec, vec, k_text)
    t_nb = time.perf_counter() - t0
    t1 = time.perf_counter()
    res = evaluate_reranked(sims, protocol, k=k, k_text=k_text, neighbors=nb)
    t_rr = time.perf_counter() - t1
    peak = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024
    return {"shape": [n_img, n_cap], "k": k, "k_text": k_text, "protocol": protocol,
            "seconds_neighbours": t_nb, "seconds_rerank_and_metrics": t_rr, "seconds_total": t_nb + t_rr,
            "peak_rss_mb": peak, "input_and_setup_rss_mb": base_mb,
            "rsum_before": res["before"]["rsum"], "rsum_after": res["after"]["rsum"]}


def render(r: dict) -> str:
    lines = ["# Re-ranking benchmark (MTFN-RR on random matrices)", "",
             f"{r['threads']} threads, {r['cpu']}, numpy {r['numpy']}. Random float32 scores rounded to 0.01 (ties), "
             "K' = 5 neighbours from random 384-d caption vectors computed block by block. Goal: < 120 s and "
             "< 4096 MB per shape.", "",
             "| shape | K | K' | neighbours (s) | re-rank + recalls (s) | total (s) | peak RSS (MB) | rsum before -> after |",
             "|---|---|---|---|---|---|---|---|"]
    for name, v in r["shapes"].items():
        lines.append(f"| {name} {v['shape'][0]}x{v['shape'][1]} | {v['k']} | {v['k_text']} | {v['seconds_neighbours']:.1f} | "
                     f"{v['seconds_rerank_and_metrics']:.1f} | {v['seconds_total']:.1f} | {v['peak_rss_mb']:.0f} | "
                     f"{v['rsum_before']:.1f} -> {v['rsum_after']:.1f} |")
    lines += ["", f"Command: `{r['command']}`", ""]
    return "\n".join(lines)


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--shapes", nargs="+", default=list(SHAPES), choices=list(SHAPES))
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--k-text", type=int, default=5)
    ap.add_argument("--shape", help=argparse.SUPPRESS)
    ap.add_argument("--out", default=str(HERE / "results" / "rerank"))
    a = ap.parse_args(argv)
    if a.shape:  # child
        print(json.dumps(run_shape(a.shape, a.threads, a.k_text)))
        return
    out = {}
    for name in a.shapes:
        proc = subprocess.run([sys.executable, __file__, "--shape", name, "--threads", str(a.threads),
                               "--k-text", str(a.k_text)], capture_output=True, text=True)
        if proc.returncode:
            sys.exit(f"shape {name} failed:\n{proc.stderr[-2000:]}")
        out[name] = json.loads(proc.stdout.strip().splitlines()[-1])
        v = out[name]
        print(f"{name}: {v['seconds_total']:.1f}s (neighbours {v['seconds_neighbours']:.1f}s), peak RSS "
              f"{v['peak_rss_mb']:.0f} MB, rsum {v['rsum_before']:.1f} -> {v['rsum_after']:.1f}", flush=True)
    from harness import write_report

    from vlmatch_lab.host import host

    report = {"shapes": out, "threads": a.threads, "cpu": platform.processor() or platform.machine(),
              "host": host(), "numpy": np.__version__,
              "command": "python benchmarks/rerank.py " + " ".join(argv or sys.argv[1:])}

    write_report(a.out, report, render)


if __name__ == "__main__":
    main()
