"""The queue's semantics against real Postgres (seed: indexworker/queue.go)."""

from __future__ import annotations

import json
import math
from datetime import timedelta
from decimal import Decimal

import pytest
import trio
import trio.lowlevel

from nexarch_events.aio import Connection, Database
from nexarch_events.errors import (
    DatabaseUnavailable,
    InvalidJobError,
    JobNotFound,
    NoJobAvailable,
)
from nexarch_events.models import (
    MAX_PAYLOAD_BYTES,
    Failure,
    JobStatus,
    JobType,
    NewJob,
)
from nexarch_events.queue.jobs import Queue
from nexarch_events.queue.notify import (
    INDEX_JOBS_CHANNEL,
    JOB_EVENTS_CHANNEL,
    RESYNC,
    Event,
    Listener,
    Notification,
    Resync,
    Subscription,
)
from nexarch_events.settings import QueueSettings


async def count_rows(db: Database) -> int:
    return int(await db.fetchval("SELECT count(*) FROM mail_index_jobs"))


# -- the seed's API -------------------------------------------------------------

async def test_enqueue_index_and_status(queue: Queue) -> None:
    job_id = await queue.enqueue_index("acme", "<m1@example.org>", {"subject": "Rechnung"})
    job = await queue.status(job_id)
    assert job.id == job_id
    assert job.job_type is JobType.INDEX
    assert (job.tenant_slug, job.message_id) == ("acme", "<m1@example.org>")
    assert job.status is JobStatus.PENDING
    assert (job.attempts, job.max_attempts) == (0, 5)
    assert job.last_error is None


async def test_enqueue_delete_has_empty_payload(queue: Queue, db: Database) -> None:
    job_id = await queue.enqueue_delete("acme", "m1")
    payload = await db.fetchval("SELECT payload::text FROM mail_index_jobs WHERE id = $1", job_id)
    assert json.loads(payload) == {}
    assert (await queue.status(job_id)).job_type is JobType.DELETE


async def test_no_job_available_and_not_found_are_distinct(queue: Queue) -> None:
    with pytest.raises(NoJobAvailable):
        await queue.dequeue("w")
    with pytest.raises(JobNotFound):
        await queue.status(12345)
    assert not issubclass(NoJobAvailable, JobNotFound)
    assert not issubclass(JobNotFound, NoJobAvailable)


async def test_dequeue_marks_processing_and_counts_the_attempt(queue: Queue) -> None:
    job_id = await queue.enqueue_index("acme", "m1", {"a": 1})
    job = await queue.dequeue("worker-1")
    assert job.id == job_id and job.payload == {"a": 1} and job.attempts == 1
    status = await queue.status(job_id)
    assert status.status is JobStatus.PROCESSING
    assert status.locked_by == "worker-1"
    with pytest.raises(NoJobAvailable):
        await queue.dequeue("worker-2")


async def test_complete(queue: Queue) -> None:
    await queue.enqueue_index("acme", "m1", {})
    job = await queue.dequeue("w")
    result = await queue.complete([job])
    assert result.statuses == {job.id: JobStatus.SUCCEEDED} and result.refused == ()
    status = await queue.status(job.id)
    assert status.status is JobStatus.SUCCEEDED and status.finished_at is not None
    assert status.locked_by is None


async def test_status_is_scoped_to_a_tenant_when_asked(queue: Queue) -> None:
    job_id = await queue.enqueue_index("tenant-a", "m1", {})
    assert (await queue.status(job_id, tenant_slug="tenant-a")).id == job_id
    with pytest.raises(JobNotFound):
        await queue.status(job_id, tenant_slug="tenant-b")


# -- retries, backoff, max attempts -----------------------------------------------

async def test_failure_backs_off_by_the_seed_formula(db: Database) -> None:
    queue = Queue(db, QueueSettings(backoff_base=10.0, backoff_cap=10))
    await queue.enqueue_index("acme", "m1", {})
    job = await queue.dequeue("w")
    before = await db.fetchval("SELECT now()")
    result = await queue.fail(job, "index unreachable")
    assert result.statuses == {job.id: JobStatus.PENDING}
    row = await db.fetchrow("SELECT available_at, last_error, attempts FROM mail_index_jobs")
    assert row is not None
    assert row["last_error"] == "index unreachable"
    delay = (row["available_at"] - before).total_seconds()
    # attempts = 1 -> min(1, 10) * 10 s
    assert 9.9 <= delay <= 11, delay
    with pytest.raises(NoJobAvailable):
        await queue.dequeue("w")  # not due yet


async def test_backoff_is_capped(db: Database) -> None:
    # A fractional base: Postgres once inferred the parameter as an integer
    # and truncated 0.5 s to 0 (no backoff at all).
    queue = Queue(db, QueueSettings(backoff_base=0.5, backoff_cap=2))
    job_id = await queue.enqueue_index("acme", "m1", {}, max_attempts=10)
    delays = []
    for _ in range(4):
        await db.execute("UPDATE mail_index_jobs SET available_at = now() WHERE id = $1", job_id)
        job = await queue.dequeue("w")
        await queue.fail(job, "still down")
        # The ack sets available_at and updated_at from the same now() (one
        # statement, one transaction): their difference is exactly the delay
        # the database computed, however long the test paused in between.
        delay = await db.fetchval(
            "SELECT extract(epoch FROM available_at - updated_at)::float8"
            "  FROM mail_index_jobs WHERE id = $1", job_id)
        delays.append(delay)
    assert delays == [0.5, 1.0, 1.0, 1.0]


