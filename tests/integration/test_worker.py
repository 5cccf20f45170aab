"""Workers, wake-ups and the sweeper, in one process against real Postgres.

drain_interval is long (60 s) in these tests: whatever finishes in a few
seconds was woken by a notification or by the sweeper's due-time timer, not
by the safety net.
"""

from __future__ import annotations

from collections.abc import AsyncIterator, Sequence

import pytest
import trio

from nexarch_events.aio import Database
from nexarch_events.errors import ConfigurationError, JobFailed
from nexarch_events.models import ClaimedJob, Failure, JobId, JobStatus, JobType, NewJob
from nexarch_events.queue.jobs import Queue
from nexarch_events.queue.worker import BatchHandler, WorkerPool, lease_watch_limit, per_job
from nexarch_events.service import QueueService
from nexarch_events.settings import QueueSettings, Settings


class Recorder:
    """A handler that records what it ran; behaviour per job from its payload."""

    def __init__(self) -> None:
        self.ran: list[int] = []
        self.started = trio.Event()
        self.release = trio.Event()

    async def handle(self, job: ClaimedJob) -> None:
        behaviour = job.payload.get("do")
        if behaviour == "block":
            self.started.set()
            await self.release.wait()
        elif behaviour == "fail-once" and job.attempts == 1:
            raise RuntimeError("transient outage")
        elif behaviour == "poison":
            raise JobFailed("cannot parse this message", permanent=True)
        self.ran.append(job.id)

    def handlers(self) -> dict[str, object]:
        batch = per_job(self.handle)
        return {"index": batch, "delete": batch}


@pytest.fixture
def settings(fast_settings: QueueSettings) -> Settings:
    return Settings(queue=fast_settings).with_queue(drain_interval=60.0)


@pytest.fixture
async def running(db: Database, settings: Settings) -> AsyncIterator[tuple[QueueService, Recorder]]:
    recorder = Recorder()
    service = QueueService(db, settings, recorder.handlers())  # type: ignore[arg-type]
    async with trio.open_nursery() as nursery:
        await nursery.start(service.run)
        yield service, recorder
        nursery.cancel_scope.cancel()


async def wait_status(queue: Queue, job_id: int, status: JobStatus, within: float = 10) -> None:
    with trio.fail_after(within):
        while (await queue.status(job_id)).status != status:
            await trio.sleep(0.02)


async def test_enqueue_wakes_a_worker(running: tuple[QueueService, Recorder],
                                      queue: Queue) -> None:
    _, recorder = running
    job_id = await queue.enqueue_index("acme", "m1", {})
    await wait_status(queue, job_id, JobStatus.SUCCEEDED, within=5)
    assert recorder.ran == [job_id]


async def test_one_job_at_a_time_costs_one_claim_statement_per_job(
        running: tuple[QueueService, Recorder], queue: Queue,
        monkeypatch: pytest.MonkeyPatch) -> None:
    """The trickle regime: the ack of a job claims the next one in the same
    round trip; when that claim finds nothing the worker waits instead of
    claiming again (a job committed meanwhile wakes it or leaves a credit).
    Before: two claim statements per job, one of them always empty."""
    service, recorder = running
    with trio.fail_after(5):
        while service.pool.wakeups.idle < service.settings.queue.workers:
            await trio.sleep(0.01)
    claims = 0
    real_claim = Queue.claim

    async def counting_claim(self: Queue, limit: int, worker_id: str) -> list[ClaimedJob]:
        nonlocal claims
        claims += 1
        return await real_claim(self, limit, worker_id)

    monkeypatch.setattr(Queue, "claim", counting_claim)
    ids = []
    for n in range(20):
        job_id = await queue.enqueue_index("acme", f"trickle-{n}", {})
        await wait_status(queue, job_id, JobStatus.SUCCEEDED)
        ids.append(job_id)
    assert recorder.ran == ids
    # One claim per job; a little slack for a wake-up credit racing an ack.
    assert claims <= 20 + service.settings.queue.workers, claims


