"""SMAN: the vectorised model against a plain one-pair-at-a-time float64 form of the paper's
equations (tests/models/reference.py), for every variant and both score modes."""

import numpy as np
import pytest
import torch

from vlmatch import create_model
from vlmatch.losses import intra_pair_hinge
from vlmatch.models import sman as sman_module

from .reference import sman_matrix, sman_pair
from .test_scan import VOCAB

VARIANTS = ["sman", "sman_inter", "sman_sim", "sman_im", "sman_im_loc"]


def _model(name, **kw):
    torch.manual_seed(0)
    return create_model(name, img_dim=12, embed_dim=8, word_dim=7, vocab_size=VOCAB, attn_dim=5, **kw).double()


def _inputs(seed=0):
    g = torch.Generator().manual_seed(seed)
    feats = torch.randn(3, 6, 12, generator=g, dtype=torch.float64)
    mask = torch.ones(3, 6, dtype=torch.bool)
    mask[1, 4:] = False  # image 1: 4 regions
    mask[2, 1] = False  # image 2: a hole, so the GRU's raster order skips a region
    lengths = torch.tensor([6, 2, 4, 1, 3])
    tokens = torch.randint(1, VOCAB, (5, 6), generator=g)
    for i, n in enumerate(lengths):
        tokens[i, n:] = 0
    return feats, mask, tokens, lengths


@pytest.mark.parametrize("score_mode", ["sum", "concat"])
@pytest.mark.parametrize("name", VARIANTS + ["sman_alpha0.5_mean"])
def test_sman_score_equals_loop_reference(name, score_mode):
    extra = {"alpha": 0.5, "word_combine": "mean"} if name.startswith("sman_alpha") else {}
    model = _model("sman" if extra else name, score_mode=score_mode, **extra).eval()
    feats, mask, tokens, lengths = _inputs()
    with torch.no_grad():
        got = model.score(model.encode_images(feats, mask), model.encode_texts(tokens, lengths))
    want = sman_matrix(model, feats, mask, tokens, lengths, score_mode)
    torch.testing.assert_close(got, want, atol=1e-10, rtol=0)


@pytest.mark.parametrize("name", ["sman", "sman_im"])
def test_training_scores_are_the_sum_of_cosines(name):
    """Whatever score_mode evaluates with, training (and so the objective) sees d of eq. 20."""
    model = _model(name, score_mode="concat", dropout=0.0).train()
    feats, mask, tokens, lengths = _inputs(1)
    got = model.score(model.encode_images(feats, mask), model.encode_texts(tokens, lengths)).detach()
    torch.testing.assert_close(got, sman_matrix(model, feats, mask, tokens, lengths, "sum"), atol=1e-10, rtol=0)


@pytest.mark.parametrize("name", VARIANTS)
def test_global_embeddings_give_d0_plus_d1(name):
    model = _model(name).eval()
    feats, mask, tokens, lengths = _inputs(2)
    with torch.no_grad():
        a, b = model.global_embeddings(model.encode_images(feats, mask), model.encode_texts(tokens, lengths))
    want = sman_matrix(model, feats, mask, tokens, lengths, lambda r: r["cos"][0] + r["cos"][1])
    torch.testing.assert_close(a @ b.T, want, atol=1e-10, rtol=0)


@pytest.mark.parametrize("chunk", [None, 1])
@pytest.mark.parametrize("score_mode", ["sum", "concat"])
@pytest.mark.parametrize("name", ["sman", "sman_sim"])
def test_sman_blocks_and_padding_are_consistent(name, score_mode, chunk, monkeypatch):
    model = _model(name, score_mode=score_mode).eval()
    feats, mask, tokens, lengths = _inputs(3)
    with torch.no_grad():
        img = model.encode_images(feats, mask)
        full = model.score(img, model.encode_texts(torch.nn.functional.pad(tokens, (0, 3)), lengths))
        if chunk:  # the inference path's cache-sized pieces, down to one caption each, give the same
            monkeypatch.setattr(sman_module, "_CHUNK_ELEMENTS", chunk)
        # the engine's path: captions encoded in chunks of different widths, then concatenated
        chunks = [model.encode_texts(tokens[i:j, : int(lengths[i:j].max())], lengths[i:j]) for i, j in ((0, 2), (2, 5))]
        cat = type(chunks[0]).cat(chunks)
        torch.testing.assert_close(model.score(img, cat), full)
        part = model.score(img.select(slice(1, 3)), cat.select(slice(3, 5)))
        one_image = model.score(img.select(slice(2, 3)), cat)
        one_caption = model.score(img, cat.select(slice(1, 2)))
    torch.testing.assert_close(part, full[1:3, 3:5])
    torch.testing.assert_close(one_image, full[2:3])
    torch.testing.assert_close(one_caption, full[:, 1:2])


