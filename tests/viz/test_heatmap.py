"""Heat maps: grid placement, box shading, one shared colour scale, PNG output."""

import numpy as np
import pytest

from vlmatch.errors import VlmatchError
from vlmatch.viz.attention import PairAttention
from vlmatch.viz.heatmap import render, word_maps


def att(weights, grid=None):
    w = np.asarray(weights, dtype=np.float32)
    return PairAttention([f"w{j}" for j in range(w.shape[1])], w, "regions", 0.5, grid=grid)


def test_grid_weights_land_on_their_cell():
    w = np.zeros((4, 2))
    w[1, 0] = 1.0  # word 0 -> row 0, column 1 (top right)
    w[2, 1] = 1.0  # word 1 -> row 1, column 0 (bottom left)
    maps = word_maps(att(w, grid=2), (40, 20))  # W=40, H=20
    assert maps.shape == (2, 20, 40)
    assert maps[0, :10, 20:].mean() > 3 * maps[0, 10:, :20].mean()
    assert maps[1, 10:, :20].mean() > 3 * maps[1, :10, 20:].mean()
    with pytest.raises(VlmatchError, match="not a square grid"):
        word_maps(att(np.ones((3, 2))), (8, 8))


def test_boxes_are_shaded_by_their_weight():
    w = np.array([[0.2, 0.9], [0.8, 0.1]])
    boxes = np.array([[0, 0, 10, 10], [5, 5, 20, 20]])
    maps = word_maps(att(w), (20, 20), boxes)
    assert maps[0, 2, 2] == pytest.approx(0.2) and maps[0, 15, 15] == pytest.approx(0.8)
    assert maps[0, 7, 7] == pytest.approx(0.8)  # overlap keeps the larger weight
    assert maps[1, 2, 2] == pytest.approx(0.9) and maps[1, 19, 0] == 0.0


@pytest.mark.slow  # seconds
def test_render_writes_a_png_with_one_panel_per_word(tmp_path):
    rgb = np.random.default_rng(0).integers(0, 255, (30, 40, 3), dtype=np.uint8)
    a = att(np.random.default_rng(1).dirichlet(np.ones(4), size=3).T, grid=2)
    png = render(a, rgb)
    assert png[:8] == b"\x89PNG\r\n\x1a\n"
    out = render(a, rgb, tmp_path / "h.png")
    assert out.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"


def test_content_words_at_the_photos_aspect_on_the_inferno_scale():
    """Special tokens never, function words on request; panels the photo's shape at 384 px; inferno colours."""
    from io import BytesIO

    from PIL import Image

    from vlmatch.viz.words import is_content, shown_columns

    words = ["[CLS]", "a", "dog", "on", "the", "beach", "[SEP]"]
    assert shown_columns(words) == [2, 5] and shown_columns(words, all_words=True) == [1, 2, 3, 4, 5]
    assert not is_content("<start>") and not is_content("The") and is_content("the dog")
    assert shown_columns(["[CLS]", "a", "[SEP]"]) == [1]  # nothing else to show: its words
    w = np.zeros((4, 7), dtype=np.float32)
    w[0, :] = 0.2
    w[0, 1] = 5.0  # "a" is hottest: with function words hidden, the scale is the shown words' own
    w[3, 2] = w[3, 5] = 1.0  # dog and beach: bottom right cell
    a = PairAttention(words, w, "regions", 0.5, grid=2)
    rgb = np.full((200, 400, 3), 128, dtype=np.uint8)  # landscape 2:1
    im = Image.open(BytesIO(render(a, rgb)))
    assert im.size == (798, 349)  # two panels of 384 x 192 (+ margins, words, title, colour bar)
    im_all = Image.open(BytesIO(render(a, rgb, all_words=True)))
    assert im_all.size == (1192, 573)  # five panels, three a row
    tall = Image.open(BytesIO(render(a, np.full((400, 200, 3), 128, dtype=np.uint8))))
    assert tall.size[1] > tall.size[0]  # a portrait photo stays portrait
    px = np.asarray(im.convert("RGB"), dtype=int)
    hot = px[45 + 170, 10 + 370]  # near the bottom right of the first panel: the top of the scale
    assert hot[0] > 200 and hot[1] > 200 and hot[2] < 170  # inferno's pale yellow, not jet's dark red
    cold = px[45 + 20, 10 + 20]
    assert cold[2] >= cold[1]  # inferno's dark purple over grey, not jet's blue-cyan


def test_each_word_on_its_own_scale_in_shares_of_its_part():
    """A cell's value is its share (%) of the word's positive total; by default each word's panel is on its own
    scale, so a word whose part is spread over the photo lights its top cell as brightly as a word whose part sits in
    one cell; with shared_scale its panel stays dim beside the other's."""
    from io import BytesIO

    from PIL import Image

    from vlmatch.viz.heatmap import cell_shares

    w = np.array([[0.0, 0.3], [0.05, 0.25], [0.05, 0.25], [0.9, 0.2]])  # "bike" in one cell, "riding" spread
    shares = cell_shares(w * np.array([1.0, 0.1]))  # whatever the size of each word's part
    np.testing.assert_allclose(shares.sum(axis=0), 100.0)
    np.testing.assert_allclose(shares[:, 1], [30.0, 25.0, 25.0, 20.0])
    signed = cell_shares(np.array([[2.0], [-1.0], [2.0]]))  # a negative cell takes from the word's part
    np.testing.assert_allclose(signed[:, 0], [50.0, -25.0, 50.0])
    a = PairAttention(["bike", "riding"], w, "score", 0.3, grid=2)
    rgb = np.full((100, 100, 3), 128, dtype=np.uint8)

    def top_cell(png):  # the top left cell of the second panel ("riding"'s top cell)
        px = np.asarray(Image.open(BytesIO(png)).convert("RGB"), dtype=int)
        return px[45 + 10, 10 + 100 + 10 + 10]

    own, shared = top_cell(render(a, rgb, display=100)), top_cell(render(a, rgb, display=100, shared_scale=True))
    assert own.sum() > shared.sum() + 150  # bright on its own scale, dim on the one the other word tops
