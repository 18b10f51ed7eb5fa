"""An index built with a calibrated model: stage 1 ranks by the calibrated score itself, and search
(two-stage and exhaustive) gives the evaluation engine's calibrated ranking, in both directions."""

import numpy as np
import pytest
import torch

import vlmatch
from vlmatch.data.precomp import PrecompSplit
from vlmatch.evaluation.scoring import model_scores
from vlmatch.models.calibration import Calibration
from vlmatch.models.registry import load_model
from vlmatch.search.build import build_index


@pytest.fixture(scope="module")
def calibrated(toy_ckpts, small_world, tmp_path_factory):
    """The toy VSE++ with a calibration whose caption bank sits on a few test images (hubs to push down)."""
    root = tmp_path_factory.mktemp("cal")
    m = load_model(toy_ckpts["vsepp"])
    split = PrecompSplit(small_world, "test")
    with torch.no_grad():
        img = m.encode_images(torch.from_numpy(np.array(split.features[:20], np.float32))).embedding
        tokens, lengths = m.tokenize(PrecompSplit(small_world, "train").captions[:40])
        txt = m.encode_texts(tokens, lengths).embedding
    m.calibration = Calibration.fit(20.0, rank=32, text=img + 0.1 * torch.randn(img.shape), image=txt)
    m.save(root / "ckpt")
    out = root / "idx"
    build_index(out, root / "ckpt", features=small_world, split="test", dtype="float32", progress=False,
                captions=small_world / "test_caps.txt")
    return root / "ckpt", out


@pytest.mark.slow  # seconds
def test_search_ranks_by_the_calibrated_scores_of_the_engine(calibrated, toy_ckpts, small_world):
    ckpt, out = calibrated
    idx = vlmatch.Index.open(out)
    split = PrecompSplit(small_world, "test")
    sims = model_scores(load_model(ckpt), split, progress=False)
    raw = model_scores(load_model(toy_ckpts["vsepp"]), split, progress=False)
    moved = 0
    for j in (0, 7, 123, 301):
        order = np.lexsort((np.arange(split.n_images), -sims[:, j].astype(np.float64)))
        moved += order[:10].tolist() != np.argsort(-raw[:, j], kind="stable")[:10].tolist()
        full = idx.search(split.captions[j], k=len(idx), candidates=len(idx))
        assert [r.id for r in full] == order.tolist()
        np.testing.assert_allclose([r.score for r in full], sims[order, j], atol=1e-5)
        # stage 1 is the calibrated inner product: a small candidate list already holds the exhaustive top 10
        two = idx.search(split.captions[j], k=10, candidates=12)
        assert [r.id for r in two] == order[:10].tolist()
        np.testing.assert_allclose([r.stage1_score for r in two], [r.score for r in two], atol=1e-5)
    assert moved  # the calibration changed what comes back


def test_image_to_caption_search_uses_the_caption_offsets(calibrated, small_world):
    ckpt, out = calibrated
    idx = vlmatch.Index.open(out)
    split = PrecompSplit(small_world, "test")
    sims = model_scores(load_model(ckpt), split, progress=False)
    feats = np.asarray(split.features[3], np.float32)
    res = idx.search_image(feats, k=5, candidates=len(split.captions))
    want = np.lexsort((np.arange(sims.shape[1]), -sims[3].astype(np.float64)))[:5]
    assert [r.id for r in res] == want.tolist()
    np.testing.assert_allclose([r.score for r in res], sims[3, want], atol=1e-5)


def test_the_index_keeps_the_calibration_with_its_copy_of_the_model(calibrated):
    ckpt, out = calibrated
    idx = vlmatch.Index.open(out)
    assert idx.model.calibration is not None and idx.model.calibration.beta == 20.0
    assert (out / "model" / "calibration.safetensors").read_bytes() == (ckpt / "calibration.safetensors").read_bytes()


@pytest.mark.slow  # a Milvus Lite build beside the folder's
def test_a_milvus_index_of_the_calibrated_model_ranks_as_the_folder(calibrated, small_world, tmp_path):
    pytest.importorskip("milvus_lite")
    from vlmatch.search.backends.base import MilvusLocation
    from vlmatch.search.build import build_index

    ckpt, out = calibrated
    loc = MilvusLocation(str(tmp_path / "m.db"), "cal")
    build_index(loc, ckpt, features=small_world, split="test", dtype="float32", progress=False,
                 captions=small_world / "test_caps.txt")
    a, b = vlmatch.Index.open(out), vlmatch.Index.open(milvus_uri=loc.uri, collection="cal")
    assert b.model.calibration is not None and b.stage1_is_score
    b.images.take = None  # stage 1's scores are final: no encoding is fetched from Milvus
    for q in PrecompSplit(small_world, "test").captions[:5]:
        ra, rb = a.search(q, k=10, candidates=20), b.search(q, k=10, candidates=20)
        assert [r.id for r in ra] == [r.id for r in rb]
        np.testing.assert_allclose([r.score for r in ra], [r.score for r in rb], atol=1e-4)
        np.testing.assert_allclose([r.stage1_score for r in ra], [r.stage1_score for r in rb], atol=1e-4)
