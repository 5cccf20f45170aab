"""Archive -> queue -> worker -> search index, end to end, in one process.

Waits are on the job-events channel (the event contract), never on sleeps.
"""

from __future__ import annotations

from collections.abc import AsyncIterator
from dataclasses import replace

import pytest
import trio

from nexarch_events.aio import Database
from nexarch_events.index.base import IndexBackend, SearchQuery
from nexarch_events.index.postgres import PostgresIndex
from nexarch_events.mail.archive import Archive, Location
from nexarch_events.mail.indexer import Indexer
from nexarch_events.models import JobStatus, JobType, NewJob
from nexarch_events.queue.jobs import Queue
from nexarch_events.queue.notify import JOB_EVENTS_CHANNEL, Notification, Subscription
from nexarch_events.reindex import reindex, verify
from nexarch_events.service import QueueService
from nexarch_events.settings import QueueSettings, Settings
from tests.support.mailgen import hostile_messages, realistic_messages, unique_token


class Pipeline:
    def __init__(self, db: Database, service: QueueService, backend: IndexBackend,
                 events: Subscription) -> None:
        self.db, self.service, self.backend, self.events = db, service, backend, events
        self.archive = Archive(db)
        self.queue: Queue = service.queue
        self.outcomes: dict[int, str] = {}

    async def wait_jobs(self, job_ids: set[int], within: float = 60) -> dict[int, str]:
        """Outcomes of these jobs, from job-events notifications."""
        with trio.fail_after(within):
            while not job_ids <= set(self.outcomes):
                event = await self.events.receive()
                if isinstance(event, Notification):
                    data = event.json()
                    for job_id in data.get("ids") or []:  # type: ignore[union-attr]
                        self.outcomes[int(job_id)] = str(data["event"])  # type: ignore[arg-type]
                else:  # RESYNC: read the table
                    for job_id, status in (await self.queue.statuses(sorted(job_ids))).items():
                        if status in (JobStatus.SUCCEEDED, JobStatus.FAILED):
                            self.outcomes[job_id] = status.value
        return {i: self.outcomes[i] for i in job_ids}

    async def search(self, text: str, tenant: str = "acme") -> list[int]:
        result = await self.backend.search(SearchQuery(tenant, text, limit=100))
        return [hit.archive_id for hit in result.hits]


@pytest.fixture
async def pipeline(db: Database, fast_settings: QueueSettings) -> AsyncIterator[Pipeline]:
    backend = PostgresIndex(db)
    settings = Settings(queue=fast_settings).with_queue(drain_interval=60.0, batch_size=20)
    service = QueueService(db, settings, Indexer(db, backend).handlers(),
                           listen_job_events=True)
    events = service.listener.subscribe(JOB_EVENTS_CHANNEL)
    async with trio.open_nursery() as nursery:
        await nursery.start(service.run)
        yield Pipeline(db, service, backend, events)
        nursery.cancel_scope.cancel()


async def test_archived_mail_becomes_searchable(pipeline: Pipeline) -> None:
    raws = list(realistic_messages(30, seed=1))
    stored = [await pipeline.archive.store("acme", raw, Location("INBOX", 1, n + 1))
              for n, raw in enumerate(raws)]
    outcomes = await pipeline.wait_jobs({s.job_id for s in stored if s.job_id})
    assert set(outcomes.values()) == {"succeeded"}
    for n, s in enumerate(stored):
        assert await pipeline.search(unique_token(n)) == [s.archive_id]
    assert await pipeline.search(unique_token(0), tenant="other") == []
    hit = (await pipeline.backend.search(SearchQuery("acme", unique_token(3),
                                                     mailbox="INBOX"))).hits[0]
    assert hit.archive_id == stored[3].archive_id


