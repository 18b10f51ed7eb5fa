"""Which of a caption's tokens a heat map shows (the CLI's PNG and the web page alike): special tokens never,
function words only on request (``--all-words``), a phrase's column always.
"""

from __future__ import annotations

import re

SPECIAL = re.compile(r"^(<.*>|\[(CLS|SEP|PAD|UNK|MASK)\])$")

# English function words: articles, pronouns, prepositions, conjunctions, auxiliaries, particles and
# punctuation -- the closed classes, which carry no place in a photo
FUNCTION_WORDS = frozenset("""
a an the this that these those some any each every another other such no
i me my mine we us our you your he him his she her it its they them their there here
of in on at to into onto from by with without for about over under above below near behind beside
between among through across along around against toward towards upon off out up down than as like
and or but nor so yet if while because although though when where whether which who whom whose what
is are was were be been being am do does did has have had having will would shall should can could may
might must 's not very too also just then
. , ; : ! ? ' " - ( ) ...
""".split())


def is_special(token: str) -> bool:
    return bool(SPECIAL.match(token))


def is_content(token: str) -> bool:
    """A token a heat map shows by default: not a special token, not a function word (any case)."""
    return not is_special(token) and token.lower() not in FUNCTION_WORDS


def shown_columns(words: list[str], all_words: bool = False) -> list[int]:
    """The columns to draw: content words (every word but special tokens with ``all_words``); when a caption
    has no content word, its words; never a special token."""
    words_only = [j for j, w in enumerate(words) if not is_special(w)]
    if all_words:
        return words_only
    return [j for j in words_only if is_content(words[j])] or words_only
