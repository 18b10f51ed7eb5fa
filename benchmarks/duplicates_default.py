"""Duplicates measured on the shipped default model, against photos that look alike (issue 60, item 6).

    nice -n 19 python benchmarks/duplicates_default.py          # make the set, build its index, measure
    python benchmarks/duplicates_default.py --rerender          # only rewrite duplicates_default.md

The threshold of ``vlmatch index duplicates`` and its figures were measured (benchmarks/duplicates.py) with the
model the default replaced, on easy negatives (random other photos). This set is harder on both sides, all of it
made here from Flickr8k val photos (under $VLMATCH_CACHE/duplicates_default/):

* **copy families**: ``--originals`` photos, each with the copies ``resized`` (50 % of each side), ``q50`` (JPEG
  quality 50), ``crop10`` (10 % of each side cut away, off-centre), ``rotated`` (stored sideways with EXIF
  orientation 6), ``brighter`` and ``darker`` (exposure shifted by +/- 2/3 stop, gamma-curved: the neighbours of
  an HDR bracket or a burst), ``burst`` (shifted by 3 % and 1/3 stop brighter: the next frame of a burst);
* **look-alikes**, which must not be grouped: ``--scenes`` photos cut into their left and right 45 % (two
  crops of one scene that do not overlap: same place, same light), and every other val photo as a distinct
  photo -- so each val photo's nearest other val photo by the model's embedding is in the set (the
  ``nearest_distinct`` figures say how close those pairs come and how many are grouped).

Families, scenes and distinct photos are split in halves at random (seed 0); the threshold is the one with the
best pairwise F1 on half A, and every figure is of half B (the same code as the command:
:func:`vlmatch.search.library.duplicates.similar_pairs` and :func:`group_pairs`). The chosen threshold is stored with
the model (its ``duplicates`` record in ``src/vlmatch/pretrained/registry.json``), which ``index duplicates``
reads when ``--threshold`` is not given. Not a timing: run it under nice beside anything.

Results: benchmarks/results/duplicates_default.json and .md.
"""

from __future__ import annotations

import argparse
import json
import os
import shlex
import subprocess
import sys
import time
from pathlib import Path

import duplicates as D  # benchmarks/duplicates.py: its evaluation, on this set's kinds
import numpy as np
from harness import write_report

from vlmatch_lab.host import cpu_flags, cpu_model
from vlmatch_lab.paths import cache_root, data_root

HERE = Path(__file__).resolve().parent
RESULTS = HERE / "results" / "duplicates_default"
SHARED = data_root(check=False) / "flickr8k"  # $VLMATCH_DATA/flickr8k: the photos and Karpathy captions
CACHE = cache_root() / "duplicates_default"
KINDS = ("resized", "q50", "crop10", "rotated", "brighter", "darker", "burst")


def exposure(im, stops: float):
    """Pixels as if exposed ``stops`` more (linear light, sRGB-ish gamma 2.2), clipped as a sensor clips."""
    from PIL import Image

    a = (np.asarray(im, dtype=np.float32) / 255.0) ** 2.2 * (2.0 ** stops)
    return Image.fromarray(np.clip(np.rint(np.clip(a, 0, 1) ** (1 / 2.2) * 255), 0, 255).astype(np.uint8))


