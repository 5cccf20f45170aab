"""The archive ids a search-language query finds in one tenant, through the
configured index backend (``erase --query``, query holds).

Pages of ``MAX_LIMIT`` hits until a short page; a query that finds more
than ``MAX_MATCHES`` messages is refused (``TooManyMatches``) rather than
acted on in part. Only indexed mail can be found: a message archived but
not yet indexed is not matched.
"""

from __future__ import annotations

from ..errors import NexarchError
from ..index.base import MAX_LIMIT, MAX_OFFSET, IndexBackend, InvalidQuery, SearchQuery
from ..models import validate_tenant_slug

#: The most messages one query may act on (the backends page this far).
MAX_MATCHES = MAX_OFFSET + MAX_LIMIT


class TooManyMatches(NexarchError):
    """A query finds more messages than one lifecycle action may take."""


def check_query(tenant_slug: str, query: str) -> str:
    """The query if it is a searchable one; raises InvalidQuery (an empty
    query would mean "everything": refused here, never widened)."""
    validate_tenant_slug(tenant_slug)
    if not isinstance(query, str) or not query.strip():
        raise InvalidQuery("the query is empty: name words to search for (an erasure or "
                           "hold of everything is --all or a tenant hold)")
    SearchQuery(tenant_slug, query, limit=1)  # raises InvalidQuery naming the problem
    return query


async def find_ids(backend: IndexBackend, tenant_slug: str, query: str) -> set[int]:
    """Every archive id of the tenant the query finds. Raises InvalidQuery,
    TooManyMatches, IndexUnavailable."""
    check_query(tenant_slug, query)
    found: set[int] = set()
    offset = 0
    while True:
        if offset > MAX_OFFSET:
            raise TooManyMatches(
                f"the query {query[:80]!r} finds more than {MAX_MATCHES} messages of tenant "
                f"{tenant_slug!r}: narrow it (or erase/hold the whole tenant)")
        result = await backend.search(SearchQuery(tenant_slug, query, limit=MAX_LIMIT,
                                                  offset=offset))
        found.update(hit.archive_id for hit in result.hits)
        if len(result.hits) < MAX_LIMIT:
            return found
        offset += MAX_LIMIT
