"""experiments/recipes/: one recipe per recorded training run (experiments/results/flickr8k/RUN.json) and one per
shipped model (src/vlmatch/pretrained/registry.json), each a valid config that trains what the row records."""

import json
from pathlib import Path

import pytest

from tests.benchmark_scripts import EXPERIMENTS, load_script
from vlmatch import pretrained
from vlmatch.training.config import load_config
from vlmatch_lab import recipes as lab_recipes
from vlmatch_lab.paths import cache_root, data_root

ROWS = {p.stem: json.loads(p.read_text()) for p in sorted((EXPERIMENTS / "results" / "flickr8k").glob("*.json"))
        if not p.name.startswith("_")}
TRAINED = sorted(n for n, r in ROWS.items() if "config" in r and "ensemble_of" not in r and "rerank" not in r)
RECIPES = EXPERIMENTS / "recipes"


@pytest.fixture(scope="module")
def recipes():
    return lab_recipes, load_script("recipe_of_row", "experiment_recipe_of_row")


def _comparable(cfg: dict) -> dict:
    """A config less what differs between machines: the folder names of the features and the run it starts from."""
    cfg = json.loads(json.dumps(cfg))
    cfg["data"]["path"] = Path(cfg["data"]["path"]).name
    if cfg["data"].get("entities"):
        cfg["data"]["entities"] = Path(cfg["data"]["entities"]).name
    if cfg["train"].get("init_from"):
        cfg["train"]["init_from"] = "/".join(Path(cfg["train"]["init_from"]).parts[-2:])
    return cfg


def test_there_is_a_recipe_for_every_trained_row_and_no_other():
    assert len(TRAINED) >= 100
    have = sorted(p.stem for p in (RECIPES / "flickr8k").glob("*.yaml"))
    missing = sorted(set(TRAINED) - set(have))
    assert not missing, f"no recipe for {missing}: python experiments/recipe_of_row.py {' '.join(missing)}"
    assert have == TRAINED


@pytest.mark.parametrize("name", TRAINED)
def test_a_runs_recipe_trains_what_its_row_records(recipes, name):
    read_recipe = recipes[0].read_recipe
    cfg, rec = read_recipe(RECIPES / "flickr8k" / f"{name}.yaml")
    row = ROWS[name]
    assert rec["name"] == name and rec["data"] == "flickr8k" and rec.get("recorded") == row["command"]
    # the row's whole config, every override written out (a key added since takes its default, as the run did)
    assert _comparable(cfg) == _comparable(load_config(None, extra={k: row["config"][k] for k in ("model", "data", "train")}))
    assert cfg["train"]["seed"] == row["config"]["train"].get("seed", 0) and cfg["train"]["epochs"] == row["epochs"]
    assert rec["features"] == recipes[1].features(row["config"]["data"]["path"])
    # the features in this machine's cache: the recipe writes them from the cache root, as every path of the rooms'
    raw = (RECIPES / "flickr8k" / f"{name}.yaml").read_text()
    assert f"  path: $VLMATCH_CACHE/{Path(row['config']['data']['path']).name}\n" in raw
    assert cfg["data"]["path"] == str(cache_root() / Path(row["config"]["data"]["path"]).name)
    if cfg["data"].get("entities"):
        assert "  entities: $VLMATCH_DATA/flickr30k_entities\n" in raw
        assert cfg["data"]["entities"] == str(data_root(check=False) / "flickr30k_entities")


@pytest.mark.parametrize("entry", pretrained.entries(), ids=lambda e: e.name)
def test_every_shipped_model_has_its_recipe(recipes, entry):
    read_recipe = recipes[0].read_recipe
    path = RECIPES / "pretrained" / f"{entry.name}.yaml"
    assert path.is_file(), f"no recipe for pretrained:{entry.name}: python experiments/recipe_of_row.py"
    cfg, rec = read_recipe(path)
    run_cfg, run_rec = read_recipe(RECIPES / "flickr8k" / f"{rec['name']}.yaml")
    assert cfg == run_cfg and rec["features"] == run_rec["features"]  # the run it came from, as that run's recipe
    assert entry.command.startswith(ROWS[rec["name"]]["command"].split(" --set data.entities")[0])
    ship = rec["ship"]
    assert (ship["name"], ship["role"], ship["default"], ship["pair_score"]) == (
        entry.name, entry.role, entry.default, entry.pair_score)
    assert ship.get("explainer") == (entry.explainer or {}).get("row")
    if entry.calibration:  # calibration.py's arguments after --model RUN, as the shipped calibration was made (then
        # into benchmarks/cache/, where the rooms' cache was before it had a root of its own)
        made = entry.calibration["command"].replace("benchmarks/cache", str(cache_root()))
        assert made.endswith(f"--model {rec['name']} " + " ".join(rec["calibration"]))
    else:
        assert "calibration" not in rec


def test_a_row_recorded_on_another_machine_becomes_a_recipe_of_the_rooms_roots(recipes, tmp_path, monkeypatch):
    read_recipe, convert = recipes[0].read_recipe, recipes[1]
    monkeypatch.setattr(convert, "RECIPES", tmp_path)
    cfg = load_config(None, ["model.embed_dim=64", "train.seed=5", "train.epochs=3", "train.grounding_loss=30",
                             "data.entities=/elsewhere/shared/flickr30k_entities",
                             "train.init_from=/elsewhere/repo/benchmarks/cache/runs/a/best",
                             "data.path=/elsewhere/repo/benchmarks/cache/flickr8k-efficientnet-lite1-320"])
    row = {"metrics": {"rsum": 1.0}, "epochs": 3, "config": cfg, "command": "python experiments/flickr8k.py ...",
           "note": "a note", "stopped_after_epoch": 2}
    out = convert.write_row_recipe("x1", row)
    got, rec = read_recipe(out)
    assert out == tmp_path / "flickr8k" / "x1.yaml" and out.read_text().startswith("# The recipe of run x1")
    assert rec == {"name": "x1", "data": "flickr8k", "features": {"backbone": "efficientnet-lite1", "input_size": 320},
                   "recorded": "python experiments/flickr8k.py ...",
                   "note": "a note (recorded: stopped by hand after 2 epochs)"}
    text = out.read_text()  # written from the roots; read with this machine's folders in their place
    assert "  path: $VLMATCH_CACHE/flickr8k-efficientnet-lite1-320\n" in text
    assert "  entities: $VLMATCH_DATA/flickr30k_entities\n" in text and "  init_from: $VLMATCH_CACHE/runs/a/best\n" in text
    assert got["data"]["path"] == str(cache_root() / "flickr8k-efficientnet-lite1-320")
    assert got["data"]["entities"] == str(data_root(check=False) / "flickr30k_entities")
    assert got["train"]["init_from"] == str(cache_root() / "runs" / "a" / "best")
    assert (got["train"]["seed"], got["train"]["epochs"], got["model"]["embed_dim"]) == (5, 3, 64)
    assert convert.write_row_recipe("x2", {**row, "ensemble_of": ["a", "b"]}) is None  # no training: no recipe
