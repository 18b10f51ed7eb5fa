"""Text encoders: word embedding -> (bi)GRU, SCAN style."""

from __future__ import annotations

from torch import Tensor, nn
from torch.nn.utils.rnn import pack_padded_sequence, pad_packed_sequence


class GRUTextEncoder(nn.Module):
    """Embedding (word_dim) -> GRU -> per-word vectors (B, L, D), zero past each caption, and a final vector (B, D).
    ``bidirectional``: the two directions' states averaged (SCAN's ``bi_gru``), at each word and at the ends."""

    def __init__(self, vocab_size: int, word_dim: int, embed_dim: int, num_layers: int = 1,
                 bidirectional: bool = True):
        super().__init__()
        self.embed = nn.Embedding(vocab_size, word_dim)
        self.rnn = nn.GRU(word_dim, embed_dim, num_layers, batch_first=True, bidirectional=bidirectional)
        self.bidirectional = bidirectional
        self.embed_dim = embed_dim
        nn.init.uniform_(self.embed.weight, -0.1, 0.1)

    def forward(self, tokens: Tensor, lengths: Tensor) -> tuple[Tensor, Tensor]:
        if lengths.min() < 1:
            raise ValueError("every caption needs at least one token")
        x = self.embed(tokens)
        packed = pack_padded_sequence(x, lengths.cpu(), batch_first=True, enforce_sorted=False)
        out, h = self.rnn(packed)
        out, _ = pad_packed_sequence(out, batch_first=True, total_length=tokens.shape[1])
        if self.bidirectional:
            out = (out[..., : self.embed_dim] + out[..., self.embed_dim:]) / 2
            final = (h[-2] + h[-1]) / 2
        else:
            final = h[-1]
        return out, final