async def test_jobs_waiting_before_start_are_drained(db: Database, settings: Settings) -> None:
    queue = Queue(db, settings.queue)
    ids = await queue.enqueue_many([NewJob(JobType.INDEX, "acme", f"m{n}", {}) for n in range(30)])
    recorder = Recorder()
    service = QueueService(db, settings, recorder.handlers())  # type: ignore[arg-type]
    async with trio.open_nursery() as nursery:
        await nursery.start(service.run)
        await wait_status(queue, ids[-1], JobStatus.SUCCEEDED)
        with trio.fail_after(5):
            while len(recorder.ran) < 30:
                await trio.sleep(0.02)
        nursery.cancel_scope.cancel()
    assert sorted(recorder.ran) == ids


async def test_a_notification_wakes_only_as_many_workers_as_jobs(
        running: tuple[QueueService, Recorder], queue: Queue) -> None:
    service, _ = running
    wakeups = service.pool.wakeups
    with trio.fail_after(5):
        while wakeups.idle < service.settings.queue.workers:
            await trio.sleep(0.01)
    woken_before = service.pool.stats.claimed
    job_id = await queue.enqueue_index("acme", "m1", {})
    await wait_status(queue, job_id, JobStatus.SUCCEEDED)
    with trio.fail_after(5):
        while wakeups.idle < service.settings.queue.workers:
            await trio.sleep(0.01)
    assert service.pool.stats.claimed == woken_before + 1
    # The queue counts claims that found nothing: one job, one wake-up.
    # Three workers stayed asleep: nobody else claimed (checked via locked_by).
    rows = await queue.db.fetch("SELECT locked_by FROM mail_index_jobs")
    assert len(rows) == 1


async def test_retry_falls_due_without_polling(running: tuple[QueueService, Recorder],
                                               queue: Queue) -> None:
    service, recorder = running
    job_id = await queue.enqueue_index("acme", "m1", {"do": "fail-once"})
    await wait_status(queue, job_id, JobStatus.SUCCEEDED, within=10)
    job = await queue.status(job_id)
    assert job.attempts == 2 and job.last_error == "RuntimeError: transient outage"
    assert recorder.ran == [job_id]
    assert service.sweeper.due_wakeups >= 1


async def test_one_bad_job_fails_alone(running: tuple[QueueService, Recorder],
                                       queue: Queue) -> None:
    _, recorder = running
    ids = await queue.enqueue_many([
        NewJob(JobType.INDEX, "acme", "good-1", {}),
        NewJob(JobType.INDEX, "acme", "poison", {"do": "poison"}),
        NewJob(JobType.INDEX, "acme", "good-2", {}),
    ])
    await wait_status(queue, ids[1], JobStatus.FAILED)
    for job_id in (ids[0], ids[2]):
        await wait_status(queue, job_id, JobStatus.SUCCEEDED)
    failed = await queue.status(ids[1])
    assert failed.attempts == 1 and failed.last_error == "cannot parse this message"
    # The worker is still alive and working.
    later = await queue.enqueue_index("acme", "after", {})
    await wait_status(queue, later, JobStatus.SUCCEEDED)
    assert sorted(recorder.ran) == [ids[0], ids[2], later]


async def test_a_handler_crash_fails_its_batch_and_the_worker_goes_on(
        db: Database, settings: Settings) -> None:
    calls = 0

    async def explode(jobs: Sequence[ClaimedJob]) -> dict[JobId, Failure]:
        nonlocal calls
        calls += 1
        if calls == 1:
            raise ValueError("index backend exploded")
        return {}

    service = QueueService(db, settings, {"index": explode, "delete": explode})
    queue = service.queue
    async with trio.open_nursery() as nursery:
        await nursery.start(service.run)
        job_id = await queue.enqueue_index("acme", "m1", {})
        await wait_status(queue, job_id, JobStatus.SUCCEEDED, within=10)
        nursery.cancel_scope.cancel()
    job = await queue.status(job_id)
    assert job.attempts == 2 and job.last_error == "ValueError: index backend exploded"


