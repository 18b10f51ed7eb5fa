"""VSE++ (Faghri et al., BMVC 2018): the global-embedding baseline.

Image: mean of the region features -> FC -> l2-norm. Text: embedding -> (bi)GRU -> final state
(or mean of words) -> l2-norm. Score: cosine (inner product of the normalised vectors).

``text_encoder`` (see :mod:`vlmatch.models.text_side`): with a pretrained transformer, the GRU over
learned embeddings is replaced by the transformer's token vectors through a learned affine layer
(H -> D), and the sentence vector is their mean over the tokens (``text_pool`` is then moot: the
transformer has no final state).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Literal

from torch import Tensor

from ..encoders.image import RegionProjection
from ..encoders.text import GRUTextEncoder
from .base import ImageEncoding, MatchingModel, ModelConfig, TextEncoding, l2norm, length_mask, masked_mean
from .registry import register
from .text_side import TextSide, TextSideOptions


@dataclass
class VSEConfig(ModelConfig, TextSideOptions):
    bi_gru: bool = True
    num_layers: int = 1
    text_pool: Literal["last", "mean"] = "last"  # "last": final GRU state(s); "mean": mean of the word states
    precomp_enc_type: Literal["basic", "weight_norm"] = "basic"
    no_imgnorm: bool = False


class VSE(TextSide, MatchingModel):
    Config = VSEConfig

    def __init__(self, cfg: VSEConfig):
        super().__init__(cfg)
        self.img_fc = RegionProjection(cfg.img_dim, cfg.embed_dim, cfg.precomp_enc_type)
        self.txt_enc = self.make_text_side(cfg.embed_dim, lambda: GRUTextEncoder(
            cfg.vocab_size, cfg.word_dim, cfg.embed_dim, cfg.num_layers, cfg.bi_gru))

    def encode_images(self, features: Tensor, mask: Tensor | None = None) -> ImageEncoding:
        pooled = masked_mean(features, None if mask is None else mask[..., None], dim=1)
        emb = self.img_fc(pooled)
        return ImageEncoding(embedding=emb if self.cfg.no_imgnorm else l2norm(emb))

    def encode_texts(self, tokens: Tensor, lengths: Tensor) -> TextEncoding:
        words, final = self.txt_enc(tokens, lengths)
        if self.cfg.text_pool == "mean" and self.uses_vocab:
            final = masked_mean(words, length_mask(lengths, words.shape[1])[..., None], dim=1)
        return TextEncoding(lengths=lengths, embedding=l2norm(final))

    def score(self, img: ImageEncoding, txt: TextEncoding) -> Tensor:
        return img.embedding @ txt.embedding.T

    def pair_flops(self, n_regions: int, n_words: int) -> dict[str, int]:
        return {"macs": self.cfg.embed_dim, "transcendentals": 0}  # one inner product

    def bytes_per_pair(self, n_regions: int, n_words: int) -> int:
        return 8

    def global_embeddings(self, img: ImageEncoding, txt: TextEncoding) -> tuple[Tensor, Tensor]:
        """The score is exactly the inner product of the two embeddings."""
        return img.embedding, txt.embedding


register("vsepp", VSE, "VSE++ global baseline: mean-pooled regions + bi-GRU, cosine score")
