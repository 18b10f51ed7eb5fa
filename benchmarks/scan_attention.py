"""How SCAN attends on grid features: entropy of the attention of matching pairs (issue 17).

    python benchmarks/scan_attention.py --checkpoint benchmarks/cache/runs/NAME/best [NAME2/best ...]

For the first ``--images`` val images and each of their captions (positive pairs only), takes the
model's attention (t-i: each word's weights over the k regions; i-t: each region's weights over
the words) and reports, per checkpoint:

- ``entropy``: mean normalised entropy H / log(n) of the attention distributions (1 = uniform,
  0 = all weight on one cell),
- ``effective``: mean exp(H), the effective number of cells (or words) attended,
- ``top1``: mean largest weight, and ``top1_uniform`` = 1/n for comparison.

Results go to benchmarks/results/scan_attention.{json,md}.
"""

from __future__ import annotations

import argparse
import json
from pathlib import Path

import numpy as np
import torch

from vlmatch.data.precomp import PrecompSplit
from vlmatch.io import write_json, write_text
from vlmatch.models.registry import load_model

HERE = Path(__file__).resolve().parent
FEATURES = HERE / "cache" / "flickr8k-efficientnet-lite0"
RESULTS = HERE / "results"


@torch.no_grad()
def attention_stats(model, split: PrecompSplit, n_images: int) -> dict:
    model.eval()
    ent, eff, top1, sizes = [], [], [], []
    for i in range(min(n_images, split.n_images)):
        feats = torch.as_tensor(np.array(split.image(i), dtype=np.float32))[None]
        img = model.encode_images(feats, None)
        for j in range(i * split.per_image, (i + 1) * split.per_image):
            tokens, lengths = model.tokenize([split.captions[j]])
            att = model.pair_attention(img, model.encode_texts(tokens, lengths))
            w = np.asarray(att["weights"], dtype=np.float64)  # (k, n)
            dists = w.T if att["axis"] == "regions" else w  # one distribution per row
            n = dists.shape[1]
            p = np.clip(dists, 1e-12, 1.0)
            h = -(p * np.log(p)).sum(axis=1)
            ent += list(h / np.log(n))
            eff += list(np.exp(h))
            top1 += list(dists.max(axis=1))
            sizes.append(n)
    return {"pairs": len(sizes), "distributions": len(ent),
            "attends_over": "regions" if model.cfg.direction == "t2i" else "words",
            "cells": int(np.median(sizes)), "entropy": float(np.mean(ent)),
            "entropy_p10": float(np.percentile(ent, 10)), "entropy_p90": float(np.percentile(ent, 90)),
            "effective": float(np.mean(eff)), "top1": float(np.mean(top1)), "top1_uniform": 1.0 / float(np.median(sizes))}


def render(rows: dict) -> str:
    lines = ["# SCAN attention on Flickr8k val grid features (positive pairs)", "",
             "Normalised entropy H/log(n) of each attention distribution (1 = uniform over the n cells or words, "
             "0 = one cell); effective = exp(H); top1 = the largest weight (uniform: 1/n).", "",
             "| checkpoint | over | n | entropy (p10-p90) | effective cells | top1 (uniform) |", "|---|---|---|---|---|---|"]
    for name, r in rows.items():
        lines.append(f"| {name} | {r['attends_over']} | {r['cells']} | {r['entropy']:.3f} ({r['entropy_p10']:.3f}-"
                     f"{r['entropy_p90']:.3f}) | {r['effective']:.1f} | {r['top1']:.3f} ({r['top1_uniform']:.3f}) |")
    notes = [f"- {name}: {r['note']}" for name, r in rows.items() if r.get("note")]
    return "\n".join(lines + (["", "Notes:"] + notes if notes else [])) + "\n"


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--checkpoint", nargs="+", required=True)
    ap.add_argument("--features", default=str(FEATURES))
    ap.add_argument("--images", type=int, default=100)
    ap.add_argument("--note", help="a remark stored with these rows (what the checkpoint is)")
    a = ap.parse_args(argv)
    split = PrecompSplit(a.features, "dev", max_images=a.images)
    out = RESULTS / "scan_attention.json"
    rows = json.loads(out.read_text()) if out.is_file() else {}
    for ck in a.checkpoint:
        name = Path(ck).parent.name if Path(ck).name == "best" else Path(ck).name
        rows[name] = {**attention_stats(load_model(ck), split, a.images), "checkpoint": ck,
                      **({"note": a.note} if a.note else {})}
    write_json(out, rows)
    write_text(RESULTS / "scan_attention.md", render(rows))
    print(render(rows))


if __name__ == "__main__":
    main()
