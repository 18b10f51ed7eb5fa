"""``vlmatch explain``: a heat map of which image parts each word of a caption attends to."""

from __future__ import annotations

from ..errors import ConfigError, DataError
from .common import (
    Phases,
    add_backbone_args,
    add_backend_args,
    check_json_out,
    checkpoint_arg,
    milvus_location,
    open_index,
    utf8_text,
    visible_text,
    write_json_out,
)

# evaluation.explainers.METHODS, spelled out so the parser imports no torch (tests/cli/test_cold_start.py keeps
# the two equal)
METHODS = ("attention", "contribution", "gradient", "occlusion")


def add_parser(sub):
    p = sub.add_parser("explain", help="heat map of which image parts each word of a caption attends to",
                       description="Extract the image's features with the backbone the model was trained on, take "
                                   "the model's maps for this one pair and draw one panel per word, each on its own "
                                   "colour scale (--shared-scale: one for all), in each cell's share of the word's "
                                   "part; prints the score `vlmatch search` shows for the pair, split into the "
                                   "ranking model's part (the maps) and the concept part (a number).")
    p.add_argument("--model", type=checkpoint_arg,
                   help="checkpoint folder of an attention model, or pretrained:NAME (default: the shipped default "
                        "re-scorer, see `vlmatch pretrained`)")
    p.add_argument("--image", help="image file (or --id of an indexed photo)")
    p.add_argument("--id", type=int, help="an indexed photo's id: its stored encoding and the index's model, from "
                                          "--index DIR or --backend milvus --milvus-uri URI --collection NAME")
    p.add_argument("--index", help="index folder (with --id)")
    p.add_argument("--text", required=True, help="the caption")
    p.add_argument("--out", required=True, help="PNG to write")
    p.add_argument("--json", metavar="OUT", help="also write the raw weights as JSON (- for standard output)")
    p.add_argument("--method", choices=METHODS,
                   help="how the maps are made: attention (the model's own weights), contribution (the exact share of "
                        "each position in the score), gradient (gradient x input), occlusion (score drop with each "
                        "position masked); default: the shipped explainer's method, else the model's best")
    p.add_argument("--phrase", action="append", default=[], metavar="TEXT",
                   help="also a map for this phrase (repeatable): with attention/contribution a part of the caption "
                        "(its tokens summed), with gradient/occlusion scored as its own query")
    add_backbone_args(p)
    p.add_argument("--boxes", metavar="FILE.npy", help="(k, 4) region boxes x1 y1 x2 y2 in image pixels "
                                                      "(region features); default: the backbone's grid")
    p.add_argument("--all-words", action="store_true",
                   help="also draw the function words (a, the, on, is ...); by default the PNG shows the content words "
                        "(special tokens such as [CLS] never; --json keeps every token)")
    p.add_argument("--shared-scale", action="store_true",
                   help="draw every word on one colour scale, so panels compare (default: each word on its own scale, "
                        "so a word with a small part is readable too)")
    add_mirror_arg(p)
    add_backend_args(p)
    p.set_defaults(func=cmd_explain, quick_exit=True)  # ends without the interpreter's teardown (cli.quick_exit)


def cmd_explain(a):
    phases = Phases()  # VLMATCH_PROFILE=1: import / load / explain / render times on stderr
    with phases("import"):
        from pathlib import Path

        import numpy as np
        import torch

        from ..evaluation.explainers import default_method
        from ..features.backbones import backbone_for
        from ..features.photo import load_image
        from ..features.provenance import check_backbone, checkpoint_backbone, resolve_backbone
        from ..features.views import mirror_pixels
        from ..io import check_writable
        from ..models.registry import load_model
        from ..viz.attention import explain_pair
        from ..viz.heatmap import render  # noqa: F401 (matplotlib: timed with the imports, not the render)

    visible_text(utf8_text(a.text, "--text"), "--text")
    check_writable(a.out)  # before any work, not after it
    check_json_out(a.json)
    if a.id is not None:
        return explain_indexed(a, phases)
    if a.index or milvus_location(a) is not None:
        raise ConfigError("--index / --backend milvus go with --id (an indexed photo); --image explains any file")
    if a.image is None:
        raise ConfigError("explain needs --image FILE, or --id ID of an indexed photo")
    boxes = None
    if a.boxes is not None:
        try:
            boxes = np.load(a.boxes, allow_pickle=False)
        except (OSError, ValueError, EOFError) as e:
            raise DataError(a.boxes, f"not a readable .npy array ({type(e).__name__})") from None
    default_explainer(a)
    with phases("load"):
        model = load_model(a.model)
        method = a.method or default_method(model)
        bb = backbone_for(resolve_backbone(a.model, a.backbone), a.weights)
        check_backbone(checkpoint_backbone(a.model), bb.describe(), model.cfg.img_dim, a.model)
    mirror = recorded_mirror(a.model) if a.mirror is None else a.mirror
    with phases("encode"), torch.inference_mode():
        pixels = load_image(Path(a.image), bb.info.input_size)
        views = bb(bb.preprocess([pixels, mirror_pixels(pixels)] if mirror else [pixels])).numpy()
    with phases("explain"):
        att = explain_pair(model, views[0], a.text, method, a.phrase, mirror_features=views[1] if mirror else None)
        search_parts(att, a.model, model, views[0], a.text)
    att.grid, att.image = bb.info.grid, str(a.image)
    _finish(a, att, model, method, phases, record={"model": str(a.model)}, boxes=boxes)


