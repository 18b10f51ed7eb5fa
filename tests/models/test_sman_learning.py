"""SMAN learns on the toy world, through the shared trainer with its own objective (hinge triplet +
intra-pair term), far above chance; the paper's inference score (concatenation) ranks above chance."""

import pytest

from vlmatch import load_model
from vlmatch.data.precomp import PrecompSplit
from vlmatch.evaluation.metrics import evaluate_protocol
from vlmatch.evaluation.scoring import model_scores
from vlmatch.training.config import load_config
from vlmatch.training.loop import train

CHANCE_RSUM = 24.0  # R@1/5/10 = 1/200, 5/200, 10/200 in % in both directions


@pytest.mark.slow
@pytest.mark.parametrize("name", ["sman", "sman_im"])
def test_sman_learns_far_above_chance(small_world, tmp_path, name):
    cfg = load_config(None, extra={
        "model": {"name": name, "embed_dim": 64, "word_dim": 32, "attn_dim": 32, "dropout": 0.1, "score_mode": "sum"},
        "data": {"path": str(small_world), "val_max_images": 200, "min_word_count": 1},
        "train": {"epochs": 4, "batch_size": 64, "lr": 1e-3, "lr_update": 4, "log_every": 50,
                  "warmup_epochs": 1}})
    best = train(cfg, tmp_path / "run", progress=False)
    assert best["rsum"] > 4 * CHANCE_RSUM, best
    assert best["i2t_r10"] > 15 and best["t2i_r10"] > 15, best
    model = load_model(tmp_path / "run" / "best")
    model.cfg.score_mode = "concat"
    sims = model_scores(model, PrecompSplit(small_world, "dev", max_images=200), progress=False)
    concat = evaluate_protocol(sims, "single")
    # the paper's inference score ranks above chance, but well below the trained score d here (measured,
    # the default eq. 22 reading per_level: sman rsum 139.6 with d, 78.8 with the concatenation, whose cosine
    # weights each level by its norm; sman_im 229.3 / 179.2; with intra_scale sum, sman 160.8 / 66.3 on the
    # same host and 174.5 / 68.3 on another -- see experiments/results/flickr8k.md for real images)
    assert concat["rsum"] > 2 * CHANCE_RSUM, (concat, best)
