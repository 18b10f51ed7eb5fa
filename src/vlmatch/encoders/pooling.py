"""Image-side pooling of region vectors into one vector, for the global-embedding models.

``mean`` (VSE++), ``max`` (each dimension's largest value), and ``gpo``: VSE-infinity's Generalized Pooling
Operator (Chen et al., CVPR 2021), each dimension's values sorted and summed with weights that depend only on
the rank k and the number of regions K, ``theta_k = softmax_k(w . GRU(pe(k, K)) / 0.1)`` (a sinusoidal encoding
of size 32, a bidirectional GRU of 32 with its directions averaged), so one model serves grids of any size.
"""

from __future__ import annotations

import math

import torch
from torch import Tensor, nn


def position_encoding(k: int, d: int) -> Tensor:
    """Sinusoidal encoding (Vaswani et al.) of positions 1..k, shape (k, d)."""
    pos = torch.arange(1, k + 1, dtype=torch.float32)[:, None]
    div = torch.exp(torch.arange(0, d, 2, dtype=torch.float32) * (-math.log(10000.0) / d))
    pe = torch.zeros(k, d)
    pe[:, 0::2] = torch.sin(pos * div)
    pe[:, 1::2] = torch.cos(pos * div)
    return pe


class GPO(nn.Module):
    """Generalized pooling: a learned weighting of each dimension's sorted values (see the module)."""

    def __init__(self, d_pe: int = 32, d_hidden: int = 32, temperature: float = 0.1):
        super().__init__()
        self.d_pe, self.temperature = d_pe, temperature
        self.gru = nn.GRU(d_pe, d_hidden, batch_first=True, bidirectional=True)
        self.linear = nn.Linear(d_hidden, 1, bias=False)

    def rank_weights(self, counts: Tensor, k_max: int) -> Tensor:
        """(B, k_max) weights over the ranks for images with ``counts`` regions each (zero past the count)."""
        out = torch.zeros(counts.shape[0], k_max, device=counts.device)
        for k in counts.unique().tolist():  # one GRU pass per distinct region count (one for a grid)
            h, _ = self.gru(position_encoding(int(k), self.d_pe).to(self.linear.weight)[None])
            h = (h[..., : h.shape[-1] // 2] + h[..., h.shape[-1] // 2:]) / 2
            w = torch.softmax(self.linear(h)[0, :, 0] / self.temperature, dim=0)
            out[counts == k, : int(k)] = w.to(out.dtype)
        return out

    def forward(self, x: Tensor, mask: Tensor | None = None) -> Tensor:
        """x: (B, K, D) region vectors, mask: (B, K) true where a region exists -> (B, D)."""
        b, k_max, _ = x.shape
        counts = torch.full((b,), k_max, device=x.device) if mask is None else mask.sum(dim=1)
        if mask is not None:
            x = x.masked_fill(~mask.bool()[..., None], float("-inf"))
        ranked = x.sort(dim=1, descending=True).values
        weights = self.rank_weights(counts, k_max).to(x.dtype)
        ranked = torch.where(weights[..., None] > 0, ranked, torch.zeros_like(ranked))  # the -inf padding
        return (ranked * weights[..., None]).sum(dim=1)


def masked_max(x: Tensor, mask: Tensor | None) -> Tensor:
    """Each dimension's largest value over the existing regions: (B, K, D) -> (B, D)."""
    if mask is not None:
        x = x.masked_fill(~mask.bool()[..., None], float("-inf"))
    return x.max(dim=1).values


class RegionMLP(nn.Module):
    """VSE-infinity's image head: FC(v) + MLP(v) per region, the MLP two layers (img_dim -> D/2 -> D)."""

    def __init__(self, img_dim: int, embed_dim: int):
        super().__init__()
        self.mlp = nn.Sequential(nn.Linear(img_dim, embed_dim // 2), nn.ReLU(), nn.Linear(embed_dim // 2, embed_dim))

    def forward(self, features: Tensor) -> Tensor:
        return self.mlp(features)