async def test_plain_sql_archive_then_enqueue_is_indexed(pipeline: Pipeline) -> None:
    """Another program archives with plain SQL and enqueues with plain SQL."""
    raw = next(iter(realistic_messages(1, seed=7)))
    archive_id = await pipeline.db.fetchval(
        "INSERT INTO mail_archive (tenant_slug, sha256, size_bytes, raw) "
        "VALUES ('acme', sha256($1), length($1), $1) RETURNING id", raw)
    job_id = await pipeline.db.fetchval(
        "INSERT INTO mail_index_jobs (job_type, tenant_slug, message_id) "
        "VALUES ('index', 'acme', $1) RETURNING id", str(archive_id))
    assert await pipeline.wait_jobs({job_id}) == {job_id: "succeeded"}
    assert await pipeline.search(unique_token(0)) == [archive_id]


async def test_delete_enqueued_after_index_wins(pipeline: Pipeline) -> None:
    raws = list(realistic_messages(40, seed=2))
    jobs: set[int] = set()
    deleted: list[int] = []
    kept: list[tuple[int, int]] = []
    for n, raw in enumerate(raws):
        stored = await pipeline.archive.store("acme", raw)
        assert stored.job_id is not None
        jobs.add(stored.job_id)
        if n % 2 == 0:
            # Deleted right away: the delete may be claimed before the index
            # job ran, and must still win.
            delete_job = await pipeline.archive.delete("acme", stored.archive_id)
            assert delete_job is not None
            jobs.add(delete_job)
            deleted.append(n)
        else:
            kept.append((n, stored.archive_id))
    assert set((await pipeline.wait_jobs(jobs)).values()) == {"succeeded"}
    for n in deleted:
        assert await pipeline.search(unique_token(n)) == []
    for n, archive_id in kept:
        assert await pipeline.search(unique_token(n)) == [archive_id]
    report = await verify(pipeline.db, pipeline.backend, "acme")
    assert report.consistent, report


async def test_hostile_messages_fail_alone_and_the_worker_goes_on(pipeline: Pipeline) -> None:
    good = list(realistic_messages(6, seed=3))
    jobs: dict[int, str] = {}
    archive_ids: dict[str, int] = {}
    hostile = hostile_messages()
    # Good and hostile interleaved, so that they share claim batches.
    for n, (name, raw) in enumerate(hostile):
        if n < len(good):
            stored = await pipeline.archive.store("acme", good[n])
            assert stored.job_id is not None
            jobs[stored.job_id] = f"good-{n}"
            archive_ids[f"good-{n}"] = stored.archive_id
        if not raw:
            continue  # the archive refuses empty input before any job exists
        stored = await pipeline.archive.store("acme", raw)
        if stored.job_id is not None:
            jobs[stored.job_id] = name
    outcomes = await pipeline.wait_jobs(set(jobs), within=180)
    for job_id, name in jobs.items():
        if name.startswith("good-"):
            assert outcomes[job_id] == "succeeded", name
            n = int(name.split("-")[1])
            assert await pipeline.search(unique_token(n)) == [archive_ids[name]]
        elif outcomes[job_id] == "failed":
            job = await pipeline.queue.status(job_id)
            assert job.last_error and job.last_error.startswith("cannot parse archived message"), \
                (name, job.last_error)
            assert job.attempts == 1  # permanent: no pointless retries
    # The worker survived all of it.
    after = await pipeline.archive.store("acme", next(iter(realistic_messages(1, seed=99))))
    assert after.job_id is not None
    assert await pipeline.wait_jobs({after.job_id}) == {after.job_id: "succeeded"}


async def test_caps_are_recorded_not_silent(pipeline: Pipeline) -> None:
    big = (b"From: a@example.org\r\nSubject: big\r\nContent-Type: text/plain\r\n\r\n"
           + b"capybara " + b"word " * 300_000)  # 1.5 MB of text: above the body cap
    stored = await pipeline.archive.store("acme", big)
    assert stored.job_id is not None
    assert await pipeline.wait_jobs({stored.job_id}) == {stored.job_id: "succeeded"}
    notes = await pipeline.db.fetchval("SELECT index_notes FROM mail_archive WHERE id = $1",
                                       stored.archive_id)
    assert notes and any("truncated" in note for note in notes), notes
    assert await pipeline.search("capybara") == [stored.archive_id]


