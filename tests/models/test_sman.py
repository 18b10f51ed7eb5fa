"""SMAN: the vectorised model against a plain one-pair-at-a-time float64 form of the paper's
equations (tests/models/reference.py), for every variant, both score modes and both readings of
eq. 9 and eq. 22, with and without grid pooling."""

import numpy as np
import pytest
import torch

from vlmatch import create_model
from vlmatch.models import sman as sman_module
from vlmatch.models.losses import intra_pair_hinge

from .reference import sman_intra, sman_matrix, sman_pair
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


def _grid_inputs(seed=0, side=4):
    g = torch.Generator().manual_seed(seed)
    feats = torch.randn(3, side * side, 12, generator=g, dtype=torch.float64)
    lengths = torch.tensor([5, 2, 4, 1])
    tokens = torch.randint(1, VOCAB, (4, 5), generator=g)
    for i, n in enumerate(lengths):
        tokens[i, n:] = 0
    return feats, torch.ones(3, side * side, dtype=torch.bool), tokens, lengths


OPTIONS = {"sman_alpha0.5_mean": ("sman", {"alpha": 0.5, "word_combine": "mean"}),
           "sman_eq9": ("sman", {"word_attention": "eq9"}), "sman_im_eq9": ("sman_im", {"word_attention": "eq9"})}


@pytest.mark.parametrize("score_mode", ["sum", "concat"])
@pytest.mark.parametrize("name", VARIANTS + list(OPTIONS))
def test_sman_score_equals_loop_reference(name, score_mode):
    name, extra = OPTIONS.get(name, (name, {}))
    model = _model(name, score_mode=score_mode, **extra).eval()
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


def _objective_by_definition(s, image_index, m1, m2, lam, n_levels, hardest, scale):
    """eq. 21 (hinge triplet, hardest or summed negatives) + λ eq. 22 read as a distance, by loops: the summed
    cosine distance K - d, or (``scale="per_level"``) its mean over the K levels (K - d) / K."""
    n = len(s)
    inter = 0.0
    for i in range(n):
        neg_c = [max(0.0, m1 - s[i][i] + s[i][j]) for j in range(n) if image_index[j] != image_index[i]]
        neg_i = [max(0.0, m1 - s[i][i] + s[j][i]) for j in range(n) if image_index[j] != image_index[i]]
        inter += (max(neg_c, default=0.0) + max(neg_i, default=0.0)) if hardest else (sum(neg_c) + sum(neg_i))
    per = n_levels if scale == "per_level" else 1
    intra = sum(max(0.0, (n_levels - s[i][i]) / per - m2) + max(0.0, (n_levels - s[i][i]) / per - m2) for i in range(n))
    return inter + lam * intra


@pytest.mark.parametrize("scale", ["sum", "per_level"])
@pytest.mark.parametrize("hardest", [False, True])
@pytest.mark.parametrize("name", ["sman", "sman_inter", "sman_im"])
def test_sman_loss_is_its_definition(name, hardest, scale):
    model = _model(name, intra_weight=0.0 if name == "sman_inter" else 1.5, intra_margin=0.3, intra_scale=scale)
    g = torch.Generator().manual_seed(5)
    k = model.n_levels
    scores = (torch.rand(6, 6, generator=g, dtype=torch.float64) * 2 - 1) * k  # d in [-K, K]
    scores.diagonal().copy_(torch.tensor([k - 0.1, k - 0.5, 0.2, k, -1.0, k - 0.29], dtype=torch.float64))
    image_index = torch.tensor([0, 0, 1, 2, 3, 3])
    got = model.loss(scores, {"image_index": image_index}, {"margin": 0.2}, hardest)
    want = _objective_by_definition(scores.tolist(), image_index.tolist(), 0.2, 0.3, model.cfg.intra_weight, k, hardest,
                                    scale)
    assert float(got) == pytest.approx(want, abs=1e-12)
    # the intra term pulls positives together: it falls as the positive similarity rises
    assert float(intra_pair_hinge(torch.tensor([1.0]), 3, 0.25)) > float(intra_pair_hinge(torch.tensor([2.5]), 3, 0.25))
    assert float(intra_pair_hinge(torch.tensor([2.9]), 3, 0.25)) == 0.0
    # summed over 3 levels the hinge needs d > 2.75 to switch off; per level, a mean cosine above 0.75 (d > 2.25)
    assert float(intra_pair_hinge(torch.tensor([2.5]), 3, 0.25)) == pytest.approx(0.5)
    assert float(intra_pair_hinge(torch.tensor([2.5]), 3, 0.25, per_level=True)) == 0.0
    assert float(intra_pair_hinge(torch.tensor([1.5]), 3, 0.25, per_level=True)) == pytest.approx(2 * (0.5 - 0.25))