@pytest.mark.parametrize("name", VARIANTS)
def test_sman_gradients_reach_every_parameter(name):
    model = _model(name).float().train()
    feats, mask, tokens, lengths = _inputs(4)
    scores = model(feats.float(), mask, tokens[:3], lengths[:3])
    batch = {"image_index": torch.arange(3)}
    model.loss(scores, batch, {"margin": 0.2}, hardest=False).backward()
    for pname, p in model.named_parameters():
        assert p.grad is not None and torch.isfinite(p.grad).all(), pname
        assert p.grad.abs().sum() > 0, f"no gradient reaches {pname}"


def _objective_by_definition(s, image_index, m1, m2, lam, n_levels, hardest):
    """eq. 21 (hinge triplet, hardest or summed negatives) + λ eq. 22 read as a distance, by loops."""
    n = len(s)
    inter = 0.0
    for i in range(n):
        neg_c = [max(0.0, m1 - s[i][i] + s[i][j]) for j in range(n) if image_index[j] != image_index[i]]
        neg_i = [max(0.0, m1 - s[i][i] + s[j][i]) for j in range(n) if image_index[j] != image_index[i]]
        inter += (max(neg_c, default=0.0) + max(neg_i, default=0.0)) if hardest else (sum(neg_c) + sum(neg_i))
    intra = sum(max(0.0, (n_levels - s[i][i]) - m2) + max(0.0, (n_levels - s[i][i]) - m2) for i in range(n))
    return inter + lam * intra


@pytest.mark.parametrize("hardest", [False, True])
@pytest.mark.parametrize("name", ["sman", "sman_inter", "sman_im"])
def test_sman_loss_is_its_definition(name, hardest):
    model = _model(name, intra_weight=0.0 if name == "sman_inter" else 1.5, intra_margin=0.3)
    g = torch.Generator().manual_seed(5)
    k = model.n_levels
    scores = (torch.rand(6, 6, generator=g, dtype=torch.float64) * 2 - 1) * k  # d in [-K, K]
    scores.diagonal().copy_(torch.tensor([k - 0.1, k - 0.5, 0.2, k, -1.0, k - 0.29], dtype=torch.float64))
    image_index = torch.tensor([0, 0, 1, 2, 3, 3])
    got = model.loss(scores, {"image_index": image_index}, {"margin": 0.2}, hardest)
    want = _objective_by_definition(scores.tolist(), image_index.tolist(), 0.2, 0.3, model.cfg.intra_weight, k, hardest)
    assert float(got) == pytest.approx(want, abs=1e-12)
    # the intra term pulls positives together: it falls as the positive similarity rises
    assert float(intra_pair_hinge(torch.tensor([1.0]), 3, 0.25)) > float(intra_pair_hinge(torch.tensor([2.5]), 3, 0.25))
    assert float(intra_pair_hinge(torch.tensor([2.9]), 3, 0.25)) == 0.0


@pytest.mark.parametrize("name", VARIANTS)
def test_sman_pair_attention(name):
    model = _model(name).eval()
    feats, mask, tokens, lengths = _inputs(6)
    with torch.no_grad():
        img, txt = model.encode_images(feats, mask), model.encode_texts(tokens, lengths)
        att = model.pair_attention(img.select(slice(1, 2)), txt.select(slice(2, 3)))
    r = sman_pair(model, feats[1][mask[1]], tokens[2, :4])
    shown = r["a2v"] if model.cfg.stacked else r["a1v"]
    assert att["axis"] == "regions" and att["weights"].shape == (6, 4)
    np.testing.assert_allclose(att["weights"][:4], np.repeat(np.array(shown)[:, None], 4, axis=1), atol=1e-10)
    np.testing.assert_allclose(att["weights"][4:], 0.0)  # masked regions
    np.testing.assert_allclose(att["weights"].sum(axis=0), 1.0, atol=1e-10)
    np.testing.assert_allclose(att["region_weights"]["intra"][:4], r["a1v"], atol=1e-10)
    np.testing.assert_allclose(att["word_weights"]["intra"], r["a1t"], atol=1e-10)
    if model.cfg.stacked:
        np.testing.assert_allclose(att["word_weights"]["multimodal"], r["a2t"], atol=1e-10)
    else:
        assert "multimodal" not in att["region_weights"]


def test_dropout_only_in_training():
    model = _model("sman", dropout=0.3)
    feats, mask, tokens, lengths = _inputs(7)
    model.train()
    a = model(feats, mask, tokens, lengths)
    b = model(feats, mask, tokens, lengths)
    assert not torch.allclose(a, b)
    model.eval()
    with torch.no_grad():
        torch.testing.assert_close(model(feats, mask, tokens, lengths), model(feats, mask, tokens, lengths))


def test_pair_flops_count_the_pair_part():
    m = create_model("sman", img_dim=16, embed_dim=512, attn_dim=512, vocab_size=10)
    assert m.pair_flops(49, 12)["macs"] == 2 * 512 + 2 * 512 * 512 + 2 * 61 * 512 + 61 * 512 + 3 * 512
    assert create_model("sman_im", img_dim=16, vocab_size=10).pair_flops(49, 12)["macs"] == 2 * 512  # one GEMM
