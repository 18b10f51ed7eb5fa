"""Explanation methods: per image position, how much a word (or a phrase, or a query) made the score.

Over the model protocol only: ``attention`` (``model.pair_attention``) and ``contribution`` (the exact share
of each term, ``model.position_contributions``) give one map per token of a caption in context (a phrase's
map sums its tokens); ``gradient`` (gradient x input over the raw features' channels) and ``occlusion`` (the
score drop when a position is masked out) score a text as its own query. Every map is (k,) over the k image
positions; larger means "this position made the score more". The methods side by side: docs/grounding.md.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import torch
from torch import Tensor

from ..errors import ConfigError, VlmatchError
from ..models.base import MatchingModel

METHODS = ("attention", "contribution", "gradient", "occlusion")
TOKEN_METHODS = ("attention", "contribution")  # a map per token of the caption, in context
QUERY_METHODS = ("gradient", "occlusion")  # a map per text scored as its own query


def check_method(method: str) -> str:
    if method not in METHODS:
        raise ConfigError(f"--method {method!r}: choose one of {', '.join(METHODS)}")
    return method


def supports(model: MatchingModel, method: str) -> bool:
    """Whether ``model`` can give ``method``'s maps (gradient and occlusion: every model)."""
    if method in QUERY_METHODS:
        return True
    probe = torch.zeros(1, 1, model.cfg.img_dim, dtype=_dtype(model))
    tokens, lengths = model.tokenize(["a"])
    try:
        with torch.no_grad():
            if method == "attention":
                model.pair_attention(model.encode_images(probe), model.encode_texts(tokens, lengths))
            else:
                model.position_contributions(probe, None, tokens, lengths)
    except VlmatchError:
        return False
    return True


@dataclass
class TokenMaps:
    tokens: list[str]  # the caption's tokens as the model sees them (special tokens included)
    weights: np.ndarray  # (k, n): column j is token j's map
    axis: str  # attention: "regions" | "words" | "pair"; contribution: "score" (the matrix sums to it)
    score: float


def _dtype(model: MatchingModel) -> torch.dtype:
    return next((p.dtype for p in model.parameters() if p.is_floating_point()), torch.float32)


def _as_batch(features, mask, dtype=torch.float32) -> tuple[Tensor, Tensor | None]:
    f = torch.as_tensor(np.array(features, dtype=np.float32)).to(dtype)
    f = f[None] if f.dim() == 2 else f
    m = None if mask is None else torch.as_tensor(np.asarray(mask), dtype=torch.bool).reshape(1, -1)
    return f, m


def token_maps(model: MatchingModel, features, caption: str, method: str, mask=None) -> TokenMaps:
    """``attention`` or ``contribution`` maps of every token of ``caption`` for one image (features (k, D))."""
    if method not in TOKEN_METHODS:
        raise ConfigError(f"method {method!r} scores texts as their own queries: use query_maps")
    model.eval()
    f, m = _as_batch(features, mask, _dtype(model))
    tokens, lengths = model.tokenize([caption])
    words = model.decode_tokens(tokens[0], int(lengths[0]))
    with torch.no_grad():
        img = model.encode_images(f, m)
        txt = model.encode_texts(tokens, lengths)
        score = float(model.score(img, txt)[0, 0])
        if method == "attention":
            att = model.pair_attention(img, txt)
            return TokenMaps(words, np.asarray(att["weights"], dtype=np.float32), att["axis"], score)
        c = model.position_contributions(f, m, tokens, lengths)[0, :, : int(lengths[0])]
    return TokenMaps(words, c.float().numpy(), "score", score)


def caption_token_maps(model: MatchingModel, features, captions: list[str], method: str) -> list[np.ndarray]:
    """Token maps ((k, n_c) each) of several captions of ONE image, batched where the method allows."""
    if method == "attention":
        return [token_maps(model, features, c, method).weights for c in captions]
    model.eval()
    f, _ = _as_batch(features, None, _dtype(model))
    tokens, lengths = model.tokenize(captions)
    with torch.no_grad():
        c = model.position_contributions(f.expand(len(captions), -1, -1), None, tokens, lengths)
    return [c[i, :, : int(lengths[i])].float().numpy() for i in range(len(captions))]


