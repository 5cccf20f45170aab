"""Index writes fenced by the lease (guarantee 15), on both backends.

A zombie is a worker whose lease was taken over: the sweeper thought it
dead, another worker ran its job again, and later jobs of the same message
ran too. Its write may still reach the index afterwards. Here the zombie is
the real Indexer handler, paused just before its backend call (a gate), on
jobs claimed, reclaimed and re-run through the real queue in real Postgres.
Manticore is the in-process stand-in (tests/support/manticore_standin.py,
answering as the real server does: insert refuses an existing id, a /bulk is
one transaction), or a real server when MANTICORE_URL is set.
"""

from __future__ import annotations

import random
from collections.abc import AsyncIterator, Awaitable, Callable, Sequence
from functools import partial

import pytest
import trio

from nexarch_events.aio import Database
from nexarch_events.index.base import IndexBackend, IndexDocument, SearchQuery, WriteFence
from nexarch_events.lifecycle.erasure import Eraser
from nexarch_events.mail.archive import Archive
from nexarch_events.mail.indexer import Indexer
from nexarch_events.models import ClaimedJob, JobId, JobStatus
from nexarch_events.queue.jobs import Queue
from nexarch_events.queue.notify import JOB_EVENTS_CHANNEL, Notification
from nexarch_events.reindex import verify
from nexarch_events.service import QueueService
from nexarch_events.settings import QueueSettings, Settings
from tests.support.backends import open_backend
from tests.support.mailgen import realistic_messages, unique_token

TENANT = "acme"

#: Ages the heartbeats of jobs still held under the given leases, so that the
#: sweeper's own reclaim statement (queue.reclaim_stale) takes them over.
AGE_HEARTBEATS = """
UPDATE mail_index_jobs j SET heartbeat_at = now() - interval '1 hour'
  FROM unnest($1::bigint[], $2::uuid[]) AS a(id, lease)
 WHERE j.id = a.id AND j.lease = a.lease
"""
STILL_HELD = """
SELECT count(*) FROM mail_index_jobs j, unnest($1::bigint[], $2::uuid[]) AS a(id, lease)
 WHERE j.id = a.id AND j.lease = a.lease
"""


@pytest.fixture(params=["postgres", "manticore"])
async def backend(request: pytest.FixtureRequest, db: Database) -> AsyncIterator[IndexBackend]:
    async with open_backend(request.param, db) as opened:
        await opened.ensure_schema(TENANT)
        try:
            yield opened
        finally:
            drop = getattr(opened, "drop_schema", None)
            if drop is not None:
                await drop(TENANT)


async def take_over(db: Database, queue: Queue, jobs: Sequence[ClaimedJob]) -> None:
    """What happens to a worker that stops heartbeating: the sweeper
    reclaims its jobs (retried while a heartbeat keeps getting in between)."""
    ids, leases = [j.id for j in jobs], [j.lease for j in jobs]
    with trio.fail_after(30):
        while await db.fetchval(STILL_HELD, ids, leases):
            await db.execute(AGE_HEARTBEATS, ids, leases)
            await queue.reclaim_stale()


async def run_alone(queue: Queue, indexer: Indexer, expected: JobId) -> None:
    """Claim the next job as a healthy worker, run its handler, ack it."""
    jobs = await queue.claim(10, "healthy")
    assert [j.id for j in jobs] == [expected]
    handler = indexer.handlers()[jobs[0].job_type.value]
    failures = await handler(jobs)
    result = await queue.ack([(job, failures.get(job.id)) for job in jobs])
    assert result.statuses == {expected: JobStatus.SUCCEEDED}


async def found(backend: IndexBackend, text: str) -> list[int]:
    result = await backend.search(SearchQuery(TENANT, text, limit=100))
    return [hit.archive_id for hit in result.hits]


class Gate:
    """An IndexBackend whose writes wait until ``opened`` (the zombie's
    pause: it loaded and parsed, then stalled before writing)."""

    def __init__(self, inner: IndexBackend) -> None:
        self.inner = inner
        self.name = inner.name
        self.fences_in_database = inner.fences_in_database
        self.reached = trio.Event()
        self.opened = trio.Event()

    async def ensure_schema(self, tenant_slug: str) -> None:
        await self.inner.ensure_schema(tenant_slug)

    async def upsert(self, documents: Sequence[IndexDocument],
                     fences: Sequence[WriteFence] | None = None) -> None:
        self.reached.set()
        await self.opened.wait()
        await self.inner.upsert(documents, fences)

    async def delete(self, tenant_slug: str, archive_ids: Sequence[int],
                     fences: Sequence[WriteFence] | None = None) -> None:
        self.reached.set()
        await self.opened.wait()
        await self.inner.delete(tenant_slug, archive_ids, fences)


