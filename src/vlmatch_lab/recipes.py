"""A recipe: a config file plus a ``recipe:`` section ``vlmatch train`` ignores, so that ``experiments/run.py``
reproduces a run in one command (and ``release/ship.py`` ships its model):

    recipe:
      name: c36_vsepp_lite2_320_lora32   # the run's name: its run folder and its results row (one folder name)
      data: flickr8k                     # where data.path comes from: flickr8k | toyworld | precomp
      features: {backbone: efficientnet-lite2, input_size: 320}   # flickr8k: the extraction that makes data.path
      world: {seed: 1, n_train: 600}     # toyworld: the ToyWorldConfig fields that generate data.path
      calibration: [--banks, both]       # optional: calibration.py's arguments after training (flickr8k)
      note: ...                          # optional: stored with the results row
      recorded: python benchmarks/...    # optional: the command line the run was first recorded with
      ship: {name: ..., role: ...}       # a shipped model's recipe (recipes/pretrained/): release/ship.py's options

Its paths start with ``$VLMATCH_CACHE/`` or ``$VLMATCH_DATA/``, which :func:`read_recipe` expands to this machine's
folders (vlmatch_lab.paths).
"""

from __future__ import annotations

from pathlib import Path

from vlmatch.errors import DataError
from vlmatch.names import name_problem
from vlmatch.training.config import PATHS, RECIPE, load_config, read_yaml_file  # PATHS: a config's folders and files

from .paths import expand

DATA = ("flickr8k", "toyworld", "precomp")
KEYS = {"name", "data", "features", "world", "calibration", "note", "recorded", "ship"}
SHIP_KEYS = {"name", "role", "default", "pair_score", "explainer", "default_explainer", "notes", "selected"}
BY = ("val rsum", "pointing")  # what a recipe's ship.selected choice compared its candidate runs by


def read_recipe(path: str | Path) -> tuple[dict, dict]:
    """``(config, recipe)`` of a recipe file, both checked (a DataError naming the file and field), paths expanded."""
    path = Path(path)
    if not path.is_file():
        raise DataError(path, "no such recipe file")
    raw = read_yaml_file(path)
    rec = raw.get(RECIPE) if isinstance(raw, dict) else None
    if not isinstance(rec, dict):
        raise DataError(path, f"no '{RECIPE}:' section (a recipe is a config file plus a '{RECIPE}:' section)")
    unknown = set(rec) - KEYS
    if unknown:
        raise DataError(path, f"{RECIPE}: unknown key(s) {sorted(unknown)}; known: {sorted(KEYS)}")
    problem = name_problem(rec.get("name"))
    if problem:  # it becomes runs/<name>, replaced whole by a run: "." or ".." would be the runs folder or its parent
        raise DataError(path, f"{RECIPE}.name must be a run name (one folder name): it {problem}")
    if rec.get("data") not in DATA:
        raise DataError(path, f"{RECIPE}.data must be one of {', '.join(DATA)}, got {rec.get('data')!r}")
    if rec["data"] == "flickr8k":
        feats = rec.get("features")
        size = feats.get("input_size") if isinstance(feats, dict) else None
        if not (isinstance(feats, dict) and isinstance(feats.get("backbone"), str)
                and isinstance(size, int) and not isinstance(size, bool) and size > 0):
            raise DataError(path, f"{RECIPE}.features must be {{backbone: NAME, input_size: PIXELS}} for flickr8k data, "
                                  f"got {feats!r}")
        from vlmatch.features.backbones import BACKBONES

        if feats["backbone"] not in BACKBONES:  # named before data.path, which is derived from it
            raise DataError(path, f"{RECIPE}.features.backbone: unknown backbone {feats['backbone']!r}; available: "
                                  f"{', '.join(BACKBONES)}")
    if rec["data"] == "toyworld" and not isinstance(rec.get("world", {}), dict):
        raise DataError(path, f"{RECIPE}.world must be a mapping of ToyWorldConfig fields, got {rec['world']!r}")
    if rec.get("calibration") is not None and not (isinstance(rec["calibration"], list)
                                                   and all(isinstance(x, str) for x in rec["calibration"])):
        raise DataError(path, f"{RECIPE}.calibration must be a list of calibration.py arguments, got {rec['calibration']!r}")
    ship = rec.get("ship")
    if ship is not None and not (isinstance(ship, dict) and {"name", "role"} <= set(ship) and set(ship) <= SHIP_KEYS):
        raise DataError(path, f"{RECIPE}.ship must hold name and role (and any of {sorted(SHIP_KEYS - {'name', 'role'})})"
                              f", got {ship!r}")
    if ship is not None:
        check_ship(path, ship)
    for c in (ship or {}).get("selected") or []:
        listed = (isinstance(c, dict) and set(c) == {"what", "among", "by"} and isinstance(c["among"], list)
                  and len(c["among"]) >= 2 and rec["name"] in c["among"] and c["by"] in BY)
        crossfit = isinstance(c, dict) and set(c) == {"what", "crossfit"} and isinstance(c["crossfit"], str)
        if not (listed or crossfit):
            raise DataError(path, f"{RECIPE}.ship.selected: each choice is {{what, among: [2+ run names, this run's "
                                  f"included], by: {' or '.join(sorted(BY))}}} or {{what, crossfit: the name of its "
                                  f"record in results/grounding_choices/}}, got {c!r}")
    # the config as `vlmatch train --config` reads it, its paths expanded here first ($VLMATCH_DATA has a default here)
    merged: dict = {}
    for section, key in PATHS:
        if isinstance((raw.get(section) or {}).get(key), str):
            merged.setdefault(section, {})[key] = expand(raw[section][key])
    cfg = load_config(str(path), extra=merged or None)
    if not cfg["data"].get("path"):
        raise DataError(path, "data.path: a recipe names the folder its data is in (or 'toyworld')")
    if rec.get("calibration"):
        rec = {**rec, "calibration": [expand(x) for x in rec["calibration"]]}
    return cfg, rec


ROLES = ("retriever", "rescorer")  # release/ship.py --role
PAIR_SCORES = ("model", "mean")  # release/ship.py --pair-score
FLAGS = ("default", "default_explainer")  # true or false


def check_ship(path: Path, ship: dict) -> None:
    """A recipe's ``ship`` section, each field as release/ship.py's option of the same name takes it."""
    def bad(key, problem):
        return DataError(path, f"{RECIPE}.ship.{key} {problem}")

    for key in ("name", "explainer"):
        if key in ship and (key == "name" or ship[key] is not None):
            problem = name_problem(ship[key])
            if problem:
                what = "a shipped model's name (pretrained:NAME: one folder name)" if key == "name" else \
                    "a grounding row's name (experiments/results/grounding/ROW.json: one file name)"
                raise bad(key, f"must be {what}: it {problem}")
    for key, choices in (("role", ROLES), ("pair_score", PAIR_SCORES)):
        if key in ship and ship[key] not in choices:
            raise bad(key, f"must be one of {', '.join(choices)}, got {ship[key]!r}")
    for key in FLAGS:
        if key in ship and not isinstance(ship[key], bool):
            raise bad(key, f"must be true or false, got {ship[key]!r}")
    if "notes" in ship and not isinstance(ship["notes"], str):
        raise bad("notes", f"must be text, got {type(ship['notes']).__name__} {str(ship['notes'])[:40]!r}")


def features_of_recipe(rec: dict) -> tuple[str, int] | None:
    """(backbone, input size) of a Flickr8k recipe's features; None for other data."""
    if rec["data"] != "flickr8k":
        return None
    return rec["features"]["backbone"], rec["features"]["input_size"]
