"""Each explanation method against its definition on small random models: ``contribution`` sums to the
score (and equals the paper's terms computed loop by loop), ``occlusion`` equals re-scoring with the cell
masked, ``gradient`` equals autograd's; token spans for a tokenizer that splits words into pieces."""

import math

import numpy as np
import pytest
import torch

from tests.encoders.tiny_bert import tiny_bert_folder
from vlmatch.errors import VlmatchError
from vlmatch.evaluation.explainers import default_method, query_maps, supports, token_maps, token_spans
from vlmatch.models.registry import create_model

WORDS = ("a", "dog", "red", "ball", "runs", "on", "the", "grass")
CAPTIONS = ["a red dog runs", "the ball on the grass", "a dog"]


@pytest.fixture(scope="module")
def bert(tmp_path_factory):
    return str(tiny_bert_folder(tmp_path_factory.mktemp("bert"), hidden=16, layers=1, heads=2, words=WORDS))


def _model(name, bert, **kw):
    torch.manual_seed(0)
    return create_model(name, img_dim=12, embed_dim=8, text_encoder=bert, text_cache=False, **kw).double().eval()


def _inputs(model):
    g = torch.Generator().manual_seed(3)
    feats = torch.randn(3, 6, 12, generator=g, dtype=torch.float64)
    mask = torch.tensor([[1] * 6, [1, 1, 0, 1, 0, 1], [1, 0, 1, 1, 1, 1]], dtype=torch.bool)
    tokens, lengths = model.tokenize(CAPTIONS)
    return feats, mask, tokens, lengths


@pytest.mark.parametrize("name,kw", [("vsepp", {}), ("scan_t2i_avg", {}), ("scan_i2t_avg", {}),
                                     ("scan_t2i_avg", {"agg": "sum"})])
def test_contribution_sums_to_the_score(name, kw, bert):
    m = _model(name, bert, **kw)
    feats, mask, tokens, lengths = _inputs(m)
    with torch.no_grad():
        c = m.position_contributions(feats, mask, tokens, lengths)
        s = m.score(m.encode_images(feats, mask), m.encode_texts(tokens, lengths)).diagonal()
    torch.testing.assert_close(c.sum(dim=(1, 2)), s, rtol=1e-6, atol=1e-7)  # l2norm's eps aside
    assert float(c[~mask].abs().sum()) == 0.0  # masked positions take no share
    for b, n in enumerate(lengths.tolist()):
        assert float(c[b, :, n:].abs().sum()) == 0.0  # nor do padded words


def test_vsepp_gru_contribution_needs_mean_pooling(bert):
    torch.manual_seed(0)
    m = create_model("vsepp", img_dim=12, embed_dim=8, word_dim=6, vocab_size=20, text_pool="mean").double().eval()
    feats = torch.randn(2, 4, 12, dtype=torch.float64)
    tokens, lengths = torch.randint(4, 20, (2, 5)), torch.tensor([5, 3])
    with torch.no_grad():
        c = m.position_contributions(feats, None, tokens, lengths)
        s = m.score(m.encode_images(feats), m.encode_texts(tokens, lengths)).diagonal()
    torch.testing.assert_close(c.sum(dim=(1, 2)), s)
    last = create_model("vsepp", img_dim=12, embed_dim=8, word_dim=6, vocab_size=20, text_pool="last")
    with pytest.raises(VlmatchError, match="no per-word decomposition"):
        last.position_contributions(feats.float(), None, tokens, lengths)


def test_scan_t2i_contribution_is_the_papers_terms_loop_by_loop(bert):
    """alpha_ij s_ij / (||e_j|| ||a_j||) / n, from eq. 1-5 written as loops (clipped l2 norm over words, λ1 = 9)."""
    m = _model("scan_t2i_avg", bert)
    feats, _, tokens, lengths = _inputs(m)
    with torch.no_grad():
        c = m.position_contributions(feats, None, tokens, lengths)
        v = m.encode_images(feats).regions
        e = m.encode_texts(tokens, lengths).words
    for b in range(3):
        n, k = int(lengths[b]), v.shape[1]
        s = [[float(v[b, i] @ e[b, j]) for j in range(n)] for i in range(k)]
        for j in range(n):
            clipped = [[x if x > 0 else 0.1 * x for x in row] for row in s]
            norms = [math.sqrt(sum(clipped[i][jj] ** 2 for jj in range(n))) + 1e-8 for i in range(k)]
            z = [9.0 * clipped[i][j] / norms[i] for i in range(k)]
            top = max(z)
            alpha = [math.exp(x - top) for x in z]
            alpha = [x / sum(alpha) for x in alpha]
            a = sum(alpha[i] * v[b, i] for i in range(k))
            for i in range(k):
                want = alpha[i] * s[i][j] / (float(e[b, j].norm()) * float(a.norm())) / n
                assert float(c[b, i, j]) == pytest.approx(want, rel=1e-6, abs=1e-12)


def test_pooling_without_a_decomposition_is_refused(bert):
    m = _model("scan_t2i_lse", bert)
    assert not supports(m, "contribution") and supports(m, "attention") and supports(m, "gradient")
    assert default_method(m) == "gradient"
    assert default_method(_model("vsepp", bert)) == "contribution"
    with pytest.raises(VlmatchError, match="no exact decomposition"):
        token_maps(m, np.zeros((4, 12)), "a dog", "contribution")


