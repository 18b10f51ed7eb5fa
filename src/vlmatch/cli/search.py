"""``vlmatch index build|update`` and ``vlmatch search``."""

from __future__ import annotations

import json

from ..errors import ConfigError, DataError
from ..io import printable
from .common import (
    Phases,
    add_backbone_args,
    add_backend_args,
    check_json_out,
    milvus_location,
    open_index,
    options_from,
    positive_int,
    utf8_text,
    visible_text,
    write_json_out,
)
from .filters import add_filter_args, where_of
from .similar import add_duplicates_parser, add_like_args, like_args, run_like

# search.job.SCORES and search.stage1.KINDS, spelled out so the parser imports no torch or faiss
# (tests/cli/test_cold_start.py keeps them equal)
SCORES = ("model", "mean")
KINDS = ("auto", "flat", "ivf", "hnsw")
DATE_FROM_MTIME = ("date a photo without an EXIF capture time by its file's modification time (else it has no "
                   "date, and a date filter leaves it out)")


def add_parser(sub):
    p = sub.add_parser("index", help="build or update a search index of images (and captions)")
    s = p.add_subparsers(dest="index_cmd", required=True)
    b = s.add_parser("build", help="encode a collection once into an index folder",
                     description="Extract features with the backbone the model was trained on (--images) or read "
                                 "a precomp split (--features, --split), encode every image once, and write the "
                                 "stage-1 vectors (FAISS), the stage-2 encodings (memory-mapped), the id -> path "
                                 "table and a manifest into --out. Re-running an interrupted build resumes it; a "
                                 "build killed at any point leaves the previous index whole. One build or update of "
                                 "a folder at a time. Under torchrun every rank encodes a shard and rank 0 merges them.")
    from .common import checkpoint_arg

    b.add_argument("--model", type=checkpoint_arg,
                   help="checkpoint folder (model.safetensors + config.json) or pretrained:NAME (default: the shipped "
                        "default pair, see `vlmatch pretrained`)")
    b.add_argument("--images", help="folder of images (searched recursively)")
    b.add_argument("--features", help="precomp feature folder ({split}_ims.npy) instead of --images")
    b.add_argument("--split", default="test", help="split of --features (default test)")
    b.add_argument("--captions", help="caption file (one per line) to index for image -> text search")
    b.add_argument("--retriever", type=checkpoint_arg,
                   help="checkpoint of a companion stage-1 model (e.g. VSE++ on the same features), "
                        "needed when the model has no global part")
    b.add_argument("--out", help="index folder: new, empty or an index (rebuilt); outside --images (the folder "
                                 "backend)")
    add_backend_args(b, writing=True)
    b.add_argument("--rebuild", action="store_true",
                   help="encode every photo again where --out already indexes --images with this model (without it "
                        "such a build stops at once and says what `vlmatch index update` would do)")
    b.add_argument("--overwrite", action="store_true",
                   help="build into an --out that holds other files too (they are kept; only an index's own entries "
                        "are replaced)")
    add_backbone_args(b)
    b.add_argument("--score", choices=SCORES,
                   help="stage 2's ranking score: the model's own (default with --model), or the mean of the model's "
                        "and the retriever's (their ensemble; the shipped default pair's choice is in `vlmatch pretrained`)")
    b.add_argument("--dtype", default="float16", choices=["float16", "float32"], help="stage-2 storage precision")
    b.add_argument("--ann", default="auto", choices=list(KINDS),
                   help="stage-1 index: exact inner product (flat), IVF or HNSW; auto = flat up to 50k items, HNSW above")
    b.add_argument("--nlist", type=positive_int, help="IVF lists (default 4 sqrt(n); at most the number of items)")
    _add_encode_args(b)
    fusion = b.add_mutually_exclusive_group()
    fusion.add_argument("--open-vocab", dest="open_vocab", action="store_true", default=None,
                    help="fuse the ranker's score with the zero-shot score of the backbone's ImageNet concepts (default: "
                         "where the model ships with that fusion, as the default does; docs/open-vocabulary.md)")
    fusion.add_argument("--no-open-vocab", dest="open_vocab", action="store_false",
                    help="rank by the model's own score alone")
    b.set_defaults(func=cmd_build)
    u = s.add_parser("update", help="add new and changed images, drop deleted ones (no re-encoding of the rest)")
    u.add_argument("index", nargs="?", help="index folder (or --backend milvus ...)")
    add_backend_args(u, writing=True)
    _add_encode_args(u)
    u.add_argument("--concepts", action="store_true",
                   help="also encode every photo's open-vocabulary concept columns again, with this vlmatch's concept "
                        "lexicon, text encoder and basis (an index whose recorded ones differ is refused until then; "
                        "one backbone pass per photo; the folder backend)")
    u.set_defaults(func=cmd_update)
    add_duplicates_parser(s)

    q = sub.add_parser("search", help="search an index by text (or by image against indexed captions)",
                       description="Stage 1 picks --candidates items by global vectors; stage 2 re-scores them "
                                   "with the model. --candidates >= the index size gives the exhaustive ranking.")
    q.add_argument("index", nargs="?", help="index folder (omit with --backend milvus)")
    q.add_argument("text", nargs="?", help="the query sentence")
    add_backend_args(q)
    q.add_argument("--image", help="an image file: search the indexed captions instead")
    add_like_args(q)
    q.add_argument("-k", type=int, default=10, help="results to show (default 10)")
    q.add_argument("--candidates", type=int, help="stage-1 candidates re-scored by the model (default 100)")
    q.add_argument("--json", metavar="OUT", help="write the results (rank order) as JSON (- for standard output)")
    add_filter_args(q)
    q.set_defaults(func=cmd_search, quick_exit=True)  # read-only: ends without the interpreter's teardown


