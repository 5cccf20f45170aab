"""Behind PgBouncer in transaction mode (a real one, Debian's package).

Work connections go through the pooler, with asyncpg's prepared-statement
cache off; the LISTEN connection needs a direct URL
(NEXARCH_LISTEN_DATABASE_URL). Without one, the listener's self-check hears
nothing and the service refuses to start, naming the cause, instead of
running deaf.
"""

from __future__ import annotations

from collections.abc import Iterator
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