async def test_jobs_that_do_not_name_an_archive_fail_clearly(pipeline: Pipeline) -> None:
    ids = await pipeline.queue.enqueue_many([
        NewJob(JobType.INDEX, "acme", "<not-an-archive-id@example.org>", {}),
        NewJob(JobType.DELETE, "acme", "-5", {}),
    ])
    outcomes = await pipeline.wait_jobs(set(ids))
    assert set(outcomes.values()) == {"failed"}
    first = await pipeline.queue.status(ids[0])
    assert first.last_error is not None and "is not an archive id" in first.last_error


async def test_a_delete_keyed_with_a_leading_zero_fails_instead_of_overtaking(
        pipeline: Pipeline) -> None:
    """The queue orders the jobs of one key; "01" is another key than "1",
    so a delete enqueued as "01" was claimed beside the index job "1" and,
    run first, left the message searchable (a search audit). It fails for
    good now, saying why; the message's own key still works."""
    [stored] = [await pipeline.archive.store("acme", raw)
                for raw in realistic_messages(1, seed=11)]
    assert stored.job_id is not None
    await pipeline.wait_jobs({stored.job_id})
    [padded] = await pipeline.queue.enqueue_many(
        [NewJob(JobType.DELETE, "acme", f"0{stored.archive_id}", {})])
    assert await pipeline.wait_jobs({padded}) == {padded: "failed"}
    status = await pipeline.queue.status(padded)
    assert status.attempts == 1 and status.last_error is not None \
        and "no leading zero" in status.last_error, status


async def test_an_archive_id_out_of_range_fails_its_job_not_the_batch(
        pipeline: Pipeline) -> None:
    """An id above 2^63-1 failed the batch's database statement: every job
    of the batch, other tenants' too, was retried and failed with it (a
    retry-loop audit). Now it fails alone, for good, saying why."""
    stored = [await pipeline.archive.store("acme", raw)
              for raw in realistic_messages(5, seed=7)]
    await pipeline.wait_jobs({s.job_id for s in stored if s.job_id is not None})
    bad = ["99999999999999999999", "9223372036854775808", "1_0", "+7", " 7", "0"]
    ids = await pipeline.queue.enqueue_many(
        [NewJob(JobType.INDEX, "acme", str(s.archive_id), {}) for s in stored]
        + [NewJob(JobType.INDEX, "evil", key, {}) for key in bad]
        + [NewJob(JobType.DELETE, "evil", bad[0], {})])
    outcomes = await pipeline.wait_jobs(set(ids))
    assert [outcomes[i] for i in ids] == ["succeeded"] * 5 + ["failed"] * (len(bad) + 1)
    for job_id in ids[5:]:
        status = await pipeline.queue.status(job_id)
        assert status.attempts == 1, status  # permanent: no retry
        assert status.last_error is not None and (
            "out of range" in status.last_error or "is not an archive id" in status.last_error)


async def test_reindex_rebuilds_and_verify_reports(db: Database,
                                                   fast_settings: QueueSettings) -> None:
    settings = Settings(queue=fast_settings).with_queue(drain_interval=60.0)
    backend = PostgresIndex(db)
    archive = Archive(db)
    stored = [await archive.store("acme", raw) for raw in realistic_messages(25, seed=4)]
    # No worker ran yet (their index jobs wait), and the index holds a stale
    # document the archive never had.
    await backend.upsert([_stale_document()])
    before = await verify(db, backend, "acme")
    assert len(before.missing) == 25 and before.extra == (999_999,)
    seen: list[tuple[int, int, int]] = []
    result = await reindex(db, settings, backend, "acme",
                           progress=lambda d, f, t: seen.append((d, f, t)))
    assert (result.indexed, result.removed, result.failed) == (25, 1, 0)
    assert seen[-1] == (26, 0, 26)
    after = await verify(db, backend, "acme")
    assert after.consistent and after.indexed == 25
    hits = [h.archive_id for h in (await backend.search(SearchQuery("acme",
                                                                    unique_token(5)))).hits]
    assert hits == [stored[5].archive_id]


