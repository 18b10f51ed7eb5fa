"""How SCAN and CAAN attend on grid features: entropy of the attention of matching pairs (issues 17, 22).

    python experiments/scan_attention.py --checkpoint $VLMATCH_CACHE/runs/NAME/best [NAME2/best ...]

For the first ``--images`` val images and each of their captions (positive pairs only), takes the
model's attention (SCAN t-i: each word's weights over the k regions; SCAN i-t: each region's weights
over the words; CAAN: its one distribution over the regions, f, and its one over the words, g, rows
``over regions`` and ``over words``) and reports, per checkpoint:

- ``entropy``: mean normalised entropy H / log(n) of the attention distributions (1 = uniform,
  0 = all weight on one cell),
- ``effective``: mean exp(H), the effective number of cells (or words) attended,
- ``top1``: mean largest weight, and ``top1_uniform`` = 1/n for comparison,
- ``cells``: how alike the grid cells are: mean cosine between two different cells of one image and
  between cells of two different images, for the raw backbone features and for the model's embedded
  regions (if cells of one image are nearly as alike as the image's mean, there is little to attend to),
- with ``--uniform``: the val rsum of the checkpoint as trained and with its attention replaced by the
  uniform one (SCAN: λ1 = 0, every word attends to the mean cell; CAAN: its baseline's mean pooling of
  regions and words, with the trained encoders), both through the scoring engine on the whole val
  split -- what the learned attention adds.

Results go to experiments/results/scan_attention.{json,md}; heat maps made with ``vlmatch explain
--out experiments/results/scan_attention/NAME.png`` are linked from the report.
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

import numpy as np
import torch

from vlmatch.data.precomp import PrecompSplit
from vlmatch.io import write_json, write_text
from vlmatch.models.registry import load_model
from vlmatch_lab.caches import features_dir
from vlmatch_lab.inputs import need_features, need_run

HERE = Path(__file__).resolve().parent
FEATURES = features_dir()  # the study's feature cache (Lite0, 224 px), under the rooms' one cache
RESULTS = HERE / "results"


def _distributions(att: dict) -> dict[str, np.ndarray]:
    """One pair's attention as its distributions, one per row, keyed by what they are over."""
    if att["axis"] == "pair":  # CAAN: f over the regions and g over the words, one each
        return {"regions": np.asarray(att["region_weights"], dtype=np.float64)[None],
                "words": np.asarray(att["word_weights"], dtype=np.float64)[None]}
    w = np.asarray(att["weights"], dtype=np.float64)  # (k, n)
    return {"regions": w.T} if att["axis"] == "regions" else {"words": w}


def _summary(over: str, rows: list[np.ndarray]) -> dict:
    sizes = [r.shape[1] for r in rows]
    dists = [d for r in rows for d in r]
    p = [np.clip(d, 1e-12, 1.0) for d in dists]
    h = np.array([-(x * np.log(x)).sum() for x in p])
    ent = h / np.log([len(d) for d in dists])
    return {"distributions": len(dists), "attends_over": over, "cells": int(np.median(sizes)),
            "entropy": float(np.mean(ent)), "entropy_p10": float(np.percentile(ent, 10)),
            "entropy_p90": float(np.percentile(ent, 90)), "effective": float(np.mean(np.exp(h))),
            "top1": float(np.mean([d.max() for d in dists])), "top1_uniform": 1.0 / float(np.median(sizes))}


@torch.no_grad()
def attention_stats(model, split: PrecompSplit, n_images: int) -> dict[str, dict]:
    """The attention's statistics over the positive pairs, one entry per axis the model attends over."""
    model.eval()
    by_axis: dict[str, list[np.ndarray]] = {}
    pairs = 0
    for i in range(min(n_images, split.n_images)):
        feats = torch.as_tensor(np.array(split.image(i), dtype=np.float32))[None]
        img = model.encode_images(feats, None)
        for j in range(i * split.per_image, (i + 1) * split.per_image):
            tokens, lengths = model.tokenize([split.captions[j]])
            for over, d in _distributions(model.pair_attention(img, model.encode_texts(tokens, lengths))).items():
                by_axis.setdefault(over, []).append(d)
            pairs += 1
    return {over: {"pairs": pairs, **_summary(over, rows)} for over, rows in by_axis.items()}


def _cell_cosines(cells: list[np.ndarray]) -> dict:
    """Mean cosine of two different cells of one image, and of cells of two different images."""
    unit = [c / (np.linalg.norm(c, axis=1, keepdims=True) + 1e-12) for c in cells]
    within, across = [], []
    for i, c in enumerate(unit):
        g = c @ c.T
        n = len(c)
        within.append((g.sum() - np.trace(g)) / (n * (n - 1)))
        across.append(float((c @ unit[(i + 1) % len(unit)].T).mean()))
    return {"within_image": float(np.mean(within)), "across_images": float(np.mean(across))}


@torch.no_grad()
def cell_stats(model, split: PrecompSplit, n_images: int) -> dict:
    raw, emb = [], []
    for i in range(min(n_images, split.n_images)):
        f = np.array(split.image(i), dtype=np.float32)
        raw.append(f.astype(np.float64))
        emb.append(model.encode_images(torch.from_numpy(f)[None], None).regions[0].double().numpy())
    return {"raw": _cell_cosines(raw), "embedded": _cell_cosines(emb)}


def uniform_settings(model) -> dict:
    """The options that make ``model``'s attention uniform with everything else as trained: SCAN's
    λ1 = 0 (a softmax at temperature 0), CAAN's baseline form (no inter- or intra-modal attention: the
    mean of the regions and the mean of the words)."""
    if hasattr(model.cfg, "lambda_softmax"):
        return {"lambda_softmax": 0.0}
    if hasattr(model.cfg, "inter") and hasattr(model.cfg, "intra"):
        return {"inter": False, "intra": "none"}
    sys.exit(f"--uniform: no uniform form of {model.name}'s attention is known here (SCAN and CAAN have one)")


