import pytest
import torch

from vlmatch import create_model
from vlmatch.errors import ConfigError
from vlmatch.models.attention import RAW_FEATURE_NORMS

from .reference import scan_alpha, scan_pair, score_matrix, summax_pair

VOCAB = 30


def _inputs(seed=0, n_img=3, n_txt=4, k=5, img_dim=12, with_mask=True):
    g = torch.Generator().manual_seed(seed)
    feats = torch.randn(n_img, k, img_dim, generator=g)
    mask = torch.ones(n_img, k, dtype=torch.bool)
    if with_mask:
        mask[1, 3:] = False  # image 1 has only 3 regions
    lengths = torch.tensor([6, 2, 4, 1][:n_txt])
    tokens = torch.randint(1, VOCAB, (n_txt, 6), generator=g)
    for i, n in enumerate(lengths):
        tokens[i, n:] = 0
    return feats, (mask if with_mask else None), tokens, lengths


def _model(name, **kw):
    torch.manual_seed(0)
    return create_model(name, img_dim=12, embed_dim=8, word_dim=7, vocab_size=VOCAB, **kw).double()


@pytest.mark.parametrize("direction", ["t2i", "i2t"])
@pytest.mark.parametrize("agg", ["avg", "lse", "sum", "max"])
@pytest.mark.parametrize("norm", RAW_FEATURE_NORMS)
def test_scan_score_equals_loop_reference(direction, agg, norm):
    name = f"scan_{direction}_{'lse' if agg == 'lse' else 'avg'}"
    model = _model(name, agg=agg, raw_feature_norm=norm)
    feats, mask, tokens, lengths = _inputs()
    with torch.no_grad():
        img = model.encode_images(feats.double(), mask)
        txt = model.encode_texts(tokens, lengths)
        got = model.score(img, txt)
    c = model.cfg
    want = score_matrix(lambda v, e: scan_pair(v, e, direction, norm, c.lambda_softmax, agg, c.lambda_lse), img, txt)
    assert got.shape == (3, 4)
    torch.testing.assert_close(got, want, atol=1e-5, rtol=0)


@pytest.mark.parametrize("agg", ["avg", "lse"])
def test_one_query_against_many_regions_equals_loop_reference(agg):
    """t-i with fewer words than regions (one query re-scoring its candidates) forms each attended
    vector a_j itself instead of going through the per-image Gram matrix (the path the test above
    takes, with 5 regions against 24 words): the same scores."""
    model = _model(f"scan_t2i_{agg}", agg=agg)
    feats, _, tokens, lengths = _inputs(seed=3, n_img=4, k=20)
    mask = torch.ones(4, 20, dtype=torch.bool)
    mask[2, 11:] = False
    with torch.no_grad():
        img = model.encode_images(feats.double(), mask)
        one = model.encode_texts(tokens[:1], lengths[:1])  # 6 words against 20 regions: a_j directly
        batch = model.encode_texts(tokens, lengths)
        got_one, got_batch = model.score(img, one), model.score(img, batch)
    c = model.cfg
    want = score_matrix(lambda v, e: scan_pair(v, e, "t2i", c.raw_feature_norm, c.lambda_softmax, agg, c.lambda_lse),
                        img, batch)
    torch.testing.assert_close(got_one, want[:, :1], atol=1e-10, rtol=0)
    torch.testing.assert_close(got_batch, want, atol=1e-10, rtol=0)


@pytest.mark.parametrize("direction", ["t2i", "i2t"])
def test_summax_equals_loop_reference(direction):
    model = _model(f"summax_{direction}")
    feats, mask, tokens, lengths = _inputs(seed=1)
    with torch.no_grad():
        img = model.encode_images(feats.double(), mask)
        txt = model.encode_texts(tokens, lengths)
        got = model.score(img, txt)
    want = score_matrix(lambda v, e: summax_pair(v, e, direction), img, txt)
    torch.testing.assert_close(got, want, atol=1e-5, rtol=0)


@pytest.mark.parametrize("name", ["scan_t2i_avg", "scan_i2t_lse"])
def test_no_norm_ablations_still_exact(name):
    model = _model(name, no_imgnorm=True, precomp_enc_type="weight_norm")
    feats, mask, tokens, lengths = _inputs(seed=2)
    with torch.no_grad():
        img = model.encode_images(feats.double(), mask)
        txt = model.encode_texts(tokens, lengths)
        got = model.score(img, txt)
    c = model.cfg
    want = score_matrix(lambda v, e: scan_pair(v, e, c.direction, c.raw_feature_norm, c.lambda_softmax, c.agg,
                                               c.lambda_lse), img, txt)
    torch.testing.assert_close(got, want, atol=1e-5, rtol=0)


def test_padding_and_block_split_do_not_change_scores():
    """Extra padding columns and scoring in sub-blocks give the same numbers."""
    model = _model("scan_t2i_lse")
    feats, mask, tokens, lengths = _inputs(seed=3)
    with torch.no_grad():
        img = model.encode_images(feats.double(), mask)
        txt = model.encode_texts(torch.nn.functional.pad(tokens, (0, 4)), lengths)
        full = model.score(img, txt)
        parts = torch.cat([model.score(img.select(slice(0, 1)), txt), model.score(img.select(slice(1, 3)), txt)])
        single = model.score(img.select(slice(2, 3)), txt.select(slice(1, 2)))
    torch.testing.assert_close(full, parts)
    assert single.shape == (1, 1)
    torch.testing.assert_close(single[0, 0], full[2, 1])


