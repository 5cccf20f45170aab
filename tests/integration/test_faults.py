"""Database errors are sorted once, at the boundary, by SQLSTATE; a worker
process survives every one that is not a bug (guarantee 11).

The first half raises each kind of error for real (a held lock under
statement_timeout or lock_timeout, a real deadlock, a serialization failure,
a read-only session, a check violation, a missing function) and checks how
``aio/pg.py`` sorted it. The second half does the same to a running worker
process and checks that it is still alive and finishes every job once the
fault is gone. Faults Postgres will not produce on demand (a full NOTIFY
queue, a full disk) come from a ``pg_notify`` shadowed in this test's own
database, which raises them for the service's connections only.
"""

from __future__ import annotations

from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from pathlib import Path

import pytest
import trio

from nexarch_events.aio import Connection, Database
from nexarch_events.errors import (
    DatabaseError,
    DatabaseRejected,
    DatabaseTransient,
    DatabaseUnavailable,
)
from nexarch_events.queue.jobs import Queue
from tests.support.procs import (
    WorkerProcess,
    WorkerProcesses,
    check_alive,
    wait_listening,
    wait_statuses,
)

#: A pg_notify that wins over pg_catalog's (search_path = public, pg_catalog)
#: and raises the SQLSTATE in test_fault, for the service's connections only
#: (their application_name starts with nexarch-events/), so the test itself
#: can still enqueue.
SHADOW_PG_NOTIFY = [
    "CREATE TABLE public.test_fault (sqlstate text NOT NULL)",
    """CREATE FUNCTION public.pg_notify(channel text, payload text) RETURNS void
       LANGUAGE plpgsql AS $$
       DECLARE code text;
       BEGIN
           IF current_setting('application_name') LIKE 'nexarch-events/%' THEN
               SELECT f.sqlstate INTO code FROM public.test_fault f LIMIT 1;
               IF code = '54000' THEN
                   RAISE EXCEPTION 'too many notifications in the NOTIFY queue'
                         USING ERRCODE = code;
               ELSIF code IS NOT NULL THEN
                   RAISE EXCEPTION 'fault injected by the test' USING ERRCODE = code;
               END IF;
           END IF;
           PERFORM pg_catalog.pg_notify(channel, payload);
       END $$""",
    """DO $$ BEGIN
           EXECUTE format('ALTER DATABASE %I SET search_path = public, pg_catalog',
                          current_database());
       END $$""",
]


async def alter_database(db: Database, setting: str, value: str | None) -> None:
    """ALTER DATABASE <this one> SET/RESET: new sessions only."""
    clause = "RESET " + setting if value is None else f"SET {setting} = '{value}'"
    async with db.acquire() as conn:  # one session: set_config, then read it
        await conn.execute("SELECT set_config('nexarch.t', $1, false)", clause)
        await conn.execute("""DO $$ BEGIN EXECUTE format('ALTER DATABASE %I %s',
                              current_database(), current_setting('nexarch.t')); END $$""")


async def raised(executor: Connection | Database, query: str, *args: object) -> DatabaseError:
    with pytest.raises(DatabaseError) as info:
        await executor.execute(query, *args)
    return info.value


@asynccontextmanager
async def table_locked(database_url: str) -> AsyncIterator[None]:
    """LOCK TABLE mail_index_jobs (ACCESS EXCLUSIVE) for the block."""
    holder = await Connection.open(database_url, command_timeout=None)
    try:
        await holder.execute("SET statement_timeout = 0")
        await holder.execute("SET lock_timeout = 0")
        async with holder.transaction():
            await holder.execute("LOCK TABLE mail_index_jobs IN ACCESS EXCLUSIVE MODE")
            yield
    finally:
        await holder.aclose()


# -- sorting: each class raised for real ----------------------------------------------


async def test_statement_timeout_behind_a_held_lock_is_transient(
        db: Database, database_url: str) -> None:
    conn = await Connection.open(database_url)
    try:
        await conn.execute("SET statement_timeout = '200ms'")
        with trio.fail_after(20):
            async with table_locked(database_url):
                exc = await raised(conn, "SELECT count(*) FROM mail_index_jobs")
        assert (type(exc), exc.sqlstate) == (DatabaseTransient, "57014")
        # The session is still usable: a transient error is about the statement.
        assert await conn.fetchval("SELECT 1") == 1
    finally:
        await conn.aclose()


