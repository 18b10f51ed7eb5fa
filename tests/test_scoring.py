"""The engine fills the same matrix as one direct ``score`` call, whatever the block plan."""

import numpy as np
import pytest
import torch

from vlmatch import create_model
from vlmatch.data.loaders import encode_captions, pad_tokens
from vlmatch.data.precomp import PrecompSplit
from vlmatch.data.vocab import Vocab
from vlmatch.scoring import BlockPlan, model_scores


@pytest.mark.parametrize("name", ["vsepp", "scan_t2i_lse", "scan_i2t_avg"])
@pytest.mark.parametrize("plan", [BlockPlan(7, 13), BlockPlan(200, 1000), None])
def test_engine_equals_direct_score(small_world, name, plan):
    sp = PrecompSplit(small_world, "test", max_images=40)
    vocab = Vocab.build(sp.captions, 1)
    torch.manual_seed(0)
    model = create_model(name, img_dim=sp.img_dim, embed_dim=16, word_dim=8, vocab_size=len(vocab))
    got = model_scores(model, sp, vocab, plan=plan, progress=False)
    tokens, lengths = pad_tokens(encode_captions(sp, vocab))
    with torch.no_grad():
        want = model.score(model.encode_images(torch.from_numpy(np.array(sp.features))),
                           model.encode_texts(tokens, lengths)).numpy()
    np.testing.assert_allclose(got, want, atol=1e-5)


def test_block_plan_respects_budget():
    m = create_model("scan_t2i_avg")
    p = BlockPlan.for_budget(m, 5000, 25000, 36, 12, budget=2**30)
    assert p.images * p.captions * m.bytes_per_pair(36, 12) <= 2**30
    assert p.images > 1 and p.captions > 1
