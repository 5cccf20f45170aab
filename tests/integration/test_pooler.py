"""Behind PgBouncer in transaction mode (a real one, Debian's package).

Work connections go through the pooler, with asyncpg's prepared-statement
cache off; the LISTEN connection needs a direct URL
(NEXARCH_LISTEN_DATABASE_URL). Without one, the listener's self-check hears
nothing and the service refuses to start, naming the cause, instead of
running deaf.
"""

from __future__ import annotations

from collections.abc import AsyncIterator, Iterator
from contextlib import asynccontextmanager
from pathlib import Path

import pytest
import trio

from nexarch_events.aio import Database
from nexarch_events.errors import ConfigurationError
from nexarch_events.queue.jobs import Queue
from nexarch_events.queue.notify import Listener
from nexarch_events.settings import QueueSettings
from tests.support.pgbouncer import PgBouncer, running_pgbouncer
from tests.support.procs import WorkerProcesses, wait_listening, wait_statuses

SETTINGS: dict[str, float | int] = {
    "stale_after": 5.0, "heartbeat_interval": 0.5, "drain_interval": 60.0,
    "listener_ping_interval": 1.0, "listener_ping_timeout": 2.0,
    "reconnect_min": 0.05, "reconnect_max": 0.5,
}


@pytest.fixture
def pgbouncer(database_url: str) -> Iterator[PgBouncer]:
    with running_pgbouncer(database_url) as bouncer:
        yield bouncer


async def test_a_listener_behind_a_transaction_pooler_refuses_to_start(
        db: Database, database_url: str, pgbouncer: PgBouncer) -> None:
    listener = Listener(pgbouncer.url(database_url),
                        QueueSettings(listener_ping_timeout=1.0, listener_ping_interval=1.0))
    # Were it to start, it would run (listen) until the timeout.
    with trio.fail_after(20), pytest.raises(ConfigurationError) as info:
        await listener.run()
    assert "NEXARCH_LISTEN_DATABASE_URL" in str(info.value)
    assert not listener.connected and listener.connections == 0


async def test_a_listener_on_a_direct_connection_hears_itself(
        db: Database, database_url: str) -> None:
    listener = Listener(database_url, QueueSettings(listener_ping_timeout=5.0))
    with trio.fail_after(20):
        async with trio.open_nursery() as nursery:
            await nursery.start(listener.run)
            assert listener.connected
            nursery.cancel_scope.cancel()


@pytest.mark.slow
async def test_a_worker_process_runs_through_pgbouncer_with_a_direct_listen_url(
        db: Database, database_url: str, pgbouncer: PgBouncer, tmp_path: Path) -> None:
    async with WorkerProcesses(pgbouncer.url(database_url), tmp_path / "effects.tsv", tmp_path,
                               SETTINGS,
                               extra_env={"NEXARCH_LISTEN_DATABASE_URL": database_url}) as procs:
        worker = await procs.start("pooled", workers=2, batch_size=10)
        with trio.fail_after(60):
            await wait_listening(db, worker)
            queue = Queue(db)
            ids = [int(await queue.enqueue_index("acme", f"m{n}", {})) for n in range(20)]
            # Woken by notifications (drain_interval is 60 s): the LISTEN
            # connection hears them, the work goes through the pooler.
            await wait_statuses(db, ids, alive=[worker])


@pytest.mark.slow
async def test_a_worker_process_without_a_direct_listen_url_exits_2(
        db: Database, database_url: str, pgbouncer: PgBouncer, tmp_path: Path) -> None:
    async with WorkerProcesses(pgbouncer.url(database_url), tmp_path / "effects.tsv", tmp_path,
                               SETTINGS) as procs:
        worker = await procs.start("deaf", workers=1)
        with trio.fail_after(60):
            # 2: a configuration error (the message names the variable to set).
            assert await worker.wait() == 2


# -- session state behind a pooler: the importer's run lock ----------------------


RUN_LOCK, RETENTION_LOCK = 1312902721, 1312902723  # sql/importer.sql, sql/lifecycle.sql


async def held_locks(db: Database, lock_class: int) -> int:
    """Session advisory locks of one class held anywhere in this database."""
    count: int = await db.fetchval(
        "SELECT count(*) FROM pg_locks WHERE locktype = 'advisory' AND classid = $1"
        " AND database = (SELECT oid FROM pg_database WHERE datname = current_database())",
        lock_class)
    return count


