"""CAAN's pair-dependent work for a block of (image, caption) pairs: the attention weights f, g (eq. 7-17)
organised so that every product with m columns is one batched GEMM and nothing is copied in m.

Layout. The region-word GEMM gives [H]_+ as (Ni, k, Nt, n). Its normalisations (eq. 12-13 and SA's
cosines, eq. 16-17) are per pair and cheap (k n values a pair), computed once from the squared entries.
Products with a per-image operand (Σ_i H^vu_ij Q4ᵀv_i and SA's Rᵀ (V Q1)) read that layout in place, one
GEMM per image (contraction over the k regions); the per-pair products (R X, H^uv (U Q2), H^u (U Q3))
use the pair-major (Ni·Nt, k, n) copy of the small matrices; the per-caption operands U Q2, U Q3 are
laid out per pair once per caption chunk and reused by every image sub-block.

Cache and memory. Used under ``torch.no_grad`` only (evaluation, search; training keeps
``CAAN._weights``' autograd-safe form): the model cuts a block into sub-blocks of at most ``SUB_PAIRS``
pairs whose (pairs x (k + n) x m) attention tensors stay in the last-level cache, and they are written
into buffers reused from call to call (one set per thread): glibc maps every fresh block above its mmap
threshold anew, so fresh tensors of several MB fault in (and zero) every page on every call.

w · tanh(t) is evaluated as (2w) · σ(2t) - Σw (aten's sigmoid is about 10x faster than its tanh on CPU,
``benchmarks/roofline.py``); the factor 2 is folded into the small per-item operands (2 V Q1 ...), so
the big tensors see one GEMM write, one in-place sigmoid and one matrix-vector product.
"""

from __future__ import annotations

import threading
from dataclasses import dataclass

import torch
from torch import Tensor

from .attention import cross_sim
from .base import EPS

SUB_PAIRS = 128  # pairs of one sub-block: (k + n) m floats each, 6 MB at k=36, n=12, m=256 in float32

_LOCAL = threading.local()


def _buffer(name: str, shape: tuple[int, ...], like: Tensor) -> Tensor:
    """A scratch tensor of this thread, reused across calls (its contents are overwritten)."""
    pool = getattr(_LOCAL, "pool", None)
    if pool is None:
        pool = _LOCAL.pool = {}
    key = (name, like.dtype, like.device)
    t = pool.get(key)
    numel = 1
    for s in shape:
        numel *= s
    if t is None or t.numel() < numel:
        t = pool[key] = torch.empty(numel, dtype=like.dtype, device=like.device)
    return t[:numel].view(shape)


@dataclass
class Operands:
    """What a block's attention needs: regions' and words' per-item terms, factor 2 folded in."""
    vk: Tensor  # V K (Ni, k, D)
    words: Tensor  # U (Nt, n, D)
    p1: Tensor | None  # 2 V Q1 (SA) or None
    p4: Tensor | None  # 2 V Q4 (IA)
    p2: Tensor | None  # 2 U Q2 (IA)
    p3: Tensor | None  # 2 U Q3 (SA)
    fa_v: Tensor | None  # 2 H^v V Q1 (FA), (Ni, k, m)
    fa_u: Tensor | None  # 2 H^u U Q3 (FA), (Nt, n, m)
    rmask: Tensor | None  # (Ni, k) bool
    wmask: Tensor | None  # (Nt, n) bool


