"""Sentence vectors in a pretrained transformer's own space: the packaged all-MiniLM-L6-v2 as it was trained (mean
of the last layer's token vectors, unit length), without any model's adapters or projection. The open-vocabulary
scorer (:mod:`vlmatch.models.concepts`) meets concept names and queries here: the base space was trained on a
billion sentence pairs of every kind, a ranker's adapters on Flickr8k's captions.
"""

from __future__ import annotations

import os

import torch
from torch import Tensor

from .hf import HFTextEncoder, for_queries


class SentenceEmbedder:
    """``embed(texts) -> (n, H)`` unit vectors of a frozen transformer folder (default: the packaged MiniLM)."""

    def __init__(self, path: str | os.PathLike | None = None, lean: bool = True, encoder: HFTextEncoder | None = None):
        """``encoder``: embed with a model's own text encoder instead (a ranker's: its query forward is shared)."""
        self.encoder = encoder if encoder is not None else HFTextEncoder(path, trainable=False)
        if encoder is None:
            for_queries(self.encoder, lean=lean)  # the in-memory memo and the lean forward, as a search's queries
        self.dim = self.encoder.hidden_size

    def content_hash(self) -> str:
        return self.encoder.content_hash()

    @torch.no_grad()
    def embed(self, texts: list[str], batch_size: int = 256) -> Tensor:
        out = []
        for a in range(0, len(texts), batch_size):
            tokens, lengths = self.encoder.tokenize(list(texts[a:a + batch_size]))
            vecs = self.encoder.token_vectors(tokens, lengths, cache=False)  # zero past each text
            pooled = vecs.sum(1) / lengths[:, None].clamp(min=1).to(vecs.dtype)
            out.append(torch.nn.functional.normalize(pooled.float(), dim=-1))
        return torch.cat(out)
