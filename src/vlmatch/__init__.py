"""vlmatch: image-text matching and cross-modal retrieval on one engine.

``create_model``, ``load_model``, ``Index`` ... are imported on first use (PEP 562): importing the package, and so
``vlmatch --help``, imports no torch."""

from __future__ import annotations

from . import pretrained  # noqa: F401 (registers "pretrained:NAME" checkpoint names; imports no torch)
from .lazy import lazy_names
from .version import __version__

# public name -> the module that defines it (imported when the name is first asked for)
_LAZY = {"create_model": ".models.registry", "describe_models": ".models.registry", "list_models": ".models.registry",
         "load_model": ".models.registry", "Index": ".search.index"}

__all__ = ["Index", "create_model", "list_models", "describe_models", "load_model", "__version__"]


__getattr__, __dir__ = lazy_names(__name__, globals(), _LAZY)
