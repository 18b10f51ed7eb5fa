"""experiments/grounding.py --crossfit: a choice among grounding rows made on one half of the val images and
reported on the other, written and rendered; rows under the rsum floor are no candidates."""

from __future__ import annotations

import json
import sys

import pytest

from tests.benchmark_scripts import EXPERIMENTS, load_script
from vlmatch.evaluation.pointing_stats import half_of


def _row(name, hits, names, rsum):
    return {"row": name, "model": "m", "method": "contribution", "features": "f", "val_rsum": rsum,
            "pointing": round(100.0 * sum(hits) / (4 * len(hits)), 2), "pointing_ci95": [1.0, 2.0], "centre": 50.0,
            "caption_mean": 50.0, "ceiling": 99.0, "phrases": 4 * len(hits), "by_type": {}, "seconds": 1.0,
            "note": None, "command": "c", "host": {"cpu": "x", "flags": []}, "finished": "2026-11-27T00:00:00",
            "per_image": {"names": names, "hits": hits, "phrases": [4] * len(hits)}}


@pytest.fixture
def script(tmp_path, monkeypatch):
    monkeypatch.syspath_prepend(str(EXPERIMENTS))
    mod = load_script("grounding")
    monkeypatch.setattr(mod, "RESULTS", tmp_path)
    monkeypatch.setattr(mod, "ROWS", tmp_path / "grounding")
    monkeypatch.setattr(mod, "CHOICES", tmp_path / "grounding_choices")
    monkeypatch.setattr(mod, "BENCH_PAGE", tmp_path / "bench_grounding.md")  # never the repository's page
    names = [f"{i}.jpg" for i in range(200)]
    side = [half_of(n) for n in names]
    (tmp_path / "grounding").mkdir()
    rows = {"lucky": ([4 if s == 0 else 0 for s in side], 340.0),  # all hits on half 0, none on half 1
            "steady": ([3] * 200, 339.0),
            "weak_ranker": ([4] * 200, 300.0)}  # points best but ranks below the floor
    for name, (hits, rsum) in rows.items():
        mod.write_row(tmp_path / "grounding" / f"{name}.json", _row(name, hits, names, rsum))  # the rows' own form
    return mod, tmp_path


def test_the_choice_is_cross_fitted_and_the_floor_keeps_a_weak_ranker_out(script, monkeypatch, capsys):
    mod, root = script
    monkeypatch.setattr(sys, "argv", ["grounding.py", "--crossfit", "pick", "--rows", "lucky", "steady",
                                      "weak_ranker", "--min-rsum", "330"])
    mod.main()
    assert "weak_ranker: val rsum 300.0 below the floor 330.0" in capsys.readouterr().out
    c = json.loads((root / "grounding_choices" / "pick.json").read_text())
    assert c["candidates"] == ["lucky", "steady"]
    assert c["picks"]["picked_on_0"] == {"run": "lucky", "reported_on_other": 0.0}  # its luck does not carry over
    assert c["picks"]["picked_on_1"]["run"] == "steady" and c["picks"]["picked_on_1"]["reported_on_other"] == 75.0
    table = (root / "grounding.md").read_text()
    assert "## Cross-fitted choices" in table and "| pick | lucky, steady, weak_ranker | 330.0 |" in table
    assert "1.0-2.0" in table  # the rows' intervals are rendered


def test_an_unknown_row_is_one_line(script, monkeypatch):
    mod, _ = script
    monkeypatch.setattr(sys, "argv", ["grounding.py", "--crossfit", "x", "--rows", "nope"])
    with pytest.raises(SystemExit, match="nope.json not found"):
        mod.main()
