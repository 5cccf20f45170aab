"""Crash and multi-process tests: killed workers, killed and half-open
listener connections, a Postgres restart, several worker processes at once,
graceful shutdown, per-message order under retries.

Worker processes run ``python -m nexarch_events worker`` with the handlers of
``tests.support.handlers``, which append one line per job event to an effects
file (who ran which job, when, how often). Tests assert on job rows, effects
and return values, never on log text. Every test carries an absolute
``trio.fail_after``.
"""

from __future__ import annotations

import shutil
import signal
import statistics
import tempfile
import time
from collections import Counter, defaultdict
from collections.abc import AsyncIterator, Iterator
from contextlib import asynccontextmanager
from dataclasses import replace
from pathlib import Path

import pytest
import trio

from nexarch_events.aio import Database
from nexarch_events.db.embedded import EmbeddedPostgres
from nexarch_events.db.migrations import migrate
from nexarch_events.errors import DatabaseUnavailable
from nexarch_events.models import JobType, NewJob
from nexarch_events.queue.jobs import Queue
from nexarch_events.service import QueueService
from nexarch_events.settings import QueueSettings, Settings
from tests.support.handlers import Effect, make_handlers, read_effects
from tests.support.procs import (
    WorkerProcess,
    WorkerProcesses,
    check_alive,
    job_rows,
    retrying,
    status_counts,
    wait_listening,
    wait_statuses,
    wait_until,
)
from tests.support.tcp_proxy import TcpProxy

STALE_AFTER = 2.0

#: NEXARCH_QUEUE_* of every worker process unless a test says otherwise.
#: drain_interval is long: only notifications, due retries and stale leases
#: may wake anyone, so a lost wake-up shows as a timeout.
PROCESS_SETTINGS: dict[str, float | int] = {
    "stale_after": STALE_AFTER, "heartbeat_interval": 0.25, "backoff_base": 0.2,
    "backoff_cap": 3, "drain_interval": 60.0, "shutdown_grace": 2.0,
    "listener_ping_interval": 1.0, "listener_ping_timeout": 2.0,
    "reconnect_min": 0.05, "reconnect_max": 0.5,
}


@pytest.fixture
async def procs(database_url: str, tmp_path: Path) -> AsyncIterator[WorkerProcesses]:
    async with WorkerProcesses(database_url, tmp_path / "effects.tsv", tmp_path,
                               PROCESS_SETTINGS) as processes:
        yield processes


@asynccontextmanager
async def running(service: QueueService) -> AsyncIterator[QueueService]:
    """Run ``service`` in-process for the block, then cancel it."""
    async with trio.open_nursery() as nursery:
        await nursery.start(service.run)
        try:
            yield service
        finally:
            service.cancel()


def effects_of(effects: list[Effect], kind: str) -> dict[int, list[Effect]]:
    by_job: dict[int, list[Effect]] = defaultdict(list)
    for effect in effects:
        if effect.kind == kind:
            by_job[effect.job_id].append(effect)
    return by_job


async def wait_effect(path: Path, kind: str, job_id: int, worker: WorkerProcess) -> Effect:
    """Block until ``worker`` wrote a ``kind`` line for the job; raise if it died."""
    found: list[Effect] = []

    async def seen() -> bool:
        check_alive(worker)
        found[:] = [e for e in read_effects(path)
                    if e.kind == kind and e.job_id == job_id and e.pid == worker.pid]
        return bool(found)

    await wait_until(seen)
    return found[0]


async def epoch(db: Database, column: str, job_id: int) -> float:
    """A timestamp column of a job row as time.time() seconds."""
    assert column in {"heartbeat_at", "updated_at", "finished_at"}
    value = await db.fetchval(
        f"SELECT extract(epoch FROM {column}) FROM mail_index_jobs WHERE id = $1", job_id)
    assert value is not None, f"job {job_id} has no {column}"
    return float(value)


# -- 1. SIGKILL --------------------------------------------------------------------


