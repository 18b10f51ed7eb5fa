"""The open-vocabulary scorer: what the backbone's own ImageNet head sees in a photo, in a sentence space.

ConSE (Norouzi et al., ICLR 2014) over WordNet's tree (:mod:`vlmatch.features.concepts`): a class's probability
also flows to every hypernym above it, so "a dog" finds a photo whatever the breed. Each node weighs its
probability times its specificity, ``log(1000 / classes under it) ** ic_power``; the photo's *concept vector* is
the unit-length weighted mean of its ``top_k`` heaviest nodes' name vectors in a sentence space
(:mod:`vlmatch.encoders.sentence`), where a query is embedded by its own words. The head is linear over the grid
cells (CAM), so the concept vector depends on the grid only through its mean. The name vectors are computed on
first use and kept per process. docs/open-vocabulary.md.
"""

from __future__ import annotations

import hashlib
import json
from dataclasses import asdict, dataclass
from pathlib import Path

import numpy as np
import torch
from torch import Tensor

from ..errors import ConfigError, DataError
from ..io import save_npy

_NAMES: dict = {}  # name vectors by (lexicon, text model, template): shared by the scorers of one process


@dataclass(frozen=True)
class ConceptOptions:
    """How a photo's class posterior becomes its concept vector (chosen on the concept-held-out protocol:
    docs/open-vocabulary.md). ``tree``: False is plain ConSE over the 1,000 classes."""

    temperature: float = 1.0
    top_k: int = 16
    ic_power: float = 1.0
    tree: bool = True
    template: str = "a photo of a {}."
    max_leaves: int = 1000  # nodes over more of the head's classes than this are left out (too general to name)
    unit: bool = True  # False: the weights renormalised to sum 1 (the concept score is an expected cosine)

    def __post_init__(self):
        if not self.temperature > 0 or self.top_k < 1 or self.ic_power < 0 or "{}" not in self.template:
            raise ConfigError(f"concept options out of range: {self}")

    def describe(self) -> dict:
        return asdict(self)


def name_cache_path(key: tuple) -> Path:
    """Where the name vectors of ``key`` (lexicon, text model, template) are kept between processes:
    ``$VLMATCH_CACHE/concepts/`` (a pure function of the key, made again when missing or damaged)."""
    from ..data.resolve import cache_dir

    digest = hashlib.sha256(json.dumps(key).encode()).hexdigest()[:24]
    return cache_dir() / "concepts" / f"names-{digest}.npy"


def principal_directions(names: Tensor, dims: int) -> Tensor:
    """(H, dims) the leading right singular vectors of the (nodes, H) name vectors, each signed so that its
    largest entry is positive (the SVD's signs are arbitrary; a fixed sign keeps stored vectors comparable
    across processes and hosts)."""
    if not 1 <= dims <= min(names.shape):  # no more directions than the names span
        raise ConfigError(f"concept dims must be between 1 and {min(names.shape)}, not {dims}")
    _, _, vh = torch.linalg.svd(names.double(), full_matrices=False)
    basis = vh[:dims].T
    sign = torch.sign(basis.gather(0, basis.abs().argmax(0, keepdim=True)))
    return (basis * sign).float()


class ConceptScorer:
    """Photo grids -> concept vectors; queries -> sentence vectors; their inner product is the zero-shot score."""

    def __init__(self, head_weight: Tensor, head_bias: Tensor, embedder, options: ConceptOptions | None = None,
                 lexicon=None):
        from ..features.concepts import load_lexicon

        self.options = options or ConceptOptions()
        self.lexicon = lexicon or load_lexicon()
        if head_weight.shape[0] != self.lexicon.n_classes:
            raise ConfigError(f"the backbone's head has {head_weight.shape[0]} classes; the lexicon names "
                              f"{self.lexicon.n_classes}")
        self.weight = head_weight.float()
        self.bias = head_bias.float()
        self.embedder = embedder
        self.cover = self.lexicon.cover_matrix()  # (nodes, classes): 1 where the node is the class or above it
        leaves = self.cover.sum(1)
        self.specificity = torch.log(self.lexicon.n_classes / leaves).clamp(min=0) ** self.options.ic_power
        self.specificity = self.specificity * (leaves <= self.options.max_leaves)
        if not self.options.tree:  # ConSE: the classes alone
            self.specificity = torch.zeros_like(self.specificity)
            self.specificity[: self.lexicon.n_classes] = 1.0
        self._names: Tensor | None = None

    def name_vectors(self) -> Tensor:
        """(nodes, H) unit vectors of each node's names (the template filled with each name, averaged): made once
        per scorer, from this process's memo, the cache file or the text model."""
        if self._names is not None:
            return self._names
        key = (self.lexicon.digest, self.embedder.content_hash(), self.options.template)
        self._names = _NAMES.get(key)
        path = name_cache_path(key)
        if self._names is None and path.is_file():
            try:
                self._names = _NAMES[key] = torch.from_numpy(np.load(path, allow_pickle=False))
            except (OSError, ValueError):
                self._names = None  # a damaged cache file: made again below
        if self._names is None:
            texts, owner = [], []
            for i, names in enumerate(self.lexicon.names):
                for n in names[:3]:
                    texts.append(self.options.template.format(n))
                    owner.append(i)
            vecs = self.embedder.embed(texts)
            sums = torch.zeros(len(self.lexicon.names), vecs.shape[1]).index_add_(0, torch.tensor(owner), vecs)
            self._names = _NAMES[key] = torch.nn.functional.normalize(sums, dim=-1)
            try:  # written whole or not at all; a cache that cannot be written is only slower, never an error
                save_npy(path, self._names.numpy().astype(np.float32))
            except (OSError, DataError):
                pass
        return self._names

    def node_weights(self, grid: Tensor) -> Tensor:
        """(B, nodes) weights of the concept vector: probability x specificity, all but the top_k zeroed."""
        logits = grid.float().mean(1) @ self.weight.T + self.bias
        p = torch.softmax(logits / self.options.temperature, dim=-1)
        w = (p @ self.cover.T) * self.specificity
        k = min(self.options.top_k, w.shape[1])
        top = w.topk(k, dim=1)
        return torch.zeros_like(w).scatter_(1, top.indices, top.values)

    @torch.no_grad()
    def photo_vectors(self, grid: Tensor) -> Tensor:
        """(B, cells, dim) backbone grids -> (B, H) unit concept vectors."""
        w = self.node_weights(grid)
        if not self.options.unit:
            return (w / w.sum(1, keepdim=True).clamp(min=1e-12)) @ self.name_vectors()
        return torch.nn.functional.normalize(w @ self.name_vectors(), dim=-1)
