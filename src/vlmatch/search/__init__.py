"""Search your own collection: an index folder, two-stage retrieval, the Python API. (The names below are
imported on first use: the command line's parser reads this package's light modules without torch.)"""

from __future__ import annotations

import importlib

_LAZY = {"Index": ".index", "SearchHit": ".index", "SearchResult": ".index", "DEFAULT_CANDIDATES": ".index"}

__all__ = ["Index", "SearchHit", "SearchResult", "DEFAULT_CANDIDATES"]


def __getattr__(name: str):
    if name in _LAZY:
        value = getattr(importlib.import_module(_LAZY[name], __name__), name)
        globals()[name] = value
        return value
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