async def test_graceful_shutdown_releases_unfinished_jobs(db: Database, settings: Settings) -> None:
    recorder = Recorder()
    service = QueueService(db, settings, recorder.handlers())  # type: ignore[arg-type]
    queue = service.queue
    async with trio.open_nursery() as nursery:
        await nursery.start(service.run)
        slow = await queue.enqueue_index("acme", "slow", {"do": "block"})
        with trio.fail_after(5):
            await recorder.started.wait()
        with trio.fail_after(10):
            await service.shutdown(grace=0.3)
            # run() returns by itself once the workers are done.
    job = await queue.status(slow)
    assert job.status is JobStatus.PENDING and job.attempts == 0
    assert service.pool.stats.released == 1
    assert await db.fetchval("SELECT count(*) FROM mail_index_jobs "
                             "WHERE status = 'processing'") == 0


async def test_cancellation_releases_in_flight_jobs(db: Database, settings: Settings) -> None:
    recorder = Recorder()
    service = QueueService(db, settings, recorder.handlers())  # type: ignore[arg-type]
    queue = service.queue
    async with trio.open_nursery() as nursery:
        await nursery.start(service.run)
        slow = await queue.enqueue_index("acme", "slow", {"do": "block"})
        with trio.fail_after(5):
            await recorder.started.wait()
        nursery.cancel_scope.cancel()
    job = await queue.status(slow)
    assert job.status is JobStatus.PENDING and job.attempts == 0


async def test_shutdown_lets_a_job_finish_within_the_grace(db: Database,
                                                           settings: Settings) -> None:
    recorder = Recorder()
    service = QueueService(db, settings, recorder.handlers())  # type: ignore[arg-type]
    queue = service.queue
    async with trio.open_nursery() as nursery:
        await nursery.start(service.run)
        job_id = await queue.enqueue_index("acme", "m", {"do": "block"})
        with trio.fail_after(5):
            await recorder.started.wait()
        await service.shutdown(grace=5)
        recorder.release.set()
    assert (await queue.status(job_id)).status is JobStatus.SUCCEEDED
    assert recorder.ran == [job_id]


async def test_a_job_claimed_as_the_shutdown_begins_is_handed_back_not_run(
        db: Database, settings: Settings) -> None:
    """A claim in flight when shutdown() was called took a job enqueued
    after it, and the worker ran it (CI: the API's queue view found the job
    failed, not pending). What such a claim took is now handed back with
    the attempt refunded, and never started."""
    from tests.support.tcp_proxy import TcpProxy

    recorder = Recorder()
    proxy = TcpProxy.for_url(db.dsn)
    settings = settings.with_queue(workers=1)
    async with trio.open_nursery() as outer:
        await outer.start(proxy.run)
        async with Database.open(proxy.url(db.dsn), max_size=4) as proxied:
            service = QueueService(proxied, settings, recorder.handlers())  # type: ignore[arg-type]
            async with trio.open_nursery() as nursery:
                await nursery.start(service.run)
                # The claim's answer (its row names the message) is held
                # after the server committed it.
                held = proxy.gate(b"claimed-at-shutdown", from_server=True)
                job_id = await Queue(db).enqueue_index("acme", "claimed-at-shutdown", {})
                with trio.fail_after(10):
                    await held.reached.wait()
                await service.shutdown(grace=0)
                held.open()
                with trio.fail_after(10):
                    await service.pool.finished.wait()
                nursery.cancel_scope.cancel()
        outer.cancel_scope.cancel()
    job = await Queue(db).status(job_id)
    assert (job.status, job.attempts) == (JobStatus.PENDING, 0)
    assert recorder.ran == []
    assert service.pool.stats.released == 1


@pytest.mark.parametrize(("stale_after", "interval"),
                         [(30.0, 7.5), (4.0, 2.0), (2.0, 1.0), (1.0, 0.4), (10.0, 0.1)])