async def test_failed_after_max_attempts_keeps_last_error(queue: Queue, db: Database) -> None:
    job_id = await queue.enqueue_index("acme", "m1", {}, max_attempts=3)
    for attempt in range(1, 4):
        await db.execute("UPDATE mail_index_jobs SET available_at = now() WHERE id = $1", job_id)
        job = await queue.dequeue("w")
        assert job.attempts == attempt
        result = await queue.fail(job, f"error {attempt}")
    assert result.statuses == {job_id: JobStatus.FAILED}
    status = await queue.status(job_id)
    assert status.status is JobStatus.FAILED
    assert status.attempts == 3 and status.last_error == "error 3"
    assert status.finished_at is not None
    await db.execute("UPDATE mail_index_jobs SET available_at = now() - interval '1 hour'")
    with pytest.raises(NoJobAvailable):
        await queue.dequeue("w")


async def test_permanent_failure_skips_retries(queue: Queue) -> None:
    job_id = await queue.enqueue_index("acme", "m1", {})
    job = await queue.dequeue("w")
    await queue.ack([(job, Failure("malformed MIME: no header/body separator", permanent=True))])
    status = await queue.status(job_id)
    assert status.status is JobStatus.FAILED and status.attempts == 1
    assert status.last_error == "malformed MIME: no header/body separator"


async def test_long_errors_are_clipped_and_nul_is_escaped(queue: Queue) -> None:
    job_id = await queue.enqueue_index("acme", "m1", {})
    job = await queue.dequeue("w")
    await queue.fail(job, "bad\x00byte " + "x" * 10_000, permanent=True)
    error = (await queue.status(job_id)).last_error
    assert error is not None and error.startswith("bad\\x00byte ")
    assert len(error) < 4100 and error.endswith("characters cut]")


async def test_an_error_with_a_lone_surrogate_is_recorded(queue: Queue) -> None:
    """A search server's JSON error may carry "\\udcff": the ack could not
    encode it, and the worker died of it, again after every restart (a
    retry-loop audit)."""
    job_id = await queue.enqueue_index("acme", "m1", {})
    job = await queue.dequeue("w")
    await queue.fail(job, "internal error \udcff from the index", permanent=True)
    status = await queue.status(job_id)
    assert status.status is JobStatus.FAILED
    assert status.last_error == "internal error \\udcff from the index"


# -- operators: re-queue and statistics ---------------------------------------------

async def _fail_permanently(queue: Queue, tenant: str, message_id: str,
                            job_type: JobType = JobType.INDEX) -> int:
    if job_type is JobType.INDEX:
        job_id = await queue.enqueue_index(tenant, message_id, {})
    else:
        job_id = await queue.enqueue_delete(tenant, message_id)
    job = await queue.dequeue("w")
    assert job.id == job_id
    await queue.fail(job, "boom", permanent=True)
    return job_id


async def test_requeue_one_failed_job(queue: Queue) -> None:
    job_id = await _fail_permanently(queue, "acme", "m1")
    result = await queue.requeue(job_id)
    assert result.requeued == (job_id,)
    status = await queue.status(job_id)
    assert status.status is JobStatus.PENDING and status.attempts == 0
    assert status.last_error == "boom"  # history stays until the next outcome
    assert (await queue.dequeue("w")).id == job_id


async def test_requeue_unknown_or_unfailed_job_is_not_found(queue: Queue) -> None:
    pending = await queue.enqueue_index("acme", "m1", {})
    with pytest.raises(JobNotFound):
        await queue.requeue(pending)
    with pytest.raises(JobNotFound):
        await queue.requeue(999_999)


async def test_requeue_by_filter(queue: Queue) -> None:
    a1 = await _fail_permanently(queue, "tenant-a", "m1")
    a2 = await _fail_permanently(queue, "tenant-a", "m2", JobType.DELETE)
    b1 = await _fail_permanently(queue, "tenant-b", "m1")
    result = await queue.requeue_failed(tenant_slug="tenant-a", job_type=JobType.INDEX)
    assert result.requeued == (a1,)
    result = await queue.requeue_failed()
    assert set(result.requeued) == {a2, b1}


async def test_requeue_refuses_a_job_a_newer_job_overtook(queue: Queue) -> None:
    # An index failed for good, then the message was deleted: re-running the
    # index now would resurrect a deleted message in the search index.
    index_id = await _fail_permanently(queue, "acme", "m1")
    delete_id = await queue.enqueue_delete("acme", "m1")
    job = await queue.dequeue("w")
    assert job.id == delete_id
    await queue.complete([job])
    result = await queue.requeue_failed()
    assert result.requeued == () and result.superseded == (index_id,)
    assert (await queue.status(index_id)).status is JobStatus.FAILED


async def test_stats(queue: Queue, db: Database) -> None:
    empty = await queue.stats()
    assert empty.counts == {s: 0 for s in JobStatus} and empty.oldest_ready_age_s is None
    await _fail_permanently(queue, "acme", "m0")
    await queue.enqueue_index("acme", "m1", {})
    await queue.enqueue_index("acme", "m2", {})
    await queue.enqueue_index("acme", "m3", {}, delay_s=3600)
    await db.execute("UPDATE mail_index_jobs SET available_at = now() - interval '90 seconds' "
                     "WHERE message_id = 'm1'")
    job = await queue.dequeue("w")
    assert job.message_id == "m1"
    await queue.complete([job])
    await queue.dequeue("w")  # m2 -> processing
    stats = await queue.stats()
    assert stats.counts == {JobStatus.PENDING: 1, JobStatus.PROCESSING: 1,
                            JobStatus.SUCCEEDED: 1, JobStatus.FAILED: 1}
    # The only ready job is m3? No: m3 is delayed an hour, so nothing is ready.
    assert stats.oldest_ready_age_s is None
    await db.execute("UPDATE mail_index_jobs SET available_at = now() - interval '30 seconds' "
                     "WHERE message_id = 'm3'")
    stats = await queue.stats()
    assert stats.oldest_ready_age_s is not None and 29 <= stats.oldest_ready_age_s <= 40


# -- bulk enqueue and batch claim --------------------------------------------------

