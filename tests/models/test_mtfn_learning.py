"""MTFN on the toy world through the shared trainer: the image-text stage learns, the text-text stage
(caption-pair batches, initialised from stage 1) trains S_TT without moving S_IT, and re-ranking with
S_TT runs from the CLI on the model's own matrices.

MTFN scores global vectors, which cannot bind attributes to objects, so on the toy world it levels off around
85-100 val rsum (input_norm l2, this schedule: 51, 63, 85, 83, 99 after epochs 1-5 on an AVX2 host; the paper's
input_norm none: 28, 55, 74, 90, 90). The test asserted 4 x chance (96), inside that spread, so its pass hung
on the host's float code paths; it asserts 2.5 x chance (60), which every variant clears by 25 or more."""

import json

import numpy as np
import pytest
import torch

from vlmatch import load_model
from vlmatch.cli import main
from vlmatch.data.precomp import PrecompSplit
from vlmatch.evaluation.scoring import model_scores
from vlmatch.training.config import load_config
from vlmatch.training.loop import train

CHANCE_RSUM = 24.0  # 200 dev images


def _cfg(world, **train_over):
    return load_config(None, extra={
        "model": {"name": "mtfn", "embed_dim": 64, "word_dim": 32, "rank": 4, "fusion_dim": 64, "rr_k": 5,
                  "input_norm": "l2"},
        "data": {"path": str(world), "val_max_images": 200, "min_word_count": 1},
        "train": {"epochs": 5, "batch_size": 64, "lr": 1e-3, "lr_update": 2, "lr_decay": 0.5, "log_every": 5,
                  "warmup_epochs": 1, **train_over}})


@pytest.fixture(scope="module")
def runs(small_world, tmp_path_factory):
    it = tmp_path_factory.mktemp("mtfn_it")
    best_it = train(_cfg(small_world), it, progress=False)
    tt = tmp_path_factory.mktemp("mtfn_tt")
    best_tt = train(_cfg(small_world, stage="text_text", init_from=str(it / "best"), epochs=2), tt, progress=False)
    return it, best_it, tt, best_tt


@pytest.mark.slow
def test_mtfn_image_text_stage_learns_with_halving_lr(runs):
    it, best, _, _ = runs
    assert best["rsum"] > 2.5 * CHANCE_RSUM, best
    lrs = sorted({json.loads(x)["lr"] for x in (it / "metrics.jsonl").read_text().splitlines()
                  if json.loads(x)["type"] == "train"}, reverse=True)
    assert lrs == pytest.approx([1e-3, 5e-4, 2.5e-4])  # halved every 2 epochs over 5


@pytest.mark.slow
def test_text_text_stage_trains_s_tt_and_leaves_s_it_alone(runs, small_world):
    it, best_it, tt, best_tt = runs
    a, b = load_model(it / "best"), load_model(tt / "best")
    assert not a.has_text_similarity() and b.has_text_similarity()
    split = PrecompSplit(small_world, "dev", max_images=200)
    np.testing.assert_array_equal(model_scores(a, split, progress=False), model_scores(b, split, progress=False))
    frozen = {k for k in a.state_dict() if not k.startswith(("tt.", "tt_proj.", "tt_trained"))}
    assert all(torch.equal(a.state_dict()[k], b.state_dict()[k]) for k in frozen)
    assert best_tt["reranked"]["before_rsum"] == pytest.approx(best_it["rsum"])
    log = [json.loads(x) for x in (tt / "metrics.jsonl").read_text().splitlines()]
    losses = [r["loss"] for r in log if r["type"] == "train"]
    assert np.mean(losses[-5:]) < np.mean(losses[:5])  # the text-text loss goes down


@pytest.mark.slow
def test_rerank_cli_with_the_models_s_tt(runs, small_world, tmp_path, capsys):
    _, _, tt, _ = runs
    sims = tmp_path / "s.npy"
    assert main(["evaluate", "--checkpoint", str(tt / "best"), "--data", str(small_world), "--split", "dev",
                 "--max-images", "200", "--save-sims", str(sims), "--rerank", "--k", "5", "--no-progress",
                 "--json", str(tmp_path / "e.json")]) == 0
    ev = json.loads((tmp_path / "e.json").read_text())
    assert ev["rerank"]["text"] == "S_TT" and ev["rerank"]["after"]["rsum"] > 0
    assert main(["rerank", "--sims", str(sims), "--k", "5", "--k-text", "3", "--text-model", str(tt / "best"),
                 "--data", str(small_world), "--split", "dev", "--max-images", "200", "--no-progress",
                 "--json", str(tmp_path / "r.json")]) == 0
    r = json.loads((tmp_path / "r.json").read_text())
    assert set(r) >= {"before", "after", "k", "k_text"} and r["k_text"] == 3
    for d in ("before", "after"):
        assert {"i2t_r1", "t2i_r1", "rsum"} <= set(r[d])
    assert r["before"]["rsum"] == pytest.approx(ev["rsum"])
    out = capsys.readouterr().out
    assert "RR K=5, K'=3" in out
