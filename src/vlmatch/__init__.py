"""vlmatch: image-text matching and cross-modal retrieval on one engine.

Importing the package is light (no torch): ``create_model``, ``load_model``, ``Index`` ... are imported on
first use (PEP 562), so ``vlmatch --help`` and every command's argument errors answer without importing
torch (benchmarks/cold_start.py measures it)."""

from __future__ import annotations

import importlib

from . import pretrained  # noqa: F401 (registers "pretrained:NAME" checkpoint names; imports no torch)
from .version import __version__

# public name -> the module that defines it (imported when the name is first asked for)
_LAZY = {"create_model": ".models.registry", "describe_models": ".models.registry", "list_models": ".models.registry",
         "load_model": ".models.registry", "Index": ".search.index"}

__all__ = ["Index", "create_model", "list_models", "describe_models", "load_model", "__version__"]


def __getattr__(name: str):
    if name in _LAZY:
        value = getattr(importlib.import_module(_LAZY[name], __name__), name)
        globals()[name] = value
        return value
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")


def __dir__():
    return sorted(set(globals()) | set(_LAZY))
