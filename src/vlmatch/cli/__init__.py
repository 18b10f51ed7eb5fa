"""``vlmatch`` command line: train, evaluate, quickstart, data synth, vocab build, features, models."""

from __future__ import annotations

import argparse
import json
import os
import sys
from pathlib import Path

from ..errors import VlmatchError

DATA_HELP = ("a precomp folder, or 'toyworld' for the bundled synthetic data (generated on first use into "
             "$VLMATCH_CACHE/toyworld, default ~/.cache/vlmatch/toyworld)")


def positive_int(text: str) -> int:
    """An argparse type: an integer >= 1 (argparse reports anything else in one line)."""
    try:
        value = int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected an integer >= 1, got {text!r}") from None
    if value < 1:
        raise argparse.ArgumentTypeError(f"expected an integer >= 1, got {value}")
    return value


def checkpoint_arg(text: str):
    """An argparse type: a checkpoint folder, or ``pretrained:NAME`` (a model shipped with vlmatch) resolved to
    its hash-checked folder; an unknown name or a damaged file is one argparse error line."""
    from ..errors import VlmatchError
    from ..models.registry import resolve_checkpoint

    try:
        return str(resolve_checkpoint(text))  # a string, as argparse gives every other path
    except VlmatchError as e:
        raise argparse.ArgumentTypeError(str(e)) from None


def _add_train(sub):
    p = sub.add_parser("train", help="train a model from a YAML config",
                       description="Train a model. Writes config.yaml, metrics.jsonl, best/ and last/ "
                                   "checkpoints into the run folder. Launch with torchrun for DDP.")
    p.add_argument("--config", help="bundled config name (see `vlmatch configs`) or a YAML path")
    p.add_argument("--set", dest="overrides", action="append", default=[], metavar="SECTION.KEY=VALUE",
                   help="override a config value, e.g. --set train.lr=1e-4 (repeatable)")
    p.add_argument("--run-dir", help="output folder (default runs/<config name>)")
    p.add_argument("--resume", metavar="RUN_DIR", help="continue an interrupted run exactly from RUN_DIR/last")
    p.add_argument("--overwrite", action="store_true", help="delete the run already in --run-dir and start afresh "
                                                             "(a fresh run otherwise refuses such a folder)")
    p.add_argument("--no-progress", action="store_true")
    p.set_defaults(func=cmd_train)


def cmd_train(a):
    from ..training.config import load_config
    from ..training.loop import train

    if a.resume:
        if a.overwrite:
            raise VlmatchError("--resume continues a run and --overwrite deletes it: pass one of them")
        run_dir = Path(a.resume)
        cfg = load_config(str(run_dir / "config.yaml"), a.overrides)
    else:
        if not a.config:
            raise VlmatchError("train needs --config (or --resume RUN_DIR)")
        cfg = load_config(a.config, a.overrides)
        run_dir = Path(a.run_dir or Path("runs") / Path(a.config).stem)
    best = train(cfg, run_dir, resume=bool(a.resume), progress=not a.no_progress, overwrite=a.overwrite)
    if int(os.environ.get("RANK", "0")) != 0:  # under torchrun, rank 0 reports
        return
    if best and "rsum" in best:
        from ..evaluation.metrics import format_table

        epoch = f"epoch {best['epoch'] + 1}/{cfg['train']['epochs']}" if "epoch" in best else ""
        print(f"validation ({cfg['data']['val_split']}) of the best-on-validation checkpoint, {epoch}:")
        print(format_table({cfg["model"]["name"]: best}))
    from ..viz.curves import write_curves

    curves = write_curves([run_dir], run_dir / "curves.png")
    print(f"run folder: {run_dir}  (config.yaml, metrics.jsonl; best/ = best on validation, last/ = latest)")
    if curves:
        print(f"curves:     {curves}")
    if (run_dir / "best").is_dir():
        from ..data.precomp import available_splits
        from ..data.resolve import resolve_data

        data = cfg["data"]["path"] or "toyworld"
        split = "test" if "test" in available_splits(resolve_data(data)) else cfg["data"]["val_split"]
        print(f"next:       vlmatch evaluate --checkpoint {run_dir / 'best'} --data {data} --split {split}")


