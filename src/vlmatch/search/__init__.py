"""Search your own collection: an index folder, two-stage retrieval, the Python API."""

from .index import DEFAULT_CANDIDATES, Index, SearchResult

__all__ = ["Index", "SearchResult", "DEFAULT_CANDIDATES"]
