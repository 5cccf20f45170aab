"""Resuming an event stream (queue.sql's "finished_after", api/events.py)
reads from its cursor, not the finished-job history before it: on real
Postgres, through the deployed statement, past asyncpg's five custom plans.
Counted are index entries and scanned rows of mail_index_jobs
(tests/support/reads.py), so nothing is timed.

Before, the cursor was compared inside a CASE, so it was only a filter and
the scan of the finished index started at the oldest finished job (found by
an audit of the SQL, stop 24). Where a stream starts ("last_finished") still
walks back through every tenant's newer jobs for an idle tenant; see the
closing note of stop 24."""

from __future__ import annotations

import pytest

from nexarch_events.aio import Connection, Database
from nexarch_events.db import sqlfiles
from tests.support.reads import entries_read

QUEUE = sqlfiles.queries("queue.sql")
SMALL, LARGE = 50, 20_000


@pytest.fixture
async def history(db: Database) -> dict[str, list[int]]:
    """A small tenant's jobs finished a day ago, then a large tenant's,
    finished since, one a second: each tenant's job ids in finish order."""
    await db.execute("""
        INSERT INTO mail_index_jobs (job_type, tenant_slug, message_id, status, attempts,
                                     finished_at)
        SELECT 'index', CASE WHEN n <= $1::int THEN 'small' ELSE 'large' END, 'm' || n,
               'succeeded', 1, now() - interval '1 day' + n * interval '1 second'
          FROM generate_series(1, $1::int + $2::int) AS n""", SMALL, LARGE)
    await db.execute("ANALYZE mail_index_jobs")  # as autovacuum would
    return {t: [r["id"] for r in await db.fetch(
        "SELECT id FROM mail_index_jobs WHERE tenant_slug = $1 ORDER BY finished_at, id", t)]
        for t in ("small", "large")}


@pytest.mark.parametrize("tenant", ["large", None])
async def test_resuming_a_stream_reads_from_its_cursor(
        db: Database, history: dict[str, list[int]], tenant: str | None) -> None:
    mark = history["large"][LARGE // 2]
    conn = await Connection.open(db.dsn)
    try:
        for _ in range(8):  # past the custom plans
            async with entries_read(conn, "mail_index_jobs") as read:
                rows = await conn.fetch(QUEUE["finished_after"], tenant, mark, 100)
            assert [r["id"] for r in rows] == history["large"][LARGE // 2 + 1:LARGE // 2 + 101]
            # The mark's row, the page and a look-ahead: not the history before it.
            assert read[0] <= 110, read[0]
    finally:
        await conn.aclose()
