"""Attention weights of one image-caption pair, for inspection and heat maps.

Every attention model exposes one pair's weights through the protocol method
``model.pair_attention(img, txt)`` (a (k, n) array tying the n words to the k image positions),
so nothing here knows which model it is talking to. :mod:`vlmatch.viz.heatmap` draws them.
"""

from __future__ import annotations

from dataclasses import dataclass, field

import numpy as np
import torch

from ..errors import ConfigError
from ..models.base import ImageEncoding, MatchingModel


@dataclass
class PairAttention:
    words: list[str]  # caption tokens, <start>/<end> included (they are encoded too)
    weights: np.ndarray  # (n_regions, n_words)
    axis: str  # "regions": each word's weights over regions sum to 1; "words": each region's over words;
    #            "pair": weights of the (region, word) terms of the score (sum to 1 over the matrix)
    score: float
    grid: int | None = None  # grid side when the k positions are a grid x grid feature map
    image: str | None = None  # the image file, when known
    extra: dict = field(default_factory=dict)  # model-specific vectors (e.g. CAAN's f and g)

    def to_dict(self) -> dict:
        return {"words": self.words, "weights": self.weights.tolist(), "axis": self.axis, "score": self.score,
                "grid": self.grid, "image": self.image, "shape": list(self.weights.shape),
                **{k: np.asarray(v).tolist() for k, v in self.extra.items()}}


@torch.no_grad()
def attention_of_encodings(model: MatchingModel, img: ImageEncoding, caption: str) -> PairAttention:
    """Weights of ``model`` for one encoded image (``img`` holds one item) and one caption text."""
    if not isinstance(caption, str) or not caption.strip():
        raise ConfigError("the caption to explain is empty")
    model.eval()
    tokens, lengths = model.tokenize([caption])
    dev = next(iter(img.tensors().values())).device
    txt = model.encode_texts(tokens.to(dev), lengths.to(dev))
    att = model.pair_attention(img, txt)
    words = model.decode_tokens(tokens[0], int(lengths[0]))
    extra = {k: v for k, v in att.items() if k not in ("weights", "axis")}
    return PairAttention(words, np.asarray(att["weights"]), att["axis"], float(model.score(img, txt)[0, 0]),
                         extra=extra)


@torch.no_grad()
def pair_attention(model: MatchingModel, features, caption: str, mask=None) -> PairAttention:
    """Weights of ``model`` for one image (features (k, img_dim)) and one caption text.

    The caption goes through the model's own ``tokenize``; the weights come from the model's
    ``pair_attention`` (SCAN t-i: for each word, its weights over the regions; SCAN i-t: for each
    region, its weights over the words; CAAN: f_i g_j, the weight of each region-word term).
    """
    model.eval()
    feats = torch.as_tensor(np.array(features, dtype=np.float32))[None]  # a copy: memory-mapped input is read-only
    m = None if mask is None else torch.as_tensor(np.asarray(mask), dtype=torch.bool)[None]
    return attention_of_encodings(model, model.encode_images(feats, m), caption)
