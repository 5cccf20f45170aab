"""Index consistency: compare the index with the archive, and rebuild it.

``reindex`` goes through the queue rather than writing the index directly:
an index job per archived message and a delete job per document the archive
no longer has. The queue orders them with any concurrent delete of the same
message (guarantee 3), so a rebuild can never resurrect a deleted message.
It runs workers of its own, so it also completes when no worker runs.

``verify`` reads the index before the archive: a document indexed after the
index was read cannot look "extra", so ``repair`` (an index job per missing
message, a delete job per extra document, through the queue) never deletes
the document of mail archived meanwhile. Extra documents of messages that
were erased (``mail_erasures``) are reported apart: erased mail that search
could still find.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

import trio

from .aio import Database
from .db import sqlfiles
from .index.base import IndexBackend
from .mail.archive import Archive
from .mail.indexer import Indexer
from .models import JobId, JobType, NewJob, validate_tenant_slug
from .queue.jobs import Queue
from .queue.notify import JOB_EVENTS_CHANNEL, Notification
from .service import QueueService
from .settings import Settings

Progress = Callable[[int, int, int], None]  # done, failed, total
_LIFECYCLE_SQL = sqlfiles.queries("lifecycle.sql")


@dataclass(frozen=True, slots=True)
class IndexReport:
    tenant_slug: str
    archived: int
    indexed: int
    #: archived but not in the index
    missing: tuple[int, ...]
    #: in the index but not archived (any more)
    extra: tuple[int, ...]
    #: of ``extra``: messages that were erased (search can still find them)
    erased: tuple[int, ...] = ()

    @property
    def consistent(self) -> bool:
        return not self.missing and not self.extra


@dataclass(frozen=True, slots=True)
class ReindexResult:
    tenant_slug: str
    indexed: int
    removed: int
    failed: int


async def verify(db: Database, backend: IndexBackend, tenant_slug: str) -> IndexReport:
    validate_tenant_slug(tenant_slug)
    indexed = await backend.document_ids(tenant_slug)  # first: see the module docstring
    archived = set(await Archive(db).ids(tenant_slug))
    extra = sorted(indexed - archived)
    erased = sorted(r["archive_id"] for r in await db.fetch(
        _LIFECYCLE_SQL["erased_ids"], tenant_slug, extra)) if extra else []
    return IndexReport(tenant_slug, len(archived), len(indexed),
                       tuple(sorted(archived - indexed)), tuple(extra), tuple(erased))


async def repair(db: Database, report: IndexReport) -> list[JobId]:
    """Enqueue what brings the index in line with the archive ``report``
    found: an index job per missing message, a delete job per extra
    document, unless that job is already queued (a repair run twice before
    the workers caught up queued every job twice). Returns the new jobs;
    the workers (a running service) do them."""
    queue = Queue(db)
    tenant = report.tenant_slug
    missing = [str(i) for i in report.missing]
    extra = [str(i) for i in report.extra]
    queued_index = await queue.open_keys(tenant, JobType.INDEX, missing) if missing else set()
    queued_delete = await queue.open_keys(tenant, JobType.DELETE, extra) if extra else set()
    jobs = [NewJob(JobType.INDEX, tenant, key, {"archive_id": int(key), "repair": True})
            for key in missing if key not in queued_index]
    jobs += [NewJob(JobType.DELETE, tenant, key, {"repair": True})
             for key in extra if key not in queued_delete]
    out: list[JobId] = []
    for start in range(0, len(jobs), 5000):
        out.extend(await queue.enqueue_many(jobs[start:start + 5000]))
    return out


async def reindex(db: Database, settings: Settings, backend: IndexBackend, tenant_slug: str,
                  progress: Progress | None = None) -> ReindexResult:
    """Rebuild one tenant's index from the archive. Blocks until every job it
    enqueued has finished (succeeded or failed for good)."""
    validate_tenant_slug(tenant_slug)
    # The index first, as verify does: a message archived and indexed
    # between the two reads is then in both, where in the other order it
    # looked like a stale document, and its delete job took a live
    # message out of search (a race audit).
    indexed = await backend.document_ids(tenant_slug)
    archived = await Archive(db).ids(tenant_slug)
    extra = sorted(indexed - set(archived))
    jobs = [NewJob(JobType.INDEX, tenant_slug, str(i), {"archive_id": i, "reindex": True})
            for i in archived]
    jobs += [NewJob(JobType.DELETE, tenant_slug, str(i)) for i in extra]
    if not jobs:
        return ReindexResult(tenant_slug, 0, 0, 0)
    await backend.ensure_schema(tenant_slug)
    service = QueueService(db, settings, Indexer(db, backend).handlers(), name="reindex",
                           listen_job_events=True)
    events = service.listener.subscribe(JOB_EVENTS_CHANNEL)
    pending: set[int] = set()
    enqueued: list[int] = []
    done = failed = 0
    failed_ids: set[int] = set()
    total = len(jobs)
    async with trio.open_nursery() as nursery:
        # Listening before enqueuing: no outcome can be missed.
        await nursery.start(service.run)
        for start in range(0, len(jobs), 5000):
            enqueued.extend(await service.queue.enqueue_many(jobs[start:start + 5000]))
        pending.update(enqueued)
        if progress:
            progress(0, 0, total)
        async for event in events:
            if not isinstance(event, Notification):
                # Missed notifications: ask the table which of ours are finished.
                statuses = await service.queue.statuses(sorted(pending))
                for job_id, status in statuses.items():
                    if status in ("succeeded", "failed"):
                        pending.discard(job_id)
                        done += 1
                        if status == "failed":
                            failed += 1
                            failed_ids.add(job_id)
            else:
                data = event.json()
                ids = data.get("ids")
                for finished in ids if isinstance(ids, list) else []:
                    if isinstance(finished, int) and finished in pending:
                        pending.discard(finished)
                        done += 1
                        if data.get("event") == "failed":
                            failed += 1
                            failed_ids.add(finished)
            if progress:
                progress(done, failed, total)
            if not pending:
                break
        await service.shutdown()
    # What succeeded, not what was asked for: with every job failing it said
    # "2 message(s) indexed ... 2 failed" (an operator audit).
    failed_index = len(failed_ids & set(enqueued[:len(archived)]))
    return ReindexResult(tenant_slug, indexed=len(archived) - failed_index,
                         removed=len(extra) - (len(failed_ids) - failed_index), failed=failed)
