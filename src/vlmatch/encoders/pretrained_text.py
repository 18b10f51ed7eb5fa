"""A pretrained transformer as the text side of a model whose paper uses a GRU / LSTM.

``PretrainedWords(path, out_dim)`` = a local Hugging Face BERT-family folder (:class:`HFTextEncoder`:
offline, frozen by default with its token outputs cached on disk) + one learned affine layer:

    E      = transformer(tokens)                 (B, L, H): the last layer, zero past each caption
    words  = E W_p + b_p                         (B, L, D): the word vectors the model's equations start from
    final  = (1/n) Σ_j words_j                   (B, D): the sentence vector (mean over the n tokens)

The tokens are the tokenizer's WordPiece ids including its own [CLS] and [SEP] (as the transformer
is fed); every one is a "word" of the model's equations. The mean is the pooling all-MiniLM-L6-v2 was
trained with, and since the layer is affine ``final = mean(E) W_p + b_p``. ``forward`` returns
``(words, final)`` like :class:`vlmatch.encoders.text.GRUTextEncoder`, so a model swaps one for the
other without touching its equations.

With ``finetune=True`` the transformer is a trained submodule (its weights are saved with the model's;
no cache). Frozen, it stays outside the parameter tree (a checkpoint records its folder and SHA-256);
``lora`` (a :class:`vlmatch.encoders.lora.LoRASpec`) trains low-rank adapters on it, saved alone.
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
