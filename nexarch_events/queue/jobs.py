"""The index job queue on ``mail_index_jobs`` (seed: indexworker/queue.go).

Every method is one statement, one round trip. The SQL, with the reasons for
each clause, is in ``sql/queue.sql``. Enqueueing wakes workers everywhere by
a trigger's NOTIFY; acks announce outcomes on the job-events channel
(docs/events.md).
"""

from __future__ import annotations

import json
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass
from datetime import UTC, datetime
from typing import cast

from ..aio import Executor, Row
from ..db import sqlfiles
from ..errors import DatabaseError, InvalidJobError, JobNotFound, NoJobAvailable
from ..models import (
    DEFAULT_MAX_ATTEMPTS,
    AckResult,
    ClaimedJob,
    Failure,
    Job,
    JobId,
    JobStatus,
    JobType,
    JSONObject,
    JSONValue,
    LeaseToken,
    NewJob,
    QueueStats,
    RequeueResult,
    storable_text,
    validate_tenant_slug,
)
from ..settings import QueueSettings

_SQL = sqlfiles.queries("queue.sql")


class Queue:
    """Access to ``mail_index_jobs``. Cheap to create; runs its statements on
    the caller's pool (Database) or connection."""

    def __init__(self, db: Executor, settings: QueueSettings | None = None) -> None:
        self.db = db
        self.settings = settings or QueueSettings()
        #: Acks refused because the lease had been taken over (zombie acks),
        #: counted over this object's life.
        self.refused_acks = 0

    # -- producers -----------------------------------------------------------

    async def enqueue_index(self, tenant_slug: str, message_id: str,
                            payload: Mapping[str, JSONValue], *,
                            max_attempts: int = DEFAULT_MAX_ATTEMPTS,
                            delay_s: float = 0.0) -> JobId:
        """Enqueue an index job (seed: EnqueueIndex). Raises InvalidJobError,
        writing nothing, if any argument is unacceptable."""
        job = NewJob(JobType.INDEX, tenant_slug, message_id, payload,
                     max_attempts=max_attempts, delay_s=delay_s)
        return (await self.enqueue_many([job]))[0]

    async def enqueue_delete(self, tenant_slug: str, message_id: str, *,
                             max_attempts: int = DEFAULT_MAX_ATTEMPTS) -> JobId:
        """Enqueue a delete job (seed: EnqueueDelete)."""
        job = NewJob(JobType.DELETE, tenant_slug, message_id, {}, max_attempts=max_attempts)
        return (await self.enqueue_many([job]))[0]

    async def enqueue_many(self, jobs: Sequence[NewJob]) -> list[JobId]:
        """Enqueue any number of jobs in one statement, one transaction and one
        notification. Returns their ids in input order. All or nothing."""
        if not jobs:
            return []
        for job in jobs:
            if not isinstance(job, NewJob):
                raise InvalidJobError(f"enqueue_many takes NewJob values, got {type(job).__name__}")
        try:
            if len(jobs) == 1:
                job = jobs[0]
                rows = await self.db.fetch(
                    _SQL["enqueue_one"], job.job_type.value, job.tenant_slug, job.message_id,
                    job.payload_json, job.max_attempts, float(job.delay_s))
            else:
                rows = await self.db.fetch(
                    _SQL["enqueue"],
                    [j.job_type.value for j in jobs], [j.tenant_slug for j in jobs],
                    [j.message_id for j in jobs], [j.payload_json for j in jobs],
                    [j.max_attempts for j in jobs], [float(j.delay_s) for j in jobs])
        except DatabaseError as exc:
            if exc.sqlstate and exc.sqlstate.startswith("23"):
                # The table's CHECKs mirror NewJob's validation; reaching one
                # means the two disagree (e.g. jsonb's re-serialized size).
                raise InvalidJobError(f"job rejected by the database: {exc}") from exc
            raise
        # Identity values follow input order (ORDER BY ord in the INSERT).
        return sorted(JobId(row["id"]) for row in rows)

    # -- workers ---------------------------------------------------------------

    async def claim(self, limit: int, worker_id: str) -> list[ClaimedJob]:
        """Claim up to ``limit`` ready jobs in one statement; [] if none."""
        rows = await self.db.fetch(_SQL["claim"], limit, worker_id)
        jobs = [_claimed(row) for row in rows]
        jobs.sort(key=lambda j: j.id)
        return jobs

    async def dequeue(self, worker_id: str) -> ClaimedJob:
        """Claim exactly one job (seed: Dequeue); raises NoJobAvailable."""
        jobs = await self.claim(1, worker_id)
        if not jobs:
            raise NoJobAvailable("no job is ready")
        return jobs[0]

    async def heartbeat(self, leases: Mapping[JobId, LeaseToken]) -> set[JobId]:
        """Refresh leases; return the ids whose lease is lost (taken over)."""
        if not leases:
            return set()
        ids = list(leases)
        rows = await self.db.fetch(_SQL["heartbeat"], ids, [leases[i] for i in ids])
        kept = {row["id"] for row in rows}
        return {i for i in ids if i not in kept}

    async def ack(self, outcomes: Sequence[tuple[ClaimedJob, Failure | None]]) -> AckResult:
        """Record a batch's outcomes in one statement: None = succeeded, a
        Failure = retry with backoff, or ``failed`` after max attempts (or at
        once if permanent). Jobs whose lease was taken over are refused."""
        if not outcomes:
            return AckResult({}, ())
        outcomes, postponed = await self._postpone(outcomes)
        if not outcomes:
            return postponed
        rows = await self.db.fetch(
            _SQL["ack"],
            [job.id for job, _ in outcomes], [job.lease for job, _ in outcomes],
            [None if f is None else _clip_error(f.error) for _, f in outcomes],
            [False if f is None else f.permanent for _, f in outcomes],
            float(self.settings.backoff_base), self.settings.backoff_cap)
        return _merged(self._ack_result(rows, (job.id for job, _ in outcomes)), postponed)

    async def ack_and_claim(self, outcomes: Sequence[tuple[ClaimedJob, Failure | None]],
                            limit: int, worker_id: str) -> tuple[AckResult, list[ClaimedJob]]:
        """``ack`` then ``claim``, in one statement and one round trip (two
        when some outcome is an outage)."""
        outcomes, postponed = await self._postpone(outcomes)
        rows = await self.db.fetch(
            _SQL["ack_and_claim"],
            [job.id for job, _ in outcomes], [job.lease for job, _ in outcomes],
            [None if f is None else _clip_error(f.error) for _, f in outcomes],
            [False if f is None else f.permanent for _, f in outcomes],
            float(self.settings.backoff_base), self.settings.backoff_cap, limit, worker_id)
        acked = [row for row in rows if row["acked"]]
        claimed = sorted((_claimed(row) for row in rows if not row["acked"]), key=lambda j: j.id)
        return _merged(self._ack_result(acked, (job.id for job, _ in outcomes)),
                       postponed), claimed

    async def _postpone(self, outcomes: Sequence[tuple[ClaimedJob, Failure | None]]
                        ) -> tuple[list[tuple[ClaimedJob, Failure | None]], AckResult]:
        """Record the outages among ``outcomes`` (Failure.outage): retried
        after a doubling wait, the attempt refunded, up to OUTAGE_RETRIES
        times per job. Returns the outcomes still to acknowledge (the others,
        and outages past that budget or whose lease is gone: the ack charges
        or refuses them), and what was recorded (pending again)."""
        outages = [(job, f) for job, f in outcomes if f is not None and f.outage]
        if not outages:
            return list(outcomes), AckResult({}, ())
        rows = await self.db.fetch(
            _SQL["postpone"], [job.id for job, _ in outages], [job.lease for job, _ in outages],
            [_clip_error(f.error) for _, f in outages if f is not None],
            float(self.settings.backoff_base), OUTAGE_RETRIES)
        postponed = {JobId(row["id"]) for row in rows}
        result = AckResult({job_id: JobStatus.PENDING for job_id in postponed}, ())
        return [(job, f) for job, f in outcomes if job.id not in postponed], result

    async def complete(self, jobs: Sequence[ClaimedJob]) -> AckResult:
        """Mark jobs succeeded (seed: complete)."""
        return await self.ack([(job, None) for job in jobs])

    async def fail(self, job: ClaimedJob, error: str, *, permanent: bool = False) -> AckResult:
        """Record one failure (seed: fail)."""
        return await self.ack([(job, Failure(error, permanent))])

    async def release(self, jobs: Sequence[ClaimedJob]) -> list[JobId]:
        """Hand jobs back unfinished (shutdown), refunding their attempt."""
        if not jobs:
            return []
        rows = await self.db.fetch(_SQL["release"], [j.id for j in jobs], [j.lease for j in jobs])
        return sorted(JobId(row["id"]) for row in rows)

    async def release_unknown(self, worker_id: str, known: Sequence[JobId]) -> list[JobId]:
        """Hand back the jobs ``worker_id`` holds but does not know of (a
        claim or an ack_and_claim whose answer was lost), refunding their
        attempt. Waits for a claim of ``worker_id`` still running."""
        rows = await self.db.fetch(_SQL["release_unknown"], worker_id, [int(i) for i in known])
        return sorted(JobId(row["id"]) for row in rows)

    # -- sweeper ---------------------------------------------------------------

    async def reclaim_stale(self) -> dict[JobId, JobStatus]:
        """Put back jobs whose worker stopped heartbeating; returns their new status."""
        return {r.id: r.status for r in await self.reclaim_stale_jobs()}

    async def reclaim_stale_jobs(self) -> list[Reclaimed]:
        """``reclaim_stale`` with, per job, whether it ran alone when its worker
        died (then it is the suspect and was charged the attempt; the jobs
        of a larger batch were not, and run alone from now on)."""
        rows = await self.db.fetch(_SQL["reclaim_stale"], float(self.settings.stale_after))
        return sorted((Reclaimed(JobId(row["id"]), JobStatus(row["status"]), row["alone"])
                       for row in rows), key=lambda r: r.id)

    async def ready_count(self, limit: int) -> int:
        """Jobs ready now, counted up to ``limit``."""
        return int(await self.db.fetchval(_SQL["ready_count"], limit))

    async def schedule(self) -> tuple[datetime | None, datetime | None, datetime]:
        """(earliest future retry, oldest heartbeat, database now)."""
        row = await self.db.fetchrow(_SQL["schedule"])
        assert row is not None
        return row["next_due"], row["oldest_heartbeat"], row["db_now"]

    async def prune(self, limit: int = 500) -> int:
        """Delete up to ``limit`` finished jobs past their retention
        (settings.retain_succeeded / retain_failed); returns how many. One
        short statement: call it again while it returns ``limit``."""
        s = self.settings
        return int(await self.db.fetchval(
            _SQL["prune"], s.retain_succeeded or None, s.retain_failed or None, limit))

    async def dead_rows(self) -> int:
        """Dead row versions in the job table (statistics; may lag a second)."""
        return int(await self.db.fetchval(_SQL["dead_rows"]))

    async def vacuum_allowed(self) -> bool:
        """May this role vacuum the job table (owner of it or of the database,
        or, from Postgres 17, holder of MAINTAIN on it)?"""
        return bool(await self.db.fetchval(_SQL["vacuum_allowed"]))

    @staticmethod
    async def vacuum(conn: Executor) -> None:
        """VACUUM the job table on ``conn``, which must be outside a
        transaction and may be busy for seconds (not a pooled connection
        whose command timeout is tuned for one-row statements), and a
        session of its own (a direct URL, not a transaction pooler's): the
        role's or database's ``statement_timeout`` is switched off on it
        first, the connection's command timeout bounds the vacuum."""
        await conn.execute(_SQL["vacuum_session"])
        await conn.execute(_SQL["vacuum"])

    async def cursor_lost(self, job_id: int, *, tenant_slug: str | None = None) -> str | None:
        """Why an event stream resuming after job ``job_id`` cannot know what
        it missed ("pruned": the job was deleted by retention; "requeued":
        it was re-queued since it finished; "later_pruned": a job that
        finished after it was), or None if it can. With ``tenant_slug``,
        another tenant's job is an unknown id."""
        lost = await self.db.fetchval(_SQL["cursor_lost"], int(job_id), tenant_slug)
        return None if lost is None else str(lost)

    # -- operators -------------------------------------------------------------

    async def status(self, job_id: int, *, tenant_slug: str | None = None) -> Job:
        """A job's current state (seed: Status). Raises JobNotFound; with
        ``tenant_slug``, a job of another tenant is not found either."""
        if tenant_slug is not None:
            validate_tenant_slug(tenant_slug)
        row = await self.db.fetchrow(_SQL["status"], int(job_id), tenant_slug)
        if row is None:
            raise JobNotFound(f"job {job_id} not found")
        return Job(
            id=JobId(row["id"]), job_type=JobType(row["job_type"]),
            tenant_slug=row["tenant_slug"], message_id=row["message_id"],
            status=JobStatus(row["status"]), attempts=row["attempts"],
            max_attempts=row["max_attempts"], available_at=row["available_at"],
            locked_by=row["locked_by"], last_error=row["last_error"],
            created_at=row["created_at"], updated_at=row["updated_at"],
            finished_at=row["finished_at"])

    async def open_keys(self, tenant_slug: str, job_type: JobType,
                        message_ids: Sequence[str]) -> set[str]:
        """The keys among ``message_ids`` whose newest unfinished job (pending
        or processing) is of ``job_type``: that work is already queued."""
        rows = await self.db.fetch(_SQL["open_keys"], tenant_slug, list(message_ids),
                                   job_type.value)
        return {r["message_id"] for r in rows}

    async def statuses(self, job_ids: Sequence[int]) -> dict[JobId, JobStatus]:
        """Statuses of many jobs in one query; unknown ids are absent."""
        rows = await self.db.fetch(_SQL["statuses"], [int(i) for i in job_ids])
        return {JobId(r["id"]): JobStatus(r["status"]) for r in rows}

    async def requeue(self, job_id: int) -> RequeueResult:
        """Re-queue one failed job with fresh attempts. Raises JobNotFound if
        no failed job has that id."""
        result = await self.requeue_failed(job_id=job_id)
        if not result.requeued and not result.superseded:
            raise JobNotFound(f"no failed job with id {job_id}")
        return result

    async def requeue_failed(self, *, job_id: int | None = None, tenant_slug: str | None = None,
                             job_type: JobType | str | None = None) -> RequeueResult:
        """Re-queue every failed job matching all given filters. Jobs that a
        newer job of the same message has overtaken are left failed and
        reported as superseded (re-running them would undo the newer job)."""
        if tenant_slug is not None:
            validate_tenant_slug(tenant_slug)
        kind = None if job_type is None else JobType(job_type).value
        rows = await self.db.fetch(_SQL["requeue_failed"],
                                   None if job_id is None else int(job_id), tenant_slug, kind)
        return RequeueResult(
            requeued=tuple(JobId(r["id"]) for r in rows if r["requeued"]),
            superseded=tuple(JobId(r["id"]) for r in rows if not r["requeued"]))

    async def stats(self) -> QueueStats:
        """Counts per status and the oldest ready job's age, every tenant's."""
        return _stats(await self.db.fetchrow(_SQL["stats"]))

    async def stats_for(self, tenant_slug: str | None) -> QueueStats:
        """``stats`` of one tenant's jobs (None: every tenant's)."""
        if tenant_slug is None:
            return await self.stats()
        validate_tenant_slug(tenant_slug)
        return _stats(await self.db.fetchrow(_SQL["stats_tenant"], tenant_slug))

    async def succeeded_within(self, seconds: float, *, tenant_slug: str | None = None) -> int:
        """Jobs (of one tenant, or all) that succeeded in the last ``seconds``."""
        if tenant_slug is not None:
            validate_tenant_slug(tenant_slug)
        return int(await self.db.fetchval(_SQL["succeeded_within"], tenant_slug,
                                          float(seconds)))

    async def last_finished(self, *, tenant_slug: str | None = None) -> JobId | None:
        """The job (of one tenant, or all) that finished last; None if none has."""
        if tenant_slug is not None:
            validate_tenant_slug(tenant_slug)
        value = await self.db.fetchval(_SQL["last_finished"], tenant_slug)
        return None if value is None else JobId(int(value))

    async def finished_after(self, job_id: int, *, tenant_slug: str | None = None,
                             limit: int = 1000) -> list[FinishedJob]:
        """Jobs (of one tenant, or all) that finished after job ``job_id`` did,
        in finish order, at most ``limit`` (see ``finished_after`` in
        sql/queue.sql for what "after" means when that job is not finished)."""
        if tenant_slug is not None:
            validate_tenant_slug(tenant_slug)
        rows = await self.db.fetch(_SQL["finished_after"], tenant_slug, int(job_id), limit)
        return [FinishedJob(id=JobId(r["id"]), tenant_slug=r["tenant_slug"],
                            status=JobStatus(r["status"]), job_type=JobType(r["job_type"]),
                            message_id=r["message_id"], finished_at=r["finished_at"])
                for r in rows]

    # -- helpers ---------------------------------------------------------------

    def _ack_result(self, rows: list[Row], sent: Iterable[JobId]) -> AckResult:
        statuses = {JobId(row["id"]): JobStatus(row["status"]) for row in rows}
        refused = tuple(i for i in sent if i not in statuses)
        self.refused_acks += len(refused)
        return AckResult(statuses=statuses, refused=refused)