async def test_bulk_enqueue_returns_ids_in_input_order(queue: Queue, db: Database) -> None:
    jobs = [NewJob(JobType.INDEX, "acme", f"m{n}", {"n": n}) for n in range(500)]
    ids = await queue.enqueue_many(jobs)
    assert len(ids) == 500 and ids == sorted(ids)
    rows = await db.fetch("SELECT id, message_id, payload::text AS p FROM mail_index_jobs")
    by_id = {r["id"]: (r["message_id"], json.loads(r["p"])) for r in rows}
    for n, job_id in enumerate(ids):
        assert by_id[job_id] == (f"m{n}", {"n": n})


async def test_bulk_enqueue_is_all_or_nothing(queue: Queue, db: Database) -> None:
    good = NewJob(JobType.INDEX, "acme", "m1", {})
    with pytest.raises(InvalidJobError):
        await queue.enqueue_many([good, NewJob(JobType.INDEX, "Bad Slug", "m2", {})])
    assert await count_rows(db) == 0


async def test_one_job_and_a_batch_store_the_same_rows(queue: Queue, db: Database) -> None:
    """One job goes in by its own statement (sql/queue.sql enqueue_one), a
    batch by the unnested one: the same columns either way, and the same
    checks reached in the database."""
    def job(message_id: str) -> NewJob:
        return NewJob(JobType.DELETE, "acme", message_id, {"k": [1, "ü", None]},
                      max_attempts=7, delay_s=30.5)

    [one] = await queue.enqueue_many([job("one")])
    batch = await queue.enqueue_many([job("batch"), job("other")])
    columns = """job_type, tenant_slug, payload::text AS payload, status, attempts,
                 max_attempts, isolate, outage_retries, lease, locked_by,
                 round(extract(epoch FROM available_at - created_at)::numeric, 1) AS delay"""
    rows = {r["id"]: dict(r) for r in await db.fetch(
        f"SELECT id, {columns} FROM mail_index_jobs")}
    assert rows[one] == {**rows[batch[0]], "id": one}
    assert rows[one]["delay"] == Decimal("30.5") and rows[one]["status"] == "pending"
    # A value only the database refuses (the table's CHECK, not NewJob):
    # the same error by either statement, nothing written.
    over = NewJob(JobType.INDEX, "acme", "over", {})
    object.__setattr__(over, "max_attempts", 1001)
    for jobs in ([over], [over, job("beside")]):
        with pytest.raises(InvalidJobError, match="mail_index_jobs_attempts"):
            await queue.enqueue_many(jobs)
    assert await count_rows(db) == 3


async def test_batch_claim_takes_up_to_the_limit_in_due_order(queue: Queue) -> None:
    ids = await queue.enqueue_many(
        [NewJob(JobType.INDEX, "acme", f"m{n}", {}) for n in range(25)])
    first = await queue.claim(10, "w1")
    second = await queue.claim(10, "w2")
    third = await queue.claim(10, "w3")
    assert [j.id for j in first] == ids[:10]
    assert [j.id for j in second] == ids[10:20]
    assert [j.id for j in third] == ids[20:]
    assert len({j.lease for j in first + second + third}) == 25


async def test_concurrent_claims_never_share_a_job(queue: Queue) -> None:
    await queue.enqueue_many([NewJob(JobType.INDEX, "acme", f"m{n}", {}) for n in range(600)])
    claimed: list[int] = []

    async def claimer(name: str) -> None:
        while jobs := await queue.claim(7, name):
            claimed.extend(j.id for j in jobs)

    async with trio.open_nursery() as nursery:
        for n in range(8):
            nursery.start_soon(claimer, f"w{n}")
    assert len(claimed) == 600 and len(set(claimed)) == 600


async def test_batched_ack_mixes_outcomes_in_one_statement(queue: Queue) -> None:
    await queue.enqueue_many([NewJob(JobType.INDEX, "acme", f"m{n}", {}) for n in range(3)])
    a, b, c = await queue.claim(3, "w")
    result = await queue.ack([(a, None), (b, Failure("retry me")),
                              (c, Failure("never", permanent=True))])
    assert result.statuses == {a.id: JobStatus.SUCCEEDED, b.id: JobStatus.PENDING,
                               c.id: JobStatus.FAILED}


# -- leases, heartbeats, stale reclaim, zombies ---------------------------------------

async def test_zombie_ack_is_refused_and_counted(queue: Queue, db: Database) -> None:
    await queue.enqueue_index("acme", "m1", {})
    zombie = await queue.dequeue("worker-a")
    # worker-a stops heartbeating; its lease goes stale and is taken over.
    await db.execute("UPDATE mail_index_jobs SET heartbeat_at = now() - interval '1 hour'")
    assert await queue.reclaim_stale() == {zombie.id: JobStatus.PENDING}
    successor = await queue.dequeue("worker-b")
    assert successor.id == zombie.id and successor.lease != zombie.lease
    assert successor.attempts == 2

    refused = await queue.complete([zombie])
    assert refused.refused == (zombie.id,) and refused.statuses == {}
    assert await queue.fail(zombie, "late") == type(refused)({}, (zombie.id,))
    assert await queue.heartbeat({zombie.id: zombie.lease}) == {zombie.id}
    assert await queue.release([zombie]) == []
    assert queue.refused_acks == 2
    status = await queue.status(zombie.id)
    assert status.status is JobStatus.PROCESSING and status.locked_by == "worker-b"

    assert (await queue.complete([successor])).statuses == {successor.id: JobStatus.SUCCEEDED}


async def test_heartbeat_keeps_a_live_lease(db: Database) -> None:
    queue = Queue(db, QueueSettings(stale_after=1.0, heartbeat_interval=0.2))
    await queue.enqueue_index("acme", "m1", {})
    job = await queue.dequeue("w")
    for _ in range(8):  # 1.6 s: well past stale_after
        await trio.sleep(0.2)
        assert await queue.heartbeat({job.id: job.lease}) == set()
        assert await queue.reclaim_stale() == {}
    assert (await queue.complete([job])).statuses == {job.id: JobStatus.SUCCEEDED}