def _add_evaluate(sub):
    p = sub.add_parser("evaluate", help="recall metrics of a model or of saved score matrices",
                       description="Evaluate saved score matrices (--sims, n_images x n_captions .npy) or "
                                   "checkpoints (--checkpoint with --data/--split). Several matrices or "
                                   "checkpoints are averaged into an ensemble. Ties count against the "
                                   "ground truth. Under torchrun (--nproc_per_node=N, --nnodes) every rank "
                                   "scores its share of the image blocks (gloo on CPU, nccl on GPU) and rank 0 "
                                   "evaluates; the matrix is bit-identical to a single process.")
    p.add_argument("--sims", nargs="+", metavar="FILE.npy", help="score matrices (rows images, columns captions)")
    p.add_argument("--checkpoint", nargs="+", metavar="DIR", type=checkpoint_arg,
                   help="model folders (model.safetensors + config.json), or pretrained:NAME")
    p.add_argument("--data", help=f"data for --checkpoint: {DATA_HELP}")
    p.add_argument("--split", default="test", help="split name (default test; COCO 1K/5K use testall)")
    p.add_argument("--protocol", default="single", choices=["single", "coco1k5fold", "coco5k"])
    p.add_argument("--max-images", type=positive_int, help="keep the first N images (e.g. 1000 for SCAN's dev)")
    p.add_argument("--save-sims", metavar="FILE.npy", help="save the (ensembled) score matrix")
    p.add_argument("--json", metavar="PATH", help="write every number as JSON")
    p.add_argument("--device", default="auto")
    p.add_argument("--budget-mb", type=float, default=32.0,
                   help="working memory of one scoring block in MiB (default 32: cache-sized); sets the block shape")
    p.add_argument("--compile", action="store_true",
                   help="run the model's score through torch.compile at one fixed block shape (see README)")
    p.add_argument("--top-k", type=positive_int, metavar="K",
                   help="two-stage: rank every pair by the model's global part (one GEMM), re-score only each "
                        "query's top K with the full score (models with a global part: vsepp, sman, mtfn, mmca); "
                        "one checkpoint, --protocol single")
    p.add_argument("--no-progress", action="store_true")
    p.add_argument("--rerank", action="store_true",
                   help="also report the recalls after cross-modal re-ranking (MTFN-RR, both directions); T2I uses "
                        "S_TT from --text-sims / --text-model, or from the checkpoint's own text-text branch")
    _add_rerank_options(p)
    p.set_defaults(func=cmd_evaluate)


def _add_rerank_options(p) -> None:
    p.add_argument("--k", "--rerank-k", dest="k", type=int, default=None,
                   help="K: candidates re-ranked per query (default 15 for single, 7 for the COCO protocols)")
    p.add_argument("--k-text", type=int, default=5, help="K': caption neighbours by S_TT in T2I re-ranking (default 5)")
    t = p.add_mutually_exclusive_group()
    t.add_argument("--text-sims", metavar="TT.npy", help="caption-caption similarity S_TT (n_captions x n_captions)")
    t.add_argument("--text-model", metavar="DIR",
                   help="S_TT from a model folder: a vlmatch checkpoint with a text-text branch (mtfn after its "
                        "text_text stage) or a local Hugging Face sentence encoder (cosine of mean-pooled vectors); "
                        "needs --data/--split for the captions")
    p.add_argument("--no-text", action="store_true", help="T2I re-ranking without S_TT (the paper's 'w/o S_TT')")


