"""A font for each word a heat map writes under its panel: the default font when it has the word's glyphs, else the
first installed font that does, else an ASCII label of its code points (``U+72D7``), never matplotlib's empty
boxes; :func:`undrawable` names the words that got such a label.
"""

from __future__ import annotations

from functools import cache


@cache
def _charmap(path: str) -> frozenset[int]:
    """The code points the font file ``path`` has glyphs for (empty when it cannot be read)."""
    from matplotlib.ft2font import FT2Font

    try:
        return frozenset(FT2Font(path).get_charmap())
    except (OSError, RuntimeError, ValueError):
        return frozenset()


@cache
def _default_font() -> str:
    from matplotlib import font_manager

    return font_manager.findfont(font_manager.FontProperties())


def _covers(path: str, word: str) -> bool:
    chars = _charmap(path)
    return all(ord(ch) in chars or ch.isspace() for ch in word)


@cache
def font_for(word: str) -> str | None:
    """The font file to draw ``word`` with: the default one when it has every glyph, else the first installed
    font that has them all; None when no installed font has them."""
    if _covers(_default_font(), word):
        return _default_font()
    from matplotlib import font_manager

    for entry in sorted(font_manager.fontManager.ttflist, key=lambda f: f.fname):
        if "last resort" in entry.name.lower():  # a placeholder glyph (a box) for every code point: no font at all
            continue
        if _covers(entry.fname, word):
            return entry.fname
    return None


def plain(word: str, most: int = 3) -> str:
    """``word`` as ASCII code points (``U+72D7 U+5728``; the first ``most``, then ``...``): a label every font draws."""
    points = [f"U+{ord(ch):04X}" for ch in word if not ch.isspace()]
    return " ".join(points[:most]) + (" ..." if len(points) > most else "")


def label(word: str) -> tuple[str, dict]:
    """(text, matplotlib text keywords) to write ``word`` under its panel: the word in a font that has its glyphs,
    or its code points (:func:`plain`) when no installed font does."""
    path = font_for(word)
    if path is None:
        return plain(word), {}
    if path == _default_font():
        return word, {}
    from matplotlib.font_manager import FontProperties

    return word, {"fontproperties": FontProperties(fname=path)}


def undrawable(words: list[str]) -> list[str]:
    """The words of ``words`` that no installed font draws (their panels are labelled by :func:`plain`)."""
    return [w for w in dict.fromkeys(words) if font_for(w) is None]
