"""experiments/run.py: one command reproduces a run from its recipe file -- the data made, the model trained with the
recipe's seed and epochs, the results row written in the shape of experiments/results/flickr8k/*.json -- and the same
recipe run twice gives the same row."""

import json
import re
import shutil
from pathlib import Path

import pytest

from tests.benchmark_scripts import EXPERIMENTS, load_script
from vlmatch_lab.paths import cache_root

TINY = Path(__file__).with_name("tiny_recipe.yaml")
ROW_FIELDS = {"metrics", "epochs", "minutes_per_epoch", "val_rsum_by_epoch", "command", "config", "finished"}


@pytest.fixture
def runner(tmp_path, monkeypatch):
    monkeypatch.syspath_prepend(str(EXPERIMENTS))
    monkeypatch.chdir(tmp_path)  # a recipe's relative data.path is read from the folder the command runs in
    shutil.copy(TINY, tmp_path / "tiny.yaml")
    return load_script("run", "experiments_run")


def _run(runner, tmp_path, results: str) -> dict:
    assert runner.main(["tiny.yaml", "--results", results, "--runs", str(tmp_path / "runs"), "--no-progress"]) == 0
    return json.loads((tmp_path / results / "tiny_vsepp.json").read_text())


@pytest.mark.slow  # a recipe's training
def test_a_recipe_is_reproduced_by_one_command(runner, tmp_path):
    row = _run(runner, tmp_path, "first")
    assert ROW_FIELDS <= set(row) and row["recipe"] == "tiny.yaml" and row["note"] == "the runner's test recipe"
    assert row["command"] == "python experiments/run.py tiny.yaml"
    # the recipe's seed and epochs are what trained: in the row, in the run folder's config, in its validations
    assert row["config"]["train"]["seed"] == 3 and row["epochs"] == 2
    assert "seed: 3" in (tmp_path / "runs" / "tiny_vsepp" / "config.yaml").read_text()
    assert len(row["val_rsum_by_epoch"]) == 2 and row["metrics"]["epoch"] in (0, 1)
    assert row["metrics"]["rsum"] == pytest.approx(max(row["val_rsum_by_epoch"]), abs=0.01)
    assert (tmp_path / "toy" / "train_ims.npy").is_file() and (tmp_path / "runs" / "tiny_vsepp" / "best").is_dir()
    assert 0 < row["metrics"]["rsum"] <= 600 and row["minutes_per_epoch"] > 0
    again = _run(runner, tmp_path, "second")  # the same recipe again: the same run
    assert again["metrics"] == row["metrics"] and again["val_rsum_by_epoch"] == row["val_rsum_by_epoch"]


def test_a_bad_recipe_is_one_line_naming_the_file_and_field(runner, tmp_path, capsys):
    bad = tmp_path / "bad.yaml"
    bad.write_text((tmp_path / "tiny.yaml").read_text().replace("data: toyworld", "data: imagenet"))
    assert runner.main([str(bad), "--results", "r", "--runs", str(tmp_path / "runs")]) == 2
    err = capsys.readouterr().err.strip()
    assert len(err.splitlines()) == 1 and str(bad) in err and "recipe.data must be one of" in err
    assert not (tmp_path / "runs").exists()


def test_a_flickr8k_recipe_extracts_the_features_its_data_path_names(monkeypatch, tmp_path):
    monkeypatch.syspath_prepend(str(EXPERIMENTS))
    runner = load_script("run", "experiments_run_f8k")
    recipe = EXPERIMENTS / "recipes" / "pretrained" / "vsepp-lite2-320-grounded-f8k.yaml"
    calls = []
    monkeypatch.setattr(runner.flickr8k, "ensure_features", lambda shared, size, backbone: calls.append((size, backbone)))
    shared = tmp_path / "flickr8k"
    shared.mkdir()
    (shared / "dataset_flickr8k.json").write_text("{}")
    cfg, rec = runner.read_recipe(recipe)  # data.path: $VLMATCH_CACHE/..., this machine's cache in its place
    assert cfg["data"]["path"] == str(cache_root() / "flickr8k-efficientnet-lite2-320")
    monkeypatch.chdir(tmp_path)  # from any folder
    runner.make_data(cfg, rec, shared)
    assert calls == [(320, "efficientnet-lite2")]
    cfg["data"]["path"] = "elsewhere/flickr8k-efficientnet-lite2-320"  # another folder: refused, naming the one it wants
    with pytest.raises(runner.VlmatchError, match=re.escape("$VLMATCH_CACHE/flickr8k-efficientnet-lite2-320")):
        runner.make_data(cfg, rec, shared)


def test_a_flickr8k_recipe_without_its_data_names_the_variable(monkeypatch, tmp_path):
    monkeypatch.syspath_prepend(str(EXPERIMENTS))
    runner = load_script("run", "experiments_run_f8k_nodata")
    monkeypatch.setenv("VLMATCH_DATA", str(tmp_path / "nowhere"))
    cfg, rec = runner.read_recipe(EXPERIMENTS / "recipes" / "pretrained" / "vsepp-lite2-320-grounded-f8k.yaml")
    with pytest.raises(SystemExit) as e:
        runner.make_data(cfg, rec)
    assert "VLMATCH_DATA" in str(e.value.code) and len(str(e.value.code).splitlines()) == 1


def test_a_recipe_that_is_not_yaml_is_one_line_naming_the_file_and_the_place(runner, tmp_path, capsys):
    bad = tmp_path / "broken.yaml"
    bad.write_text("model:\n  name: vsepp\n  embed_dim: [32\nrecipe: {name: x}\n")
    assert runner.main([str(bad), "--results", "r", "--runs", str(tmp_path / "runs")]) == 2
    err = capsys.readouterr().err.strip()
    assert len(err.splitlines()) == 1 and str(bad) in err and "not valid YAML: line" in err, err


def test_a_row_records_its_paths_from_the_roots_not_this_machines_folders(runner, monkeypatch, tmp_path):
    monkeypatch.setenv("VLMATCH_CACHE", str(tmp_path / "cache"))
    cfg = {"data": {"path": str(tmp_path / "cache" / "flickr8k-efficientnet-lite0"), "entities": None},
           "train": {"init_from": str(tmp_path / "cache" / "runs" / "a" / "best"), "seed": 1}, "model": {"name": "vsepp"}}
    out = runner.portable_config(cfg)
    assert out["data"]["path"] == "$VLMATCH_CACHE/flickr8k-efficientnet-lite0"
    assert out["train"]["init_from"] == "$VLMATCH_CACHE/runs/a/best" and out["train"]["seed"] == 1
    assert cfg["data"]["path"].startswith(str(tmp_path))  # the run's own config is left as it trained