async def test_a_zombie_index_write_after_an_erasure_leaves_the_message_unsearchable(
        db: Database, backend: IndexBackend, fast_settings: QueueSettings) -> None:
    queue = Queue(db, fast_settings)
    archive = Archive(db)
    healthy = Indexer(db, backend)
    gate = Gate(backend)
    zombie = Indexer(db, gate)  # type: ignore[arg-type]
    raw = next(iter(realistic_messages(1, seed=41)))
    stored = await archive.store(TENANT, raw)
    assert stored.job_id is not None

    async with trio.open_nursery() as nursery:
        # The zombie claims the index job, loads and parses the message, stalls.
        claimed = await queue.claim(10, "zombie")
        assert [j.id for j in claimed] == [stored.job_id]
        zombie_failures: dict[JobId, object] = {}

        async def zombie_runs() -> None:
            zombie_failures.update(await zombie.index_batch(claimed))

        nursery.start_soon(zombie_runs)
        await gate.reached.wait()
        # Its lease is taken over; a healthy worker indexes the message again.
        await take_over(db, queue, claimed)
        await run_alone(queue, healthy, stored.job_id)
        assert await found(backend, unique_token(0)) == [stored.archive_id]
        # Erasure: the archive row goes and a delete job is enqueued (one
        # transaction); the healthy worker removes the document.
        delete_job = await archive.delete(TENANT, stored.archive_id)
        assert delete_job is not None
        await run_alone(queue, healthy, delete_job)
        assert await found(backend, unique_token(0)) == []
        # The zombie wakes up and writes what it parsed long ago.
        gate.opened.set()
    assert zombie_failures == {}  # it believes it succeeded ...
    result = await queue.ack([(job, None) for job in claimed])
    assert set(result.refused) == {stored.job_id}  # ... but its ack is refused
    # ... and its write changed nothing: the erased message stays unsearchable.
    assert await found(backend, unique_token(0)) == []
    assert await found(backend, "") == []
    assert stored.archive_id not in await backend.document_ids(TENANT)
    report = await verify(db, backend, TENANT)
    assert report.consistent, report


async def test_a_zombie_write_after_its_whole_tenant_was_erased_finds_nothing_to_revive(
        db: Database, backend: IndexBackend, fast_settings: QueueSettings) -> None:
    """Erasing a tenant drops its index table, and with it Manticore's
    tombstones: a zombie's late write would create the table again and bring
    the erased message back. The Indexer looks up erased ids after a write
    that the database could not fence (mail_erasures) and deletes them again."""
    queue = Queue(db, fast_settings)
    archive = Archive(db)
    healthy = Indexer(db, backend)
    gate = Gate(backend)
    zombie = Indexer(db, gate)  # type: ignore[arg-type]
    raw = next(iter(realistic_messages(1, seed=47)))
    stored = await archive.store(TENANT, raw)
    assert stored.job_id is not None

    async with trio.open_nursery() as nursery:
        claimed = await queue.claim(10, "zombie")
        assert [j.id for j in claimed] == [stored.job_id]
        nursery.start_soon(zombie.index_batch, claimed)
        await gate.reached.wait()
        await take_over(db, queue, claimed)
        await run_alone(queue, healthy, stored.job_id)
        assert await found(backend, unique_token(0)) == [stored.archive_id]
        # Eraser.erase_tenant's order, with a fast worker: the batch's
        # erasure commits, a worker runs its delete job (tombstone), then the
        # tenant's table is dropped (the tombstone with it).
        erased = await Eraser(db, backend).erase(TENANT, [stored.archive_id], actor="test")
        [delete_job] = erased.delete_jobs
        await run_alone(queue, healthy, delete_job)
        await backend.drop_tenant(TENANT)
        assert await found(backend, unique_token(0)) == []
        gate.opened.set()  # the zombie writes what it parsed before the erasure
    assert await found(backend, unique_token(0)) == []
    assert await found(backend, "") == []
    assert stored.archive_id not in await backend.document_ids(TENANT)


