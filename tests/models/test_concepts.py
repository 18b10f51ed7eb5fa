"""The zero-shot concept scorer (vlmatch.models.concepts) against a plain loop-by-loop reading of its equations,
and the ImageNet lexicon it reads (vlmatch.features.concepts)."""

import math

import numpy as np
import pytest
import torch

from vlmatch.errors import ConfigError
from vlmatch.features.concepts import Lexicon, load_lexicon
from vlmatch.models.concepts import ConceptOptions, ConceptScorer


class HashEmbedder:
    """A deterministic stand-in for the sentence model: one random unit vector per text."""

    dim = 8

    def content_hash(self):
        return "hash-embedder"

    def embed(self, texts):
        out = []
        for t in texts:
            g = torch.Generator().manual_seed(abs(hash(t)) % (2**31))
            v = torch.randn(self.dim, generator=g)
            out.append(v / v.norm())
        return torch.stack(out)


def tiny_lexicon() -> Lexicon:
    # 4 classes (0..3), then their hypernyms: 4 = dog (over 0, 1), 5 = cat (over 2), 6 = animal (over 4, 5, 3)
    names = [["golden retriever"], ["beagle"], ["tabby"], ["newt"], ["dog"], ["cat"], ["animal"]]
    parents = [[4], [4], [5], [6], [6], [6], []]
    return Lexicon(names, parents, 4, "tiny")


@pytest.fixture(autouse=True)
def no_disk_cache(tmp_path, monkeypatch):
    monkeypatch.setenv("VLMATCH_CACHE", str(tmp_path / "cache"))


def scorer(opts: ConceptOptions, seed: int = 0) -> ConceptScorer:
    g = torch.Generator().manual_seed(seed)
    return ConceptScorer(torch.randn(4, 6, generator=g), torch.randn(4, generator=g), HashEmbedder(), opts,
                         lexicon=tiny_lexicon())


def loop_vector(sc: ConceptScorer, grid: torch.Tensor) -> torch.Tensor:
    """The concept vector of one photo by the equations, one node at a time."""
    opts, lex = sc.options, sc.lexicon
    cells = grid.shape[0]
    logits = [sum(float(grid[r] @ sc.weight[c]) for r in range(cells)) / cells + float(sc.bias[c]) for c in range(4)]
    z = [math.exp(v / opts.temperature) for v in logits]
    p = [v / sum(z) for v in z]
    weights = []
    for n in range(len(lex.names)):
        covered = [c for c in range(4) if n in lex.ancestors(c)]
        prob = sum(p[c] for c in covered)
        spec = math.log(4 / len(covered)) ** opts.ic_power if opts.tree else float(n < 4)
        if len(covered) > opts.max_leaves:
            spec = 0.0
        weights.append(prob * spec)
    top = sorted(range(len(weights)), key=lambda n: -weights[n])[:opts.top_k]
    names = sc.name_vectors()
    v = sum(weights[n] * names[n] for n in top)
    return v / v.norm() if opts.unit else v / sum(weights[n] for n in top)


@pytest.mark.parametrize("opts", [ConceptOptions(tree=False, top_k=2), ConceptOptions(tree=True, top_k=3),
                                  ConceptOptions(tree=True, top_k=7, ic_power=2.0, temperature=0.5),
                                  ConceptOptions(tree=True, top_k=4, max_leaves=2, unit=False)])
def test_photo_vectors_equal_the_equations(opts):
    sc = scorer(opts)
    grid = torch.randn(3, 5, 6, generator=torch.Generator().manual_seed(1))
    got = sc.photo_vectors(grid)
    for i in range(3):
        assert torch.allclose(got[i], loop_vector(sc, grid[i]), atol=1e-5)


def test_a_class_flows_to_its_hypernyms():
    lex = tiny_lexicon()
    m = lex.cover_matrix()
    assert m[4].tolist() == [1, 1, 0, 0]  # dog: both breeds
    assert m[6].tolist() == [1, 1, 1, 1]  # animal: everything
    assert m[:4].diag().tolist() == [1, 1, 1, 1]


def test_a_photo_depends_on_its_grid_only_through_the_grids_mean():
    """The head is linear over the cells (CAM): the mean of each cell's class scores is the pooled photo's, so a grid
    and a grid of its mean cell give the same node weights and concept vector."""
    sc = scorer(ConceptOptions())
    grid = torch.randn(2, 9, 6)
    flat = grid.mean(1, keepdim=True).expand(-1, 9, -1)
    cells = grid @ sc.weight.T + sc.bias
    assert torch.allclose(cells.mean(1), grid.mean(1) @ sc.weight.T + sc.bias, atol=1e-5)
    assert torch.allclose(sc.node_weights(grid), sc.node_weights(flat), atol=1e-6)
    assert torch.allclose(sc.photo_vectors(grid), sc.photo_vectors(flat), atol=1e-6)
    assert not torch.allclose(sc.node_weights(grid), sc.node_weights(torch.randn(2, 9, 6)), atol=1e-3)


def test_options_out_of_range_are_refused():
    for bad in (dict(temperature=0), dict(top_k=0), dict(ic_power=-1), dict(template="no slot")):
        with pytest.raises(ConfigError):
            ConceptOptions(**bad)


def test_name_vectors_are_cached_between_processes(tmp_path):
    from vlmatch.models import concepts

    concepts._NAMES.clear()  # what other tests of this process left in memory
    sc = scorer(ConceptOptions())
    first = sc.name_vectors()
    files = list((tmp_path / "cache" / "concepts").glob("names-*.npy"))
    assert len(files) == 1
    np.save(files[0], np.asarray(first) * 0 + 7.0)  # a later scorer reads the file, not the model
    concepts._NAMES.clear()
    assert float(scorer(ConceptOptions()).name_vectors()[0, 0]) == 7.0


def test_the_shipped_lexicon_names_imagenet_and_its_hypernyms():
    lex = load_lexicon()
    assert lex.n_classes == 1000 and len(lex.names) > 1000
    dog = next(i for i, n in enumerate(lex.names) if n[0] == "dog")
    cover = lex.cover_matrix()
    breeds = set(np.flatnonzero(cover[dog].numpy()).tolist())
    assert breeds == set(range(151, 269))  # every ILSVRC dog breed, and nothing else
    assert lex.names[281][0] == "tabby" and "cat" in {n[0] for n in (lex.names[j] for j in lex.ancestors(281))}


def test_principal_directions_are_orthonormal_signed_and_keep_the_names_span():
    """The projection the open-vocabulary columns use (Fusion.dims): orthonormal, a fixed sign, and at full rank
    it keeps every inner product of vectors in the names' span."""
    from vlmatch.models.concepts import principal_directions

    names = scorer(ConceptOptions()).name_vectors()  # 7 name vectors in 8 dimensions: rank 7
    u = principal_directions(names, 7)
    assert torch.allclose(u.T @ u, torch.eye(7), atol=1e-5)
    assert bool((u.gather(0, u.abs().argmax(0, keepdim=True)) > 0).all())
    a, b = torch.rand(3, 7) @ names, torch.rand(4, 7) @ names  # mixtures of names, as photo vectors are
    assert torch.allclose((a @ u) @ (b @ u).T, a @ b.T, atol=1e-5)
    small = principal_directions(names, 2)
    assert torch.allclose(small, u[:, :2], atol=1e-5)  # the leading directions, in order
    with pytest.raises(ConfigError, match="between 1 and 7"):  # 7 names span no more than 7 directions
        principal_directions(names, 8)
