"""CAAN's pair-dependent work without autograd (evaluation, search): the attention logits of a block of pairs and
their cosine, organised so that every product with m columns is one batched GEMM and nothing is copied in m.

The model runs the region-word GEMM and the normalisations of [H]_+ once for up to ``GEMM_PAIRS`` pairs, in a
layout that serves both the per-image GEMMs and the per-pair products without a copy (:class:`Terms`), and the
products with m columns in sub-blocks of at most ``SUB_PAIRS`` pairs, whose (pairs x (k + n) x m) tensors stay in
cache. Everything is written into buffers reused across calls (one set per thread): fresh multi-MB tensors fault
in every page on every call. w · tanh(t) = (2w) · σ(2t) - Σw is evaluated as (2w) · σ(2t) (aten's sigmoid is ~10x
faster than its tanh on CPU, ``benchmarks/roofline.py``; the constant -Σw leaves the softmax as it is), the 2
folded into the small per-item operands.
"""

from __future__ import annotations

import threading
from dataclasses import dataclass

import torch
from torch import Tensor

from .attention import cross_sim
from .base import EPS, safe_sqrt

SUB_PAIRS = 128  # pairs of one sub-block: (k + n) m floats each, 6 MB at k=36, n=12, m=256 in float32
GEMM_PAIRS = 2048  # pairs of one region-word GEMM: 7 k n floats each, 24 MB at k=36, n=12

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
class Terms:
    """[H]_+ of a block of pairs and what the attention reads of it, each (Ni, Nt, n, k): a pair's (k x n)
    matrix stored transposed, so that an image's rows over all captions form one (Nt·n x k) matrix."""
    h_uv: Tensor  # H^uv, over regions (eq. 12)
    h_vu: Tensor  # H^vu, over words (eq. 13)
    r: Tensor | None  # rows of H^uv as unit vectors (SA)
    c: Tensor | None  # columns of H^vu as unit vectors (SA)

    def rows(self, a: int, b: int) -> Terms:
        return Terms(*(None if t is None else t[a:b] for t in (self.h_uv, self.h_vu, self.r, self.c)))


@torch.no_grad()
def terms(vk: Tensor, words: Tensor, rmask: Tensor | None, wmask: Tensor | None, semantic: bool,
          gemm_dtype=None) -> Terms:
    """[H]_+ = tanh([V K Uᵀ]_+) of every pair of the block from one GEMM, and its normalisations."""
    (ni, k, d), (nt, n, _) = vk.shape, words.shape
    if gemm_dtype is None and vk.dtype == words.dtype:
        s = torch.mm(words.reshape(nt * n, d), vk.reshape(ni * k, d).T, out=buffer("s", (nt * n, ni * k), vk))
    else:
        s = cross_sim(words, vk, gemm_dtype).view(nt * n, ni * k)
    hp = buffer("hp", (ni, nt, n, k), vk).copy_(s.relu_().tanh_().view(nt, n, ni, k).permute(2, 0, 1, 3))
    if rmask is not None:
        hp.mul_(rmask[:, None, None, :].to(hp.dtype))
    if wmask is not None:
        hp.mul_(wmask[None, :, :, None].to(hp.dtype))
    sq = torch.mul(hp, hp, out=buffer("sq", hp.shape, hp))
    out = Terms(_unit(hp, sq, 3, "h_uv"), _unit(hp, sq, 2, "h_vu"), None, None)  # over regions; over words
    if semantic:  # rows of H^uv and columns of H^vu as unit vectors (eq. 16-17)
        out.r = _unit(out.h_uv, torch.mul(out.h_uv, out.h_uv, out=sq), 2, "r")
        out.c = _unit(out.h_vu, torch.mul(out.h_vu, out.h_vu, out=sq), 3, "c")
    return out


@torch.no_grad()
def logits(h: Terms, p: dict[str, Tensor], w2_v: Tensor, w2_u: Tensor, lv: Tensor, lu: Tensor) -> None:
    """The attention logits w_v · f̃_i + Σw_v into ``lv`` (Ni, Nt, k) and w_u · g̃_j + Σw_u into ``lu`` (Ni, Nt, n)
    of every pair of a sub-block, as (2w) · σ(2t) with ``w2_*`` = 2w (the constant Σw leaves the softmax as it is).

    ``p``: the doubled operands present, per image 2 V Q1 (``p1``), 2 V Q4 (``p4``), FA's 2 H^v V Q1 (``fa_v``);
    per pair 2 U Q2 and 2 U Q3 (``p2``, ``p3``: :func:`per_pair`); FA's per-caption 2 H^u U Q3 (``fa_u``)."""
    ni, nt, n, k = h.h_uv.shape
    pairs, like, m = ni * nt, h.h_uv, w2_v.shape[0]
    tv = tu = None
    if "p4" in p:  # Σ_i H^vu_ij 2Q4ᵀv_i: one GEMM per image
        tu = torch.bmm(h.h_vu.view(ni, nt * n, k), p["p4"], out=buffer("tu", (ni, nt * n, m), like)).view(pairs, n, m)
    if h.r is not None:
        x = torch.bmm(h.r.view(ni, nt * n, k), p["p1"], out=buffer("x", (ni, nt * n, m), like))  # Rᵀ 2VQ1
        r = h.r.view(pairs, n, k)
        tv = torch.bmm(r.mT, x.view(pairs, n, m), out=buffer("tv", (pairs, k, m), like))  # H^v 2VQ1 = R Rᵀ 2VQ1
        c = h.c.view(pairs, n, k)
        hu, p3 = torch.bmm(c, c.mT), p["p3"][:ni].reshape(pairs, n, m)  # H^u = Cᵀ C, (pairs, n, n)
        tu = torch.bmm(hu, p3, out=buffer("tu", (pairs, n, m), like)) if tu is None else tu.baddbmm_(hu, p3)
    if "p2" in p:
        p2, hv = p["p2"][:ni].reshape(pairs, n, m), h.h_uv.view(pairs, n, k).mT
        tv = torch.bmm(hv, p2, out=buffer("tv", (pairs, k, m), like)) if tv is None else tv.baddbmm_(hv, p2)
    if "fa_v" in p:  # FA's pair-independent terms
        tv = tv.view(ni, nt, k, m).add_(p["fa_v"][:, None]).view(pairs, k, m)
        tu = tu.view(ni, nt, n, m).add_(p["fa_u"][None]).view(pairs, n, m)
    torch.mv(tv.sigmoid_().view(-1, m), w2_v, out=lv.view(-1))
    torch.mv(tu.sigmoid_().view(-1, m), w2_u, out=lu.view(-1))


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
    """2 p of a per-caption operand (Nt, n, m) laid out per pair, (n_images, Nt, n, m), in this thread's buffer
    ``name``: written once per caption chunk, read by every image sub-block."""
    out = buffer(name, (n_images, *p.shape), p)
    return torch.mul(p[None].expand_as(out), 2, out=out)


def _unit(x: Tensor, sq: Tensor, dim: int, name: str) -> Tensor:
    """x / (||x|| + EPS) along ``dim`` (SCAN's l2norm) from ``sq`` = x², into this thread's buffer ``name``."""
    return torch.div(x, sq.sum(dim=dim, keepdim=True).sqrt_().add_(EPS), out=buffer(name, x.shape, x))
