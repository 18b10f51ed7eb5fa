"""Queries that name two things ("a dog running on the beach"): the top candidates re-scored by how well *each*
content word of the query is found in the photo.

A candidate's *AND evidence* is its weakest word's score (the word's sentence vector against the photo's concept
vector), each word standardised over the candidates; the final score is the fused score, standardised likewise,
plus ``beta`` times that evidence. On Flickr8k val's two-thing queries the gain is small
(experiments/results/open_vocab/two_things_*.json), so the shipped default's ``beta`` is 0 (off).
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
