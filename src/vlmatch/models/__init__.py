"""The models: the protocol every model follows (:mod:`.base`), one module per paper, the registry of
their names, and the training losses. Importing this package registers every built-in model."""

from . import caan, mmca, mtfn, scan, sman, vse  # noqa: F401 (each registers its names)
from .base import ImageEncoding, MatchingModel, TextEncoding
from .registry import create_model, describe_models, list_models, load_model

__all__ = ["ImageEncoding", "TextEncoding", "MatchingModel", "create_model", "list_models",
           "describe_models", "load_model"]
