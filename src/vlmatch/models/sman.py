"""SMAN: Stacked Multi-modal Attention Network (Ji, Wang, Han, Pang; IEEE Trans. Cybernetics), from its equations.

Notation as the paper's: grid regions I_m (M of them), word vectors S_l; per level k the image and text vectors
v_k, t_k (k = 0: the queries, 1: intra-modal attention, 2: multi-modal attention with the fusion gate's queries
o_v, o_t); training score d = Σ_k cos(v_k, t_k). The equations, how each ambiguous one is read and the fast
form: docs/models/sman.md.

Bundled configs (each ``sman*`` config in configs/ resolves to these options; tests/training/test_config.py checks it):
    sman*_f30k, sman*_coco    score_mode: concat, grid_pool: 2, word_init: xavier, intra_scale: per_level, word_attention: eq5
    sman*_f8k                 score_mode: sum, grid_pool: 1, word_init: uniform, word_attention: eq5
    sman_f8k                  intra_scale: sum
    sman_minilm_f8k           intra_scale: per_level
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Literal

import torch
import torch.nn.functional as F
from torch import Tensor, nn
from torch.nn.utils.rnn import pack_padded_sequence, pad_packed_sequence

from ..errors import ConfigError
from ..options import option
from .attention import masked_softmax
from .base import (
    EPS,
    ImageEncoding,
    MatchingModel,
    ModelConfig,
    TextEncoding,
    differentiable_backward,
    l2norm,
    length_mask,
    masked_mean,
    safe_sqrt,
)
from .losses import hinge_triplet, intra_pair_hinge
from .registry import register
from .text_side import TextSide, TextSideOptions


@dataclass
class SMANConfig(ModelConfig, TextSideOptions):
    attn_dim: int = 512  # a: hidden size of the attention perceptrons
    stacked: bool = True  # the multi-modal attention step (eq. 12-18)
    location: bool = True  # the GRU location query v_loc (eq. 3-4)
    alpha: float = option(0.9, min=0.0, max=1.0, doc="fusion ratio α of eq. 12")
    score_mode: Literal["concat", "sum"] = "concat"  # evaluation: cosine of [v0,v1,v2] (§III-C.2) | Σ cosines (eq. 20)
    word_combine: Literal["sum", "mean"] = "sum"  # S_l = h_f + h_b (eq. 1) | the prose's averaging
    dropout: float = option(0.3, min=0.0, max=1.0, doc="dropout on region features and word embeddings")
    intra_weight: float = option(1.0, min=0.0, doc="λ of eq. 23 (0: SMAN-inter)")
    intra_margin: float = 0.25  # m2 of eq. 22
    intra_scale: Literal["sum", "per_level"] = option(
        "per_level", doc="eq. 22's distance: 'sum' = K - d (summed over the K levels), 'per_level' = 1 - d/K (their mean)")
    word_attention: Literal["eq5", "eq9"] = option(
        "eq5", doc="eq. 9's hidden state: 'eq5' = tanh(W_t S_l ⊙ tanh(W_tq t0)) as eq. 5, 13, 16; "
                   "'eq9' = tanh(W_t S_l) ⊙ tanh(W_tq t0) as printed")
    word_init: Literal["uniform", "xavier"] = option(
        "uniform", doc="initial word embeddings: uniform(-0.1, 0.1) or Xavier (the paper; the SMAN paper configs)")
    grid_pool: int = option(1, min=1, doc="average-pool each P x P block of a square grid of regions first "
                                          "(2: a 14x14 ResNet map at 448 px -> the paper's 7x7, M = 49)")


@dataclass
class SMANImages(ImageEncoding):
    unit: Tensor | None = None  # [v_k / |v_k|] of the pair-independent levels, (B, K*D): unit·unit = Σ d_k
    flat: Tensor | None = None  # [v_0, v_1 (, v_2)] raw, (B, K*D), for score_mode="concat"
    sq: Tensor | None = None  # |flat|², (B,)
    hat: Tensor | None = None  # v̂ = U_v (v0 + v1), (B, D)
    keys: Tensor | None = None  # W_v2 I_m + b, (B, k, a)
    proj: Tensor | None = None  # P2 I_m / M (no bias), (B, k, D)
    alpha1: Tensor | None = None  # α1 over regions, (B, k)
    alpha2: Tensor | None = None  # α2 over regions when it is pair-independent (α = 1), (B, k)


@dataclass
class SMANTexts(TextEncoding):
    unit: Tensor | None = None
    flat: Tensor | None = None
    sq: Tensor | None = None
    hat: Tensor | None = None  # t̂ = U_t (t0 + t1), (B, D)
    keys: Tensor | None = None  # W_t2 S_l + b, (B, n, a)
    alpha1: Tensor | None = None  # (B, n)
    alpha2: Tensor | None = None  # (B, n), α = 1 only

    per_word_fields = ("words", "keys", "alpha1", "alpha2")


class _Attention(nn.Module):
    """f_att of eq. 5-6: weights over items x_m given a query q. ``form`` "eq5" (eq. 5, 13, 16):
    h_m = tanh(W x_m ⊙ tanh(W_q q)); "eq9" (eq. 9 as printed): h_m = tanh(W x_m) ⊙ tanh(W_q q)."""

    def __init__(self, in_dim: int, query_dim: int, attn_dim: int, form: str = "eq5"):
        super().__init__()
        self.form = form
        self.key = nn.Linear(in_dim, attn_dim)  # W_v / W_t
        self.query = nn.Linear(query_dim, attn_dim)  # W_vq / W_tq
        self.logit = nn.Linear(attn_dim, 1, bias=False)  # w_vh / w_th (a bias would cancel in the softmax)

    def weights(self, keys: Tensor, q: Tensor, mask: Tensor | None) -> Tensor:
        """keys (..., m, a) = key(x), q (..., a) = tanh(query(·)), broadcasting -> softmax_m (..., m)."""
        w = self.logit.weight[0]
        if self.form == "eq9":
            return masked_softmax((torch.tanh(keys) * q.unsqueeze(-2)) @ w, mask, dim=-1)
        if q.dim() != 3:  # one query per item (eq. 5, 9)
            return masked_softmax(torch.tanh(keys * q.unsqueeze(-2)) @ w, mask, dim=-1)
        return masked_softmax(pair_logits(keys, q, w), mask, dim=-1)  # a query per pair (eq. 13, 16)

    def forward(self, x: Tensor, query: Tensor, mask: Tensor | None) -> Tensor:
        return self.weights(self.key(x), torch.tanh(self.query(query)), mask)


_CHUNK_ELEMENTS = 1 << 18  # 1 MiB of float32 hidden states per piece: they stay in cache


def _pieces(keys: Tensor, q: Tensor):
    """Cache-sized pieces of the pair block: (i, captions j0:j1, keys of the piece (c or 1, m, a), q (c, 1, a))."""
    ni, nt, a = q.shape
    m = keys.shape[-2]
    step = max(1, _CHUNK_ELEMENTS // (m * a))
    for i in range(ni):
        k_i = keys[i if keys.shape[0] > 1 else 0]  # (Nt, m, a) or (1, m, a)
        for j in range(0, nt, step):
            yield i, j, j + step, (k_i[j:j + step] if k_i.shape[0] > 1 else k_i), q[i, j:j + step, None, :]


def _tanh_of(kk: Tensor, qq: Tensor) -> Tensor:
    """tanh(kk ⊙ qq) as 2 σ(2 kk ⊙ qq) - 1, a fresh tensor: aten's sigmoid is ~10x faster than its tanh on CPU."""
    return torch.sigmoid_(kk * (2 * qq)).mul_(2).sub_(1)