async def test_stale_lease_is_reclaimed_and_counts_the_attempt(db: Database) -> None:
    queue = Queue(db, QueueSettings(stale_after=0.5, heartbeat_interval=0.1))
    job_id = await queue.enqueue_index("acme", "m1", {}, max_attempts=2)
    await queue.dequeue("dead-worker")
    assert await queue.reclaim_stale() == {}  # not stale yet
    await trio.sleep(0.7)
    assert await queue.reclaim_stale() == {job_id: JobStatus.PENDING}
    status = await queue.status(job_id)
    assert status.attempts == 1 and status.last_error is not None
    assert "dead-worker" in status.last_error
    # The second crash uses the last attempt: failed, not an endless loop.
    await queue.dequeue("dead-worker-2")
    await trio.sleep(0.7)
    assert await queue.reclaim_stale() == {job_id: JobStatus.FAILED}


async def test_release_refunds_the_attempt(queue: Queue) -> None:
    job_id = await queue.enqueue_index("acme", "m1", {})
    job = await queue.dequeue("w")
    assert await queue.release([job]) == [job_id]
    status = await queue.status(job_id)
    assert status.status is JobStatus.PENDING and status.attempts == 0
    assert (await queue.dequeue("w")).id == job_id


# -- guarantee 3: per-message order -----------------------------------------------

async def test_delete_after_index_waits_for_the_index(db: Database) -> None:
    queue = Queue(db, QueueSettings(backoff_base=60.0))
    index_id = await queue.enqueue_index("acme", "m1", {})
    delete_id = await queue.enqueue_delete("acme", "m1")
    other_id = await queue.enqueue_index("acme", "m2", {})
    jobs = await queue.claim(10, "w")
    assert [j.id for j in jobs] == [index_id, other_id]  # the delete waits
    index_job = jobs[0]
    await queue.fail(index_job, "index down")  # retry scheduled
    await queue.complete([jobs[1]])
    # While the index waits for its retry, the delete must not overtake it.
    assert await queue.claim(10, "w") == []
    await queue.db.execute("UPDATE mail_index_jobs SET available_at = now() "
                           "WHERE id = $1", index_id)
    retried = await queue.claim(10, "w")
    assert [j.id for j in retried] == [index_id]
    await queue.complete(retried)
    last = await queue.claim(10, "w")
    assert [j.id for j in last] == [delete_id]


async def test_a_job_committed_late_waits_for_the_running_job_of_its_message(
        db: Database) -> None:
    """An id is drawn at INSERT and seen at COMMIT. An index job whose
    enqueue committed after a later-id delete of the same message had
    started was claimed beside it: both ran at once, and the delete's
    outcome was announced first (a race audit, with a plain-SQL producer).
    Now it waits until the running job of its message has finished."""
    queue = Queue(db)
    producer = await Connection.open(db.dsn)
    try:
        async with producer.transaction():
            late_index = await producer.fetchval(
                "INSERT INTO mail_index_jobs (job_type, tenant_slug, message_id) "
                "VALUES ('index', 'acme', 'm1') RETURNING id")
            delete_id = await queue.enqueue_delete("acme", "m1")
            assert late_index < delete_id
            running = await queue.claim(10, "w1")
            assert [j.id for j in running] == [delete_id]
    finally:
        await producer.aclose()
    other = await queue.enqueue_index("acme", "m2", {})
    assert [j.id for j in await queue.claim(10, "w2")] == [other]
    await queue.complete(running)
    assert [j.id for j in await queue.claim(10, "w2")] == [late_index]


async def test_two_claims_in_flight_never_start_two_jobs_of_one_message(
        db: Database) -> None:
    """Claim A takes the delete while the index of the same message (a lower
    id) is not committed yet; the index commits; claim B, whose snapshot
    sees it but not A's claim, took it as the oldest open job of its key:
    both ran at once (a queue audit: 11 of 300 messages with 2 processes x
    4 workers). Now B finds the key held by A and leaves the job."""
    queue = Queue(db)
    producer = await Connection.open(db.dsn)
    claimer = await Connection.open(db.dsn)
    try:
        await producer.execute("BEGIN")
        index_id = await producer.fetchval(
            "INSERT INTO mail_index_jobs (job_type, tenant_slug, message_id) "
            "VALUES ('index', 'acme', 'm1') RETURNING id")
        delete_id = await queue.enqueue_delete("acme", "m1")
        assert index_id < delete_id
        await claimer.execute("BEGIN")
        claimed_a = await Queue(claimer).claim(10, "a")
        assert [j.id for j in claimed_a] == [delete_id]
        await producer.execute("COMMIT")  # the index is visible now; A's claim is not
        claimed_b = await queue.claim(10, "b")
        await claimer.execute("COMMIT")
    finally:
        await producer.aclose()
        await claimer.aclose()
    assert claimed_b == []
    running = await db.fetch("SELECT id FROM mail_index_jobs WHERE status = 'processing'")
    assert [r["id"] for r in running] == [delete_id]
    await queue.complete(claimed_a)
    assert [j.id for j in await queue.claim(10, "b")] == [index_id]


async def test_failed_job_unblocks_the_next_of_its_message(queue: Queue) -> None:
    index_id = await _fail_permanently(queue, "acme", "m1")
    delete_id = await queue.enqueue_delete("acme", "m1")
    assert [j.id for j in await queue.claim(10, "w")] == [delete_id]
    assert index_id < delete_id


async def test_same_message_id_in_another_tenant_is_independent(queue: Queue) -> None:
    a = await queue.enqueue_index("tenant-a", "m1", {})
    b = await queue.enqueue_index("tenant-b", "m1", {})
    assert [j.id for j in await queue.claim(10, "w")] == [a, b]


