"""Reproduce a run from its recipe: make its data, train, evaluate, calibrate where it says, write its results row.

    python experiments/run.py experiments/recipes/flickr8k/c36_vsepp_lite2_320_lora32.yaml
    python experiments/run.py experiments/recipes/pretrained/vsepp-lite2-320-grounded-f8k.yaml   # then release/ship.py --recipe
    python experiments/run.py --render        # only rewrite experiments/results/flickr8k.md from the rows

Steps, in order: the recipe's data (Flickr8k features extracted once into $VLMATCH_CACHE/flickr8k-<backbone>[-<size>]
from $VLMATCH_DATA/flickr8k, or the toy world generated), training into ``--runs``/<name> (``vlmatch train``'s loop with the
recipe's config: its seed and epochs), the validation of the best checkpoint on the val split (the row's metrics),
``calibration.py --model <name> ...`` where the recipe has ``calibration:``, then the row --
``--results``/<name>.json, the shape experiments/flickr8k.py writes -- and, for Flickr8k rows in the default folder,
the tables of experiments/results/flickr8k.md rendered again from every row.
"""

from __future__ import annotations

import argparse
import subprocess
import sys
import time
from pathlib import Path

import flickr8k

from vlmatch.errors import VlmatchError
from vlmatch.io import write_json, write_text
from vlmatch.training.config import PATHS
from vlmatch_lab.caches import features_dir, runs_dir
from vlmatch_lab.paths import data_root, portable
from vlmatch_lab.recipes import features_of_recipe, read_recipe

HERE = Path(__file__).resolve().parent
ROOT = HERE.parent
RUNS = runs_dir()


def portable_config(cfg: dict) -> dict:
    """The config a row records, its paths from the rooms' roots ($VLMATCH_CACHE/..., $VLMATCH_DATA/...) rather
    than this machine's folders."""
    out = {section: dict(fields) if isinstance(fields, dict) else fields for section, fields in cfg.items()}
    for section, key in PATHS:
        if isinstance(out.get(section, {}).get(key), str):
            out[section][key] = portable(out[section][key])
    return out

def make_data(cfg: dict, rec: dict, shared: Path | None = None) -> None:
    """The folder ``data.path`` names, made if missing: Flickr8k features (from ``shared``, default
    $VLMATCH_DATA/flickr8k), or the recipe's toy world."""
    path = cfg["data"]["path"]
    if rec["data"] == "flickr8k":
        backbone, size = features_of_recipe(rec)
        want = features_dir(size, backbone)
        if Path(path).resolve() != want.resolve():
            raise VlmatchError(f"recipe {rec['name']}: data.path {path} is not the cache of its features "
                               f"({backbone}, {size} px): {portable(str(want))}")
        shared = shared or data_root() / "flickr8k"
        if not (shared / "dataset_flickr8k.json").is_file():
            sys.exit(f"experiments/run.py: {shared / 'dataset_flickr8k.json'} is missing (pass --shared DIR)")
        mirror = (cfg["data"].get("mirror") or 0) > 0  # data.mirror trains on the splits' mirror views too
        flickr8k.ensure_features(shared, size, backbone, **({"mirror": True} if mirror else {}))
    elif rec["data"] == "toyworld" and path != "toyworld":
        from vlmatch.data.synth import ToyWorldConfig, ensure_toyworld

        try:
            world = ToyWorldConfig(**rec.get("world", {}))
        except TypeError as e:
            raise VlmatchError(f"recipe {rec['name']}: recipe.world: {e}") from None
        ensure_toyworld(path, world)


