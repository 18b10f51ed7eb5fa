"""``vlmatch search IDX --like PHOTO|ID ["text"]`` and ``vlmatch index duplicates IDX``."""

from __future__ import annotations

import json
from pathlib import Path

from ..errors import ConfigError
from .common import check_json_out, checked, utf8_text, write_json_out

text_weight = checked(float, lambda v: 0.0 <= v <= 1.0, "expected a number between 0 and 1, got {text}")


# search.library.similar.DEFAULT_TEXT_WEIGHT and search.library.duplicates' defaults, spelled out so the parser imports no torch
# (tests/cli/test_cold_start.py keeps them equal)
DEFAULT_TEXT_WEIGHT = 0.5
DEFAULT_THRESHOLD = 0.68
DEFAULT_NEIGHBOURS = 16


def add_like_args(q) -> None:
    q.add_argument("--like", nargs="+", metavar=("PHOTO|ID", "TEXT"),
                   help="search by photo: the indexed photos most like this one, a file (in or outside the index) or "
                        "an indexed id; with a text (after it, or as the query text), photos like it that also match "
                        "the text")
    q.add_argument("--text-weight", type=text_weight, default=None, metavar="W",
                   help=f"with --like and a text: the text's share of the combined score, 0..1 (default "
                        f"{DEFAULT_TEXT_WEIGHT}; each score is standardised over the candidates first)")


def like_target(like: str):
    """``--like``'s value: a photo file when one exists at that path, else an indexed id (digits)."""
    if Path(like).is_file():
        return like
    if like.strip().isdigit():
        return int(like)
    raise ConfigError(f"--like {like}: neither a photo file nor an indexed id")


def like_args(a):
    """``search --like``'s arguments checked (before the index is opened); returns the photo or id."""
    if a.image is not None:
        raise ConfigError("--like and --image are two different searches: give one of them")
    if len(a.like) > 2:
        raise ConfigError(f"--like takes a photo (or id) and at most one text, not {len(a.like)} values: quote the text")
    if len(a.like) == 2:
        if a.text is not None:
            raise ConfigError("two query texts (one after --like, one before it): give one")
        a.text = utf8_text(a.like[1], "the query text")
    a.like = a.like[0]
    if a.text_weight is not None and a.text is None:
        raise ConfigError("--text-weight weighs the query text against --like: give a query text too")
    return like_target(a.like)


def run_like(a, idx, like, where=None):
    """The results of ``search --like`` (and its text, if given), among the photos ``where`` keeps."""
    return idx.search_like(like, k=a.k, text=a.text, where=where, candidates=a.candidates, text_weight=a.text_weight)


def add_duplicates_parser(s) -> None:
    d = s.add_parser("duplicates", help="groups of near-identical photos (resized, re-encoded, cropped, rotated copies)",
                     description="Every photo's nearest photos by the model's image-image similarity (the cosine of "
                                 "the stage-1 image embeddings); pairs at or above --threshold whose copy signals "
                                 "(stored per photo by the index build) also agree are joined into groups.")
    d.add_argument("index", help="index folder")
    d.add_argument("--threshold", type=float,
                   help="the similarity (cosine of the two photos' image embeddings; above 0, at most 1) at or above "
                        "which two photos whose copy signals agree are copies of one: higher keeps only closer "
                        "copies, lower catches more. Default: the index's model's own threshold, stored with a "
                        "shipped model (chosen on copies against look-alike photos: "
                        "benchmarks/duplicates_copies.py), else "
                        f"{DEFAULT_THRESHOLD}")
    d.add_argument("--similar", action="store_true",
                   help="group by similarity alone (photos of the same kind of scene too), without the copy signal "
                        "that tells a photo's copies from look-alikes")
    d.add_argument("--neighbours", type=int, default=DEFAULT_NEIGHBOURS,
                   help=f"nearest photos looked at per photo (default {DEFAULT_NEIGHBOURS})")
    d.add_argument("--json", metavar="OUT", help="write the groups as JSON (- for standard output)")
    d.set_defaults(func=cmd_duplicates)


def cmd_duplicates(a):
    from ..io import printable
    from ..search.index import Index
    from ..search.library.duplicates import check_threshold, find_duplicates

    if a.threshold is not None:
        check_threshold(a.threshold)
    if a.neighbours < 1:
        raise ConfigError(f"--neighbours must be at least 1, not {a.neighbours}")
    check_json_out(a.json)
    idx = Index.open(a.index, lean_queries=False)
    rep = find_duplicates(idx, a.threshold, a.neighbours, copies=not a.similar)
    if a.threshold is None:
        from ..search.library.duplicates import model_threshold

        rec = model_threshold(idx)[1]
        print(f"threshold {rep['threshold']}: " + (
            f"the model's own (held out: pairwise precision {rec['pair_precision']:.3f}, recall "
            f"{rec['pair_recall']:.3f}); --threshold to choose" if rec else
            "the generic default (the model records none); --threshold to choose"))
    sig = rep["copy_signal"]
    if sig:
        print(f"copies: the copy signals at most {sig['copy_bits']} of 63 bits apart, or {sig['strong_bits']} at any "
              "similarity; near-blank photos only with identical files (--similar: similarity alone)")
    if rep["without_copy_signal"]:
        print(f"{rep['without_copy_signal']} photos have no copy signal (indexed before it): grouped by similarity "
              "alone; build the index again to add it")
    print(f"{'group':>5}  {'photos':>6}  {'lowest':>7}  files")
    for g, group in enumerate(rep["groups"], start=1):
        names = ", ".join(printable(p, controls=True) for p in group["paths"])
        print(f"{g:>5}  {len(group['ids']):>6}  {group['similarity']:7.4f}  {names}")
    n_in = sum(len(g["ids"]) for g in rep["groups"])
    print(f"{len(rep['groups'])} groups, {n_in} of {rep['photos']} photos (threshold {rep['threshold']})")
    if a.json:
        write_json_out(a.json, {"index": a.index, **rep})
    else:
        print(json.dumps({"groups": len(rep["groups"]), "photos_in_groups": n_in, "photos": rep["photos"]}))
