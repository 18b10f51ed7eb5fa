"""experiments/open_vocab_limits.py's pure parts: each query's rank, the best rule, the signals a weight may read."""

import numpy as np

from tests.benchmark_scripts import load_script

lim = load_script("open_vocab_limits", "open_vocab_limits_under_test")


def test_ranks_read_each_querys_own_photo_by_its_caption_index():
    # 3 photos; queries are captions 0 and 7 (photos 0 and 1: five captions per photo)
    S = np.array([[0.9, 0.1], [0.5, 0.8], [0.95, 0.2]])
    assert lim.ranks(S, np.array([0, 7])).tolist() == [1, 0]


def test_best_picks_the_highest_figure_with_its_rule():
    assert lim.best([(1.0, {"w": 1}), (3.0, {"w": 2}), (2.0, {"w": 3})]) == (3.0, {"w": 2})


def test_signals_are_standardised_over_the_queries_and_agreement_is_a_correlation():
    g = np.random.default_rng(0)
    zH = g.normal(size=(40, 30))
    zC = zH.copy()
    zC[:, :15] = g.normal(size=(40, 15))  # half the queries: the scorers agree exactly; the rest at random
    s = lim.signals(zH, zC, g.random(30))
    for v in s.values():
        assert np.isclose(v.mean(), 0, atol=1e-9) and np.isclose(v.std(), 1, atol=1e-6)
    assert s["agreement"][15:].min() > s["agreement"][:15].max()
