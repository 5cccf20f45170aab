"""Retention: finished jobs past queue.retain_succeeded / retain_failed are
deleted in small batches, by the sweeper or ``Queue.prune``, never in the
way of claims, and never one that an older failed job of its message still
needs (a requeue must see that it was overtaken)."""

from __future__ import annotations

import trio

from nexarch_events.aio import Connection, Database
from nexarch_events.models import JobStatus, JobType, NewJob
from nexarch_events.queue.jobs import Queue
from nexarch_events.queue.sweeper import Sweeper
from nexarch_events.queue.worker import WakeUps
from nexarch_events.settings import QueueSettings
from tests.support.procs import job_rows

DAY = 86400.0


async def finished(db: Database, queue: Queue, message_id: str, status: str,
                   days_ago: float) -> int:
    """A job that finished ``days_ago`` days ago with ``status``."""
    job_id = int(await queue.enqueue_index("acme", message_id, {}))
    await db.execute(
        "UPDATE mail_index_jobs SET status = $2, attempts = 1, "
        "finished_at = now() - $3::float8 * interval '1 day' WHERE id = $1",
        job_id, status, days_ago)
    return job_id


async def test_prune_keeps_what_retention_keeps(db: Database) -> None:
    queue = Queue(db, QueueSettings(retain_succeeded=7 * DAY, retain_failed=30 * DAY))
    old_ok = await finished(db, queue, "a", "succeeded", 8)
    new_ok = await finished(db, queue, "b", "succeeded", 6)
    old_failed = await finished(db, queue, "c", "failed", 31)
    new_failed = await finished(db, queue, "d", "failed", 8)
    pending = int(await queue.enqueue_index("acme", "e", {}))
    # A failed index job kept, then a delete of the same message that
    # succeeded long ago: the delete stays while the failed job does.
    kept_failed = await finished(db, queue, "f", "failed", 20)
    overtaking = await finished(db, queue, "f", "succeeded", 10)

    assert await queue.prune(500) == 2
    left = set(await job_rows(db))
    assert left == {new_ok, new_failed, pending, kept_failed, overtaking}
    assert old_ok not in left and old_failed not in left
    requeued = await queue.requeue_failed(job_id=kept_failed)
    assert requeued.superseded == (kept_failed,), "the requeue would undo the newer delete"

    # Keep forever: 0.
    forever = Queue(db, QueueSettings(retain_succeeded=0, retain_failed=0))
    await db.execute("UPDATE mail_index_jobs SET finished_at = now() - interval '999 days' "
                     "WHERE finished_at IS NOT NULL")
    assert await forever.prune(500) == 0
    # The failed job goes first; the job that overtook it, on the next round.
    assert await queue.prune(500) == 3
    assert await queue.prune(500) == 1
    assert set(await job_rows(db)) == {pending}


async def test_prune_goes_in_small_batches_past_rows_someone_holds(
        db: Database, database_url: str) -> None:
    queue = Queue(db, QueueSettings(retain_succeeded=DAY))
    assert await queue.cursor_lost(0) is None  # nothing pruned yet
    ids = [await finished(db, queue, f"m{n}", "succeeded", 2) for n in range(12)]
    # A claimable job, and a finished row held by someone else's transaction.
    ready = int(await queue.enqueue_index("acme", "ready", {}))
    holder = await Connection.open(database_url)
    try:
        async with holder.transaction():
            await holder.execute("SELECT 1 FROM mail_index_jobs WHERE id = $1 FOR UPDATE",
                                 ids[0])
            with trio.fail_after(10):
                assert [await queue.prune(5) for _ in range(3)] == [5, 5, 1]
                # Claims go on meanwhile.
                assert [j.id for j in await queue.claim(10, "w")] == [ready]
    finally:
        await holder.aclose()
    assert set(await job_rows(db, ids)) == {ids[0]}
    assert await queue.cursor_lost(ids[1]) == "pruned"
    # Kept, but what finished after it was pruned: a stream cannot resume there.
    assert await queue.cursor_lost(ids[0]) == "later_pruned"
    assert await queue.cursor_lost(ready) is None
    # A stream opened before its tenant had a finished job resumes after
    # job 0: what was pruned since cannot be replayed either.
    assert await queue.cursor_lost(0) == "later_pruned"
    assert await queue.cursor_lost(0, tenant_slug="acme") == "later_pruned"


async def test_the_sweeper_prunes_a_backlog(db: Database) -> None:
    settings = QueueSettings(retain_succeeded=2.0, retain_failed=2.0, drain_interval=60.0)
    queue = Queue(db, settings)
    ids = [int(i) for i in await queue.enqueue_many(
        [NewJob(JobType.INDEX, "acme", f"m{n}", {}) for n in range(1200)])]
    for job in [await queue.claim(1200, "w")]:
        await queue.complete(job)
    assert (await queue.statuses(ids[:1])) == {ids[0]: JobStatus.SUCCEEDED}
    sweeper = Sweeper(queue, WakeUps(1), settings)
    with trio.fail_after(30):
        async with trio.open_nursery() as nursery:
            await nursery.start(sweeper.run)
            while await db.fetchval("SELECT count(*) FROM mail_index_jobs") > 0:
                await trio.sleep(0.1)
            nursery.cancel_scope.cancel()
    assert sweeper.pruned == 1200
