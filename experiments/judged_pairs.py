"""Query–photo pairs judged by people, on Flickr8k val: the sample and the contact sheets its readers judge.

    python experiments/judged_pairs.py sample --index VAL_INDEX     # pairs.json: queries x photos across the score range
    python experiments/judged_pairs.py sheets --out SHEETS_DIR       # one contact sheet (PNG) per query, for the readers

The protocol (docs/relevance.md): each query is a Flickr8k val caption (one of a random val photo's five) or an
everyday query (experiments/judgments/everyday.txt); its photos are picked from its ranking over the 1,000 val photos
by the shipped default (``Index.search_many`` on an index of the val JPEGs, the score the search shows): ranks 1, 2,
4, 10 and 30 and one at random from ranks 100-1,000, so that the pairs span the whole score range. A sheet shows the
query and its six photos in a shuffled order, labelled A-F, with no score or rank. Each reader judges every pair of
the sheets given to them on Hodosh et al.'s four-point scale (JAIR 2013): 4 the query describes the photo without
errors, 3 with minor errors, 2 it describes some aspects of it, 1 it is unrelated. A match is a rating of 3 or 4.
The judgments are committed as data (experiments/judgments/); ``experiments/relevance_fit.py`` fits the relevance on
them. The test split is never read.
"""

from __future__ import annotations

import argparse
import json
import random
import sys
import textwrap
from pathlib import Path

HERE = Path(__file__).resolve().parent
JUDGMENTS = HERE / "judgments"
PAIRS = JUDGMENTS / "pairs.json"
RANKS = (1, 2, 4, 10, 30)  # and one photo at random from ranks RANDOM_FROM..1,000
RANDOM_FROM = 100
N_CAPTIONS = 150
SEED = 66
LABELS = "ABCDEF"


def val_images(data: Path) -> list[dict]:
    """The val split's photos in dataset order: file name and its five captions."""
    d = json.loads((data / "flickr8k" / "dataset_flickr8k.json").read_text())
    return [{"file": im["filename"], "captions": [s["raw"] for s in im["sentences"]]}
            for im in d["images"] if im["split"] == "val"]


def queries(val: list[dict], rng: random.Random) -> list[dict]:
    """N_CAPTIONS val captions (one caption each of as many distinct random photos) and the everyday queries."""
    out = []
    for i in sorted(rng.sample(range(len(val)), N_CAPTIONS)):
        c = rng.randrange(len(val[i]["captions"]))
        out.append({"text": val[i]["captions"][c].strip(), "kind": "val caption", "own": val[i]["file"]})
    for line in (JUDGMENTS / "everyday.txt").read_text().splitlines():
        if line.strip():
            out.append({"text": line.strip(), "kind": "everyday", "own": None})
    return out


def sample(a) -> None:
    from vlmatch.search import Index
    from vlmatch_lab.paths import data_root

    rng = random.Random(SEED)
    val = val_images(data_root())
    qs = queries(val, rng)
    index = Index.open(a.index)
    n = len(val)
    hits = index.search_many([q["text"] for q in qs], k=n, candidates=n)
    pairs = []
    for qi, (q, hs) in enumerate(zip(qs, hits, strict=True)):
        if len(hs) != n:
            sys.exit(f"{a.index}: the index holds {len(hs)} photos, not the {n} val photos")
        picks = [r - 1 for r in RANKS] + [rng.randrange(RANDOM_FROM - 1, n)]
        chosen = [(r + 1, hs[r]) for r in picks]
        order = list(range(len(chosen)))
        rng.shuffle(order)  # the sheet's order: no rank to read from a position
        for label, j in zip(LABELS, order, strict=True):
            rank, h = chosen[j]
            pairs.append({"pair": f"q{qi:03d}{label}", "query": qi, "text": q["text"], "kind": q["kind"],
                          "photo": Path(h.path).name, "rank": rank, "score": round(float(h.score), 5),
                          "own": q["own"] == Path(h.path).name})
    out = {"protocol": __doc__.split("\n\n", 2)[2].strip(), "seed": SEED, "ranks": list(RANKS),
           "random_from": RANDOM_FROM, "model": index.manifest.get("model", {}).get("name")
           if isinstance(index.manifest.get("model"), dict) else index.manifest.get("model"),
           "queries": [q["text"] for q in qs], "pairs": pairs}
    from vlmatch.io import write_json

    write_json(PAIRS, out)
    print(f"{len(pairs)} pairs over {len(qs)} queries -> {PAIRS}")


def sheets(a) -> None:
    from PIL import Image, ImageDraw, ImageFont

    from vlmatch_lab.paths import data_root

    images = data_root() / "flickr8k" / "images"
    d = json.loads(PAIRS.read_text())
    out = Path(a.out)
    out.mkdir(parents=True, exist_ok=True)
    cell, pad, head = 336, 8, 60  # the val JPEGs here are 224 x 224: drawn at 1.5x
    try:
        font = ImageFont.truetype("DejaVuSans.ttf", 22)
        big = ImageFont.truetype("DejaVuSans-Bold.ttf", 34)
    except OSError:
        font = big = ImageFont.load_default()
    by_query: dict[int, list[dict]] = {}
    for p in d["pairs"]:
        by_query.setdefault(p["query"], []).append(p)
    for qi, ps in by_query.items():
        W, H = 3 * cell + 4 * pad, head + 2 * cell + 3 * pad
        sheet = Image.new("RGB", (W, H), "white")
        draw = ImageDraw.Draw(sheet)
        text = textwrap.wrap(f"q{qi:03d}: {ps[0]['text']}", 80)  # a long caption on two lines, never cut
        draw.multiline_text((pad, 4 if len(text) > 1 else 16), "\n".join(text[:2]), fill="black", font=font)
        for k, p in enumerate(ps):
            im = Image.open(images / p["photo"]).convert("RGB")
            im = im.resize((cell, round(cell * im.height / im.width)), Image.Resampling.LANCZOS)
            x, y = pad + (k % 3) * (cell + pad), head + (k // 3) * (cell + pad)
            sheet.paste(im, (x, y))
            label = p["pair"][-1]
            draw.rectangle((x, y, x + 40, y + 42), fill="yellow")
            draw.text((x + 8, y + 2), label, fill="black", font=big)
        sheet.save(out / f"q{qi:03d}.png")
    print(f"{len(by_query)} sheets -> {out}")


def main(argv=None) -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    sub = p.add_subparsers(dest="cmd", required=True)
    s = sub.add_parser("sample", help="pick the pairs from an index of the val photos")
    s.add_argument("--index", required=True, help="an index of the 1,000 val JPEGs built with the shipped default")
    t = sub.add_parser("sheets", help="one contact sheet per query")
    t.add_argument("--out", required=True)
    a = p.parse_args(argv)
    {"sample": sample, "sheets": sheets}[a.cmd](a)


if __name__ == "__main__":
    main()
