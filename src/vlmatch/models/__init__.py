from .base import ImageEncoding, MatchingModel, TextEncoding
from .registry import create_model, describe_models, list_models, load_model

__all__ = ["ImageEncoding", "TextEncoding", "MatchingModel", "create_model", "list_models",
           "describe_models", "load_model"]
