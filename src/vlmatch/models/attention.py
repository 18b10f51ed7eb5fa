"""Masked building blocks for cross attention over (images x regions x captions x words) blocks.

All functions take tensors laid out (Ni, k, Nt, L): image block, regions, caption block, words,
so one call covers every pair of a block. Masks broadcast to that layout.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import Tensor

from .base import EPS, masked_mean

RAW_FEATURE_NORMS = ("softmax", "l2norm", "clipped_l2norm", "l1norm", "clipped_l1norm", "clipped", "no_norm")
GEMM_DTYPES = {"float32": None, "bfloat16": torch.bfloat16, "float16": torch.float16}  # a config's gemm_dtype


def masked_softmax(x: Tensor, mask: Tensor | None, dim: int) -> Tensor:
    if mask is not None:
        x = x.masked_fill(~mask, float("-inf"))
    return torch.softmax(x, dim=dim)


def normalize_raw(s: Tensor, kind: str, dim: int, mask: Tensor | None, scale: float = 1.0) -> Tensor:
    """SCAN's ``raw_feature_norm`` of region-word similarities along the query axis ``dim``, times ``scale``.

    As in the official code, the "clipped" variants use LeakyReLU(0.1) rather than a hard [.]_+;
    ``l1norm`` divides by the sum of absolute values (the official code calls an undefined
    function there). Masked positions take no part and come out as 0. ``scale`` (SCAN's λ1) is
    folded into the small per-row divisor, which saves a pass over the block.
    """
    if kind not in RAW_FEATURE_NORMS:
        raise ValueError(f"raw_feature_norm must be one of {RAW_FEATURE_NORMS}, not {kind!r}")
    if kind == "softmax":
        out = masked_softmax(s, mask, dim)
        out = out if mask is None else out.masked_fill(~mask, 0.0)
        return out * scale if scale != 1.0 else out
    if kind.startswith("clipped"):
        s = F.leaky_relu(s, 0.1)
    if mask is not None:
        s = s.masked_fill(~mask, 0.0)
    if kind.endswith("l2norm"):
        return s * (scale / (torch.linalg.vector_norm(s, dim=dim, keepdim=True) + EPS))
    if kind.endswith("l1norm"):
        return s * (scale / (s.abs().sum(dim=dim, keepdim=True) + EPS))
    return s * scale if scale != 1.0 else s  # clipped, no_norm


def pool(r: Tensor, mask: Tensor | None, dim: int, how: str, lambda_lse: float) -> Tensor:
    """Pool relevance scores over ``dim``: avg, lse (stable LogSumExp / lambda), sum or max."""
    if how == "avg":
        return masked_mean(r, mask, dim)
    if how == "sum":
        return r.sum(dim=dim) if mask is None else r.masked_fill(~mask, 0.0).sum(dim=dim)
    if how == "max":
        return (r if mask is None else r.masked_fill(~mask, float("-inf"))).amax(dim=dim)
    if how == "lse":
        z = r * lambda_lse
        if mask is not None:
            z = z.masked_fill(~mask, float("-inf"))
        return torch.logsumexp(z, dim=dim) / lambda_lse
    raise ValueError(f"pooling must be avg, lse, sum or max, not {how!r}")


def cross_sim(v: Tensor, e: Tensor, dtype: torch.dtype | None = None) -> Tensor:
    """All region-word inner products of a block as one GEMM: (Ni, k, D) x (Nt, L, D) -> (Ni, k, Nt, L).

    With ``dtype`` (e.g. bfloat16) the product runs in that precision and returns float32.
    """
    ni, k, d = v.shape
    nt, n_words, _ = e.shape
    a, b = v.reshape(ni * k, d), e.reshape(nt * n_words, d)
    if dtype is not None and dtype != a.dtype:
        out = (a.to(dtype) @ b.to(dtype).T).float()
    else:
        out = a @ b.T
    return out.view(ni, k, nt, n_words)
