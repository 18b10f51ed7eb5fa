"""CAAN: Context-Aware Attention Network (Zhang, Lei, Zhang, Li; CVPR 2020). No public code: the
paper's equations are the specification.

Notation: regions v_i (i = 1..k) and words u_j (j = 1..n), both D-dimensional (eq. 1-4, SCAN's
encoders). Per pair:
    H      = tanh(Vᵀ K U)                                   (k x n, eq. 7)
    H^uv_ij = [H_ij]_+ / ||[H_:j]_+||   (over regions)     (eq. 12)
    H^vu_ij = [H_ij]_+ / ||[H_i:]_+||   (over words)       (eq. 13)
Intra-modal context (eq. 14-17):
    FA: H^v = Vᵀ M1 V (k x k),  H^u = Uᵀ M2 U (n x n)
    SA: H^v_ii' = cos(H^uv_i:, H^uv_i':)  (each region's response over the words)
        H^u_jj' = cos(H^vu_:j, H^vu_:j')  (each word's response over the regions)
Attention (eq. 8-11), **the reading taken here**: the paper writes f = softmax(W^v f̃) with
f̃ = tanh(H^v Vᵀ Q1 + H^uv Uᵀ Q2); for this to give one weight per region the products must be
read row-wise, i.e. for region i
    f̃_i = tanh( Σ_i' H^v_ii' Q1ᵀ v_i'  +  Σ_j H^uv_ij Q2ᵀ u_j )   (m-dim),   f = softmax_i(w_vᵀ f̃_i)
and for word j (H^vu enters transposed, the only way its shape fits)
    g̃_j = tanh( Σ_j' H^u_jj' Q3ᵀ u_j'  +  Σ_i H^vu_ij Q4ᵀ v_i ),               g = softmax_j(w_uᵀ g̃_j).
Q1..Q4 are D x m, w_v, w_u are m-vectors (the paper's W^v, W^u). Then v̂ = V f, û = U g and
S = <v̂, û> (eq. 5-6, §3.4); with ``norm_output`` (default) v̂ and û are l2-normalised first,
i.e. S is their cosine, which keeps the hinge margin of 0.2 meaningful.
Variants (Table 4): baseline (mean pooling), IA (inter only), FA / SA (intra only), IA+FA, and
CAAN = IA+SA. Absent regions and padded words are masked everywhere.

Fast form: per-image (V K, V Q1, V Q4, FA's H^v V Q1, V Vᵀ) and per-caption terms (U Q2, U Q3,
FA's H^u U Q3, U Uᵀ) are computed once in ``encode_*``; the pair part needs two region-word
GEMMs (Vᵀ K U and Vᵀ U) and batched products for the attention terms; <v̂, û> = fᵀ (Vᵀ U) g and
||v̂||² = fᵀ (Vᵀ V) f, so v̂ and û are never materialised.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Literal

import torch
from torch import Tensor, nn

from ..encoders.image import RegionProjection
from ..encoders.text import GRUTextEncoder
from .attention import cross_sim, masked_softmax
from .base import EPS, ImageEncoding, MatchingModel, ModelConfig, TextEncoding, l2norm, length_mask, safe_sqrt
from .registry import register


@dataclass
class CAANConfig(ModelConfig):
    inter: bool = True  # inter-modal attention (IA)
    intra: Literal["none", "feature", "semantic"] = "semantic"  # none | feature (FA) | semantic (SA)
    attn_dim: int = 256  # m
    no_imgnorm: bool = False
    no_txtnorm: bool = False
    norm_output: bool = True
    bi_gru: bool = True
    num_layers: int = 1
    precomp_enc_type: Literal["basic", "weight_norm"] = "basic"
    gemm_dtype: Literal["float32", "bfloat16", "float16"] = "float32"


@dataclass
class CAANImages(ImageEncoding):
    vk: Tensor | None = None  # V K, (B, k, D)
    p1: Tensor | None = None  # V Q1 (or FA: H^v V Q1), (B, k, m)
    p4: Tensor | None = None  # V Q4, (B, k, m)
    gram: Tensor | None = None  # V Vᵀ, (B, k, k)


@dataclass
class CAANTexts(TextEncoding):
    p2: Tensor | None = None  # U Q2, (B, n, m)
    p3: Tensor | None = None  # U Q3 (or FA: H^u U Q3), (B, n, m)

    per_word_fields = ("words", "p2", "p3")


def _unit(x: Tensor, dim: int) -> Tensor:
    return x / (torch.linalg.vector_norm(x, dim=dim, keepdim=True) + EPS)


class CAAN(MatchingModel):
    Config = CAANConfig

    def __init__(self, cfg: CAANConfig):
        super().__init__(cfg)
        if cfg.intra not in ("none", "feature", "semantic"):
            raise ValueError(f"intra must be none, feature or semantic, not {cfg.intra!r}")
        d, m = cfg.embed_dim, cfg.attn_dim
        self.img_enc = RegionProjection(cfg.img_dim, d, cfg.precomp_enc_type)
        self.txt_enc = GRUTextEncoder(cfg.vocab_size, cfg.word_dim, d, cfg.num_layers, cfg.bi_gru)
        if self.attends:
            def mat(rows, cols):
                return nn.Parameter(torch.randn(rows, cols) / rows ** 0.5)

            if cfg.intra != "none":
                self.Q1, self.Q3 = mat(d, m), mat(d, m)
            if cfg.inter:
                self.Q2, self.Q4 = mat(d, m), mat(d, m)
            self.w_v, self.w_u = nn.Parameter(torch.randn(m) / m ** 0.5), nn.Parameter(torch.randn(m) / m ** 0.5)
            if cfg.inter or cfg.intra == "semantic":
                self.K = nn.Parameter(torch.eye(d) + torch.randn(d, d) * 0.01)
            if cfg.intra == "feature":
                self.M1 = nn.Parameter(torch.eye(d) + torch.randn(d, d) * 0.01)
                self.M2 = nn.Parameter(torch.eye(d) + torch.randn(d, d) * 0.01)

    @property
    def attends(self) -> bool:
        return self.cfg.inter or self.cfg.intra != "none"

    @property
    def _needs_h(self) -> bool:
        return self.cfg.inter or self.cfg.intra == "semantic"

    # --- pair-independent ------------------------------------------------------------------
    def encode_images(self, features: Tensor, mask: Tensor | None = None) -> CAANImages:
        v = self.img_enc(features)
        if not self.cfg.no_imgnorm:
            v = l2norm(v)
        return self.prepare_images(ImageEncoding(regions=v, mask=mask))

    def encode_texts(self, tokens: Tensor, lengths: Tensor) -> CAANTexts:
        words, _ = self.txt_enc(tokens, lengths)
        if not self.cfg.no_txtnorm:
            words = l2norm(words)
        return self.prepare_texts(TextEncoding(lengths=lengths, words=words))

    def prepare_images(self, img: ImageEncoding) -> CAANImages:
        """Per-image terms from projected regions (kept out of the pair loop)."""
        v, mask = img.regions, img.mask
        out = CAANImages(regions=v, mask=mask, gram=v @ v.transpose(1, 2))
        if not self.attends:
            return out
        if self.cfg.intra != "none":
            out.p1 = v @ self.Q1
        if self.cfg.inter:
            out.p4 = v @ self.Q4
        if self._needs_h:
            out.vk = v @ self.K
        if self.cfg.intra == "feature":  # H^v V Q1 with H^v = Vᵀ M1 V, summed over valid regions only
            hv = (v @ self.M1) @ v.transpose(1, 2)
            if mask is not None:
                hv = hv * mask[:, None, :].to(hv.dtype)
            out.p1 = hv @ out.p1
        return out

    def prepare_texts(self, txt: TextEncoding) -> CAANTexts:
        u, lengths = txt.words, txt.lengths
        out = CAANTexts(lengths=lengths, words=u)
        if not self.attends:
            return out
        if self.cfg.inter:
            out.p2 = u @ self.Q2
        if self.cfg.intra != "none":
            out.p3 = u @ self.Q3
        if self.cfg.intra == "feature":
            hu = (u @ self.M2) @ u.transpose(1, 2)
            hu = hu * length_mask(lengths, u.shape[1])[:, None, :].to(hu.dtype)
            out.p3 = hu @ out.p3
        return out

    # --- pair-dependent --------------------------------------------------------------------
    def attention(self, img: CAANImages, txt: CAANTexts) -> tuple[Tensor, Tensor]:
        """Region weights f (Ni, k, Nt) and word weights g (Ni, Nt, n) of every pair."""
        f, g = self._weights(img, txt.trim())
        return f.transpose(1, 2), g

    def pair_attention(self, img: CAANImages, txt: CAANTexts) -> dict:
        """One pair's attention. CAAN attends once per modality: f over the k regions and g over the n
        words (eq. 8-11), and S = fᵀ (V Uᵀ) g / norms, so f_i g_j is the weight of the (region i,
        word j) term of the score: ``weights`` is that (k, n) outer product ("pair": it sums to 1
        over the whole matrix; word j's column is f scaled by g_j). f and g themselves are returned
        as ``region_weights`` and ``word_weights``."""
        f, g = self.attention(img, txt)
        f, g = f[0, :, 0].detach().float().cpu(), g[0, 0].detach().float().cpu()
        return {"weights": torch.outer(f, g).numpy(), "axis": "pair", "region_weights": f.numpy(),
                "word_weights": g.numpy()}

    def _weights(self, img: CAANImages, txt: CAANTexts) -> tuple[Tensor, Tensor]:
        """f (Ni, Nt, k) and g (Ni, Nt, n). Everything pair-dependent is laid out (Ni, Nt, ., .)
        so the batched products need no permutation of the big (pair x k x m) tensors."""
        v, u = img.regions, txt.words
        ni, k, _ = v.shape
        nt, n, _ = u.shape
        rmask = None if img.mask is None else img.mask[:, None, :]  # (Ni, 1, k)
        wmask = length_mask(txt.lengths, n)[None]  # (1, Nt, n)
        if not self.attends:  # baseline: mean pooling
            f = torch.ones(ni, nt, k, dtype=v.dtype, device=v.device)
            if rmask is not None:
                f = f * rmask.to(v.dtype)
            g = wmask.to(u.dtype).expand(ni, nt, n)
            return f / f.sum(dim=2, keepdim=True), g / g.sum(dim=2, keepdim=True)
        c = self.cfg
        tv = img.p1[:, None] if c.intra == "feature" else 0.0  # (Ni, 1, k, m)
        tu = txt.p3[None] if c.intra == "feature" else 0.0  # (1, Nt, n, m)
        if self._needs_h:
            hp = torch.relu(torch.tanh(_pairs(cross_sim(img.vk, u, _dtype(c)))))  # (Ni, Nt, k, n)
            valid = wmask[:, :, None, :] if rmask is None else wmask[:, :, None, :] & rmask[:, :, :, None]
            hp = hp.masked_fill(~valid, 0.0)
            h_uv = _unit(hp, dim=2)  # over regions
            h_vu = _unit(hp, dim=3)  # over words
            if c.inter:
                tv = tv + h_uv @ txt.p2[None]  # Σ_j H^uv_ij Q2ᵀu_j
                tu = tu + h_vu.transpose(2, 3) @ img.p4[:, None]  # Σ_i H^vu_ij Q4ᵀv_i
            if c.intra == "semantic":
                r = _unit(h_uv, dim=3)  # rows of H^uv as unit vectors: H^v = R Rᵀ
                tv = tv + r @ (r.transpose(2, 3) @ img.p1[:, None])
                cu = _unit(h_vu, dim=2)  # columns of H^vu as unit vectors: H^u = Cᵀ C
                tu = tu + cu.transpose(2, 3) @ (cu @ txt.p3[None])
        logits_v = (torch.tanh(tv) @ self.w_v).expand(ni, nt, k)
        logits_u = (torch.tanh(tu) @ self.w_u).expand(ni, nt, n)
        return masked_softmax(logits_v, rmask, dim=2), masked_softmax(logits_u, wmask, dim=2)

    def score(self, img: CAANImages, txt: CAANTexts) -> Tensor:
        txt = txt.trim()
        f, g = self._weights(img, txt)  # (Ni, Nt, k), (Ni, Nt, n)
        u = txt.words
        s = _pairs(cross_sim(img.regions, u, _dtype(self.cfg)))  # v_i . u_j, (Ni, Nt, k, n)
        dot = ((f[:, :, None, :] @ s)[:, :, 0, :] * g).sum(dim=2)  # fᵀ S g = <v̂, û>
        if not self.cfg.norm_output:
            return dot
        v_sq = ((f[:, :, None, :] @ img.gram[:, None])[:, :, 0, :] * f).sum(dim=2)  # ||v̂||²
        u_gram = u @ u.transpose(1, 2)  # (Nt, n, n)
        u_sq = ((g[:, :, None, :] @ u_gram[None])[:, :, 0, :] * g).sum(dim=2)  # ||û||²
        return dot / (safe_sqrt(v_sq) * safe_sqrt(u_sq)).clamp(min=EPS)

    def bytes_per_pair(self, n_regions: int, n_words: int) -> int:
        m = self.cfg.attn_dim if self.attends else 0
        return 4 * (6 * n_regions * n_words + 3 * (n_regions + n_words) * m)


def _pairs(x: Tensor) -> Tensor:
    """(Ni, k, Nt, n) from the region-word GEMM -> (Ni, Nt, k, n), the layout of the pair work."""
    return x.permute(0, 2, 1, 3).contiguous()


def _dtype(cfg):
    return {"float32": None, "bfloat16": torch.bfloat16, "float16": torch.float16}[cfg.gemm_dtype]


_COMMON = dict(img_dim=2048, embed_dim=1024)
register("caan_baseline", CAAN, "CAAN baseline: mean pooling of regions and words", inter=False, intra="none",
         **_COMMON)
register("caan_ia", CAAN, "CAAN with inter-modal attention only", inter=True, intra="none", **_COMMON)
register("caan_fa", CAAN, "CAAN with feature-based intra-modal attention only", inter=False, intra="feature",
         **_COMMON)
register("caan_sa", CAAN, "CAAN with semantics-based intra-modal attention only", inter=False, intra="semantic",
         **_COMMON)
register("caan_ia_fa", CAAN, "CAAN: inter-modal + feature-based intra-modal attention", inter=True,
         intra="feature", **_COMMON)
register("caan", CAAN, "CAAN (full): inter-modal + semantics-based intra-modal attention", inter=True,
         intra="semantic", **_COMMON)
