"""The open-vocabulary fusion (vlmatch.search.open_vocab): one inner product is the fused score, the relevance
scale, the 'nothing matches' line, and the AND re-scoring of two-thing queries (vlmatch.search.compose)."""

import numpy as np
import pytest
import torch

from vlmatch.errors import ConfigError
from vlmatch.models.registry import load_model
from vlmatch.search.compose import and_evidence, query_terms, rescore
from vlmatch.search.encode import Stage1Source
from vlmatch.search.hits import SearchHit, with_relevance
from vlmatch.search.open_vocab import Fusion, Relevance, content_words, no_match_line, rare_share


class FakeOpenVocab:
    """Concept vectors from the features' mean (a fixed random map), queries from a text hash; weight w(q)."""

    dim = 6

    def __init__(self, img_dim):
        self.map = torch.randn(img_dim, self.dim, generator=torch.Generator().manual_seed(3))

    def photo_vectors(self, feats):
        return torch.nn.functional.normalize(feats.float().mean(1) @ self.map, dim=-1)

    def embed(self, texts):
        out = [torch.randn(self.dim, generator=torch.Generator().manual_seed(len(t) * 7 + ord(t[0]))) for t in texts]
        return torch.nn.functional.normalize(torch.stack(out), dim=-1)

    def weights(self, texts):
        return torch.tensor([0.5 + 0.1 * len(t.split()) for t in texts])

    def query_vectors(self, texts):
        return self.embed(texts) * self.weights(texts)[:, None]


def test_one_inner_product_is_the_fused_score(toy_ckpts):
    """stage-1 photo . stage-1 query = the model's own score + w(q) x cosine(concept(photo), concept(query))."""
    model = load_model(toy_ckpts["vsepp"]).eval()
    ov = FakeOpenVocab(model.cfg.img_dim)
    s1 = Stage1Source(model, None, ov)
    feats = torch.randn(5, 4, model.cfg.img_dim, generator=torch.Generator().manual_seed(0))
    texts = ["a red ball", "two cubes on the left", "a star"]
    with torch.no_grad():
        img = model.encode_images(feats)
        pv = s1.image_vectors(feats, img)
        qv = s1.text_vectors(texts, None, 4)
        tok, ln = model.tokenize(texts)
        own = model.score(img, model.encode_texts(tok, ln))
    fused = own + (ov.photo_vectors(feats) @ ov.embed(texts).T) * ov.weights(texts)[None, :]
    assert torch.allclose(pv @ qv.T, fused, atol=1e-5)
    # a photo query read from a stored encoding (no features) has zeros in the concept columns
    assert torch.count_nonzero(s1.image_vectors(None, img)[:, -ov.dim:]) == 0


def test_fusion_records_round_trip_and_bad_ones_are_refused():
    f = Fusion(0.2, 0.5, 1.7, None, {"tree": False, "top_k": 10},
               {"scores": [0.0, 1.0], "probabilities": [0.0, 0.5], "threshold": 0.15}, dims=96)
    assert Fusion.of(f.describe()) == f
    assert Fusion.of({"w0": 0.1}).dims is None  # a record from before the projection: all the columns
    with pytest.raises(ConfigError, match="dims"):
        Fusion(0.1, dims=0)
    with pytest.raises(ConfigError, match="open-vocabulary record"):
        Fusion.of({"slope": 1})
    with pytest.raises(ConfigError, match="increasing"):
        Relevance.of({"scores": [1.0, 0.0], "probabilities": [0.0, 0.5], "threshold": 0.1})


def test_rare_words_are_the_content_words_training_never_used():
    vocab = frozenset({"dog", "beach", "runs"})
    assert content_words("A dog runs on the beach") == ["dog", "runs", "beach"]
    assert rare_share("a dog on the beach", vocab) == 0.0
    assert rare_share("a toaster in the kitchen", vocab) == 1.0
    assert rare_share("a dog in the kitchen", vocab) == 0.5
    assert rare_share("the", vocab) == 0.0 and rare_share("a dog", None) == 0.0


def test_relevance_is_a_probability_that_grows_with_the_score():
    rel = Relevance.of({"scores": [-0.5, 0.0, 0.5], "probabilities": [0.0, 0.1, 0.6], "threshold": 0.2})
    p = rel([-1.0, 0.0, 0.3, 0.6])
    assert np.all((p >= 0) & (p <= 1)) and np.all(np.diff(p) >= 0) and p[2] == pytest.approx(0.4)
    hits = [SearchHit(1, 7, 0.1, 0.1, path="x.jpg"), SearchHit(2, 8, 0.0, 0.0, path="y.jpg")]
    with_relevance(hits, rel)
    assert hits[1].no_match and hits[1].relevance == pytest.approx(0.1)
    assert hits[0].relevance == pytest.approx(0.2, abs=1e-4) and not hits[0].no_match
    hits = [SearchHit(1, 7, 0.1, 0.1, path="x.jpg"), SearchHit(2, 8, 0.0, 0.0, path="y.jpg")]
    with_relevance(hits, Relevance.of({"scores": [-0.5, 0.0, 0.5], "probabilities": [0.0, 0.1, 0.6],
                                       "threshold": 0.5}))
    assert hits[0].no_match
    hits[0].no_match = True
    line = no_match_line(hits)
    assert line.startswith("no photo matches this well") and line.endswith("closest: x.jpg")
    assert no_match_line([{**hits[0].to_dict(), "no_match": False}]) is None
    assert no_match_line([SearchHit(1, 1, 0.5, 0.5, path="z.jpg")]) is None  # no relevance scale: no line


def test_two_thing_queries_prefer_the_photo_that_holds_both():
    assert query_terms("A dog is running on the beach") == ["dog", "running", "beach"]
    # three candidates, two words: the first holds both, the second only the dog, the third only the beach
    words = np.array([[0.6, 0.6], [0.9, 0.1], [0.1, 0.9]])
    ev = and_evidence(words)
    assert ev.argmax() == 0
    fused = np.array([0.50, 0.52, 0.51])  # the global score prefers a photo with one of the two
    assert rescore(fused, words, 0.0).argmax() == 1
    assert rescore(fused, words, 2.0).argmax() == 0
