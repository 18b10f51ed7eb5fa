"""Near-duplicate photos (issue 46, item 6) and search by photo (item 5), measured on Flickr8k val photos.

    nice -n 10 python benchmarks/duplicates.py                 # make the set, build its index, measure
    python benchmarks/duplicates.py --rerender                 # only rewrite duplicates.md

The set (under $VLMATCH_CACHE/duplicates/): ``--originals`` Flickr8k val photos (seed 0), each with four
copies -- ``resized`` (60 % of each side, JPEG quality 90), ``q60`` (re-encoded at JPEG quality 60),
``crop5`` (5 % of each side cut away, off-centre, quality 90) and ``rotated`` (the pixels turned 90 degrees
counter-clockwise and EXIF orientation 6 written, so that it is displayed upright: how a phone stores a
portrait shot) -- mixed with ``--distinct`` other val photos, all indexed with the shipped default model
(``vlmatch index build --images DIR --out IDX``).

The originals (with their copies) and the distinct photos are split in two halves at random (seed 0).
The threshold of ``vlmatch index duplicates`` is chosen on half A (the one with the best pairwise F1 over
a grid) and every figure is reported on half B, whose photos are grouped on their own (the same code as
the command: :func:`vlmatch.search.library.duplicates.similar_pairs` and :func:`group_pairs` on B's vectors):

* pairwise precision / recall: over the pairs of photos put in one group, against the pairs of one family
  (an original and its copies);
* per group: a family counts as found when one group is exactly that family; precision is the share of the
  groups that are exactly a family, recall the share of the families found exactly;
* recall per copy kind: the share of (original, copy) pairs put in one group;
* search by photo: for each original of B, the share of its four copies among the first five of
  ``Index.search_like(original id)`` over B ∪ A (the whole index), and how often it is itself first.

Results: benchmarks/results/duplicates.json and duplicates.md.
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

import numpy as np
from harness import write_report

from vlmatch_lab.host import cpu_flags, cpu_model
from vlmatch_lab.paths import cache_root, data_root

HERE = Path(__file__).resolve().parent
RESULTS = HERE / "results" / "duplicates"
SHARED = data_root(check=False) / "flickr8k"  # $VLMATCH_DATA/flickr8k: the photos and Karpathy captions
CACHE = cache_root() / "duplicates"
KINDS = ("resized", "q60", "crop5", "rotated")
GRID = np.round(np.arange(0.50, 0.995, 0.005), 3)


def make_copy(src: Path, kind: str, dst: Path) -> None:
    from PIL import Image

    with Image.open(src) as im:
        im = im.convert("RGB")
    w, h = im.size
    if kind == "resized":
        im.resize((round(w * 0.6), round(h * 0.6)), Image.LANCZOS).save(dst, quality=90)
    elif kind == "q60":
        im.save(dst, quality=60)
    elif kind == "crop5":
        dx, dy = round(w * 0.05), round(h * 0.05)
        im.crop((dx // 3, dy // 3, w - dx + dx // 3, h - dy + dy // 3)).save(dst, quality=90)
    elif kind == "rotated":  # stored sideways, displayed upright (orientation 6: turn 90 degrees clockwise)
        exif = Image.Exif()
        exif[0x0112] = 6
        im.transpose(Image.Transpose.ROTATE_90).save(dst, quality=90, exif=exif)
    else:
        raise ValueError(kind)


def make_set(images: Path, n_orig: int, n_distinct: int, seed: int) -> tuple[Path, dict]:
    """The photo folder and its truth: file name -> (family, kind); distinct photos have family None."""
    meta = json.loads((SHARED / "dataset_flickr8k.json").read_text())
    val = sorted(im["filename"] for im in meta["images"] if im["split"] == "val")
    rng = np.random.default_rng(seed)
    picked = [val[i] for i in rng.permutation(len(val))[: n_orig + n_distinct]]
    folder = CACHE / f"photos_{n_orig}_{n_distinct}_{seed}"
    truth = {}
    done = folder / ".complete"
    folder.mkdir(parents=True, exist_ok=True)
    for f, name in enumerate(picked[:n_orig]):
        stem = Path(name).stem
        truth[f"f{f:04d}_orig_{stem}.jpg"] = (f, "orig")
        for kind in KINDS:
            truth[f"f{f:04d}_{kind}_{stem}.jpg"] = (f, kind)
    for name in picked[n_orig:]:
        truth[f"distinct_{Path(name).stem}.jpg"] = (None, "distinct")
    if not done.is_file():
        from PIL import Image

        for fname, (_, kind) in truth.items():
            src = images / (fname.split("_", 2)[-1] if kind != "distinct" else fname.removeprefix("distinct_"))
            if kind in ("orig", "distinct"):
                with Image.open(src) as im:  # the original as a fresh file (same pixels, quality 95)
                    im.convert("RGB").save(folder / fname, quality=95)
            else:
                make_copy(src, kind, folder / fname)
        done.write_text("ok\n")
    return folder, truth


def reader_applies_orientation(folder: Path, truth: dict) -> bool:
    """Does the package's photo reader turn a photo with orientation 6 upright (issue 46 item 1)? Compared on
    the first family: the original vs its rotated copy as read."""
    from vlmatch.features.extract import load_image

    orig = next(n for n, (f, k) in truth.items() if f == 0 and k == "orig")
    rot = next(n for n, (f, k) in truth.items() if f == 0 and k == "rotated")
    a = load_image(folder / orig, 224).astype(float)
    b = load_image(folder / rot, 224).astype(float)
    return float(np.abs(a - b).mean()) < 10.0


def build(folder: Path, out: Path) -> float:
    """Build the set's index (once; the seconds it took are kept beside it for later runs)."""
    took = out.parent / f"{out.name}.build_s"
    if (out / "manifest.json").is_file() and took.is_file():
        return float(took.read_text())
    t0 = time.perf_counter()
    subprocess.run([sys.executable, "-m", "vlmatch.cli", "index", "build", "--images", str(folder), "--out", str(out),
                    "--no-progress"], check=True, stdout=subprocess.DEVNULL)
    seconds = time.perf_counter() - t0
    took.write_text(f"{seconds}\n")
    return seconds