async def test_reindex_counts_what_was_indexed_not_what_was_asked(
        db: Database, fast_settings: QueueSettings) -> None:
    """A text-search configuration the server does not have fails every
    index job: reindex said "2 message(s) indexed ... 2 failed" (an operator
    audit). Real Postgres, refusing the configuration by name."""
    settings = Settings(queue=fast_settings).with_queue(drain_interval=60.0)
    archive = Archive(db)
    for raw in realistic_messages(2, seed=5):
        await archive.store("acme", raw)
    broken = PostgresIndex(db, configs=("simple", "klingon"))
    result = await reindex(db, settings, broken, "acme")
    assert (result.indexed, result.removed, result.failed) == (0, 0, 2)


def _stale_document():  # type: ignore[no-untyped-def]
    from nexarch_events.index.base import IndexDocument

    return IndexDocument(archive_id=999_999, tenant_slug="acme", subject="stale", sender="",
                         sender_addresses=(), recipients="", body="gone", attachment_names=(),
                         attachment_text="", sent_at=None)


async def test_a_manticore_table_of_another_schema_fails_its_jobs_for_good(
        db: Database, fast_settings: QueueSettings) -> None:
    from nexarch_events.index.manticore import ManticoreBackend
    from tests.support.manticore_standin import open_manticore_standin

    async with open_manticore_standin() as standin, \
            ManticoreBackend(standin.url, verify=False) as backend:
        # A table an older release created, without the 'dated' column.
        await backend._call(  # the test plays the older release
            "/sql", b"CREATE TABLE nexarch_mail_acme (subject text, body text, sent_at bigint)",
            "text/plain", params={"mode": "raw"})
        settings = Settings(queue=fast_settings).with_queue(drain_interval=60.0)
        service = QueueService(db, settings, Indexer(db, backend).handlers(),
                               listen_job_events=True)
        events = service.listener.subscribe(JOB_EVENTS_CHANNEL)
        async with trio.open_nursery() as nursery:
            await nursery.start(service.run)
            pipeline = Pipeline(db, service, backend, events)
            stored = await pipeline.archive.store("acme", next(iter(realistic_messages(1))))
            assert stored.job_id is not None
            # Permanent: failed at the first attempt, not retried with backoff.
            assert await pipeline.wait_jobs({stored.job_id}, within=30) \
                == {stored.job_id: "failed"}
            row = await db.fetchrow("SELECT attempts, last_error FROM mail_index_jobs "
                                    "WHERE id = $1", stored.job_id)
            assert row is not None and row["attempts"] == 1
            assert "another schema" in row["last_error"]
            nursery.cancel_scope.cancel()


async def test_mail_in_decomposed_unicode_is_found_by_its_words(pipeline: Pipeline) -> None:
    """macOS writes "ü" as "u" + U+0308 (attachment names above all): such
    mail was found by no query with an umlaut, in either backend (found by
    an audit). Documents are composed (NFC) as queries are."""
    import unicodedata

    nfd = unicodedata.normalize("NFD", "Grüße aus Köln")
    raw = (f"From: a@example.org\r\nSubject: {nfd}\r\nMessage-ID: <nfd@x>\r\n"
           "Content-Type: text/plain; charset=utf-8\r\n\r\n"
           f"Viele {nfd}, und \ue000nicht\ue001 markiert\r\n").encode()
    stored = await pipeline.archive.store("acme", raw, Location("INBOX", 1, 1))
    assert stored.job_id is not None
    assert await pipeline.wait_jobs({stored.job_id}) == {stored.job_id: "succeeded"}
    for query in ("Grüße", "Köln", unicodedata.normalize("NFD", "Köln")):
        assert await pipeline.search(query) == [stored.archive_id], query
    [hit] = (await pipeline.backend.search(SearchQuery("acme", "markiert"))).hits
    assert hit.snippet.count("<mark>") == hit.snippet.count("</mark>") == 1