async def test_many_concurrent_workers_keep_per_message_order(queue: Queue) -> None:
    """Guarantee 3 under concurrency and retries: for every message the
    effects happen in enqueue order, whichever worker runs them."""
    messages = [f"m{n}" for n in range(40)]
    jobs = []
    for round_ in range(3):
        for m in messages:
            kind = JobType.DELETE if round_ == 1 else JobType.INDEX
            jobs.append(NewJob(kind, "acme", m, {} if kind is JobType.DELETE else {"r": round_}))
    ids = await queue.enqueue_many(jobs)
    effects: dict[str, list[int]] = {m: [] for m in messages}
    failed_once: set[int] = set()

    async def worker(name: str) -> None:
        idle = 0
        while idle < 20:
            claimed = await queue.claim(5, name)
            if not claimed:
                idle += 1
                await queue.db.execute(
                    "UPDATE mail_index_jobs SET available_at = now() "
                    "WHERE status = 'pending' AND available_at > now()")
                await trio.sleep(0.01)
                continue
            idle = 0
            outcomes = []
            for job in claimed:
                if job.id % 3 == 0 and job.id not in failed_once:
                    failed_once.add(job.id)  # every third job fails once
                    outcomes.append((job, Failure("transient")))
                else:
                    effects[job.message_id].append(job.id)
                    outcomes.append((job, None))
                await trio.lowlevel.checkpoint()
            await queue.ack(outcomes)

    with trio.fail_after(60):
        async with trio.open_nursery() as nursery:
            for n in range(6):
                nursery.start_soon(worker, f"w{n}")
    id_of = dict(zip(ids, jobs, strict=True))
    for m in messages:
        expected = sorted(i for i, job in id_of.items() if job.message_id == m)
        assert effects[m] == expected, m
    assert failed_once


# -- bad input: a clear error, nothing written ---------------------------------------

@pytest.mark.parametrize(("kwargs", "message"), [
    ({"job_type": "reindex"}, "unknown job type 'reindex'"),
    ({"tenant_slug": ""}, "tenant slug is empty"),
    ({"tenant_slug": "a" * 64}, "limit is 63"),
    ({"tenant_slug": "Acme Corp"}, "is invalid"),
    ({"tenant_slug": "-acme"}, "is invalid"),
    ({"tenant_slug": "acme_corp"}, "is invalid"),
    ({"message_id": ""}, "message id is empty"),
    ({"message_id": "x" * 999}, "limit is 998"),
    ({"message_id": "a\x00b"}, "NUL"),
    ({"payload": ["not", "an", "object"]}, "must be a JSON object"),
    ({"payload": {"body": "nul \x00 inside"}}, "NUL"),
    ({"payload": {"n\x00": 1}}, "NUL"),
    ({"payload": {"x": math.nan}}, "not serializable"),
    ({"payload": {"x": object()}}, "not serializable"),
    ({"payload": {"x": "\udcff"}}, "not valid Unicode"),
    ({"payload": {"body": "x" * MAX_PAYLOAD_BYTES}}, "the limit is 1048576"),
    ({"max_attempts": 0}, "max_attempts"),
    ({"delay_s": -1}, "delay"),
])
async def test_bad_jobs_are_rejected_and_write_nothing(
        queue: Queue, db: Database, kwargs: dict[str, object], message: str) -> None:
    fields: dict[str, object] = {"job_type": "index", "tenant_slug": "acme",
                                 "message_id": "m1", "payload": {}}
    fields.update(kwargs)
    with pytest.raises(InvalidJobError, match=message.replace("(", r"\(")):
        job = NewJob(**fields)  # type: ignore[arg-type]
        await queue.enqueue_many([job])
    assert await count_rows(db) == 0


async def test_payload_just_under_the_limit_is_accepted(queue: Queue) -> None:
    body = "x" * (MAX_PAYLOAD_BYTES - len('{"body": ""}'))
    job_id = await queue.enqueue_index("acme", "m1", {"body": body})
    assert (await queue.dequeue("w")).payload["body"] == body
    assert job_id


async def test_plain_sql_producers_are_held_to_the_same_rules(db: Database) -> None:
    from nexarch_events.errors import DatabaseError

    bad_rows = [
        "('reindex', 'acme', 'm1', '{}')",
        "('index', 'Bad Slug', 'm1', '{}')",
        "('index', 'acme', '', '{}')",
        "('index', 'acme', 'm1', '[1, 2]')",
    ]
    for values in bad_rows:
        with pytest.raises(DatabaseError) as info:
            await db.execute("INSERT INTO mail_index_jobs (job_type, tenant_slug, message_id, "
                             f"payload) VALUES {values}")
        assert info.value.sqlstate == "23514", values  # check_violation
        assert info.value.constraint and info.value.constraint.startswith("mail_index_jobs_")
    assert await count_rows(db) == 0


# -- notifications (the event contract, docs/events.md) -----------------------------

async def _next_notification(sub: Subscription) -> Notification:
    with trio.fail_after(10):
        while True:
            event = await sub.receive()
            if event is not RESYNC:
                assert isinstance(event, Notification)
                return event


async def _no_more_notifications(sub: Subscription, wait: float = 0.3) -> None:
    with trio.move_on_after(wait):
        event = await sub.receive()
        raise AssertionError(f"unexpected notification: {event}")


async def test_a_listener_killed_as_soon_as_it_listens_backs_off(db: Database) -> None:
    """A LISTEN connection killed right after each connect (a watchdog, a
    failover loop) was reconnected every reconnect_min, each time with a
    RESYNC for every subscriber and a WARNING: 77 in 10 s (a retry-loop
    audit). The backoff starts over only after a connection that lasted."""
    settings = QueueSettings(listener_ping_interval=1.0, listener_ping_timeout=1.0,
                             reconnect_min=0.05, reconnect_max=1.0)
    listener = Listener(db.dsn, settings, name="killed")
    sub = listener.subscribe(JOB_EVENTS_CHANNEL)
    async with trio.open_nursery() as nursery:
        await nursery.start(listener.run)
        started = trio.current_time()
        while trio.current_time() - started < 4.0:
            pid = listener.backend_pid
            if listener.connected and pid is not None:  # as soon as it listens
                await db.execute("SELECT pg_terminate_backend($1)", pid)
            await trio.sleep(0.005)
        # 0.05 s doubling to 1 s: about 8 connections in 4 s (every 50 ms
        # before: about 60). Each is a RESYNC.
        assert listener.connections <= 10, listener.connections
        resyncs = 0
        while True:
            with trio.move_on_after(0.05):
                event = await sub.receive()
                resyncs += event is RESYNC
                continue
            break
        assert 1 <= resyncs <= 10
        # Left alone, it stays up, and hears again.
        with trio.fail_after(5):
            while not listener.connected:
                await trio.sleep(0.02)
        nursery.cancel_scope.cancel()


