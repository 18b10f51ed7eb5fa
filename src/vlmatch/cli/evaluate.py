"""``vlmatch evaluate`` and ``vlmatch rerank``: recalls of checkpoints or saved score matrices, before and after re-ranking."""

from __future__ import annotations

import sys

from ..errors import VlmatchError
from .common import DATA_HELP, check_json_out, checkpoint_arg, positive_int, write_json_out


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
    p.add_argument("--max-images", type=positive_int, help="keep the first N images (e.g. 1000 for SCAN's dev)")
    p.add_argument("--save-sims", metavar="FILE.npy", help="save the (ensembled) score matrix")
    p.add_argument("--json", metavar="PATH", help="write every number as JSON (- for standard output)")
    p.add_argument("--budget-mb", type=float, default=32.0,
                   help="working memory of one scoring block in MiB (default 32: cache-sized); sets the block shape")
    p.add_argument("--compile", action="store_true",
                   help="run the model's score through torch.compile at one fixed block shape (see README)")
    p.add_argument("--top-k", type=positive_int, metavar="K",
                   help="two-stage: rank every pair by the model's global part (one GEMM), re-score only each "
                        "query's top K with the full score (models with a global part: vsepp, sman, mtfn, mmca); "
                        "one checkpoint, --protocol single")
    p.add_argument("--no-calibration", action="store_true",
                   help="score without the query-bank calibration a checkpoint keeps (calibration.safetensors)")
    p.add_argument("--rerank", action="store_true",
                   help="also report the recalls after cross-modal re-ranking (MTFN-RR, both directions); T2I uses "
                        "S_TT from --text-sims / --text-model, or from the checkpoint's own text-text branch")
    _add_shared_options(p)
    p.set_defaults(func=cmd_evaluate)


def _add_shared_options(p) -> None:
    """The options ``evaluate`` and ``rerank`` share."""
    p.add_argument("--protocol", default="single", choices=["single", "coco1k5fold", "coco5k"])
    p.add_argument("--device", default="auto")
    p.add_argument("--no-progress", action="store_true")
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
    from ..evaluation.scoring import checkpoint_scores
    from ..io import check_writable, save_npy

    if bool(a.sims) == bool(a.checkpoint):
        raise VlmatchError("evaluate needs exactly one of --sims or --checkpoint")
    if a.save_sims:  # before any work, not after the table
        check_writable(a.save_sims)
    check_json_out(a.json)
    if a.checkpoint and not a.data:
        raise VlmatchError("--checkpoint needs --data")
    if a.top_k:
        return evaluate_two_stage(a)
    if a.sims:
        if D.world_from_env()[0] != 0:  # under torchrun there is nothing to share: rank 0 does it all
            return
        mats, sources = [load_sims(p) for p in a.sims], list(a.sims)
    else:
        mats, sources = [], list(a.checkpoint)
        for ck in a.checkpoint:  # under torchrun every rank scores its share, rank 0 gets the matrix
            mats.append(checkpoint_scores(ck, a.data, a.split, a.max_images, a.device, not a.no_progress,
                                          budget=int(a.budget_mb * 2**20), compile=a.compile,
                                          calibrated=not a.no_calibration))
        rank = D.world()[0]
        D.shutdown()
        if rank != 0:
            return
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
        write_json_out(a.json, {"sources": sources, **res, **extra})


def evaluate_two_stage(a) -> None:
    """``evaluate --top-k K``: stage 1 by the global embeddings, stage 2 the full score on each query's top K."""
    from ..data.precomp import PrecompSplit
    from ..data.resolve import resolve_data
    from ..distributed import pick_device
    from ..evaluation.metrics import format_table
    from ..evaluation.validate import validate
    from ..models.registry import load_checkpoint

    bad = [f for f, on in (("--sims", a.sims), ("--save-sims", a.save_sims), ("--rerank", a.rerank),
                           ("--compile", a.compile)) if on]
    if bad or a.protocol != "single" or not a.checkpoint or len(a.checkpoint) != 1:
        raise VlmatchError("--top-k needs exactly one --checkpoint and --protocol single" +
                           (f"; it does not combine with {', '.join(bad)}" if bad else ""))
    dev = pick_device(a.device)
    model = load_checkpoint(a.checkpoint[0], map_location=dev)
    if a.no_calibration:
        model.calibration = None
    split = PrecompSplit(resolve_data(a.data), a.split, max_images=a.max_images)
    res = validate(model, split, dev, progress=not a.no_progress, top_k=a.top_k)  # the trainer's two-stage recalls
    print(format_table({f"{a.checkpoint[0]} (top {a.top_k})": res}))
    if a.json:
        write_json_out(a.json, {"sources": list(a.checkpoint), "top_k": a.top_k, **res})


def run_rerank(a, sims, source, own_model=None) -> dict:
    """Re-rank ``sims`` per the parsed options, print before/after tables, return the record."""
    from ..evaluation.metrics import format_table
    from ..evaluation.rerank import evaluate_reranked, fold_captions, load_text_sims, model_neighbors

    text_sims, neighbors, text = None, None, "none"
    if not a.no_text and a.k_text > 0:
        if a.text_sims:
            text_sims, text = load_text_sims(a.text_sims, sims.shape[1]), a.text_sims
        elif a.text_model or own_model:
            group = fold_captions(a.protocol, sims.shape[1], sims.shape[0])  # COCO 1K: S_TT within each fold
            if not a.data:
                raise VlmatchError("--text-model needs --data (and --split) for the captions")
            neighbors, text = model_neighbors(a.text_model or own_model, a.data, a.split, sims.shape[1], a.k_text,
                                              max_images=a.max_images, device=a.device, required=bool(a.text_model),
                                              group=group, progress=not a.no_progress)
    res = evaluate_reranked(sims, a.protocol, k=a.k, k_text=a.k_text, text_sims=text_sims, neighbors=neighbors,
                            source=source, progress=not a.no_progress)
    res["text_source"] = text
    tag = f"RR K={res['k']}" + (f", K'={res['k_text']} ({text})" if res["text"] != "none" else ", w/o S_TT")
    print(format_table({"before": res["before"], tag: res["after"]}))
    return res


def _add_rerank(sub):
    p = sub.add_parser("rerank", help="cross-modal re-ranking (MTFN-RR) of a saved score matrix",
                       description="Re-rank a score matrix (rows images, columns captions) with MTFN-RR (I2T eq. 8-12, "
                                   "T2I eq. 13-15) and print the recalls before and after, both directions. S_TT comes "
                                   "from --text-sims or --text-model, never from the ground-truth caption grouping.")
    p.add_argument("--sims", required=True, metavar="S.npy")
    _add_shared_options(p)
    p.add_argument("--data", help="precomp data folder whose captions --text-model reads")
    p.add_argument("--split", default="test")
    p.add_argument("--max-images", type=int)
    p.add_argument("--json", metavar="OUT",
                   help="write the recalls before and after (both directions) as JSON (- for standard output)")
    p.set_defaults(func=cmd_rerank)


def cmd_rerank(a):
    from ..evaluation.metrics import load_sims

    check_json_out(a.json)  # before any work, not after the tables
    sims = load_sims(a.sims)
    res = run_rerank(a, sims, a.sims)
    if a.json:
        write_json_out(a.json, {"sims": a.sims, **res})


def add_parser(sub):
    _add_evaluate(sub)
    _add_rerank(sub)