async def test_reindex_leaves_mail_archived_and_indexed_while_it_reads(
        db: Database, fast_settings: QueueSettings, monkeypatch: pytest.MonkeyPatch) -> None:
    """reindex read the archive's ids, then the index's: a message archived
    and indexed between the two reads looked like a stale document, and
    its delete job took live mail out of search (a race audit: 4-10 per
    round at 200 archived messages a second). Here the message arrives
    right after whichever read comes first."""
    from dataclasses import replace

    settings = Settings(queue=fast_settings).with_queue(drain_interval=60.0)
    archive = Archive(db)
    for raw in realistic_messages(3, seed=6):
        await archive.store("acme", raw)
    arrived: list[int] = []

    class Racing(PostgresIndex):
        async def document_ids(self, tenant_slug: str) -> set[int]:
            ids = await super().document_ids(tenant_slug)
            await arrive()
            return ids

    backend = Racing(db)
    real_ids = Archive.ids

    async def ids(self: Archive, tenant_slug: str) -> list[int]:
        found = await real_ids(self, tenant_slug)
        await arrive()
        return found

    async def arrive() -> None:
        if arrived:
            return
        stored = await archive.store("acme", next(iter(realistic_messages(1, seed=7))))
        arrived.append(stored.archive_id)
        # Indexed at once by some worker: its document is in the index.
        await PostgresIndex.upsert(backend, [replace(_stale_document(),
                                                     archive_id=stored.archive_id)])

    monkeypatch.setattr(Archive, "ids", ids)
    result = await reindex(db, settings, backend, "acme")
    assert arrived and result.removed == 0
    assert arrived[0] in await PostgresIndex.document_ids(backend, "acme")


async def test_an_index_outage_longer_than_the_retries_fails_no_job(
        db: Database, database_url: str, fast_settings: QueueSettings) -> None:
    """Each outage the handler met counted as an attempt: five in about
    100 s by default, and every message archived during a longer outage
    (a restart, a failover) was failed for good, never searchable (a
    crash audit). An outage is not charged now; the job waits it out. The
    outage is real: the index table is locked by another session, the
    worker's sessions give up after lock_timeout = 200ms; with
    backoff_base = 0.05 s the old code spent all five attempts in well
    under a second."""
    from tests.integration.test_faults import alter_database

    settings = Settings(queue=replace(fast_settings, backoff_base=0.05, backoff_cap=2))
    stored = await Archive(db).store("acme", next(iter(realistic_messages(1, seed=8))))
    await alter_database(db, "lock_timeout", "200ms")
    async with Database.open(database_url, max_size=5) as timed, db.acquire() as holder:
        service = QueueService(timed, settings, Indexer(timed, PostgresIndex(timed)).handlers())
        async with trio.open_nursery() as nursery:
            async with holder.transaction():
                await holder.execute("LOCK TABLE mail_search_documents IN ACCESS EXCLUSIVE MODE")
                await nursery.start(service.run)
                with trio.fail_after(30):
                    while service.pool.stats.retried < 6:
                        await trio.sleep(0.05)
                row = await db.fetchrow("SELECT status, attempts, last_error FROM "
                                        "mail_index_jobs WHERE id = $1", stored.job_id)
                assert row["status"] == "pending" and row["attempts"] == 0
                assert "55P03" in row["last_error"]
            with trio.fail_after(30):
                while (await Queue(db).status(stored.job_id)).status != JobStatus.SUCCEEDED:
                    await trio.sleep(0.05)
            nursery.cancel_scope.cancel()
    found = await PostgresIndex(db).search(SearchQuery("acme", unique_token(0), limit=5))
    assert [h.archive_id for h in found.hits] == [stored.archive_id]