async def test_a_handler_hears_each_notification_in_the_delivery_and_resync_on_reconnect(
        queue: Queue, db: Database, fast_settings: QueueSettings) -> None:
    """Listener.on_event (the workers' wake-ups): the handler hears every
    notification in order, and RESYNC after the first connect and after a
    reconnect (notifications sent meanwhile are gone: drain)."""
    listener = Listener(db.dsn, fast_settings)
    heard: list[object] = []

    def handler(event: Event) -> None:
        heard.append(event if isinstance(event, Resync) else event.json()["first_id"])

    listener.on_event(INDEX_JOBS_CHANNEL, handler)
    async with trio.open_nursery() as nursery:
        await nursery.start(listener.run)
        first = await queue.enqueue_index("acme", "m1", {})
        second = await queue.enqueue_index("acme", "m2", {})
        with trio.fail_after(10):
            while len(heard) < 3:
                await trio.sleep(0.01)
        assert heard == [RESYNC, first, second]
        await db.execute("SELECT pg_terminate_backend($1)", listener.backend_pid)
        with trio.fail_after(10):
            while listener.connections < 2 or not listener.connected:
                await trio.sleep(0.01)
        third = await queue.enqueue_index("acme", "m3", {})
        with trio.fail_after(10):
            while len(heard) < 5:
                await trio.sleep(0.01)
        assert heard[3:] == [RESYNC, third]
        nursery.cancel_scope.cancel()


@pytest.mark.parametrize("error", [ZeroDivisionError, DatabaseUnavailable])
async def test_a_handler_that_raises_ends_the_listener_with_its_error(
        queue: Queue, db: Database, fast_settings: QueueSettings,
        error: type[Exception]) -> None:
    """An exception of a handler is a bug in our code: it must end the
    listener's task (and with it the service, exit 70), not vanish inside
    asyncpg's callback while the workers are never woken again. Even a
    DatabaseError: taken for a lost connection, it would have had the
    listener reconnect for ever with nobody woken."""
    listener = Listener(db.dsn, fast_settings)

    def handler(event: Event) -> None:
        if event is not RESYNC:
            raise error("a bug")

    listener.on_event(INDEX_JOBS_CHANNEL, handler)
    with pytest.raises(ExceptionGroup) as raised, trio.fail_after(10):
        async with trio.open_nursery() as nursery:
            await nursery.start(listener.run)
            await queue.enqueue_index("acme", "m1", {})
            await trio.sleep_forever()
    assert raised.group_contains(error, match="a bug")
    assert listener.connections == 1


async def test_enqueue_notifies_once_per_statement(queue: Queue, db: Database,
                                                   fast_settings: QueueSettings) -> None:
    listener = Listener(db.dsn, fast_settings)
    sub = listener.subscribe(INDEX_JOBS_CHANNEL)
    async with trio.open_nursery() as nursery:
        await nursery.start(listener.run)
        ids = await queue.enqueue_many(
            [NewJob(JobType.INDEX, "acme", f"m{n}", {}) for n in range(1000)]
            + [NewJob(JobType.INDEX, "acme", "later", {}, delay_s=120)])
        note = await _next_notification(sub)
        assert note.channel == INDEX_JOBS_CHANNEL
        data = json.loads(note.payload)
        assert data["v"] == 1 and data["event"] == "enqueued"
        assert data["ready"] == 1000
        assert (data["first_id"], data["last_id"]) == (ids[0], ids[-1])
        assert data["next_due"] is not None
        assert len(note.payload.encode()) < 200
        await _no_more_notifications(sub)

        # A plain SQL INSERT by another program wakes workers too.
        await db.execute("INSERT INTO mail_index_jobs (job_type, tenant_slug, message_id) "
                         "VALUES ('delete', 'acme', 'm7')")
        data = json.loads((await _next_notification(sub)).payload)
        assert data["event"] == "enqueued" and data["ready"] == 1
        assert data["next_due"] is None
        nursery.cancel_scope.cancel()


async def test_released_and_reclaimed_jobs_announce_that_they_are_ready_again(
        queue: Queue, db: Database, fast_settings: QueueSettings) -> None:
    """docs/events.md's `released` and `reclaimed` payloads: the id range of
    the jobs ready again, and how many."""
    listener = Listener(db.dsn, fast_settings)
    wake = listener.subscribe(INDEX_JOBS_CHANNEL)
    async with trio.open_nursery() as nursery:
        await nursery.start(listener.run)
        ids = await queue.enqueue_many([NewJob(JobType.INDEX, "acme", f"m{n}", {})
                                        for n in range(3)])
        assert json.loads((await _next_notification(wake)).payload)["event"] == "enqueued"
        claimed = await queue.claim(10, "w")
        await queue.release(claimed[:2])
        data = json.loads((await _next_notification(wake)).payload)
        assert (data["v"], data["event"]) == (1, "released")
        assert (data["ready"], data["first_id"], data["last_id"]) == (2, ids[0], ids[1])
        await db.execute("UPDATE mail_index_jobs SET heartbeat_at = now() - interval '1 hour' "
                         "WHERE id = $1", ids[2])
        assert [r.id for r in await queue.reclaim_stale_jobs()] == [ids[2]]
        data = json.loads((await _next_notification(wake)).payload)
        assert (data["v"], data["event"]) == (1, "reclaimed")
        assert (data["first_id"], data["last_id"]) == (ids[2], ids[2])
        await _no_more_notifications(wake)
        nursery.cancel_scope.cancel()


