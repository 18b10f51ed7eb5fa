"""SCAN: Stacked Cross Attention (Lee, Chen, Hua, Hu, He; ECCV 2018) and the Sum-Max baselines.

Notation as the paper's: regions v_i, words e_j, similarities s_ij; each query item attends over the other
modality and the pooled cosines R(e_j, a_j) give S(I, T). The equations and the exact fast form (one GEMM per
block, ``cross_sim``): docs/models/scan.md.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Literal

import torch
from torch import Tensor

from ..encoders.image import RegionProjection
from ..errors import VlmatchError
from .attention import GEMM_DTYPES, RAW_FEATURE_NORMS, cross_sim, masked_softmax, normalize_raw, pool
from .base import EPS, ImageEncoding, MatchingModel, ModelConfig, TextEncoding, l2norm, length_mask, safe_sqrt
from .registry import register
from .text_side import TextSide, TextSideOptions


@dataclass
class SCANConfig(ModelConfig, TextSideOptions):
    direction: Literal["t2i", "i2t"] = "t2i"  # "t2i" (text-to-image) or "i2t" (image-to-text)
    method: Literal["attention", "summax"] = "attention"  # "attention" (SCAN) or "summax" (Sum-Max baseline)
    raw_feature_norm: Literal[RAW_FEATURE_NORMS] = "clipped_l2norm"
    lambda_softmax: float = 9.0  # λ1
    agg: Literal["avg", "lse", "sum", "max"] = "avg"  # avg | lse | sum | max
    lambda_lse: float = 6.0  # λ2
    precomp_enc_type: Literal["basic", "weight_norm"] = "basic"  # basic | weight_norm
    no_imgnorm: bool = False
    no_txtnorm: bool = False
    bi_gru: bool = True
    num_layers: int = 1
    gemm_dtype: Literal["float32", "bfloat16", "float16"] = "float32"  # precision of the region-word GEMM only
    # Normalise the raw region features before the projection (not in the paper; for grid features,
    # see experiments/results/flickr8k.md): none | l2 (each region to unit norm) | batchnorm (per channel).
    feature_norm: Literal["none", "l2", "batchnorm"] = "none"


class SCAN(TextSide, MatchingModel):
    Config = SCANConfig

    def __init__(self, cfg: SCANConfig):
        super().__init__(cfg)
        if cfg.feature_norm == "batchnorm":
            self.feat_bn = torch.nn.BatchNorm1d(cfg.img_dim)
        self.img_enc = RegionProjection(cfg.img_dim, cfg.embed_dim, cfg.precomp_enc_type)
        self.txt_enc = self.make_text_side()

    # --- pair-independent ------------------------------------------------------------------
    def _normalise_features(self, features: Tensor, mask: Tensor | None) -> Tensor:
        kind = self.cfg.feature_norm
        if kind == "l2":
            return l2norm(features)
        if kind == "batchnorm":  # statistics over the valid regions of the batch
            flat = features.reshape(-1, features.shape[-1])
            if mask is None:
                return self.feat_bn(flat).reshape(features.shape)
            out = torch.zeros_like(flat)
            keep = mask.reshape(-1)
            out[keep] = self.feat_bn(flat[keep])
            return out.reshape(features.shape)
        return features

    def encode_images(self, features: Tensor, mask: Tensor | None = None) -> ImageEncoding:
        v = self.img_enc(self._normalise_features(features, mask))
        v = v if self.cfg.no_imgnorm else l2norm(v)
        return ImageEncoding(regions=v, mask=mask)

    def encode_texts(self, tokens: Tensor, lengths: Tensor) -> TextEncoding:
        words, _ = self.txt_enc(tokens, lengths)
        words = words if self.cfg.no_txtnorm else l2norm(words)
        return TextEncoding(lengths=lengths, words=words)

    # --- pair-dependent --------------------------------------------------------------------
    def _block(self, img: ImageEncoding, txt: TextEncoding):
        txt = txt.trim()
        v, e = img.regions, txt.words
        s = cross_sim(v, e, GEMM_DTYPES[self.cfg.gemm_dtype])  # (Ni, k, Nt, L)
        rmask = None if img.mask is None or bool(img.mask.all()) else img.mask[:, :, None, None]
        # (1, 1, Nt, L) over words; None when no caption of the block is padded (length-sorted blocks)
        wmask = None if bool((txt.lengths == e.shape[1]).all()) else length_mask(txt.lengths, e.shape[1])[None, None]
        return v, e, s, rmask, wmask

    def attention(self, img: ImageEncoding, txt: TextEncoding) -> Tensor:
        """Attention weights of every pair of the blocks, (Ni, k, Nt, L).

        t2i: weights over regions for each word (sum to 1 over k); i2t: over words for each region.
        """
        _, _, s, rmask, wmask = self._block(img, txt)
        return self._alpha(s, rmask, wmask)

    def pair_attention(self, img: ImageEncoding, txt: TextEncoding) -> dict:
        """One pair's weights, (k, n): t2i each word's over regions ("regions"), i2t each region's over words."""
        att = self.attention(img, txt)[0, :, 0, :]
        return {"weights": att.detach().float().cpu().numpy(), "axis": "regions" if self.cfg.direction == "t2i" else "words"}

    def _diagonal(self, features: Tensor, mask: Tensor | None, tokens: Tensor, lengths: Tensor):
        """The diagonal pairs (image b, caption b) of a batch: v, e, s (B, k, 1, L), α, and the (B, k, L) mask of
        valid (region, word) terms."""
        img = self.shared("encode_images", self.encode_images, features, mask)
        txt = self.shared("encode_texts", self.encode_texts, tokens, lengths)
        v, e = img.regions, txt.words  # (B, k, D), (B, L, D)
        s = torch.einsum("bkd,bld->bkl", v, e)[:, :, None, :]  # the diagonal pairs as (B, k, 1, L)
        wmask = length_mask(lengths, e.shape[1])[:, None, None, :]  # (B, 1, 1, L)
        rmask = None if mask is None else mask[:, :, None, None]
        keep = wmask[:, 0] if rmask is None else wmask[:, 0] & rmask[:, :, 0]
        return v, e, s, self._alpha(s, rmask, wmask), keep

    def position_attention(self, features: Tensor, mask: Tensor | None, tokens: Tensor, lengths: Tensor) -> Tensor:
        """α of the pairs (image b, caption b), (B, k, L), as ``pair_attention`` shows it: t-i each word's weights
        over the regions (columns sum to 1), i-t each region's over the words (rows sum to 1). Padded words and
        masked regions are 0. Differentiable: ``train.grounding_map: attention`` trains through it."""
        if self.cfg.method != "attention":
            raise VlmatchError("SCAN's Sum-Max baseline has no attention weights")
        _, _, _, alpha, keep = self._diagonal(features, mask, tokens, lengths)
        return alpha[:, :, 0, :].masked_fill(~keep, 0.0)

    def position_contributions(self, features: Tensor, mask: Tensor | None, tokens: Tensor, lengths: Tensor) -> Tensor:
        """Exact for attention with AVG (or SUM) pooling: R(e_j, a_j) = Σ_i α_ij s_ij / (||e_j|| ||a_j||) is
        linear in the terms α_ij s_ij, so t-i's (region i, word j) share is α_ij s_ij / (||e_j|| ||a_j||) / n
        (i-t: α_ij s_ij / (||v_i|| ||a_i||) / k). LogSumExp and Max pooling do not decompose: they raise."""
        c = self.cfg
        if c.method != "attention" or c.agg not in ("avg", "sum"):
            raise VlmatchError(f"SCAN with {c.method} / {c.agg} pooling has no exact decomposition of its score over "
                               f"image positions (AVG and SUM pooling have one): use the gradient or occlusion method")
        v, e, s, alpha, keep = self._diagonal(features, mask, tokens, lengths)
        terms = (alpha * s)[:, :, 0, :].masked_fill(~keep, 0.0)  # (B, k, L)
        if c.direction == "t2i":
            a = torch.einsum("bkl,bkd->bld", alpha[:, :, 0, :], v)  # a_j
            denom = e.norm(dim=2) * safe_sqrt((a * a).sum(dim=2))  # (B, L)
            count = lengths.to(terms.dtype)
            out = terms / denom.clamp(min=EPS)[:, None, :]
        else:
            a = torch.einsum("bkl,bld->bkd", alpha[:, :, 0, :], e)  # a_i
            denom = v.norm(dim=2) * safe_sqrt((a * a).sum(dim=2))  # (B, k)
            count = (torch.full_like(lengths, v.shape[1]) if mask is None else mask.sum(dim=1)).to(terms.dtype)
            out = terms / denom.clamp(min=EPS)[:, :, None]
        if c.agg == "avg":
            out = out / count.clamp(min=1)[:, None, None]
        return out

    def _alpha(self, s: Tensor, rmask, wmask) -> Tensor:
        c = self.cfg
        if c.direction == "t2i":  # normalise along words, attend over regions
            s_bar = normalize_raw(s, c.raw_feature_norm, dim=3, mask=wmask, scale=c.lambda_softmax)
            return masked_softmax(s_bar, rmask, dim=1)
        s_bar = normalize_raw(s, c.raw_feature_norm, dim=1, mask=rmask, scale=c.lambda_softmax)
        return masked_softmax(s_bar, wmask, dim=3)

    def score(self, img: ImageEncoding, txt: TextEncoding) -> Tensor:
        c = self.cfg
        v, e, s, rmask, wmask = self._block(img, txt)
        ni, k, nt, n_words = s.shape
        if c.method == "summax":  # t-i: Σ_j max_i s_ij; i-t: Σ_i max_j s_ij
            if c.direction == "t2i":
                return pool(pool(s, rmask, 1, "max", 0.0), None if wmask is None else wmask[0], 2, "sum", 0.0)
            return pool(pool(s, wmask, 3, "max", 0.0), None if rmask is None else rmask[..., 0], 1, "sum", 0.0)

        alpha = self._alpha(s, rmask, wmask)
        if c.direction == "t2i":
            dot = torch.linalg.vecdot(alpha, s, dim=1)  # e_j . a_j, (Ni, Nt, L), fused multiply-sum
            q, d = nt * n_words, v.shape[2]
            if q * (k + 1) * d < k * k * d + q * k * (k + 1):  # few words (one query's re-scoring): a_j itself
                a = torch.bmm(alpha.reshape(ni, k, q).transpose(1, 2), v)  # (Ni, Nt*L, D)
                a_norm = safe_sqrt((a * a).sum(dim=2)).view(ni, nt, n_words)
            else:  # a batch: ||a_j||^2 = alpha_j^T G alpha_j with the per-image Gram G, shared by all words
                gram = v @ v.transpose(1, 2)  # (Ni, k, k)
                g_alpha = torch.bmm(gram, alpha.reshape(ni, k, q)).view(ni, k, nt, n_words)
                a_norm = safe_sqrt(torch.linalg.vecdot(alpha, g_alpha, dim=1))  # ||a_j||, (Ni, Nt, L)
            f_norm = e.norm(dim=2)[None]  # ||e_j||, (1, Nt, L)
            rel = dot / (f_norm * a_norm).clamp(min=EPS)
            return pool(rel, None if wmask is None else wmask[0], dim=2, how=c.agg, lambda_lse=c.lambda_lse)
        dot = torch.linalg.vecdot(alpha, s, dim=3)  # v_i . a_i, (Ni, k, Nt)
        gram = e @ e.transpose(1, 2)  # (Nt, L, L)
        a_t = alpha.permute(2, 0, 1, 3).reshape(nt, ni * k, n_words)
        h_alpha = torch.bmm(a_t, gram)  # (Nt, Ni*k, L), gram is symmetric
        a_norm = safe_sqrt(torch.linalg.vecdot(a_t, h_alpha, dim=2)).view(nt, ni, k).permute(1, 2, 0)
        f_norm = v.norm(dim=2)[..., None]  # ||v_i||, (Ni, k, 1)
        rel = dot / (f_norm * a_norm).clamp(min=EPS)
        return pool(rel, None if rmask is None else rmask[..., 0], dim=1, how=c.agg, lambda_lse=c.lambda_lse)

    def pair_flops(self, n_regions: int, n_words: int) -> dict[str, int]:
        """s_ij (k n D); Sum-Max adds only k n comparisons. Attention, with q queries attending over r
        items (t-i: the n words over the k regions): the raw norm of s (2 k n, one sqrt per item
        line), λ1-softmax (k n exp, k n), e_j . a_j = Σ_i α_ij s_ij (k n), ||a_j||² = α_jᵀ G α_j with
        the per-item Gram G (q (r² + r), cheaper than forming a_j: q (r + 1) D), the cosine and the
        pooling (2 q, q sqrt; LSE q exp + 1 log)."""
        c = self.cfg
        k, n, d = n_regions, n_words, c.embed_dim
        macs = k * n * d
        if c.method == "summax":
            return {"macs": macs, "transcendentals": 0}
        q, r = (n, k) if c.direction == "t2i" else (k, n)
        macs += 4 * k * n + q * min(r * r + r, (r + 1) * d) + 2 * q
        trans = k * n + r + q + (q + 1 if c.agg == "lse" else 0)
        return {"macs": macs, "transcendentals": trans}

    def bytes_per_pair(self, n_regions: int, n_words: int) -> int:
        # s, s̄, α, G·α (or their i2t twins) and temporaries, float32
        return 4 * n_regions * n_words * 7


_F30K = dict(embed_dim=1024, img_dim=2048)
register("scan_t2i_avg", SCAN, "SCAN text-to-image, AVG pooling (λ1=9)", direction="t2i", agg="avg",
         lambda_softmax=9.0, **_F30K)
register("scan_t2i_lse", SCAN, "SCAN text-to-image, LogSumExp pooling (λ1=9, λ2=6)", direction="t2i",
         agg="lse", lambda_softmax=9.0, lambda_lse=6.0, **_F30K)
register("scan_i2t_avg", SCAN, "SCAN image-to-text, AVG pooling (λ1=4)", direction="i2t", agg="avg",
         lambda_softmax=4.0, **_F30K)
register("scan_i2t_lse", SCAN, "SCAN image-to-text, LogSumExp pooling (λ1=4, λ2=5)", direction="i2t",
         agg="lse", lambda_softmax=4.0, lambda_lse=5.0, **_F30K)
register("summax_t2i", SCAN, "Sum-Max text-to-image baseline (SCAN eq. 9)", direction="t2i",
         method="summax", **_F30K)
register("summax_i2t", SCAN, "Sum-Max image-to-text baseline (SCAN eq. 10)", direction="i2t",
         method="summax", **_F30K)
