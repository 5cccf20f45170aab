"""The job table's vacuum against a real Postgres: dead row versions past the
threshold are vacuumed on a connection of its own, a vacuum somebody else
runs is skipped rather than waited for, and a role that may not vacuum is
told once and leaves the table to autovacuum."""

from __future__ import annotations

import logging
import uuid
from collections.abc import Iterator
from functools import partial
from urllib.parse import urlsplit, urlunsplit

import pytest
import trio

from nexarch_events.aio import Connection, Database, execute_sync
from nexarch_events.models import JobType, NewJob
from nexarch_events.queue.jobs import Queue
from nexarch_events.queue.vacuum import TableVacuum
from nexarch_events.settings import QueueSettings

from ..conftest import PgServer


async def vacuum_count(db: Database) -> int:
    return int(await db.fetchval(
        "SELECT vacuum_count FROM pg_stat_user_tables "
        "WHERE relid = 'mail_index_jobs'::regclass"))


async def without_autovacuum(db: Database) -> None:
    """Autovacuum off for this database's job table: on a server where it is
    on, it could vacuum the table first (then there is nothing left for the
    task) or hold it while the task's VACUUM (SKIP_LOCKED) skips."""
    await db.execute("ALTER TABLE mail_index_jobs SET (autovacuum_enabled = false)")


async def make_dead_rows(db: Database, queue: Queue, n: int) -> None:
    """``n`` jobs, each updated once: ``n`` dead row versions (the statistics
    count them once the updating backend flushes, about a second later)."""
    await queue.enqueue_many([NewJob(JobType.INDEX, "acme", f"m{i}", {}) for i in range(n)])
    await db.execute("UPDATE mail_index_jobs SET attempts = attempts")


def vacuum_for(queue: Queue, url: str) -> TableVacuum:
    return TableVacuum(queue, partial(Connection.open, url, application_name="test/vacuum"))


async def test_dead_rows_past_the_threshold_are_vacuumed(db: Database,
                                                         database_url: str) -> None:
    await without_autovacuum(db)
    queue = Queue(db, QueueSettings(vacuum_dead_rows=500))
    vacuum = vacuum_for(queue, database_url)
    before = await vacuum_count(db)
    async with trio.open_nursery() as nursery:
        await nursery.start(vacuum.run)
        await trio.sleep(3)  # below the threshold: looked at, left alone
        assert vacuum.vacuums == 0
        await make_dead_rows(db, queue, 1000)
        with trio.fail_after(30):
            while vacuum.vacuums == 0:
                await trio.sleep(0.1)
        nursery.cancel_scope.cancel()
    assert await vacuum_count(db) == before + 1, "Postgres counts the vacuum"
    assert vacuum.left_behind < 500
    assert await queue.dead_rows() < 500


async def test_a_table_someone_else_vacuums_is_skipped_not_waited_for(
        db: Database, database_url: str) -> None:
    queue = Queue(db, QueueSettings(vacuum_dead_rows=500))
    vacuum = vacuum_for(queue, database_url)
    # The lock a running (auto)vacuum holds, held by another session.
    holder = await Connection.open(database_url)
    try:
        async with holder.transaction():
            await holder.execute("LOCK TABLE mail_index_jobs IN SHARE UPDATE EXCLUSIVE MODE")
            with trio.fail_after(10):  # without SKIP_LOCKED: until the holder ends
                await vacuum.vacuum_once()
    finally:
        await holder.aclose()
    assert vacuum.vacuums == 1


async def test_a_statement_timeout_of_the_role_does_not_cancel_the_vacuum(
        db: Database, database_url: str) -> None:
    # As if the operator had set statement_timeout = 100ms for the service's
    # role (asyncpg sends unknown URL parameters as server settings), with
    # the vacuum slowed down by cost delays so that it takes longer than
    # that on any machine: it would be cancelled, retried after a backoff,
    # and cancelled again. (The SET before it takes far less than 100 ms,
    # also on a busy machine.)
    await without_autovacuum(db)
    queue = Queue(db)
    await make_dead_rows(db, queue, 2000)
    before = await vacuum_count(db)
    url = f"{database_url}?statement_timeout=100&vacuum_cost_delay=10&vacuum_cost_limit=1"
    check = await Connection.open(url)
    try:
        assert await check.fetchval("SHOW statement_timeout") == "100ms", "the setting applies"
    finally:
        await check.aclose()
    started = trio.current_time()
    with trio.fail_after(120):
        await vacuum_for(queue, url).vacuum_once()
    assert trio.current_time() - started > 0.1, "the vacuum outlasted the timeout"
    assert await vacuum_count(db) == before + 1


@pytest.fixture
def stranger_url(pg_server: PgServer, database_url: str) -> Iterator[str]:
    """The test's database, as a login role that owns neither it nor the
    job table."""
    role = f"nexarch_stranger_{uuid.uuid4().hex[:8]}"
    execute_sync(pg_server.admin_url, [f'CREATE ROLE "{role}" LOGIN'])
    parts = urlsplit(database_url)
    host = parts.netloc.rpartition("@")[2]
    yield urlunsplit(parts._replace(netloc=f"{role}@{host}"))
    execute_sync(pg_server.admin_url, [f'DROP ROLE IF EXISTS "{role}"'])


async def test_a_role_that_may_not_vacuum_says_so_once_and_stops(
        aio_loop: None, stranger_url: str, caplog: pytest.LogCaptureFixture) -> None:
    async with Database.open(stranger_url) as db:
        queue = Queue(db, QueueSettings(vacuum_dead_rows=1))
        assert not await queue.vacuum_allowed()
        vacuum = vacuum_for(queue, stranger_url)
        with caplog.at_level(logging.WARNING, logger="nexarch_events.queue.vacuum"):
            with trio.fail_after(10):
                await vacuum.run()  # returns: nothing it could do
    assert vacuum.vacuums == 0
    lines = [r.getMessage() for r in caplog.records if r.name == "nexarch_events.queue.vacuum"]
    assert len(lines) == 1 and "may not vacuum mail_index_jobs" in lines[0], lines


async def test_from_postgres_17_maintain_on_the_table_is_enough(
        aio_loop: None, stranger_url: str, database_url: str) -> None:
    async with Database.open(database_url) as owner:
        version = int(await owner.fetchval("SHOW server_version_num"))
        role = stranger_url.split("://", 1)[1].split("@", 1)[0]
        if version >= 170000:
            await owner.execute(f'GRANT MAINTAIN ON mail_index_jobs TO "{role}"')
    try:
        async with Database.open(stranger_url) as db:
            # Before 17 the privilege does not exist: the check must not name it.
            assert await Queue(db).vacuum_allowed() is (version >= 170000)
    finally:
        if version >= 170000:  # else the role could not be dropped after
            async with Database.open(database_url) as owner:
                await owner.execute(f'REVOKE MAINTAIN ON mail_index_jobs FROM "{role}"')


async def test_the_owner_may_vacuum(queue: Queue) -> None:
    assert await queue.vacuum_allowed()


async def test_autovacuum_of_the_job_table_is_not_throttled(db: Database) -> None:
    # Migration 0025: while autovacuum holds the table, the service's own
    # VACUUM (SKIP_LOCKED) skips it, so autovacuum's pass must be short.
    options = await db.fetchval(
        "SELECT reloptions FROM pg_class WHERE oid = 'mail_index_jobs'::regclass")
    assert "autovacuum_vacuum_cost_delay=0" in (options or [])