def cmd_evaluate(a):
    import numpy as np

    from .. import distributed as D
    from ..evaluation.metrics import ensemble, evaluate_protocol, format_table, load_sims
    from ..io import check_writable, save_npy, write_json

    if bool(a.sims) == bool(a.checkpoint):
        raise VlmatchError("evaluate needs exactly one of --sims or --checkpoint")
    for out in (a.save_sims, a.json):  # before any work, not after the table
        if out:
            check_writable(out)
    if a.top_k:
        return evaluate_two_stage(a)
    if a.sims:
        if D.world_from_env()[0] != 0:  # under torchrun there is nothing to share: rank 0 does it all
            return
        mats, sources = [load_sims(p) for p in a.sims], list(a.sims)
    else:
        if not a.data:
            raise VlmatchError("--checkpoint needs --data")
        mats, sources = [], list(a.checkpoint)
        for ck in a.checkpoint:  # under torchrun every rank scores its share, rank 0 gets the matrix
            mats.append(checkpoint_scores(ck, a.data, a.split, a.max_images, a.device, not a.no_progress,
                                          budget=int(a.budget_mb * 2**20), compile=a.compile))
        if D.world()[0] != 0:
            D.shutdown()
            return
        D.shutdown()
    sims = mats[0] if len(mats) == 1 else ensemble(mats, sources)
    res = evaluate_protocol(sims, a.protocol, source=sources[0])
    label = sources[0] if len(sources) == 1 else f"ensemble of {len(sources)}"
    print(format_table({label: res}))
    for i, fold in enumerate(res.get("folds", [])):
        print(format_table({f"fold {i}": fold}).splitlines()[-1])
    if a.save_sims:
        with np.errstate(over="ignore"):
            small = sims.astype(np.float32)
        if not np.isfinite(small).all():  # e.g. 1e300 would become inf in float32
            print(f"vlmatch: note: scores beyond the float32 range; {a.save_sims} is saved as float64", file=sys.stderr)
            small = sims.astype(np.float64)
        save_npy(a.save_sims, small)
    extra = {}
    if a.rerank:
        own = a.checkpoint[0] if a.checkpoint and len(a.checkpoint) == 1 and not (a.text_sims or a.text_model) else None
        rr = run_rerank(a, sims, sources[0], own_model=own)
        extra = {"rerank": {k: v for k, v in rr.items() if k != "before"}}
    elif a.text_sims or a.text_model:
        raise VlmatchError("--text-sims / --text-model only apply with --rerank")
    if a.json:
        write_json(a.json, {"sources": sources, **res, **extra})


def evaluate_two_stage(a) -> None:
    """``evaluate --top-k K``: stage 1 by the global embeddings, stage 2 the full score on each query's top K."""
    from ..data.precomp import PrecompSplit
    from ..data.resolve import resolve_data
    from ..evaluation.metrics import format_table
    from ..io import write_json
    from ..training.loop import pick_device, validate

    bad = [f for f, on in (("--sims", a.sims), ("--save-sims", a.save_sims), ("--rerank", a.rerank),
                           ("--compile", a.compile)) if on]
    if bad or a.protocol != "single" or not a.checkpoint or len(a.checkpoint) != 1:
        raise VlmatchError("--top-k needs exactly one --checkpoint and --protocol single" +
                           (f"; it does not combine with {', '.join(bad)}" if bad else ""))
    if not a.data:
        raise VlmatchError("--checkpoint needs --data")
    dev = pick_device(a.device)
    model = load_checkpoint(a.checkpoint[0], dev)
    split = PrecompSplit(resolve_data(a.data), a.split, max_images=a.max_images)
    res = validate(model, split, dev, progress=not a.no_progress, top_k=a.top_k)  # the trainer's two-stage recalls
    print(format_table({f"{a.checkpoint[0]} (top {a.top_k})": res}))
    if a.json:
        write_json(a.json, {"sources": list(a.checkpoint), "top_k": a.top_k, **res})


def run_rerank(a, sims, source, own_model=None) -> dict:
    """Re-rank ``sims`` per the parsed options, print before/after tables, return the record."""
    from ..evaluation.metrics import format_table
    from ..evaluation.rerank import evaluate_reranked, fold_captions

    text_sims, neighbors, text = None, None, "none"
    if not a.no_text and a.k_text > 0:
        if a.text_sims:
            text_sims, text = load_text_sims(a.text_sims, sims.shape[1]), a.text_sims
        elif a.text_model or own_model:
            group = fold_captions(a.protocol, sims.shape[1], sims.shape[0])  # COCO 1K: S_TT within each fold
            neighbors, text = model_neighbors(a.text_model or own_model, a, sims.shape[1], required=bool(a.text_model),
                                              group=group)
    res = evaluate_reranked(sims, a.protocol, k=a.k, k_text=a.k_text, text_sims=text_sims, neighbors=neighbors,
                            source=source, progress=not a.no_progress)
    res["text_source"] = text
    tag = f"RR K={res['k']}" + (f", K'={res['k_text']} ({text})" if res["text"] != "none" else ", w/o S_TT")
    print(format_table({"before": res["before"], tag: res["after"]}))
    return res


