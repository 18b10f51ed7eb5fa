"""CAAN's no-autograd block scoring (vlmatch.models.caan_block): float32 against the loop-by-loop equations,
the sub-blocks against the whole block, and the reused buffers across calls of other shapes."""

import pytest
import torch

from vlmatch import create_model
from vlmatch.models import caan_block

from .reference import caan_pair, score_matrix
from .test_caan import VARIANTS
from .test_scan import VOCAB, _inputs


def _model(name, **kw):
    torch.manual_seed(0)
    return create_model(name, img_dim=12, embed_dim=8, word_dim=7, vocab_size=VOCAB, attn_dim=5, **kw).eval()


@pytest.mark.parametrize(("sub_pairs", "gemm_pairs"), [(1, 1), (3, 7), (128, 512)])
@pytest.mark.parametrize("name", VARIANTS)
def test_float32_block_scoring_equals_loop_reference(name, sub_pairs, gemm_pairs, monkeypatch):
    """Every variant, float32, sub-blocks of one pair, of three (split over captions and images) and the whole
    block, with region-word GEMMs of one pair, of a few sub-blocks and of the whole block: within 1e-5 of the
    paper's equations computed one pair at a time in float64."""
    monkeypatch.setattr(caan_block, "SUB_PAIRS", sub_pairs)
    monkeypatch.setattr(caan_block, "GEMM_PAIRS", gemm_pairs)
    model = _model(name)
    feats, mask, tokens, lengths = _inputs(seed=11)
    with torch.no_grad():
        img = model.encode_images(feats, mask)
        txt = model.encode_texts(tokens, lengths)
        got = model.score(img, txt)
    assert got.dtype == torch.float32
    want = score_matrix(lambda v, e: caan_pair(model.double(), v, e), img, txt)
    torch.testing.assert_close(got.double(), want, atol=1e-5, rtol=0)


@pytest.mark.parametrize("name", ["caan", "caan_ia", "caan_sa", "caan_ia_fa"])
def test_block_path_equals_autograd_path(name, monkeypatch):
    """The sub-blocked, buffer-reusing form (no autograd) and the training form give the same scores; a second
    call at another block shape (buffers reused and resized) changes nothing."""
    monkeypatch.setattr(caan_block, "SUB_PAIRS", 5)
    monkeypatch.setattr(caan_block, "GEMM_PAIRS", 12)
    model = _model(name)
    feats, mask, tokens, lengths = _inputs(seed=12)
    img = model.encode_images(feats, mask)
    txt = model.encode_texts(tokens, lengths)
    want = model.score(img, txt).detach()
    with torch.no_grad():
        first = model.score(img, txt)
        model.score(img.select(slice(0, 1)), txt.select(slice(1, 3)))  # another shape in the same buffers
        again = model.score(img, txt)
    torch.testing.assert_close(first, want, atol=1e-6, rtol=0)
    assert torch.equal(first, again)