def test_the_lease_watch_limit_lies_between_a_heartbeat_and_stale_after(
        stale_after: float, interval: float) -> None:
    limit = lease_watch_limit(stale_after, interval)
    assert interval < limit < stale_after


async def test_a_heartbeat_of_half_stale_after_does_not_stop_healthy_jobs(
        db: Database, settings: Settings) -> None:
    """With heartbeat_interval = stale_after / 2 (the most the settings
    accept), the lease watch's limit was the interval itself: a lease
    looked lost just before each heartbeat confirmed it, so a healthy job
    longer than an interval was stopped, handed back and claimed again for
    ever (a review: 12 starts, never finished)."""
    settings = settings.with_queue(workers=1, stale_after=4.0, heartbeat_interval=2.0)
    starts: list[int] = []

    async def slow(job: ClaimedJob) -> None:
        starts.append(job.attempts)
        await trio.sleep(6.0)

    handler = per_job(slow)
    service = QueueService(db, settings, {"index": handler, "delete": handler})
    async with trio.open_nursery() as nursery:
        await nursery.start(service.run)
        job_id = await service.queue.enqueue_index("acme", "slow", {})
        with trio.fail_after(30):
            while (await service.queue.status(job_id)).status is not JobStatus.SUCCEEDED:
                await trio.sleep(0.1)
        nursery.cancel_scope.cancel()
    assert starts == [1]
    assert service.pool.stats.lost_leases == 0


async def test_every_job_type_needs_a_handler(queue: Queue) -> None:
    async def noop(jobs: Sequence[ClaimedJob]) -> dict[JobId, Failure]:
        return {}

    with pytest.raises(ConfigurationError, match="delete"):
        WorkerPool(queue, {"index": noop})


async def test_final_failures_are_logged_at_warning_and_retries_at_info(
        running: tuple[QueueService, Recorder], queue: Queue,
        caplog: pytest.LogCaptureFixture) -> None:
    caplog.set_level("INFO", logger="nexarch_events.queue.worker")
    poison = await queue.enqueue_index("acme", "bad", {"do": "poison"})
    retried = await queue.enqueue_index("acme", "flaky", {"do": "fail-once"})
    await wait_status(queue, poison, JobStatus.FAILED)
    await wait_status(queue, retried, JobStatus.SUCCEEDED)
    by_job = {(r.job_id, r.levelname, r.job_status, r.attempts, r.tenant)  # type: ignore[attr-defined]
              for r in caplog.records if hasattr(r, "job_id")}
    assert by_job == {(poison, "WARNING", "failed", 1, "acme"),
                      (retried, "INFO", "pending", 1, "acme")}


async def test_a_worker_paused_by_an_outage_stops_at_once(db: Database,
                                                          settings: Settings) -> None:
    """A worker all of whose batch met an outage pauses, doubling up to
    reconnect_max; a shutdown during the pause waited it out (with
    NEXARCH_QUEUE_RECONNECT_MAX at 60 s, a minute for a restart)."""
    settings = settings.with_queue(workers=1, batch_size=1, reconnect_max=30.0,
                                   backoff_base=0.05)
    calls = 0
    fifth = trio.Event()

    async def out_of_reach(jobs: Sequence[ClaimedJob]) -> dict[JobId, Failure]:
        nonlocal calls
        calls += 1
        if calls == 5:
            fifth.set()
        return {job.id: Failure("the index is out of reach", outage=True) for job in jobs}

    service = QueueService(db, settings, {"index": out_of_reach, "delete": out_of_reach})
    async with trio.open_nursery() as nursery:
        await nursery.start(service.run)
        await service.queue.enqueue_many(
            [NewJob(JobType.INDEX, "acme", f"m{n}", {}) for n in range(10)])
        with trio.fail_after(30):
            await fifth.wait()
        await trio.sleep(0.3)  # in the pause after the 5th batch (8 s)
        started = trio.current_time()
        await service.shutdown(grace=0.3)
    assert trio.current_time() - started < 4.0
    assert calls == 5
    assert await db.fetchval("SELECT count(*) FROM mail_index_jobs "
                             "WHERE status = 'processing'") == 0


