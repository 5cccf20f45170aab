"""Erasure: messages, a query's matches, or a whole tenant, removed from the
archive and, through the queue's delete jobs, from the index.

One transaction per batch (see the package docstring): the tenant's shared
lifecycle lock, the hold check, the archive rows (and their locations), the
pending index jobs of those messages, a delete job per message enqueued by
``Queue.enqueue_many`` on the same connection, the ``mail_erasures`` record
and the audit row. Held mail is refused whole (``HeldByLegalHold`` lists
every held id and its holds); retention passes ``skip_held`` instead.
Unknown ids (never archived in that tenant: another tenant's mail looks
the same) are refused whole too (``MessageNotFound``); ids erased before
are reported as such and not counted again.

A whole tenant: holds refuse it; its import is unregistered first
(accounts, mailboxes, sync state, failures: no run starts again) and runs
in flight are waited for (their run locks), then the archive goes in batches,
each a transaction as above, and last the backend drops the tenant's
table/documents (``IndexBackend.drop_tenant``). The delete jobs still run:
they are what orders the removal behind index jobs already claimed. Mail
archived after the last batch (an import run still in flight) is kept,
with its index job and document, and the audit row counts it.

Mail erased here comes back only if it is imported again: from a mailbox
that is still registered and whose server still holds it (a resync, or a
new UIDVALIDITY). ``unregister_mailboxes`` removes the registrations of
the mailboxes the erased mail was seen in.
"""

from __future__ import annotations

import json
import logging
import re
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field, replace

import trio

from ..aio import Connection, Database
from ..db import sqlfiles
from ..errors import DatabaseError, InvalidJobError, NexarchError
from ..index.base import MAX_DOCUMENT_ID, IndexBackend
from ..models import JobId, JobStatus, JobType, JSONValue, NewJob, validate_tenant_slug
from ..queue.jobs import Queue
from . import audit
from .audit import AuditAction
from .holds import Holds, QueryHeld, held_in
from .matching import find_ids

log = logging.getLogger(__name__)
_SQL = sqlfiles.queries("lifecycle.sql")
_IMPORTER_SQL = sqlfiles.queries("importer.sql")

#: Messages per erasure transaction (a tenant, a query, a retention pass).
DEFAULT_BATCH = 500
#: Ids one call takes.
MAX_IDS = 100_000
_DIGITS = re.compile(r"[0-9]{1,20}")


class MessageNotFound(NexarchError, LookupError):
    """Ids that are no archived message of the tenant (nothing was erased)."""

    def __init__(self, tenant_slug: str, ids: Sequence[int]) -> None:
        self.tenant_slug = tenant_slug
        self.ids = tuple(sorted(ids))
        shown = " ".join(map(str, self.ids[:20])) + (" ..." if len(self.ids) > 20 else "")
        super().__init__(f"no archived message {shown} in tenant {tenant_slug!r}; nothing "
                         "was erased")


class HeldByLegalHold(NexarchError):
    """Messages under legal hold: the erasure was refused whole."""

    def __init__(self, tenant_slug: str, held: Mapping[int, Iterable[int]],
                 descriptions: Mapping[int, str] | None = None, *,
                 message: str | None = None) -> None:
        self.tenant_slug = tenant_slug
        self.held = {i: tuple(sorted(h)) for i, h in sorted(held.items())}
        holds = sorted({h for hs in self.held.values() for h in hs})
        self.hold_ids = tuple(holds)
        named = "; ".join((descriptions or {}).get(h, f"legal hold #{h}") for h in holds[:5])
        shown = " ".join(map(str, list(self.held)[:20])) + (" ..." if len(self.held) > 20
                                                            else "")
        super().__init__(message or (
            f"refused: message(s) {shown} of tenant {tenant_slug!r} are under {named}; "
            "nothing was erased (remove the hold, or leave those messages out)"))


@dataclass(frozen=True, slots=True)
class ErasureResult:
    tenant_slug: str
    #: Archive ids erased now, ascending, and their delete jobs (pairwise).
    erased: tuple[int, ...] = ()
    delete_jobs: tuple[JobId, ...] = ()
    #: Ids erased by an earlier erasure.
    already_erased: tuple[int, ...] = ()
    #: Held ids left alone (skip_held only): id -> hold ids.
    skipped_held: Mapping[int, tuple[int, ...]] = field(default_factory=dict)
    audit_id: int | None = None
    #: Mailboxes unregistered with it (unregister_mailboxes).
    unregistered: tuple[str, ...] = ()