class _PairLogits(torch.autograd.Function):
    """w · tanh(keys ⊙ q) for every pair of a block: keys (Ni, 1, m, a) or (1, Nt, m, a), q (Ni, Nt, a)
    -> (Ni, Nt, m). The (pairs x m x a) hidden states are the bulk of SMAN's pair work: made, squashed
    and reduced in cache-sized pieces they cost a few passes over cache, not memory, and the backward
    pass makes them again piece by piece instead of keeping them (with t = tanh(keys ⊙ q) and the
    incoming gradient G (pairs x m): dw = Σ G t, S = G w (1 - t²), dq = Σ_m S keys, dkeys = Σ S q over
    the pairs that share them)."""

    @staticmethod
    def forward(ctx, keys: Tensor, q: Tensor, w: Tensor) -> Tensor:
        ctx.save_for_backward(keys, q, w)
        ni, nt, _ = q.shape
        out = q.new_empty(ni, nt, keys.shape[-2])
        for i, j0, j1, kk, qq in _pieces(keys, q):
            torch.matmul(_tanh_of(kk, qq), w, out=out[i, j0:j1])
        return out

    @staticmethod
    def backward(ctx, g: Tensor):
        keys, q, w = ctx.saved_tensors
        if torch.is_grad_enabled():  # differentiated again (create_graph): the plain expression, through autograd
            return differentiable_backward(lambda k, qq, ww: torch.tanh(k * qq[:, :, None, :]) @ ww, (keys, q, w), g)
        g = g.contiguous()
        dq = torch.empty_like(q) if ctx.needs_input_grad[1] else None
        dk = torch.zeros_like(keys) if ctx.needs_input_grad[0] else None
        dw = torch.zeros_like(w)
        for i, j0, j1, kk, qq in _pieces(keys, q):
            t = _tanh_of(kk, qq)  # (c, m, a)
            gg = g[i, j0:j1]  # (c, m)
            dw.addmv_(t.reshape(-1, t.shape[-1]).T, gg.reshape(-1))
            sv = t.mul_(t).neg_().add_(1).mul_(gg[..., None]).mul_(w)  # G w (1 - t²)
            if dq is not None:
                torch.sum(sv * kk, dim=1, out=dq[i, j0:j1])
            if dk is not None:  # into the keys this piece read: its captions' own, or one row shared by them
                ki = i if keys.shape[0] > 1 else 0
                if keys.shape[1] > 1:
                    dk[ki, j0:j1].addcmul_(sv, qq)
                else:
                    dk[ki, 0].add_((sv * qq).sum(0))
        return dk, dq, dw


