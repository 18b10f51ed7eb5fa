"""The models: the protocol every model follows (:mod:`.base`), one module per paper, the registry of
their names, and the training losses. The registry registers every built-in model on its first lookup
(:func:`load_builtin_models`); importing this package alone imports no torch (the command line's parser
and the checkpoint resolver need only names)."""

from __future__ import annotations

from ..lazy import lazy_names

_LAZY = {"ImageEncoding": ".base", "TextEncoding": ".base", "MatchingModel": ".base", "create_model": ".registry",
         "list_models": ".registry", "describe_models": ".registry", "load_model": ".registry"}

__all__ = ["ImageEncoding", "TextEncoding", "MatchingModel", "create_model", "list_models",
           "describe_models", "load_model"]


def load_builtin_models() -> None:
    """Import every built-in model module (each registers its names with :mod:`.registry`)."""
    from . import caan, mmca, mtfn, scan, sman, vse  # noqa: F401


__getattr__, __dir__ = lazy_names(__name__, globals(), _LAZY)