@pytest.mark.slow
async def test_sigkill_mid_job_is_taken_over_after_the_stale_timeout_and_done_once(
        db: Database, procs: WorkerProcesses) -> None:
    queue = Queue(db)
    with trio.fail_after(60):
        a = await procs.start("a", workers=2, batch_size=1)
        # Slow for its first worker only, quick for whoever takes it over.
        job = await queue.enqueue_index("acme", "kill-1", {"sleep": 60, "sleep_attempts": 1})
        await wait_effect(procs.effects_path, "start", job, a)
        row = (await job_rows(db, [job]))[job]
        assert row["status"] == "processing"
        assert row["locked_by"].startswith("a#")

        a.kill()
        assert await a.wait() == -signal.SIGKILL
        # A is dead: this is its last heartbeat. The job may not be taken
        # over before it is stale_after old.
        last_heartbeat = await epoch(db, "heartbeat_at", job)
        assert (await job_rows(db, [job]))[job]["status"] == "processing"

        b = await procs.start("b", workers=2, batch_size=1)
        # B starts, finds the lease in its first sweep, and takes the job
        # once it is stale: well within this, even on a busy machine.
        with trio.move_on_after(STALE_AFTER + 20):
            await wait_statuses(db, [job], "succeeded", alive=[b])
        row = (await job_rows(db, [job]))[job]
        assert row["status"] == "succeeded", \
            f"the killed worker's job is still {row['status']!r}: not taken over"

    effects = [e for e in read_effects(procs.effects_path) if e.job_id == job]
    starts = [(e.pid, e.attempts) for e in effects if e.kind == "start"]
    assert starts == [(a.pid, 1), (b.pid, 2)]
    done = [e for e in effects if e.kind == "done"]
    assert [(e.pid, e.attempts) for e in done] == [(b.pid, 2)], "completed exactly once, by B"
    taken_over_at = next(e.at for e in effects if e.kind == "start" and e.pid == b.pid)
    assert taken_over_at >= last_heartbeat + STALE_AFTER - 0.01, \
        f"taken over {taken_over_at - last_heartbeat:.2f}s after the last heartbeat"
    row = (await job_rows(db, [job]))[job]
    assert (row["status"], row["attempts"], row["lease"], row["locked_by"]) == \
        ("succeeded", 2, None, None)
    assert b.returncode is None


@pytest.mark.slow
async def test_job_of_a_killed_process_is_taken_over_by_a_process_already_running(
        db: Database, procs: WorkerProcesses) -> None:
    """Both processes run before the job is claimed, so the survivor has no
    fresh start to read the schedule on: its sweeper must still find the
    dead process's lease once it is stale, not only at the next safety-net
    drain (60 s here)."""
    queue = Queue(db)
    with trio.fail_after(60):
        a = await procs.start("a", workers=1, batch_size=1)
        b = await procs.start("b", workers=1, batch_size=1)
        await wait_listening(db, a, b)
        # The case under test is a process that has run for a while: its
        # sweeper has read the schedule at start-up, found nothing to watch,
        # and sleeps. (Started right after the listener: give it a moment.)
        await trio.sleep(1.0)
        job = await queue.enqueue_index("acme", "kill-2", {"sleep": 60, "sleep_attempts": 1})

        async def claimed() -> bool:
            return any(e.job_id == job for e in read_effects(procs.effects_path))

        await wait_until(claimed)
        holder_pid = read_effects(procs.effects_path)[0].pid
        holder, survivor = (a, b) if holder_pid == a.pid else (b, a)
        holder.kill()
        assert await holder.wait() == -signal.SIGKILL
        killed_at = trio.current_time()

        # Stale after STALE_AFTER; a sweeper that re-reads the schedule at
        # least every stale_after finds it by twice that. Slack for a busy box.
        bound = 2 * STALE_AFTER + 4
        with trio.move_on_after(bound):
            await wait_statuses(db, [job], "succeeded", alive=[survivor])
        waited = trio.current_time() - killed_at
        row = (await job_rows(db, [job]))[job]
        assert row["status"] == "succeeded", (
            f"job of the killed process still {row['status']!r} {waited:.1f}s after the kill "
            f"(stale_after={STALE_AFTER}s): the running process did not take it over")

    done = effects_of(read_effects(procs.effects_path), "done")
    assert [(e.pid, e.attempts) for e in done[job]] == [(survivor.pid, 2)]