@torch.no_grad()
def logits(op: Operands, inter: bool, semantic: bool, w_v: Tensor, w_u: Tensor, *, gemm_dtype=None,
           per_pair: tuple[Tensor | None, Tensor | None] = (None, None)) -> tuple[Tensor, Tensor]:
    """The attention logits w_v · f̃_i (Ni, Nt, k) and w_u · g̃_j (Ni, Nt, n) of every pair of the block.

    ``per_pair``: 2 U Q2 and 2 U Q3 laid out per pair (at least Ni, Nt, n, m; :func:`per_pair`)."""
    ni, k, d = op.vk.shape
    nt, n, _ = op.words.shape
    pairs = ni * nt
    like = op.vk
    if gemm_dtype is None and like.dtype == op.words.dtype:
        s = torch.mm(op.vk.reshape(ni * k, d), op.words.reshape(nt * n, d).T,
                     out=_buffer("s", (ni * k, nt * n), like)).view(ni, k, nt, n)
    else:
        s = cross_sim(op.vk, op.words, gemm_dtype)
    hp = s.relu_().tanh_()  # [H]_+ = tanh([V K Uᵀ]_+)
    if op.rmask is not None:
        hp = hp * op.rmask[:, :, None, None].to(hp.dtype)
    if op.wmask is not None:
        hp = hp * op.wmask[None, None].to(hp.dtype)
    sq = hp * hp
    col_inv = _inv_norm(sq.sum(dim=1, keepdim=True))  # 1 / ||[H_:j]_+|| over regions, (Ni, 1, Nt, n)
    row_inv = _inv_norm(sq.sum(dim=3, keepdim=True))  # 1 / ||[H_i:]_+|| over words, (Ni, k, Nt, 1)
    h_uv, h_vu = hp * col_inv, hp * row_inv  # eq. 12, 13
    m = w_v.shape[0]
    tv = tu = None
    if inter:  # Σ_i H^vu_ij 2Q4ᵀv_i: one GEMM per image, reading H^vu in place
        tu = torch.bmm(h_vu.view(ni, k, nt * n).mT, op.p4, out=_buffer("tu", (ni, nt * n, m), like)).view(pairs, n, m)
    if semantic:  # rows of H^uv and columns of H^vu as unit vectors (eq. 16-17), from the same squares
        r = h_uv * _inv_norm((sq * col_inv.square()).sum(dim=3, keepdim=True))
        c = h_vu * _inv_norm((sq * row_inv.square()).sum(dim=1, keepdim=True))
        x = torch.bmm(r.view(ni, k, nt * n).mT, op.p1, out=_buffer("x", (ni, nt * n, m), like))  # Rᵀ 2VQ1
        tv = torch.bmm(_pairs(r), x.view(pairs, n, m), out=_buffer("tv", (pairs, k, m), like))  # H^v 2VQ1
        cp = _pairs(c)
        hu, p3 = torch.bmm(cp.mT, cp), per_pair[1][:ni].reshape(pairs, n, m)  # H^u = Cᵀ C, (pairs, n, n)
        tu = torch.bmm(hu, p3, out=_buffer("tu", (pairs, n, m), like)) if tu is None else tu.baddbmm_(hu, p3)
    if inter:
        p2, hv = per_pair[0][:ni].reshape(pairs, n, m), _pairs(h_uv)
        tv = torch.bmm(hv, p2, out=_buffer("tv", (pairs, k, m), like)) if tv is None else tv.baddbmm_(hv, p2)
    if op.fa_v is not None:  # FA's pair-independent terms
        tv = tv.view(ni, nt, k, m).add_(op.fa_v[:, None]).view(pairs, k, m)
        tu = tu.view(ni, nt, n, m).add_(op.fa_u[None]).view(pairs, n, m)
    lv = torch.mv(tv.sigmoid_().view(-1, m), 2 * w_v).sub_(w_v.sum()).view(ni, nt, k)
    lu = torch.mv(tu.sigmoid_().view(-1, m), 2 * w_u).sub_(w_u.sum()).view(ni, nt, n)
    return lv, lu


def per_pair(p: Tensor, n_images: int, name: str) -> Tensor:
    """A per-caption operand (Nt, n, m) laid out per pair, (n_images, Nt, n, m), in this thread's buffer
    ``name``: written once per caption chunk, read by every image sub-block."""
    out = _buffer(name, (n_images, *p.shape), p)
    return out.copy_(p[None].expand_as(out))


def release() -> None:
    """Drop this thread's reused buffers."""
    _LOCAL.pool = {}


def _pairs(h: Tensor) -> Tensor:
    """(Ni, k, Nt, n) -> (Ni·Nt, k, n), the pair-major copy of a small (k x n) per-pair matrix."""
    ni, k, nt, n = h.shape
    return h.permute(0, 2, 1, 3).reshape(ni * nt, k, n)


def _inv_norm(sq_sum: Tensor) -> Tensor:
    """1 / (sqrt(Σ x²) + EPS): SCAN's l2norm divisor."""
    return sq_sum.sqrt().add_(EPS).reciprocal_()
