"""The pointing game: a map that points right scores 100 %, the centre what geometry says, on a grid world
whose objects' cells are known; the peak, the cell centres and the table."""

import numpy as np
import pytest

from vlmatch.errors import ConfigError
from vlmatch.evaluation.grounding import cell_centres, format_grounding, peak, pointing_game

from .gridworld import GRID, H, OracleModel, W, make_gridworld


@pytest.fixture
def world(tmp_path):
    return make_gridworld(tmp_path / "entities"), tmp_path / "entities"


@pytest.mark.parametrize("method", ["contribution", "attention", "occlusion", "gradient"])
def test_a_map_that_points_right_scores_100(world, method):
    (feats, names, where), root = world
    res = pointing_game(OracleModel(), feats, names, root, method)
    assert res["pointing"] == 100.0
    # every image has 3 grounded phrases (chain 0 is never counted)
    assert res["phrases"] == 3 * len(names) and res["images"] == len(names)
    assert res["ceiling"] == 100.0  # every object fills one cell, whose centre is inside its box


def test_centre_and_caption_mean_are_what_geometry_says(world):
    (feats, names, where), root = world
    res = pointing_game(OracleModel(), feats, names, root, "contribution")
    centre_cell = (GRID * GRID) // 2
    # first caption names two objects (2 phrases), the second one (the first object is chain 0)
    expected_centre = sum((c[a] == centre_cell) + 2 * (c[b] == centre_cell)
                          for c, (a, b) in ((w, list(w)) for w in where))
    assert res["centre"] == pytest.approx(100.0 * expected_centre / res["phrases"], abs=0.01)
    # the caption's mean map peaks at one of its objects: right for that object's phrase, so between
    assert 0 < res["caption_mean"] < 100
    assert set(res["by_type"]) == {"animals", "other"}
    assert res["by_type"]["animals"]["phrases"] == len(names)


def test_a_map_that_points_wrong_scores_0(world):
    (feats, names, _), root = world

    class Contrary(OracleModel):
        def position_contributions(self, features, mask, tokens, lengths):
            return -super().position_contributions(features, mask, tokens, lengths)

    assert pointing_game(Contrary(), feats, names, root, "contribution")["pointing"] == 0.0


def test_geometry_helpers():
    c = cell_centres(3, W, H)
    assert c.shape == (9, 2) and tuple(c[0]) == (15.0, 10.0) and tuple(c[4]) == (45.0, 30.0)
    assert peak(np.array([0.1, 0.5, 0.5])) == 1 and peak(np.array([np.nan, np.nan])) == -1
    assert peak(np.array([np.nan, 2.0, 1.0])) == 1


def test_no_grid_or_no_phrase_is_one_line(world, tmp_path):
    (feats, names, _), root = world
    with pytest.raises(ConfigError, match="not a square grid"):
        pointing_game(OracleModel(), feats[:, :8], names, root, "occlusion")
    with pytest.raises(ConfigError, match="no phrase with a box"):
        pointing_game(OracleModel(), feats, [f"9{n}" for n in names], root, "occlusion")


def test_table_has_every_column(world):
    (feats, names, _), root = world
    res = pointing_game(OracleModel(), feats, names, root, "occlusion")
    table = format_grounding({"oracle occlusion": res})
    assert "pointing" in table.splitlines()[0] and "100.0" in table.splitlines()[1]
    for key in ("pointing", "centre", "caption_mean", "ceiling", "phrases", "by_type"):
        assert key in res


@pytest.mark.parametrize("method", ["contribution", "attention"])
def test_phrase_as_its_own_query(world, method):
    (feats, names, _), root = world
    res = pointing_game(OracleModel(), feats, names, root, method, phrase_as_query=True)
    assert res["pointing"] == 100.0 and res["phrases_as"] == "query"
    assert pointing_game(OracleModel(), feats, names, root, method)["phrases_as"] == "tokens"
