"""Attention weights of one image-caption pair, for inspection and (later) heat maps."""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import torch

from .errors import VlmatchError
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

    SCAN t-i: for each word, its weights over the regions; SCAN i-t: for each region, its
    weights over the words. The model must carry its vocabulary (checkpoints do).
    """
    if model.vocab is None:
        raise VlmatchError(f"model {model.name} has no vocabulary attached (load it from a checkpoint)")
    if not hasattr(model, "attention") or not hasattr(model.cfg, "direction"):
        raise VlmatchError(f"model {model.name} has no word-region attention map")
    model.eval()
    ids = model.vocab.encode(caption)
    feats = torch.as_tensor(np.asarray(features, dtype=np.float32))[None]
    m = None if mask is None else torch.as_tensor(mask, dtype=torch.bool)[None]
    img = model.encode_images(feats, m)
    txt = model.encode_texts(torch.tensor([ids]), torch.tensor([len(ids)]))
    att = model.attention(img, txt)[0, :, 0, :].numpy()
    return PairAttention(model.vocab.decode(ids), att, "regions" if model.cfg.direction == "t2i" else "words",
                         float(model.score(img, txt)[0, 0]))