async def test_a_second_signal_does_not_wait_for_an_ack_the_database_does_not_answer(
        db: Database, settings: Settings) -> None:
    """Stop now (the second SIGTERM) while a batch's outcome waits for a
    database that does not answer: the shielded wait to record it ran out
    its bound, max(stale_after, 5) s, first (a shutdown audit: 28 s, 58 s
    with stale_after 60). Its lease expires and the sweeper re-queues it."""
    from tests.support.tcp_proxy import TcpProxy

    settings = settings.with_queue(workers=1, stale_after=20.0)
    started, release = trio.Event(), trio.Event()

    async def slow(jobs: Sequence[ClaimedJob]) -> dict[JobId, Failure]:
        started.set()
        await release.wait()
        return {}

    proxy = TcpProxy.for_url(db.dsn)
    async with trio.open_nursery() as outer:
        await outer.start(proxy.run)
        async with Database.open(proxy.url(db.dsn), max_size=4) as proxied:
            service = QueueService(proxied, settings, {"index": slow, "delete": slow})
            held = proxy.gate(b"mail_index_jobs_ack_and_claim")
            async with trio.open_nursery() as nursery:
                await nursery.start(service.run)
                job_id = await service.queue.enqueue_index("acme", "m", {})
                with trio.fail_after(10):
                    await started.wait()
                release.set()
                with trio.fail_after(10):
                    await held.reached.wait()  # the ack is on its way, unanswered
                await service.shutdown(grace=0.1)
                service.cancel()
                stopping = trio.current_time()
            stopped = trio.current_time() - stopping
            held.open()
        outer.cancel_scope.cancel()
    assert stopped < 8.0, stopped  # 22 s before
    assert (await Queue(db).status(job_id)).status is JobStatus.PROCESSING  # its lease runs


async def test_a_worker_cut_off_from_postgres_stops_its_handler_before_another_runs_it(
        db: Database, settings: Settings) -> None:
    """Cut off from Postgres (not dead), a worker's lease expires and another
    process's sweeper hands its job to a worker of its own; the cut-off
    handler ran on beside the new owner (a queue audit: 4 s of both). It is
    stopped once its lease has gone unconfirmed for nearly stale_after."""
    from tests.support.tcp_proxy import TcpProxy

    settings = settings.with_queue(workers=1, stale_after=4.0, heartbeat_interval=0.5)
    events: list[str] = []
    first_started, second_started = trio.Event(), trio.Event()

    async def cut_off(jobs: Sequence[ClaimedJob]) -> dict[JobId, Failure]:
        events.append("cut-off started")
        first_started.set()
        try:
            await trio.sleep(60)
        except trio.Cancelled:
            events.append("cut-off stopped")
            raise
        events.append("cut-off finished")
        return {}

    async def healthy(jobs: Sequence[ClaimedJob]) -> dict[JobId, Failure]:
        events.append("healthy started")
        second_started.set()
        return {}

    proxy = TcpProxy.for_url(db.dsn)
    async with trio.open_nursery() as outer:
        await outer.start(proxy.run)
        async with Database.open(proxy.url(db.dsn), max_size=4) as proxied:
            cut = QueueService(proxied, settings, {"index": cut_off, "delete": cut_off},
                               name="cut")
            async with trio.open_nursery() as nursery:
                await nursery.start(cut.run)
                job_id = await Queue(db).enqueue_index("acme", "m", {})
                with trio.fail_after(10):
                    await first_started.wait()
                # Reconnects too go nowhere: a new pool connection that got
                # through let a heartbeat renew the lease (CI under stress).
                proxy.cut_off()
                other = QueueService(db, settings, {"index": healthy, "delete": healthy},
                                     name="healthy")
                await nursery.start(other.run)
                with trio.fail_after(30):
                    await second_started.wait()
                cut.cancel()
                other.cancel()
        outer.cancel_scope.cancel()
    assert events[:3] == ["cut-off started", "cut-off stopped", "healthy started"], events
    status = await Queue(db).status(job_id)
    assert status.attempts == 2