async def test_a_zombie_delete_after_a_newer_index_leaves_the_document(
        db: Database, backend: IndexBackend, fast_settings: QueueSettings) -> None:
    """The other direction: an old delete landing late never removes what a
    later job wrote (here a re-index of a message still in the archive)."""
    queue = Queue(db, fast_settings)
    archive = Archive(db)
    healthy = Indexer(db, backend)
    gate = Gate(backend)
    zombie = Indexer(db, gate)  # type: ignore[arg-type]
    raw = next(iter(realistic_messages(1, seed=43)))
    stored = await archive.store(TENANT, raw)
    assert stored.job_id is not None
    await run_alone(queue, healthy, stored.job_id)
    key = str(stored.archive_id)
    delete_job = await queue.enqueue_delete(TENANT, key)

    async with trio.open_nursery() as nursery:
        claimed = await queue.claim(10, "zombie")
        assert [j.id for j in claimed] == [delete_job]
        nursery.start_soon(zombie.delete_batch, claimed)
        await gate.reached.wait()
        await take_over(db, queue, claimed)
        await run_alone(queue, healthy, delete_job)
        assert await found(backend, unique_token(0)) == []
        reindex_job = await queue.enqueue_index(TENANT, key, {})
        await run_alone(queue, healthy, reindex_job)
        assert await found(backend, unique_token(0)) == [stored.archive_id]
        gate.opened.set()
    assert set((await queue.ack([(job, None) for job in claimed])).refused) == {delete_job}
    assert await found(backend, unique_token(0)) == [stored.archive_id]
    assert (await verify(db, backend, TENANT)).consistent


async def test_a_write_under_a_lease_still_held_lands(
        db: Database, backend: IndexBackend, fast_settings: QueueSettings) -> None:
    """The fence lets the lease holder through (index, then delete)."""
    queue = Queue(db, fast_settings)
    archive = Archive(db)
    indexer = Indexer(db, backend)
    stored = [await archive.store(TENANT, raw) for raw in realistic_messages(3, seed=44)]
    jobs = await queue.claim(10, "healthy")
    assert {j.id for j in jobs} == {s.job_id for s in stored}
    assert await indexer.index_batch(jobs) == {}
    assert await found(backend, unique_token(1)) == [stored[1].archive_id]
    deletes = [await archive.delete(TENANT, stored[1].archive_id)]
    assert (await queue.ack([(job, None) for job in jobs])).refused == ()
    claimed = await queue.claim(10, "healthy")
    assert [j.id for j in claimed] == deletes
    assert await indexer.delete_batch(claimed) == {}
    assert await found(backend, unique_token(1)) == []
    assert await found(backend, unique_token(2)) == [stored[2].archive_id]


# -- an erasure racing a re-index, with zombies, through the real workers -------


class Zombies:
    """An IndexBackend that turns some writes into zombie writes: before
    writing, it has the sweeper take the job over (its heartbeat aged, as if
    the process had stalled), waits until the job and the jobs after it on the
    same message have run on other workers (bounded), then writes with the
    old lease, as a stalled process that wakes up would.

    Only once ``armed``: then the first ``sure`` writes always turn (a test
    that depends on a random share of however many batches the workers
    happened to form made 0-2 zombies in some runs), later ones at random."""

    def __init__(self, inner: IndexBackend, db: Database, queue: Queue, *, seed: int,
                 share: float = 0.3, at_once: int = 2, sure: int = 2) -> None:
        self.inner, self.db, self.queue = inner, db, queue
        self.name, self.fences_in_database = inner.name, inner.fences_in_database
        self.random = random.Random(seed)
        self.share, self.at_once, self.sure = share, at_once, sure
        self.armed = False
        self.started = 0
        self.active = 0
        self.turned: set[int] = set()
        self.zombie_writes = 0

    async def ensure_schema(self, tenant_slug: str) -> None:
        await self.inner.ensure_schema(tenant_slug)

    def _turns(self, fences: Sequence[WriteFence] | None) -> bool:
        if not fences or not self.armed or self.active >= self.at_once:
            return False
        if self.started >= self.sure and self.random.random() >= self.share:
            return False
        return not any(f.job_id in self.turned for f in fences)

    async def _write(self, fences: Sequence[WriteFence] | None,
                     write: Callable[[], Awaitable[None]]) -> None:
        if not self._turns(fences):
            await write()
            return
        # A stalled process cannot be stopped by its own lease watch (the
        # worker stops a handler whose lease was lost; a frozen one does
        # not run): the stall and the write that follows are shielded.
        with trio.CancelScope(shield=True):
            await self._stall(fences)
            await write()

    async def _stall(self, fences: Sequence[WriteFence] | None) -> None:
        assert fences
        self.started += 1
        self.active += 1
        try:
            self.turned.update(f.job_id for f in fences)
            ids, leases = [f.job_id for f in fences], [f.lease for f in fences]
            with trio.move_on_after(20):
                while await self.db.fetchval(STILL_HELD, ids, leases):
                    await self.db.execute(AGE_HEARTBEATS, ids, leases)
                    await self.queue.reclaim_stale()
            # Wait (bounded) until no job of these messages is open any more.
            with trio.move_on_after(3):
                while await self.db.fetchval(
                        "SELECT count(*) FROM mail_index_jobs o, mail_index_jobs j "
                        "WHERE j.id = ANY($1::bigint[]) AND o.tenant_slug = j.tenant_slug "
                        "AND o.message_id = j.message_id "
                        "AND o.status IN ('pending', 'processing')", ids):
                    await trio.sleep(0.05)
            self.zombie_writes += 1
        finally:
            self.active -= 1

    async def upsert(self, documents: Sequence[IndexDocument],
                     fences: Sequence[WriteFence] | None = None) -> None:
        await self._write(fences, partial(self.inner.upsert, documents, fences))

    async def delete(self, tenant_slug: str, archive_ids: Sequence[int],
                     fences: Sequence[WriteFence] | None = None) -> None:
        await self._write(fences, partial(self.inner.delete, tenant_slug, archive_ids, fences))


