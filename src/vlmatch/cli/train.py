"""``vlmatch train``."""

from __future__ import annotations

import os
from pathlib import Path

from ..errors import VlmatchError


def add_parser(sub):
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
        if a.config:  # the run's own config.yaml is what it continues with
            raise VlmatchError(f"--resume {a.resume} continues the run with its own config ({Path(a.resume) / 'config.yaml'}); "
                               f"--config {a.config} would train another: drop --config (--set may change the options "
                               "that do not alter the run), or start a new run with --run-dir")
        run_dir = Path(a.resume)
        if a.run_dir and Path(a.run_dir).resolve() != run_dir.resolve():
            raise VlmatchError(f"--resume {a.resume} continues the run in {a.resume} itself; --run-dir {a.run_dir} names "
                               "another folder: drop --run-dir (a resumed run never moves), or start a new run there "
                               "with --config")
        if not (run_dir / "config.yaml").is_file():  # not the bundled-config lookup's message
            what = "no such run folder" if not run_dir.is_dir() else "no config.yaml in it (not a run vlmatch train began)"
            raise VlmatchError(f"--resume {run_dir}: {what}; start a run there with `vlmatch train --config CONFIG "
                               f"--run-dir {run_dir}`")
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
