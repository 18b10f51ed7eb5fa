"""Vocabulary: built from training captions only; reads and writes SCAN's vocab JSON."""

from __future__ import annotations

from collections import Counter
from collections.abc import Iterable
from pathlib import Path

from ..errors import DataError
from ..io import read_json, write_json
from .tokenizer import tokenize

PAD, START, END, UNK = "<pad>", "<start>", "<end>", "<unk>"
SPECIALS = (PAD, START, END, UNK)


class Vocab:
    """Word <-> id mapping with ``<pad>``=0, ``<start>``=1, ``<end>``=2, ``<unk>``=3."""

    def __init__(self, words: Iterable[str] = ()):
        self.idx2word: list[str] = list(SPECIALS)
        self.word2idx: dict[str, int] = {w: i for i, w in enumerate(SPECIALS)}
        for w in words:
            self.add(w)

    def add(self, word: str) -> int:
        if word not in self.word2idx:
            self.word2idx[word] = len(self.idx2word)
            self.idx2word.append(word)
        return self.word2idx[word]

    def __len__(self) -> int:
        return len(self.idx2word)

    def __contains__(self, word: str) -> bool:
        return word in self.word2idx

    def __eq__(self, other) -> bool:
        return isinstance(other, Vocab) and self.idx2word == other.idx2word

    def encode(self, caption: str, add_special: bool = True) -> list[int]:
        """Caption text -> ids: ``<start>`` tokens ``<end>`` as SCAN does."""
        unk = self.word2idx[UNK]
        ids = [self.word2idx.get(t, unk) for t in tokenize(caption)]
        if add_special:
            ids = [self.word2idx[START]] + ids + [self.word2idx[END]]
        return ids

    def decode(self, ids: Iterable[int]) -> list[str]:
        return [self.idx2word[i] for i in ids]

    @classmethod
    def build(cls, captions: Iterable[str], min_count: int = 4) -> Vocab:
        """Words seen at least ``min_count`` times, most frequent first (ties alphabetical)."""
        counts = Counter(t for c in captions for t in tokenize(c))
        words = sorted((w for w, n in counts.items() if n >= min_count), key=lambda w: (-counts[w], w))
        return cls(w for w in words if w not in SPECIALS)

    # SCAN's JSON layout: {"word2idx": {...}, "idx2word": {"0": "<pad>", ...}, "idx": N}
    def to_json(self) -> dict:
        return {
            "word2idx": dict(self.word2idx),
            "idx2word": {str(i): w for i, w in enumerate(self.idx2word)},
            "idx": len(self.idx2word),
        }

    def save(self, path) -> None:
        write_json(path, self.to_json(), indent=None)

    @classmethod
    def from_json(cls, obj: dict, source="<vocab>") -> Vocab:
        try:
            i2w = obj["idx2word"]
            n = int(obj.get("idx", len(i2w)))
            words = [i2w[str(i)] if isinstance(i2w, dict) else i2w[i] for i in range(n)]
        except (KeyError, IndexError, TypeError, ValueError) as e:
            raise DataError(source, f"not a SCAN vocab JSON (needs idx2word 0..idx-1): {e}") from None
        if tuple(words[:4]) != SPECIALS:
            raise DataError(source, f"the first four words must be {SPECIALS}, found {tuple(words[:4])}")
        if len(set(words)) != len(words):
            raise DataError(source, "a word appears twice in idx2word")
        v = cls()
        for w in words[4:]:
            v.add(w)
        return v

    @classmethod
    def load(cls, path) -> Vocab:
        path = Path(path)
        obj = read_json(path, "vocabulary file not found")
        return cls.from_json(obj, source=path)