async def test_lock_timeout_is_transient(db: Database, database_url: str) -> None:
    conn = await Connection.open(database_url)
    try:
        await conn.execute("SET lock_timeout = '100ms'")
        with trio.fail_after(20):
            async with table_locked(database_url):
                exc = await raised(conn, "UPDATE mail_index_jobs SET attempts = 0")
        assert (type(exc), exc.sqlstate) == (DatabaseTransient, "55P03")
    finally:
        await conn.aclose()


async def test_deadlock_and_serialization_failure_are_transient(
        db: Database, database_url: str) -> None:
    queue = Queue(db)
    a = await queue.enqueue_index("acme", "dl-a", {})
    b = await queue.enqueue_index("acme", "dl-b", {})
    first, second = (await Connection.open(database_url), await Connection.open(database_url))
    errors: list[DatabaseError] = []

    async def cross(conn: Connection, mine: int, theirs: int, locked: trio.Event,
                    other_locked: trio.Event) -> None:
        try:
            async with conn.transaction():
                await conn.execute("UPDATE mail_index_jobs SET attempts = 1 WHERE id = $1", mine)
                locked.set()
                await other_locked.wait()
                await conn.execute("UPDATE mail_index_jobs SET attempts = 2 WHERE id = $1",
                                   theirs)
        except DatabaseError as exc:
            errors.append(exc)

    try:
        with trio.fail_after(30):
            one, two = trio.Event(), trio.Event()
            async with trio.open_nursery() as nursery:
                nursery.start_soon(cross, first, a, b, one, two)
                nursery.start_soon(cross, second, b, a, two, one)
        assert [(type(e), e.sqlstate) for e in errors] == [(DatabaseTransient, "40P01")]

        # A repeatable-read transaction that updates a row changed since its
        # snapshot: serialization failure.
        with pytest.raises(DatabaseError) as info:
            async with first.transaction():
                await first.execute("SET TRANSACTION ISOLATION LEVEL REPEATABLE READ")
                await first.fetchval("SELECT attempts FROM mail_index_jobs WHERE id = $1", a)
                await second.execute("UPDATE mail_index_jobs SET attempts = 3 WHERE id = $1",
                                     a)
                await first.execute("UPDATE mail_index_jobs SET attempts = 4 WHERE id = $1", a)
        assert (type(info.value), info.value.sqlstate) == (DatabaseTransient, "40001")
    finally:
        await first.aclose()
        await second.aclose()


async def test_full_notify_queue_and_full_disk_are_transient(
        db: Database, database_url: str) -> None:
    for statement in SHADOW_PG_NOTIFY:
        await db.execute(statement)
    conn = await Connection.open(database_url, application_name="nexarch-events/test")
    try:
        for sqlstate in ("54000", "53100"):
            await db.execute("DELETE FROM test_fault")
            await db.execute("INSERT INTO test_fault VALUES ($1)", sqlstate)
            exc = await raised(conn, "SELECT pg_notify('nexarch_job_events', 'x')")
            assert (type(exc), exc.sqlstate) == (DatabaseTransient, sqlstate)
    finally:
        await conn.aclose()


async def test_read_only_session_means_reconnect(db: Database, database_url: str) -> None:
    conn = await Connection.open(database_url)
    try:
        await conn.execute("SET default_transaction_read_only = on")
        exc = await raised(conn, "UPDATE mail_index_jobs SET attempts = 0")
        assert (type(exc), exc.sqlstate) == (DatabaseUnavailable, "25006")
    finally:
        await conn.aclose()


async def test_bad_data_is_rejected_and_bad_sql_is_a_bug(db: Database) -> None:
    exc = await raised(db, "INSERT INTO mail_index_jobs (job_type, tenant_slug, message_id, "
                           "max_attempts) VALUES ('index', 'acme', 'x', 0)")
    assert (type(exc), exc.sqlstate) == (DatabaseRejected, "23514")
    exc = await raised(db, "SELECT no_such_function_of_ours()")
    assert (type(exc), exc.sqlstate) == (DatabaseError, "42883")


# -- a worker process survives each -----------------------------------------------------

#: NEXARCH_QUEUE_* of the worker processes here. A short drain interval makes
#: the sweeper and every worker run statements all through a fault.
SETTINGS: dict[str, float | int] = {
    "stale_after": 5.0, "heartbeat_interval": 0.25, "backoff_base": 0.2, "backoff_cap": 3,
    "drain_interval": 0.3, "shutdown_grace": 2.0, "listener_ping_interval": 1.0,
    "listener_ping_timeout": 2.0, "reconnect_min": 0.05, "reconnect_max": 0.5,
}


