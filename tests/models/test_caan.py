import pytest
import torch

from vlmatch import create_model
from vlmatch.models.losses import hinge_triplet

from .reference import caan_pair, score_matrix
from .test_scan import VOCAB, _inputs

VARIANTS = ["caan_baseline", "caan_ia", "caan_fa", "caan_sa", "caan_ia_fa", "caan"]


def _model(name, **kw):
    torch.manual_seed(0)
    return create_model(name, img_dim=12, embed_dim=8, word_dim=7, vocab_size=VOCAB, attn_dim=5, **kw).double()


@pytest.mark.parametrize("norm_output", [True, False])
@pytest.mark.parametrize("name", VARIANTS)
def test_caan_score_equals_loop_reference(name, norm_output):
    model = _model(name, norm_output=norm_output)
    feats, mask, tokens, lengths = _inputs(seed=7)
    with torch.no_grad():
        img = model.encode_images(feats.double(), mask)
        txt = model.encode_texts(tokens, lengths)
        got = model.score(img, txt)
    want = score_matrix(lambda v, e: caan_pair(model, v, e), img, txt)
    torch.testing.assert_close(got, want, atol=1e-5, rtol=0)


@pytest.mark.parametrize("name", VARIANTS)
def test_caan_blocks_and_padding_are_consistent(name):
    model = _model(name)
    feats, mask, tokens, lengths = _inputs(seed=8)
    with torch.no_grad():
        img = model.encode_images(feats.double(), mask)
        txt = model.encode_texts(torch.nn.functional.pad(tokens, (0, 3)), lengths)
        full = model.score(img, txt)
        part = model.score(img.select(slice(1, 2)), txt.select(slice(2, 4)))
    torch.testing.assert_close(part, full[1:2, 2:4])


@pytest.mark.parametrize("name", VARIANTS)
def test_caan_gradients_reach_every_parameter(name):
    model = _model(name).float()
    feats, mask, tokens, lengths = _inputs(seed=9)
    hinge_triplet(model(feats, mask, tokens, lengths)[:, :3]).backward()
    for pname, p in model.named_parameters():
        assert p.grad is not None and torch.isfinite(p.grad).all(), pname
        assert p.grad.abs().sum() > 0, f"no gradient reaches {pname}"
