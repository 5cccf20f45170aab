"""A page of one tenant's archive in id order reads that page, not the other
tenants' rows nor the tenant's whole archive (migration 0029), on real
Postgres, through the deployed statements and past asyncpg's five custom
plans into the generic one. Counted are index entries of mail_archive read
per page (tests/support/reads.py), so nothing is timed.

Before, a small tenant's page walked the primary key from its cursor and
read every other tenant's row above it; a large tenant's page read all of
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
PAGE = 20
SMALL, LARGE = 30, 3000


@pytest.fixture
async def archive(db: Database) -> dict[str, list[int]]:
    """A small tenant's messages first, then a large one's: each tenant's ids."""
    for tenant, count in (("small", SMALL), ("large", LARGE)):
        await db.execute("""
            INSERT INTO mail_archive (tenant_slug, sha256, size_bytes, raw)
            SELECT $1, sha256(convert_to($1 || n, 'UTF8')), length($1 || n),
                   convert_to($1 || n, 'UTF8')
              FROM generate_series(1, $2::int) AS n""", tenant, count)
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


# Each statement as (file, name, arguments for tenant, after, limit, index
# entries it may read per row: "undated" looks each message up again by id).
PAGED: list[tuple[str, str, Callable[[str, int, int], tuple[object, ...]], int]] = [
    ("archive.sql", "ids_page", lambda t, after, n: (t, after, n), 1),
    ("lifecycle.sql", "ids_page", lambda t, after, n: (t, after, n), 1),
    # Retention's windows: every message is dated, and expired by 2100.
    ("lifecycle.sql", "undated", lambda t, after, n: (t, after, n), 2),
    ("lifecycle.sql", "expired", lambda t, after, n: (t, FUTURE, after, n), 1),
    # An event stream's replay.
    ("importer.sql", "archived_after", lambda t, after, n: (t, after, n), 1),
]


@pytest.mark.parametrize(("file", "name", "args", "per_row"), PAGED,
                         ids=[f"{f}:{n}" for f, n, _, _ in PAGED])
async def test_a_page_of_one_tenant_reads_about_one_page(
        db: Database, archive: dict[str, list[int]], file: str, name: str,
        args: Callable[[str, int, int], tuple[object, ...]], per_row: int) -> None:
    query = sqlfiles.queries(file)[name]
    conn = await Connection.open(db.dsn)
    try:
        for tenant in ("small", "large", "small", "large"):
            seen: list[int] = []
            after = 0
            for _ in range(8):  # past the custom plans, in both tenants
                async with entries_read(conn, "mail_archive") as read:
                    rows = await conn.fetch(query, *args(tenant, after, PAGE))
                assert read[0] <= per_row * PAGE + 2, (tenant, after, read[0])
                if not rows:
                    break
                assert all(r["expired"] for r in rows) if name == "expired" else True
                assert all(r["head"] is None for r in rows) if name == "undated" else True
                seen += [r[0] for r in rows]  # the id
                after = seen[-1]
            assert seen == archive[tenant][:len(seen)] and len(seen) >= min(SMALL, 8 * PAGE)
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
                assert read[0] <= 2, (tenant, read[0])
                assert newest == (max(archive[tenant]) if tenant in archive else
                                  0 if tenant else max(archive["large"]))
    finally:
        await conn.aclose()
