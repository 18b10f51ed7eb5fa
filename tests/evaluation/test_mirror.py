"""Mirror views of a heat map: the columns of a grid map reversed, the mean of two views, a text naming a side
kept on the photo's own map; in the pointing game and in ``explain_pair``."""

import numpy as np
import pytest

from vlmatch.errors import ConfigError
from vlmatch.evaluation.grounding import pointing_game
from vlmatch.evaluation.mirror import grid_of, merge_views, mirror_grid, names_a_side
from vlmatch.viz.attention import explain_pair

from . import gridworld
from .gridworld import GRID, OracleModel, make_gridworld


def test_mirror_grid_reverses_each_row_and_is_its_own_inverse():
    w = np.arange(9.0)
    assert mirror_grid(w, 3).tolist() == [2, 1, 0, 5, 4, 3, 8, 7, 6]
    m = np.random.default_rng(0).normal(size=(16, 5))  # (k, words): every column mirrored alike
    assert np.array_equal(mirror_grid(mirror_grid(m, 4), 4), m)
    assert np.array_equal(mirror_grid(m, 4)[:, 2], mirror_grid(m[:, 2], 4))
    with pytest.raises(ConfigError, match="not a 3 x 3 grid"):
        mirror_grid(np.zeros(8), 3)
    with pytest.raises(ConfigError, match="not a square grid"):
        grid_of(10)


def test_merge_views_is_the_mean_with_the_mirror_mirrored_back():
    rng = np.random.default_rng(1)
    photo, mirror = rng.normal(size=(9, 2)), rng.normal(size=(9, 2))
    merged = merge_views(photo, mirror, 3)
    assert np.allclose(merged[0], (photo[0] + mirror[2]) / 2) and np.allclose(merged[4], (photo[4] + mirror[4]) / 2)
    assert merge_views(photo, None, 3) is not None and np.array_equal(merge_views(photo, None, 3), photo)
    assert np.allclose(merge_views(photo, mirror_grid(photo, 3), 3), photo)  # a mirror-symmetric look: unchanged
    with pytest.raises(ConfigError, match="do not match"):
        merge_views(photo, mirror[:4], 3)


@pytest.mark.parametrize("text, side", [("the man on the left", True), ("Right hand", True), ("a leftover", False),
                                        ("a bright kite", False), ("alright then", False), ("left-handed", True)])
def test_names_a_side(text, side):
    assert names_a_side(text) is side


def _mirrored(feats):
    """The features a per-cell model would see in each image's mirror: the cells' columns reversed."""
    return np.stack([mirror_grid(f, GRID) for f in feats])


def test_pointing_with_an_exact_mirror_view_is_unchanged(tmp_path):
    feats, names, _ = make_gridworld(tmp_path / "e")
    alone = pointing_game(OracleModel(), feats, names, tmp_path / "e", "contribution")
    both = pointing_game(OracleModel(), feats, names, tmp_path / "e", "contribution", mirror_features=_mirrored(feats))
    assert alone["pointing"] == both["pointing"] == 100.0 and both["mirror"] and not alone["mirror"]


@pytest.mark.parametrize("method", ["contribution", "occlusion"])
def test_a_mirror_view_that_points_elsewhere_moves_the_peak(tmp_path, method):
    feats, names, where = make_gridworld(tmp_path / "e")
    decoy = np.zeros_like(feats)
    for i, objs in enumerate(where):  # in the mirror, each object shows 3x stronger in the cell of the other one
        (a, ca), (b, cb) = objs.items()
        for obj, cell in ((a, cb), (b, ca)):
            decoy[i, cell, gridworld.OBJECTS.index(obj)] = 3.0
    res = pointing_game(OracleModel(), feats, names, tmp_path / "e", method, mirror_features=_mirrored(decoy))
    assert res["pointing"] == 0.0  # the mean's peak is the decoy's: the mirror's map was used, mirrored back
    with pytest.raises(ConfigError, match="2 mirror views for 12 images"):
        pointing_game(OracleModel(), feats, names, tmp_path / "e", method, mirror_features=decoy[:2])


def test_explain_pair_averages_the_two_views_exactly(tmp_path):
    feats, _, _ = make_gridworld(tmp_path / "e", n_images=2)
    model = OracleModel()
    photo = explain_pair(model, feats[0], "a dog and a cat", "contribution", phrases=["a cat"])
    other = explain_pair(model, feats[1], "a dog and a cat", "contribution", phrases=["a cat"])
    both = explain_pair(model, feats[0], "a dog and a cat", "contribution", phrases=["a cat"],
                        mirror_features=feats[1])
    assert np.allclose(both.weights, (photo.weights + mirror_grid(other.weights, GRID)) / 2)
    assert both.score == pytest.approx(photo.score) and both.mirror_score == pytest.approx(other.score)
    assert both.to_dict()["mirrored"] and not photo.to_dict()["mirrored"] and "mirror_score" not in photo.to_dict()


@pytest.mark.parametrize("method", ["contribution", "occlusion"])
def test_a_text_that_names_a_side_keeps_the_photo_s_map(tmp_path, monkeypatch, method):
    monkeypatch.setattr(gridworld, "WORDS", gridworld.WORDS + ["left"])
    feats, _, _ = make_gridworld(tmp_path / "e", n_images=2)
    model = OracleModel()
    photo = explain_pair(model, feats[0], "a left dog and a cat", method, phrases=["a cat"])
    both = explain_pair(model, feats[0], "a left dog and a cat", method, phrases=["a cat"], mirror_features=feats[1])
    assert np.array_equal(both.weights, photo.weights) and both.mirror_score is None
