"""Search by photo on a Milvus index (milvus-lite): the same ranking and scores as the folder index of the same
photos (its stage-1 vectors made from the stored encodings, not read from stage1.npy)."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest

pytest.importorskip("milvus_lite")
pytestmark = pytest.mark.slow  # both tests open the folder index and its Milvus Lite copy: seconds

from vlmatch.errors import ConfigError  # noqa: E402
from vlmatch.search.backends.base import MilvusLocation  # noqa: E402
from vlmatch.search.build import build_index  # noqa: E402
from vlmatch.search.index import Index  # noqa: E402

from ..like_index import build_like_index  # noqa: E402


@pytest.fixture(scope="module")
def pair(tmp_path_factory):
    root = tmp_path_factory.mktemp("like_milvus")
    folder = build_like_index(root)
    loc = MilvusLocation(str(root / "m.db"), "like")
    build_index(loc, root / "vse", images=root / "photos", backbone="efficientnet-lite0", progress=False)
    return Index.open(folder, lean_queries=False), Index.open(milvus_uri=loc.uri, collection=loc.collection,
                                                               lean_queries=False)


def _same(a, b):
    assert [Path(h.path).name for h in a] == [Path(h.path).name for h in b]
    np.testing.assert_allclose([h.score for h in a], [h.score for h in b], atol=2e-3)
    np.testing.assert_allclose([h.stage1_score for h in a], [h.stage1_score for h in b], atol=2e-3)


def _id(idx, name):
    coll = idx.images
    for key in range(64):  # Milvus keys are the item ids
        if coll.key_of(key) is not None and Path(coll.items_of([coll.key_of(key)])[0]["path"]).name == name:
            return key
    raise AssertionError(name)


@pytest.mark.slow  # a Milvus Lite build
def test_like_on_milvus_equals_the_folder_index(pair):
    folder, milvus = pair
    n = len(folder)
    for name in ("photo_000.jpg", "photo_001.jpg", "photo_005.jpg"):
        _same(folder.search_like(_id(folder, name), k=n, candidates=n),
              milvus.search_like(_id(milvus, name), k=n, candidates=n))
    photo = folder.path_of(_id(folder, "photo_003.jpg"))
    _same(folder.search_like(photo, k=4), milvus.search_like(photo, k=4))
    _same(folder.search_like(_id(folder, "photo_002.jpg"), k=n, candidates=n, text="a red ball in the park"),
          milvus.search_like(_id(milvus, "photo_002.jpg"), k=n, candidates=n, text="a red ball in the park"))


def test_duplicates_needs_an_index_folder(pair):
    from vlmatch.search.library.duplicates import find_duplicates

    with pytest.raises(ConfigError, match="index folder"):
        find_duplicates(pair[1])