async def test_acks_announce_outcomes_per_tenant_in_small_chunks(
        queue: Queue, db: Database, fast_settings: QueueSettings) -> None:
    listener = Listener(db.dsn, fast_settings)
    events = listener.subscribe(JOB_EVENTS_CHANNEL)
    wake = listener.subscribe(INDEX_JOBS_CHANNEL)
    async with trio.open_nursery() as nursery:
        await nursery.start(listener.run)
        await queue.enqueue_many(
            [NewJob(JobType.INDEX, "tenant-a", f"m{n}", {}) for n in range(450)]
            + [NewJob(JobType.INDEX, "tenant-b", "m1", {}) for _ in range(1)]
            + [NewJob(JobType.INDEX, "tenant-b", f"x{n}", {}) for n in range(2)])
        jobs = await queue.claim(1000, "w")
        b_jobs = [j for j in jobs if j.tenant_slug == "tenant-b"]
        outcomes: list[tuple[object, Failure | None]] = [
            (j, None) for j in jobs if j.tenant_slug == "tenant-a"]
        outcomes += [(b_jobs[0], Failure("bad", permanent=True)),
                     (b_jobs[1], Failure("again later")), (b_jobs[2], None)]
        await queue.ack(outcomes)  # type: ignore[arg-type]

        received = []
        for _ in range(5):  # 3 chunks for tenant-a, 1 success + 1 failure for tenant-b
            received.append(json.loads((await _next_notification(events)).payload))
        await _no_more_notifications(events)
        a_ids = [i for d in received if d["tenant"] == "tenant-a" for i in d["ids"]]
        assert sorted(a_ids) == sorted(j.id for j in jobs if j.tenant_slug == "tenant-a")
        assert all(len(d["ids"]) <= 200 for d in received)
        assert {(d["event"], d["tenant"], tuple(d["ids"])) for d in received
                if d["tenant"] == "tenant-b"} == {
            ("failed", "tenant-b", (b_jobs[0].id,)), ("succeeded", "tenant-b", (b_jobs[2].id,))}
        assert all(set(d) == {"v", "event", "tenant", "ids", "finished_at"} for d in received)
        # finished_at names the finish as the table holds it, in one form.
        for d in received:
            stamps = await db.fetch("SELECT DISTINCT nexarch_utc_stamp(finished_at) AS s "
                                    "FROM mail_index_jobs WHERE id = ANY($1::bigint[])", d["ids"])
            assert [r["s"] for r in stamps] == [d["finished_at"]]

        # The retry is announced on the index channel with its due time.
        while True:
            data = json.loads((await _next_notification(wake)).payload)
            if data["event"] == "retry_scheduled":
                break
        due = await db.fetchval("SELECT extract(epoch FROM available_at) FROM mail_index_jobs "
                                "WHERE id = $1", b_jobs[1].id)
        assert data["next_due"] == pytest.approx(float(due), abs=1e-3)
        nursery.cancel_scope.cancel()


async def test_schedule_reports_next_retry_and_oldest_heartbeat(queue: Queue) -> None:
    next_due, oldest, now = await queue.schedule()
    assert next_due is None and oldest is None
    await queue.enqueue_index("acme", "m1", {}, delay_s=30)
    await queue.enqueue_index("acme", "m2", {})
    await queue.dequeue("w")
    next_due, oldest, now = await queue.schedule()
    assert next_due is not None and oldest is not None
    assert timedelta(seconds=29) < next_due - now <= timedelta(seconds=31)
    assert oldest <= now


async def test_plain_sql_updates_of_identity_columns_are_validated(queue: Queue,
                                                                   db: Database) -> None:
    from nexarch_events.errors import DatabaseError

    job_id = await queue.enqueue_index("acme", "m1", {})
    for assignment in ("tenant_slug = 'Bad Slug'", "message_id = ''", "payload = '[1]'"):
        with pytest.raises(DatabaseError) as info:
            await db.execute(f"UPDATE mail_index_jobs SET {assignment} WHERE id = $1", job_id)
        assert info.value.sqlstate == "23514", assignment
    job = await queue.status(job_id)
    assert (job.tenant_slug, job.message_id) == ("acme", "m1")


async def test_ack_and_claim_in_one_statement(queue: Queue) -> None:
    index_id = await queue.enqueue_index("acme", "m1", {})
    delete_id = await queue.enqueue_delete("acme", "m1")
    other_id = await queue.enqueue_index("acme", "m2", {})
    first = await queue.claim(1, "w")
    assert [j.id for j in first] == [index_id]
    result, following = await queue.ack_and_claim([(first[0], None)], 10, "w")
    assert result.statuses == {index_id: JobStatus.SUCCEEDED} and result.refused == ()
    # The ack ran first: the delete queued behind the index is claimable now.
    assert [j.id for j in following] == [delete_id, other_id]
    result, nothing = await queue.ack_and_claim(
        [(following[0], None), (following[1], Failure("later"))], 10, "w")
    assert result.statuses == {delete_id: JobStatus.SUCCEEDED, other_id: JobStatus.PENDING}
    assert nothing == []


async def test_a_job_failed_by_the_sweeper_is_announced_with_its_finish(
        db: Database, fast_settings: QueueSettings) -> None:
    """The last attempt's worker died: the sweeper's "failed" names the
    finish as the table holds it (migration 0034), like an ack's."""
    queue = Queue(db, QueueSettings(stale_after=0.3, heartbeat_interval=0.1))
    listener = Listener(db.dsn, fast_settings)
    events = listener.subscribe(JOB_EVENTS_CHANNEL)
    async with trio.open_nursery() as nursery:
        await nursery.start(listener.run)
        job_id = await queue.enqueue_index("acme", "m1", {}, max_attempts=1)
        await queue.dequeue("dead-worker")
        await trio.sleep(0.5)
        assert await queue.reclaim_stale() == {job_id: JobStatus.FAILED}
        data = json.loads((await _next_notification(events)).payload)
        assert (data["event"], data["ids"]) == ("failed", [job_id])
        assert data["finished_at"] == await db.fetchval(
            "SELECT nexarch_utc_stamp(finished_at) FROM mail_index_jobs WHERE id = $1", job_id)
        nursery.cancel_scope.cancel()