def query_maps(model: MatchingModel, features, queries: list[str], method: str, mask=None) -> np.ndarray:
    """(k, Q) maps, column q for ``queries[q]`` scored as its own query against one image (features (k, D)).

    attention/contribution: the sum over the query's own tokens (its special tokens left out);
    gradient: Σ_d v_id ∂S/∂v_id; occlusion: S(all positions) - S(position i masked)."""
    model.eval()
    f, m = _as_batch(features, mask, _dtype(model))
    k = f.shape[1]
    if method in TOKEN_METHODS:
        cols = []
        for q in queries:
            (a, b), = token_spans(model, q, [(0, len(q))])
            cols.append(token_maps(model, features, q, method, mask).weights[:, a:b].sum(axis=1))
        return np.stack(cols, axis=1) if cols else np.zeros((k, 0), np.float32)
    if method == "gradient":
        maps = gradient_maps(model, f.expand(len(queries), -1, -1), None if m is None else m.expand(len(queries), -1),
                             queries, create_graph=False)
        return maps.detach().T.float().numpy()
    tokens, lengths = model.tokenize(queries)
    check_method(method)  # occlusion, or an unknown method
    base = torch.ones(k, dtype=torch.bool) if m is None else m[0]
    masks = base.expand(k, k).clone()
    masks[torch.arange(k), torch.arange(k)] = False  # copy i: position i masked
    with torch.no_grad():
        txt = model.encode_texts(tokens, lengths)
        full = model.score(model.encode_images(f, base[None]), txt)  # (1, Q)
        occluded = model.score(model.encode_images(f.expand(k, -1, -1), masks), txt)  # (k, Q): one block
    drop = (full - occluded).float().numpy()
    drop[~base.numpy()] = 0.0  # a position masked already is no evidence
    return drop


# Queries scored per block by ``gradient_maps``: a block costs block² pairs of which its diagonal is used, so a
# small block wastes little scoring while keeping the Python loop short.
GRADIENT_BLOCK = 8


def gradient_maps(model: MatchingModel, features: Tensor, mask: Tensor | None, texts: list[str],
                  create_graph: bool = False) -> Tensor:
    """(P, k): gradient x input of S(image p, text p) w.r.t. image p's raw position features, summed over the
    channels, for each row p of ``features`` (P, k, D), each text scored as its own query: the ``gradient``
    method's maps (:func:`query_maps`) and the map ``train.grounding_map: gradient`` teaches. One backward for
    all: copy p only reaches S(copy p, text p). ``create_graph``: the maps keep their graph (the text side's
    too), so a loss on them trains the model (double backward)."""
    x = features.detach().clone().requires_grad_(True)
    tokens, lengths = model.tokenize(texts)
    with torch.set_grad_enabled(create_graph):
        txt = model.encode_texts(tokens.to(x.device), lengths.to(x.device))
    with torch.enable_grad():
        img = model.encode_images(x, mask)
        s = torch.cat([model.score(img.select(slice(a, a + GRADIENT_BLOCK)),
                                   txt.select(slice(a, a + GRADIENT_BLOCK))).diagonal()
                       for a in range(0, len(texts), GRADIENT_BLOCK)])
        (g,) = torch.autograd.grad(s.sum(), x, create_graph=create_graph)
    return (g * x).sum(dim=2)


def token_spans(model: MatchingModel, text: str, char_spans: list[tuple[int, int]]) -> list[tuple[int, int]]:
    """Token index ranges [a, b) of character spans of ``text`` in the model's own tokenisation of it.

    Model-agnostic: the tokens before a span are those of the text up to the span (word tokenizers and
    WordPiece split at word boundaries the same way in a prefix as in the whole text), less the end token
    a tokenisation of any text carries. Spans past the model's token limit come back empty (a == b)."""
    _, n_full = model.tokenize([text])
    n_full = int(n_full[0])
    ends = sorted({x for span in char_spans for x in span})
    if not ends:
        return []
    close = _closing_tokens(model)
    _, one = model.tokenize(["a"])
    count = {0: int(one[0]) - close - 1}  # the opening tokens ([CLS], <start>): before any word
    prefixes = [e for e in ends if text[:e].strip()]
    if prefixes:
        _, lens = model.tokenize([text[:e].rstrip() for e in prefixes])
        count.update({e: int(lens[i]) - close for i, e in enumerate(prefixes)})
    count.update({e: count[0] for e in ends if e not in count})
    limit = n_full - close
    return [(min(count[a], limit), min(count[b], limit)) for a, b in char_spans]


def _closing_tokens(model: MatchingModel) -> int:
    """How many tokens close every tokenisation (an end / [SEP] token: 1; none: 0)."""
    a, la = model.tokenize(["a"])
    b, lb = model.tokenize(["a a"])
    grow = int(lb[0]) - int(la[0])  # one word more
    if grow <= 0:
        return 0
    last_a, last_b = int(a[0, int(la[0]) - 1]), int(b[0, int(lb[0]) - 1])
    return 1 if last_a == last_b and int(a[0, int(la[0]) - 2]) == int(b[0, int(lb[0]) - 2]) and int(la[0]) >= 2 else 0


# The order in which a model's default method is chosen: the best-grounding method on Flickr8k val first
# (experiments/results/grounding.md measures every method of the shipped models).
PREFERENCE = ("contribution", "gradient", "occlusion", "attention")


def default_method(model: MatchingModel) -> str:
    """The first method of :data:`PREFERENCE` that ``model`` has."""
    return next(m for m in PREFERENCE if supports(model, m))