@torch.no_grad()
def uniform_ablation(model, features) -> dict:
    """Val rsum as trained and with uniform attention (:func:`uniform_settings`), whole val split."""
    from vlmatch.evaluation.metrics import evaluate_protocol
    from vlmatch.evaluation.scoring import model_scores

    change = uniform_settings(model)
    split = PrecompSplit(features, "dev")
    trained = evaluate_protocol(model_scores(model, split, progress=True), "single")["rsum"]
    kept = {k: getattr(model.cfg, k) for k in change}
    for k, v in change.items():
        setattr(model.cfg, k, v)
    try:
        uniform = evaluate_protocol(model_scores(model, split, progress=True), "single")["rsum"]
    finally:
        for k, v in kept.items():
            setattr(model.cfg, k, v)
    return {"rsum_trained": trained, "rsum_uniform": uniform, "uniform_by": change,
            **({"lambda_softmax": kept["lambda_softmax"]} if "lambda_softmax" in kept else {})}


def render(rows: dict) -> str:
    lines = ["# SCAN and CAAN attention on Flickr8k val grid features (positive pairs)", "",
             "Normalised entropy H/log(n) of each attention distribution (1 = uniform over the n cells or words, "
             "0 = one cell); effective = exp(H); top1 = the largest weight (uniform: 1/n).", "",
             "| checkpoint | over | n | entropy (p10-p90) | effective cells | top1 (uniform) |", "|---|---|---|---|---|---|"]
    for name, row in rows.items():
        # rows written before CAAN (one axis) hold the statistics themselves
        for r in (row["attention"].values() if "attention" in row else [row]):
            lines.append(f"| {name} | {r['attends_over']} | {r['cells']} | {r['entropy']:.3f} ({r['entropy_p10']:.3f}-"
                         f"{r['entropy_p90']:.3f}) | {r['effective']:.1f} | {r['top1']:.3f} ({r['top1_uniform']:.3f}) |")
    cells = {n: r for n, r in rows.items() if "cells_cos" in r}
    if cells:
        lines += ["", "How alike the 7x7 cells are (mean cosine; raw = the backbone's 1280-d features, embedded = "
                      "the model's D-d regions):", "",
                  "| checkpoint | raw: two cells of one image | raw: cells of two images | embedded: one image | "
                  "embedded: two images |", "|---|---|---|---|---|"]
        for n, r in cells.items():
            c = r["cells_cos"]
            lines.append(f"| {n} | {c['raw']['within_image']:.3f} | {c['raw']['across_images']:.3f} | "
                         f"{c['embedded']['within_image']:.3f} | {c['embedded']['across_images']:.3f} |")
    abl = {n: r for n, r in rows.items() if "uniform" in r}
    if abl:
        lines += ["", "What the learned attention adds (whole val split, 1000 images x 5000 captions):", "",
                  "| checkpoint | val rsum as trained | with uniform attention | difference |",
                  "|---|---|---|---|"]
        for n, r in abl.items():
            u = r["uniform"]
            how = (f"lambda1 {u['lambda_softmax']:g} -> 0" if "lambda_softmax" in u
                   else ", ".join(f"{k} = {v}" for k, v in u["uniform_by"].items()))
            lines.append(f"| {n} ({how}) | {u['rsum_trained']:.1f} | {u['rsum_uniform']:.1f} | "
                         f"{u['rsum_trained'] - u['rsum_uniform']:+.1f} |")
    pngs = sorted((RESULTS / "scan_attention").glob("*.png"))
    if pngs:
        lines += ["", "Heat maps (`vlmatch explain`, one panel per word, one colour scale; uniform = 1/49 = 0.020):", ""]
        lines += [f"![{p.stem}](scan_attention/{p.name})" for p in pngs]
    notes = [f"- {name}: {r['note']}" for name, r in rows.items() if r.get("note")]
    return "\n".join(lines + (["", "Notes:"] + notes if notes else [])) + "\n"


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--checkpoint", nargs="+", required=True)
    ap.add_argument("--features", default=str(FEATURES))
    ap.add_argument("--images", type=int, default=100)
    ap.add_argument("--note", help="a remark stored with these rows (what the checkpoint is)")
    ap.add_argument("--uniform", action="store_true",
                    help="also score the whole val split with uniform attention (SCAN: lambda1 = 0; CAAN: mean "
                         "pooling) against as trained")
    a = ap.parse_args(argv)
    need_features(Path(a.features))
    for ck in a.checkpoint:
        need_run(Path(ck))
    split = PrecompSplit(a.features, "dev", max_images=a.images)
    out = RESULTS / "scan_attention.json"
    rows = json.loads(out.read_text()) if out.is_file() else {}
    for ck in a.checkpoint:
        name = Path(ck).parent.name if Path(ck).name == "best" else Path(ck).name
        model = load_model(ck)
        prev = rows.get(name, {})  # a re-run keeps the note and the ablation only for the same checkpoint
        keep = {k: prev[k] for k in ("note", "uniform") if k in prev and prev.get("checkpoint") == ck}
        row = {**keep, "attention": attention_stats(model, split, a.images), "checkpoint": ck,
               "cells_cos": cell_stats(model, split, a.images), **({"note": a.note} if a.note else {})}
        if a.uniform:
            row["uniform"] = uniform_ablation(model, a.features)
        rows[name] = row
    write_json(out, rows)
    write_text(RESULTS / "scan_attention.md", render(rows))
    print(render(rows))


if __name__ == "__main__":
    main()
