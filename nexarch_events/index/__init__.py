"""Search index backends behind one small interface (``base.IndexBackend``)."""

from .base import (
    IndexBackend,
    IndexBackendError,
    IndexDocument,
    IndexRejected,
    IndexUnavailable,
    InvalidQuery,
    SearchHit,
    SearchQuery,
    SearchResult,
)

__all__ = ["IndexBackend", "IndexBackendError", "IndexDocument", "IndexRejected",
           "IndexUnavailable", "InvalidQuery", "SearchHit", "SearchQuery", "SearchResult"]
