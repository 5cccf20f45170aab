"""A search without words, filtered by sender or mailbox ("all mail from
anna@..."), reads the messages that pass the filter, not the tenant's
whole index: on real Postgres, through PostgresIndex.search, past
asyncpg's five custom plans. Counted are index entries and scanned rows of
mail_search_documents (tests/support/reads.py), so nothing is timed.

Before migration 0031 such a search walked the tenant's documents newest
first and tested each one's sender (100,000 read for 10 found; 25-30 ms at
100,000 messages, linear in the tenant's size)."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta

import pytest

from nexarch_events.aio import Connection, Database
from nexarch_events.index.base import SearchQuery
from nexarch_events.index.postgres import PostgresIndex
from tests.support.reads import entries_read

TENANT = "acme"
COUNT = 20_000
T0 = datetime(2026, 1, 1, tzinfo=UTC)


@pytest.fixture
async def documents(db: Database) -> None:
    """COUNT documents of the tenant, newest id sent last: every 2,000th from
    rare@example.org and in "Legal" too, the rest from one of 200 senders;
    a few of another tenant from the rare sender, in "Legal"."""
    await db.execute("""
        INSERT INTO mail_search_documents (
            tenant_slug, archive_id, subject, sender, sender_addresses, recipients, body,
            attachment_names, attachment_text, sent_at, received_at, mailboxes, size_bytes,
            search)
        SELECT t, n, 'subject ' || n, 'x', ARRAY[
                   CASE WHEN n % 2000 = 0 THEN 'rare@example.org'
                        ELSE 'a' || (n % 200) || '@example.org' END],
               '', 'body', '', '', $2::timestamptz + n * interval '1 minute',
               $2::timestamptz + n * interval '1 minute',
               CASE WHEN n % 2000 = 0 THEN ARRAY['INBOX', 'Legal'] ELSE ARRAY['INBOX'] END,
               10, to_tsvector('simple', 'body')
          FROM generate_series(1, $1::int) AS n,
               (VALUES ('acme'), ('other')) AS tenants(t)
         WHERE t = 'acme' OR n % 2000 = 0""", COUNT, T0)
    await db.execute("ANALYZE mail_search_documents")  # as autovacuum would


RARE = list(range(COUNT, 0, -2000))  # newest first


@pytest.mark.parametrize("sort", ["relevance", "sent", "received"])
@pytest.mark.parametrize("filters", [{"sender": "Rare@Example.org"}, {"mailbox": "Legal"},
                                     {"sender": "rare@example.org", "mailbox": "Legal"}])
async def test_a_rare_filter_reads_what_passes_it(
        db: Database, documents: None, sort: str, filters: dict[str, str]) -> None:
    conn = await Connection.open(db.dsn)
    try:
        index = PostgresIndex(conn)
        for _ in range(8):  # past the custom plans
            async with entries_read(conn, "mail_search_documents") as read:
                result = await index.search(SearchQuery(TENANT, "", sort=sort, limit=5,
                                                        **filters))  # type: ignore[arg-type]
            assert [h.archive_id for h in result.hits] == RARE[:5]
            assert (result.total, result.exact_total) == (len(RARE), True)
            assert read[0] <= 5 * len(RARE) + 20, read[0]
    finally:
        await conn.aclose()


async def test_a_common_filter_still_pages_newest_first_and_counts_to_the_cap(
        db: Database, documents: None) -> None:
    index = PostgresIndex(db, count_limit=50)
    result = await index.search(SearchQuery(TENANT, "", sender="a7@example.org", limit=3,
                                            offset=2))
    expected = [n for n in range(COUNT, 0, -1) if n % 200 == 7][2:5]
    assert [h.archive_id for h in result.hits] == expected
    assert (result.total, result.exact_total) == (50, False)
    within = await index.search(SearchQuery(
        TENANT, "", mailbox="INBOX", sort="received", limit=2,
        received_from=T0 + timedelta(minutes=100), received_to=T0 + timedelta(minutes=104)))
    assert [h.archive_id for h in within.hits] == [103, 102]
    assert (within.total, within.exact_total) == (4, True)
