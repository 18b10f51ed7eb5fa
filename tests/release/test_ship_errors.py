"""release/ship.py answers a bad --recipe in one line (a missing file, YAML that does not parse, an unknown
``recipe:`` key), and a re-ship whose float16 gate fails leaves the shipped folder as it was: the new one is
written and gated in a staging folder, then swapped in by renames."""

from __future__ import annotations

import subprocess
import sys

import pytest

from tests.benchmark_scripts import RELEASE, load_script

ROOT = RELEASE.parent
TINY = ROOT / "tests" / "experiments" / "tiny_recipe.yaml"


def _ship(*args) -> subprocess.CompletedProcess:
    env = {"PYTHONPATH": str(ROOT / "src"), "PATH": "/usr/bin:/bin"}
    return subprocess.run([sys.executable, str(RELEASE / "ship.py"), *map(str, args)], capture_output=True, text=True,
                          env=env, cwd=ROOT, timeout=120)


@pytest.mark.parametrize("case", ["missing", "not_yaml", "unknown_key"])
def test_a_bad_recipe_is_one_line(tmp_path, case):
    recipe = tmp_path / "r.yaml"
    if case == "not_yaml":
        recipe.write_text("model: {name: vsepp\nrecipe:\n  name: x\n")
    elif case == "unknown_key":
        recipe.write_text(TINY.read_text().replace("recipe:\n", "recipe:\n  colour: blue\n", 1))
    r = _ship("--recipe", recipe)
    assert r.returncode != 0
    err = r.stderr.strip()
    assert len(err.splitlines()) == 1 and "Traceback" not in err and str(recipe) in err, err
    assert {"missing": "no such recipe file", "not_yaml": "not valid YAML: line",
            "unknown_key": "unknown key(s) ['colour']"}[case] in err


def test_a_failed_float16_gate_leaves_the_shipped_folder_in_place(tmp_path, monkeypatch):
    ship = load_script("ship", "release_ship")
    out = tmp_path / "weights" / "m"
    out.mkdir(parents=True)
    (out / "model.safetensors").write_bytes(b"the shipped weights")
    stage = out.with_name(".m.staging")

    def staged(model, folder, features_dir):
        folder.mkdir()
        (folder / "model.safetensors").write_bytes(b"new weights")
        return {}, "", None, {"rsum": 300.0}

    monkeypatch.setattr(ship, "stage_float16", staged)
    monkeypatch.setattr(ship, "PRETRAINED", tmp_path)
    with pytest.raises(SystemExit, match="not shipped"):
        ship.ship_staged(None, "m", tmp_path, {"rsum": 310.0})
    assert (out / "model.safetensors").read_bytes() == b"the shipped weights" and not stage.exists()
    ship.ship_staged(None, "m", tmp_path, {"rsum": 300.2})  # a gate passed: swapped in whole
    assert (out / "model.safetensors").read_bytes() == b"new weights" and not stage.exists()
    assert sorted(p.name for p in out.parent.iterdir()) == ["m"]
