"""Two-stage retrieval against the exhaustive score matrix: recall and time for a few K.

    python benchmarks/two_stage.py --checkpoint $VLMATCH_CACHE/runs/mmca_f8k/best --images 200

Stage 1 ranks every pair by the model's global part (``global_embeddings``: for MMCA i0·c0, one
GEMM); stage 2 re-scores each query's top K with the full score (``scoring.two_stage_scores``).
Both are run on the same slice of the val split (the first --images images and their captions),
so the recalls compare like for like; times are wall seconds on this machine (text-encoder
outputs come from the on-disk cache in both). Results: benchmarks/results/two_stage_<name>.{json,md}.
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from pathlib import Path

import torch

from vlmatch_lab.caches import features_dir
from vlmatch_lab.inputs import need_features

HERE = Path(__file__).resolve().parent


def main(argv=None) -> dict:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--checkpoint", required=True)
    ap.add_argument("--data", default=str(features_dir()))
    ap.add_argument("--split", default="dev")
    ap.add_argument("--images", type=int, default=200)
    ap.add_argument("--ks", default="1,5,10,20,50")
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--name", default=None)
    a = ap.parse_args(argv)
    from vlmatch import load_model
    from vlmatch.data.precomp import PrecompSplit
    from vlmatch.evaluation.metrics import format_table, recall_metrics
    from vlmatch.evaluation.scoring import model_scores, two_stage_scores

    need_features(Path(a.data), (a.split,))
    torch.set_num_threads(a.threads)
    model = load_model(a.checkpoint)
    split = PrecompSplit(a.data, a.split, max_images=a.images)
    two_stage_scores(model, split, 1, progress=False)  # warm the text cache and the allocator
    rows, table = {}, {}
    t = time.perf_counter()
    full = recall_metrics(model_scores(model, split, progress=False))
    rows["exhaustive"] = {"seconds": time.perf_counter() - t, "pairs": split.n_images * len(split.captions), **full}
    table["exhaustive"] = full
    for k in [int(x) for x in a.ks.split(",")]:
        t = time.perf_counter()
        m = recall_metrics(*two_stage_scores(model, split, k, progress=False))
        rows[f"top {k}"] = {"seconds": time.perf_counter() - t, "pairs": (split.n_images + len(split.captions)) * k, **m}
        table[f"two-stage top {k}"] = m
    name = a.name or Path(a.checkpoint).resolve().parent.name
    r = {"checkpoint": a.checkpoint, "split": a.split, "images": split.n_images, "captions": len(split.captions),
         "threads": a.threads, "command": "python benchmarks/two_stage.py " + " ".join(argv or sys.argv[1:]),
         "rows": rows}
    md = (f"# Two-stage retrieval vs exhaustive: {name}\n\n{split.n_images} images x {len(split.captions)} "
          f"captions of Flickr8k {a.split}, {a.threads} threads. Stage 1: i0·c0 for every pair; stage 2: "
          f"the full score on each query's top K.\n\n```\n{format_table(table)}\n```\n\n"
          "| | pairs fully scored | seconds |\n|---|---:|---:|\n"
          + "".join(f"| {k} | {v['pairs']} | {v['seconds']:.1f} |\n" for k, v in rows.items())
          + f"\nReproduce: `{r['command']}`\n")
    out = HERE / "results" / f"two_stage_{name}"
    out.with_suffix(".json").write_text(json.dumps(r, indent=2) + "\n")
    out.with_suffix(".md").write_text(md)
    print(md)
    return r


if __name__ == "__main__":
    main()
