"""The job handlers that keep a search index in step with the archive.

index jobs: load the archived bytes, parse them (in a worker thread, so the
trio loop keeps heartbeating and waking), write the batch with ONE backend
call. delete jobs: one backend call per tenant.

One bad message fails one job: a message that cannot be parsed fails its job
permanently with the parser's message; if the backend rejects a batch, the
batch is split in halves until the rejected documents are isolated, and the
rest are written.

Every write is fenced by its job (``WriteFence``: the job id and the lease
the ``ClaimedJob`` carries): a worker whose lease was taken over while it
parsed or stalled writes nothing that could undo a later job, so a late
index write cannot bring back a message a delete job removed (guarantee
15; how each backend keeps it: index/postgres.py, index/manticore.py).
"""

from __future__ import annotations

import json
import logging
from collections.abc import Mapping, Sequence
from dataclasses import replace

import trio

from ..aio import Database
from ..db import sqlfiles
from ..errors import DatabaseTransient, is_outage
from ..index.base import (
    IndexBackend,
    IndexDocument,
    IndexRejected,
    IndexUnavailable,
    WriteFence,
)
from ..models import ClaimedJob, Failure, JobId
from ..queue.worker import BatchHandler
from . import mime
from .archive import Archive, StoredMessage

log = logging.getLogger(__name__)
_SQL = sqlfiles.queries("archive.sql")


#: Batches up to this many raw bytes are parsed on the trio thread.
INLINE_PARSE_BYTES = 256 * 1024


class NotAnArchiveId(ValueError):
    pass


#: Archive ids are Postgres bigints.
MAX_ARCHIVE_ID = 2**63 - 1


def archive_id_of(job: ClaimedJob) -> int:
    """Jobs for archived mail carry the archive id as their queue key: ASCII
    digits (``int()`` alone also takes " 7", "+7" and "1_0"), 1..2^63-1. A
    larger number failed the database statement of the whole batch, every
    tenant's jobs in it, until all had failed (a retry-loop audit)."""
    key = job.message_id
    if not (key.isascii() and key.isdigit()):
        raise NotAnArchiveId(
            f"message id {key[:80]!r} is not an archive id "
            "(index and delete jobs name the archived message by its id)")
    if key.startswith("0"):
        # "01" is not archive id 1's key: the queue orders the jobs of one
        # key (guarantee 3), and a delete enqueued as "01" ran beside, or
        # before, the index job "1" it must follow (a search audit).
        raise NotAnArchiveId(
            f"message id {key[:80]!r} is not an archive id as the archive writes it "
            f"(no leading zero): jobs of one message must share its key")
    value = int(key[:30])
    if not 1 <= value <= MAX_ARCHIVE_ID or len(key) > 30:
        raise NotAnArchiveId(f"archive id {key[:30]}{'...' if len(key) > 30 else ''} is out "
                             f"of range (1..{MAX_ARCHIVE_ID})")
    return value


def fence_of(job: ClaimedJob) -> WriteFence:
    """The fence of a write made for this job (index/base.py)."""
    return WriteFence(job.id, job.lease)


def _parse(stored: StoredMessage, max_text_chars: int
           ) -> tuple[IndexDocument | None, str | None, tuple[str, ...]]:
    """(document, error, notes): runs in a worker thread."""
    try:
        parsed = mime.parse_message(stored.raw, max_text_chars=max_text_chars)
    except mime.MimeError as exc:
        return None, f"cannot parse archived message {stored.archive_id}: {exc}", ()
    document = mime.to_index_document(parsed, archive_id=stored.archive_id,
                                      tenant_slug=stored.tenant_slug,
                                      mailboxes=stored.mailboxes, size_bytes=stored.size_bytes)
    document = replace(document, received_at=stored.received_at)
    if document.sent_at is None and stored.received_at is not None:
        # No (usable) Date header: the server's received date is the best we have.
        document = replace(document, sent_at=stored.received_at)
    return document, None, parsed.notes



def index_failure(exc: IndexUnavailable | IndexRejected) -> Failure:
    """A job's failure for the index's error: a refusal is permanent, an
    outage is not charged (Failure.outage), anything else is retried."""
    if isinstance(exc, IndexRejected):
        return Failure(str(exc), permanent=True)
    return Failure(str(exc), outage=exc.outage)