def _add_encode_args(p) -> None:
    """How ``index build`` and ``index update`` read and encode photos."""
    p.add_argument("--skip-bad", action="store_true", help="skip unreadable images (listed in the manifest)")
    p.add_argument("--batch-size", type=positive_int, default=64)
    p.add_argument("--no-progress", action="store_true")
    p.add_argument("--date-from-mtime", action="store_true", help=DATE_FROM_MTIME)


def check_out_folder(path) -> None:
    """Refuse, before any work, an index folder that cannot be created or written in (tried for real:
    ``os.access`` says yes to root even where the file system says no, e.g. /proc)."""
    import tempfile
    from pathlib import Path

    path = Path(path)
    if path.exists() and not path.is_dir():
        raise DataError(path, "is a file; --out names the index folder")
    made = [p for p in (path, *path.parents) if not p.exists()]
    try:
        path.mkdir(parents=True, exist_ok=True)
        tempfile.TemporaryFile(dir=path).close()
    except OSError as e:
        raise DataError(path, f"cannot be created or written in ({e.strerror or e})") from None
    finally:
        for p in made:  # leave no trace: the build creates what it needs
            try:
                p.rmdir()
            except OSError:
                break


def cmd_build(a):
    from ..search.build import build_index
    from ..search.job import BuildOptions

    if a.model is None:  # the shipped default pair
        if a.retriever is not None:
            raise ConfigError("--retriever without --model: give the model too, or neither for the shipped default pair")
        from ..checkpoints.read import resolve_checkpoint
        from ..pretrained import default_pair, default_score

        model, retriever = default_pair()
        a.score = a.score or default_score()
        print(f"using the shipped default: --model pretrained:{model}"
              + (f" --retriever pretrained:{retriever} --score {a.score}" if retriever else ""))
        a.model = resolve_checkpoint(f"pretrained:{model}")
        a.retriever = resolve_checkpoint(f"pretrained:{retriever}") if retriever else None
    opts = options_from(BuildOptions, a, retriever_ckpt=a.retriever, score=a.score or "model")
    target = milvus_location(a)
    if target is not None:
        if a.out or a.overwrite:
            raise ConfigError("--out and --overwrite are for the folder backend; a Milvus index is --collection NAME")
        a.out = str(target)
    else:
        if not a.out:
            raise ConfigError("index build needs --out FOLDER (or --backend milvus --milvus-uri URI --collection NAME)")
        check_out_folder(a.out)
        if a.images is not None and not a.rebuild:
            from ..search.changes import same_index_plan, update_line

            plan = same_index_plan(a.out, a.images, a.model, a.retriever)
            if plan is not None:
                raise ConfigError(update_line(a.out, plan))
        target = a.out
    m = build_index(target, a.model, opts)
    if m is None:  # a torchrun rank other than 0
        return
    from ..search.report import summary_lines

    print("\n".join(summary_lines(m)))
    print(json.dumps({"index": a.out, "counts": m["counts"], "stage1": m["stage1"],
                      "ann": {k: v["stage1"]["kind"] for k, v in m["collections"].items()}}, indent=2))


def cmd_update(a):
    from ..search.build import update_index
    from ..search.job import UpdateOptions

    target = milvus_location(a)
    if target is not None and a.index:
        raise ConfigError("index update takes an index folder or --backend milvus ..., not both")
    if target is None and not a.index:
        raise ConfigError("index update needs the index folder (or --backend milvus --milvus-uri URI --collection NAME)")
    rep = update_index(target or a.index, options_from(UpdateOptions, a))
    for bad in rep.get("skipped", []):
        print(f"skipped {bad['key']}: {bad['error']}")
    print(json.dumps({k: v for k, v in rep.items() if k != "skipped"}))


NO_MATCH = "no photo matches these filters"


