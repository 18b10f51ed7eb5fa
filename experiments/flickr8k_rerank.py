"""Flickr8k: cross-modal re-ranking (MTFN-RR) of a trained run's val score matrix, as a results row.

    python experiments/flickr8k_rerank.py --run vsepp_f8k_3ep                      # RR w/o S_TT
    python experiments/flickr8k_rerank.py --run vsepp_f8k_3ep --text-run mtfn_f8k_tt  # S_TT of MTFN's text branch
    python experiments/flickr8k_rerank.py --run mtfn_f8k_tt --text-run mtfn_f8k_tt    # MTFN-RR with S_TT

Reads $VLMATCH_CACHE/runs/<run>/best, scores the Karpathy val split (1000 images, 5000 captions; the
matrix is kept as $VLMATCH_CACHE/rerank/<run>_val_sims.npy for the next variant), re-ranks it with
vlmatch.evaluation.rerank (K = 15 as for Flickr30K, K' = 5) and writes experiments/results/flickr8k/<row>.json with
the recalls after re-ranking (``metrics``) and before (``before``), then re-renders flickr8k.md. The same
figures come from ``vlmatch evaluate --checkpoint RUN/best --data FEATS --split dev --rerank [...]``.
"""

from __future__ import annotations

import argparse
import json
import shlex
import time
from pathlib import Path

import numpy as np
from flickr8k import HERE, RUNS, load_results, render

from vlmatch.data.precomp import PrecompSplit
from vlmatch.evaluation.rerank import evaluate_reranked, model_text_neighbors
from vlmatch.evaluation.scoring import model_scores
from vlmatch.io import save_npy, write_json, write_text
from vlmatch.models.registry import load_model
from vlmatch_lab.caches import features_dir, runs_dir
from vlmatch_lab.inputs import need_features, need_run
from vlmatch_lab.paths import cache_root

CACHE = features_dir()  # the study's feature cache (Lite0, 224 px)


def val_sims(run_dir: Path, split: PrecompSplit) -> np.ndarray:
    cached = cache_root() / "rerank" / f"{run_dir.name}_val_sims.npy"  # not inside the run's own folder
    best = run_dir / "best"
    if cached.is_file() and cached.stat().st_mtime > (best / "model.safetensors").stat().st_mtime:
        return np.load(cached)
    sims = model_scores(load_model(best), split, progress=True)
    save_npy(cached, sims)
    return sims


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--run", required=True, help="a trained run under $VLMATCH_CACHE/runs")
    ap.add_argument("--text-run", help="a run whose model has a trained text-text branch (S_TT); default: w/o S_TT")
    ap.add_argument("--k", type=int, default=15)
    ap.add_argument("--k-text", type=int, default=5)
    ap.add_argument("--name", help="row name (default <run>_rr or <run>_rr_stt)")
    ap.add_argument("--threads", type=int, default=2)
    a = ap.parse_args(argv)
    import torch

    torch.set_num_threads(a.threads)
    runs = runs_dir()
    need_features(CACHE)
    for run in filter(None, (a.run, a.text_run)):
        need_run(runs / run / "best")
    split = PrecompSplit(CACHE, "dev")
    t0 = time.perf_counter()
    sims = val_sims(runs / a.run, split)
    t_scores = time.perf_counter() - t0
    neighbors = None
    if a.text_run:
        neighbors = model_text_neighbors(load_model(runs / a.text_run / "best"), split, a.k_text, progress=True)
    t1 = time.perf_counter()
    res = evaluate_reranked(sims, "single", k=a.k, k_text=a.k_text, neighbors=neighbors, source=a.run)
    t_rr = time.perf_counter() - t1
    name = a.name or f"{a.run}_rr" + ("_stt" if a.text_run else "")
    src = json.loads((RUNS / f"{a.run}.json").read_text()) if (RUNS / f"{a.run}.json").is_file() else {}
    cmd = f"python experiments/flickr8k_rerank.py --run {a.run}" + (f" --text-run {a.text_run}" if a.text_run else "") \
        + (f" --k {a.k}" if a.k != 15 else "") + (f" --k-text {a.k_text}" if a.k_text != 5 else "") \
        + (f" --name {shlex.quote(a.name)}" if a.name else "")
    text = f"S_TT of {a.text_run}'s text-text branch, K'={a.k_text}" if a.text_run else "w/o S_TT"
    before = res["before"]
    note = (f"RR (K={a.k}, {text}) of {a.run}'s best val matrix: rsum {before['rsum']:.1f} -> {res['after']['rsum']:.1f}, "
            f"i2t R@1 {before['i2t_r1']:.1f} -> {res['after']['i2t_r1']:.1f}, t2i R@1 {before['t2i_r1']:.1f} -> "
            f"{res['after']['t2i_r1']:.1f}; re-ranking {t_rr:.1f}s (scoring {t_scores:.1f}s)")
    row = {"metrics": {**res["after"], "epoch": (src.get("metrics") or {}).get("epoch")}, "before": before,
           "epochs": src.get("epochs", "?"), "minutes_per_epoch": src.get("minutes_per_epoch", float("nan")),
           "command": cmd, "config": src.get("config", {"train": {"batch_size": 128}}),
           "rerank": {"k": res["k"], "k_text": res["k_text"], "text": text, "seconds": t_rr},
           "finished": time.strftime("%Y-%m-%dT%H:%M:%S"), "note": note}
    write_json(RUNS / f"{name}.json", row)
    results = load_results()
    write_text(HERE / "results" / "flickr8k.md", render(results))
    print(note)


if __name__ == "__main__":
    main()
