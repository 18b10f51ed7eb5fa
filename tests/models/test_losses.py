"""The hinge triplet loss against its definition, written with explicit loops."""

import pytest
import torch

from vlmatch.models.losses import hinge_triplet


def plain(scores, margin, max_violation, ids=None):
    n = len(scores)
    ids = list(range(n)) if ids is None else ids
    total = 0.0
    for i in range(n):  # image i as query: its captions j != i are negatives (unless same image)
        costs = [max(0.0, margin + float(scores[i, j]) - float(scores[i, i])) for j in range(n) if ids[j] != ids[i]]
        total += (max(costs) if costs else 0.0) if max_violation else sum(costs)
    for j in range(n):  # caption j as query
        costs = [max(0.0, margin + float(scores[i, j]) - float(scores[j, j])) for i in range(n) if ids[i] != ids[j]]
        total += (max(costs) if costs else 0.0) if max_violation else sum(costs)
    return total


@pytest.mark.parametrize("max_violation", [False, True])
@pytest.mark.parametrize("ids", [None, [0, 1, 0, 2, 3, 1]])
def test_hinge_matches_definition(max_violation, ids):
    s = torch.randn(6, 6, generator=torch.Generator().manual_seed(0))
    got = hinge_triplet(s, 0.2, max_violation, None if ids is None else torch.tensor(ids))
    assert float(got) == pytest.approx(plain(s, 0.2, max_violation, ids), rel=1e-6)


def test_perfect_separation_costs_nothing_and_collapse_costs_2_b_margin():
    assert float(hinge_triplet(torch.eye(4) * 5, 0.2, True)) == 0.0
    assert float(hinge_triplet(torch.zeros(4, 4), 0.2, True)) == pytest.approx(2 * 4 * 0.2)


def test_non_square_is_rejected():
    with pytest.raises(ValueError, match="square"):
        hinge_triplet(torch.zeros(2, 3))
