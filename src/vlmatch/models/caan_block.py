"""CAAN's pair-dependent work without autograd (evaluation, search): the attention logits of a block of pairs and
their cosine, organised so that every product with m columns is one batched GEMM and nothing is copied in m.

The model cuts a block into sub-blocks of at most ``SUB_PAIRS`` pairs, whose (pairs x (k + n) x m) tensors stay
in the last-level cache, written into buffers reused across calls (one set per thread): fresh multi-MB tensors
fault in every page on every call. w · tanh(t) is evaluated as (2w) · σ(2t) - Σw (aten's sigmoid is ~10x faster
than its tanh on CPU, ``benchmarks/roofline.py``), the 2 folded into the small per-item operands.
"""

from __future__ import annotations

import threading
from dataclasses import dataclass

import torch
from torch import Tensor

from .attention import cross_sim
from .base import EPS, safe_sqrt

SUB_PAIRS = 128  # pairs of one sub-block: (k + n) m floats each, 6 MB at k=36, n=12, m=256 in float32

_LOCAL = threading.local()


def buffer(name: str, shape: tuple[int, ...], like: Tensor) -> Tensor:
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
                     out=buffer("s", (ni * k, nt * n), like)).view(ni, k, nt, n)
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
        tu = torch.bmm(h_vu.view(ni, k, nt * n).mT, op.p4, out=buffer("tu", (ni, nt * n, m), like)).view(pairs, n, m)
    if semantic:  # rows of H^uv and columns of H^vu as unit vectors (eq. 16-17), from the same squares
        r = h_uv * _inv_norm((sq * col_inv.square()).sum(dim=3, keepdim=True))
        c = h_vu * _inv_norm((sq * row_inv.square()).sum(dim=1, keepdim=True))
        x = torch.bmm(r.view(ni, k, nt * n).mT, op.p1, out=buffer("x", (ni, nt * n, m), like))  # Rᵀ 2VQ1
        tv = torch.bmm(_pairs(r), x.view(pairs, n, m), out=buffer("tv", (pairs, k, m), like))  # H^v 2VQ1
        cp = _pairs(c)
        hu, p3 = torch.bmm(cp.mT, cp), per_pair[1][:ni].reshape(pairs, n, m)  # H^u = Cᵀ C, (pairs, n, n)
        tu = torch.bmm(hu, p3, out=buffer("tu", (pairs, n, m), like)) if tu is None else tu.baddbmm_(hu, p3)
    if inter:
        p2, hv = per_pair[0][:ni].reshape(pairs, n, m), _pairs(h_uv)
        tv = torch.bmm(hv, p2, out=buffer("tv", (pairs, k, m), like)) if tv is None else tv.baddbmm_(hv, p2)
    if op.fa_v is not None:  # FA's pair-independent terms
        tv = tv.view(ni, nt, k, m).add_(op.fa_v[:, None]).view(pairs, k, m)
        tu = tu.view(ni, nt, n, m).add_(op.fa_u[None]).view(pairs, n, m)
    lv = torch.mv(tv.sigmoid_().view(-1, m), 2 * w_v).sub_(w_v.sum()).view(ni, nt, k)
    lu = torch.mv(tu.sigmoid_().view(-1, m), 2 * w_u).sub_(w_u.sum()).view(ni, nt, n)
    return lv, lu


def cosine(f: Tensor, g: Tensor, regions: Tensor, words: Tensor, gram_v: Tensor | None) -> Tensor:
    """<v̂, û> of every pair, v̂ = V f (one GEMM per image), û = U g (one per caption), in this thread's buffers;
    with ``gram_v`` (V Vᵀ per image) divided by ‖v̂‖ ‖û‖, ‖v̂‖² as fᵀ V Vᵀ f (k² a pair, not D)."""
    (ni, nt, _), d = f.shape, regions.shape[-1]
    v_hat = torch.bmm(f, regions, out=buffer("v_hat", (ni, nt, d), regions))
    u_hat = torch.bmm(g.transpose(0, 1), words, out=buffer("u_hat", (nt, ni, d), words))
    prod = buffer("prod", (ni, nt, d), words)
    dot = torch.mul(v_hat, u_hat.transpose(0, 1), out=prod).sum(dim=2)
    if gram_v is None:
        return dot
    v_sq, u_sq = (torch.bmm(f, gram_v) * f).sum(dim=2), torch.mul(u_hat, u_hat, out=prod.view(nt, ni, d)).sum(dim=2).T
    return dot / (safe_sqrt(v_sq) * safe_sqrt(u_sq)).clamp(min=EPS)


def per_pair(p: Tensor, n_images: int, name: str) -> Tensor:
    """A per-caption operand (Nt, n, m) laid out per pair, (n_images, Nt, n, m), in this thread's buffer
    ``name``: written once per caption chunk, read by every image sub-block."""
    out = buffer(name, (n_images, *p.shape), p)
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
