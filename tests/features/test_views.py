"""A photo's views for the backbone: its mirror image's pixels and features, read from the file as displayed."""

import numpy as np
import pytest
import torch

from vlmatch.errors import DataError
from vlmatch.features.photo import load_image
from vlmatch.features.views import mirror_pixels, photo_features

from ..search.photo_index import draw_photos

pytest.importorskip("efficientnet_lite_pytorch")


def test_mirror_pixels_reverses_the_columns():
    px = np.arange(2 * 3 * 3, dtype=np.uint8).reshape(2, 3, 3)
    m = mirror_pixels(px)
    assert m.flags["C_CONTIGUOUS"] and np.array_equal(m[:, 0], px[:, 2]) and np.array_equal(m[:, ::-1], px)


def test_photo_features_of_the_mirror_view_are_the_backbone_s_of_the_mirrored_photo(tmp_path):
    from vlmatch.features.backbones import create_backbone

    bb = create_backbone("efficientnet-lite0", input_size=64)
    paths = sorted(draw_photos(tmp_path / "p", 3).iterdir())
    photo = photo_features(bb, paths, batch_size=2)
    mirror = photo_features(bb, paths, mirror=True, batch_size=2)
    assert photo.shape == mirror.shape == (3, 4, 1280) and photo.dtype == np.float32
    with torch.inference_mode():
        by_hand = bb(bb.preprocess([load_image(p, 64)[:, ::-1].copy() for p in paths])).numpy()
    np.testing.assert_allclose(mirror, by_hand, rtol=1e-5, atol=1e-5)
    assert not np.allclose(mirror, photo, atol=1e-3)  # the drawn photos are not mirror-symmetric
    assert photo_features(bb, []).shape == (0, 4, 1280)
    with pytest.raises(DataError, match="gone.jpg: image not found"):
        photo_features(bb, [tmp_path / "gone.jpg"])