@pytest.mark.parametrize("scale", ["sum", "per_level"])
@pytest.mark.parametrize("name", ["sman", "sman_im"])
def test_sman_intra_term_of_the_model_equals_the_reference(name, scale):
    """The model's L_intra on its own training scores is Σ over the positives of the reference's eq. 22."""
    model = _model(name, intra_scale=scale, intra_margin=0.25, dropout=0.0).train()
    feats, mask, tokens, lengths = _inputs(8)
    tokens, lengths = tokens[:3], lengths[:3]
    scores = model(feats, mask, tokens, lengths).detach()
    batch, train_cfg = {"image_index": torch.arange(3)}, {"margin": 0.2}
    got = model.loss(scores, batch, train_cfg, hardest=False) - _model(name, intra_weight=0.0).loss(
        scores, batch, train_cfg, hardest=False)
    want = sum(sman_pair(model, feats[i][mask[i]], tokens[i, : int(lengths[i])])["intra"] for i in range(3))
    assert want > 0 and float(got) == pytest.approx(want, abs=1e-10)
    assert sman_intra([0.9, 0.9, 0.9], 0.25, "sum") == pytest.approx(2 * 0.05)
    assert sman_intra([0.9, 0.9, 0.9], 0.25, "per_level") == 0.0


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


@pytest.mark.parametrize("score_mode", ["sum", "concat"])
@pytest.mark.parametrize("name", ["sman", "sman_sim", "sman_im_loc"])
def test_grid_pool_score_equals_loop_reference(name, score_mode):
    """grid_pool=2: the reference averages each 2x2 block of the 4x4 raster grid by loops, then the equations."""
    model = _model(name, score_mode=score_mode, grid_pool=2).eval()
    feats, mask, tokens, lengths = _grid_inputs(9)
    with torch.no_grad():
        got = model.score(model.encode_images(feats, mask), model.encode_texts(tokens, lengths))
        assert torch.equal(got, model.score(model.encode_images(feats), model.encode_texts(tokens, lengths)))
    torch.testing.assert_close(got, sman_matrix(model, feats, None, tokens, lengths, score_mode), atol=1e-10, rtol=0)


def test_grid_pool_is_the_model_on_the_pooled_grid():
    """A 14x14 grid with grid_pool=2 scores as the same weights on its 2x2-averaged 7x7 grid; the attention
    comes back on the 196 input cells, each block's weight shared by its 4 cells."""
    pooled = _model("sman", grid_pool=2).eval()
    plain = _model("sman").eval()
    plain.load_state_dict(pooled.state_dict())
    feats, _, tokens, lengths = _grid_inputs(10, side=14)
    small = torch.nn.functional.avg_pool2d(feats.reshape(3, 14, 14, 12).permute(0, 3, 1, 2), 2)
    small = small.permute(0, 2, 3, 1).reshape(3, 49, 12)
    assert torch.allclose(small[0, 8], feats[0, [30, 31, 44, 45]].mean(0))  # cell (1, 1) = input rows 2-3, cols 2-3
    with torch.no_grad():
        img, txt = pooled.encode_images(feats), pooled.encode_texts(tokens, lengths)
        torch.testing.assert_close(pooled.score(img, txt), plain.score(plain.encode_images(small), txt), atol=1e-12, rtol=0)
        att = pooled.pair_attention(img.select(slice(1, 2)), txt.select(slice(0, 1)))
        ref = plain.pair_attention(plain.encode_images(small[1:2]), txt.select(slice(0, 1)))
    w = att["weights"]
    assert w.shape == (196, 5) and ref["weights"].shape == (49, 5)
    np.testing.assert_allclose(w.sum(axis=0), 1.0, atol=1e-6)  # weights are float32
    blocks = w.reshape(7, 2, 7, 2, 5)
    np.testing.assert_allclose(blocks, np.broadcast_to(ref["weights"].reshape(7, 1, 7, 1, 5) / 4, blocks.shape), atol=1e-8)
    np.testing.assert_allclose(np.array(att["region_weights"]["intra"]).reshape(7, 2, 7, 2).sum(axis=(1, 3)),
                               np.array(ref["region_weights"]["intra"]).reshape(7, 7), atol=1e-12)
    assert pooled.pair_flops(196, 12) == plain.pair_flops(49, 12)
    assert pooled.bytes_per_pair(196, 12) == plain.bytes_per_pair(49, 12)


