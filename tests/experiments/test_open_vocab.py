"""experiments/open_vocab.py's pure parts: ranks and recalls, the bootstrap, the Platt fit, the held-out concepts
(the recipe excludes exactly their words), and the two-thing queries."""

import numpy as np

from tests.benchmark_scripts import load_script
from vlmatch_lab.recipes import read_recipe

ov = load_script("open_vocab", "open_vocab_under_test")


def test_ranks_count_every_photo_scored_above_the_captions_own():
    S = np.array([[0.9, 0.1], [0.5, 0.8], [0.95, 0.2]])  # 3 photos x 2 captions, one caption per photo here
    assert ov.t2i_ranks(S, per_image=1).tolist() == [1, 0]
    s, r1, r5, r10 = ov.rsum_t2i(np.array([0, 3, 12, 7]))
    assert (r1, r5, r10) == (25.0, 50.0, 75.0) and s == 150.0


def test_zscore_standardises_each_query_over_the_photos():
    z = ov.zscore(np.random.default_rng(0).normal(3, 2, (50, 4)))
    assert np.allclose(z.mean(0), 0, atol=1e-9) and np.allclose(z.std(0), 1, atol=1e-6)


def test_platt_fit_recovers_a_logistic_law():
    g = np.random.default_rng(1)
    x = g.normal(0, 1, 20000)
    y = (g.random(20000) < 1 / (1 + np.exp(-(3.0 * x - 1.0)))).astype(float)
    a, b = ov.platt_fit(x, y)
    assert abs(a - 3.0) < 0.2 and abs(b + 1.0) < 0.1


def test_the_recipe_holds_out_exactly_the_protocols_concept_words():
    cfg, _ = read_recipe(ov.HELDOUT_RECIPE)
    assert sorted(cfg["data"]["exclude_words"]) == sorted(w for ws in ov.CONCEPTS.values() for w in ws)
    assert len(ov.CONCEPTS) >= 10


def test_bootstrap_interval_holds_the_figure():
    ranks = np.random.default_rng(2).integers(0, 30, 500)
    lo, hi = ov.bootstrap(ranks, np.arange(500) // 5, n=300)
    assert lo <= ov.rsum_t2i(ranks)[0] <= hi


def test_rare_share_counts_words_training_never_used():
    assert np.allclose(ov.rare_share(["a dog eats pizza", "the"], {"dog", "eats"}), [1 / 3, 0.0])


def test_reliability_bins_hold_every_pair_once():
    g = np.random.default_rng(3)
    p = g.random(1000)
    y = g.random(1000) < p
    bins = ov.reliability(p, y)
    assert sum(b["pairs"] for b in bins) == 1000 and len(bins) == 10
    assert all(abs(b["predicted"] - b["observed"]) < 0.15 for b in bins)  # a calibrated predictor


def test_isotonic_fit_is_increasing_and_reads_the_rates():
    g = np.random.default_rng(4)
    x = g.normal(0, 1, 50000)
    y = (g.random(50000) < 1 / (1 + np.exp(-(4 * x - 6)))).astype(float)
    kx, ky = ov.isotonic_fit(x, y, per_bin=50)
    assert kx == sorted(kx) and ky == sorted(ky)
    assert abs(float(ov.isotonic_apply((kx, ky), np.array([2.0]))[0]) - 1 / (1 + np.exp(-2.0))) < 0.1
