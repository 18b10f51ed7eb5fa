"""Search your own collection: an index folder, two-stage retrieval, the Python API."""

from .index import DEFAULT_CANDIDATES, Index, SearchHit, SearchResult

__all__ = ["Index", "SearchHit", "SearchResult", "DEFAULT_CANDIDATES"]
