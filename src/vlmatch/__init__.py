"""vlmatch: image-text matching and cross-modal retrieval on one engine."""

from . import pretrained  # noqa: F401 (registers "pretrained:NAME" checkpoint names)
from .models.registry import create_model, describe_models, list_models, load_model
from .search.index import Index

__version__ = "0.1.0"
__all__ = ["Index", "create_model", "list_models", "describe_models", "load_model", "__version__"]