def attempts_recorded() -> tuple[list[int], trio.Event, BatchHandler]:
    """A handler recording each job's attempt, and an event set once it ran."""
    runs: list[int] = []
    ran = trio.Event()

    async def handler(jobs: Sequence[ClaimedJob]) -> dict[JobId, Failure]:
        runs.extend(job.attempts for job in jobs)
        ran.set()
        return {}
    return runs, ran, handler


async def test_jobs_taken_by_a_claim_whose_answer_was_lost_are_handed_back_at_once(
        db: Database, settings: Settings) -> None:
    """A claim committed, but its answer came after the command timeout: the
    job was held by nobody until stale_after, then charged as a suspect
    (its process held nothing else: "alone"). The worker now hands back
    what such a claim took, through the pool (a review)."""
    from dataclasses import replace

    from tests.support.tcp_proxy import TcpProxy

    settings = replace(settings.with_queue(workers=1, stale_after=30.0), command_timeout=1.0)
    runs, ran, handler = attempts_recorded()

    proxy = TcpProxy.for_url(db.dsn)
    async with trio.open_nursery() as outer:
        await outer.start(proxy.run)
        async with Database.open(proxy.url(db.dsn), max_size=4) as proxied:
            service = QueueService(proxied, settings, {"index": handler, "delete": handler})
            async with trio.open_nursery() as nursery:
                await nursery.start(service.run)
                held = proxy.gate(b"answer-lost", from_server=True)
                job_id = await Queue(db).enqueue_index("acme", "answer-lost", {})
                with trio.fail_after(10):
                    await held.reached.wait()
                await trio.sleep(2.0)  # past the command timeout
                held.open()
                with trio.fail_after(10):  # not stale_after (30 s)
                    await ran.wait()
                service.cancel()
        outer.cancel_scope.cancel()
    assert runs == [1]  # its first counted attempt
    status = await Queue(db).status(job_id)
    assert status.last_error is None or "suspected" not in status.last_error


async def test_a_hand_back_waits_for_a_claim_still_running_on_the_server(
        db: Database, settings: Settings) -> None:
    """The claim's answer was lost because the claim itself was still running
    on the server (here: waiting for its process's lock) when the command
    timeout struck. The hand-back ran at once, found nothing of the worker's,
    and the claim committed after it: the job stayed 'processing', held by
    nobody, until stale_after (a review). The hand-back now waits for the
    worker's claim in flight (migration 0049), then hands back what it took.
    The command timeout (3 s) is above the 2 s the test needs to see the
    hand-back waiting; stale_after (30 s) is above the test's wait, so only the
    hand-back can make the job run."""
    from dataclasses import replace

    from nexarch_events.aio import Connection

    settings = replace(settings.with_queue(workers=1, stale_after=30.0), command_timeout=3.0)
    runs, ran, handler = attempts_recorded()

    service = QueueService(db, settings, {"index": handler, "delete": handler})
    async with trio.open_nursery() as nursery:
        await nursery.start(service.run)
        blocker = await Connection.open(db.dsn)
        try:
            # The claim picks its rows, then waits for its process's lock
            # (migration 0046) beyond the command timeout.
            await blocker.execute("SELECT pg_advisory_lock(1312902725, hashtext($1))",
                                  service.pool.instance)
            job_id = await Queue(db).enqueue_index("acme", "claim-in-flight", {})
            waiting_hand_back = False
            with trio.move_on_after(15):
                while not waiting_hand_back:
                    await trio.sleep(0.05)
                    waiting_hand_back = bool(await db.fetchval(
                        "SELECT count(*) FROM pg_stat_activity WHERE wait_event_type = 'Lock'"
                        " AND query LIKE '%mail_index_jobs_release_unknown%'"))
            await blocker.execute("SELECT pg_advisory_unlock(1312902725, hashtext($1))",
                                  service.pool.instance)
        finally:
            await blocker.aclose()
        with trio.move_on_after(10):  # not stale_after (30 s)
            await ran.wait()
        status = await Queue(db).status(job_id)
        service.cancel()
    assert runs == [1], f"the job ran {runs} times; it is {status.status} ({status.last_error})"
    assert waiting_hand_back, "the hand-back did not wait for the claim in flight"
    assert status.last_error is None or "suspected" not in status.last_error