def pair_set(groups) -> set:
    return {(a, b) for g in groups for i, a in enumerate(g) for b in g[i + 1:]}


def evaluate(rows: np.ndarray, vectors: np.ndarray, queries: np.ndarray, fam: np.ndarray, kind: list,
             threshold: float) -> dict:
    """Figures of the photos ``rows`` grouped on their own at ``threshold``."""
    from vlmatch.search.library.duplicates import group_pairs, similar_pairs

    pairs = similar_pairs(vectors[rows], queries[rows], threshold)
    groups = [[int(rows[i]) for i in g] for g in group_pairs(len(rows), [(i, j) for i, j, _ in pairs])]
    pred = pair_set(groups)
    families: dict[int, list[int]] = {}
    for r in rows:
        if fam[r] >= 0:
            families.setdefault(int(fam[r]), []).append(int(r))
    true_groups = [sorted(g) for g in families.values()]
    true = pair_set(true_groups)
    tp = len(pred & true)
    exact = {tuple(sorted(g)) for g in groups} & {tuple(g) for g in true_groups}
    by_kind = {}
    for k in KINDS:
        want = {(min(o, c), max(o, c)) for g in true_groups for o in g if kind[o] == "orig" for c in g if kind[c] == k}
        by_kind[k] = len(want & pred) / max(1, len(want))
    distinct_rows = {int(r) for r in rows if fam[r] < 0}
    return {"threshold": threshold, "photos": len(rows), "families": len(true_groups),
            "distinct": len(distinct_rows), "groups": len(groups),
            "pair_precision": tp / max(1, len(pred)), "pair_recall": tp / max(1, len(true)),
            "pair_f1": 2 * tp / max(1, len(pred) + len(true)),
            "group_precision": len(exact) / max(1, len(groups)), "group_recall": len(exact) / max(1, len(true_groups)),
            "recall_by_kind": by_kind,
            "distinct_photos_grouped": sum(1 for g in groups for r in g if r in distinct_rows)}


