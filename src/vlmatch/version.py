"""The version of vlmatch (one place; ``vlmatch.__version__`` re-exports it)."""

__version__ = "0.1.0"
