"""vlmatch: image-text matching and cross-modal retrieval on one engine."""

from . import pretrained  # noqa: F401 (registers "pretrained:NAME" checkpoint names)
from .models.registry import create_model, describe_models, list_models, load_model
from .search.index import Index
from .version import __version__

__all__ = ["Index", "create_model", "list_models", "describe_models", "load_model", "__version__"]
