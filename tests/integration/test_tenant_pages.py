"""A pass over one tenant's archive in id order, page by page, reads that
tenant's rows about once: not the other tenants' rows (unless it holds most
of the archive), nor its whole archive per page (migration 0029). On real
Postgres, through the deployed statements, twice each, so asyncpg's prepared
statements are past their five custom plans. Counted are index entries and
scanned rows of mail_archive (tests/support/reads.py), so nothing is timed.

Before, a small tenant's page walked the primary key from its cursor and
read every other tenant's rows above it; a large tenant's page read all of
its rows through (tenant_slug, sha256) and sorted them.

Retention's "undated" and "expired" filtered and limited in one step; the
planner joined the tenant's whole archive to its dates and sorted it, per
page (a large tenant's page read 3,000 entries here). They now read a window
of ids first and judge each message of it."""

from __future__ import annotations

from collections.abc import Callable
from datetime import UTC, datetime

import pytest

from nexarch_events.aio import Connection, Database
from nexarch_events.db import sqlfiles
from tests.support.reads import entries_read

FUTURE = datetime(2100, 1, 1, tzinfo=UTC)
PAGE = 200
SMALL, LARGE = 300, 20_000


@pytest.fixture
async def archive(db: Database) -> dict[str, list[int]]:
    """Half of a small tenant's messages, a large tenant's, then the small
    one's other half (so that walking the ids crosses the large one's): each
    tenant's ids."""
    half = SMALL // 2
    for tenant, first, last in (("small", 1, half), ("large", 1, LARGE),
                                ("small", half + 1, SMALL)):
        await db.execute("""
            INSERT INTO mail_archive (tenant_slug, sha256, size_bytes, raw)
            SELECT $1, sha256(convert_to($1 || n, 'UTF8')), length($1 || n),
                   convert_to($1 || n, 'UTF8')
              FROM generate_series($2::int, $3::int) AS n""", tenant, first, last)
    await db.execute("""
        INSERT INTO mail_archive_dates (archive_id, tenant_slug, sent_at)
        SELECT id, tenant_slug, '2001-01-01' FROM mail_archive""")
    # An archive large enough for this to matter has statistics (autovacuum
    # analyzes it); on a table without them the planner guesses any tenant
    # to be a handful of rows.
    await db.execute("ANALYZE mail_archive")
    return {t: [r["id"] for r in await db.fetch(
        "SELECT id FROM mail_archive WHERE tenant_slug = $1 ORDER BY id", t)]
        for t in ("small", "large")}


# Each statement as (file, name, arguments for tenant, after, limit, and the
# entries it may read per row of the tenant: its archive row, its date row
# where it judges the date, and its archive row again where "undated" reads
# the header of one without a date).
PAGED: list[tuple[str, str, Callable[[str, int, int], tuple[object, ...]], int]] = [
    ("archive.sql", "ids_page", lambda t, after, n: (t, after, n), 1),
    ("lifecycle.sql", "ids_page", lambda t, after, n: (t, after, n), 1),
    # Retention's windows: every message is dated, and expired by 2100.
    ("lifecycle.sql", "undated", lambda t, after, n: (t, after, n), 3),
    ("lifecycle.sql", "expired", lambda t, after, n: (t, FUTURE, after, n), 2),
    # An event stream's replay.
    ("importer.sql", "archived_after", lambda t, after, n: (t, after, n), 1),
]


@pytest.mark.parametrize(("file", "name", "args", "per_row"), PAGED,
                         ids=[f"{f}:{n}" for f, n, _, _ in PAGED])
async def test_a_pass_over_one_tenant_reads_that_tenant_once(
        db: Database, archive: dict[str, list[int]], file: str, name: str,
        args: Callable[[str, int, int], tuple[object, ...]], per_row: int) -> None:
    query = sqlfiles.queries(file)[name]
    total = sum(len(ids) for ids in archive.values())
    conn = await Connection.open(db.dsn)
    try:
        # Twice each: asyncpg's prepared statement goes generic after five.
        for tenant in ("small", "large", "small", "large"):
            mine = len(archive[tenant])
            seen: list[int] = []
            read = 0
            while True:
                async with entries_read(conn, "mail_archive", "mail_archive_dates") as page_read:
                    rows = await conn.fetch(query, *args(tenant, seen[-1] if seen else 0, PAGE))
                read += page_read[0]
                if name == "expired":
                    assert all(r["expired"] for r in rows)
                if name == "undated":
                    assert all(r["head"] is None for r in rows)
                seen += [r[0] for r in rows]  # the id
                if len(rows) < PAGE:
                    break
            assert seen == archive[tenant]
            # The tenant's rows once (and their date rows), a look-ahead
            # entry per page, and, for a tenant that holds most of the
            # archive, the others' rows once (walking the primary key is
            # then the cheap plan).
            pages = mine // PAGE + 1
            bound = per_row * mine + 2 * pages + (total - mine if mine > total / 2 else 0)
            assert read <= bound, (tenant, read, bound)
    finally:
        await conn.aclose()


async def test_the_newest_id_of_one_tenant_reads_one_entry(
        db: Database, archive: dict[str, list[int]]) -> None:
    # Where a tenant's event stream starts.
    query = sqlfiles.queries("importer.sql")["archive_max_id"]
    conn = await Connection.open(db.dsn)
    try:
        for _ in range(4):  # past the custom plans
            for tenant in ("small", "large", "nobody", None):
                async with entries_read(conn, "mail_archive") as read:
                    newest = await conn.fetchval(query, tenant)
                # A tenant holding most of the archive may walk the primary
                # key down through the others' newer rows: the cheap plan.
                others = SMALL if tenant == "large" else 0
                assert read[0] <= 2 + others, (tenant, read[0])
                everyone = max(max(ids) for ids in archive.values())
                assert newest == (max(archive[tenant]) if tenant in archive else
                                  0 if tenant else everyone)
    finally:
        await conn.aclose()