async def test_the_ack_of_one_job_matches_the_batch_ack(
        queue: Queue, db: Database, fast_settings: QueueSettings) -> None:
    # Migration 0024 acks a single job with one UPDATE instead of the batch
    # statement; both must leave the same row and send the same notification.
    listener = Listener(db.dsn, fast_settings)
    events = listener.subscribe(JOB_EVENTS_CHANNEL)
    wake = listener.subscribe(INDEX_JOBS_CHANNEL)
    ack = ("SELECT id, status FROM {fn}($1::bigint[], $2::uuid[], $3::text[], $4::bool[], "
           "0.2, 3)")
    row_state = ("SELECT status, attempts, last_error, lease IS NULL AS no_lease, "
                 "locked_by IS NULL AS unlocked, heartbeat_at IS NULL AS no_heartbeat, "
                 "extract(epoch FROM available_at - CASE WHEN status = 'pending' "
                 "THEN updated_at ELSE created_at END) AS due_in, "
                 "finished_at = updated_at AS finished_now, finished_at IS NULL AS open "
                 "FROM mail_index_jobs WHERE id = $1")
    # (error, permanent, attempts already used before this one, lease kept)
    cases = {"success": (None, False, 0, True), "retry": ("later", False, 0, True),
             "permanent": ("bad", True, 0, True), "last attempt": ("again", False, 4, True),
             "lease taken over": (None, False, 0, False)}
    async with trio.open_nursery() as nursery:
        await nursery.start(listener.run)
        for name, (error, permanent, used, keep_lease) in cases.items():
            states, notes = [], []
            for fn in ("mail_index_jobs_ack", "mail_index_jobs_ack_batch"):
                job_id = await queue.enqueue_index("acme", f"{name}-{fn}", {})
                await db.execute("UPDATE mail_index_jobs SET attempts = $2 WHERE id = $1",
                                 job_id, used)
                job = await queue.dequeue("w")
                assert job.id == job_id
                await _next_notification(wake)  # its enqueue
                lease = job.lease if keep_lease else "00000000-0000-0000-0000-000000000000"
                rows = await db.fetch(ack.format(fn=fn), [job_id], [lease], [error], [permanent])
                returned = [(r["id"] == job_id, r["status"]) for r in rows]
                state = dict(await db.fetchrow(row_state, job_id))  # type: ignore[arg-type]
                sent = []
                if keep_lease and error is not None and not permanent and used < 4:
                    data = json.loads((await _next_notification(wake)).payload)
                    due = await db.fetchval("SELECT extract(epoch FROM available_at) "
                                            "FROM mail_index_jobs WHERE id = $1", job_id)
                    assert data.pop("next_due") == pytest.approx(float(due), abs=1e-3)
                    sent.append(data)
                elif keep_lease:
                    data = json.loads((await _next_notification(events)).payload)
                    assert data.pop("ids") == [job_id]
                    assert data.pop("finished_at") == await db.fetchval(
                        "SELECT nexarch_utc_stamp(finished_at) FROM mail_index_jobs "
                        "WHERE id = $1", job_id)
                    sent.append(data)
                states.append((returned, state))
                notes.append(sent)
                # A retried job falls due again soon: out of the next dequeue's way.
                await db.execute("DELETE FROM mail_index_jobs WHERE id = $1", job_id)
            await _no_more_notifications(events, wait=0.1)
            assert states[0] == states[1], name
            assert notes[0] == notes[1], name
            assert bool(notes[0]) == keep_lease, name
        nursery.cancel_scope.cancel()


async def test_outage_refunds_are_bounded_and_their_wait_doubles(db: Database) -> None:
    """An outage's refund had no bound and always waited the first backoff:
    a job whose own work looks like an outage (it kills its database
    session) ran every 10 s for ever and never ended failed (a review
    audit). Now the wait doubles, and past OUTAGE_RETRIES refunds an
    outage is charged like any failure."""
    from nexarch_events.queue.jobs import OUTAGE_RETRIES

    queue = Queue(db, QueueSettings(backoff_base=1.0, backoff_cap=1))
    job_id = await queue.enqueue_index("acme", "m1", {}, max_attempts=2)
    waits: list[float] = []
    statuses: list[JobStatus] = []
    for _ in range(OUTAGE_RETRIES + 2):
        await db.execute("UPDATE mail_index_jobs SET available_at = now() WHERE id = $1",
                         job_id)
        [job] = await queue.claim(1, "w")
        result = await queue.ack([(job, Failure("connection lost", outage=True))])
        statuses.append(result.statuses[job_id])
        waits.append(await db.fetchval(
            "SELECT extract(epoch FROM available_at - now()) FROM mail_index_jobs "
            "WHERE id = $1", job_id))
    row = await db.fetchrow("SELECT status, attempts, outage_retries FROM mail_index_jobs "
                            "WHERE id = $1", job_id)
    assert statuses[:OUTAGE_RETRIES] == [JobStatus.PENDING] * OUTAGE_RETRIES
    assert [round(w) for w in waits[:6]] == [1, 2, 4, 8, 16, 32]
    # The budget spent: the next outage costs attempt 1 of 2, the one after
    # that ends the job.
    assert statuses[OUTAGE_RETRIES:] == [JobStatus.PENDING, JobStatus.FAILED]
    assert (row["status"], row["attempts"], row["outage_retries"]) == \
        ("failed", 2, OUTAGE_RETRIES)