async def enqueue(db: Database, prefix: str, count: int, sleep: float = 0.0) -> list[int]:
    queue = Queue(db)
    payload = {"sleep": sleep} if sleep else {}
    return [int(await queue.enqueue_index("acme", f"{prefix}-{n}", payload))
            for n in range(count)]


async def stay_alive(worker: WorkerProcess, seconds: float) -> None:
    """Sleep ``seconds``, raising at once if the worker process exits."""
    with trio.move_on_after(seconds):
        while True:
            check_alive(worker)
            await trio.sleep(0.1)


async def finish_after_fault(db: Database, worker: WorkerProcess, during: list[int]) -> None:
    """The fault is gone: everything enqueued during it, and new jobs, end
    succeeded while the worker process stays alive."""
    with trio.fail_after(40):
        await wait_statuses(db, during, alive=[worker])
        after = await enqueue(db, "after", 10)
        await wait_statuses(db, after, alive=[worker])
    check_alive(worker)


@pytest.fixture
async def procs(database_url: str, tmp_path: Path) -> AsyncIterator[WorkerProcesses]:
    async with WorkerProcesses(database_url, tmp_path / "effects.tsv", tmp_path,
                               SETTINGS) as processes:
        yield processes


async def start_warm(db: Database, procs: WorkerProcesses) -> WorkerProcess:
    worker = await procs.start("a", workers=2, batch_size=5)
    with trio.fail_after(30):
        await wait_listening(db, worker)
        await wait_statuses(db, await enqueue(db, "warm", 5), alive=[worker])
    return worker


@pytest.mark.slow
@pytest.mark.parametrize("setting", ["statement_timeout", "lock_timeout"])
async def test_worker_survives_timeouts_behind_a_held_table_lock(
        db: Database, database_url: str, procs: WorkerProcesses, setting: str) -> None:
    await alter_database(db, setting, "300ms")
    worker = await start_warm(db, procs)
    # Slow jobs: claimed before the lock, acknowledged while it is held.
    during = await enqueue(db, "during", 10, sleep=1.0)
    with trio.fail_after(10):
        await wait_statuses(db, during[:1], "processing", alive=[worker])
    async with table_locked(database_url):
        await stay_alive(worker, 2.5)
    await finish_after_fault(db, worker, during)


@pytest.mark.slow
@pytest.mark.parametrize("sqlstate", ["54000", "40P01", "40001", "53100"])
async def test_worker_survives_errors_raised_by_pg_notify(
        db: Database, procs: WorkerProcesses, sqlstate: str) -> None:
    for statement in SHADOW_PG_NOTIFY:
        await db.execute(statement)
    worker = await start_warm(db, procs)
    # Every acknowledgement notifies: while the fault lasts, none goes through.
    await db.execute("INSERT INTO test_fault VALUES ($1)", sqlstate)
    during = await enqueue(db, "during", 10)
    await stay_alive(worker, 2.5)
    await db.execute("DELETE FROM test_fault")
    await finish_after_fault(db, worker, during)


@pytest.mark.slow
async def test_worker_survives_a_read_only_server(
        db: Database, database_url: str, procs: WorkerProcesses) -> None:
    worker = await start_warm(db, procs)
    producer = await Connection.open(database_url)  # a session from before
    try:
        await alter_database(db, "default_transaction_read_only", "on")
        # A failover: the connections drop, and the new ones land on a
        # read-only server.
        await db.execute("SELECT pg_terminate_backend(pid) FROM pg_stat_activity "
                         "WHERE application_name LIKE 'nexarch-events/%' "
                         "AND datname = current_database()")
        queue = Queue(producer)
        during = [int(await queue.enqueue_index("acme", f"ro-{n}", {})) for n in range(10)]
        await stay_alive(worker, 2.5)
        await alter_database(db, "default_transaction_read_only", None)
        await finish_after_fault(db, worker, during)
    finally:
        await producer.aclose()


@pytest.mark.slow
async def test_every_connection_of_a_worker_process_is_named_by_its_role(
        db: Database, procs: WorkerProcesses) -> None:
    await start_warm(db, procs)
    names = {row["application_name"] for row in await db.fetch(
        "SELECT application_name FROM pg_stat_activity WHERE datname = current_database()"
        " AND backend_type = 'client backend' AND pid <> pg_backend_pid()")}
    # The test's own pool may hold idle connections besides this one (no name).
    assert names - {""} == {"nexarch-events/listener/a", "nexarch-events/pool/a",
                            "nexarch-events/worker/a/0", "nexarch-events/worker/a/1"}
