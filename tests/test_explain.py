import numpy as np
import pytest
import torch

from vlmatch import create_model
from vlmatch.data.vocab import Vocab
from vlmatch.errors import VlmatchError
from vlmatch.explain import pair_attention


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
