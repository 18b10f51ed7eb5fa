"""VSE++'s image-side options (VSE-infinity's pooling and MLP head) against loops over regions."""

import pytest
import torch

from vlmatch import load_model
from vlmatch.data.vocab import Vocab
from vlmatch.errors import VlmatchError
from vlmatch.evaluation.explainers import default_method, supports
from vlmatch.models.registry import create_model

KW = dict(img_dim=6, embed_dim=8, word_dim=4, vocab_size=10, text_pool="mean")


def _loop_image_vector(m, regions):
    """The image vector of one image (its existing regions only), region by region, dimension by dimension."""
    projected = []
    for v in regions:
        p = m.img_fc.fc.weight @ v + m.img_fc.fc.bias
        if m.img_mlp is not None:
            p = p + m.img_mlp(v)
        projected.append(p)
    if m.cfg.img_pool == "mean":
        pooled = sum(projected) / len(projected)
    elif m.cfg.img_pool == "max":
        pooled = torch.stack([max(p[d] for p in projected) for d in range(len(projected[0]))])
    else:
        theta = m.img_gpo.rank_weights(torch.tensor([len(projected)]), len(projected))[0]
        pooled = torch.stack([sum(t * x for t, x in zip(theta, sorted((p[d] for p in projected), reverse=True), strict=True))
                              for d in range(len(projected[0]))])
    return pooled / pooled.norm()


@pytest.mark.parametrize("pool", ["mean", "max", "gpo"])
@pytest.mark.parametrize("mlp", [False, True])
def test_the_image_vector_is_the_pooled_projection_of_each_existing_region(pool, mlp):
    torch.manual_seed(0)
    m = create_model("vsepp", img_pool=pool, img_mlp=mlp, **KW).double().eval()
    feats = torch.randn(3, 5, 6, dtype=torch.float64)
    mask = torch.tensor([[1, 1, 1, 1, 1], [1, 0, 1, 1, 0], [0, 0, 0, 1, 0]]).bool()
    with torch.no_grad():
        got = m.encode_images(feats, mask).embedding
        for b in range(3):
            torch.testing.assert_close(got[b], _loop_image_vector(m, feats[b][mask[b]]))


@pytest.mark.parametrize("opts", [dict(img_pool="max"), dict(img_pool="gpo"), dict(img_pool="gpo", img_mlp=True)])
def test_a_non_linear_image_side_refuses_the_exact_decomposition_in_one_line(opts):
    m = create_model("vsepp", **opts, **KW)
    m.vocab = Vocab.build(["a dog"], min_count=1)
    with pytest.raises(VlmatchError, match="non-linear image side"):
        m.position_contributions(torch.randn(1, 3, 6), None, torch.tensor([[1, 2]]), torch.tensor([2]))
    assert not supports(m, "contribution") and default_method(m) != "contribution"
    linear = create_model("vsepp", **KW)
    linear.vocab = m.vocab
    assert supports(linear, "contribution")


def test_the_mlp_head_with_mean_pooling_decomposes_exactly_cell_by_cell():
    """img_mlp + mean: the image vector is the mean of per-cell vectors, so cell i / word j's share is
    (FC(v_i) + MLP(v_i)) . w_j / (k n |v̄| |w̄|), written here as a loop, and the shares sum to the cosine."""
    torch.manual_seed(1)
    m = create_model("vsepp", img_mlp=True, **KW).double().eval()
    m.vocab = Vocab.build(["a dog runs on grass"], min_count=1)
    feats = torch.randn(2, 5, 6, dtype=torch.float64)
    mask = torch.tensor([[1, 1, 1, 1, 1], [1, 0, 1, 1, 0]]).bool()
    tokens, lengths = m.tokenize(["a dog runs", "grass"])
    assert supports(m, "contribution") and default_method(m) == "contribution"
    with torch.no_grad():
        got = m.position_contributions(feats, mask, tokens, lengths)
        words, _ = m.txt_enc(tokens, lengths)
        for b in range(2):
            cells = [i for i in range(5) if mask[b, i]]
            vec = {i: m.img_fc.fc.weight @ feats[b, i] + m.img_fc.fc.bias + m.img_mlp(feats[b, i]) for i in cells}
            img = sum(vec.values()) / len(cells)
            n = int(lengths[b])
            txt = sum(words[b, j] for j in range(n)) / n
            for i in range(5):
                for j in range(got.shape[2]):
                    want = 0.0 if (i not in cells or j >= n) else \
                        float(vec[i] @ words[b, j]) / (len(cells) * n * float(img.norm()) * float(txt.norm()))
                    assert abs(float(got[b, i, j]) - want) < 1e-10
            score = m.score(m.encode_images(feats[b:b + 1], mask[b:b + 1]), m.encode_texts(tokens[b:b + 1], lengths[b:b + 1]))
            assert abs(float(got[b].sum()) - float(score)) < 1e-6  # l2norm divides by |x| + eps


def test_an_unknown_pooling_is_refused():
    with pytest.raises(VlmatchError, match="img_pool must be one of mean, max, gpo"):
        create_model("vsepp", img_pool="median", **KW)


def test_the_options_survive_a_checkpoint(tmp_path):
    from vlmatch.search.build import save_checkpoint

    torch.manual_seed(0)
    m = create_model("vsepp", img_pool="gpo", img_mlp=True, **KW).eval()
    save_checkpoint(tmp_path / "ck", m)
    back = load_model(tmp_path / "ck").eval()
    assert back.cfg.img_pool == "gpo" and back.cfg.img_mlp
    feats = torch.randn(2, 4, 6)
    with torch.no_grad():
        torch.testing.assert_close(back.encode_images(feats).embedding, m.encode_images(feats).embedding)
