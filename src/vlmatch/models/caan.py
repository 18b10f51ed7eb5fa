"""CAAN: Context-Aware Attention Network (Zhang, Lei, Zhang, Li; CVPR 2020), built from the paper's equations
(there is no public code); docs/models/caan.md states them and the reading of eq. 8-11 taken here.

Per-image (V K, V Q1, V Q4, V Vᵀ, FA's H^v V Q1) and per-caption terms (U Q2, U Q3, FA's H^u U Q3) are computed
once in ``encode_*``. ``score`` runs the pair part in cache-sized sub-blocks without autograd
(:mod:`vlmatch.models.caan_block`) and through ``_weights`` with it (training); both are checked against the
loop-by-loop equations (tests/models/test_caan*.py).

Bundled configs (each ``caan*`` config in configs/ resolves to these options; tests/training/test_config.py checks it):
    caan*_f30k, caan*_coco, caan*_f8k, quickstart_caan    norm_output: true
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Literal

import torch
from torch import Tensor, nn

from ..encoders.image import RegionProjection
from . import caan_block
from .attention import GEMM_DTYPES, cross_sim, masked_softmax
from .base import EPS, ImageEncoding, MatchingModel, ModelConfig, TextEncoding, l2norm, length_mask, safe_sqrt
from .registry import register
from .text_side import TextSide, TextSideOptions


@dataclass
class CAANConfig(ModelConfig, TextSideOptions):
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

    # H = [tanh(V K Uᵀ)]_+ is normalised over regions and words: where its entries are near zero, a
    # float16 V K moves a pair's score by up to ~2e-2 (Flickr8k val); float32 keeps it at ~1e-5
    full_precision_fields = ("vk",)


@dataclass
class CAANTexts(TextEncoding):
    p2: Tensor | None = None  # U Q2, (B, n, m)
    p3: Tensor | None = None  # U Q3 (or FA: H^u U Q3), (B, n, m)

    per_word_fields = ("words", "p2", "p3")
    full_precision_fields = ("words",)  # the U in [tanh(V K Uᵀ)]_+, as CAANImages.vk


class CAAN(TextSide, MatchingModel):
    Config = CAANConfig

    def __init__(self, cfg: CAANConfig):
        super().__init__(cfg)
        d, m = cfg.embed_dim, cfg.attn_dim
        self.img_enc = RegionProjection(cfg.img_dim, d, cfg.precomp_enc_type)
        self.txt_enc = self.make_text_side()
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
        v = v if self.cfg.no_imgnorm else l2norm(v)
        return self.prepare_images(ImageEncoding(regions=v, mask=mask))

    def encode_texts(self, tokens: Tensor, lengths: Tensor) -> CAANTexts:
        words, _ = self.txt_enc(tokens, lengths)
        words = words if self.cfg.no_txtnorm else l2norm(words)
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
        """f (Ni, Nt, k) and g (Ni, Nt, n) of every pair of the blocks.

        Layout: the region-word GEMM gives H as (Ni, k, Nt, n); products with a per-image operand
        (V Q1, V Q4) read it as one GEMM per image (no copy), products with a per-caption operand
        (U Q2, U Q3) and the per-pair products use a caption-major copy (Nt, Ni, ., .). The big
        (pair x k x m) attention tensors are produced contiguous, accumulated and squashed in place.
        """
        v, u = img.regions, txt.words
        ni, k, _ = v.shape
        nt, n, _ = u.shape
        rmask = None if img.mask is None or bool(img.mask.all()) else img.mask  # (Ni, k)
        wmask = None if bool((txt.lengths == n).all()) else length_mask(txt.lengths, n)  # (Nt, n)
        if not self.attends:  # baseline: mean pooling
            f = v.new_ones(ni, nt, k) if rmask is None else rmask[:, None, :].to(v.dtype).expand(ni, nt, k)
            g = u.new_ones(ni, nt, n) if wmask is None else wmask[None].to(u.dtype).expand(ni, nt, n)
            return f / f.sum(dim=2, keepdim=True), g / g.sum(dim=2, keepdim=True)
        c = self.cfg
        tv = tu = None  # pre-activations of f̃ (Nt, Ni, k, m) and g̃ (Nt, Ni, n, m), caption-major
        if self._needs_h:
            hp = torch.relu(torch.tanh(cross_sim(img.vk, u, GEMM_DTYPES[c.gemm_dtype])))  # [H]_+, (Ni, k, Nt, n)
            if rmask is not None:
                hp = hp * rmask[:, :, None, None].to(hp.dtype)
            if wmask is not None:
                hp = hp * wmask[None, None].to(hp.dtype)
            h_uv = l2norm(hp, dim=1)  # over regions
            h_vu = l2norm(hp, dim=3)  # over words
            if c.inter:  # Σ_j H^uv_ij Q2ᵀu_j per caption;  Σ_i H^vu_ij Q4ᵀv_i per image
                tv = _per_caption(h_uv.permute(2, 0, 1, 3), txt.p2)
                tu = _per_image(h_vu, img.p4).transpose(0, 1)
            if c.intra == "semantic":
                r = l2norm(h_uv, dim=3)  # rows of H^uv as unit vectors: H^v = R Rᵀ, applied as R (Rᵀ V Q1)
                x = _per_image(r, img.p1).transpose(0, 1).reshape(nt * ni, n, -1)  # Rᵀ V Q1, (Nt*Ni, n, m)
                r_t = r.permute(2, 0, 1, 3).reshape(nt * ni, k, n)
                tv = torch.bmm(r_t, x).view(nt, ni, k, -1) if tv is None else tv.view(nt * ni, k, -1).baddbmm_(
                    r_t, x).view(nt, ni, k, -1)
                cu = l2norm(h_vu, dim=1).permute(2, 0, 1, 3).reshape(nt * ni, k, n)  # columns of H^vu, unit
                hu = torch.bmm(cu.transpose(1, 2), cu).view(nt, ni, n, n)  # H^u = Cᵀ C (n x n, formed first)
                tu = _per_caption(hu, txt.p3) if tu is None else _per_caption(hu, txt.p3).add_(tu)
        fresh = tv is not None
        if c.intra == "feature":  # pair-independent H^v V Q1 / H^u U Q3 (folded into p1 / p3)
            tv = img.p1[None] if tv is None else tv + img.p1[None]
            tu = txt.p3[:, None] if tu is None else tu + txt.p3[:, None]
        logits_v = _squash(tv, self.w_v, fresh).transpose(0, 1).expand(ni, nt, k)
        logits_u = _squash(tu, self.w_u, fresh).transpose(0, 1).expand(ni, nt, n)
        return (masked_softmax(logits_v, None if rmask is None else rmask[:, None, :], dim=2),
                masked_softmax(logits_u, None if wmask is None else wmask[None], dim=2))

    def score(self, img: CAANImages, txt: CAANTexts) -> Tensor:
        txt = txt.trim()
        if torch.is_grad_enabled() or not self._needs_h:
            f, g = self._weights(img, txt)  # (Ni, Nt, k), (Ni, Nt, n)
            return self._cosine(img, txt, f, g)
        return self._score_blocks(img, txt)

    def _score_blocks(self, img: CAANImages, txt: CAANTexts) -> Tensor:
        """Without autograd: [H]_+ and the cosine per GEMM block, the attention per sub-block
        (:mod:`vlmatch.models.caan_block`)."""
        ni, nt = len(img.regions), len(txt.lengths)
        cap_step = min(nt, caan_block.SUB_PAIRS)
        img_step = min(ni, max(1, caan_block.SUB_PAIRS // cap_step))
        gemm_step = min(ni, img_step * max(1, caan_block.GEMM_PAIRS // (img_step * cap_step)))
        out = img.regions.new_empty(ni, nt)
        c = self.cfg
        sem, fa = c.intra == "semantic", c.intra == "feature"
        twice = {key: torch.mul(getattr(img, f), 2, out=caan_block.buffer(f, getattr(img, f).shape, img.regions))
                 for f, key, on in (("p1", "fa_v" if fa else "p1", sem or fa), ("p4", "p4", c.inter))
                 if on}  # once per block; FA's p1 is its pair-independent H^v V Q1
        w2 = (2 * self.w_v, 2 * self.w_u)
        for t0 in range(0, nt, cap_step):
            tx = txt.select(slice(t0, t0 + cap_step))
            n_cap, n = tx.words.shape[:2]
            per_caption = {"p2": caan_block.per_pair(tx.p2, img_step, "p2")} if c.inter else {}
            if sem:
                per_caption["p3"] = caan_block.per_pair(tx.p3, img_step, "p3")
            if fa:  # FA's per-caption term
                per_caption["fa_u"] = 2 * tx.p3
            wmask = None if bool((tx.lengths == n).all()) else length_mask(tx.lengths, n)
            for g0 in range(0, ni, gemm_step):
                im = img.select(slice(g0, g0 + gemm_step))
                rmask = None if im.mask is None or bool(im.mask.all()) else im.mask
                h = caan_block.terms(im.vk, tx.words, rmask, wmask, sem, GEMM_DTYPES[c.gemm_dtype])
                n_img, k = im.vk.shape[:2]
                lv = caan_block.buffer("lv", (n_img, n_cap, k), im.vk)
                lu = caan_block.buffer("lu", (n_img, n_cap, n), im.vk)
                for a0 in range(0, n_img, img_step):
                    rows = slice(g0 + a0, g0 + a0 + img_step)
                    p = {f: t[rows] for f, t in twice.items()} | per_caption
                    caan_block.logits(h.rows(a0, a0 + img_step), p, *w2, lv[a0:a0 + img_step], lu[a0:a0 + img_step])
                f = masked_softmax(lv, None if rmask is None else rmask[:, None, :], dim=2)
                g = masked_softmax(lu, None if wmask is None else wmask[None], dim=2)
                out[g0:g0 + gemm_step, t0:t0 + cap_step] = caan_block.cosine(f, g, im.regions, tx.words,
                                                                             im.gram if c.norm_output else None)
        return out

    def _cosine(self, img: CAANImages, txt: CAANTexts, f: Tensor, g: Tensor) -> Tensor:
        """S = <v̂, û> (or their cosine) from the weights: v̂ = V f one GEMM per image, û = U g one per caption."""
        v_hat = torch.bmm(f, img.regions)  # (Ni, Nt, D)
        u_hat = torch.bmm(g.transpose(0, 1), txt.words).transpose(0, 1)  # (Ni, Nt, D), caption-major storage
        dot = torch.linalg.vecdot(v_hat, u_hat)  # <v̂, û>
        if not self.cfg.norm_output:
            return dot
        v_sq, u_sq = torch.linalg.vecdot(v_hat, v_hat), torch.linalg.vecdot(u_hat, u_hat)
        return dot / (safe_sqrt(v_sq) * safe_sqrt(u_sq)).clamp(min=EPS)

    def pair_flops(self, n_regions: int, n_words: int) -> dict[str, int]:
        """Counted from eq. 5-17 with the per-item products (V K, V Q1, V Q4, U Q2, U Q3, FA's H^v V Q1,
        H^u U Q3, V Vᵀ) outside the pair. H = tanh(Vᵀ K U): k n D and k n tanh; the two
        normalisations of [H]_+: 4 k n and k + n sqrt. IA: H^uv (U Q2) and H^vuᵀ (V Q4), 2 k n m. SA: the
        cosines (4 k n, k + n sqrt), then H^v V Q1 as R (Rᵀ V Q1) or (R Rᵀ) V Q1, whichever is
        cheaper (min(2 k n m, k² (n + m))), the same for H^u (min(2 k n m, n² (k + m))). Attention: tanh
        of (k + n) m-vectors, their (k + n) m dot products with w, (k + n) exp. Score: v̂ = V f,
        û = U g, their inner product and norms ((k + n + 3) D, 2 sqrt). Without any pair-dependent
        attention (baseline, FA only) f and g belong to the items and only <v̂, û> is left (D)."""
        c = self.cfg
        k, n, d, m = n_regions, n_words, c.embed_dim, c.attn_dim
        if not self._needs_h:  # baseline / FA: v̂ and û are per item
            return {"macs": d, "transcendentals": 0}
        macs, trans = k * n * d + 4 * k * n, k * n + k + n
        if c.inter:
            macs += 2 * k * n * m
        if c.intra == "semantic":
            macs += 4 * k * n + min(2 * k * n * m, k * k * (n + m)) + min(2 * k * n * m, n * n * (k + m))
            trans += k + n
        macs += (k + n) * m + (k + n + 3) * d
        trans += (k + n) * m + k + n + 2
        return {"macs": macs, "transcendentals": trans}

    def bytes_per_pair(self, n_regions: int, n_words: int) -> int:
        """The block path's working set per pair: the region-word products, [H]_+ and what is read of it (7 k n),
        the logits and weights (2 (k + n)), v̂, û and their product (3 D); the (k + n) m attention tensors are
        bounded by ``caan_block.SUB_PAIRS``, not by the block."""
        k, n = n_regions, n_words
        return 4 * (7 * k * n + 2 * (k + n) + 3 * self.cfg.embed_dim) if self._needs_h else 4 * 3 * self.cfg.embed_dim


def _per_image(h: Tensor, p: Tensor) -> Tensor:
    """Σ_i h[a, i, b, j] p[a, i, :] for every pair: (Ni, k, Nt, n) x (Ni, k, m) -> (Ni, Nt, n, m),
    one GEMM per image reading h in place (its (Nt, n) rows are contiguous)."""
    ni, k, nt, n = h.shape
    return torch.bmm(h.reshape(ni, k, nt * n).transpose(1, 2), p).view(ni, nt, n, -1)


def _per_caption(h: Tensor, p: Tensor) -> Tensor:
    """Σ_j h[b, a, r, j] p[b, j, :]: caption-major h (Nt, Ni, r, n) x p (Nt, n, m) -> (Nt, Ni, r, m),
    one GEMM per caption."""
    nt, ni, r, n = h.shape
    return torch.bmm(h.reshape(nt, ni * r, n), p).view(nt, ni, r, -1)


def _squash(t: Tensor, w: Tensor, fresh: bool) -> Tensor:
    """w · tanh(t) over the last axis; ``fresh``: t is this block's own temporary, squashed in place.

    Through tanh(x) = 2 σ(2x) - 1: w · tanh(t) = (2w) · σ(2t) - Σw. Same value to float rounding, and
    on CPU aten's sigmoid runs about 10x faster than its tanh (``benchmarks/roofline.py`` measures both;
    one host's figures are in benchmarks/results/host_notes.md): (pairs x (k + n) x m) of them are CAAN's
    largest elementwise work."""
    s = t.mul_(2).sigmoid_() if fresh else torch.sigmoid(2 * t)
    return s @ (2 * w) - w.sum()


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