class Indexer:
    def __init__(self, db: Database, backend: IndexBackend, *,
                 max_text_chars: int = mime.DEFAULT_MAX_TEXT_CHARS) -> None:
        if not isinstance(getattr(backend, "fences_in_database", None), bool):
            # Checked here, not at the first write: guessing would either
            # skip the erasure re-check or pay for it on every batch.
            raise TypeError(f"index backend {type(backend).__name__} must declare "
                            "fences_in_database (see IndexBackend)")
        self.db = db
        self.archive = Archive(db)
        self.backend = backend
        self.max_text_chars = max_text_chars
        self._schemas: set[str] = set()

    def handlers(self) -> dict[str, BatchHandler]:
        return {"index": self.index_batch, "delete": self.delete_batch}

    async def index_batch(self, jobs: Sequence[ClaimedJob]) -> Mapping[JobId, Failure]:
        failures: dict[JobId, Failure] = {}
        wanted: dict[JobId, tuple[str, int]] = {}
        for job in jobs:
            try:
                wanted[job.id] = (job.tenant_slug, archive_id_of(job))
            except NotAnArchiveId as exc:
                failures[job.id] = Failure(str(exc), permanent=True)
        stored = await self.archive.load(list(wanted.values()))
        todo = [(job, stored[wanted[job.id][1]]) for job in jobs
                if job.id in wanted and wanted[job.id][1] in stored]
        # A job whose message is no longer archived has nothing to index: the
        # delete that removed it is queued behind this job and wins.
        def parse_all() -> list[tuple[IndexDocument | None, str | None, tuple[str, ...]]]:
            return [_parse(message, self.max_text_chars) for _, message in todo]

        if sum(message.size_bytes for _, message in todo) <= INLINE_PARSE_BYTES:
            # Small batches parse faster than a thread handoff (measured:
            # ~0.3 ms for a 15 KB mail, ~1 ms for the handoff on 2 cores).
            parsed = parse_all()
        else:
            # Big ones go to a thread, so the trio loop keeps heartbeating.
            parsed = await trio.to_thread.run_sync(parse_all)
        documents: list[tuple[ClaimedJob, IndexDocument]] = []
        notes: dict[int, tuple[str, tuple[str, ...]]] = {}
        for (job, message), (document, error, message_notes) in zip(todo, parsed, strict=True):
            if error is not None:
                failures[job.id] = Failure(error, permanent=True)
            elif document is not None:
                documents.append((job, document))
            if message_notes:
                notes[message.archive_id] = (message.tenant_slug, message_notes)
        for tenant in {document.tenant_slug for _, document in documents} - self._schemas:
            try:
                await self._ensure_schema(tenant)
            except (IndexUnavailable, IndexRejected) as exc:
                # A table of another schema is permanent (IndexRejected), not "retry later".
                for job, document in documents:
                    if document.tenant_slug == tenant:
                        failures[job.id] = index_failure(exc)
                documents = [(j, d) for j, d in documents if d.tenant_slug != tenant]
        await self._upsert(documents, failures)
        if not self.backend.fences_in_database:
            await self._unwrite_erased(
                [(job, document) for job, document in documents if job.id not in failures],
                failures)
        if notes:
            await self._record_notes(notes)
        return failures

    async def delete_batch(self, jobs: Sequence[ClaimedJob]) -> Mapping[JobId, Failure]:
        failures: dict[JobId, Failure] = {}
        by_tenant: dict[str, list[tuple[ClaimedJob, int]]] = {}
        for job in jobs:
            try:
                by_tenant.setdefault(job.tenant_slug, []).append((job, archive_id_of(job)))
            except NotAnArchiveId as exc:
                failures[job.id] = Failure(str(exc), permanent=True)
        for tenant, pairs in by_tenant.items():
            try:
                await self.backend.delete(tenant, [archive_id for _, archive_id in pairs],
                                          [fence_of(job) for job, _ in pairs])
            except (IndexUnavailable, IndexRejected) as exc:
                for job, _ in pairs:
                    failures[job.id] = index_failure(exc)
        return failures

    async def _ensure_schema(self, tenant: str) -> None:
        await self.backend.ensure_schema(tenant)
        self._schemas.add(tenant)

    async def _upsert(self, pairs: list[tuple[ClaimedJob, IndexDocument]],
                      failures: dict[JobId, Failure]) -> None:
        if not pairs:
            return
        try:
            await self.backend.upsert([document for _, document in pairs],
                                      [fence_of(job) for job, _ in pairs])
        except IndexUnavailable as exc:
            for job, _ in pairs:
                failures[job.id] = index_failure(exc)
        except IndexRejected as exc:
            if len(pairs) == 1:
                failures[pairs[0][0].id] = Failure(str(exc), permanent=True)
                return
            middle = len(pairs) // 2
            await self._upsert(pairs[:middle], failures)
            await self._upsert(pairs[middle:], failures)

    async def _unwrite_erased(self, written: list[tuple[ClaimedJob, IndexDocument]],
                              failures: dict[JobId, Failure]) -> None:
        """Remove again what was just written for mail erased meanwhile.

        A backend whose writes cannot check the lease in the database
        (Manticore: versions and tombstones, see index/manticore.py) keeps
        an older write from overwriting a newer one, but a tombstone goes
        with the tenant's table when a whole tenant is erased: a zombie's
        write after that would create the table again and bring erased mail
        back into search. Erased archive ids are never reused, so a document
        for one is always wrong: look them up after every write, delete."""
        if not written:
            return
        try:
            rows = await self.db.fetch(_SQL["erased_among"],
                                       [d.tenant_slug for _, d in written],
                                       [d.archive_id for _, d in written])
        except DatabaseTransient as exc:
            for job, _ in written:
                failures[job.id] = Failure(f"cannot check for erasures after the write: {exc}",
                                           outage=is_outage(exc))
            return
        erased: dict[str, list[int]] = {}
        for row in rows:
            erased.setdefault(row["tenant_slug"], []).append(row["archive_id"])
        for tenant, ids in erased.items():
            log.warning("a late index write of erased mail was removed again tenant=%s "
                        "archive_ids=%s", tenant, sorted(ids))
            try:
                await self.backend.delete(tenant, ids)
            except (IndexUnavailable, IndexRejected) as exc:
                for job, document in written:
                    if document.tenant_slug == tenant and document.archive_id in ids:
                        failures[job.id] = Failure(
                            f"erased message {document.archive_id} was written to the index "
                            f"and could not be removed again: {exc}")

    async def _record_notes(self, notes: dict[int, tuple[str, tuple[str, ...]]]) -> None:
        for archive_id, (tenant, message_notes) in notes.items():
            log.warning("indexed with notes tenant=%s archive_id=%d notes=%s",
                        tenant, archive_id, "; ".join(message_notes))
        try:
            await self.db.execute(_SQL["set_notes"], list(notes),
                                  [tenant for tenant, _ in notes.values()],
                                  [json.dumps(list(n)) for _, n in notes.values()])
        except DatabaseTransient:
            log.warning("could not record index notes for %d message(s)", len(notes))
