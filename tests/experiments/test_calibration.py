"""experiments/calibration.py: beta is picked on val half A only, the written calibration is the one its row
reports, and the record and the table say so."""

from __future__ import annotations

import json

import numpy as np
import pytest
import torch

from tests.benchmark_scripts import EXPERIMENTS, load_script
from vlmatch.evaluation.metrics import recall_metrics
from vlmatch.models.calibration import Calibration, load_calibration


def _unit(rng, n, d=8):
    x = rng.standard_normal((n, d)).astype(np.float32)
    return x / np.linalg.norm(x, axis=1, keepdims=True)


@pytest.fixture
def bench(tmp_path, monkeypatch):
    monkeypatch.syspath_prepend(str(EXPERIMENTS))
    mod = load_script("calibration")
    monkeypatch.setattr(mod, "HERE", tmp_path)
    monkeypatch.setattr(mod, "CACHE", tmp_path / "cache")
    monkeypatch.setattr(mod, "RESULTS", tmp_path / "results" / "calibration")
    monkeypatch.setattr(mod, "weights_of", lambda model: "0" * 64)  # the toy's embeddings come from no checkpoint
    rng = np.random.default_rng(0)
    img = _unit(rng, 40)  # val: 40 images with 5 captions each, near their image; a few hub images
    txt = np.repeat(img, 5, axis=0) + 0.6 * rng.standard_normal((200, 8)).astype(np.float32)
    txt /= np.linalg.norm(txt, axis=1, keepdims=True)
    hubs = _unit(rng, 3)
    train_txt = np.concatenate([hubs[rng.integers(0, 3, 150)] + 0.3 * rng.standard_normal((150, 8)), _unit(rng, 150)])
    (tmp_path / "cache").mkdir()
    np.savez(tmp_path / "cache" / "toy.npz", dev_img=img, dev_txt=txt, train_img=_unit(rng, 60),
             train_txt=(train_txt / np.linalg.norm(train_txt, axis=1, keepdims=True)).astype(np.float32))
    return mod


def _half(e, h):
    n = len(e["dev_img"]) // 2
    rows = slice(0, n) if h == "A" else slice(n, 2 * n)
    return e["dev_img"][rows], e["dev_txt"][rows.start * 5:rows.stop * 5]


def _rsum(cal, img, txt):
    s = img @ txt.T
    s = s - cal.image_offsets(torch.from_numpy(img)).numpy()[:, None]
    s = s - cal.text_offsets(torch.from_numpy(txt)).numpy()[None, :]
    return recall_metrics(s)["rsum"]


@pytest.mark.slow  # seconds
def test_beta_is_cross_fitted_on_halves_that_prefer_different_betas(bench, tmp_path):
    """Recomputed here, not read from the record's own curves: the beta written is the best on half A, the figure
    reported on half B is B's at that beta, and the other way round; the toy's halves disagree on beta, so a
    record that picked on B, or on all of val, or reported a half at its own best beta, fails."""
    bench.main(["--model", "toy", "--rows", "50", "--rank", "6", "--banks", "both", "--write", str(tmp_path / "w")])
    rec = json.loads((tmp_path / "results" / "calibration" / "toy.json").read_text())
    row = rec["settings"][0]  # the full banks: rebuilt here exactly
    assert row["setting"].startswith("full banks")
    e = np.load(tmp_path / "cache" / "toy.npz")
    tt, ti = torch.from_numpy(e["train_txt"]), torch.from_numpy(e["train_img"])
    curves = {h: {b: _rsum(Calibration(b, tt, ti), *_half(e, h)) for b in bench.BETAS} for h in ("A", "B")}
    best = {h: max(c, key=lambda b: (c[b], -b)) for h, c in curves.items()}
    assert best["A"] != best["B"]  # the toy is one where the halves prefer different betas
    assert row["beta"] == best["A"] and row["beta_B"] == best["B"]
    assert row["B"]["rsum"] == pytest.approx(curves["B"][best["A"]], abs=0.01)  # held out: B at A's beta
    assert row["A"]["rsum"] == pytest.approx(curves["A"][best["B"]], abs=0.01)  # held out: A at B's beta
    assert row["held_out"] == pytest.approx((curves["B"][best["A"]] + curves["A"][best["B"]]) / 2, abs=0.01)
    assert row["B"]["rsum"] < curves["B"][best["B"]] or row["A"]["rsum"] < curves["A"][best["A"]]  # not in-sample


def test_the_choice_of_banks_is_cross_fitted(bench, tmp_path):
    bench.main(["--model", "toy", "--rows", "50", "--rank", "6", "--banks", "both"])
    rec = json.loads((tmp_path / "results" / "calibration" / "toy.json").read_text())
    text, both = rec["settings"][1], rec["settings"][2]
    best_a = max(max(s["curve_A"].values()) for s in (text, both))
    on_a = text if max(text["curve_A"].values()) == best_a else both
    on_b = text if max(text["curve_B"].values()) >= max(both["curve_B"].values()) else both
    c = rec["banks_cross_fit"]
    assert c["chosen_on_A"] == ("text" if on_a is text else "both") and c["B"] == on_a["B"]["rsum"]
    assert c["chosen_on_B"] == ("text" if on_b is text else "both") and c["A"] == on_b["A"]["rsum"]
    md = (tmp_path / "results" / "calibration.md").read_text()
    assert f"reads **{c['B']:.2f}** on half B" in md and f"**{text['B']['rsum']:.2f}**" in md


def test_the_written_calibration_is_the_reported_one_and_beta_comes_from_half_a(bench, tmp_path):
    bench.main(["--model", "toy", "--rows", "50", "--rank", "6", "--banks", "both", "--write", str(tmp_path / "w")])
    rec = json.loads((tmp_path / "results" / "calibration" / "toy.json").read_text())
    assert [s["setting"].split(":")[0].split(" (")[0] for s in rec["settings"]] == [
        "full banks", "shipped", "shipped + image bank 50 rows, rank 6, int8"]
    row = rec["settings"][2]
    a_curve = {float(b): v for b, v in row["curve_A"].items()}
    assert row["beta"] == max(a_curve, key=lambda b: (a_curve[b], -b))  # the best on half A, not on B or all
    assert rec["shipped_setting"] == 2
    cal = load_calibration(tmp_path / "w", 8)
    assert cal.beta == row["beta"] and cal.text_bank.shape == (50, 8) and cal.image_bank.shape == (50, 8)
    e = np.load(tmp_path / "cache" / "toy.npz")
    s = e["dev_img"] @ e["dev_txt"].T
    s = s - cal.image_offsets(torch.from_numpy(e["dev_img"])).numpy()[:, None]
    s = s - cal.text_offsets(torch.from_numpy(e["dev_txt"])).numpy()[None, :]
    assert recall_metrics(s)["rsum"] == pytest.approx(row["val"]["rsum"], abs=0.01)
    assert rec["uncalibrated"]["val"]["rsum"] == pytest.approx(recall_metrics(e["dev_img"] @ e["dev_txt"].T)["rsum"],
                                                               abs=0.01)
    md = (tmp_path / "results" / "calibration.md").read_text()
    assert "### toy" in md and "Written: both banks" in md and f"**{row['B']['rsum']:.2f}**" in md
