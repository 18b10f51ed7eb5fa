"""experiments/relevance_signals.py's pure parts: a signal standardised over the photos, and the per-query AUC that
asks whether the top photo's signal tells a query with a match from one without."""

import numpy as np

from tests.benchmark_scripts import load_script

sig = load_script("relevance_signals", "relevance_signals_under_test")


def test_each_column_is_standardised_over_the_photos():
    s = np.array([[1.0, 10.0], [2.0, 10.0], [3.0, 40.0]])
    z = sig.standardised(s)
    assert np.allclose(z.mean(0), 0) and np.allclose(z.std(0), 1)
    assert z[2, 1] > z[0, 1] == z[1, 1]


def pairs_of(ranks_by_query):
    return [{"query": q, "rank": r} for q, ranks in enumerate(ranks_by_query) for r in ranks]


def test_top_photo_auc_counts_matched_and_unmatched_queries_and_skips_the_rest():
    # query 0: top photo matches; query 1: none of ranks 1, 2, 4 match; query 2: rank 2 matches (neither kind)
    pairs = pairs_of([[1, 2, 4, 10], [1, 2, 4, 10], [1, 2, 4, 10]])
    y = np.array([1, 0, 0, 0, 0, 0, 0, 1, 0, 1, 0, 0], bool)
    x = np.array([0.9, 0, 0, 0, 0.2, 0, 0, 0, 0.5, 0, 0, 0])
    got = sig.top_photo_auc(pairs, x, y)
    assert got == {"queries_top_match": 1, "queries_no_match_in_top4": 1, "auc": 1.0}
    x[0], x[4] = x[4], x[0]  # the unmatched query's top photo now scores higher: the signal is wrong
    assert sig.top_photo_auc(pairs, x, y)["auc"] == 0.0
