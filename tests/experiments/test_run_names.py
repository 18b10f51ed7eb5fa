"""experiments/run.py refuses, in one line naming the recipe and its field, a run name that is not one folder name
("." was the runs folder itself: its overwrite removed the other runs' folders), and a recipe's unknown backbone before
the data.path derived from it; nothing in the runs folder or the cache around it is touched."""

from __future__ import annotations

import json
import os
import subprocess
import sys

import pytest

from tests.benchmark_scripts import EXPERIMENTS

ROOT = EXPERIMENTS.parent
TINY = ROOT / "tests" / "experiments" / "tiny_recipe.yaml"


def _run(tmp_path, recipe) -> subprocess.CompletedProcess:
    env = {**os.environ, "PYTHONPATH": str(ROOT / "src"), "VLMATCH_CACHE": str(tmp_path / "cache"),
           "OMP_NUM_THREADS": "1"}
    return subprocess.run([sys.executable, str(EXPERIMENTS / "run.py"), str(recipe), "--no-progress",
                           "--runs", str(tmp_path / "cache" / "runs"), "--results", str(tmp_path / "results")],
                          capture_output=True, text=True, env=env, cwd=tmp_path, timeout=300)


def _cache(tmp_path) -> dict:
    """A cache with two other runs' folders and a file beside the runs folder: all must survive."""
    runs = tmp_path / "cache" / "runs"
    for run in ("best", "ranks"):
        (runs / run).mkdir(parents=True)
        (runs / run / "config.yaml").write_text(f"{run}\n")
    (tmp_path / "cache" / "config.yaml").write_text("the cache's own file\n")
    return _tree(tmp_path / "cache")


def _tree(root) -> dict:
    return {str(p.relative_to(root)): p.read_text() if p.is_file() else None for p in sorted(root.rglob("*"))}


NAMES = {"dot": '"."', "dotdot": '".."', "newline": '"a\\nb"', "nul": '"a\\0b"', "long": "x" * 300,
         "slash": "runs/../x", "hidden": '".x"', "zero_width": '"\\u200b"', "number": "7"}
SAYS = {"dot": "a folder's own name", "dotdot": "a folder's own name", "newline": "U+000A", "nul": "U+0000",
        "long": "at most 200", "slash": "without separators", "hidden": "starts with '.'", "zero_width": "U+200B",
        "number": "must be a string, not int 7"}


@pytest.mark.slow  # experiments/run.py in a process of its own per case
@pytest.mark.parametrize("case", sorted(NAMES))
def test_a_run_name_that_is_not_one_folder_name_is_refused_and_nothing_is_removed(tmp_path, case):
    before = _cache(tmp_path)
    recipe = tmp_path / "r.yaml"
    recipe.write_text(TINY.read_text().replace("name: tiny_vsepp", f"name: {NAMES[case]}"))
    r = _run(tmp_path, recipe)
    err = r.stderr.strip()
    assert r.returncode == 2 and len(err.splitlines()) == 1 and "Traceback" not in err, err
    assert str(recipe) in err and "recipe.name must be a run name (one folder name)" in err and SAYS[case] in err, err
    assert _tree(tmp_path / "cache") == before and not (tmp_path / "results").exists() and r.stdout == ""


def test_a_good_name_passes_the_check(tmp_path):
    from vlmatch.names import name_problem

    assert name_problem("c36_vsepp_lite2_320_lora32") is None and name_problem("läufer-2") is None
    assert name_problem("x" * 200) is None and name_problem("é" * 101)  # bytes, not characters, are counted


@pytest.mark.slow  # experiments/run.py in a process of its own
def test_an_unknown_backbone_is_named_before_the_data_path_derived_from_it(tmp_path):
    recipe = tmp_path / "r.yaml"
    text = (EXPERIMENTS / "recipes" / "pretrained" / "vsepp-lite2-320-grounded-f8k.yaml").read_text()
    recipe.write_text(text.replace("backbone: efficientnet-lite2", "backbone: efficientnet-lite9"))
    r = _run(tmp_path, recipe)
    err = r.stderr.strip()
    assert r.returncode == 2 and len(err.splitlines()) == 1, err
    assert "recipe.features.backbone: unknown backbone 'efficientnet-lite9'; available: efficientnet-lite0" in err, err
    assert "data.path" not in err
    assert json.dumps(_tree(tmp_path)) == json.dumps({"r.yaml": recipe.read_text()})
