"""Workers: N trio tasks that claim batches, run the handler of each job
type, and acknowledge each batch with one statement.

A worker only sleeps after a claim came back empty, and then until it is
woken: by a notification (through ``WakeUps``, targeted: one job wakes one
idle worker), by the sweeper when a retry falls due, or at shutdown.
"""

from __future__ import annotations

import logging
import math
import os
import secrets
import socket
from collections import deque
from collections.abc import Awaitable, Callable, Iterator, Mapping, Sequence
from contextlib import contextmanager
from dataclasses import dataclass

import trio

from ..aio import Connection, Database
from ..errors import (
    ConfigurationError,
    DatabaseTransient,
    DatabaseUnavailable,
    JobFailed,
    is_outage,
)
from ..metrics import Metrics
from ..models import AckResult, ClaimedJob, Failure, JobId, JobType
from ..settings import QueueSettings
from .jobs import Queue
from .outage import Outage, RateLimited

log = logging.getLogger(__name__)

#: Handles a batch of jobs of one type; returns the failures by job id.
#: Jobs absent from the result succeeded. An exception fails the whole batch
#: (retryable), so a handler that can tell jobs apart should catch per job.
BatchHandler = Callable[[Sequence[ClaimedJob]], Awaitable[Mapping[JobId, Failure]]]
JobHandler = Callable[[ClaimedJob], Awaitable[None]]


def per_job(handle: JobHandler) -> BatchHandler:
    """A BatchHandler that runs ``handle`` for each job in turn. ``JobFailed``
    fails that job with its message (permanently if it says so); any other
    exception fails that job with a retry. The rest of the batch goes on."""

    async def handle_batch(jobs: Sequence[ClaimedJob]) -> Mapping[JobId, Failure]:
        failures: dict[JobId, Failure] = {}
        for job in jobs:
            try:
                await handle(job)
            except JobFailed as exc:
                failures[job.id] = Failure(str(exc), exc.permanent)
            except Exception as exc:
                failures[job.id] = Failure(f"{type(exc).__name__}: {exc}")
        return failures

    return handle_batch


class WakeUps:
    """Targeted wake-ups for idle workers.

    ``wake(n)`` wakes at most n idle workers. Wake-ups nobody was idle to take
    become credits, so a worker whose claim raced with a new job's commit
    claims once more instead of sleeping through it.

    The worker that went idle last is woken first: when jobs trickle in one
    at a time, the same worker (and its connection's server process, warm
    in the CPU's caches) takes them, instead of each job waking the
    coldest one.
    """

    def __init__(self, workers: int) -> None:
        self._idle: deque[trio.Event] = deque()
        self._credits = 0
        self._limit = workers
        self._closed = False

    @property
    def idle(self) -> int:
        return len(self._idle)

    def wake(self, n: int) -> int:
        """Wake up to ``n`` workers; returns how many were idle and woken."""
        woken = 0
        while n > 0 and self._idle:
            self._idle.pop().set()
            n -= 1
            woken += 1
        self._credits = min(self._limit, self._credits + n)
        return woken

    def wake_all(self) -> None:
        self.wake(self._limit)

    def close(self) -> None:
        """Wake everyone now and never block again (shutdown)."""
        self._closed = True
        while self._idle:
            self._idle.popleft().set()

    async def wait(self) -> None:
        """Block until woken; returns at once if a credit is waiting."""
        if self._closed or self._credits:
            if not self._closed:
                self._credits -= 1
            await trio.lowlevel.checkpoint()
            return
        event = trio.Event()
        self._idle.append(event)
        try:
            await event.wait()
        finally:
            if not event.is_set():
                self._idle.remove(event)


@dataclass(slots=True)
class WorkerStats:
    claimed: int = 0
    succeeded: int = 0
    retried: int = 0
    failed: int = 0
    refused: int = 0
    released: int = 0
    lost_leases: int = 0
    #: outcomes that could not be recorded in time (the jobs run again)
    unrecorded: int = 0


def lease_watch_limit(stale_after: float, heartbeat_interval: float) -> float:
    """How long a job's lease may go unconfirmed before its handler is
    stopped: stale_after less a margin for the stop to take effect before
    the sweeper may hand the job on. The margin is one heartbeat interval
    (the default interval, stale_after / 4, gives 3/4 of stale_after), or
    half the gap between interval and stale_after if that is smaller, so
    the limit always lies between the two; with the interval at most half
    of stale_after (the settings see to it), the limit is at least 1.5
    intervals, room for a late heartbeat. It was ``max(stale_after -
    interval, interval)``: with an interval of half stale_after or more, a
    lease looked lost just before the heartbeat that confirmed it, and a
    healthy job longer than an interval was stopped and re-run for ever (a
    review)."""
    margin = min(heartbeat_interval, (stale_after - heartbeat_interval) / 2)
    return stale_after - margin


