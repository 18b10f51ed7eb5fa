"""What several commands share: argument types and help texts."""

from __future__ import annotations

import argparse

DATA_HELP = ("a precomp folder, or 'toyworld' for the bundled synthetic data (generated on first use into "
             "$VLMATCH_CACHE/toyworld, default ~/.cache/vlmatch/toyworld)")


def positive_int(text: str) -> int:
    """An argparse type: an integer >= 1 (argparse reports anything else in one line)."""
    try:
        value = int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected an integer >= 1, got {text!r}") from None
    if value < 1:
        raise argparse.ArgumentTypeError(f"expected an integer >= 1, got {value}")
    return value


def checkpoint_arg(text: str):
    """An argparse type: a checkpoint folder, or ``pretrained:NAME`` (a model shipped with vlmatch) resolved to
    its hash-checked folder; an unknown name or a damaged file is one argparse error line."""
    from ..errors import VlmatchError
    from ..models.registry import resolve_checkpoint

    try:
        return str(resolve_checkpoint(text))  # a string, as argparse gives every other path
    except VlmatchError as e:
        raise argparse.ArgumentTypeError(str(e)) from None


def utf8_text(text: str, name: str) -> str:
    """``text`` from the command line, refused (a ConfigError naming the argument ``name``) when it holds
    bytes that are not UTF-8: Python hands them over as lone surrogates, which no tokenizer takes."""
    from ..errors import ConfigError
    from ..io import printable

    for i, ch in enumerate(text):
        if "\ud800" <= ch <= "\udfff":
            raise ConfigError(f"{name} is not UTF-8 text (byte {printable(ch)} at character {i + 1} of "
                              f"\"{printable(text, controls=True)}\"): give the text in UTF-8")
    return text