_EAGER_PAIR_LOGITS = None


def pair_logits(keys: Tensor, q: Tensor, w: Tensor) -> Tensor:
    """w · tanh(keys ⊙ q) for every pair of a block (see ``_PairLogits``); a Python loop over pieces, which
    ``torch.compile`` leaves to eager. ``torch.compiler.disable`` is applied at the first call, not at import:
    it imports torch._dynamo (1.8 s), which every command paid before, SMAN or not."""
    global _EAGER_PAIR_LOGITS
    if _EAGER_PAIR_LOGITS is None:
        _EAGER_PAIR_LOGITS = torch.compiler.disable(_PairLogits.apply)
    return _EAGER_PAIR_LOGITS(keys, q, w)


def _cos(a: Tensor, b: Tensor) -> Tensor:
    return (a * b).sum(-1) / (torch.linalg.vector_norm(a, dim=-1) * torch.linalg.vector_norm(b, dim=-1)).clamp(min=EPS)


class SMAN(TextSide, MatchingModel):
    Config = SMANConfig
    # what a config.json without these keys was made with: the default before the paper's "concat", and the
    # behaviour before the other options existed (word_init is left out: it only sets initial weights)
    legacy_options = {"score_mode": "sum", "intra_scale": "sum", "word_attention": "eq5", "grid_pool": 1}

    def __init__(self, cfg: SMANConfig):
        super().__init__(cfg)
        f, d, a = cfg.img_dim, cfg.embed_dim, cfg.attn_dim
        self.drop = nn.Dropout(cfg.dropout)
        self.words = self.make_text_side(lambda: None, dropout=cfg.dropout)  # None: eq. 1's own layers below
        if self.uses_vocab:
            self.embed = nn.Embedding(cfg.vocab_size, cfg.word_dim)
            self.lstm = nn.LSTM(cfg.word_dim, d, batch_first=True, bidirectional=True)
        self.P0, self.P1 = nn.Linear(f, d), nn.Linear(f, d)
        if cfg.location:
            self.gru = nn.GRU(f, d, batch_first=True)
        self.att_v1, self.att_t1 = _Attention(f, d, a), _Attention(d, d, a, form=cfg.word_attention)
        if cfg.stacked:
            self.U_v, self.U_t = nn.Linear(d, d), nn.Linear(d, d)
            self.att_v2, self.att_t2 = _Attention(f, d, a), _Attention(d, d, a)
            self.P2 = nn.Linear(f, d)
        if self.uses_vocab:  # last, as before the text_encoder option: a seed gives the same weights
            if cfg.word_init == "xavier":
                nn.init.xavier_uniform_(self.embed.weight)
            else:
                nn.init.uniform_(self.embed.weight, -0.1, 0.1)

    @property
    def n_levels(self) -> int:
        return 3 if self.cfg.stacked else 2

    @property
    def pair_dependent(self) -> bool:
        return self.cfg.stacked and self.cfg.alpha != 1.0

    # --- pair-independent ------------------------------------------------------------------
    def _location(self, x: Tensor, mask: Tensor | None) -> Tensor:
        """v_loc: mean of the GRU states over the valid regions, fed in raster order."""
        if mask is None or bool(mask.all()):
            return self.gru(x)[0].mean(dim=1)
        order = torch.sort((~mask).to(torch.int8), dim=1, stable=True).indices  # valid first, order kept
        xs = torch.gather(x, 1, order[..., None].expand_as(x))
        n = mask.sum(dim=1)
        out, _ = self.gru(pack_padded_sequence(xs, n.cpu().clamp(min=1), batch_first=True, enforce_sorted=False))
        out, _ = pad_packed_sequence(out, batch_first=True, total_length=x.shape[1])
        return out.sum(dim=1) / n.clamp(min=1)[:, None].to(out.dtype)

    def _pool_grid(self, features: Tensor, mask: Tensor | None) -> tuple[Tensor, Tensor | None]:
        """``grid_pool`` = P > 1: the mean of each P x P block of the (side x side, raster order) grid, in
        raster order of the pooled grid; every region must be present (a grid has no absent cells)."""
        p = self.cfg.grid_pool
        if p == 1:
            return features, mask
        if mask is not None and not bool(mask.all()):
            raise ConfigError(f"model {self.name}: grid_pool={p} pools cells of a grid, but these features have "
                              "absent regions (a region mask): use grid_pool=1 for region features")
        b, m, f = features.shape
        side = math.isqrt(m)
        if side * side != m or side % p:
            raise ConfigError(f"model {self.name}: grid_pool={p} needs a square grid whose side divides by {p}; "
                              f"the features have {m} regions")
        x = features.reshape(b, side, side, f).permute(0, 3, 1, 2)
        return F.avg_pool2d(x, p).permute(0, 2, 3, 1).reshape(b, -1, f), None

    def _unpool(self, w: Tensor) -> Tensor:
        """Weights over the pooled cells (k,) -> over the input grid's cells, each block's weight shared
        equally by its P x P cells (the sum is kept)."""
        p = self.cfg.grid_pool
        if p == 1:
            return w
        g = math.isqrt(w.shape[-1])
        grid = w.reshape(g, g).repeat_interleave(p, 0).repeat_interleave(p, 1)
        return grid.reshape(-1) / (p * p)

    def n_model_regions(self, n_regions: int) -> int:
        """Regions the model attends over for ``n_regions`` input regions (fewer with ``grid_pool``)."""
        return n_regions // (self.cfg.grid_pool ** 2)

    def encode_images(self, features: Tensor, mask: Tensor | None = None) -> SMANImages:
        features, mask = self._pool_grid(features, mask)
        x = self.drop(features)
        m = None if mask is None else mask[..., None]
        count = (torch.full(x.shape[:1], x.shape[1], dtype=x.dtype, device=x.device) if mask is None
                 else mask.sum(dim=1).clamp(min=1).to(x.dtype))
        v0 = torch.tanh(self.P0(masked_mean(x, m, dim=1)))  # eq. 2 (v_glo)
        if self.cfg.location:
            v0 = v0 + self._location(x, mask)  # eq. 3-4
        a1 = self.att_v1(x, v0, mask)  # eq. 5-6
        v1 = torch.tanh(self.P1((a1[..., None] * x).sum(dim=1) / count[:, None]))  # eq. 7
        out = SMANImages(mask=mask, alpha1=a1)
        levels = [v0, v1]
        if self.cfg.stacked:
            out.hat = self.U_v(v0 + v1)
            out.keys = self.att_v2.key(x)
            out.proj = (x @ self.P2.weight.T) / count[:, None, None]
            if not self.pair_dependent:  # α = 1: o_v = σ(v̂) is the image's own
                out.alpha2 = self.att_v2.weights(out.keys, torch.tanh(self.att_v2.query(torch.sigmoid(out.hat))), mask)
                # eq. 15: tanh(P2 · (1/M) Σ_m α2_m I_m) = tanh(Σ_m α2_m (P2 I_m / M) + b)
                levels.append(torch.tanh((out.alpha2.unsqueeze(-2) @ out.proj).squeeze(-2) + self.P2.bias))
        return self._finish(out, levels)

    def encode_texts(self, tokens: Tensor, lengths: Tensor) -> SMANTexts:
        if lengths.min() < 1:
            raise ValueError("every caption needs at least one token")
        if self.words is not None:  # a pretrained transformer's token vectors through the learned layer
            s = self.words(tokens, lengths)[0]
        else:
            e = self.drop(self.embed(tokens))
            packed = pack_padded_sequence(e, lengths.cpu(), batch_first=True, enforce_sorted=False)
            h, _ = pad_packed_sequence(self.lstm(packed)[0], batch_first=True, total_length=tokens.shape[1])
            d = self.cfg.embed_dim
            s = h[..., :d] + h[..., d:]  # eq. 1
            if self.cfg.word_combine == "mean":
                s = s / 2
        wmask = length_mask(lengths, s.shape[1])
        t0 = masked_mean(s, wmask[..., None], dim=1)  # eq. 8
        a1 = self.att_t1(s, t0, wmask)  # eq. 9-10
        t1 = (a1[..., None] * s).sum(dim=1)  # eq. 11
        out = SMANTexts(lengths=lengths, words=s, alpha1=a1)
        levels = [t0, t1]
        if self.cfg.stacked:
            out.hat = self.U_t(t0 + t1)
            out.keys = self.att_t2.key(s)
            if not self.pair_dependent:
                out.alpha2 = self.att_t2.weights(out.keys, torch.tanh(self.att_t2.query(torch.sigmoid(out.hat))), wmask)
                levels.append((out.alpha2[..., None] * s).sum(dim=1))
        return self._finish(out, levels)

    @staticmethod
    def _finish(out, levels: list[Tensor]):
        out.unit = torch.cat([l2norm(v, floor=True) for v in levels], dim=1)
        out.flat = torch.cat(levels, dim=1)
        out.sq = (out.flat * out.flat).sum(dim=1)
        return out

    # --- pair-dependent --------------------------------------------------------------------
    def multimodal(self, img: SMANImages, txt: SMANTexts) -> tuple[Tensor, Tensor, Tensor, Tensor]:
        """v2, t2 (Ni, Nt, D) and α2 over regions (Ni, Nt, k) and words (Ni, Nt, n) of every pair."""
        txt = txt.trim()
        al = self.cfg.alpha
        vh, th = img.hat[:, None], txt.hat[None]  # (Ni, 1, D), (1, Nt, D)
        q_v = torch.tanh(self.att_v2.query(torch.sigmoid(al * vh + (1 - al) * th)))  # eq. 12-13: (Ni, Nt, a)
        q_t = torch.tanh(self.att_t2.query(torch.sigmoid(al * th + (1 - al) * vh)))  # eq. 12, 16
        rmask = None if img.mask is None else img.mask[:, None, :]
        wmask = length_mask(txt.lengths, txt.words.shape[1])[None]
        a_v = self.att_v2.weights(img.keys[:, None], q_v, rmask)  # eq. 13-14: (Ni, Nt, k)
        a_t = self.att_t2.weights(txt.keys[None], q_t, wmask)  # eq. 16-17: (Ni, Nt, n)
        v2 = torch.tanh(torch.bmm(a_v, img.proj) + self.P2.bias)  # eq. 15
        t2 = torch.bmm(a_t.transpose(0, 1), txt.words).transpose(0, 1)  # eq. 18
        return v2, t2, a_v, a_t

    def score(self, img: SMANImages, txt: SMANTexts) -> Tensor:
        mode = "sum" if self.training else self.cfg.score_mode  # training: d of eq. 20
        if not self.pair_dependent:
            if mode == "sum":
                return img.unit @ txt.unit.T
            return (img.flat @ txt.flat.T) / (safe_sqrt(img.sq)[:, None] * safe_sqrt(txt.sq)[None]).clamp(min=EPS)
        v2, t2, _, _ = self.multimodal(img, txt)
        if mode == "sum":
            return img.unit @ txt.unit.T + _cos(v2, t2)  # d0 + d1 + d2
        num = img.flat @ txt.flat.T + (v2 * t2).sum(-1)
        den = safe_sqrt(img.sq[:, None] + (v2 * v2).sum(-1)) * safe_sqrt(txt.sq[None] + (t2 * t2).sum(-1))
        return num / den.clamp(min=EPS)

    def loss(self, scores: Tensor, batch: dict, train_cfg: dict, hardest: bool) -> Tensor:
        """L = L_inter + λ L_intra (eq. 21-23) on the batch matrix of d (see the module's reading of eq. 22)."""
        inter = hinge_triplet(scores, train_cfg["margin"], hardest, batch["image_index"].to(scores.device))
        if not self.cfg.intra_weight:
            return inter
        intra = intra_pair_hinge(scores.diagonal(), self.n_levels, self.cfg.intra_margin,
                                 per_level=self.cfg.intra_scale == "per_level")
        return inter + self.cfg.intra_weight * intra

    def global_embeddings(self, img: SMANImages, txt: SMANTexts) -> tuple[Tensor, Tensor]:
        """[v0/|v0|, v1/|v1|] and [t0/|t0|, t1/|t1|]: their inner product is d0 + d1."""
        d2 = 2 * self.cfg.embed_dim
        return img.unit[:, :d2], txt.unit[:, :d2]

    def pair_attention(self, img: SMANImages, txt: SMANTexts) -> dict:
        """SMAN attends over regions and over words separately (never word-to-region). ``weights``
        (k, n) is the multi-modal region attention α2 (α1 without the stacked step) repeated for each
        word, axis "regions" (each column sums to 1); ``region_weights`` / ``word_weights`` hold the
        lists {"intra": α1, "multimodal": α2} over the k regions / n words. With ``grid_pool`` the k regions
        are the input grid's cells, each pooled cell's weight shared evenly by the cells it averages."""
        n = int(txt.lengths[0])
        a1_v, a1_t = self._unpool(img.alpha1[0]), txt.alpha1[0, :n]
        if self.pair_dependent:
            _, _, a_v, a_t = self.multimodal(img.select(slice(0, 1)), txt.select(slice(0, 1)))
            a2_v, a2_t = self._unpool(a_v[0, 0]), a_t[0, 0, :n]
        elif self.cfg.stacked:
            a2_v, a2_t = self._unpool(img.alpha2[0]), txt.alpha2[0, :n]
        else:
            a2_v = a2_t = None
        shown = a1_v if a2_v is None else a2_v
        out = {"weights": shown.detach().float().cpu()[:, None].expand(-1, n).numpy().copy(), "axis": "regions",
               "region_weights": {"intra": a1_v.tolist()}, "word_weights": {"intra": a1_t.tolist()}}
        if a2_v is not None:
            out["region_weights"]["multimodal"] = a2_v.tolist()
            out["word_weights"]["multimodal"] = a2_t.tolist()
        return out

    def pair_flops(self, n_regions: int, n_words: int) -> dict[str, int]:
        """Work per (image, caption) pair of ``score`` (the per-item work excluded). Pair-independent
        (α = 1, or no stacked step): one inner product of the K D-long unit vectors. Otherwise: d0 + d1
        (2 D), the queries W_vq2 o_v, W_tq2 o_t (2 D a), the hidden states and logits (W I ⊙ q, then
        w_h · tanh(.): 2 (k + n) a), Σ α2 P2 I / M and Σ α2 S ((k + n) D), the d2 cosine (3 D).
        Transcendentals: the gate's 2 D sigmoids, the queries' 2 a tanh, the hidden states' (k + n) a
        tanh, the softmaxes' k + n exp, v2's D tanh and 2 sqrt."""
        d, a = self.cfg.embed_dim, self.cfg.attn_dim
        k, n = self.n_model_regions(n_regions), n_words
        if not self.pair_dependent:
            return {"macs": self.n_levels * d, "transcendentals": 0}
        macs = 2 * d + 2 * d * a + 2 * (k + n) * a + (k + n) * d + 3 * d
        trans = 2 * d + 2 * a + (k + n) * a + (k + n) + d + 2
        return {"macs": macs, "transcendentals": trans}

    def bytes_per_pair(self, n_regions: int, n_words: int) -> int:
        if not self.pair_dependent:
            return 8
        d, a, k = self.cfg.embed_dim, self.cfg.attn_dim, self.n_model_regions(n_regions)
        return 4 * (2 * (k + n_words) * a + 8 * d + 4 * a + 2 * (k + n_words))


_PAPER = dict(img_dim=2048, embed_dim=512, word_dim=512, attn_dim=512)
register("sman", SMAN, "SMAN (full): stacked multi-modal attention (α=0.9) + intra-pair term", **_PAPER)
register("sman_inter", SMAN, "SMAN-inter: full model, hinge triplet only (λ=0)", intra_weight=0.0, **_PAPER)
register("sman_sim", SMAN, "SMAN-SIM: stacked intra-modal attention (α=1)", alpha=1.0, **_PAPER)
register("sman_im", SMAN, "SMAN-IM: intra-modal attention only, no location query", stacked=False,
         location=False, **_PAPER)
register("sman_im_loc", SMAN, "SMAN-IM-LOC: intra-modal attention with the GRU location query", stacked=False,
         **_PAPER)