def steps_per_epoch(cfg: dict, rec: dict) -> int:
    """Training steps of one epoch: the train captions over the batch size (capped by max_steps_per_epoch)."""
    from vlmatch.data.resolve import resolve_data

    if rec["data"] == "flickr8k":
        n = flickr8k.TRAIN_CAPTIONS
    else:
        caps = resolve_data(cfg["data"]["path"]) / f"{cfg['data']['train_split']}_caps.txt"
        n = sum(1 for ln in caps.read_text(encoding="utf-8").splitlines() if ln.strip())
    steps = -(-n // cfg["train"]["batch_size"])
    cap = cfg["train"].get("max_steps_per_epoch")
    return min(steps, cap) if cap else steps


def run_recipe(recipe: Path, results: Path, runs: Path = RUNS, shared: Path | None = None,
               progress: bool = True) -> dict:
    """Reproduce ``recipe``: its row, also written to ``results``/<name>.json."""
    from vlmatch.training.loop import train

    cfg, rec = read_recipe(recipe)
    name = rec["name"]
    make_data(cfg, rec, shared)
    run_dir = runs / name
    if run_dir.resolve().parent != runs.resolve():  # replaced whole below: never a folder outside --runs
        raise VlmatchError(f"{recipe}: recipe.name {name!r}: {run_dir} resolves to {run_dir.resolve()}, outside "
                           f"the runs folder {runs}; not replaced")
    best = train(cfg, run_dir, overwrite=True, progress=progress)  # a recipe run again replaces its run folder
    if rec.get("calibration"):
        subprocess.run([sys.executable, str(HERE / "calibration.py"), "--model", name, *rec["calibration"]], check=True)
    shown = recipe.resolve().relative_to(ROOT) if recipe.resolve().is_relative_to(ROOT) else recipe
    row = {"metrics": best, "epochs": cfg["train"]["epochs"],
           "minutes_per_epoch": flickr8k.epoch_minutes(run_dir, steps_per_epoch(cfg, rec)),
           "val_rsum_by_epoch": flickr8k.val_history(run_dir),
           "command": f"python experiments/run.py {shown}", "recipe": str(shown), "config": portable_config(cfg),
           "finished": time.strftime("%Y-%m-%dT%H:%M:%S"), **({"note": rec["note"]} if rec.get("note") else {})}
    write_json(results / f"{name}.json", row)
    if rec["data"] == "flickr8k" and results.resolve() == flickr8k.RUNS.resolve():
        render()
    return row


def render() -> str:
    """experiments/results/flickr8k.md from every row of experiments/results/flickr8k/ (no training, no data)."""
    text = flickr8k.render(flickr8k.load_results())
    write_text(flickr8k.RESULTS / "flickr8k.md", text)
    return text


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("recipes", nargs="*", type=Path, help="recipe files (experiments/recipes/...), run one after another")
    ap.add_argument("--results", type=Path,
                    help="folder of the results rows (default: experiments/results/<data>, e.g. .../flickr8k)")
    ap.add_argument("--runs", type=Path, default=RUNS, help="folder of the run folders (default: $VLMATCH_CACHE/runs)")
    ap.add_argument("--shared", type=Path, help="the Flickr8k folder (images/ + Karpathy JSON; default $VLMATCH_DATA/flickr8k)")
    ap.add_argument("--render", action="store_true", help="rewrite experiments/results/flickr8k.md from its rows")
    ap.add_argument("--no-progress", action="store_true")
    a = ap.parse_args(argv)
    if not a.recipes and not a.render:
        ap.error("name a recipe file (or --render)")
    try:
        for recipe in a.recipes:
            _, rec = read_recipe(recipe)
            results = a.results or HERE / "results" / rec["data"]
            row = run_recipe(recipe, results, a.runs, a.shared, progress=not a.no_progress)
            rsum = row["metrics"].get("rsum", float("nan"))
            print(f"{rec['name']}: val rsum {rsum:.2f} -> {results / (rec['name'] + '.json')}")
    except VlmatchError as e:
        print(f"experiments/run.py: error: {e}", file=sys.stderr)
        return 2
    if a.render:
        print(render())
    return 0


if __name__ == "__main__":
    sys.exit(main())
