"""Search your own collection: an index folder, two-stage retrieval, the Python API. (The names below are
imported on first use: the command line's parser reads this package's light modules without torch.)"""

from __future__ import annotations

from ..lazy import lazy_names

_LAZY = {"Index": ".index", "SearchHit": ".index", "SearchResult": ".index", "DEFAULT_CANDIDATES": ".index"}

__all__ = ["Index", "SearchHit", "SearchResult", "DEFAULT_CANDIDATES"]


__getattr__, __dir__ = lazy_names(__name__, globals(), _LAZY)