def make_copy(src: Path, kind: str, dst: Path) -> None:
    from PIL import Image

    with Image.open(src) as im:
        im = im.convert("RGB")
    w, h = im.size
    if kind == "resized":
        im.resize((round(w * 0.5), round(h * 0.5)), Image.LANCZOS).save(dst, quality=90)
    elif kind == "q50":
        im.save(dst, quality=50)
    elif kind == "crop10":
        dx, dy = round(w * 0.10), round(h * 0.10)
        im.crop((dx // 3, dy // 3, w - dx + dx // 3, h - dy + dy // 3)).save(dst, quality=90)
    elif kind == "rotated":
        D.make_copy(src, "rotated", dst)
    elif kind in ("brighter", "darker"):
        exposure(im, 2 / 3 if kind == "brighter" else -2 / 3).save(dst, quality=90)
    elif kind == "burst":
        dx, dy = round(w * 0.03), round(h * 0.03)
        exposure(im.crop((dx, dy, w, h)).resize((w, h), Image.BICUBIC), 1 / 3).save(dst, quality=90)
    else:
        raise ValueError(kind)


def make_set(images: Path, n_orig: int, n_scenes: int, seed: int) -> tuple[Path, dict]:
    """The photo folder and its truth: file name -> (family or None, kind, scene or None)."""
    from PIL import Image

    meta = json.loads((SHARED / "dataset_flickr8k.json").read_text())
    val = sorted(im["filename"] for im in meta["images"] if im["split"] == "val")
    order = [val[i] for i in np.random.default_rng(seed).permutation(len(val))]
    folder = CACHE / f"photos_{n_orig}_{n_scenes}_{seed}"
    truth = {}
    for f, name in enumerate(order[:n_orig]):
        truth[f"f{f:04d}_orig_{Path(name).stem}.jpg"] = (f, "orig", None, name)
        for kind in KINDS:
            truth[f"f{f:04d}_{kind}_{Path(name).stem}.jpg"] = (f, kind, None, name)
    for s, name in enumerate(order[n_orig:n_orig + n_scenes]):
        for side in ("left", "right"):
            truth[f"s{s:04d}_{side}_{Path(name).stem}.jpg"] = (None, side, s, name)
    for name in order[n_orig + n_scenes:]:
        truth[f"distinct_{Path(name).stem}.jpg"] = (None, "distinct", None, name)
    done = folder / ".complete"
    if not done.is_file():
        folder.mkdir(parents=True, exist_ok=True)
        for fname, (_, kind, _, name) in truth.items():
            src = images / name
            if kind in ("orig", "distinct"):
                with Image.open(src) as im:
                    im.convert("RGB").save(folder / fname, quality=95)
            elif kind in ("left", "right"):
                with Image.open(src) as im:
                    w, h = im.size
                    box = (0, 0, round(w * 0.45), h) if kind == "left" else (w - round(w * 0.45), 0, w, h)
                    im.convert("RGB").crop(box).save(folder / fname, quality=95)
            else:
                make_copy(src, kind, folder / fname)
        done.write_text("ok\n")
    return folder, {k: v[:3] for k, v in truth.items()}


def build(folder: Path, out: Path) -> float:
    if (out / "manifest.json").is_file():
        return float((out.parent / f"{out.name}.build_s").read_text())
    t0 = time.perf_counter()
    subprocess.run([sys.executable, "-m", "vlmatch.cli", "index", "build", "--images", str(folder), "--out", str(out),
                    "--no-progress"], check=True, stdout=subprocess.DEVNULL)
    took = time.perf_counter() - t0
    (out.parent / f"{out.name}.build_s").write_text(f"{took}\n")
    return took


def lookalike_figures(rows, vectors, queries, fam, kind, scene, threshold) -> dict:
    """Of half ``rows``: each scene's two crops (similarity, grouped?), and each distinct photo's nearest other
    distinct photo (similarity; how many such pairs reach the threshold)."""
    rows = np.asarray(rows)
    left = {scene[r]: r for r in rows if kind[r] == "left"}
    right = {scene[r]: r for r in rows if kind[r] == "right"}
    halves = [float(queries[left[s]] @ vectors[right[s]]) for s in left if s in right]
    dis = np.array([r for r in rows if kind[r] == "distinct"])
    sim = queries[dis] @ vectors[dis].T
    np.fill_diagonal(sim, -np.inf)
    nearest = sim.max(axis=1)
    return {"scene_halves": {"pairs": len(halves), "similarity_p50_p95_max": [round(float(x), 3) for x in
                                                                              np.percentile(halves, [50, 95, 100])],
                             "at_or_above_threshold": int(sum(h >= threshold for h in halves))},
            "nearest_distinct": {"photos": len(dis), "similarity_p50_p95_max": [round(float(x), 3) for x in
                                                                                np.percentile(nearest, [50, 95, 100])],
                                 "pairs_at_or_above_threshold": int((np.triu(sim, 1) >= threshold).sum())}}


def run(a, argv) -> dict:
    from vlmatch.search.index import Index
    from vlmatch.search.library.similar import image_query

    D.KINDS = KINDS  # the evaluation's recall per copy kind, over this set's kinds
    folder, truth = make_set(Path(a.images), a.originals, a.scenes, a.seed)
    out = CACHE / f"index_{folder.name}"
    build_s = build(folder, out)
    idx = Index.open(out, lean_queries=False)
    names = [Path(it["path"]).name for it in idx.items]
    fam = np.array([-1 if truth[n][0] is None else truth[n][0] for n in names])
    kind = [truth[n][1] for n in names]
    scene = [truth[n][2] for n in names]
    vectors = np.asarray(idx.images.stage1.vectors, dtype=np.float32)
    queries = image_query(idx, vectors)
    rng = np.random.default_rng(a.seed)
    fam_a = set(rng.permutation(a.originals)[: a.originals // 2].tolist())
    scene_a = set(rng.permutation(a.scenes)[: a.scenes // 2].tolist())
    distinct = [r for r in range(len(names)) if kind[r] == "distinct"]
    distinct_a = set(rng.permutation(distinct)[: len(distinct) // 2].tolist())
    in_a = np.array([fam[r] in fam_a if fam[r] >= 0 else scene[r] in scene_a if scene[r] is not None
                     else r in distinct_a for r in range(len(names))])
    rows_a, rows_b = np.flatnonzero(in_a), np.flatnonzero(~in_a)
    sweep = [D.evaluate(rows_a, vectors, queries, fam, kind, float(t)) for t in D.GRID]
    best = max(sweep, key=lambda r: (r["pair_f1"], r["threshold"]))
    t = best["threshold"]
    half_b = D.evaluate(rows_b, vectors, queries, fam, kind, t)
    from vlmatch.search.library.duplicates import DEFAULT_THRESHOLD

    before = D.evaluate(rows_b, vectors, queries, fam, kind, DEFAULT_THRESHOLD)  # the generic default, for comparison
    model = Path(idx.manifest["model"]["checkpoint"]).name
    return {"command": ("nice -n 19 python benchmarks/duplicates_default.py " + shlex.join(argv)).strip(),
            "host": {"cpu": cpu_model(), "flags": cpu_flags(), "threads": os.environ.get("OMP_NUM_THREADS")},
            "model": model, "set": {"originals": a.originals, "copies": list(KINDS), "scenes": a.scenes,
                                    "distinct": len(distinct), "photos": len(names), "seed": a.seed},
            "build_s": build_s, "threshold": t,
            "half_a": {k: best[k] for k in ("pair_precision", "pair_recall", "pair_f1")},
            "half_b": half_b, "half_b_at_generic": {"threshold": DEFAULT_THRESHOLD, **{
                k: before[k] for k in ("pair_precision", "pair_recall", "pair_f1", "group_precision", "group_recall",
                                       "distinct_photos_grouped")}},
            "lookalikes_half_b": lookalike_figures(rows_b, vectors, queries, fam, kind, scene, t),
            "similarities": D.similarity_figures(queries, vectors, fam, kind),
            "sweep_half_a": [{k: r[k] for k in ("threshold", "pair_precision", "pair_recall", "pair_f1")}
                             for r in sweep[::4]]}


def render(r: dict) -> str:
    b, look, sim = r["half_b"], r["lookalikes_half_b"], r["similarities"]
    lines = [
        "# Near-duplicate photos on the shipped default, against look-alikes (issue 60, item 6)", "",
        f"Command: `{r['command']}`  ", f"Host: {r['host']['cpu']} ({', '.join(r['host']['flags'])})  ",
        f"Model: {r['model']}; set: {r['set']['originals']} Flickr8k val photos, each with the copies "
        f"{', '.join(r['set']['copies'])}; {r['set']['scenes']} val photos cut into two crops that do not overlap; "
        f"{r['set']['distinct']} other val photos ({r['set']['photos']} photos; see the script's docstring). Split "
        "in halves at random: the threshold is picked on half A, every figure is of half B.", "",
        f"Threshold chosen on half A (best pairwise F1 over {D.GRID[0]}..{D.GRID[-1]}): **{r['threshold']}** "
        f"(half A: P {r['half_a']['pair_precision']:.3f}, R {r['half_a']['pair_recall']:.3f}); stored with the model "
        "(registry `duplicates`), the default of `vlmatch index duplicates`.", "",
        "| half B | value |", "|---|---:|",
        f"| photos (families, other photos) | {b['photos']} ({b['families']}, {b['distinct']}) |",
        f"| pairwise precision | {b['pair_precision']:.3f} |", f"| pairwise recall | {b['pair_recall']:.3f} |",
        f"| pairwise F1 | {b['pair_f1']:.3f} |",
        f"| group precision (groups that are exactly a family) | {b['group_precision']:.3f} |",
        f"| group recall (families found exactly) | {b['group_recall']:.3f} |",
        *[f"| recall of (original, {k}) pairs | {v:.3f} |" for k, v in b["recall_by_kind"].items()],
        f"| other photos put in a group | {b['distinct_photos_grouped']} |",
        f"| scene halves at or above the threshold | {look['scene_halves']['at_or_above_threshold']} of "
        f"{look['scene_halves']['pairs']} |",
        f"| distinct photos: pairs at or above the threshold | {look['nearest_distinct']['pairs_at_or_above_threshold']} |",
        "",
        *([f"At the generic default {g['threshold']} (the threshold measured with the model the default replaced), "
           f"half B reads pairwise P {g['pair_precision']:.3f}, R {g['pair_recall']:.3f}, group precision "
           f"{g['group_precision']:.3f}, {g['distinct_photos_grouped']} other photos grouped.", ""]
          if (g := r.get("half_b_at_generic")) else []),
        "Similarity of each copy kind to its original (min, 5th percentile, median; all of the set): "
        + "; ".join(f"{k} {v}" for k, v in sim.items() if k in r["set"]["copies"]) + ".  ",
        f"Look-alikes (half B): a scene's two crops {look['scene_halves']['similarity_p50_p95_max']} (median, 95th "
        f"percentile, max); each distinct photo's nearest other photo {look['nearest_distinct']['similarity_p50_p95_max']}; "
        f"the five closest different photos of the set {sim['different_photos_top5']}.", "",
        "Half A sweep (every 4th threshold):", "", "| threshold | P | R | F1 |", "|---:|---:|---:|---:|",
        *[f"| {s['threshold']} | {s['pair_precision']:.3f} | {s['pair_recall']:.3f} | {s['pair_f1']:.3f} |"
          for s in r["sweep_half_a"]], ""]
    return "\n".join(lines)


def main(argv=None):
    argv = sys.argv[1:] if argv is None else argv
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--images", default=str(SHARED / "images"))
    p.add_argument("--originals", type=int, default=200)
    p.add_argument("--scenes", type=int, default=100)
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--rerender", action="store_true")
    a = p.parse_args(argv)
    r = json.loads(RESULTS.with_suffix(".json").read_text()) if a.rerender else run(a, argv)
    write_report(RESULTS, r, render)
    print(render(r))


if __name__ == "__main__":
    main()