@asynccontextmanager
async def other_clients(pooled: Database) -> AsyncIterator[None]:
    """Three other clients of the pooler for the block, as the workers and
    the API are: they take whichever server connection comes free."""
    async def hammer() -> None:
        while True:
            await pooled.fetchval("SELECT 1")

    with trio.fail_after(60):
        async with trio.open_nursery() as nursery:
            for _ in range(3):
                nursery.start_soon(hammer)
            yield
            nursery.cancel_scope.cancel()


async def test_the_importer_run_lock_holds_on_a_direct_connection_behind_a_pooler(
        db: Database, database_url: str, pgbouncer: PgBouncer) -> None:
    """A session advisory lock taken through a transaction pooler stays on
    whichever server connection ran that one statement: the unlock lands on
    another, and the lock outlives the run (the mailbox is then "busy" for
    ever). With the direct URL configured, the lock's session is direct."""
    from nexarch_events.importer.mailboxes import MailboxConfig, MailboxRegistry
    from nexarch_events.importer.sync import run_sync
    from tests.integration.test_importer_traps import messages
    from tests.support.imap_script import open_scripted_imap

    async with Database.open(pgbouncer.url(database_url), max_size=4, statement_cache_size=0,
                             session_dsn=database_url) as pooled, \
            open_scripted_imap(messages(list(range(1, 31)))) as server:
        config = MailboxConfig(tenant_slug="acme", name="inbox", host=server.host,
                               port=server.port, tls_mode="plain", username="user",
                               password_ref="env:UNUSED")
        await MailboxRegistry(pooled).add(config)
        async with other_clients(pooled):
            for _ in range(5):
                report = await run_sync(pooled, config, "secret", lock_wait=5)
                assert await held_locks(db, RUN_LOCK) == 0
        assert report.last_synced_uid == 30


async def test_two_imports_in_flight_through_a_transaction_pooler(
        aio_loop: None, database_url: str, pgbouncer: PgBouncer) -> None:
    """The spare connection of a run comes from the pooled URL: each import
    is one statement, and its turn locks are transaction locks, so the order
    holds on whichever server connection PgBouncer hands out."""
    from nexarch_events.importer.mailboxes import MailboxConfig, MailboxRegistry
    from nexarch_events.importer.sync import run_sync
    from nexarch_events.testing import record_imports
    from tests.integration.test_importer_traps import messages
    from tests.support.imap_script import open_scripted_imap

    async with Database.open(pgbouncer.url(database_url), max_size=4, statement_cache_size=0,
                             session_dsn=database_url) as pooled, \
            open_scripted_imap(messages(list(range(1, 61)))) as server, \
            record_imports(database_url) as rec:
        config = MailboxConfig(tenant_slug="acme", name="inbox", host=server.host,
                               port=server.port, tls_mode="plain", username="user",
                               password_ref="env:UNUSED")
        await MailboxRegistry(pooled).add(config)
        report = await run_sync(pooled, config, "secret", lock_wait=5)
        assert report.max_in_flight == 2 and report.imported == 60
        await rec.wait_for_imported(count=60)
    rec.assert_in_uid_order()
    assert [e.uid for e in rec.select()] == list(range(1, 61))


async def test_a_retention_pass_behind_a_pooler_leaves_no_lock_behind(
        db: Database, database_url: str, pgbouncer: PgBouncer) -> None:
    """One retention pass at a time is a session lock too: behind a pooler
    without a direct session it would outlive the pass, and every later pass
    would find "another process's pass running" for ever."""
    from datetime import UTC, datetime

    from nexarch_events.index.postgres import PostgresIndex
    from nexarch_events.lifecycle.retention import Retention
    from nexarch_events.settings import RetentionSettings

    async with Database.open(pgbouncer.url(database_url), max_size=4, statement_cache_size=0,
                             session_dsn=database_url) as pooled:
        retention = Retention(pooled, PostgresIndex(pooled), RetentionSettings())
        async with other_clients(pooled):
            for _ in range(5):
                assert await retention.run_pass(datetime.now(UTC)) == []  # None: "busy"
                assert await held_locks(db, RETENTION_LOCK) == 0


# -- the job table's vacuum behind a pooler --------------------------------------


