"""``train.grounding_map: gradient``: the map it trains is the very map ``vlmatch grounding --method gradient``
scores, its loss is differentiated exactly (double backward through the models' hand-written backward
passes, checked against finite differences), and on a grid world it teaches CAAN to point."""

import json

import numpy as np
import pytest
import torch

from vlmatch.data.vocab import Vocab
from vlmatch.evaluation.explainers import GRADIENT_BLOCK, gradient_maps, query_maps
from vlmatch.evaluation.grounding import pointing_game
from vlmatch.models.base import l2norm
from vlmatch.models.registry import create_model, load_model
from vlmatch.models.sman import pair_logits
from vlmatch.training.grounding import grounding_term
from vlmatch.training.loop import train

from .test_grounding import _cfg, grid  # noqa: F401  (the grid-world fixture)

WORDS = ["a dog runs on the grass", "a red car near a tree", "two men play ball", "the sky"]
MODELS = [("caan", {"attn_dim": 5}), ("sman", {"attn_dim": 5}), ("scan_t2i_avg", {})]


def _model(name, kw, seed=0):
    torch.manual_seed(seed)
    model = create_model(name, img_dim=6, embed_dim=8, word_dim=7, vocab_size=40, **kw).double()
    model.vocab = Vocab.build(WORDS, min_count=1)
    return model


@pytest.mark.parametrize("name,kw", MODELS)
def test_gradient_maps_equal_the_pointing_games_gradient_maps_phrase_by_phrase(name, kw):
    """Blocks of phrases scored at once give each phrase's own gradient x input map (no phrase leaks into
    another's), the map query_maps gives for that phrase alone: more phrases than one block."""
    model = _model(name, kw).eval()
    texts = [w for w in " ".join(WORDS).split() if w != "a"][:GRADIENT_BLOCK + 3]
    feats = torch.randn(len(texts), 9, 6, dtype=torch.float64)
    maps = gradient_maps(model, feats, None, texts, create_graph=False)
    assert maps.shape == (len(texts), 9)
    for p, text in enumerate(texts):
        ref = query_maps(model, feats[p].numpy(), [text], "gradient")[:, 0]
        np.testing.assert_allclose(maps[p].detach().numpy(), ref, rtol=1e-5, atol=1e-8)  # query_maps: float32


class _Targets:  # three phrases: two of caption 0, one of caption 2, on a 3 x 3 grid
    texts = ["dog", "the grass", "tree"]

    def of_batch(self, caption_index):
        cells = torch.zeros(3, 9, dtype=torch.bool)
        cells[0, :2] = cells[1, 6:] = cells[2, 4] = True
        return torch.tensor([0, 0, 2]), torch.tensor([[1, 2], [4, 6], [5, 6]]), cells

    def texts_of_batch(self, caption_index):
        return list(self.texts)


def _loss_of(model):
    tokens, lengths = model.tokenize(["a dog runs on the grass", "two men play ball", "a red car near a tree"])
    torch.manual_seed(1)
    feats = torch.randn(3, 9, 6, dtype=torch.float64)
    batch = {"caption_index": torch.tensor([0, 1, 2])}
    return lambda: grounding_term(model, _Targets(), batch, (feats, None, tokens, lengths), 0.5, "mass", kind="gradient")


@pytest.mark.parametrize("name,kw", [("sman", {"attn_dim": 5}), ("vsepp", {"text_pool": "mean"})])
def test_the_gradient_grounding_loss_has_the_finite_difference_gradient(name, kw):
    """d loss / d parameter through the map's own gradient (double backward, the hand-written backward
    passes of l2norm and SMAN's pair logits falling back to autograd), against central differences. (Smooth
    models: CAAN's and SCAN's rectifiers make a gradient map piecewise constant in them, no derivative to
    difference across a kink.)"""
    model = _model(name, kw).eval()  # no dropout: the loss is a function of the parameters
    loss = _loss_of(model)
    model.zero_grad()
    loss().backward()
    params = [(n, p) for n, p in model.named_parameters() if p.grad is not None and p.grad.abs().max() > 0]
    assert len(params) >= 3, [n for n, _ in params]
    rng = np.random.default_rng(0)
    for i in rng.choice(len(params), size=min(8, len(params)), replace=False):  # a sample keeps it quick
        name_p, p = params[i]
        for flat in rng.choice(p.numel(), size=min(2, p.numel()), replace=False):
            with torch.no_grad():
                old = p.view(-1)[flat].item()
                p.view(-1)[flat] = old + 1e-6
                up = loss().item()
                p.view(-1)[flat] = old - 1e-6
                down = loss().item()
                p.view(-1)[flat] = old
            fd = (up - down) / 2e-6
            assert abs(fd - p.grad.view(-1)[flat].item()) <= 1e-6 * max(1.0, abs(fd)), (name_p, flat)


def test_caans_gradient_grounding_loss_is_finite_where_a_region_is_rectified_away():
    """CAAN's rectified responses leave all-zero columns (a region no word reaches): their unit vectors'
    second derivative is taken as 0 there, not NaN."""
    model = _model("caan", {"attn_dim": 5}).eval()
    loss = _loss_of(model)
    model.zero_grad()
    loss().backward()
    grads = [p.grad for p in model.parameters() if p.grad is not None]
    assert grads and all(bool(torch.isfinite(g).all()) for g in grads)
    assert sum(float(g.abs().sum()) for g in grads) > 0


def test_the_hand_written_backward_passes_are_differentiable_twice():
    x = torch.randn(4, 5, dtype=torch.float64, requires_grad=True)
    assert torch.autograd.gradgradcheck(lambda v: l2norm(v, dim=1), (x,))
    zero = torch.zeros(2, 5, dtype=torch.float64, requires_grad=True)  # x = 0: first gradient g / eps, then 0
    (g,) = torch.autograd.grad(l2norm(zero, dim=1).sum(), zero, create_graph=True)
    assert torch.allclose(g, torch.full_like(g, 1e8))
    (gg,) = torch.autograd.grad(g.sum(), zero)
    assert bool(torch.isfinite(gg).all())
    keys = torch.randn(2, 1, 3, 4, dtype=torch.float64, requires_grad=True)
    q = torch.randn(2, 5, 4, dtype=torch.float64, requires_grad=True)
    w = torch.randn(4, dtype=torch.float64, requires_grad=True)
    assert torch.autograd.gradcheck(pair_logits, (keys, q, w))
    assert torch.autograd.gradgradcheck(pair_logits, (keys, q, w))


@pytest.mark.slow  # a CAAN training
def test_grounding_on_gradients_teaches_caan_to_point(grid, tmp_path):  # noqa: F811
    """CAAN's attention is its caption's mean map; its per-word map is the gradient, and the objective on it
    makes that map point on held-out images where matching alone leaves it (wide margins)."""
    data, ents, dev_feats, dev_names = grid
    res = {}
    for weight in (0.0, 1.0):
        cfg = _cfg(data, ents, weight)
        cfg["model"] = {"name": "caan", "embed_dim": 16, "word_dim": 8, "attn_dim": 8}
        cfg["train"].update({"grounding_map": "gradient", "epochs": 6})
        run = tmp_path / f"w{weight}"
        train(cfg, run, progress=False)
        if weight:
            rows = [json.loads(ln) for ln in (run / "metrics.jsonl").read_text().splitlines()]
            assert any(r["type"] == "train" and r["grounding"] > 0 for r in rows)
        res[weight] = pointing_game(load_model(run / "best"), dev_feats, dev_names, ents, "gradient")["pointing"]
    assert res[1.0] >= res[0.0] + 15.0, res  # 100 against 3.3 here
