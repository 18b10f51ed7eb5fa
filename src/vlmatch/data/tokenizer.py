"""Word-level tokenizer that behaves like SCAN's ``nltk.word_tokenize(caption.lower())``.

It needs no downloaded data. For ordinary captions it gives the same tokens as NLTK's
Treebank tokenizer: words (hyphenated words and decimals kept whole), punctuation split off,
clitics split as NLTK does ("don't" -> "do", "n't"; "man's" -> "man", "'s").
"""

from __future__ import annotations

import re

_TOKEN = re.compile(
    r"""
    \w+(?=n't\b)          # 'do' of "don't"
  | n't\b                 # the clitic itself
  | '(?:s|m|d|ll|re|ve)\b # 's 'm 'd 'll 're 've
  | \d+(?:[.,]\d+)+       # 3.5, 1,000
  | \w+(?:-\w+)*          # words, t-shirt
  | \.\.\.                # ellipsis
  | [^\w\s]               # any other single punctuation mark
    """,
    re.VERBOSE,
)


def tokenize(text: str) -> list[str]:
    """Lower-case and split a caption into tokens."""
    return _TOKEN.findall(text.lower())
