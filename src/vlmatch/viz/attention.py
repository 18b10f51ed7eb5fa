"""One image-caption pair's maps for inspection and heat maps, through the models' ``pair_attention`` protocol
(a (k, n) array tying the n words to the k image positions) or an explainer; :mod:`vlmatch.viz.heatmap` draws them.
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
    method: str = "attention"  # the explanation method that made the maps (vlmatch.evaluation.explainers)
    model: str | None = None  # the checkpoint whose maps these are, when another than the caller's (an index's)
    mirror_score: float | None = None  # set when the maps are the mean of the photo's and its mirror's (the
    #                                    mirror image's score; ``score`` stays the photo's, the one that ranks)
    # the score search shows for this photo and text, split: {"score", "ranker" (what the maps split), "concepts"
    # (an open-vocabulary index's zero-shot part, not linear over the cells: a number, not drawn; None without it)};
    # None when not known (a model explained outside any index or fusion)
    parts: dict | None = None
    shows: str | None = None  # one line: what the maps split, against the score shown

    @property
    def shown_score(self) -> float:
        """The score search shows for the pair where known, else the maps' own."""
        return self.parts["score"] if self.parts else self.score

    def to_dict(self) -> dict:
        named = {"model": self.model} if self.model else {}
        mirrored = {"mirror_score": self.mirror_score} if self.mirror_score is not None else {}
        split = ({"maps_score": self.score, "parts": {k: v for k, v in self.parts.items() if k != "score"}}
                 if self.parts else {})
        shows = {"shows": self.shows} if self.shows else {}
        return {"method": self.method, **named, "words": self.words, "weights": self.weights.tolist(), "axis": self.axis,
                "score": self.shown_score, **split, **shows, "mirrored": self.mirror_score is not None, **mirrored,
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
    """Weights of ``model``'s ``pair_attention`` for one image (features (k, img_dim)) and one caption text."""
    model.eval()
    feats = torch.as_tensor(np.array(features, dtype=np.float32))[None]  # a copy: memory-mapped input is read-only
    m = None if mask is None else torch.as_tensor(np.asarray(mask), dtype=torch.bool)[None]
    return attention_of_encodings(model, model.encode_images(feats, m), caption)


def explain_pair(model: MatchingModel, features, caption: str, method: str = "attention",
                 phrases: list[str] | tuple[str, ...] = (), *, mask=None, mirror_features=None) -> PairAttention:
    """Maps of one image (features (k, img_dim)) and a caption by ``method`` (:mod:`vlmatch.evaluation.explainers`):
    a column per token (``attention``/``contribution``, a phrase's the sum of its tokens') or per word scored alone
    (``gradient``/``occlusion``), then one per phrase. ``mirror_features``: each map is the mean of the photo's and
    its mirror view's, unless the caption or a phrase names a side."""
    from ..evaluation.mirror import grid_of, merge_views, mirror_grid, names_a_side

    att = _explain_pair(model, features, caption, method, phrases, mask)
    if mirror_features is None or any(names_a_side(t) for t in (caption, *phrases)):
        return att
    grid = grid_of(att.weights.shape[0])
    other = _explain_pair(model, mirror_features, caption, method, phrases,
                          None if mask is None else mirror_grid(np.asarray(mask).reshape(-1), grid))
    att.weights = merge_views(att.weights, other.weights, grid)
    att.mirror_score = other.score
    return att


def _explain_pair(model: MatchingModel, features, caption: str, method: str, phrases, mask) -> PairAttention:
    from ..evaluation.explainers import TOKEN_METHODS, check_method, query_maps, token_maps, token_spans

    check_method(method)
    if not isinstance(caption, str) or not caption.strip():
        raise ConfigError("the caption to explain is empty")
    if method in TOKEN_METHODS:
        if method == "attention":  # the model's own weights, with its extra vectors
            att = pair_attention(model, features, caption, mask)
        else:
            tm = token_maps(model, features, caption, method, mask)
            att = PairAttention(list(tm.tokens), tm.weights, tm.axis, tm.score, method=method)
        if not phrases:
            return att
        low = caption.lower()
        spans = []
        for p in phrases:
            at = low.find(p.strip().lower())
            if at < 0 or not p.strip():
                raise ConfigError(f"--phrase {p!r} is not part of the caption {caption!r}")
            spans.append((at, at + len(p.strip())))
        cols = [att.weights[:, a:b].sum(axis=1, keepdims=True) for a, b in token_spans(model, caption, spans)]
        att.weights = np.concatenate([att.weights, *cols], axis=1)
        att.words = list(att.words) + [p.strip() for p in phrases]
        return att
    words = caption.split() + [p.strip() for p in phrases]
    weights = query_maps(model, features, words, method, mask)
    score = float(query_maps_score(model, features, caption, mask))
    return PairAttention(words, weights, "drop" if method == "occlusion" else "gradient", score, method=method)


@torch.no_grad()
def query_maps_score(model: MatchingModel, features, caption: str, mask=None) -> float:
    """The pair score of one image and one caption."""
    model.eval()
    feats = torch.as_tensor(np.array(features, dtype=np.float32))[None]
    m = None if mask is None else torch.as_tensor(np.asarray(mask), dtype=torch.bool)[None]
    tokens, lengths = model.tokenize([caption])
    return float(model.score(model.encode_images(feats, m), model.encode_texts(tokens, lengths))[0, 0])


def truncation(model: MatchingModel, caption: str) -> tuple[int, int] | None:
    """(tokens ``caption`` has, tokens the model reads) when the text encoder cuts it short, else None."""
    from ..encoders.hf import HFTextEncoder

    enc = next((m for m in model.modules() if isinstance(m, HFTextEncoder)), None)
    if enc is None:
        return None
    n = enc.count_tokens(caption)
    return (n, enc.max_length) if n > enc.max_length else None
