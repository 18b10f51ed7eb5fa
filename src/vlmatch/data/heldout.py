"""Concept-held-out training data (``data.exclude_words``): leave out every image whose captions name one of a set
of words, to measure what a model does with concepts it never saw (docs/open-vocabulary.md). A caption names a word
when a whole token is the word or a regular plural (dogs, buses, parties); ``bicycl*`` matches any token so started.
"""

from __future__ import annotations

import re

_TOKEN = re.compile(r"[a-z]+")


def word_forms(word: str) -> tuple[set[str], str | None]:
    """(exact forms, prefix or None) of one concept word."""
    w = word.strip().lower()
    if w.endswith("*"):
        return set(), w[:-1]
    forms = {w, w + "s", w + "es"}
    if w.endswith("y") and len(w) > 2 and w[-2] not in "aeiou":
        forms.add(w[:-1] + "ies")
    if w.endswith("f"):
        forms.add(w[:-1] + "ves")
    if w.endswith("fe"):
        forms.add(w[:-2] + "ves")
    if w.endswith("man"):
        forms.add(w[:-3] + "men")
    return forms, None


class WordSet:
    """Concept words and their forms; ``names(text)``: the concept words a text names."""

    def __init__(self, words):
        if isinstance(words, str):
            words = [words]
        self.words = [str(w).strip().lower() for w in words if str(w).strip()]
        if not self.words:
            raise ValueError("no concept words given")
        self._exact: dict[str, str] = {}
        self._prefix: list[tuple[str, str]] = []
        for w in self.words:
            forms, prefix = word_forms(w)
            for f in forms:
                self._exact.setdefault(f, w)
            if prefix:
                self._prefix.append((prefix, w))

    def names(self, text: str) -> set[str]:
        found = set()
        for tok in _TOKEN.findall(text.lower()):
            hit = self._exact.get(tok)
            if hit:
                found.add(hit)
            for p, w in self._prefix:
                if tok.startswith(p):
                    found.add(w)
        return found


def images_naming(captions: list[str], per_image: int, words) -> list[set[str]]:
    """For each image (``per_image`` consecutive captions), the concept words any of its captions names."""
    ws = words if isinstance(words, WordSet) else WordSet(words)
    out = []
    for i in range(0, len(captions), per_image):
        found: set[str] = set()
        for c in captions[i:i + per_image]:
            found |= ws.names(c)
        out.append(found)
    return out