@pytest.mark.slow
async def test_slow_job_of_a_live_worker_keeps_its_lease_past_stale_after(
        db: Database, procs: WorkerProcesses) -> None:
    # Both processes sweep every 0.3 s, so a lease that went stale (a missed
    # heartbeat) would be reclaimed and the job run a second time.
    queue = Queue(db)
    with trio.fail_after(60):
        a = await procs.start("a", workers=2, batch_size=1, drain_interval=0.3)
        b = await procs.start("b", workers=2, batch_size=1, drain_interval=0.3)
        await wait_listening(db, a, b)
        job = await queue.enqueue_index("acme", "slow-1", {"sleep": 3 * STALE_AFTER})

        async def finished_or_started_twice() -> bool:
            starts = [e for e in read_effects(procs.effects_path)
                      if e.job_id == job and e.kind == "start"]
            return len(starts) > 1 or (await status_counts(db, [job])).get("succeeded") == 1

        await wait_until(finished_or_started_twice)

    effects = [e for e in read_effects(procs.effects_path) if e.job_id == job]
    assert [e.kind for e in effects] == ["start", "done"], effects
    assert effects[0].pid == effects[1].pid
    assert effects[1].at - effects[0].at >= 3 * STALE_AFTER
    row = (await job_rows(db, [job]))[job]
    assert (row["status"], row["attempts"], row["last_error"]) == ("succeeded", 1, None)
    assert (a.returncode, b.returncode) == (None, None)


# -- 2. pg_terminate_backend on the listener --------------------------------------


def in_process_settings(**changes: float | int) -> Settings:
    """Settings for an in-process service: nothing but notifications (and the
    RESYNC after a reconnect) wakes the workers within a test's time."""
    queue = QueueSettings(workers=3, batch_size=10, stale_after=60.0, heartbeat_interval=1.0,
                          backoff_base=0.2, drain_interval=60.0, shutdown_grace=1.0,
                          listener_ping_interval=1.0, listener_ping_timeout=1.0,
                          reconnect_min=0.05, reconnect_max=0.5)
    return Settings(queue=queue).with_queue(**changes) if changes else Settings(queue=queue)


async def enqueue_batch(queue: Queue, prefix: str, count: int) -> list[int]:
    jobs = [NewJob(JobType.INDEX, "acme", f"{prefix}-{n}", {}) for n in range(count)]
    return [int(i) for i in await queue.enqueue_many(jobs)]


async def test_listener_killed_by_the_server_reconnects_and_loses_no_job(
        db: Database, tmp_path: Path) -> None:
    settings = in_process_settings()
    effects_path = tmp_path / "effects.tsv"
    service = QueueService(db, settings, make_handlers(effects_path), name="inproc")
    queue = Queue(db, settings.queue)
    all_ids: list[int] = []
    with trio.fail_after(45):
        async with running(service):
            listener = service.listener
            warm = await enqueue_batch(queue, "warm", 5)
            all_ids += warm
            with trio.fail_after(10):
                await wait_statuses(db, warm)

            for round_ in range(2):
                old_pid = listener.backend_pid
                reconnects = listener.reconnects
                assert old_pid is not None
                assert await db.fetchval("SELECT pg_terminate_backend($1)", old_pid) is True
                # Right after the kill, likely while the listener is down:
                # their notification is lost; the RESYNC must find them.
                during = await enqueue_batch(queue, f"during-{round_}", 10)
                all_ids += during

                async def reconnected(before: int = reconnects) -> bool:
                    return listener.reconnects > before and listener.connected

                with trio.fail_after(10):
                    await wait_until(reconnected)
                assert listener.backend_pid not in (None, old_pid)
                # Far below drain_interval (60 s): no waiting for the safety net.
                with trio.fail_after(10):
                    await wait_statuses(db, during)
                after = await enqueue_batch(queue, f"after-{round_}", 10)
                all_ids += after
                with trio.fail_after(5):
                    await wait_statuses(db, after)
            assert listener.reconnects == 2

    done = effects_of(read_effects(effects_path), "done")
    assert sorted(done) == sorted(all_ids)
    assert all(len(v) == 1 for v in done.values())
    assert await status_counts(db) == {"succeeded": len(all_ids)}


# -- 3. half-open listener connection ------------------------------------------


