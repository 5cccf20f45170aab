"""Resuming an event stream (queue.sql's "finished_after", api/events.py)
reads from its cursor, not the finished-job history before it: on real
Postgres, through the deployed statement, past asyncpg's five custom plans.
Counted are index entries and scanned rows of mail_index_jobs
(tests/support/reads.py), so nothing is timed.

Before, the cursor was compared inside a CASE, so it was only a filter and
the scan of the finished index started at the oldest finished job (found by
an audit of the SQL, stop 24). Where a stream starts ("last_finished")
walked back through every tenant's newer jobs for an idle tenant (20,001
entries for the small tenant here) until migration 0030. A quiet tenant's
resume walked every other tenant's job finished since its cursor (20,040
entries for 39 rows; 3,001 since migration 0035)."""

from __future__ import annotations

import pytest

from nexarch_events.aio import Connection, Database
from nexarch_events.db import sqlfiles
from nexarch_events.models import JobStatus
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
            # The mark's row, the page and a look-ahead (a plpgsql FOR loop
            # fetches 10 rows at a time): not the history before it.
            assert read[0] <= 120, read[0]
    finally:
        await conn.aclose()


async def test_a_quiet_tenant_resuming_reads_its_own_jobs_not_the_others(
        db: Database) -> None:
    """A tenant's stream resumes near the end of its history after a gap in
    which another tenant finished 20,000 jobs: a window of the jobs
    finished next, then the tenant's own jobs; before, the range scan
    walked every other tenant's job since the cursor."""
    await db.execute("""
        INSERT INTO mail_index_jobs (job_type, tenant_slug, message_id, status, attempts,
                                     finished_at)
        SELECT 'index', CASE WHEN n <= 2000 THEN 'quiet' ELSE 'busy' END, 'm' || n,
               'succeeded', 1, now() - interval '1 day' + n * interval '1 second'
          FROM generate_series(1, 22000) AS n""")
    await db.execute("ANALYZE mail_index_jobs")  # as autovacuum would
    quiet = [r["id"] for r in await db.fetch(
        "SELECT id FROM mail_index_jobs WHERE tenant_slug = 'quiet' ORDER BY finished_at, id")]
    conn = await Connection.open(db.dsn)
    try:
        for mark, expected in ((quiet[-40], quiet[-39:]), (0, quiet[:100])):
            for _ in range(8):  # past the custom plans
                async with entries_read(conn, "mail_index_jobs") as read:
                    rows = await conn.fetch(QUEUE["finished_after"], "quiet", mark, 100)
                assert [r["id"] for r in rows] == expected
                # The window, then the tenant's own jobs: never the other's 20,000.
                assert read[0] <= 1_000 + 2 * 2_000 + 10, (mark, read[0])
    finally:
        await conn.aclose()


async def test_a_replay_across_the_window_keeps_finish_order(db: Database) -> None:
    """Rows found in the window and rows found after it, for one tenant,
    come out as one list in finish order, then id; other tenants' and
    unfinished jobs never."""
    await db.execute("""
        INSERT INTO mail_index_jobs (job_type, tenant_slug, message_id, status, attempts,
                                     finished_at)
        SELECT 'index', CASE WHEN n % 700 = 0 THEN 'a' ELSE 'b' END, 'm' || n,
               CASE WHEN n % 1400 = 0 THEN 'failed' ELSE 'succeeded' END, 1,
               now() - interval '1 day' + (n / 2) * interval '1 second'
          FROM generate_series(1, 5000) AS n""")
    await db.execute("INSERT INTO mail_index_jobs (job_type, tenant_slug, message_id)"
                     " VALUES ('index', 'a', 'pending')")
    ordered = [r["id"] for r in await db.fetch(
        "SELECT id FROM mail_index_jobs WHERE tenant_slug = 'a' AND finished_at IS NOT NULL"
        " ORDER BY finished_at, id")]
    assert len(ordered) == 7
    for n, mark in enumerate([0, *ordered]):
        for limit in (1, 3, 100):
            rows = await db.fetch(QUEUE["finished_after"], "a", mark, limit)
            assert [r["id"] for r in rows] == ordered[n:][:limit], (mark, limit)
            assert {r["tenant_slug"] for r in rows} <= {"a"}
    everyone = await db.fetch(QUEUE["finished_after"], None, ordered[0], 10_000)
    assert len(everyone) == 5000 - 700