@pytest.mark.parametrize("name", ["vsepp", "scan_t2i_avg", "scan_i2t_lse", "caan"])
def test_occlusion_equals_rescoring_with_the_cell_masked(name, bert):
    kw = {"attn_dim": 5} if name == "caan" else {}
    m = _model(name, bert, **kw)
    feats = _inputs(m)[0][0].numpy()
    queries = ["a red dog", "the grass"]
    got = query_maps(m, feats, queries, "occlusion")
    tokens, lengths = m.tokenize(queries)
    with torch.no_grad():
        txt = m.encode_texts(tokens, lengths)
        f = torch.as_tensor(feats)[None].float().double()
        full = m.score(m.encode_images(f, torch.ones(1, 6, dtype=torch.bool)), txt)[0]
        for i in range(6):
            keep = torch.ones(1, 6, dtype=torch.bool)
            keep[0, i] = False
            masked = m.score(m.encode_images(f, keep), txt)[0]
            np.testing.assert_allclose(got[i], (full - masked).numpy(), rtol=1e-5, atol=1e-6)


@pytest.mark.parametrize("name", ["vsepp", "scan_t2i_avg", "caan"])
def test_gradient_equals_autograd(name, bert):
    kw = {"attn_dim": 5} if name == "caan" else {}
    m = _model(name, bert, **kw).float()
    feats = _inputs(m)[0][1].float().numpy()
    queries = ["a red dog", "the ball on the grass"]
    got = query_maps(m, feats, queries, "gradient")
    tokens, lengths = m.tokenize(queries)
    with torch.no_grad():
        txt = m.encode_texts(tokens, lengths)
    x = torch.as_tensor(feats)[None]
    jac = torch.autograd.functional.jacobian(lambda f: m.score(m.encode_images(f), txt)[0], x)  # (Q, 1, k, D)
    want = (jac[:, 0] * x[0]).sum(dim=2).T.numpy()
    np.testing.assert_allclose(got, want, rtol=1e-4, atol=1e-6)


@pytest.mark.parametrize("name", ["scan_t2i_avg", "caan"])
def test_gradient_x_input_of_a_model_that_normalises_each_region_sees_only_the_projections_bias(name, bert):
    """u = W x + b, v = u / ||u||: S is scale-invariant in each u, so u . dS/du = 0 and the map
    x . dS/dx = (u - b) . dS/du = -b . dS/du. At b = 0 (SCAN's and CAAN's initial bias) the map is zero up to
    round-off; trained, it is the bias read through the gradient (docs/grounding.md says what this means)."""
    kw = {"attn_dim": 5} if name == "caan" else {}
    m = _model(name, bert, **kw)
    feats = torch.as_tensor(_inputs(m)[0][0])
    queries = ["a red dog", "the ball"]
    with torch.no_grad():
        m.img_enc.fc.bias.zero_()
    assert np.abs(query_maps(m, feats.numpy(), queries, "gradient")).max() < 1e-9
    with torch.no_grad():
        m.img_enc.fc.bias.normal_()
    got = query_maps(m, feats.numpy(), queries, "gradient")
    tokens, lengths = m.tokenize(queries)
    u = m.img_enc.fc(feats).detach().expand(len(queries), -1, -1).clone().requires_grad_(True)
    m.img_enc.forward = lambda _features: u  # the projection's output, as a leaf
    s = m.score(m.encode_images(feats.expand(len(queries), -1, -1)), m.encode_texts(tokens, lengths))
    (g,) = torch.autograd.grad(s.diagonal().sum(), u)
    want = -(g * m.img_enc.fc.bias.detach()).sum(dim=2).T.numpy()
    assert np.abs(got).max() > 1e-3
    np.testing.assert_allclose(got, want, rtol=1e-5, atol=1e-7)


def test_token_spans_cover_word_pieces(bert):
    m = _model("vsepp", bert)
    text = "a puppy runs on the grass"  # "puppy" is not in the vocabulary: WordPiece splits it into letters
    spans = token_spans(m, text, [(0, 7), (8, 12), (13, 25)])
    tokens, lengths = m.tokenize([text])
    words = m.decode_tokens(tokens[0], int(lengths[0]))
    pieces = [words[a:b] for a, b in spans]
    assert pieces[0][0] == "a" and len(pieces[0]) > 2 and "".join(p.lstrip("#") for p in pieces[0][1:]) == "puppy"
    assert pieces[1] == ["runs"] and pieces[2] == ["on", "the", "grass"]
    assert words[0] == "[CLS]" and spans[0][0] == 1 and spans[2][1] == int(lengths[0]) - 1  # [SEP] left out


def test_token_spans_of_a_word_vocabulary():
    from vlmatch.data.vocab import Vocab

    torch.manual_seed(0)
    m = create_model("vsepp", img_dim=4, embed_dim=4, word_dim=4, vocab_size=10)
    m.vocab = Vocab.build(["a dog on the grass"], min_count=1)
    tokens, lengths = m.tokenize(["a dog on the grass"])
    words = m.decode_tokens(tokens[0], int(lengths[0]))
    (a, b), = token_spans(m, "a dog on the grass", [(2, 5)])
    assert words[a:b] == ["dog"]
