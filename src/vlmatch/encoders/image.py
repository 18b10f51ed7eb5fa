"""Image encoders over precomputed region (or grid) features."""

from __future__ import annotations

import math

from torch import Tensor, nn
from torch.nn.utils.parametrizations import weight_norm


class RegionProjection(nn.Module):
    """FC img_dim -> D on every region with SCAN's Xavier-uniform init (EncoderImagePrecomp); ``kind='weight_norm'``:
    weight-normalised (EncoderImageWeightNormPrecomp)."""

    def __init__(self, img_dim: int, embed_dim: int, kind: str = "basic"):
        super().__init__()
        fc = nn.Linear(img_dim, embed_dim)
        r = math.sqrt(6.0) / math.sqrt(img_dim + embed_dim)
        nn.init.uniform_(fc.weight, -r, r)
        nn.init.zeros_(fc.bias)
        if kind == "weight_norm":
            fc = weight_norm(fc, dim=None)
        elif kind != "basic":
            raise ValueError(f"unknown image encoder kind {kind!r} (basic, weight_norm)")
        self.fc = fc

    def forward(self, features: Tensor) -> Tensor:
        return self.fc(features)
