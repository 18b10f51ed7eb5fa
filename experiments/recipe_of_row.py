"""The recipe of a recorded run (a row of experiments/results/flickr8k/) and of a shipped model (an entry of
src/vlmatch/pretrained/registry.json), written from what the row records: its whole config, its features, its note.

    python experiments/recipe_of_row.py                 # a recipe for every trained row and shipped model lacking one
    python experiments/recipe_of_row.py c36_vsepp_lite2_320_lora32 --force   # write this row's recipe again

experiments/flickr8k.py writes the recipe of each run it records; this is for the rows recorded before it did.
Paths are written from the rooms' roots (vlmatch_lab.paths), which the runner fills with this machine's folders: the
feature cache and run folders as $VLMATCH_CACHE/..., the Flickr30k Entities boxes as $VLMATCH_DATA/flickr30k_entities.
"""

from __future__ import annotations

import argparse
import copy
import json
import sys
from pathlib import Path

import yaml

from vlmatch_lab.paths import CACHE_VAR, DATA_VAR, portable

HERE = Path(__file__).resolve().parent
ROWS = HERE / "results" / "flickr8k"
RECIPES = HERE / "recipes"
CACHE = f"${CACHE_VAR}"  # the rooms' one cache, wherever this machine keeps it
ENTITIES = f"${DATA_VAR}/flickr30k_entities"


def trained(row: dict) -> bool:
    """A row that training made (not an ensemble of trained runs, not a re-ranking of one)."""
    return "config" in row and "ensemble_of" not in row and "rerank" not in row


def features(data_path: str) -> dict:
    """{backbone, input_size} from a feature cache's folder name (flickr8k-<backbone>[-<size>]; 224 px if none)."""
    folder = Path(data_path).name.removeprefix("flickr8k-")
    backbone, _, size = folder.rpartition("-")
    if not size.isdigit():
        backbone, size = folder, "224"
    return {"backbone": backbone, "input_size": int(size)}


def recipe_of_row(name: str, row: dict) -> dict:
    """The recipe (a mapping: recipe section first, then the config) of trained row ``name``."""
    cfg = copy.deepcopy(row["config"])
    data = cfg["data"]
    feats = features(data["path"])
    data["path"] = f"{CACHE}/{Path(data['path']).name}"
    if data.get("entities"):
        data["entities"] = ENTITIES
    if cfg["train"].get("init_from"):
        cfg["train"]["init_from"] = portable(cfg["train"]["init_from"])  # a path recorded on one machine, read on another
    note = row.get("note", "")
    if row.get("stopped_after_epoch"):
        note += f"{' ' if note else ''}(recorded: stopped by hand after {row['stopped_after_epoch']} epochs)"
    rec = {"name": name, "data": "flickr8k", "features": feats}
    if row.get("command"):
        rec["recorded"] = row["command"]
    if note:
        rec["note"] = note
    return {"recipe": rec, "model": cfg["model"], "data": data, "train": cfg["train"]}


def recipe_of_entry(entry, rows: dict[str, dict]) -> dict:
    """The recipe of shipped model ``entry``: its run's recipe, the calibration it ships with, its ship options."""
    run = next((n for n, r in rows.items() if r.get("command") == entry.command), None)
    if run is None and "--name " in entry.command:  # a row recorded with a flag the entry's command left out
        run = entry.command.split("--name ", 1)[1].split()[0]
        run = run if run in rows else None
    if run is None:
        raise SystemExit(f"experiments/recipe_of_row.py: no row of {ROWS} records the command of {entry.name}")
    out = recipe_of_row(run, rows[run])
    if entry.calibration:
        cal = [portable(x) for x in entry.calibration["command"].split("--model ", 1)[1].split()[1:]]
        out["recipe"]["calibration"] = cal
    ship = {"name": entry.name, "role": entry.role, "default": entry.default, "pair_score": entry.pair_score}
    if entry.explainer:
        ship |= {"explainer": entry.explainer["row"], "default_explainer": bool(entry.explainer.get("default"))}
    if entry.notes:
        ship["notes"] = entry.notes
    out["recipe"]["ship"] = ship
    return out


class _Dumper(yaml.SafeDumper):
    """Sections and mappings as blocks, lists on one line (``targets: [query, key]``, ``[[0, 1.0e-3]]``)."""


_Dumper.add_representer(list, lambda d, v: d.represent_sequence("tag:yaml.org,2002:seq", v, flow_style=True))


def dump(recipe: dict, header: str) -> str:
    body = yaml.dump(recipe, Dumper=_Dumper, sort_keys=False, default_flow_style=False, width=120, allow_unicode=True)
    return "".join(f"# {ln}\n" for ln in header.splitlines()) + body


def write_row_recipe(name: str, row: dict, force: bool = True) -> Path | None:
    """experiments/recipes/flickr8k/<name>.yaml for trained row ``name`` (None for a row no training made)."""
    from vlmatch.io import write_text

    out = RECIPES / "flickr8k" / f"{name}.yaml"
    if not trained(row) or (out.exists() and not force):
        return None
    header = (f"The recipe of run {name} (its row: experiments/results/flickr8k/{name}.json).\n"
              f"Reproduce: python experiments/run.py experiments/recipes/flickr8k/{name}.yaml")
    write_text(out, dump(recipe_of_row(name, row), header))
    return out


def write_entry_recipe(entry, rows: dict[str, dict], force: bool = True) -> Path | None:
    from vlmatch.io import write_text

    out = RECIPES / "pretrained" / f"{entry.name}.yaml"
    if out.exists() and not force:
        return None
    header = (f"The recipe of the shipped model pretrained:{entry.name}.\n"
              f"Reproduce: python experiments/run.py experiments/recipes/pretrained/{entry.name}.yaml\n"
              f"then:      python release/ship.py --recipe experiments/recipes/pretrained/{entry.name}.yaml")
    write_text(out, dump(recipe_of_entry(entry, rows), header))
    return out


def load_rows() -> dict[str, dict]:
    return {p.stem: json.loads(p.read_text(encoding="utf-8")) for p in sorted(ROWS.glob("*.json"))
            if not p.name.startswith("_")}


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("names", nargs="*", help="rows (default: every trained row, and every shipped model)")
    ap.add_argument("--force", action="store_true", help="write a recipe that exists again")
    a = ap.parse_args(argv)
    rows = load_rows()
    unknown = [n for n in a.names if n not in rows]
    if unknown:
        sys.exit(f"experiments/recipe_of_row.py: no row {', '.join(unknown)} in {ROWS}")
    written = [write_row_recipe(n, rows[n], a.force) for n in (a.names or rows)]
    if not a.names:
        from vlmatch import pretrained

        written += [write_entry_recipe(e, rows, a.force) for e in pretrained.entries()]
    for p in filter(None, written):
        print(p.relative_to(HERE.parent))
    return 0


if __name__ == "__main__":
    sys.exit(main())