@asynccontextmanager
async def service_via(proxy: TcpProxy, database_url: str, db: Database, settings: Settings,
                      effects_path: Path) -> AsyncIterator[QueueService]:
    """An in-process service whose connections all go through ``proxy``,
    its workers idle after a warm-up batch. ``db`` (direct) is the test's."""
    async with trio.open_nursery() as nursery:
        await nursery.start(proxy.run)
        async with Database.open(proxy.url(database_url), max_size=10) as via_proxy:
            service = QueueService(via_proxy, settings, make_handlers(effects_path))
            async with running(service):
                warm = await enqueue_batch(Queue(db), "warm", 5)
                with trio.fail_after(30):
                    await wait_statuses(db, warm)
                    # All workers asleep: only a notification or RESYNC wakes
                    # them. And quiet: on a loaded machine, the start's
                    # RESYNC, the warm batch's notification or the first
                    # sweep could still be on its way, and woke workers for
                    # the jobs a test enqueued next (CI under load: they ran
                    # 1.9 s before the listener noticed its cut).
                    await quiet(service, settings.queue.workers)
                assert service.listener.connected
                yield service
        nursery.cancel_scope.cancel()


async def quiet(service: QueueService, workers: int, window: float = 0.5) -> None:
    """Until a whole ``window`` passed with every worker asleep, a sweep
    completed and none since, and nothing claimed."""
    def state() -> tuple[int, int, int]:
        return (service.pool.wakeups.idle, service.sweeper.sweeps,
                service.pool.stats.claimed)

    while True:
        before = state()
        await trio.sleep(window)
        if before == state() and before[0] == workers and before[1] >= 1:
            return


async def client_port(db: Database, backend_pid: int) -> int:
    port = await db.fetchval("SELECT client_port FROM pg_stat_activity WHERE pid = $1",
                             backend_pid)
    assert isinstance(port, int), f"no TCP client port for backend {backend_pid}"
    return port


async def test_half_open_listener_connection_is_noticed_by_ping(
        db: Database, database_url: str, tmp_path: Path) -> None:
    ping_interval, ping_timeout = 1.0, 1.0
    settings = in_process_settings(listener_ping_interval=ping_interval,
                                   listener_ping_timeout=ping_timeout)
    effects_path = tmp_path / "effects.tsv"
    proxy = TcpProxy.for_url(database_url)
    queue = Queue(db, settings.queue)
    with trio.fail_after(45):
        async with service_via(proxy, database_url, db, settings, effects_path) as service:
            listener = service.listener
            old_pid = listener.backend_pid
            assert old_pid is not None

            # Only the LISTEN connection goes silent; the workers' are fine.
            assert proxy.blackhole(upstream_port=await client_port(db, old_pid)) == 1
            cut_at = trio.current_time()
            during = await enqueue_batch(queue, "during", 10)

            # The longest this event loop went without running the poll below:
            # a stall of the whole process (CPU starvation, a GC pass) delays
            # the listener's timers just as much, and is no fault of the ping.
            last_poll, loop_lag = trio.current_time(), 0.0

            def noticed() -> bool:
                nonlocal last_poll, loop_lag
                now = trio.current_time()
                loop_lag = max(loop_lag, now - last_poll - 0.01)
                last_poll = now
                return not listener.connected

            with trio.fail_after(ping_interval + ping_timeout + 10):
                await wait_until(noticed, interval=0.01)
            noticed_after = trio.current_time() - cut_at
            noticed_wall = time.time()
            # The documented bound, plus what the loop itself lost, plus 0.5 s.
            # Tighter than a fixed 1.5 s on an idle box (a ping bounded only by
            # the connection's command timeout, 2 x ping_timeout, fails it),
            # and it does not depend on one.
            bound = ping_interval + ping_timeout + 0.5 + loop_lag
            assert noticed_after <= bound, (noticed_after, loop_lag, listener.reconnects)

            with trio.fail_after(10):
                await wait_until(lambda: listener.connected)
            assert listener.reconnects == 1, (listener.reconnects, noticed_after)
            assert listener.backend_pid not in (None, old_pid)
            # The old connection was never closed: its server process still
            # exists, so the listener noticed it by the ping alone.
            alive = await db.fetchval(
                "SELECT count(*) FROM pg_stat_activity WHERE pid = $1", old_pid)
            assert alive == 1

            # Far below drain_interval (60 s): woken by the RESYNC.
            with trio.fail_after(10):
                await wait_statuses(db, during)
            after = await enqueue_batch(queue, "after", 10)
            with trio.fail_after(5):
                await wait_statuses(db, after)

    done = effects_of(read_effects(effects_path), "done")
    assert len(done) == 25 and all(len(v) == 1 for v in done.values())
    # Their notification went into the black hole: they ran only once the
    # listener had noticed and resynced.
    assert min(done[i][0].at for i in during) >= noticed_wall - 0.25


