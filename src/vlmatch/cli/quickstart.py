"""``vlmatch quickstart``: generate the toy world, train VSE++ and SCAN briefly, print their test recalls (each run's
``best/`` checkpoint), where everything was written and the next commands to try.
"""

from __future__ import annotations

import shlex
import time
from pathlib import Path

from .common import check_json_out, write_json_out

DEFAULT_MODELS = ("quickstart_vsepp", "quickstart_scan")


def add_parser(sub):
    p = sub.add_parser("quickstart", help="toy world -> train VSE++ and SCAN -> recall table (a few minutes on CPU)",
                       description="Generate the toy world (cached in $VLMATCH_CACHE/toyworld), train each config "
                                   "into RUN_DIR/<config name>, print the test recalls of each run's best-on-"
                                   "validation checkpoint, where everything was written, and what to try next.")
    p.add_argument("--json", metavar="PATH", help="write the results as JSON (- for standard output)")
    p.add_argument("--run-dir", default="runs/quickstart", help="parent of the run folders (default runs/quickstart)")
    p.add_argument("--models", nargs="+", default=None, metavar="CONFIG",
                   help="configs to run (default: quickstart_vsepp quickstart_scan)")
    p.add_argument("--set", dest="overrides", action="append", default=[], metavar="SECTION.KEY=VALUE",
                   help="override a value in every config, e.g. --set train.epochs=1 (repeatable)")
    p.add_argument("--no-progress", action="store_true")
    p.set_defaults(func=cmd_quickstart)


def cmd_quickstart(a):
    check_json_out(a.json)  # before minutes of training, not after
    quickstart(a.run_dir, a.json, a.models, a.overrides, progress=not a.no_progress)



def quickstart(run_dir="runs/quickstart", json_path=None, configs=None, overrides=(), progress=True) -> dict:
    """Train each config into ``run_dir/<config name>``; returns test metrics by model name. ``overrides``
    (``section.key=value``) apply to every config."""
    from ..data.precomp import PrecompSplit
    from ..data.resolve import TOYWORLD, resolve_data
    from ..evaluation.metrics import evaluate_protocol, format_table
    from ..evaluation.scoring import model_scores
    from ..models.registry import load_model
    from ..training.config import load_config
    from ..training.loop import train

    configs = list(configs or DEFAULT_MODELS)
    results, timings, runs, data_paths = {}, {}, {}, set()
    for name in configs:
        cfg = load_config(name, list(overrides))
        out = Path(run_dir) / Path(name).stem
        print(f"== training {cfg['model']['name']} ({name}) for {cfg['train']['epochs']} epochs -> {out}")
        t0 = time.time()
        train(cfg, out, overwrite=True, progress=progress)  # the demo's own folders: a rerun starts afresh
        timings[name] = time.time() - t0
        model = load_model(out / "best")
        test = PrecompSplit(resolve_data(cfg["data"]["path"]), "test")
        data_paths.add(cfg["data"]["path"] or TOYWORLD)
        sims = model_scores(model, test, progress=progress)
        results[cfg["model"]["name"]] = evaluate_protocol(sims, "single", source=test.captions_path)
        runs[cfg["model"]["name"]] = out
    print(f"\ntest split ({test.n_images} images, {len(test.captions)} captions), "
          f"each model's best-on-validation checkpoint (<run>/best):")
    print(format_table(results))
    print("training wall time: " + ", ".join(f"{k} {v:.0f}s" for k, v in timings.items()))
    if json_path:
        write_json_out(json_path, {"data": "toyworld/test", "results": results, "train_seconds": timings,
                               "runs": {k: str(v) for k, v in runs.items()}})
    from ..viz.curves import write_curves

    curves = write_curves(list(runs.values()), Path(run_dir) / "curves.png")
    print(where_and_next(runs, data_paths, curves, json_path))
    return results


def where_and_next(runs: dict, data_paths: set, curves, json_path) -> str:
    """The closing lines: where everything was written, and commands to try next."""
    from ..data.resolve import TOYWORLD, toyworld_dir

    q = shlex.quote
    lines = ["", "Where everything is:"]
    for name, out in runs.items():
        lines.append(f"  {name:14s} run folder {out}  (config.yaml, metrics.jsonl, best/, last/)")
        lines.append(f"  {'':14s} checkpoint {out / 'best'}  (best on validation; last/ = end of training)")
    if TOYWORLD in data_paths:
        lines.append(f"  toy world      {toyworld_dir()}  (set VLMATCH_CACHE to move it; `--data toyworld` finds it)")
    if curves:
        lines.append(f"  curves         {curves}  (loss and validation recalls per epoch)")
    if json_path:
        lines.append(f"  results JSON   {json_path}")
    out = list(runs.values())[-1]
    data = next(iter(sorted(data_paths)))
    lines += ["", "Next commands to try:",
              f"  vlmatch evaluate --checkpoint {q(str(out / 'best'))} --data {q(data)} --split test",
              f"  vlmatch plot {' '.join(q(str(o)) for o in runs.values())} --out curves.png",
              f"  vlmatch data check --data {q(data)} --split test",
              "  vlmatch explain --help    # which image regions each word of a caption attended to",
              "  vlmatch index --help      # index your own images for search",
              "  vlmatch search --help     # search an index by sentence",
              "  vlmatch configs    # bundled configs, e.g. for Flickr30K / COCO / Flickr8k"]
    return "\n".join(lines)
