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


@pytest.mark.slow  # release/ship.py in a process of its own per case
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


SHIPPED_RECIPE = ROOT / "experiments" / "recipes" / "pretrained" / "vsepp-lite2-320-grounded-f8k.yaml"
BAD_SHIP = {"role": ("role", "king", "recipe.ship.role must be one of retriever, rescorer, got 'king'"),
            "name_number": ("name", 7, "recipe.ship.name must be a shipped model's name (pretrained:NAME: one folder "
                                       "name): it must be a string, not int 7"),
            "name_traversal": ("name", "../../../../outside", "recipe.ship.name must be a shipped model's name"),
            "pair_score": ("pair_score", "median", "recipe.ship.pair_score must be one of model, mean, got 'median'"),
            "default": ("default", "yes", "recipe.ship.default must be true or false, got 'yes'"),
            "notes": ("notes", ["weak on", "indoor scenes"], "recipe.ship.notes must be text, got list"),
            "explainer": ("explainer", "../../x", "recipe.ship.explainer must be a grounding row's name")}


@pytest.mark.slow  # release/ship.py in a process of its own per case
@pytest.mark.parametrize("case", sorted(BAD_SHIP))
def test_a_bad_ship_section_is_one_line_naming_its_field_before_any_run_is_looked_for(tmp_path, case):
    import yaml

    key, value, says = BAD_SHIP[case]
    raw = yaml.safe_load(SHIPPED_RECIPE.read_text())
    raw["recipe"]["ship"][key] = value
    recipe = tmp_path / "r.yaml"
    recipe.write_text(yaml.safe_dump(raw))
    r = _ship("--recipe", recipe)
    err = r.stderr.strip()
    assert r.returncode != 0 and len(err.splitlines()) == 1 and "Traceback" not in err, err
    assert str(recipe) in err and says in err, err
    assert "no such run" not in err and not (tmp_path / "outside").exists()


def test_ship_staged_refuses_a_name_that_is_not_one_folder_name(tmp_path, monkeypatch):
    ship = load_script("ship", "release_ship_names")
    monkeypatch.setattr(ship, "PRETRAINED", tmp_path / "pretrained")
    (tmp_path / "pretrained" / "weights").mkdir(parents=True)
    (tmp_path / "pretrained" / "registry.json").write_text("[]")
    monkeypatch.setattr(ship, "stage_float16", lambda *a: pytest.fail("staged a folder for a bad name"))
    for name in ("..", ".", "../../outside", "a\nb", "x" * 300):
        with pytest.raises(SystemExit, match=r"--name must be a shipped model's name \(one folder name\)"):
            ship.ship_staged(None, name, tmp_path, {"rsum": 1.0})
    assert sorted(p.name for p in tmp_path.rglob("*")) == ["pretrained", "registry.json", "weights"]