async def test_half_open_worker_connections_are_noticed_within_the_command_timeout(
        db: Database, database_url: str, tmp_path: Path) -> None:
    """Each worker task claims on a connection of its own. When those go
    silent, a woken worker's claim must give up after NEXARCH_COMMAND_TIMEOUT
    (not a hard-coded minute), reconnect and run the jobs."""
    command_timeout = 2.0
    settings = replace(in_process_settings(), command_timeout=command_timeout)
    effects_path = tmp_path / "effects.tsv"
    proxy = TcpProxy.for_url(database_url)
    queue = Queue(db, settings.queue)
    with trio.fail_after(60):
        async with service_via(proxy, database_url, db, settings, effects_path) as service:
            workers = await db.fetch(
                "SELECT pid, client_port FROM pg_stat_activity WHERE datname = current_database()"
                " AND application_name LIKE 'nexarch-events/worker/%'")
            assert len(workers) == settings.queue.workers
            for row in workers:
                assert proxy.blackhole(upstream_port=row["client_port"]) == 1
            during = await enqueue_batch(queue, "during", 10)
            # The bound: one command timeout, then a reconnect (slack for a busy box).
            with trio.fail_after(command_timeout + 8):
                await wait_statuses(db, during)
            assert service.listener.reconnects == 0
            now = await db.fetch(
                "SELECT pid FROM pg_stat_activity WHERE datname = current_database()"
                " AND application_name LIKE 'nexarch-events/worker/%'")
            # New connections; the silent ones are still there on the server.
            assert {r["pid"] for r in now} - {r["pid"] for r in workers}


async def test_listener_survives_a_server_error_that_arrives_before_the_close(
        db: Database, database_url: str, tmp_path: Path) -> None:
    """The server terminates the LISTEN connection: its FATAL error arrives,
    the close does not (yet). Under load the two arrive in separate event-loop
    turns anyway (seen with a Postgres restart); the proxy makes the gap
    last. The listener must treat the connection as dead and reconnect."""
    ping_interval, ping_timeout = 1.0, 1.0
    settings = in_process_settings(listener_ping_interval=ping_interval,
                                   listener_ping_timeout=ping_timeout)
    effects_path = tmp_path / "effects.tsv"
    proxy = TcpProxy.for_url(database_url)
    proxy.swallow_server_close = True
    queue = Queue(db, settings.queue)
    with trio.fail_after(45):
        async with service_via(proxy, database_url, db, settings, effects_path) as service:
            listener = service.listener
            old_pid = listener.backend_pid
            assert await db.fetchval("SELECT pg_terminate_backend($1)", old_pid) is True
            during = await enqueue_batch(queue, "during", 10)
            with trio.fail_after(ping_interval + ping_timeout + 10):
                await wait_until(lambda: listener.reconnects == 1 and listener.connected)
            assert listener.backend_pid not in (None, old_pid)
            # Closes pass again (the service's shutdown waits for them).
            proxy.swallow_server_close = False
            with trio.fail_after(10):
                await wait_statuses(db, during)
            after = await enqueue_batch(queue, "after", 10)
            with trio.fail_after(5):
                await wait_statuses(db, after)

    done = effects_of(read_effects(effects_path), "done")
    assert len(done) == 25 and all(len(v) == 1 for v in done.values())


# -- 4. Postgres restart -----------------------------------------------------------


@pytest.fixture
def own_postgres() -> Iterator[EmbeddedPostgres]:
    """A server of this test's own, which it may restart (never the shared one).

    Not under pytest's tmp_path: as root the server runs as another user, who
    must traverse to its data folder, and every pytest session that starts
    meanwhile (any other test run on this machine) resets
    /tmp/pytest-of-root to mode 0700, which would fail the restart.
    """
    folder = Path(tempfile.mkdtemp(prefix="nexarch-crash-pg-"))
    server = EmbeddedPostgres(folder / "data", durable=False)
    try:
        server.start()
        yield server
    finally:
        server.stop("immediate")
        shutil.rmtree(folder, ignore_errors=True)