@pytest.mark.parametrize("name", ["scan_t2i_avg", "scan_t2i_lse", "scan_i2t_avg", "scan_i2t_lse",
                                  "summax_t2i", "summax_i2t"])
def test_gradients_reach_every_parameter(name):
    model = _model(name).float()
    feats, mask, tokens, lengths = _inputs(seed=4)
    scores = model(feats, mask, tokens, lengths)
    from vlmatch.models.losses import hinge_triplet
    hinge_triplet(scores[:, :3], margin=0.2).backward()
    for pname, p in model.named_parameters():
        assert p.grad is not None and torch.isfinite(p.grad).all(), pname
        assert p.grad.abs().sum() > 0, f"no gradient reaches {pname}"


def test_attention_weights_sum_to_one_over_the_attended_axis():
    for name, axis in (("scan_t2i_avg", 1), ("scan_i2t_avg", 3)):
        model = _model(name)
        feats, mask, tokens, lengths = _inputs(seed=5)
        with torch.no_grad():
            att = model.attention(model.encode_images(feats.double(), mask), model.encode_texts(tokens, lengths))
        s = att.sum(dim=axis)
        if axis == 1:
            valid = (torch.arange(att.shape[3])[None, None, :] < lengths[None, :, None]).expand_as(s)
            torch.testing.assert_close(s[valid], torch.ones_like(s[valid]))
            assert (att[1, 3:] == 0).all()  # absent regions get no weight
        else:
            torch.testing.assert_close(s, torch.ones_like(s))


@pytest.mark.parametrize("kind", ["l2", "batchnorm"])
def test_feature_norm_normalises_regions_before_the_projection(kind):
    model = _model("scan_t2i_avg", feature_norm=kind)
    feats, mask, _, _ = _inputs(seed=5)
    feats = feats.double() * 7 + 3
    model.train()
    with torch.no_grad():
        got = model.encode_images(feats, mask).regions
        valid = feats[mask]
        if kind == "l2":
            x = feats / (feats.norm(dim=-1, keepdim=True) + 1e-8)
        else:  # batch statistics over the valid regions only (biased variance, as BatchNorm trains)
            x = (feats - valid.mean(0)) / torch.sqrt(valid.var(0, unbiased=False) + model.feat_bn.eps)
        v = model.img_enc(x)
        want = v / (v.norm(dim=-1, keepdim=True) + 1e-8)
    torch.testing.assert_close(got[mask], want[mask], atol=1e-10, rtol=0)
    if kind == "batchnorm":
        torch.testing.assert_close(model.feat_bn.running_mean, 0.1 * valid.mean(0))


def test_feature_norm_rejects_unknown_kinds():
    with pytest.raises(ConfigError, match="feature_norm must be one of none, l2, batchnorm"):
        _model("scan_t2i_avg", feature_norm="zscore")


@pytest.mark.parametrize("direction", ["t2i", "i2t"])
def test_position_attention_is_each_pairs_alpha_against_the_loop_reference(direction):
    """The batched diagonal attention the grounding objective trains is eq. 1-3 (t-i) / 6-7 (i-t) of each pair (image
    b, caption b), the same weights ``pair_attention`` shows, zero on absent regions and padded words."""
    model = _model(f"scan_{direction}_avg")
    feats, mask, tokens, lengths = _inputs(n_img=4, n_txt=4)
    feats = feats.double()
    got = model.position_attention(feats, mask, tokens, lengths)
    assert got.shape == (4, 5, 6)
    c = model.cfg
    with torch.no_grad():
        img, txt = model.encode_images(feats, mask), model.encode_texts(tokens, lengths)
    for b in range(4):
        k, n = int(mask[b].sum()), int(lengths[b])
        want = torch.tensor(scan_alpha(img.regions[b, :k], txt.words[b, :n], direction, c.raw_feature_norm,
                                       c.lambda_softmax), dtype=torch.float64)
        torch.testing.assert_close(got[b, :k, :n].detach(), want, atol=1e-9, rtol=0)
        assert (got[b, k:] == 0).all() and (got[b, :, n:] == 0).all()
        shown = model.pair_attention(img.select([b]), txt.select([b]))["weights"]
        torch.testing.assert_close(got[b, :k, :n].detach().float(), torch.as_tensor(shown[:k]), atol=1e-6, rtol=0)
    # differentiable: a loss on the maps reaches the image projection and the text encoder
    (got[:, 0, 0] * torch.arange(1.0, 5.0, dtype=torch.float64)).sum().backward()
    assert model.img_enc.fc.weight.grad.abs().sum() > 0
    assert any(p.grad is not None and p.grad.abs().sum() > 0 for p in model.txt_enc.parameters())


def test_summax_has_no_attention_to_train():
    from vlmatch.errors import VlmatchError

    model = _model("scan_t2i_avg", method="summax")
    feats, mask, tokens, lengths = _inputs()
    with pytest.raises(VlmatchError, match="no attention"):
        model.position_attention(feats.double(), mask, tokens[:3], lengths[:3])
