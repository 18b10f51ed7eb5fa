"""The pointing figures' noise (bootstrap over images) and the cross-fitted choice, against direct computations."""

import numpy as np
import pytest

from vlmatch.evaluation.pointing_stats import bootstrap_interval, crossfit_choice, half_of


def _result(hits, phrases, names=None):
    names = names or [f"img{i}.jpg" for i in range(len(hits))]
    return {"pointing": round(100.0 * sum(hits) / sum(phrases), 2),
            "per_image": {"names": names, "hits": list(hits), "phrases": list(phrases)}}


def test_the_interval_holds_the_figure_and_narrows_with_more_images():
    rng = np.random.default_rng(3)
    small = _result(rng.integers(0, 4, 50).tolist(), [4] * 50)
    big = _result(rng.integers(0, 4, 2000).tolist(), [4] * 2000)
    for r in (small, big):
        lo, hi = bootstrap_interval(r)
        assert lo < r["pointing"] < hi
    assert np.subtract(*bootstrap_interval(big)[::-1]) < np.subtract(*bootstrap_interval(small)[::-1]) / 3
    assert bootstrap_interval(small) == bootstrap_interval(small)  # seeded: the same on every call


def test_all_hits_give_a_point_interval_and_old_results_are_named():
    assert bootstrap_interval(_result([3, 2], [3, 2])) == (100.0, 100.0)
    with pytest.raises(ValueError, match="no per_image counts"):
        bootstrap_interval({"row": "old", "pointing": 50.0})


def test_the_halves_are_fixed_by_name_and_roughly_even():
    names = [f"{i}.jpg" for i in range(1000)]
    halves = [half_of(n) for n in names]
    assert halves == [half_of(n) for n in names] and 400 < sum(halves) < 600


def test_crossfitting_reports_each_pick_on_the_other_half():
    names = [f"{i}.jpg" for i in range(400)]
    side = np.array([half_of(n) for n in names])
    # run a is perfect on half 0 and useless on half 1; run b the reverse; run c is 60 % everywhere
    a = _result(np.where(side == 0, 5, 0).tolist(), [5] * 400, names)
    b = _result(np.where(side == 1, 5, 0).tolist(), [5] * 400, names)
    c = _result([3] * 400, [5] * 400, names)
    out = crossfit_choice({"a": a, "b": b, "c": c})
    assert out["picks"]["picked_on_0"] == {"run": "a", "reported_on_other": 0.0}
    assert out["picks"]["picked_on_1"] == {"run": "b", "reported_on_other": 0.0}
    assert out["pointing"] == 0.0  # the honest figure of picking by val: the selection did not generalise
    # a joint score can prefer the steady run
    joint = crossfit_choice({"a": a, "b": b, "c": c}, score=lambda k, acc: acc + (100 if k == "c" else 0))
    assert joint["pointing"] == 60.0 and joint["chosen_on_all"]["run"] == "c"


def test_runs_over_other_images_are_refused():
    with pytest.raises(ValueError, match="different images"):
        crossfit_choice({"a": _result([1], [1], ["x.jpg"]), "b": _result([1], [1], ["y.jpg"])})