@pytest.mark.slow
async def test_postgres_restart_while_workers_run_loses_no_job(
        aio_loop: None, own_postgres: EmbeddedPostgres, tmp_path: Path) -> None:
    url = own_postgres.url()
    stale_after = 3.0
    async with Database.open(url, max_size=4) as db, \
            WorkerProcesses(url, tmp_path / "effects.tsv", tmp_path,
                            {**PROCESS_SETTINGS, "stale_after": stale_after,
                             "heartbeat_interval": 0.5}) as processes:
        await migrate(db)
        queue = Queue(db)
        enqueued: dict[int, tuple[str, float]] = {}  # id -> (phase, time.time())
        phase = "before"
        stop = trio.Event()

        async def produce(task_status: trio.TaskStatus[None] = trio.TASK_STATUS_IGNORED) -> None:
            n = 0
            task_status.started()
            while not stop.is_set():
                n += 1
                while True:
                    try:
                        job_id = await queue.enqueue_index("acme", f"restart-{n}", {})
                        break
                    except DatabaseUnavailable:
                        await trio.sleep(0.05)
                enqueued[int(job_id)] = (phase, time.time())
                await trio.sleep(0.02)

        with trio.fail_after(90):
            worker = await processes.start("w", workers=3, batch_size=10)
            await wait_listening(db, worker)
            async with trio.open_nursery() as nursery:
                await nursery.start(produce)
                with trio.fail_after(10):
                    await wait_until(lambda: len(enqueued) >= 30)
                phase = "during"
                await trio.to_thread.run_sync(own_postgres.restart)
                phase = "after"
                # Keep producing until at least 50 jobs went in after the restart.
                await wait_until(lambda: (
                    sum(1 for p, _ in enqueued.values() if p == "after") >= 50))
                stop.set()

            ids = sorted(enqueued)
            with trio.fail_after(stale_after + 30):
                await retrying(db, lambda d: wait_statuses(d, ids, alive=[worker]))
            # No row beyond those we know of is left unfinished either (an
            # enqueue whose reply the restart swallowed).
            assert set(await retrying(db, status_counts)) == {"succeeded"}

            # Still woken after the restart (see also the latencies below).
            last = int(await queue.enqueue_index("acme", "restart-last", {}))
            with trio.fail_after(5):
                await wait_statuses(db, [last], alive=[worker])

            assert worker.returncode is None, "the worker process did not survive the restart"
            worker.terminate()
            assert await worker.wait() == 0

    effects = read_effects(tmp_path / "effects.tsv")
    done = effects_of(effects, "done")
    assert set(done) >= {*ids, last}
    assert {e.pid for e in effects} == {worker.pid}, "one process, never restarted"
    assert {p for p, _ in enqueued.values()} >= {"before", "after"}
    # Jobs enqueued after the restart were woken by notification (or the
    # RESYNC after the listener's reconnect), not found by a periodic sweep.
    latencies = [done[i][0].at - t for i, (p, t) in enqueued.items() if p == "after"]
    assert statistics.median(latencies) < 0.5, sorted(latencies)


# -- 5. two processes x three workers ------------------------------------------


@pytest.mark.slow
async def test_two_processes_handle_2000_jobs_exactly_once(
        db: Database, procs: WorkerProcesses) -> None:
    queue = Queue(db)
    with trio.fail_after(60):
        a = await procs.start("a", workers=3, batch_size=20)
        b = await procs.start("b", workers=3, batch_size=20)
        await wait_listening(db, a, b)
        ids: list[int] = []
        for chunk in range(10):
            ids += await enqueue_batch(queue, f"many-{chunk}", 200)
        assert len(set(ids)) == 2000
        await wait_statuses(db, ids, alive=[a, b], interval=0.2)

    effects = read_effects(procs.effects_path)
    done = Counter(e.job_id for e in effects if e.kind == "done")
    started = Counter(e.job_id for e in effects if e.kind == "start")
    assert sorted(done) == sorted(ids)
    assert [i for i, n in done.items() if n > 1] == [], "jobs completed twice"
    assert [i for i, n in started.items() if n > 1] == [], "jobs handled twice"
    assert {e.pid for e in effects} == {a.pid, b.pid}, "both processes took part"
    attempts = await db.fetch("SELECT DISTINCT attempts FROM mail_index_jobs")
    assert [r["attempts"] for r in attempts] == [1]
    assert await status_counts(db) == {"succeeded": 2000}


# -- 6. graceful shutdown with jobs in flight ---------------------------------------