@dataclass(frozen=True, slots=True)
class Reclaimed:
    """A job the sweeper took back from a dead worker."""

    id: JobId
    status: JobStatus
    #: It ran alone: the suspect, charged the attempt.
    alone: bool


@dataclass(frozen=True, slots=True)
class FinishedJob:
    """A job in a final state, as ``Queue.finished_after`` reports it."""

    id: JobId
    tenant_slug: str
    status: JobStatus
    job_type: JobType
    message_id: str
    finished_at: datetime

    @property
    def finish_stamp(self) -> str:
        """``finished_at`` as the job-events notification names this finish
        (migration 0034, ``nexarch_utc_stamp``)."""
        return self.finished_at.astimezone(UTC).strftime("%Y-%m-%dT%H:%M:%S.%fZ")


#: How often one job's attempt is refunded for an outage (queue.sql,
#: postpone): with the doubling wait, about 40 minutes of outage at the
#: default backoff base (10 s); after that an outage costs attempts too, so
#: that a job whose own work looks like an outage still ends failed.
OUTAGE_RETRIES = 12

#: last_error is for people; a 100 KB traceback helps nobody and bloats rows.
MAX_ERROR_LENGTH = 4000


def _clip_error(error: str) -> str:
    return storable_text(error, MAX_ERROR_LENGTH)


def _merged(first: AckResult, second: AckResult) -> AckResult:
    return AckResult({**first.statuses, **second.statuses}, first.refused + second.refused)


def _stats(row: Row | None) -> QueueStats:
    assert row is not None  # the statement always returns one row
    raw = cast(dict[str, int], json.loads(row["counts"]))
    counts = {status: int(raw.get(status.value, 0)) for status in JobStatus}
    age = row["oldest_ready_age_s"]
    return QueueStats(counts=counts, oldest_ready_age_s=None if age is None else float(age))


def _claimed(row: Row) -> ClaimedJob:
    return ClaimedJob(
        id=JobId(row["id"]), job_type=JobType(row["job_type"]), tenant_slug=row["tenant_slug"],
        message_id=row["message_id"], payload=cast(JSONObject, json.loads(row["payload"])),
        attempts=row["attempts"], max_attempts=row["max_attempts"],
        lease=LeaseToken(row["lease"]), enqueued_at=row["created_at"])