def load_text_sims(path, n_captions):
    import numpy as np

    from ..errors import DataError

    try:
        tt = np.load(path, mmap_mode="r", allow_pickle=False)
    except FileNotFoundError:
        raise DataError(path, "caption-caption matrix not found") from None
    except Exception as e:
        raise DataError(path, f"not a readable .npy array: {e}") from None
    if not isinstance(tt, np.ndarray):  # a .npz archive
        raise DataError(path, "a .npz archive, not one .npy caption-caption matrix: save it with numpy.save")
    if tt.shape != (n_captions, n_captions):
        raise DataError(path, f"caption-caption matrix has shape {tt.shape}, expected ({n_captions}, {n_captions}) "
                              "for this score matrix")
    return tt


def _vlmatch_config(folder: Path) -> bool:
    """Whether ``folder/config.json`` is a vlmatch checkpoint's (it names a registered model), not a
    Hugging Face one; an unreadable file is left to the loader that reports it."""
    try:
        cfg = json.loads((folder / "config.json").read_text(encoding="utf-8"))
    except (OSError, ValueError):
        return False
    return isinstance(cfg, dict) and "name" in cfg


def model_neighbors(folder, a, n_captions, required=True, group=None):
    """G(T, K') from a checkpoint's text-text branch or an offline sentence encoder, on --data/--split captions
    (with ``group``, within each group of that many consecutive captions: a COCO 1K fold)."""
    from ..data.precomp import PrecompSplit
    from ..errors import DataError
    from ..evaluation.rerank import model_text_neighbors, sentence_neighbors
    from ..training.loop import data_root, pick_device

    folder = Path(folder)
    if not a.data:
        raise VlmatchError("--text-model needs --data (and --split) for the captions")
    split = PrecompSplit(data_root(a.data), a.split, max_images=a.max_images)
    if len(split.captions) != n_captions:
        raise DataError(split.captions_path, f"{len(split.captions)} captions, the score matrix has {n_captions}")
    dev = pick_device(a.device)
    if (folder / "model.safetensors").is_file() and _vlmatch_config(folder):
        from ..models.registry import load_model

        model = load_model(folder, map_location=dev)
        if not model.has_text_similarity():
            if required:
                raise VlmatchError(f"{folder}: model {model.name} has no text-text similarity (S_TT)")
            return None, "none"
        return model_text_neighbors(model, split, a.k_text, device=dev, progress=not a.no_progress,
                                    group=group), str(folder)
    return sentence_neighbors(folder, split.captions, a.k_text, device=dev, progress=not a.no_progress,
                              group=group), str(folder)


def _add_rerank(sub):
    p = sub.add_parser("rerank", help="cross-modal re-ranking (MTFN-RR) of a saved score matrix",
                       description="Re-rank a score matrix (rows images, columns captions) with MTFN-RR (I2T eq. 8-12, "
                                   "T2I eq. 13-15) and print the recalls before and after, both directions. S_TT comes "
                                   "from --text-sims or --text-model, never from the ground-truth caption grouping.")
    p.add_argument("--sims", required=True, metavar="S.npy")
    _add_rerank_options(p)
    p.add_argument("--protocol", default="single", choices=["single", "coco1k5fold", "coco5k"])
    p.add_argument("--data", help="precomp data folder whose captions --text-model reads")
    p.add_argument("--split", default="test")
    p.add_argument("--max-images", type=int)
    p.add_argument("--device", default="auto")
    p.add_argument("--json", metavar="OUT", help="write the recalls before and after (both directions) as JSON")
    p.add_argument("--no-progress", action="store_true")
    p.set_defaults(func=cmd_rerank)


def cmd_rerank(a):
    from ..evaluation.metrics import load_sims
    from ..io import check_writable, write_json

    if a.json:
        check_writable(a.json)  # before any work, not after the tables
    sims = load_sims(a.sims)
    res = run_rerank(a, sims, a.sims)
    if a.json:
        write_json(a.json, {"sims": a.sims, **res})


def load_checkpoint(checkpoint, device):
    """A model folder for scoring: its weights, and its vocabulary when the model uses one."""
    from ..models.registry import load_model

    model = load_model(checkpoint, map_location=device)
    if model.uses_vocab and model.vocab is None:
        raise VlmatchError(f"{checkpoint}: no vocab.json beside the model")
    return model