def say_text(att, model, text: str, all_words: bool) -> None:
    """Before a PNG is written: refuse a text the model read none of (only unknown tokens: nothing to draw), and say
    in one line each where the model cut the text short and which words no installed font can draw."""
    import sys

    from ..io import printable
    from ..viz.attention import truncation
    from ..viz.fonts import undrawable
    from ..viz.words import is_special, shown_columns

    shown = shown_columns(att.words, all_words)
    if not shown:
        unknown = sorted({w for w in att.words if is_special(w)} - {"[CLS]", "[SEP]", "<start>", "<end>"})
        raise ConfigError(f"--text {printable(text[:40], controls=True)!r}: the model reads none of its words (its "
                          f"tokenizer made only {', '.join(unknown) or 'special tokens'} of it): nothing to draw; give "
                          "the words in the language it was trained on (English)")
    cut = truncation(model, text) if model is not None else None
    if cut is not None:
        last = next((w for w in reversed(att.words) if not is_special(w)), "")
        print(f"vlmatch: note: --text is {cut[0]} tokens; the model reads its first {cut[1]} (up to {last!r}), the "
              "rest is neither scored nor drawn", file=sys.stderr)
    missing = undrawable([att.words[j] for j in shown])
    if missing:
        print(f"vlmatch: note: no installed font draws {len(missing)} word(s) "
              f"({', '.join(repr(w) for w in missing[:5])}{' ...' if len(missing) > 5 else ''}): their panels are "
              "labelled by code point (U+XXXX); install a font that has them (e.g. Noto Sans CJK) to see the words",
              file=sys.stderr)


def search_parts(att, checkpoint, model, features, text: str) -> None:
    """Give ``att`` the score an index of ``checkpoint`` would show for this photo and text, split into its parts
    (:mod:`vlmatch.search.explained`) where the model ships with an open-vocabulary fusion."""
    from ..features.provenance import checkpoint_backbone
    from ..search.explained import photo_parts, shows_line
    from ..search.open_vocab import OpenVocab

    open_vocab = OpenVocab.for_model(checkpoint, checkpoint_backbone(checkpoint))
    if open_vocab is None or not model.score_is_global():
        return
    att.parts = photo_parts(model, open_vocab, features, text)
    att.shows = shows_line(att)


def _finish(a, att, model, method: str, phases, *, record: dict, boxes=None) -> None:
    """Draw ``att`` into the PNG (and ``--json``: ``record``, the text and the maps), then print the score search
    shows for the pair (and how the maps split it)."""
    from ..viz.heatmap import render
    from ..viz.words import shown_columns

    say_text(att, model, a.text, a.all_words)
    with phases("render"):
        render(att, att.image, a.out, boxes=boxes, all_words=a.all_words, shared_scale=a.shared_scale)
    if a.json:
        write_json_out(a.json, {**record, "text": a.text, **att.to_dict()})
    n = len(shown_columns(att.words, a.all_words))
    mirrored = " (each map the mean of the photo's and its mirror image's)" if att.mirror_score is not None else ""
    head = f"{a.out}: {n}{'' if a.all_words else ' content-word'} {method} maps, score {att.shown_score:.4f}{mirrored}"
    print(f"{head}; {att.shows}" if att.shows else head)
    phases.report()


def explain_indexed(a, phases=None):
    """The heat map of indexed photo ``--id`` from its stored encoding (a folder index or a Milvus one)."""
    if a.image is not None or a.model is not None or a.boxes is not None:
        raise ConfigError("--id explains an indexed photo with the index's own model: drop --image, --model and --boxes")
    phases = phases or Phases()
    with phases("load"):
        idx = open_index(a, a.index, lean_queries=False)
    with phases("explain"):
        att = idx.explain(a.id, a.text, a.method, tuple(a.phrase), mirror=a.mirror)
    if not att.grid:
        raise ConfigError(f"{idx.root}: no image grid is known (built from features without a backbone)")
    _finish(a, att, getattr(idx, "model", None), att.method, phases, record={"index": str(idx.root), "id": a.id})


def default_explainer(a) -> None:
    """Without ``--model``: the shipped default explainer's checkpoint folder and method (unless ``--method`` is
    given) into ``a``, said in one line (the registry entry marked as it, else the default re-scorer)."""
    from ..checkpoints.read import resolve_checkpoint
    from ..pretrained import default_explainer as shipped

    if a.model is not None:
        return
    name, method = shipped()
    a.model, a.method = resolve_checkpoint(f"pretrained:{name}"), a.method or method
    mirror = " --mirror" if recorded_mirror(a.model) else ""
    print(f"using the shipped default explainer: --model pretrained:{name} --method {method}{mirror}")


def recorded_mirror(checkpoint) -> bool:
    """The default of ``--mirror``: whether a shipped model's explainer record says its maps are the mean over the
    photo and its mirror image (False for any other checkpoint)."""
    from ..pretrained import explainer_record

    return bool((explainer_record(checkpoint) or {}).get("mirror"))


def add_mirror_arg(p) -> None:
    import argparse

    p.add_argument("--mirror", action=argparse.BooleanOptionalAction, default=None,
                   help="average each map with the map of the photo's mirror image, mirrored back (one more backbone "
                        "pass; a text naming left or right keeps the photo's alone); default: on where the model's "
                        "shipped explainer record says so (the default explainer's), else off")