async def test_a_deeply_nested_foreign_notification_is_ignored(
        db: Database, settings: Settings) -> None:
    """Anyone who may NOTIFY can send 8,000 bytes of "[" on our channels
    (docs/events.md invites producers to notify the jobs channel): parsing it
    raised RecursionError, which is no database error, and ended the service
    (a review). It is a foreign payload like any other now."""
    ran = trio.Event()

    async def handler(jobs: Sequence[ClaimedJob]) -> dict[JobId, Failure]:
        ran.set()
        return {}

    service = QueueService(db, settings.with_queue(workers=1),
                           {"index": handler, "delete": handler})
    async with trio.open_nursery() as nursery:
        await nursery.start(service.run)
        for channel in ("nexarch_index_jobs", "nexarch_job_events"):
            await db.execute("SELECT pg_notify($1, repeat('[', 7990))", channel)
        await trio.sleep(0.5)  # the listener has them before the job's
        await Queue(db).enqueue_index("acme", "after-the-nested", {})
        with trio.move_on_after(10):
            await ran.wait()
        service.cancel()
    assert ran.is_set()


async def test_jobs_claimed_by_an_ack_whose_answer_was_lost_are_handed_back_at_once(
        db: Database, settings: Settings) -> None:
    """The ack of a batch committed, with the next batch claimed in the same
    statement, but its answer came after the command timeout: the claimed
    job was held by nobody until stale_after, then charged as a suspect (a
    queue audit). The worker now hands back what it holds unknowingly."""
    from dataclasses import replace

    from tests.support.tcp_proxy import TcpProxy

    settings = replace(settings.with_queue(workers=1, stale_after=30.0), command_timeout=1.0)
    first_started, release_first = trio.Event(), trio.Event()
    runs: list[tuple[str, int]] = []
    second_started = trio.Event()

    async def handler(jobs: Sequence[ClaimedJob]) -> dict[JobId, Failure]:
        for job in jobs:
            runs.append((job.message_id, job.attempts))
            if job.message_id == "first":
                first_started.set()
                await release_first.wait()
            else:
                second_started.set()
        return {}

    proxy = TcpProxy.for_url(db.dsn)
    async with trio.open_nursery() as outer:
        await outer.start(proxy.run)
        async with Database.open(proxy.url(db.dsn), max_size=4) as proxied:
            service = QueueService(proxied, settings, {"index": handler, "delete": handler})
            async with trio.open_nursery() as nursery:
                await nursery.start(service.run)
                await Queue(db).enqueue_index("acme", "first", {})
                with trio.fail_after(10):
                    await first_started.wait()
                second = await Queue(db).enqueue_index("acme", "second", {})
                # The ack's answer (its row says "succeeded") is held past
                # the command timeout, after the server committed it.
                held = proxy.gate(b"succeeded", from_server=True)
                release_first.set()
                with trio.fail_after(10):
                    await held.reached.wait()
                await trio.sleep(2.0)
                held.open()
                with trio.fail_after(10):  # not stale_after (30 s)
                    await second_started.wait()
                service.cancel()
        outer.cancel_scope.cancel()
    assert runs[-1] == ("second", 1), runs  # its first counted attempt
    status = await Queue(db).status(second)
    assert status.last_error is None or "suspected" not in status.last_error
