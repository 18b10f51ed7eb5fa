"""A pretrained transformer as the text side of a model whose paper uses a GRU / LSTM.

``PretrainedWords(path, out_dim)``: a local BERT-family folder (:class:`HFTextEncoder`) + one learned affine layer
on its token vectors: ``words = E W_p + b_p`` (B, L, D), every WordPiece token ([CLS], [SEP] included) a word of
the model's equations, and ``final`` their mean (the pooling all-MiniLM-L6-v2 was trained with). ``forward``
returns ``(words, final)`` like :class:`.text.GRUTextEncoder`, so a model swaps one for the other. ``finetune``
trains the transformer; ``lora`` (:class:`.lora.LoRASpec`) trains low-rank adapters on the frozen one.
"""

from __future__ import annotations

import os

import torch
from torch import Tensor, nn

from .hf import HFTextEncoder


class PretrainedWords(nn.Module):
    """Transformer token vectors -> learned affine layer -> (words (B, L, D), final (B, D))."""

    def __init__(self, path: str | os.PathLike | None, out_dim: int, *, finetune: bool = False, cache: bool = True,
                 max_tokens: int = 64, dropout: float = 0.0, context: bool = True, lora=None):
        super().__init__()
        self.context = context
        self.hf = HFTextEncoder(path, trainable=finetune, max_length=max_tokens, lora=lora)
        self.cache = cache
        self.proj = nn.Linear(self.hf.hidden_size, out_dim)
        self.drop = nn.Dropout(dropout)

    @property
    def hidden_size(self) -> int:
        return self.hf.hidden_size

    def token_vectors(self, tokens: Tensor, lengths: Tensor) -> Tensor:
        """E (B, L, H) in the layer's dtype, through the output cache when frozen. Without ``context``: the
        transformer's input embedding of each token (word-level: no token sees the others)."""
        if not self.context:
            mask = (torch.arange(tokens.shape[1], device=tokens.device)[None, :] < lengths[:, None]).to(self.proj.weight.dtype)
            with torch.set_grad_enabled(self.hf.trainable and torch.is_grad_enabled()):
                emb = self.hf.model.get_input_embeddings()(tokens).to(self.proj.weight.dtype)
            return emb * mask[..., None]
        return self.hf.token_vectors(tokens, lengths, self.proj.weight.dtype, cache=self.cache)

    def forward(self, tokens: Tensor, lengths: Tensor) -> tuple[Tensor, Tensor]:
        if lengths.min() < 1:
            raise ValueError("every caption needs at least one token")
        e = self.drop(self.token_vectors(tokens, lengths))
        mask = (lengths.new_tensor(range(e.shape[1]))[None, :] < lengths[:, None]).to(e.dtype)[..., None]
        words = self.proj(e) * mask
        final = words.sum(dim=1) / lengths.to(e.dtype)[:, None]
        return words, final
