"""Attention weights of one image-caption pair, for inspection and (later) heat maps."""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import torch

from .models.base import MatchingModel


@dataclass
class PairAttention:
    words: list[str]  # caption tokens, <start>/<end> included (they are encoded too)
    weights: np.ndarray  # (n_regions, n_words)
    axis: str  # "regions": each word's weights over regions sum to 1; "words": each region's over words
    score: float


@torch.no_grad()
def pair_attention(model: MatchingModel, features, caption: str, mask=None) -> PairAttention:
    """Weights of ``model`` for one image (features (k, img_dim)) and one caption text.

    The caption goes through the model's own ``tokenize``; the weights come from the model's
    ``pair_attention`` (SCAN t-i: for each word, its weights over the regions; SCAN i-t: for each
    region, its weights over the words).
    """
    model.eval()
    tokens, lengths = model.tokenize([caption])
    feats = torch.as_tensor(np.array(features, dtype=np.float32))[None]  # a copy: memory-mapped input is read-only
    m = None if mask is None else torch.as_tensor(np.asarray(mask), dtype=torch.bool)[None]
    img = model.encode_images(feats, m)
    txt = model.encode_texts(tokens, lengths)
    att = model.pair_attention(img, txt)
    words = model.decode_tokens(tokens[0], int(lengths[0]))
    return PairAttention(words, np.asarray(att["weights"]), att["axis"], float(model.score(img, txt)[0, 0]))