def checkpoint_scores(checkpoint, data, split, max_images, device, progress, budget=None, compile=False):
    from .. import distributed as D
    from ..data.precomp import PrecompSplit
    from ..data.resolve import resolve_data
    from ..evaluation.scoring import model_scores
    from ..training.loop import pick_device

    dev = D.setup(pick_device(device))  # joins the process group when launched by torchrun
    model = load_checkpoint(checkpoint, dev)
    sp = PrecompSplit(resolve_data(data), split, max_images=max_images)
    from ..evaluation.scoring import DEFAULT_BUDGET

    return model_scores(model, sp, device=dev, progress=progress, budget=budget or DEFAULT_BUDGET, compile=compile)


def _add_quickstart(sub):
    p = sub.add_parser("quickstart", help="toy world -> train VSE++ and SCAN -> recall table (a few minutes on CPU)",
                       description="Generate the toy world (cached in $VLMATCH_CACHE/toyworld), train each config "
                                   "into RUN_DIR/<config name>, print the test recalls of each run's best-on-"
                                   "validation checkpoint, where everything was written, and what to try next.")
    p.add_argument("--json", metavar="PATH", help="write the results as JSON")
    p.add_argument("--run-dir", default="runs/quickstart", help="parent of the run folders (default runs/quickstart)")
    p.add_argument("--models", nargs="+", default=None, metavar="CONFIG",
                   help="configs to run (default: quickstart_vsepp quickstart_scan)")
    p.add_argument("--set", dest="overrides", action="append", default=[], metavar="SECTION.KEY=VALUE",
                   help="override a value in every config, e.g. --set train.epochs=1 (repeatable)")
    p.add_argument("--no-progress", action="store_true")
    p.set_defaults(func=cmd_quickstart)


def cmd_quickstart(a):
    from ..io import check_writable
    from .quickstart import quickstart

    if a.json:
        check_writable(a.json)  # before minutes of training, not after
    quickstart(a.run_dir, a.json, a.models, a.overrides, progress=not a.no_progress)


def _add_data(sub):
    p = sub.add_parser("data", help="data utilities")
    s = p.add_subparsers(dest="data_cmd", required=True)
    q = s.add_parser("synth", help="write the synthetic toy world in the precomp format")
    q.add_argument("--out", required=True)
    q.add_argument("--seed", type=int, default=0)
    q.add_argument("--train", type=positive_int, default=3000)
    q.add_argument("--dev", type=positive_int, default=1000)
    q.add_argument("--test", type=positive_int, default=1000)
    q.set_defaults(func=cmd_synth)
    c = s.add_parser("check", help="validate a precomp split (shapes, captions, NaN/inf)")
    c.add_argument("--data", required=True, help=DATA_HELP)
    c.add_argument("--split", required=True, help="split name (train, dev, test, ...)")
    c.set_defaults(func=cmd_check)


def cmd_synth(a):
    from ..data.synth import ToyWorld, ToyWorldConfig

    stats = ToyWorld(ToyWorldConfig(seed=a.seed, n_train=a.train, n_dev=a.dev, n_test=a.test)).write(a.out)
    print(json.dumps(stats["splits"], indent=2))


def cmd_check(a):
    from ..data.precomp import PrecompSplit
    from ..data.resolve import resolve_data

    sp = PrecompSplit(resolve_data(a.data), a.split)
    sp.check_all_finite()
    print(json.dumps({"images": sp.n_images, "captions": len(sp.captions), "regions": sp.n_regions,
                      "dim": sp.img_dim, "captions_per_image": sp.per_image}, indent=2))


def _add_vocab(sub):
    p = sub.add_parser("vocab", help="vocabulary utilities")
    s = p.add_subparsers(dest="vocab_cmd", required=True)
    b = s.add_parser("build", help="build a vocabulary (SCAN JSON) from training captions only")
    b.add_argument("--captions", nargs="+", required=True, help="caption files (one caption per line)")
    b.add_argument("--min-count", type=positive_int, default=4)
    b.add_argument("--out", required=True)
    b.set_defaults(func=cmd_vocab)


def cmd_vocab(a):
    from ..data.precomp import read_caption_lines
    from ..data.vocab import Vocab
    from ..io import check_writable

    check_writable(a.out)
    caps = [c for f in a.captions for c in read_caption_lines(f)]
    v = Vocab.build(caps, a.min_count)
    v.save(a.out)
    print(f"{len(v)} words (min count {a.min_count}) from {len(caps)} captions -> {a.out}")