def similarity_figures(queries: np.ndarray, vectors: np.ndarray, fam: np.ndarray, kind: list) -> dict:
    """Percentiles (0, 5, 50) of each copy kind's similarity to its original, and the highest similarities
    between two photos of different families (distinct photos and originals)."""
    orig = {int(fam[r]): r for r in range(len(fam)) if kind[r] == "orig"}
    out = {}
    for k in KINDS:
        s = [float(queries[orig[int(fam[r])]] @ vectors[r]) for r in range(len(fam)) if kind[r] == k]
        out[k] = [round(float(x), 3) for x in np.percentile(s, [0, 5, 50])]
    rows = [r for r in range(len(fam)) if kind[r] in ("orig", "distinct")]
    sim = queries[rows] @ vectors[rows].T
    out["different_photos_top5"] = [round(float(x), 3) for x in np.sort(sim[np.triu_indices(len(rows), 1)])[::-1][:5]]
    return out


def like_ranking(rows_b, vectors, queries, fam, kind) -> dict:
    """Search by photo's first five for each original of half B over the whole set, ranked by the image-image
    similarity (for the default model stage 2 is the same cosine, from the stored float16 encodings)."""
    first, share = [], []
    for r in rows_b:
        if kind[r] != "orig":
            continue
        top = np.argsort(-(vectors @ queries[r]), kind="stable")[:5]
        first.append(top[0] == r)
        share.append(sum(1 for j in top if j != r and fam[j] == fam[r]) / len(KINDS))
    return {"queries": len(first), "itself_first": float(np.mean(first)), "copies_in_top5": float(np.mean(share))}


def scenario(rows_a, rows_b, vectors, queries, fam, kind) -> dict:
    sweep = [evaluate(rows_a, vectors, queries, fam, kind, float(t)) for t in GRID]
    best = max(sweep, key=lambda r: (r["pair_f1"], r["threshold"]))
    return {"threshold_from_half_a": best, "half_b": evaluate(rows_b, vectors, queries, fam, kind, best["threshold"]),
            "like_half_b": like_ranking(rows_b, vectors, queries, fam, kind),
            "similarities": similarity_figures(queries, vectors, fam, kind),
            "sweep_half_a": [{k: r[k] for k in ("threshold", "pair_precision", "pair_recall", "pair_f1")}
                             for r in sweep[::4]]}


def scale_timing(n: int, dim: int = 1026) -> dict:
    """Seconds of the duplicates pair search (:func:`similar_pairs` over a flat FAISS stage 1, as the command
    runs it up to 50,000 photos) on ``n`` random unit vectors of the default model's stage-1 width: its cost
    grows with the square of the number of photos, whatever they show."""
    from vlmatch.search.library.duplicates import similar_pairs
    from vlmatch.search.stage1 import build_faiss

    x = np.random.default_rng(0).normal(size=(n, dim)).astype(np.float32)
    x /= np.linalg.norm(x, axis=1, keepdims=True)
    index, _ = build_faiss(x, "flat")
    t0 = time.perf_counter()
    similar_pairs(x, x, 0.68, search=index.search)
    return {"photos": n, "seconds": time.perf_counter() - t0, "threads": os.environ.get("OMP_NUM_THREADS") or "all"}


def like_figures(idx, ids: list[int], fam: np.ndarray, rows_of: dict) -> dict:
    """``search_like`` of each original: itself first? its four copies in the first five?"""
    first, copies_in_top5, t = 0, [], []
    for item_id in ids:
        t0 = time.perf_counter()
        hits = idx.search_like(item_id, k=5)
        t.append(time.perf_counter() - t0)
        first += hits[0].id == item_id
        f = fam[rows_of[item_id]]
        copies_in_top5.append(sum(1 for h in hits if h.id != item_id and fam[rows_of[h.id]] == f) / len(KINDS))
    return {"queries": len(ids), "itself_first": first / len(ids), "copies_in_top5": float(np.mean(copies_in_top5)),
            "p50_ms": float(np.percentile(t, 50) * 1e3)}