def test_grid_pool_refuses_what_is_no_grid():
    from vlmatch.errors import ConfigError

    model = _model("sman", grid_pool=2).eval()
    feats, mask, _, _ = _grid_inputs(11)
    mask[0, 3] = False
    with pytest.raises(ConfigError, match="absent regions"):
        model.encode_images(feats, mask)
    for m in (15, 9):  # not square; square with an odd side
        with pytest.raises(ConfigError, match=f"square grid whose side divides by 2; the features have {m} regions"):
            model.encode_images(feats[:, :m])
    with pytest.raises(ConfigError, match="grid_pool"):
        create_model("sman", grid_pool=0)


def test_word_init_uniform_as_before_and_xavier_as_the_paper():
    """uniform(-0.1, 0.1) by default, as before; 'xavier' is the paper's. Only the embedding differs: it is
    initialised last, so a seed gives every other weight as before."""
    torch.manual_seed(0)
    xavier = create_model("sman", img_dim=12, embed_dim=8, word_dim=300, vocab_size=2000, word_init="xavier")
    torch.manual_seed(0)
    uniform = create_model("sman", img_dim=12, embed_dim=8, word_dim=300, vocab_size=2000)
    assert uniform.cfg.word_init == "uniform"
    bound = (6 / (2000 + 300)) ** 0.5  # Glorot: U(-b, b), b = sqrt(6 / (fan_in + fan_out))
    for m, b in ((xavier, bound), (uniform, 0.1)):
        w = m.embed.weight.detach()
        assert w.abs().max() <= b and w.abs().max() > 0.99 * b and w.std() == pytest.approx(b / 3 ** 0.5, rel=0.02)
    a, b = xavier.state_dict(), uniform.state_dict()
    assert all(torch.equal(a[k], b[k]) for k in a if k != "embed.weight")


def test_batch_score_flops_default_is_the_pair_count_per_pair_of_the_batch():
    m = create_model("sman", img_dim=16, vocab_size=10)
    pair = m.pair_flops(49, 12)
    assert m.batch_score_flops(5, 49, 12) == {k: 25 * v for k, v in pair.items()}


@pytest.mark.parametrize("chunk", [None, 1])
@pytest.mark.parametrize("side", ["image", "text"])
@pytest.mark.parametrize(("ni", "nt"), [(3, 4), (1, 4), (3, 1), (1, 1)])  # a batch's last, one-item block
def test_pair_logits_value_and_gradients_equal_autograd_on_the_plain_form(side, ni, nt, chunk, monkeypatch):
    if chunk:  # pieces down to one caption each
        monkeypatch.setattr(sman_module, "_CHUNK_ELEMENTS", chunk)
    g = torch.Generator().manual_seed(0)
    m, a = 5, 6
    shape = (ni, 1, m, a) if side == "image" else (1, nt, m, a)
    keys = torch.randn(shape, generator=g, dtype=torch.float64, requires_grad=True)
    q = torch.randn(ni, nt, a, generator=g, dtype=torch.float64, requires_grad=True)
    w = torch.randn(a, generator=g, dtype=torch.float64, requires_grad=True)
    upstream = torch.randn(ni, nt, m, generator=g, dtype=torch.float64)
    got = sman_module.pair_logits(keys, q, w)
    want = torch.tanh(keys * q.unsqueeze(-2)) @ w
    torch.testing.assert_close(got, want, rtol=0, atol=1e-12)
    for x, y in zip(torch.autograd.grad(got, (keys, q, w), upstream),
                    torch.autograd.grad(want, (keys, q, w), upstream), strict=True):
        torch.testing.assert_close(x, y, rtol=0, atol=1e-12)
    assert torch.autograd.gradcheck(sman_module.pair_logits, (keys, q, w))
