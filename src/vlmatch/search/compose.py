"""Queries that name two things ("a dog running on the beach"): the top candidates re-scored by how well *each*
content word of the query is found in the photo.

A single global vector per photo and per query (the default ranker) blurs a query into one point: an empty beach
and a dog on grass both sit near "a dog on the beach". Each content word scored on its own says what the photo
holds: the *AND evidence* of a candidate is its weakest word's score, standardised over the candidates
(a photo that holds every named thing is not weak on any). A word's score is its sentence vector against the
photo's concept vector (:mod:`vlmatch.models.concepts`; the ranker's own score of the word alone was tried too and
helped less). The final score of the top candidates is the fused score, standardised over them, plus ``beta`` times
that evidence; the order below them is untouched. On Flickr8k val's two-thing queries the gain is small
(experiments/results/open_vocab/two_things_*.json) and costs one more text forward per query, so the shipped
default's ``beta`` is 0 (off); an index's fusion record can turn it on.
"""

from __future__ import annotations

import numpy as np

from .open_vocab import content_words

# words that name no thing a photo holds (verbs of being, counts, vague nouns): left out of the AND
_VAGUE = frozenset("there here something someone person people thing things way side area background picture "
                   "photo image view front".split())


def query_terms(text: str, limit: int = 4) -> list[str]:
    """The query's content words that may name a thing, in order, each once (at most ``limit``)."""
    out: list[str] = []
    for w in content_words(text):
        if w not in _VAGUE and w not in out and len(w) > 2:
            out.append(w)
    return out[:limit]


def and_evidence(word_scores: np.ndarray) -> np.ndarray:
    """(candidates, words) scores -> (candidates,) the weakest word's score, each word standardised over the
    candidates first."""
    s = np.asarray(word_scores, dtype=np.float64)
    z = (s - s.mean(0, keepdims=True)) / (s.std(0, keepdims=True) + 1e-8)
    return z.min(1)


def rescore(fused: np.ndarray, word_scores: np.ndarray, beta: float) -> np.ndarray:
    """The candidates' final scores: the fused score standardised over them + beta x the AND evidence."""
    f = np.asarray(fused, dtype=np.float64)
    return (f - f.mean()) / (f.std() + 1e-8) + beta * and_evidence(word_scores)


def word_scores(model, images, terms: list[str]) -> np.ndarray:
    """(candidates, words) the model's own score of each candidate (``images``: their encodings) for each word
    alone."""
    import torch

    with torch.no_grad():
        tokens, lengths = model.tokenize(terms)
        return model.score(images, model.encode_texts(tokens, lengths)).float().cpu().numpy()
