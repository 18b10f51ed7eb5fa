"""VSE++ (Faghri et al., BMVC 2018): the global-embedding baseline, with VSE-infinity's image-side options.

One unit vector per image and per caption; the score is their inner product. The options and how they keep or
lose the exact per-cell contribution: docs/models/vsepp.md.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Literal

import torch
from torch import Tensor

from ..encoders.image import RegionProjection
from ..encoders.pooling import GPO, RegionMLP, masked_max
from ..errors import VlmatchError
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
    img_pool: Literal["mean", "max", "gpo"] = "mean"  # how the regions become one vector (see the module)
    img_mlp: bool = False  # FC(v_i) + MLP(v_i) per region (VSE-infinity's image head)


class VSE(TextSide, MatchingModel):
    Config = VSEConfig
    calibrates = True  # per-item offsets, and [v, -c, 1] . [t, 1, -d] is the calibrated score

    def __init__(self, cfg: VSEConfig):
        super().__init__(cfg)
        self.img_fc = RegionProjection(cfg.img_dim, cfg.embed_dim, cfg.precomp_enc_type)
        self.img_mlp = RegionMLP(cfg.img_dim, cfg.embed_dim) if cfg.img_mlp else None
        self.img_gpo = GPO() if cfg.img_pool == "gpo" else None
        self.txt_enc = self.make_text_side()

    @property
    def linear_image_side(self) -> bool:
        """True for VSE++'s own image side: FC of the regions' mean (= the mean of FC of each region)."""
        return self.cfg.img_pool == "mean" and self.img_mlp is None

    def encode_images(self, features: Tensor, mask: Tensor | None = None) -> ImageEncoding:
        if self.linear_image_side:  # FC(mean) = mean(FC): one projection instead of one per region
            emb = self.img_fc(masked_mean(features, None if mask is None else mask[..., None], dim=1))
        else:
            regions = self.shared("cells", self._cells, features)
            if self.cfg.img_pool == "mean":
                emb = masked_mean(regions, None if mask is None else mask[..., None], dim=1)
            elif self.cfg.img_pool == "max":
                emb = masked_max(regions, mask)
            else:
                emb = self.img_gpo(regions, mask)
        emb = emb if self.cfg.no_imgnorm else l2norm(emb)
        cal = self.calibration
        return ImageEncoding(embedding=emb, offset=None if cal is None else cal.image_offsets(emb))

    def _cells(self, features: Tensor) -> Tensor:
        """Every region's own vector: FC(v_i) (+ MLP(v_i) with img_mlp)."""
        regions = self.img_fc(features)
        return regions if self.img_mlp is None else regions + self.img_mlp(features)

    def encode_texts(self, tokens: Tensor, lengths: Tensor) -> TextEncoding:
        words, final = self.shared("words", self.txt_enc, tokens, lengths)
        if self.cfg.text_pool == "mean" and self.uses_vocab:
            final = masked_mean(words, length_mask(lengths, words.shape[1])[..., None], dim=1)
        emb, cal = l2norm(final), self.calibration
        return TextEncoding(lengths=lengths, embedding=emb, offset=None if cal is None else cal.text_offsets(emb))

    def score(self, img: ImageEncoding, txt: TextEncoding) -> Tensor:
        """Cosine similarity; minus each item's offset when the model is calibrated (models.calibration)."""
        s = img.embedding @ txt.embedding.T
        if img.offset is not None:
            s = s - img.offset[:, None]
        if txt.offset is not None:
            s = s - txt.offset[None, :]
        return s

    def position_contributions(self, features: Tensor, mask: Tensor | None, tokens: Tensor, lengths: Tensor) -> Tensor:
        """Exact: the image vector is FC(mean_i v_i) = mean_i FC(v_i) (FC is affine), and with a transformer
        (or ``text_pool: mean``) the caption vector is the mean of its word vectors w_j, so
        score = sum_ij FC(v_i) . w_j / (k n ||FC(v̄)|| ||w̄||). With ``img_mlp`` (mean pooling) the cell vector is
        FC(v_i) + MLP(v_i) and the same sum holds. The shares sum to the cosine: a calibrated model's offsets (one
        number per image and per caption, models.calibration) belong to no cell and are left out."""
        if self.cfg.img_pool != "mean":  # the image vector is not a mean of one vector per cell
            raise VlmatchError(f"VSE++ with img_pool {self.cfg.img_pool!r}{' and img_mlp' if self.img_mlp else ''} has "
                               "a non-linear image side, no per-cell decomposition of its score: use the gradient "
                               "or occlusion method")
        if self.uses_vocab and self.cfg.text_pool != "mean":
            raise VlmatchError("VSE++ with text_pool 'last' (a GRU's final state) has no per-word decomposition of its "
                               "score: use text_pool 'mean', a transformer text side, or the gradient/occlusion method")
        keep = None if mask is None else mask[..., None].to(features.dtype)
        feats = features if keep is None else features * keep
        k = features.shape[1] if mask is None else mask.sum(dim=1).clamp(min=1).to(features.dtype)
        words, final = self.shared("words", self.txt_enc, tokens, lengths)  # the matching pass's, when training
        wmask = length_mask(lengths, words.shape[1]).to(words.dtype)[..., None]
        if self.uses_vocab:  # text_pool mean over the GRU's word states
            final = masked_mean(words, wmask.bool(), dim=1)
        words = words * wmask
        if self.linear_image_side:
            pooled = self.img_fc(masked_mean(features, None if mask is None else mask[..., None], dim=1))
            fc = self.img_fc.fc
            # FC(v_i) . w_j = v_i . (W^T w_j) + b . w_j: the words go through W^T (L of them) instead of every cell
            # through W (k of them, 196 on a 14 x 14 grid), the same terms at a fraction of the cost
            terms = torch.einsum("bkf,blf->bkl", feats, words @ fc.weight) + (words @ fc.bias)[:, None, :]
        else:  # img_mlp: every cell's own vector FC(v_i) + MLP(v_i)
            cells = self.shared("cells", self._cells, features)
            pooled = masked_mean(cells, None if mask is None else mask[..., None], dim=1)
            terms = torch.einsum("bkd,bld->bkl", cells, words)
        if keep is not None:
            terms = terms * keep
        scale = final.norm(dim=1) * lengths.to(words.dtype) * k
        if not self.cfg.no_imgnorm:
            scale = scale * pooled.norm(dim=1)
        return terms / scale[:, None, None]

    def pair_flops(self, n_regions: int, n_words: int) -> dict[str, int]:
        return {"macs": self.cfg.embed_dim, "transcendentals": 0}  # one inner product

    def bytes_per_pair(self, n_regions: int, n_words: int) -> int:
        return 8

    def score_is_global(self) -> bool:
        return True

    def global_embeddings(self, img: ImageEncoding, txt: TextEncoding) -> tuple[Tensor, Tensor]:
        """The score is exactly the inner product of the two embeddings; calibrated, of ``[v, -c(I), 1]`` and
        ``[t, 1, -d(T)]`` (each extra column only where that side has an offset)."""
        a, b = [img.embedding], [txt.embedding]
        if img.offset is not None:  # -c(I) on the image side, against a 1 on the text side
            a.append(-img.offset[:, None].to(img.embedding.dtype))
            b.append(txt.embedding.new_ones(len(txt.embedding), 1))
        if txt.offset is not None:  # a 1 on the image side, against -d(T) on the text side
            a.append(img.embedding.new_ones(len(img.embedding), 1))
            b.append(-txt.offset[:, None].to(txt.embedding.dtype))
        return torch.cat(a, dim=1), torch.cat(b, dim=1)


register("vsepp", VSE, "VSE++ global baseline: mean-pooled regions + bi-GRU, cosine score")