def _add_plot(sub):
    p = sub.add_parser("plot", help="loss and validation recall curves of one run or several (PNG)",
                       description="Draw the training loss, validation rsum and R@1/5/10 (both directions) of "
                                   "one run folder or several side by side into a PNG. x = epochs completed.")
    p.add_argument("runs", nargs="+", metavar="RUN_DIR", help="run folders (with metrics.jsonl)")
    p.add_argument("--out", metavar="FILE.png", help="output PNG (default RUN_DIR/curves.png for one run, "
                                                     "curves.png for several)")
    p.set_defaults(func=cmd_plot)


def cmd_plot(a):
    from ..io import check_writable
    from ..viz.curves import plot_runs

    out = a.out or (Path(a.runs[0]) / "curves.png" if len(a.runs) == 1 else "curves.png")
    check_writable(out)
    print(f"wrote {plot_runs(a.runs, out)}")


def _add_models(sub):
    p = sub.add_parser("models", help="list registered models")
    p.set_defaults(func=cmd_models)
    c = sub.add_parser("configs", help="list bundled configs")
    c.set_defaults(func=cmd_configs)
    t = sub.add_parser("pretrained", help="list the trained models shipped with vlmatch (--model pretrained:NAME)")
    t.add_argument("--json", action="store_true", help="print the registry entries as a JSON list")
    t.set_defaults(func=cmd_pretrained)


def cmd_models(a):
    from ..models.registry import describe_models

    print("\n".join(f"{n:16s} {d}" for n, d in describe_models().items()))


def cmd_pretrained(a):
    import dataclasses
    import json

    from .. import pretrained

    found = pretrained.entries()
    if a.json:
        print(json.dumps([{**dataclasses.asdict(e), "megabytes": round(e.megabytes, 2)} for e in found], indent=1))
        return
    if not found:
        print("no pretrained models are shipped with this installation")
        return
    rows = [("name", "model", "role", "MB", "val rsum", "ms/query", "text encoder", "default")]
    rows += [(e.name, e.model, e.role, f"{e.megabytes:.1f}", f"{e.val_rsum:.1f}",
              "-" if e.ms_per_query is None else f"{e.ms_per_query:.1f}", e.text_encoder, "yes" if e.default else "")
             for e in found]
    widths = [max(len(r[i]) for r in rows) for i in range(len(rows[0]))]
    for r in rows:
        print("  ".join(c.ljust(w) for c, w in zip(r, widths, strict=True)).rstrip())
    print("\nuse one with --model pretrained:NAME, or in Python vlmatch.load_model('pretrained:NAME')")


def cmd_configs(a):
    from ..training.config import describe_configs

    configs = describe_configs()
    width = max(map(len, configs), default=0)
    print("\n".join(f"{name:{width}s}  {desc}" for name, desc in configs.items()))


def _add_serve(sub):
    from .serve import add_parser

    add_parser(sub)


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="vlmatch", description="Image-text matching and cross-modal retrieval.")
    parser.add_argument("--debug", action="store_true", help="show the full traceback of an error (accepted "
                                                             "anywhere on the command line)")
    sub = parser.add_subparsers(dest="command", required=True)
    for add in (_add_quickstart, _add_train, _add_evaluate, _add_rerank, _add_data, _add_vocab, _add_models, _add_plot,
                _add_serve):
        add(sub)
    try:
        from .features import add_parser as add_features
        add_features(sub)
    except ImportError:  # pragma: no cover
        pass
    from ..viz.attention import add_parser as add_explain
    from .search import add_parser as add_search

    add_search(sub)
    add_explain(sub)
    return parser


def main(argv=None) -> int:
    """Run one command. Bad input ends with one error line and exit 2, an unexpected error with one line
    and exit 1, Ctrl-C with exit 130; ``--debug`` (anywhere on the line) shows the traceback instead."""
    argv = list(sys.argv[1:] if argv is None else argv)
    debug = "--debug" in argv
    args = build_parser().parse_args([x for x in argv if x != "--debug"])
    try:
        args.func(args)
    except KeyboardInterrupt:
        if debug:
            raise
        print("vlmatch: interrupted", file=sys.stderr)
        return 130
    except VlmatchError as e:
        if debug:
            raise
        print(f"vlmatch: error: {e}", file=sys.stderr)
        return 2
    except Exception as e:  # not ours (a library's, the system's): still one line, never a traceback
        if debug:
            raise
        first = (str(e).strip().splitlines() or [""])[0]
        print(f"vlmatch: error: {type(e).__name__}: {first} (unexpected; run with --debug for the traceback)",
              file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
