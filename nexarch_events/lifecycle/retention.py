"""Retention: per tenant, mail is kept N days after it was received, then a
pass erases it through the erasure path (``Eraser._erase_in``: same
transaction, same delete jobs), skipping held mail.

The received date is the earliest INTERNALDATE a server gave the message
(its locations), else its Date header, else the time it was archived. The
Date header of a message without an INTERNALDATE is read once, by the pass
(``mail_archive_dates``), from the first 64 KiB of the message.

Days come from ``retention set`` (the database, audited) or else the
configuration file (``[retention.days]``). The pass runs in the service
(``RetentionTask``, in the nursery of ``nexarch-events run``) every
``retention.interval`` seconds, first at start; one pass at a time across
every process (an advisory lock). Each tenant's pass writes one audit row
(``retention_pass``: days, cutoff, erased ids, skipped held ids), completed
when the pass ends. A pass takes ``now`` as an argument: tests (and an
operator's "what if") control the clock.
"""

from __future__ import annotations

import json
import logging
from dataclasses import dataclass
from datetime import UTC, datetime, timedelta

import trio

from ..aio import Database
from ..db import sqlfiles
from ..errors import DatabaseRejected, DatabaseTransient, InvalidJobError
from ..index.base import IndexBackend, IndexUnavailable
from ..mail.mime.dates import header_date
from ..mail.mime.headers import TOP_FIELDS, read_headers
from ..mail.mime.notes import Notes
from ..models import JSONValue, validate_tenant_slug
from ..queue.outage import Outage
from ..settings import RetentionSettings
from . import audit
from .audit import AuditAction
from .erasure import Eraser
from .holds import UnevaluableHold

log = logging.getLogger(__name__)
_SQL = sqlfiles.queries("lifecycle.sql")

MAX_DAYS = 36500
#: Messages looked at per statement for a missing received date (their
#: Date header is read if so).
DATE_BATCH = 500
#: Messages looked at per statement for being expired: a window of the
#: tenant's ids, in order (lifecycle.sql, "expired").
SCAN_WINDOW = 1000


@dataclass(frozen=True, slots=True)
class RetentionPolicy:
    tenant_slug: str
    days: int
    #: "database" (retention set) or "config" (the file / environment).
    source: str
    set_by: str | None = None
    set_at: datetime | None = None


@dataclass(frozen=True, slots=True)
class PassResult:
    tenant_slug: str
    days: int
    cutoff: datetime
    erased: tuple[int, ...]
    skipped_held: tuple[int, ...]
    audit_id: int
    #: Why the pass of this tenant stopped early (what it erased until then
    #: is above); None if it went through.
    error: str | None = None


def validate_days(days: object) -> int:
    if isinstance(days, bool) or not isinstance(days, int) or not 1 <= days <= MAX_DAYS:
        raise InvalidJobError(f"retention days must be a whole number 1..{MAX_DAYS}, "
                              f"got {days!r}")
    return days


async def policies(db: Database, settings: RetentionSettings) -> list[RetentionPolicy]:
    """Every tenant's effective policy: the database's, else the file's."""
    out = {tenant: RetentionPolicy(tenant, days, "config") for tenant, days in settings.days}
    for row in await db.fetch(_SQL["retention_policies"]):
        out[row["tenant_slug"]] = RetentionPolicy(row["tenant_slug"], row["days"], "database",
                                                  row["set_by"], row["set_at"])
    return [out[t] for t in sorted(out)]


async def set_policy(db: Database, tenant_slug: str, days: int | None, *, actor: str) -> None:
    """Keep ``tenant_slug``'s mail ``days`` days (None: back to the file's
    setting, or none). Audited."""
    validate_tenant_slug(tenant_slug)
    audit.validate_actor(actor)
    if days is not None:
        validate_days(days)
    async with db.acquire() as conn, conn.transaction():
        if days is None:
            await conn.fetch(_SQL["retention_clear"], tenant_slug)
        else:
            await conn.fetch(_SQL["retention_set"], tenant_slug, days, actor)
        await audit.record(conn, actor=actor, action=AuditAction.RETENTION_SET,
                           tenant_slug=tenant_slug, target={"days": days}, count=0)


def date_header(head: bytes, now: datetime) -> datetime | None:
    """The Date field of a message's header section, None if absent or unusable."""
    fields = read_headers(head, 0, len(head), TOP_FIELDS)[0]
    return header_date(fields, now, Notes())


