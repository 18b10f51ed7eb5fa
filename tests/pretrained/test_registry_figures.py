"""Every figure the registry of shipped models quotes equals the results file it was copied from: the val
recalls (benchmarks/results/flickr8k/RUN.json, or the grounding run's record), the calibration's beta and
held-out figures (benchmarks/results/calibration/RUN.json), the explainer's pointing figures
(benchmarks/results/grounding/ROW.json) and the default pair's search figures (benchmarks/results/search.json).
A figure edited by hand, or a results file re-run without shipping again, fails here."""

from __future__ import annotations

import json
import statistics
from pathlib import Path

import pytest

from vlmatch import pretrained

RESULTS = Path(__file__).resolve().parents[2] / "benchmarks" / "results"
ENTRIES = pretrained.entries()


def _json(path: Path):
    return json.loads(path.read_text(encoding="utf-8"))


def _run_record(entry) -> dict | None:
    """The flickr8k.py record of the run an entry was trained by (the one whose command it quotes)."""
    for p in sorted((RESULTS / "flickr8k").glob("*.json")):
        rec = _json(p)
        if isinstance(rec, dict) and rec.get("command") == entry.command:
            return rec
    return None


def _calibration_record(entry) -> tuple[dict, dict]:
    run = entry.calibration["command"].split("--model ", 1)[1].split()[0]
    rec = _json(RESULTS / "calibration" / f"{run.replace(':', '_')}.json")
    shipped = rec.get("shipped_setting", {"text": 1, "both": 2}.get(rec.get("written")))
    return rec, rec["settings"][shipped]


def test_there_are_entries_to_check():
    assert len(ENTRIES) >= 5 and sum(bool(e.calibration) for e in ENTRIES) >= 2 and any(e.explainer for e in ENTRIES)


@pytest.mark.parametrize("entry", ENTRIES, ids=lambda e: e.name)
def test_the_val_recalls_are_the_runs(entry):
    raw = entry.calibration["uncalibrated"] if entry.calibration else entry.val["float32"]
    rec = _run_record(entry)
    if rec is not None:
        assert raw == pytest.approx({k: round(v, 2) for k, v in rec["metrics"].items() if k in raw}, abs=0.006)
    else:  # trained by the grounding study: its record holds the val rsum
        run = entry.command.split("--name ", 1)[1].split()[0]
        ground = _json(RESULTS / "grounding" / f"{run}.json")
        assert raw["rsum"] == pytest.approx(ground["val_rsum"], abs=0.006)
    assert entry.val_rsum == entry.val["float16"]["rsum"]


@pytest.mark.parametrize("entry", [e for e in ENTRIES if e.calibration], ids=lambda e: e.name)
def test_the_calibration_figures_are_its_benchmarks(entry):
    rec, row = _calibration_record(entry)
    assert entry.calibration["command"] == rec["command"]
    assert entry.calibration["beta"] == row["beta"]  # the beta written is the one picked on half A
    assert entry.calibration["uncalibrated"]["rsum"] == pytest.approx(rec["uncalibrated"]["val"]["rsum"], abs=0.006)
    assert entry.val["float32"]["rsum"] == pytest.approx(row["val"]["rsum"], abs=0.006)



@pytest.mark.parametrize("entry", [e for e in ENTRIES if e.calibration], ids=lambda e: e.name)
def test_the_held_out_figures_are_the_cross_fitted_record(entry):
    held = entry.calibration.get("held_out")
    assert held, f"{entry.name} quotes no held-out figures of its calibration"
    model = held["command"].split("--model ", 1)[1].split()[0]
    rec = _json(RESULTS / "calibration" / f"{model.replace(':', '_')}.json")
    assert rec["command"] == held["command"] and model == f"pretrained:{entry.name}"
    row = rec["settings"][rec["shipped_setting"]]
    assert row["beta"] == entry.calibration["beta"]  # the shipped beta is the one picked on half A
    assert held == {"B": row["B"], "A": row["A"], "beta_B": row["beta_B"], "mean": row["held_out"],
                    "banks": rec["banks_cross_fit"], "uncalibrated": {h: rec["uncalibrated"][h]["rsum"]
                                                                       for h in ("A", "B")},
                    "command": rec["command"]}


@pytest.mark.parametrize("entry", [e for e in ENTRIES if e.explainer], ids=lambda e: e.name)
def test_the_explainer_figures_are_its_grounding_row(entry):
    ex = entry.explainer
    g = _json(RESULTS / "grounding" / f"{ex['row']}.json")
    for key in ("method", "pointing", "centre", "caption_mean", "ceiling", "phrases"):
        assert ex[key] == g[key], key
    assert ex["by_type"] == {t: v["pointing"] for t, v in g["by_type"].items()}


def test_only_the_default_pair_quotes_search_figures():
    assert {e.name for e in ENTRIES if e.search or e.ms_per_query is not None} == {e.name for e in ENTRIES if e.default}


@pytest.mark.parametrize("entry", [e for e in ENTRIES if e.search], ids=lambda e: e.name)
def test_the_search_figures_are_the_default_pairs(entry):
    res = _json(RESULTS / "search.json")
    pair = res["default_pair"]
    real = next(r for r in res["real"] if r["model"] == pair["build"]["model"])
    scale = pair["scale"][-1]
    s = entry.search
    runs = pair["build"]["runs_images_per_s"]
    assert s["build_images_per_s"] == round(statistics.median(runs), 1)  # the median of the runs, not the best
    assert s["build_images_per_s_range"] == [round(min(runs), 1), round(max(runs), 1)]
    assert s["query_p50_ms"] == round(scale["latency"]["total"]["p50_ms"], 1) == entry.ms_per_query
    assert s["query_p99_ms"] == round(scale["latency"]["total"]["p99_ms"], 1)
    assert s["n_images"] == scale["n"]
    assert s["two_stage_r10"] == round(real["two_stage_t2i"]["100"]["r10"], 2)
    assert s["exhaustive_r10"] == round(real["exhaustive"]["t2i"]["r10"], 2)