@pytest.mark.slow
async def test_sigterm_releases_unfinished_jobs_after_the_grace(
        db: Database, procs: WorkerProcesses) -> None:
    grace = 2.0
    queue = Queue(db)
    path = procs.effects_path
    with trio.fail_after(60):
        w = await procs.start("w", workers=4, batch_size=1, shutdown_grace=grace)
        await wait_listening(db, w)
        slow = [int(await queue.enqueue_index("acme", f"slow-{n}", {"sleep": 60}))
                for n in range(2)]
        for job in slow:
            await wait_effect(path, "start", job, w)
        # A free worker still runs a fast job while the slow ones hang.
        fast = int(await queue.enqueue_index("acme", "fast", {}))
        await wait_effect(path, "done", fast, w)
        medium = int(await queue.enqueue_index("acme", "medium", {"sleep": 0.8}))
        await wait_effect(path, "start", medium, w)
        # Enqueued just before the signal: whether it is claimed or not, it
        # must end succeeded or pending, never stuck or lost.
        last = int(await queue.enqueue_index("acme", "last", {}))

        sigterm_at = time.time()
        w.terminate()
        assert await w.wait() == 0
        exited_after = time.time() - sigterm_at

    assert exited_after < grace + 10, "slow jobs were not cut off after the grace"
    rows = await job_rows(db)
    assert [i for i, r in rows.items() if r["status"] == "processing"] == []
    for job in slow:
        row = rows[job]
        assert (row["status"], row["attempts"], row["lease"], row["locked_by"]) == \
            ("pending", 0, None, None), dict(row)
        released_at = await epoch(db, "updated_at", job)
        assert released_at >= sigterm_at + grace - 0.05, "released before the grace was up"
    assert (rows[medium]["status"], rows[medium]["attempts"]) == ("succeeded", 1)
    assert (rows[fast]["status"], rows[fast]["attempts"]) == ("succeeded", 1)
    assert (rows[last]["status"], rows[last]["attempts"]) in {("succeeded", 1), ("pending", 0)}

    done = effects_of(read_effects(path), "done")
    assert not any(job in done for job in slow)
    # The medium job was in flight at SIGTERM and finished within the grace.
    assert done[medium][0].at > sigterm_at


# -- 7. per-message order under retries, across processes -------------------------------


@pytest.mark.slow
async def test_per_message_order_holds_under_retries_across_processes(
        db: Database, procs: WorkerProcesses) -> None:
    queue = Queue(db)
    messages = [f"order-{n}" for n in range(8)]
    jobs: list[NewJob] = []
    for message in messages:
        # index (fails twice) -> delete -> index again (fails once). The first
        # attempt is slow, so that one process cannot take every message.
        jobs += [NewJob(JobType.INDEX, "acme", message,
                        {"fail_times": 2, "sleep": 0.5, "sleep_attempts": 1}),
                 NewJob(JobType.DELETE, "acme", message),
                 NewJob(JobType.INDEX, "acme", message, {"fail_times": 1})]
    with trio.fail_after(60):
        a = await procs.start("a", workers=3, batch_size=1)
        b = await procs.start("b", workers=3, batch_size=1)
        await wait_listening(db, a, b)
        ids = [int(i) for i in await queue.enqueue_many(jobs)]
        await wait_statuses(db, ids, alive=[a, b])

    rows = await job_rows(db, ids)
    effects = read_effects(procs.effects_path)
    for n, message in enumerate(messages):
        chain = ids[3 * n:3 * n + 3]
        assert [rows[i]["attempts"] for i in chain] == [3, 1, 2]
        # In write order, every line of a job comes after the previous job
        # of the same message was done: start, fails, done, next job's start...
        seen = [(e.job_id, e.kind) for e in effects if e.message_id == message]
        expected = [(chain[0], "start"), (chain[0], "fail"), (chain[0], "start"),
                    (chain[0], "fail"), (chain[0], "start"), (chain[0], "done"),
                    (chain[1], "start"), (chain[1], "done"),
                    (chain[2], "start"), (chain[2], "fail"), (chain[2], "start"),
                    (chain[2], "done")]
        assert seen == expected, message
        # The index succeeded (its row says so) before the delete started.
        index_finished = await epoch(db, "finished_at", chain[0])
        delete_started = next(e.at for e in effects if (e.job_id, e.kind) == (chain[1], "start"))
        assert index_finished <= delete_started
    assert {e.pid for e in effects} == {a.pid, b.pid}, "both processes took part"
