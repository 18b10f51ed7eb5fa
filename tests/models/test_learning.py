"""Learning on the toy world: every model learns far above chance, and word-region attention
(SCAN) clearly beats the global VSE++ baseline, which cannot bind attributes to objects.

Settings (D=128, lr 1e-3, one warm-up epoch summing over all negatives -- the whole run for CAAN --
then hardest negatives) were calibrated on this 600-image world; with hardest negatives from the first
step SCAN t-i stays near chance (rsum ~18), as DESIGN.md reports for Flickr8k.

Every run must end on a plateau far above what it asserts, not on a steep part of its curve: a short
run's trajectory hangs on the CPU's float code paths (AVX2 and AVX-512 hosts take other MKL / oneDNN /
SLEEF paths), and at lr 5e-4 SCAN t-i was still climbing 116 -> 207 -> 334 over its last epochs and
CAAN (two warm-up epochs) ended at 84 on an AVX2 host against ~345 on an AVX-512 one. The figures each
run reaches on both kinds of code path are in .ci/run's comments."""

import pytest

from vlmatch import load_model
from vlmatch.training.config import load_config
from vlmatch.training.loop import train

# Trains four models for 6 epochs each (minutes of CPU): out of the fast loop `pytest -m "not slow"`.
pytestmark = pytest.mark.slow

CHANCE_RSUM = 3 * (0.5 + 2.5 + 5.0)  # R@1/5/10 = 1/200, 5/200, 10/200 in % in both directions: 24


def _train(world, tmp_path_factory, name, warmup_epochs=1, **model):
    cfg = load_config(None, extra={
        "model": {"name": name, "embed_dim": 128, "word_dim": 32, **model},
        "data": {"path": str(world), "val_max_images": 200, "min_word_count": 1},
        "train": {"epochs": 6, "batch_size": 64, "lr": 1e-3, "lr_update": 6,
                  "log_every": 50, "warmup_epochs": warmup_epochs}})
    run = tmp_path_factory.mktemp(name)
    return train(cfg, run, progress=False), run


@pytest.fixture(scope="module")
def results(small_world, tmp_path_factory):
    out = {name: _train(small_world, tmp_path_factory, name) for name in ("vsepp", "scan_t2i_avg", "scan_i2t_avg")}
    # CAAN stalls when hardest negatives start after one warm-up epoch here (rsum ~84, and it varies run
    # to run); after two it reached ~345 on an AVX-512 host but 83.8 on an AVX2 one (the short run hangs on
    # the CPU's float code paths). Summed over all negatives for the whole run it climbs steadily.
    out["caan"] = _train(small_world, tmp_path_factory, "caan", warmup_epochs=6, attn_dim=32)
    return out


@pytest.mark.parametrize("name", ["vsepp", "scan_t2i_avg", "scan_i2t_avg", "caan"])
def test_every_model_learns_far_above_chance(results, name):
    best, run = results[name]
    assert best["rsum"] > 4 * CHANCE_RSUM, best
    assert best["i2t_r10"] > 15 and best["t2i_r10"] > 15, best  # chance: 5
    for f in ("config.yaml", "metrics.jsonl", "best/model.safetensors", "best/config.json", "best/vocab.json",
              "best/metrics.json", "last/optimizer.safetensors", "last/trainer_state.json"):
        assert (run / f).is_file(), f
    assert load_model(run / "best").name == name


@pytest.mark.parametrize("name", ["scan_t2i_avg", "scan_i2t_avg"])
def test_attention_clearly_beats_the_global_baseline(results, name):
    assert results[name][0]["rsum"] > results["vsepp"][0]["rsum"] + 100, {k: v[0]["rsum"] for k, v in results.items()}
