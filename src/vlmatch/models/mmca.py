"""MMCA: Multi-Modality Cross Attention Network (Wei, Zhang, Li, Zhang, Wu; CVPR 2020), from its equations (§3).

Notation as the paper's: regions R (k x d), token vectors E (n x H); a self-attention unit per modality gives
i0, c0 and one cross unit over [R; E W_t] gives i1, c1; S = i0·c0 + α i1·c1. The equations, the readings where
the paper is loose and the scoring layout: docs/models/mmca.md; the text encoder and its cache: the same page.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

import torch
import torch.nn.functional as F
from torch import Tensor, nn

from ..encoders.hf import HFTextEncoder
from ..errors import ConfigError
from ..options import option
from .base import (
    ImageEncoding,
    MatchingModel,
    ModelConfig,
    TextEncoding,
    l2norm,
    length_mask,
    masked_mean,
)
from .registry import register


@dataclass
class MMCAConfig(ModelConfig):
    alpha: float = option(0.2, min=0.0, doc="weight of i1·c1 (0: the self-attention-only ablation, no cross unit)")
    heads: int = option(16, min=1, max=1024, doc="heads of both Transformer units (must divide embed_dim)")
    ffn_dim: int = option(0, min=0, max=1 << 24, doc="FFN inner width (0: embed_dim, eq. 4)")
    cnn_filters: int = option(256, min=1, max=1 << 16, doc="filters per window size (1, 2, 3) of the 1-D CNNs")
    text_encoder: str = option("", doc="local Hugging Face folder ('' = the packaged all-MiniLM-L6-v2)")
    finetune: bool = option(False, doc="train the text encoder too (then its outputs are not cached)")
    text_cache: bool = option(True, doc="cache the frozen encoder's outputs on disk")
    max_tokens: int = option(64, min=3, max=4096, doc="WordPiece tokens per caption, [CLS] and [SEP] included")


@dataclass
class MMCAImages(ImageEncoding):
    # regions: R (B, k, d), the cross unit's input; embedding: i0 (B, d)
    q: Tensor | None = None  # R W^Q of the cross unit, (B, k, d)
    k: Tensor | None = None  # R W^K
    v: Tensor | None = None  # R W^V


@dataclass
class MMCATexts(TextEncoding):
    # words: E W_t + b_t (B, n, d), the cross unit's input; embedding: c0 (B, d)
    q: Tensor | None = None  # (B, n, d)
    k: Tensor | None = None
    v: Tensor | None = None

    per_word_fields = ("words", "q", "k", "v")


class TransformerUnit(nn.Module):
    """Fig. 3: multi-head attention and FFN, each with a residual connection followed by LayerNorm."""

    def __init__(self, d: int, heads: int, ffn_dim: int):
        super().__init__()
        if d % heads:
            raise ConfigError(f"embed_dim={d} is not divisible by heads={heads}")
        self.heads = heads
        self.wq, self.wk, self.wv, self.wo = (nn.Linear(d, d) for _ in range(4))
        self.norm1, self.norm2 = nn.LayerNorm(d), nn.LayerNorm(d)
        self.ffn = nn.Sequential(nn.Linear(d, ffn_dim), nn.ReLU(), nn.Linear(ffn_dim, d))

    def qkv(self, x: Tensor) -> tuple[Tensor, Tensor, Tensor]:
        return self.wq(x), self.wk(x), self.wv(x)

    def attend(self, q: Tensor, k: Tensor, v: Tensor, key_mask: Tensor | None) -> Tensor:
        """softmax(Q Kᵀ / sqrt(d_k)) V per head, heads concatenated (before W^O); (..., T, d) in and out."""
        *lead, t, d = q.shape
        h = self.heads

        def split(x):
            return x.reshape(-1, x.shape[-2], h, d // h).transpose(1, 2)

        mask = None if key_mask is None else key_mask.reshape(-1, 1, 1, key_mask.shape[-1])
        out = F.scaled_dot_product_attention(split(q), split(k), split(v), attn_mask=mask)
        return out.transpose(1, 2).reshape(*lead, t, d)

    def finish(self, x: Tensor, attended: Tensor) -> Tensor:
        """The rest of the unit after the heads: W^O, residual + LN, FFN, residual + LN."""
        x = self.norm1(x + self.wo(attended))
        return self.norm2(x + self.ffn(x))

    def forward(self, x: Tensor, key_mask: Tensor | None) -> Tensor:
        return self.finish(x, self.attend(*self.qkv(x), key_mask))


class TextCNNHead(nn.Module):
    """Eq. 6-7: windows 1, 2, 3 -> ReLU -> max over positions -> concat -> FC -> LayerNorm (-> l2norm)."""

    WINDOWS = (1, 2, 3)

    def __init__(self, width: int, filters: int, d: int):
        super().__init__()
        self.convs = nn.ModuleList(nn.Conv1d(width, filters, w) for w in self.WINDOWS)
        self.fc = nn.Linear(filters * len(self.WINDOWS), d)
        self.norm = nn.LayerNorm(d)

    def forward(self, x: Tensor, valid: Tensor) -> Tensor:
        """x (..., n, width) with ``valid`` (..., n) bool -> (..., d) unit vectors."""
        lead, n = x.shape[:-2], x.shape[-2]
        x = (x * valid[..., None].to(x.dtype)).reshape(-1, n, x.shape[-1]).transpose(1, 2)  # (N, width, n)
        m = valid.reshape(-1, 1, n).to(x.dtype)
        pooled = []
        for w, conv in zip(self.WINDOWS, self.convs, strict=True):
            p = torch.relu(conv(F.pad(x, (0, w - 1))))  # window from every position, zeros past the end
            pooled.append((p * m).amax(dim=2))  # ReLU >= 0: zeroing invalid positions leaves the max
        return l2norm(self.norm(self.fc(torch.cat(pooled, dim=1)))).reshape(*lead, -1)


class MMCA(MatchingModel):
    Config = MMCAConfig
    uses_vocab = False  # WordPiece tokens of the text encoder's own tokenizer

    def __init__(self, cfg: MMCAConfig):
        super().__init__(cfg)
        d = cfg.embed_dim
        ffn = cfg.ffn_dim or d
        self.text = HFTextEncoder(cfg.text_encoder, trainable=cfg.finetune, max_length=cfg.max_tokens)
        hidden = self.text.hidden_size
        self.img_fc = nn.Linear(cfg.img_dim, d)
        self.self_unit = TransformerUnit(d, cfg.heads, ffn)
        self.c0_head = TextCNNHead(hidden, cfg.cnn_filters, d)
        self.word_fc = nn.Linear(hidden, d)  # W_t: E to the cross unit's width
        self.cross_unit = TransformerUnit(d, cfg.heads, ffn)
        self.c1_head = TextCNNHead(d, cfg.cnn_filters, d)

    # --- text processing (the model's own tokenizer) ------------------------------------------
    def tokenize(self, captions: list[str]) -> tuple[Tensor, Tensor]:
        return self.text.tokenize(captions)

    def decode_tokens(self, tokens: Tensor, length: int) -> list[str]:
        return self.text.decode(tokens, length)

    def token_vectors(self, tokens: Tensor, lengths: Tensor) -> Tensor:
        """E: the text encoder's last layer (B, n, H), zero past each caption; cached when frozen."""
        return self.text.token_vectors(tokens, lengths, self.img_fc.weight.dtype, cache=self.cfg.text_cache)

    def prepare_captions(self, token_lists: list[list[int]], progress: bool = False) -> None:
        if self.cfg.text_cache and not self.cfg.finetune:
            self.text.prefill(token_lists, progress)

    # --- pair-independent ------------------------------------------------------------------
    def encode_images(self, features: Tensor, mask: Tensor | None = None) -> MMCAImages:
        r = self.img_fc(features)
        rs = self.self_unit(r, mask)
        i0 = l2norm(masked_mean(rs, None if mask is None else mask[..., None], dim=1))
        q, k, v = self.cross_unit.qkv(r)
        return MMCAImages(regions=r, mask=mask, embedding=i0, q=q, k=k, v=v)

    def encode_texts(self, tokens: Tensor, lengths: Tensor) -> MMCATexts:
        if lengths.min() < 1:
            raise ValueError("every caption needs at least one token")
        e = self.token_vectors(tokens, lengths)
        valid = length_mask(lengths, e.shape[1])
        c0 = self.c0_head(e, valid)
        w = self.word_fc(e)
        q, k, v = self.cross_unit.qkv(w)
        return MMCATexts(lengths=lengths, words=w, embedding=c0, q=q, k=k, v=v)

    # --- pair-dependent --------------------------------------------------------------------
    def cross_embeddings(self, img: MMCAImages, txt: MMCATexts) -> tuple[Tensor, Tensor]:
        """i1 (Ni, Nt, d) and c1 (Ni, Nt, d) of every pair of the block."""
        txt = txt.trim()
        ni, k, d = img.regions.shape
        nt, n, _ = txt.words.shape

        def stack(a, b):  # per-item token rows -> (Ni, Nt, k + n, d) per pair
            return torch.cat([a[:, None].expand(ni, nt, k, d), b[None].expand(ni, nt, n, d)], dim=2)

        wmask = length_mask(txt.lengths, n)[None].expand(ni, nt, n)
        rmask = (torch.ones(ni, k, dtype=torch.bool, device=wmask.device) if img.mask is None else img.mask)
        keys = torch.cat([rmask[:, None].expand(ni, nt, k), wmask], dim=2)  # (Ni, Nt, k + n)
        unit = self.cross_unit
        attended = unit.attend(stack(img.q, txt.q), stack(img.k, txt.k), stack(img.v, txt.v), keys)
        yc = unit.finish(stack(img.regions, txt.words), attended)
        rc, ec = yc[:, :, :k], yc[:, :, k:]
        i1 = l2norm(masked_mean(rc, None if img.mask is None else img.mask[:, None, :, None], dim=2))
        c1 = self.c1_head(ec, wmask)
        return i1, c1

    def score(self, img: MMCAImages, txt: MMCATexts) -> Tensor:
        s = img.embedding @ txt.embedding.T
        if self.cfg.alpha == 0:
            return s
        i1, c1 = self.cross_embeddings(img, txt)
        return s + self.cfg.alpha * (i1 * c1).sum(dim=-1)

    def bytes_per_pair(self, n_regions: int, n_words: int) -> int:
        if self.cfg.alpha == 0:
            return 8
        t, d, ffn = n_regions + n_words, self.cfg.embed_dim, self.cfg.ffn_dim or self.cfg.embed_dim
        # q, k, v, y, attention out, W^O out, two LN outputs, FFN hidden, conv outputs, softmax rows
        return 4 * (9 * t * d + t * ffn + 3 * n_words * self.cfg.cnn_filters * 2 + self.cfg.heads * t * t)

    def pair_flops(self, n_regions: int, n_words: int) -> dict[str, int]:
        """Per pair, the pair-dependent part: the cross unit over t = k + n tokens (Q Kᵀ and A V over all
        t tokens, 2 t² d, as the fused attention kernel computes them; W^O t d²; FFN 2 t d d_ff) and the
        c1 head (CNN n d f (1 + 2 + 3), FC 3 f d), plus the two dots: multiply-adds. Transcendentals: the
        softmax's exponentials (heads t²), the two LayerNorms' inverse square roots (2 t) and the two
        vector norms. ReLU and max-pooling are neither."""
        k, n, d = n_regions, n_words, self.cfg.embed_dim
        if self.cfg.alpha == 0:
            return {"macs": d, "transcendentals": 0}
        t, ffn, f = k + n, self.cfg.ffn_dim or d, self.cfg.cnn_filters
        return {"macs": 2 * t * t * d + t * d * d + 2 * t * d * ffn + 6 * n * d * f + 3 * f * d + 2 * d,
                "transcendentals": self.cfg.heads * t * t + 2 * t + 2}

    # --- stage 1 and heat maps ---------------------------------------------------------------
    def score_is_global(self) -> bool:
        return self.cfg.alpha == 0  # i0 . c0 alone

    def global_embeddings(self, img: ImageEncoding, txt: TextEncoding) -> tuple[Tensor, Tensor]:
        return img.embedding, txt.embedding

    def _word_region_attention(self, img: MMCAImages, txt: MMCATexts) -> tuple[Tensor, Tensor]:
        """Each word of caption b's cross-unit weights over the k regions of image b, averaged over the heads, (B, n, k)
        (a word's query attends to all k + n tokens: the mass missing went to words), and the (B, n) word mask."""
        b, k, d = img.regions.shape
        n, h = txt.q.shape[1], self.cfg.heads

        def heads(x):  # (B, t, d) -> (B, h, t, d / h)
            return x.reshape(b, x.shape[1], h, d // h).transpose(1, 2)

        keys = torch.cat([img.k, txt.k], dim=1)
        logits = heads(txt.q) @ heads(keys).transpose(2, 3) / (d // h) ** 0.5  # (B, h, n, k + n)
        wmask = length_mask(txt.lengths, n)
        rmask = torch.ones(b, k, dtype=torch.bool, device=wmask.device) if img.mask is None else img.mask
        valid = torch.cat([rmask, wmask], dim=1)[:, None, None, :]
        return torch.softmax(logits.masked_fill(~valid, float("-inf")), dim=-1)[..., :k].mean(dim=1), wmask

    def pair_attention(self, img: MMCAImages, txt: MMCATexts) -> dict:
        """Word -> region weights of the cross unit, averaged over heads, (k, n), axis "regions": each word's
        weights over the k regions, renormalised to sum to 1 over the regions."""
        with torch.no_grad():
            w = self._word_region_attention(img, txt.trim())[0][0].T  # (k, n): column j = word j's weights
            region_mass = w.sum(dim=0)
            w = w / region_mass.clamp(min=1e-12)
        return {"weights": w.float().cpu().numpy(), "axis": "regions",
                "region_mass": region_mass.float().cpu().numpy(), "heads_averaged": self.cfg.heads}

    def position_attention(self, features: Tensor, mask: Tensor | None, tokens: Tensor, lengths: Tensor) -> Tensor:
        """``pair_attention``'s weights for the pairs (image b, caption b) of a batch, (B, k, L): each word's
        cross-unit weights over the k regions, averaged over the heads and renormalised over the regions (column
        j sums to 1; padded words are 0). Differentiable: ``train.grounding_map: attention`` trains through it."""
        a, wmask = self._word_region_attention(self.shared("encode_images", self.encode_images, features, mask),
                                               self.shared("encode_texts", self.encode_texts, tokens, lengths))
        w = a / a.sum(dim=2, keepdim=True).clamp(min=1e-12)
        return w.transpose(1, 2).masked_fill(~wmask[:, None, :], 0.0)

    # --- checkpoints -------------------------------------------------------------------------
    def save_extra(self, directory: Path) -> None:
        self.text.save_record(directory)

    def load_extra(self, directory: Path) -> None:
        self.text.check_record(directory)


register("mmca", MMCA, "MMCA: self-attention + cross-attention Transformer units, pretrained BERT-family text encoder "
                      "(default: the packaged all-MiniLM-L6-v2; the paper's BERT-base as a local folder in "
                      "mmca_f30k / mmca_coco)", img_dim=2048, embed_dim=256)