class Retention:
    """Retention passes. ``backend`` evaluates query holds."""

    def __init__(self, db: Database, backend: IndexBackend, settings: RetentionSettings,
                 *, actor: str = "retention") -> None:
        self.db = db
        self.settings = settings
        self.eraser = Eraser(db, backend)
        self.actor = actor

    async def run_pass(self, now: datetime) -> list[PassResult] | None:
        """One pass over every tenant with a policy, as if it were ``now``.
        None if another process's pass is running."""
        async with self.db.session() as conn:  # the lock lives as long as this session
            if not await conn.fetchval(_SQL["retention_lock"]):
                return None
            try:
                return [await self.pass_tenant(policy, now)
                        for policy in await policies(self.db, self.settings)]
            finally:
                with trio.move_on_after(5, shield=True):
                    await conn.fetchval(_SQL["retention_unlock"])

    async def pass_tenant(self, policy: RetentionPolicy, now: datetime) -> PassResult:
        """Erase the tenant's mail received before ``now`` - days, held mail
        left alone, ``batch_size`` messages per transaction."""
        if now.tzinfo is None:
            raise InvalidJobError("retention: now must carry a time zone")
        tenant = policy.tenant_slug
        cutoff = now - timedelta(days=policy.days)
        await self._read_dates(tenant, now)
        target: dict[str, JSONValue] = {"days": policy.days, "cutoff": cutoff.isoformat()}
        audit_id = await audit.record(self.db, actor=self.actor,
                                      action=AuditAction.RETENTION_PASS, tenant_slug=tenant,
                                      target=target, count=0)
        erased: list[int] = []
        held: set[int] = set()
        error: str | None = None
        try:
            await self._erase_expired(tenant, cutoff, target, audit_id, erased, held)
        except (UnevaluableHold, DatabaseRejected) as exc:
            # Permanent for this tenant: a query hold that cannot be
            # evaluated, so held mail cannot be told apart, or data of this
            # tenant's the database refuses (a CHECK, a trigger of the
            # operator's); its mail stays, the other tenants' passes go on,
            # and the audit row says why. (An outage propagates: the task
            # backs off and starts over.)
            error = str(exc) if isinstance(exc, UnevaluableHold) else \
                f"the database refused an erasure: {exc}"
            log.warning("retention tenant=%s: pass stopped after %d erased: %s", tenant,
                        len(erased), error)
            target["error"] = error[:1000]
        target["ids"] = audit.id_list(erased)
        if held:
            target["skipped_held"] = audit.id_list(sorted(held))
        await self.db.execute(_SQL["audit_complete"], audit_id, len(erased), json.dumps(target))
        if erased:
            log.info("retention tenant=%s days=%d erased=%d held=%d", tenant, policy.days,
                     len(erased), len(held))
        return PassResult(tenant, policy.days, cutoff, tuple(erased), tuple(sorted(held)),
                          audit_id, error)

    async def _erase_expired(self, tenant: str, cutoff: datetime,
                             target: dict[str, JSONValue], audit_id: int, erased: list[int],
                             held: set[int]) -> None:
        """Erase the tenant's mail received before ``cutoff``, adding to
        ``erased`` and ``held`` as each batch commits."""
        batch = self.settings.batch_size
        expired: list[int] = []
        after, scanned = 0, False
        while not scanned:
            # The tenant's archive in windows of ids, in order; each expired
            # message is erased in a batch of up to batch_size.
            rows = await self.db.fetch(_SQL["expired"], tenant, cutoff, after, SCAN_WINDOW)
            scanned = len(rows) < SCAN_WINDOW
            if rows:
                after = rows[-1]["id"]
            expired.extend(r["id"] for r in rows if r["expired"])
            while len(expired) >= batch or (scanned and expired):
                ids, expired = expired[:batch], expired[batch:]
                query_held = await self.eraser.holds.query_held(tenant, ids)
                async with self.db.acquire() as conn, conn.transaction():
                    result = await self.eraser.erase_in(
                        conn, tenant, ids, actor=self.actor, action=AuditAction.RETENTION_PASS,
                        target=target, query_held=query_held, skip_held=True, strict=False,
                        audit_id=audit_id)
                erased.extend(result.erased)
                held.update(result.skipped_held)
            await trio.lowlevel.checkpoint()

    async def _read_dates(self, tenant: str, now: datetime) -> None:
        after = 0
        while True:
            rows = await self.db.fetch(_SQL["undated"], tenant, after, DATE_BATCH)
            undated = [r for r in rows if r["head"] is not None]
            if undated:
                dates = [date_header(bytes(r["head"]), now) for r in undated]
                await self.db.execute(_SQL["dates_add"], tenant, [r["id"] for r in undated],
                                      dates)
            if len(rows) < DATE_BATCH:
                return
            after = rows[-1]["id"]
            await trio.lowlevel.checkpoint()


class RetentionTask:
    """The service's retention loop: a pass at start, then every
    ``settings.interval`` seconds. A database or index outage postpones the
    pass (backing off); it never stops the service."""

    def __init__(self, retention: Retention, *, reconnect_max: float = 60.0) -> None:
        self.retention = retention
        self.reconnect_max = reconnect_max
        self.passes = 0

    async def run(self, *, task_status: trio.TaskStatus[None] = trio.TASK_STATUS_IGNORED
                  ) -> None:
        outage = Outage("retention", log, max_delay=self.reconnect_max)
        task_status.started()
        while True:
            try:
                await self.retention.run_pass(datetime.now(UTC))
            except (DatabaseTransient, IndexUnavailable) as exc:
                await trio.sleep(outage.failed(exc))
                continue
            outage.ok()
            self.passes += 1
            await trio.sleep(self.retention.settings.interval)


__all__ = ["PassResult", "Retention", "RetentionPolicy", "RetentionTask", "policies",
           "set_policy", "validate_days"]