@pytest.mark.parametrize(("tenant", "bound"), [("small", 1_000 + 2 * SMALL + 10),
                                               ("large", 1_000 + 10), (None, 10)])
async def test_where_a_stream_starts_is_found_without_the_other_tenants_history(
        db: Database, history: dict[str, list[int]], tenant: str | None, bound: int) -> None:
    """An idle tenant's last finished job: a window of the newest finished
    jobs, then that tenant's own jobs; never the history of every tenant
    since it was last busy."""
    conn = await Connection.open(db.dsn)
    try:
        for _ in range(8):  # past the custom plans
            async with entries_read(conn, "mail_index_jobs") as read:
                last = await conn.fetchval(QUEUE["last_finished"], tenant)
            assert last == history[tenant or "large"][-1]
            assert read[0] <= bound, read[0]
        assert await conn.fetchval(QUEUE["last_finished"], "nobody") is None
    finally:
        await conn.aclose()


async def test_where_a_stream_starts_orders_by_finish_time_then_id(db: Database) -> None:
    """A retried job finishes after higher ids did; jobs finished in the same
    instant are ordered by id; pending jobs and other tenants' do not count."""
    rows = await db.fetch("""
        INSERT INTO mail_index_jobs (job_type, tenant_slug, message_id, status, attempts,
                                     finished_at)
        VALUES ('index', 'a', 'late', 'failed', 5, now()),
               ('index', 'a', 'x', 'succeeded', 1, now() - interval '1 minute'),
               ('index', 'a', 'y', 'succeeded', 1, now() - interval '1 minute'),
               ('index', 'b', 'z', 'succeeded', 1, now() + interval '1 minute')
        RETURNING id""")
    await db.execute("INSERT INTO mail_index_jobs (job_type, tenant_slug, message_id)"
                     " VALUES ('index', 'a', 'pending')")
    late = rows[0]["id"]
    assert await db.fetchval(QUEUE["last_finished"], "a") == late
    await db.execute("UPDATE mail_index_jobs SET finished_at = now() - interval '1 hour'"
                     " WHERE id = $1", late)
    assert await db.fetchval(QUEUE["last_finished"], "a") == rows[2]["id"]
    assert await db.fetchval(QUEUE["last_finished"], None) == rows[3]["id"]


async def test_a_small_tenants_queue_stats_read_its_own_jobs(
        db: Database, history: dict[str, list[int]]) -> None:
    """GET /queue for one tenant counts that tenant's jobs through its key,
    whatever was asked before: once the statement for "one tenant or all"
    settled on a generic plan (after calls for all tenants), a small
    tenant's counts scanned the whole job table."""
    from nexarch_events.queue import Queue

    await db.execute("""
        INSERT INTO mail_index_jobs (job_type, tenant_slug, message_id)
        SELECT 'index', 'small', 'pending-' || n FROM generate_series(1, 3) AS n""")
    conn = await Connection.open(db.dsn)
    try:
        queue = Queue(conn)
        for tenant in (None, None, "large", None, "large", None, None, "large"):
            await queue.stats_for(tenant)
        for _ in range(3):
            async with entries_read(conn, "mail_index_jobs") as read:
                stats = await queue.stats_for("small")
            assert stats.counts[JobStatus.SUCCEEDED] == SMALL
            assert stats.counts[JobStatus.PENDING] == 3
            assert stats.oldest_ready_age_s is not None
            # Its jobs, counted once and once more for the oldest ready one.
            assert read[0] <= 2 * (SMALL + 3) + 10, read[0]
        everyone = await queue.stats_for(None)
        assert everyone.counts[JobStatus.SUCCEEDED] == SMALL + LARGE
    finally:
        await conn.aclose()