@dataclass(frozen=True, slots=True)
class TenantErasure:
    tenant_slug: str
    erased: int
    delete_jobs: tuple[JobId, ...]
    unregistered: tuple[str, ...]
    audit_id: int
    #: Mailboxes whose import run was still running after ``run_wait``
    #: seconds: mail it archives later survives; erase the tenant again.
    still_running: tuple[str, ...] = ()


def validate_ids(ids: Iterable[object]) -> list[int]:
    """Archive ids (1..2^63-1), deduplicated and ascending; raises InvalidJobError."""
    out: set[int] = set()
    for raw in ids:
        if isinstance(raw, bool) or not isinstance(raw, int | str):
            raise InvalidJobError(f"archive id {raw!r} is not a number")
        # ASCII digits only: int() would also take other scripts' digits.
        if isinstance(raw, str) and not _DIGITS.fullmatch(raw):
            raise InvalidJobError(f"archive id {raw[:40]!r} is not a number")
        value = int(raw)
        if not 1 <= value <= MAX_DOCUMENT_ID:
            raise InvalidJobError(f"archive id {value} outside 1..2^63-1")
        out.add(value)
    if not out:
        raise InvalidJobError("no archive id given")
    if len(out) > MAX_IDS:
        raise InvalidJobError(f"{len(out)} ids; one erasure takes at most {MAX_IDS}")
    return sorted(out)