def run(a, argv) -> dict:
    from vlmatch.search.index import Index
    from vlmatch.search.library.similar import image_query

    folder, truth = make_set(Path(a.images), a.originals, a.distinct, a.seed)
    out = CACHE / f"index_{folder.name}"
    build_s = build(folder, out)
    idx = Index.open(out, lean_queries=False)
    items = idx.items
    names = [Path(it["path"]).name for it in items]
    fam = np.array([-1 if truth[n][0] is None else truth[n][0] for n in names])
    kind = [truth[n][1] for n in names]
    vectors = np.asarray(idx.images.stage1.vectors, dtype=np.float32)
    queries = image_query(idx, vectors)
    rng = np.random.default_rng(a.seed)
    half_a_fams = set(rng.permutation(a.originals)[: a.originals // 2].tolist())
    distinct = np.flatnonzero(fam < 0)
    half_a_distinct = set(rng.permutation(distinct)[: len(distinct) // 2].tolist())
    in_a = np.array([(fam[r] in half_a_fams) if fam[r] >= 0 else (r in half_a_distinct) for r in range(len(fam))])
    rows_a, rows_b = np.flatnonzero(in_a), np.flatnonzero(~in_a)
    oriented = reader_applies_orientation(folder, truth)
    scenarios = {"reader": scenario(rows_a, rows_b, vectors, queries, fam, kind)}
    best = scenarios["reader"]["threshold_from_half_a"]
    rows_of = {int(it["id"]): r for r, it in enumerate(items)}
    b_orig_ids = [int(items[r]["id"]) for r in rows_b if kind[r] == "orig"]
    like = like_figures(idx, b_orig_ids, fam, rows_of)
    t0 = time.perf_counter()
    cli = subprocess.run([sys.executable, "-m", "vlmatch.cli", "index", "duplicates", str(out),
                          "--json", str(CACHE / "duplicates_cli.json")],
                         check=True, capture_output=True, text=True)
    cli_s = time.perf_counter() - t0
    scale = scale_timing(a.scale) if a.scale else None
    cli_groups = len(json.loads((CACHE / "duplicates_cli.json").read_text())["groups"])
    from vlmatch.search.library.duplicates import DEFAULT_THRESHOLD

    return {"command": ("nice -n 10 python benchmarks/duplicates.py " + shlex.join(argv)).strip(),
            "default_threshold": DEFAULT_THRESHOLD, "picked_threshold": best["threshold"],
            "host": {"cpu": cpu_model(), "flags": cpu_flags(), "threads": os.environ.get("OMP_NUM_THREADS")},
            "model": Path(idx.manifest["model"]["checkpoint"]).name, "set": {"originals": a.originals, "distinct": a.distinct,
                                                          "copies": list(KINDS), "photos": len(items), "seed": a.seed},
            "scale": scale, "reader_applies_orientation": oriented, "build_s": build_s, "scenarios": scenarios,
            "like_half_b": like, "cli": {"seconds": cli_s, "groups_whole_set": cli_groups, "last_line":
                                         cli.stdout.strip().splitlines()[-1] if cli.stdout.strip() else ""}}


SCENARIOS = {"reader": "the index as built"}


def render_scenario(name: str, sc: dict) -> list[str]:
    b, a, sim = sc["half_b"], sc["threshold_from_half_a"], sc["similarities"]
    return [
        f"## {SCENARIOS[name][0].upper() + SCENARIOS[name][1:]}", "",
        f"Threshold chosen on half A (best pairwise F1 over {GRID[0]}..{GRID[-1]}): **{a['threshold']}** "
        f"(half A: pairwise P {a['pair_precision']:.3f}, R {a['pair_recall']:.3f}). Reported on half B only:", "",
        "| half B | value |", "|---|---:|",
        f"| photos (families, distinct) | {b['photos']} ({b['families']}, {b['distinct']}) |",
        f"| pairwise precision | {b['pair_precision']:.3f} |", f"| pairwise recall | {b['pair_recall']:.3f} |",
        f"| pairwise F1 | {b['pair_f1']:.3f} |",
        f"| group precision (groups that are exactly a family) | {b['group_precision']:.3f} |",
        f"| group recall (families found exactly) | {b['group_recall']:.3f} |",
        *[f"| recall of (original, {k}) pairs | {v:.3f} |" for k, v in b["recall_by_kind"].items()],
        f"| distinct photos put in a group | {b['distinct_photos_grouped']} |",
        f"| search by photo: itself first (of {sc['like_half_b']['queries']} originals) | "
        f"{sc['like_half_b']['itself_first']:.3f} |",
        f"| search by photo: share of its 4 copies in the first 5 | {sc['like_half_b']['copies_in_top5']:.3f} |", "",
        "Similarity of each copy to its original (min / 5th percentile / median, whole set): "
        + "; ".join(f"{k} {' / '.join(str(x) for x in sim[k])}" for k in KINDS)
        + f". Highest similarities of two different photos: {', '.join(str(x) for x in sim['different_photos_top5'])}.",
        "", "Half A sweep (every 4th threshold):", "", "| threshold | P | R | F1 |", "|---:|---:|---:|---:|",
        *[f"| {s['threshold']} | {s['pair_precision']:.3f} | {s['pair_recall']:.3f} | {s['pair_f1']:.3f} |"
          for s in sc["sweep_half_a"]], ""]


def render(r: dict) -> str:
    like = r["like_half_b"]
    lines = [
        "# Near-duplicate photos and search by photo (issue 46, items 5 and 6)", "",
        f"Command: `{r['command']}`  ", f"Host: {r['host']['cpu']} ({', '.join(r['host']['flags'])})  ",
        f"Model: {r['model']} (the shipped default); set: {r['set']['originals']} Flickr8k val photos, each with "
        f"the copies {', '.join(r['set']['copies'])}, and {r['set']['distinct']} distinct val photos "
        f"({r['set']['photos']} photos; see the script's docstring). Originals (with their copies) and distinct "
        "photos split in halves at random: the threshold is picked on half A, every figure is of half B.  ",
        f"Photo reader applies EXIF orientation: **{r['reader_applies_orientation']}**"
        + ("" if r["reader_applies_orientation"] else " -- the rotated copies are read sideways."), "",
        f"Search by photo (`Index.search_like(id, k=5)` over the whole index as built, for the {like['queries']} "
        f"originals of half B): itself first **{like['itself_first']:.3f}**, share of its four copies "
        f"in the first five **{like['copies_in_top5']:.3f}**, "
        f"p50 {like['p50_ms']:.1f} ms per query.", "",
        f"`vlmatch index duplicates` on the whole set as built, at the default threshold {r['default_threshold']} "
        f"(picked here: {r['picked_threshold']}): "
        f"{r['cli']['groups_whole_set']} groups, {r['cli']['seconds']:.1f} s with Python's and the model's loading "
        f"(`{r['cli']['last_line']}`). "
        f"Index build: {r['build_s']:.0f} s ({r['set']['photos'] / r['build_s']:.1f} photos/s, beside other jobs on "
        "the host: not a speed figure, see build_curve.md).",
        "",
        *([f"The pair search alone on {r['scale']['photos']:,} photos (random unit vectors of the same width; its cost "
           f"grows with the square of the number of photos): {r['scale']['seconds']:.1f} s on "
           f"{r['scale']['threads']} thread(s).", ""] if r.get("scale") else [])]
    for name, sc in r["scenarios"].items():
        lines += render_scenario(name, sc)
    return "\n".join(lines)


def main(argv=None):
    argv = sys.argv[1:] if argv is None else argv
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--images", default=str(SHARED / "images"))
    p.add_argument("--originals", type=int, default=200)
    p.add_argument("--distinct", type=int, default=300)
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--scale", type=int, default=20000, help="time the pair search on this many random vectors (0: no)")
    p.add_argument("--rerender", action="store_true")
    a = p.parse_args(argv)
    if a.rerender:
        r = json.loads(RESULTS.with_suffix(".json").read_text())
    else:
        r = run(a, argv)
    write_report(RESULTS, r, render)
    print(render(r))


if __name__ == "__main__":
    main()
