"""Metric parity against a plain re-implementation of the definitions, ties and protocols."""

import json

import numpy as np
import pytest

from vlmatch.cli import main
from vlmatch.errors import DataError
from vlmatch.evaluation.metrics import ensemble, evaluate_protocol, recall_metrics


def plain_metrics(sims):
    """The definitions, one query at a time, pessimistic ties, no vectorisation."""
    n_img, n_cap = sims.shape
    per = n_cap // n_img
    i2t, t2i = [], []
    for i in range(n_img):
        gts = range(i * per, (i + 1) * per)
        ranks = []
        for g in gts:
            wrong_ahead = sum(1 for c in range(n_cap) if c not in gts and sims[i, c] >= sims[i, g])
            ranks.append(wrong_ahead)
        i2t.append(min(ranks))
    for c in range(n_cap):
        g = c // per
        t2i.append(sum(1 for i in range(n_img) if i != g and sims[i, c] >= sims[g, c]))

    def summ(r):
        r = np.array(r)
        return {"r1": 100 * np.mean(r < 1), "r5": 100 * np.mean(r < 5), "r10": 100 * np.mean(r < 10),
                "medr": np.floor(np.median(r)) + 1, "meanr": r.mean() + 1}

    a, b = summ(i2t), summ(t2i)
    out = {f"i2t_{k}": v for k, v in a.items()} | {f"t2i_{k}": v for k, v in b.items()}
    out["rsum"] = sum(out[f"{d}_r{k}"] for d in ("i2t", "t2i") for k in (1, 5, 10))
    return out


@pytest.mark.parametrize("seed", [0, 1, 2])
def test_metrics_match_plain_definitions_with_ties(seed):
    rng = np.random.default_rng(seed)
    sims = rng.integers(0, 6, size=(30, 150)).astype(np.float32)  # few distinct values: many ties
    sims[np.arange(30), np.arange(30) * 5] += rng.integers(0, 3, 30)  # some ground truths ahead
    got, want = recall_metrics(sims), plain_metrics(sims)
    for k, v in want.items():
        assert got[k] == pytest.approx(v), k


def test_ties_count_against_the_ground_truth():
    sims = np.zeros((20, 100), dtype=np.float32)
    m = recall_metrics(sims)
    assert m["rsum"] == 0.0  # with the usual argsort the first items would "win" their ties
    assert m["i2t_medr"] == 96 and m["t2i_medr"] == 20


def test_perfect_matrix():
    sims = np.kron(np.eye(20), np.ones((1, 5))).astype(np.float32)
    m = recall_metrics(sims)
    assert m["rsum"] == 600.0 and m["i2t_medr"] == 1 and m["t2i_meanr"] == 1


def test_five_fold_protocol_is_mean_of_folds_with_right_rsum():
    rng = np.random.default_rng(3)
    n = 10
    sims = rng.normal(size=(5 * n, 25 * n)).astype(np.float32)
    for i in range(5 * n):
        sims[i, i * 5:(i + 1) * 5] += rng.uniform(0, 3)
    res = evaluate_protocol(sims, "coco1k5fold", fold_images=n)
    folds = [plain_metrics(sims[f * n:(f + 1) * n, f * 5 * n:(f + 1) * 5 * n]) for f in range(5)]
    for k in ("i2t_r1", "t2i_r10", "i2t_medr", "t2i_meanr", "rsum"):
        assert res[k] == pytest.approx(np.mean([f[k] for f in folds])), k
    recalls = sum(res[f"{d}_r{k}"] for d in ("i2t", "t2i") for k in (1, 5, 10))
    assert res["rsum"] == pytest.approx(recalls)
    whole = evaluate_protocol(sims, "coco5k", fold_images=n)
    assert whole["rsum"] == pytest.approx(plain_metrics(sims)["rsum"])


def test_protocol_shape_errors_name_the_file(tmp_path):
    bad = tmp_path / "s.npy"
    np.save(bad, np.zeros((7, 36), dtype=np.float32))
    with pytest.raises(DataError, match=r"s\.npy.*multiple"):
        evaluate_protocol(np.load(bad), "single", source=bad)
    ok = np.zeros((100, 500), dtype=np.float32)
    with pytest.raises(DataError, match="5000 images"):
        evaluate_protocol(ok, "coco1k5fold", source="x.npy")
    with pytest.raises(DataError, match="NaN"):
        evaluate_protocol(np.full((2, 10), np.nan), "single")


def test_cli_evaluate_sims_json_and_ensemble(tmp_path, capsys):
    rng = np.random.default_rng(0)
    a = rng.normal(size=(20, 100)).astype(np.float32)
    b = rng.normal(size=(20, 100)).astype(np.float32)
    np.save(tmp_path / "a.npy", a)
    np.save(tmp_path / "b.npy", b)
    assert main(["evaluate", "--sims", str(tmp_path / "a.npy"), "--json", str(tmp_path / "r.json")]) == 0
    out = capsys.readouterr().out
    assert "rsum" in out and "R@10" in out
    r = json.loads((tmp_path / "r.json").read_text())
    assert r["rsum"] == pytest.approx(plain_metrics(a)["rsum"])
    assert main(["evaluate", "--sims", str(tmp_path / "a.npy"), str(tmp_path / "b.npy"), "--json",
                 str(tmp_path / "e.json"), "--save-sims", str(tmp_path / "e.npy")]) == 0
    e = json.loads((tmp_path / "e.json").read_text())
    assert e["rsum"] == pytest.approx(plain_metrics((a.astype(np.float64) + b) / 2)["rsum"])
    np.testing.assert_allclose(np.load(tmp_path / "e.npy"), ensemble([a, b]), rtol=1e-6)


def test_cli_evaluate_bad_file_is_a_clear_error(tmp_path, capsys):
    (tmp_path / "x.npy").write_bytes(b"not numpy")
    assert main(["evaluate", "--sims", str(tmp_path / "x.npy")]) == 2
    assert "x.npy" in capsys.readouterr().err
    assert main(["evaluate", "--sims", str(tmp_path / "missing.npy")]) == 2