class Eraser:
    """Erasure of one tenant's mail. ``backend`` finds query matches,
    evaluates query holds and drops a tenant's index."""

    def __init__(self, db: Database, backend: IndexBackend) -> None:
        self.db = db
        self.backend = backend
        self.holds = Holds(db, backend)

    # -- by id -----------------------------------------------------------------

    async def erase(self, tenant_slug: str, ids: Iterable[object], *, actor: str,
                    action: AuditAction = AuditAction.ERASE, query: str | None = None,
                    unregister_mailboxes: bool = False, strict: bool = True) -> ErasureResult:
        """Erase messages by archive id: all of them, or none (unknown or
        held ids refuse the whole call; with ``strict`` False unknown ids
        are passed over). One transaction. Raises
        MessageNotFound, HeldByLegalHold, InvalidJobError, UnevaluableHold
        (a query hold that cannot be evaluated: too broad, or refused by
        today's parser)."""
        validate_tenant_slug(tenant_slug)
        audit.validate_actor(actor)
        wanted = validate_ids(ids)
        query_held = await self.holds.query_held(tenant_slug, wanted)
        target: dict[str, JSONValue] = {} if query is None else {"query": query}
        async with self.db.acquire() as conn, conn.transaction():
            # Where the mail was seen: read before its locations go with it.
            seen = [r["mailbox"] for r in await conn.fetch(
                _SQL["mailboxes_of"], tenant_slug, wanted)] if unregister_mailboxes else []
            result = await self.erase_in(conn, tenant_slug, wanted, actor=actor, action=action,
                                         target=target, query_held=query_held,
                                         skip_held=False, strict=strict)
            if seen and result.erased:
                names = tuple(r["name"] for r in await conn.fetch(
                    _SQL["unregister_mailboxes"], tenant_slug, seen))
                result = replace(result, unregistered=names)
        return result

    async def erase_query(self, tenant_slug: str, query: str, *, actor: str,
                          dry_run: bool = False, unregister_mailboxes: bool = False
                          ) -> tuple[list[int], ErasureResult | None]:
        """The ids the query finds (through the index) and, unless
        ``dry_run``, their erasure (as ``erase``; an empty match erases
        nothing and writes no audit row). A document of a message the
        archive no longer has is passed over (verify-index reports it)."""
        found = sorted(await find_ids(self.backend, tenant_slug, query))
        if dry_run or not found:
            return found, None
        return found, await self.erase(tenant_slug, found, actor=actor,
                                       action=AuditAction.ERASE_QUERY, query=query,
                                       unregister_mailboxes=unregister_mailboxes, strict=False)

    async def erase_in(self, conn: Connection, tenant_slug: str, ids: list[int], *,
                       actor: str, action: AuditAction, target: Mapping[str, JSONValue],
                       query_held: QueryHeld, skip_held: bool, strict: bool,
                       audit_id: int | None = None) -> ErasureResult:
        """The erasure transaction's statements, on ``conn`` inside its
        transaction. With ``audit_id``, the erasures belong to that audit
        row and none is written."""
        await conn.execute(_SQL["tenant_lock_shared"], tenant_slug)
        archived = {r["id"] for r in await conn.fetch(_SQL["archived_of"], tenant_slug, ids)}
        gone = sorted(set(ids) - archived)
        before = sorted(r["archive_id"] for r in await conn.fetch(
            _SQL["erased_of"], tenant_slug, gone)) if gone else []
        unknown = sorted(set(gone) - set(before))
        if unknown and strict:
            raise MessageNotFound(tenant_slug, unknown)
        held = await held_in(conn, tenant_slug, sorted(archived))
        # A query hold added after query_held was evaluated (outside this
        # transaction) is evaluated here: it committed before the lock above
        # or waits for this transaction (a race audit).
        for archive_id, holds in (await self.holds.newly_held(
                conn, tenant_slug, archived, query_held)).items():
            if archive_id in archived:
                held.setdefault(archive_id, set()).update(holds)
        if held and not skip_held:
            described = {h.id: h.describe() for h in (await self.holds.by_ids(
                {h for hs in held.values() for h in hs})).values()}
            raise HeldByLegalHold(tenant_slug, held, described)
        todo = sorted(archived - set(held))
        erased = sorted(r["id"] for r in await conn.fetch(_SQL["erase_archive"], tenant_slug,
                                                          todo)) if todo else []
        jobs: list[JobId] = []
        if erased:
            await conn.execute(_SQL["drop_pending_index_jobs"], tenant_slug,
                               [str(i) for i in erased])
            # The queue's own enqueue path, in this transaction: the trigger
            # wakes the workers when it commits.
            jobs = await Queue(conn).enqueue_many(
                [NewJob(JobType.DELETE, tenant_slug, str(i), {"erased": True}) for i in erased])
        if audit_id is None:
            audit_target: dict[str, JSONValue] = dict(target)
            audit_target["ids"] = audit.id_list(erased)
            if before:
                audit_target["already_erased"] = audit.id_list(before)
            if held:
                audit_target["skipped_held"] = audit.id_list(sorted(held))
            audit_id = await audit.record(conn, actor=actor, action=action,
                                          tenant_slug=tenant_slug, target=audit_target,
                                          count=len(erased))
        if erased:
            await conn.execute(_SQL["record_erasures"], tenant_slug, erased, audit_id,
                               [int(j) for j in jobs])
        return ErasureResult(tenant_slug, tuple(erased), tuple(jobs), tuple(before),
                             {i: tuple(sorted(h)) for i, h in held.items()}, audit_id)

    # -- a whole tenant --------------------------------------------------------

    async def erase_tenant(self, tenant_slug: str, *, actor: str, batch: int = DEFAULT_BATCH,
                           run_wait: float = 60.0) -> TenantErasure:
        """Erase a whole tenant: import stopped and unregistered, archive,
        pending index work, index table. Refused (HeldByLegalHold) while any
        hold of the tenant is active. Each batch is one transaction; an
        interrupted erasure is finished by running it again. After the
        import is unregistered, waits up to ``run_wait`` seconds for import
        runs in flight (their run locks; a service drops a removed mailbox's
        runner within NEXARCH_IMPORT_RELOAD_INTERVAL)."""
        validate_tenant_slug(tenant_slug)
        audit.validate_actor(actor)
        async with self.db.acquire() as conn, conn.transaction():
            await conn.execute(_SQL["tenant_lock_shared"], tenant_slug)
            active = await self.holds.list(tenant_slug)
            if active:
                raise HeldByLegalHold(
                    tenant_slug, {}, message=f"refused: tenant {tenant_slug!r} has "
                    f"{len(active)} active legal hold(s): "
                    f"{'; '.join(h.describe() for h in active[:5])}; nothing was erased "
                    "(remove them first)")
            unregistered = tuple(r["name"] for r in await conn.fetch(
                _SQL["unregister_tenant"], tenant_slug))
            count = int(await conn.fetchval(_SQL["tenant_count"], tenant_slug))
            # Completed below with what was erased: a refusal or an outage
            # mid-way must not leave "count" claiming erasures never made.
            target: dict[str, JSONValue] = {
                "all": True, "unregistered_mailboxes": list(unregistered), "planned": count}
            audit_id = await audit.record(
                conn, actor=actor, action=AuditAction.ERASE_TENANT, tenant_slug=tenant_slug,
                target=target, count=0)
        erased = 0
        jobs: list[JobId] = []
        try:
            still_running = await self._wait_for_runs(tenant_slug, unregistered, run_wait)
            while True:
                ids = [r["id"] for r in await self.db.fetch(_SQL["ids_page"], tenant_slug, 0,
                                                            batch)]
                if not ids:
                    break
                async with self.db.acquire() as conn, conn.transaction():
                    result = await self.erase_in(conn, tenant_slug, ids, actor=actor,
                                                 action=AuditAction.ERASE_TENANT, target={},
                                                 query_held=QueryHeld(frozenset()),
                                                 skip_held=False, strict=False,
                                                 audit_id=audit_id)
                erased += len(result.erased)
                jobs.extend(result.delete_jobs)
                await trio.lowlevel.checkpoint()
            # Mail archived after the last batch (an import run still in
            # flight, an archive call) stays archived: its index job and
            # its document are spared, or it would be archived but never
            # found (a race audit). Postgres spares them in the same
            # statement; a backend with a table per tenant (Manticore)
            # keeps the table while the tenant has mail.
            await self.db.execute(_SQL["drop_tenant_pending_jobs"], tenant_slug)
            kept = int(await self.db.fetchval(_SQL["tenant_count"], tenant_slug))
            if kept:
                log.warning("erase tenant=%s: %d message(s) archived while the erasure ran "
                            "are kept (erase them again to remove them)", tenant_slug, kept)
                target["kept_archived_meanwhile"] = kept
            else:
                await self.backend.drop_tenant(tenant_slug)
        except BaseException as exc:
            target["stopped"] = (str(exc) or type(exc).__name__)[:1000]
            raise
        finally:
            with trio.move_on_after(5, shield=True):
                try:
                    await self.db.execute(_SQL["audit_complete"], audit_id, erased,
                                          json.dumps(target))
                except DatabaseError as failed:
                    log.warning("erase tenant=%s: audit row %d not completed (%d erased): %s",
                                tenant_slug, audit_id, erased, failed)
        return TenantErasure(tenant_slug, erased, tuple(jobs), unregistered, audit_id,
                             still_running)

    async def _wait_for_runs(self, tenant_slug: str, mailboxes: Sequence[str],
                             wait: float) -> tuple[str, ...]:
        """The mailboxes whose run lock is still held after ``wait`` seconds
        (a run in flight), polled: taking a run lock is the importer's own
        test (sql/importer.sql), and it is released at once."""
        running = list(mailboxes)
        with trio.move_on_after(wait):
            while running:
                async with self.db.session() as conn:  # a session lock, taken and released
                    for name in list(running):
                        if await conn.fetchval(_IMPORTER_SQL["try_run_lock"], tenant_slug, name):
                            await conn.fetchval(_IMPORTER_SQL["run_unlock"], tenant_slug, name)
                            running.remove(name)
                if running:
                    await trio.sleep(0.5)
        if running:
            log.warning("erase tenant=%s: import run(s) of %s still running after %.0f s",
                        tenant_slug, ", ".join(running), wait)
        return tuple(running)

    # -- the proof ---------------------------------------------------------------

    async def wait_finished(self, jobs: Sequence[JobId], *,
                            poll: float = 0.2) -> dict[JobId, JobStatus]:
        """Block until every delete job has finished (succeeded or failed)
        and return their statuses. The table is polled (it is the truth; no
        notification is trusted). Cancel it to stop waiting (the caller's
        ``trio.move_on_after``)."""
        queue = Queue(self.db)
        while True:
            statuses = await queue.statuses(list(jobs))
            if all(s in (JobStatus.SUCCEEDED, JobStatus.FAILED) for s in statuses.values()):
                return statuses
            await trio.sleep(poll)

    async def queue_statuses(self, jobs: Sequence[JobId]) -> dict[JobId, JobStatus]:
        """The delete jobs' statuses now."""
        return await Queue(self.db).statuses(list(jobs))