async def test_behind_a_transaction_pooler_the_vacuum_goes_direct(
        db: Database, database_url: str, pgbouncer: PgBouncer) -> None:
    """The vacuum switches statement_timeout off for its session: through a
    transaction pooler that SET would stay on a server connection for the
    pooler's other clients. The service opens it on the direct URL (as the
    listener's); the pooler's connections keep the database's setting."""
    from nexarch_events.service import QueueService
    from nexarch_events.settings import Settings
    from tests.integration.test_vacuum import make_dead_rows, vacuum_count, without_autovacuum

    await without_autovacuum(db)
    name = await db.fetchval("SELECT current_database()")
    await db.execute(f'ALTER DATABASE "{name}" SET statement_timeout = \'7min\'')
    url = pgbouncer.url(database_url)
    settings = Settings(database_url=url, listen_database_url=database_url,
                        queue=QueueSettings(vacuum_dead_rows=500))
    before = await vacuum_count(db)
    async with Database.open(url, max_size=4, **settings.pool_options()) as pooled:
        async def never(jobs: object) -> None:
            raise AssertionError("no job is run here")

        service = QueueService(pooled, settings, {"index": never, "delete": never})
        await make_dead_rows(pooled, service.queue, 1000)
        await service.vacuum.vacuum_once()
        assert await vacuum_count(db) == before + 1
        assert await Queue(db).dead_rows() < 500
        # The server connections the pooler hands this pool (a SET sent
        # through it would stay on one of them).
        for _ in range(8):
            assert await pooled.fetchval("SHOW statement_timeout") == "7min"


async def test_cli_commands_through_a_pooler_without_a_direct_url_exit_2(
        db: Database, database_url: str, pgbouncer: PgBouncer) -> None:
    """A CLI command run where only the pooled URL is set: its prepared
    statements meet those an earlier client left on the same server
    connection (42P05, "prepared statement __asyncpg_stmt_1__ already
    exists"), which was sorted as a bug: exit 70 with a traceback (a
    deployment audit: nine commands of nine). It is the pooler case the
    README names: exit 2, naming the variable."""
    from tests.acceptance.test_cli import cli

    pooled = pgbouncer.url(database_url)
    codes = []
    for _ in range(4):
        for args in (("stats",), ("mailbox", "list")):
            result = await trio.to_thread.run_sync(lambda args=args: cli(*args, url=pooled))
            codes.append(result.returncode)
            assert result.returncode in (0, 2), result.stderr
            if result.returncode == 2:
                assert "NEXARCH_LISTEN_DATABASE_URL" in result.stderr, result.stderr
                assert "Traceback" not in result.stderr
    assert 2 in codes, codes  # the collision did happen


async def test_a_run_refused_behind_a_pooler_signs_in_to_no_mailbox(
        db: Database, database_url: str, pgbouncer: PgBouncer) -> None:
    """`run` with the listen URL through the pooler too: it exits 2, but its
    importer had started beside the listener's self-check and could leave
    a mailbox's run lock on a pooler's server connection, which blocked
    that mailbox for up to the pooler's server_lifetime (a deployment
    audit). The importer starts once the listener heard itself."""
    import os
    import subprocess
    import sys

    from nexarch_events.importer.mailboxes import MailboxConfig, MailboxRegistry
    from tests.support.imap_script import open_scripted_imap

    pooled = pgbouncer.url(database_url)
    async with open_scripted_imap([]) as server:
        await MailboxRegistry(db).add(MailboxConfig(
            tenant_slug="acme", name="inbox", host=server.host, port=server.port,
            tls_mode="plain", username="user", password_ref="env:POOLER_TEST_PW"))
        environ = {k: v for k, v in os.environ.items() if not k.startswith("NEXARCH_")}
        environ.update(NEXARCH_DATABASE_URL=pooled, NEXARCH_LISTEN_DATABASE_URL=pooled,
                       NEXARCH_API_ENABLED="false", POOLER_TEST_PW="secret")
        proc = await trio.lowlevel.open_process(
            [sys.executable, "-m", "nexarch_events", "run"], env=environ,
            stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
        with trio.fail_after(60):
            code = await proc.wait()
        assert code == 2
        assert server.logins == 0, server.commands
    assert await held_locks(db, RUN_LOCK) == 0