async def test_an_erasure_racing_a_reindex_always_wins(
        db: Database, backend: IndexBackend, fast_settings: QueueSettings) -> None:
    """Messages are indexed; then, for each, a re-index and an erasure are
    enqueued concurrently in random order and timing, while 4 workers run
    them and some of their writes turn into zombie writes. Every erased
    message ends unsearchable, every kept one searchable."""
    rng = random.Random(7)
    queue = Queue(db, fast_settings)
    zombies = Zombies(backend, db, queue, seed=8)
    settings = Settings(queue=fast_settings).with_queue(drain_interval=60.0, batch_size=5)
    service = QueueService(db, settings, Indexer(db, zombies).handlers(),  # type: ignore[arg-type]
                           listen_job_events=True)
    events = service.listener.subscribe(JOB_EVENTS_CHANNEL)
    archive = Archive(db)
    outcomes: dict[int, str] = {}

    async def wait_jobs(job_ids: set[int]) -> None:
        with trio.fail_after(120):
            while not job_ids <= set(outcomes):
                event = await events.receive()
                if isinstance(event, Notification):
                    data = event.json()
                    for job_id in data.get("ids") or []:  # type: ignore[union-attr]
                        outcomes[int(job_id)] = str(data["event"])  # type: ignore[arg-type]
                else:
                    for job_id, status in (await queue.statuses(sorted(job_ids))).items():
                        if status in (JobStatus.SUCCEEDED, JobStatus.FAILED):
                            outcomes[job_id] = status.value

    raws = list(realistic_messages(24, seed=45))
    async with trio.open_nursery() as nursery:
        await nursery.start(service.run)
        stored = [await archive.store(TENANT, raw) for raw in raws]
        await wait_jobs({s.job_id for s in stored if s.job_id is not None})
        zombies.armed = True  # zombies in the race, not in the first indexing
        jobs: set[int] = set()
        erased: list[int] = []

        async def reindex(archive_id: int) -> None:
            await trio.sleep(rng.random() * 0.05)
            jobs.add(await queue.enqueue_index(TENANT, str(archive_id), {}))

        async def erase(archive_id: int) -> None:
            await trio.sleep(rng.random() * 0.05)
            job = await archive.delete(TENANT, archive_id)
            assert job is not None
            jobs.add(job)

        async with trio.open_nursery() as racers:
            for n, s in enumerate(stored):
                racers.start_soon(reindex, s.archive_id)
                if n % 3 != 2:
                    erased.append(n)
                    racers.start_soon(erase, s.archive_id)
        await wait_jobs(jobs)
        # The zombies' refused acks and re-runs settle: nothing open remains,
        # and every zombie has written (stopping earlier cancelled a zombie
        # that was about to write: the case under test, silently skipped).
        with trio.fail_after(60):
            while zombies.active or await db.fetchval(
                    "SELECT count(*) FROM mail_index_jobs "
                    "WHERE status IN ('pending', 'processing')"):
                await trio.sleep(0.1)
        nursery.cancel_scope.cancel()
    assert zombies.zombie_writes >= zombies.sure, "too few zombie writes to mean much"
    for n, s in enumerate(stored):
        expected = [] if n in erased else [s.archive_id]
        assert await found(backend, unique_token(n)) == expected, (n, s.archive_id)
    report = await verify(db, backend, TENANT)
    assert report.consistent, report