def default_worker_name() -> str:
    return f"{socket.gethostname()}:{os.getpid()}"


class WorkerPool:
    """N worker tasks and their heartbeat task, in one nursery (``run``).

    Each worker task claims and acknowledges on a connection of its own (no
    pool acquire/release on the hot path); ``queue`` (on the pool) is used for
    heartbeats, and for acks when a worker's connection broke.
    """

    def __init__(self, queue: Queue, handlers: Mapping[JobType | str, BatchHandler],
                 settings: QueueSettings | None = None, *, name: str | None = None,
                 command_timeout: float = 60.0, statement_cache_size: int = 100) -> None:
        if not isinstance(queue.db, Database):
            raise ConfigurationError("WorkerPool needs a Queue on a Database (a pool)")
        self.dsn = queue.db.dsn
        self.queue = queue
        self.settings = settings or queue.settings
        self.handlers: dict[JobType, BatchHandler] = {JobType(k): v for k, v in handlers.items()}
        missing = [t.value for t in JobType if t not in self.handlers]
        if missing:
            raise ConfigurationError(f"no handler registered for job type(s): {', '.join(missing)}")
        self.name = name or default_worker_name()
        #: Who holds a job, in ``locked_by``: the name and a token drawn at
        #: start, "<name>#<token>/<task>". The sweeper judges a dead process
        #: by its jobs, and a claim keeps isolated jobs alone per process;
        #: a restart under the same name (a container's "hostname:1", a
        #: fixed --name) is another process to both (a review: it shielded
        #: or was blocked by the dead one's jobs).
        self.instance = f"{self.name}#{secrets.token_hex(4)}"
        #: Bounds every statement on the workers' own connections, so a
        #: half-open one is noticed (and replaced) within this.
        self.command_timeout = command_timeout
        self.statement_cache_size = statement_cache_size
        self.wakeups = WakeUps(self.settings.workers)
        self.stats = WorkerStats()
        #: Set by the service to feed /metrics.
        self.metrics: Metrics | None = None
        self._in_flight: dict[JobId, ClaimedJob] = {}
        #: in flight, but being acknowledged: a heartbeat that misses them
        #: raced with their ack, their lease was not lost
        self._settling: set[JobId] = set()
        self._stopping = False
        #: when shutdown began: the handlers' deadline (now + its grace)
        self._grace_deadline = math.inf
        #: set by shutdown: ends a worker's pause for an outage
        self._stopped = trio.Event()
        #: set when every worker task has ended (their jobs recorded or
        #: handed back): after a shutdown, nothing of this pool is running
        self.finished = trio.Event()
        self._handler_scopes: set[trio.CancelScope] = set()
        #: per job in flight: its batch's handler scope, and when its lease
        #: was last known to hold (claimed, or a heartbeat sent then passed)
        self._scope_of: dict[JobId, trio.CancelScope] = {}
        self._confirmed: dict[JobId, float] = {}
        #: shielded waits to record outcomes: ``force`` cuts them short
        self._shielded_scopes: set[trio.CancelScope] = set()
        self._forced = False
        self._log_failed = RateLimited(log, logging.WARNING)
        self._log_retry = RateLimited(log, logging.INFO)

    @property
    def in_flight(self) -> int:
        return len(self._in_flight)

    async def run(self, *, task_status: trio.TaskStatus[None] = trio.TASK_STATUS_IGNORED) -> None:
        """Run the workers until ``shutdown`` has finished them, or until
        cancelled (then in-flight jobs are released, shielded and bounded)."""
        async with trio.open_nursery() as nursery:
            nursery.start_soon(self._heartbeats)
            nursery.start_soon(self._lease_watch)
            try:
                async with trio.open_nursery() as workers:
                    for index in range(self.settings.workers):
                        workers.start_soon(self._work, index)
                    task_status.started()
            finally:
                self.finished.set()
            # All workers are done (shutdown): stop heartbeating.
            nursery.cancel_scope.cancel()

    async def shutdown(self, grace: float | None = None) -> None:
        """Stop claiming; give in-flight handlers ``grace`` seconds (default
        settings.shutdown_grace), then cancel them. Their jobs are released
        with the attempt refunded. Returns at once; ``run`` returns when done."""
        if self._stopping:
            return
        self._stopping = True
        self._stopped.set()
        self.wakeups.close()
        grace = self.settings.shutdown_grace if grace is None else grace
        self._grace_deadline = deadline = trio.current_time() + grace
        for scope in self._handler_scopes:
            scope.deadline = min(scope.deadline, deadline)
        await trio.lowlevel.checkpoint()

    def force(self) -> None:
        """Stop now (a second signal): the shielded waits to record outcomes
        end at once instead of after up to ``max(stale_after, 5)`` s without
        the database. What they did not record, the sweeper re-queues when
        the leases expire."""
        self._forced = True
        for scope in self._shielded_scopes:
            scope.cancel()

    @contextmanager
    def _shielded(self, seconds: float) -> Iterator[trio.CancelScope]:
        """A shielded scope of at most ``seconds`` that ``force`` ends."""
        with trio.move_on_after(seconds, shield=True) as scope:
            if self._forced:
                scope.cancel()
            self._shielded_scopes.add(scope)
            try:
                yield scope
            finally:
                self._shielded_scopes.discard(scope)

    async def _work(self, index: int) -> None:
        worker_id = f"{self.instance}/{index}"
        outage = Outage(f"worker {worker_id}", log, max_delay=self.settings.reconnect_max)
        # Every job of a batch met an outage (the index or the database out
        # of reach): this task pauses before it claims again.
        handler_outage = Outage(f"jobs of worker {worker_id}", log, first_delay=0.5,
                                max_delay=self.settings.reconnect_max,
                                kind="the index or the database is out of reach")
        conn: Connection | None = None
        #: claimed and not yet started (the next batch, claimed with an ack)
        jobs: list[ClaimedJob] = []
        #: the last ack already tried to claim and found nothing: wait first
        #: (a job committed since then wakes us, or left a credit)
        looked = False
        try:
            while not self._stopping:
                claiming = False
                try:
                    if conn is None:
                        conn = await Connection.open(
                            self.dsn, command_timeout=self.command_timeout,
                            connect_timeout=min(10.0, self.command_timeout),
                            application_name=f"nexarch-events/worker/{self.name}/{index}",
                            statement_cache_size=self.statement_cache_size)
                        queue = Queue(conn, self.settings)
                    if not jobs and not looked and not self._stopping:
                        claiming = True
                        jobs = await queue.claim(self.settings.batch_size, worker_id)
                except (DatabaseTransient, trio.TooSlowError) as exc:
                    # A refused statement (a timeout, a lock, a deadlock) leaves
                    # the session usable; a lost, silent or read-only one is
                    # replaced.
                    usable = isinstance(exc, DatabaseTransient) \
                        and not isinstance(exc, DatabaseUnavailable)
                    if conn is not None and not usable:
                        conn.abort()
                        conn = None
                    if claiming and not usable:
                        # The claim may have committed with its answer lost.
                        await self._hand_back_unknown(worker_id, [], "a claim")
                    await self._pause(outage.failed(exc))
                    continue
                outage.ok()
                if self._stopping:
                    # A claim in flight when the shutdown began: what it
                    # took is handed back below, never started (CI: a job
                    # enqueued after shutdown() ran and failed).
                    break
                if not jobs:
                    looked = False
                    await self.wakeups.wait()
                    continue
                batch, jobs = jobs, []
                claimed = await self._process(batch, queue, worker_id, handler_outage)
                # None: the outcome went through another path and nothing was
                # claimed with it; claim as usual. In the trickle regime this
                # saves one empty claim per job (bench/queue_bench.py mixed).
                looked = claimed is not None
                jobs = claimed or []
        finally:
            if jobs:  # claimed but never started: hand them back
                with self._shielded(5):
                    await self._settle([], jobs, self.queue)
            if conn is not None:
                await conn.aclose()

    async def _pause(self, seconds: float) -> None:
        """Wait out an outage's backoff, or until shutdown begins."""
        with trio.move_on_after(seconds):
            await self._stopped.wait()

    async def _process(self, jobs: list[ClaimedJob], queue: Queue, worker_id: str,
                       handler_outage: Outage) -> list[ClaimedJob] | None:
        """Run a batch and record its outcomes; returns the next batch when it
        was claimed in the same round trip as the acknowledgement ([] if that
        claim found nothing), None if no claim was made."""
        self.stats.claimed += len(jobs)
        if self.metrics is not None:
            self.metrics.observe_claims(jobs)
        for job in jobs:
            self._in_flight[job.id] = job
        outcomes: dict[JobId, Failure | None] = {}
        next_jobs: list[ClaimedJob] | None = None
        finished_normally = False
        try:
            scope = trio.CancelScope(deadline=self._grace_deadline)
            self._handler_scopes.add(scope)
            claimed_at = trio.current_time()
            for job in jobs:
                self._scope_of[job.id] = scope
                self._confirmed[job.id] = claimed_at
            try:
                with scope:
                    await self._run_handlers(jobs, outcomes)
                finished_normally = not scope.cancelled_caught
            finally:
                self._handler_scopes.discard(scope)
                for job in jobs:
                    self._scope_of.pop(job.id, None)
                    self._confirmed.pop(job.id, None)
        finally:
            done = [(job, outcomes[job.id]) for job in jobs if job.id in outcomes]
            unfinished = [job for job in jobs if job.id not in outcomes]
            # Every job met an outage: no claim with the ack, and a pause
            # below, so that workers do not spin through the queue while the
            # index is down (each job is retried after its backoff).
            outage_only = bool(done) and all(f is not None and f.outage for _, f in done)
            self._settling.update(job.id for job in jobs)
            # Shielded: a cancelled worker still records what it finished and
            # hands back what it did not. Bounded: stale-lease reclaim covers
            # the case where Postgres does not answer in time.
            bound = max(self.settings.stale_after, 5.0)
            lost_answer = False
            with self._shielded(bound) as settle_scope:
                if finished_normally and not unfinished and not self._stopping \
                        and not outage_only:
                    try:
                        result, next_jobs = await queue.ack_and_claim(
                            done, self.settings.batch_size, worker_id)
                        self._count(result, done)
                        done = []
                    except (DatabaseTransient, trio.TooSlowError) as exc:
                        log.info("ack on the worker's connection failed, retrying through "
                                 "the pool: %s", exc)
                        queue = self.queue
                        lost_answer = True
                await self._settle(done, unfinished, queue, worker_id)
                if lost_answer:
                    # The ack may have committed, and claimed a batch with
                    # it that this worker never heard of.
                    await self._hand_back_unknown(worker_id, [j.id for j in jobs], "an ack")
            if settle_scope.cancelled_caught:
                self.stats.unrecorded += len(jobs)
                why = "stopping now" if self._forced else \
                    f"after {bound:.0f}s without the database"
                log.warning("gave up recording the outcome of %d job(s) (%s): their leases "
                            "expire and the sweeper re-queues them; jobs %s", len(jobs), why,
                            sorted(j.id for j in jobs))
            for job in jobs:
                self._in_flight.pop(job.id, None)
                self._settling.discard(job.id)
        if outage_only and not self._stopping:
            failure = done[0][1]
            assert failure is not None
            await self._pause(handler_outage.failed(RuntimeError(failure.error)))
        elif done:
            handler_outage.ok()
        return next_jobs

    async def _hand_back_unknown(self, worker_id: str, known: list[JobId], what: str) -> None:
        """Hand back (attempt refunded) the jobs ``worker_id`` holds besides
        ``known``: claimed by a statement whose answer was lost (a command
        timeout or a cut after the commit). Through the pool; if Postgres is
        out of reach there too, the sweeper takes them back when their
        leases expire. Without this, a job a timed-out claim took sat until
        stale_after and was then charged as a suspect (a review)."""
        try:
            with trio.move_on_after(self.command_timeout):
                released = await self.queue.release_unknown(worker_id, known)
                if released:
                    self.stats.released += len(released)
                    log.info("handed back jobs %s, claimed by %s whose answer was lost",
                             released, what)
        except DatabaseTransient:
            pass

    def _count(self, result: AckResult,
               done: Sequence[tuple[ClaimedJob, Failure | None]] = ()) -> None:
        for job, failure in done:
            status = result.statuses.get(job.id)
            if failure is None or status is None:
                continue
            fields: dict[str, object] = {
                "job_id": job.id, "tenant": job.tenant_slug, "job_type": job.job_type.value,
                "attempts": job.attempts, "max_attempts": job.max_attempts,
                "error": failure.error[:500], "job_status": status.value}
            if status == "failed":
                self._log_failed("job failed for good job_id=%s tenant=%s type=%s "
                                 "attempts=%d/%d permanent=%s error=%s", job.id,
                                 job.tenant_slug, job.job_type.value, job.attempts,
                                 job.max_attempts, failure.permanent, failure.error[:500],
                                 extra=fields)
            else:
                self._log_retry("job will be retried job_id=%s tenant=%s type=%s "
                                "attempts=%d/%d error=%s", job.id, job.tenant_slug,
                                job.job_type.value, job.attempts, job.max_attempts,
                                failure.error[:500], extra=fields)
        if self.metrics is not None:
            self.metrics.count_ack(result)
        for status in result.statuses.values():
            if status == "succeeded":
                self.stats.succeeded += 1
            elif status == "failed":
                self.stats.failed += 1
            else:
                self.stats.retried += 1
        if result.refused:
            self.stats.refused += len(result.refused)
            log.warning("ack refused for jobs %s: their lease was taken over",
                        list(result.refused))

    async def _run_handlers(self, jobs: list[ClaimedJob],
                            outcomes: dict[JobId, Failure | None]) -> None:
        by_type: dict[JobType, list[ClaimedJob]] = {}
        for job in jobs:
            by_type.setdefault(job.job_type, []).append(job)
        for job_type, group in by_type.items():
            handler = self.handlers[job_type]
            try:
                failures = await handler(group)
            except DatabaseTransient as exc:
                # The database is out of reach or busy: not a bug of the
                # handler's, no traceback; an outage is not charged.
                log.warning("handler for %s met a database error; retrying its batch of %d: "
                            "%s", job_type, len(group), exc)
                failure = Failure(f"{type(exc).__name__}: {exc}", outage=is_outage(exc))
                failures = {job.id: failure for job in group}
            except Exception as exc:
                log.exception("handler for %s raised; failing its batch of %d",
                              job_type, len(group))
                failure = Failure(f"{type(exc).__name__}: {exc}")
                failures = {job.id: failure for job in group}
            for job in group:
                outcomes[job.id] = failures.get(job.id)

    async def _settle(self, done: list[tuple[ClaimedJob, Failure | None]],
                      unfinished: list[ClaimedJob], queue: Queue, worker_id: str = "") -> None:
        """Ack and release on the worker's connection; if that broke, through
        the pool, retrying while Postgres is unreachable (a restart) or
        refuses for a while (a lock, a full disk). Unbounded: the caller
        bounds it."""
        outage = Outage(f"ack of worker {worker_id or self.name}", log, max_delay=2.0)
        while done or unfinished:
            try:
                if done:
                    self._count(await queue.ack(done), done)
                    done = []
                if unfinished:
                    released = await queue.release(unfinished)
                    self.stats.released += len(released)
                    unfinished = []
            except DatabaseTransient as exc:
                queue = self.queue  # the pool reconnects by itself
                await trio.sleep(outage.failed(exc))
        outage.ok()

    async def _heartbeats(self) -> None:
        interval = self.settings.effective_heartbeat_interval
        outage = Outage(f"heartbeats of {self.name}", log, max_delay=interval)
        while True:
            await trio.sleep(interval)
            leases = {job_id: job.lease for job_id, job in self._in_flight.items()}
            if not leases:
                continue
            sent = trio.current_time()
            try:
                lost = await self.queue.heartbeat(leases)
            except DatabaseTransient as exc:
                outage.failed(exc)
                continue
            outage.ok()
            # A job acknowledged while the heartbeat ran is not lost.
            lost = {i for i in lost if i in self._in_flight and i not in self._settling}
            for job_id in leases.keys() - lost:
                if job_id in self._confirmed:
                    self._confirmed[job_id] = sent
            if lost:
                self.stats.lost_leases += len(lost)
                log.warning("lost the lease of jobs %s (taken over after a stale heartbeat): "
                            "their handlers are stopped", sorted(lost))
                self._stop_handlers(lost)

    async def _lease_watch(self) -> None:
        """Stop the handlers of jobs whose lease has not been confirmed for
        nearly ``stale_after`` (the database out of reach, a heartbeat that
        does not come back): by then another process's sweeper may have
        handed the job to a worker of its own, and the two would run it at
        once (a queue audit: a worker cut off from Postgres ran on for 4 s
        beside the new owner). What they did not finish is re-run there."""
        interval = self.settings.effective_heartbeat_interval
        limit = lease_watch_limit(self.settings.stale_after, interval)
        while True:
            await trio.sleep(min(interval, limit) / 4)
            now = trio.current_time()
            expired = {job_id for job_id, at in self._confirmed.items()
                       if now - at > limit and job_id not in self._settling}
            if expired:
                log.warning("the leases of jobs %s were not confirmed for %.0f s (the database "
                            "is out of reach or slow): their handlers are stopped, and the "
                            "jobs go to whichever worker the sweeper hands them to",
                            sorted(expired), limit)
                self._stop_handlers(expired)

    def _stop_handlers(self, job_ids: set[JobId]) -> None:
        for job_id in job_ids:
            scope = self._scope_of.get(job_id)
            if scope is not None:
                scope.cancel()
            self._confirmed.pop(job_id, None)
