import numpy as np
import pytest
import torch

from vlmatch import create_model
from vlmatch.data.vocab import Vocab
from vlmatch.errors import VlmatchError
from vlmatch.viz.attention import pair_attention


@pytest.mark.parametrize("name,axis", [("scan_t2i_avg", 0), ("scan_i2t_lse", 1)])
def test_pair_attention_matches_block_attention(name, axis):
    vocab = Vocab.build(["a red dog and a blue car"], 1)
    torch.manual_seed(0)
    m = create_model(name, img_dim=6, embed_dim=8, word_dim=4, vocab_size=len(vocab))
    m.vocab = vocab
    feats = np.random.default_rng(0).normal(size=(5, 6))
    pa = pair_attention(m, feats, "A red dog and a blue car")
    assert pa.words[1:3] == ["a", "red"] and pa.weights.shape == (5, 9)
    np.testing.assert_allclose(pa.weights.sum(axis=axis), 1.0, rtol=1e-5)
    with torch.no_grad():
        s = m(torch.tensor(feats, dtype=torch.float32)[None], None, torch.tensor([vocab.encode("a red dog and a blue car")]),
              torch.tensor([9]))
    assert pa.score == pytest.approx(float(s[0, 0]), abs=1e-6)


def test_pair_attention_needs_vocab_and_an_attention_model():
    with pytest.raises(VlmatchError, match="no vocabulary"):
        pair_attention(create_model("scan_t2i_avg", img_dim=4, embed_dim=4, word_dim=4, vocab_size=8),
                       np.zeros((2, 4)), "x")
    m = create_model("vsepp", img_dim=4, embed_dim=4, word_dim=4, vocab_size=8)
    m.vocab = Vocab()
    with pytest.raises(VlmatchError, match="no word-region attention"):
        pair_attention(m, np.zeros((2, 4)), "x")


def test_caan_pair_attention_is_the_weight_of_each_region_word_term():
    vocab = Vocab.build(["a red dog and a blue car"], 1)
    torch.manual_seed(0)
    m = create_model("caan", img_dim=6, embed_dim=8, word_dim=4, vocab_size=len(vocab), attn_dim=5)
    m.vocab = vocab
    feats = np.random.default_rng(0).normal(size=(5, 6))
    pa = pair_attention(m, feats, "a red dog and a blue car")
    assert pa.axis == "pair" and pa.weights.shape == (5, 9)
    f, g = np.asarray(pa.extra["region_weights"]), np.asarray(pa.extra["word_weights"])
    np.testing.assert_allclose(pa.weights, np.outer(f, g), rtol=1e-6)
    np.testing.assert_allclose(pa.weights.sum(), 1.0, rtol=1e-5)
    with torch.no_grad():
        img = m.encode_images(torch.tensor(feats, dtype=torch.float32)[None])
        txt = m.encode_texts(*m.tokenize(["a red dog and a blue car"]))
        f_all, g_all = m.attention(img, txt)
        # the score is fᵀ (V Uᵀ) g over the norms: the weights reproduce its numerator
        v, u = img.regions[0].double(), txt.words[0].double()
        num = float((torch.as_tensor(pa.weights, dtype=torch.float64) * (v @ u.T)).sum())
        vh, uh = v.T @ torch.as_tensor(f, dtype=torch.float64), u.T @ torch.as_tensor(g, dtype=torch.float64)
    np.testing.assert_allclose(f, f_all[0, :, 0].numpy(), rtol=1e-6)
    np.testing.assert_allclose(g, g_all[0, 0].numpy(), rtol=1e-6)
    assert pa.score == pytest.approx(num / float(vh.norm() * uh.norm()), abs=1e-5)