def format_results(results, what: str, where=None) -> str:
    """The result table; a name with a line break, a tab or bytes that are not UTF-8 is shown escaped
    (``\\n``, ``\\xe9``), so every result is one line. Photos show their capture time, camera and place (GPS,
    to about 100 m) in columns when any result records one, or when the search filters on it (``where``)."""
    from ..search.open_vocab import no_match_line

    cols = []  # (heading, width, the cell of a result) for each column shown
    if what == "file":
        def cell(r, name):
            return getattr(r, name, None)

        if any(cell(r, "taken") for r in results) or (where is not None and (where.after or where.before)):
            cols.append(("taken", 16, lambda r: (cell(r, "taken") or "-")[:16].replace("T", " ")))
        if any(cell(r, "camera") for r in results) or (where is not None and where.camera):
            width = min(24, max([6, *(len(cell(r, "camera") or "") for r in results)]))
            cols.append(("camera", width, lambda r: _clip(printable(cell(r, "camera") or "-", controls=True), width)))
        if any(cell(r, "gps") for r in results) or (where is not None and where.near):
            cols.append(("place", 19, lambda r: _place(cell(r, "gps"))))
    # the probability that the photo matches (an index with a relevance scale: docs/open-vocabulary.md)
    rel = any(getattr(r, "relevance", None) is not None for r in results)
    lines = [f"{'rank':>4}  " + (f"{'relevance':>9}  " if rel else "") + f"{'score':>8}  {'stage1':>8}  "
             + "".join(f"{h:<{w}}  " for h, w, _ in cols) + what]
    for r in results:
        name = printable(str(r.path if what == 'file' else r.text), controls=True)
        extra = "".join(f"{f(r):<{w}}  " for _, w, f in cols)
        p = getattr(r, "relevance", None)
        relevance = (f"{p:9.2f}  " if p is not None else f"{'-':>9}  ") if rel else ""
        lines.append(f"{r.rank:>4}  {relevance}{r.score:8.4f}  {r.stage1_score:8.4f}  {extra}{name}")
    line = no_match_line(results) if what == "file" else None
    return "\n".join(lines + ([line] if line else []))


def _clip(text: str, width: int) -> str:
    return text if len(text) <= width else text[:width - 1] + "…"


def _place(gps) -> str:
    """A photo's GPS position as ``lat,lon`` to 3 decimals (about 100 m); ``-`` when it records none."""
    return f"{gps[0]:.3f},{gps[1]:.3f}" if gps else "-"


def stale_reader_note(idx) -> None:
    """One line on stderr when an index of photos was encoded by the photo reader that ignored EXIF
    orientation (its rotated photos are indexed sideways until `index update` encodes them again)."""
    import sys

    from ..features.photo import READER_VERSION

    m = idx.manifest
    if (m.get("source") or {}).get("kind") == "images" and m.get("reader", 1) < READER_VERSION:
        print(f"note: {idx.root} was built by a vlmatch that ignored EXIF orientation (its rotated photos are indexed "
              "sideways): `vlmatch index update` encodes them again", file=sys.stderr)


def cmd_search(a):
    if a.backend == "milvus" and a.text is None and a.index is not None:  # no folder: the one positional is the text
        a.text, a.index = a.index, None
    if a.like is None and (a.text is None) == (a.image is None):
        raise ConfigError("search needs a query text or --image FILE (one of them)")
    if a.text is not None:
        visible_text(utf8_text(a.text, "the query text"), "the query text", "give the words to search for")
    where = where_of(a)
    if where is not None and a.image is not None:
        raise ConfigError("--after/--before/--camera/--under/--near filter photos; --image searches captions")
    like = like_args(a) if a.like is not None else None  # checked before the index is opened
    if a.like is None and a.text_weight is not None:
        raise ConfigError("--text-weight goes with --like (it weighs the text against the photo)")
    check_json_out(a.json)  # before the search, not after the table
    phases = Phases()  # VLMATCH_PROFILE=1: import / load / encode / search times on stderr
    with phases("import"):
        from ..search import index  # noqa: F401 (torch, faiss: timed apart from the load)
    with phases("load"):
        idx = open_index(a, a.index, lean_queries=False)  # one query: the lean forward would cost more than it saves
    stale_reader_note(idx)
    with phases("query"):
        if a.like is not None:
            res, what = run_like(a, idx, like, where), "file"
        elif a.image is not None:
            res, what = idx.search_image(a.image, k=a.k, candidates=a.candidates), "caption"
        else:
            res, what = idx.search(a.text, k=a.k, candidates=a.candidates, where=where), "file"
    t = idx.last_timings  # the query's own split: encoding the query, then the two stages
    enc = t.get("text", t.get("image"))
    if enc is not None:
        phases.times.pop("query")
        phases.add("encode", enc)
        phases.add("search", t.get("stage1", 0.0) + t.get("stage2", 0.0))
    if not res and where is not None:
        print(NO_MATCH)
    else:
        print(format_results(res, what, where))
    note = idx.relevance_note if a.like is None and a.image is None else None  # a text search's results only
    if note:
        print(note)
    if a.json:
        from ..search.open_vocab import no_match_line

        query = {"like": a.like, "text": a.text} if a.like is not None else a.text if a.image is None else {"image": a.image}
        line = no_match_line(res) if what == "file" else None  # when the best photo is unlikely to match
        write_json_out(a.json, {"query": query, "index": a.index or str(idx.root),
                            "candidates": a.candidates, "timings_s": idx.last_timings,
                            **({"where": where.to_dict()} if where is not None else {}),
                            **({"no_match": line} if line else {}),
                            **({"relevance_note": note} if note else {}),
                            "results": [r.to_dict() for r in res]})
    phases.report()
