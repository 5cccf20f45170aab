"""Legal holds: a tenant, a mailbox or a query frozen against erasure and
retention (``mail_legal_holds``, migration 0021; the design is in the
package docstring).

A query hold records the ids its query finds when it is added and is
evaluated again through the index at each erasure: a message it found then,
or finds now, is held. Adding a hold waits for running erasures of the
tenant (the lifecycle lock), so none commits past it. Every change is
audited; a removed hold keeps its row (removed_at, removed_by).
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass, replace
from datetime import datetime
from enum import StrEnum

from ..aio import Database, Executor, Row
from ..db import sqlfiles
from ..errors import InvalidJobError, NexarchError
from ..index.base import IndexBackend, IndexRejected, InvalidQuery
from ..models import validate_tenant_slug
from . import audit
from .matching import TooManyMatches, check_query, find_ids

_SQL = sqlfiles.queries("lifecycle.sql")
MAX_REASON = 1000
MAX_MAILBOX = 1000


class HoldScope(StrEnum):
    TENANT = "tenant"
    MAILBOX = "mailbox"
    QUERY = "query"


class HoldNotFound(NexarchError, LookupError):
    """No active hold with that id (in that tenant)."""


@dataclass(frozen=True, slots=True)
class Hold:
    id: int
    tenant_slug: str
    scope: HoldScope
    mailbox: str | None
    query: str | None
    reason: str
    created_by: str
    created_at: datetime
    removed_by: str | None
    removed_at: datetime | None
    #: Messages a query hold found when it was added.
    recorded: int = 0

    @property
    def active(self) -> bool:
        return self.removed_at is None

    def describe(self) -> str:
        what = {HoldScope.TENANT: "the whole tenant",
                HoldScope.MAILBOX: f"mailbox {self.mailbox!r}",
                HoldScope.QUERY: f"query {self.query!r}"}[self.scope]
        return f"legal hold #{self.id} on {what} ({self.reason})"


def validate_hold(scope: HoldScope | str, mailbox: str | None, query: str | None,
                  reason: str, tenant_slug: str) -> HoldScope:
    """Raises InvalidJobError (InvalidQuery for a bad query) naming the problem."""
    validate_tenant_slug(tenant_slug)
    try:
        kind = HoldScope(scope)
    except ValueError:
        raise InvalidJobError(f"hold scope must be tenant, mailbox or query, got "
                              f"{str(scope)[:40]!r}") from None
    if not isinstance(reason, str) or not reason.strip() or len(reason) > MAX_REASON \
            or "\x00" in reason:
        raise InvalidJobError(f"a hold needs a reason of 1..{MAX_REASON} characters "
                              "(the case or request it is for)")
    if kind is HoldScope.MAILBOX:
        if not mailbox or len(mailbox) > MAX_MAILBOX or "\x00" in mailbox:
            raise InvalidJobError("a mailbox hold needs the mailbox name (1..1000 characters)")
    elif mailbox is not None:
        raise InvalidJobError(f"a {kind.value} hold takes no mailbox")
    if kind is HoldScope.QUERY:
        if query is None:
            raise InvalidJobError("a query hold needs the query")
        check_query(tenant_slug, query)
    elif query is not None:
        raise InvalidJobError(f"a {kind.value} hold takes no query")
    return kind


def _hold(row: Row) -> Hold:
    return Hold(id=row["id"], tenant_slug=row["tenant_slug"], scope=HoldScope(row["scope"]),
                mailbox=row["mailbox"], query=row["query"], reason=row["reason"],
                created_by=row["created_by"], created_at=row["created_at"],
                removed_by=row["removed_by"], removed_at=row["removed_at"],
                recorded=int(row.get("recorded") or 0))


class UnevaluableHold(NexarchError):
    """A query hold of the tenant cannot be evaluated now: its mail cannot
    be told apart from held mail, so none of it may be erased."""


class Holds:
    """Legal holds of every tenant. ``backend`` evaluates query holds."""

    def __init__(self, db: Database, backend: IndexBackend) -> None:
        self.db = db
        self.backend = backend

    async def add(self, tenant_slug: str, scope: HoldScope | str, *, reason: str, actor: str,
                  mailbox: str | None = None, query: str | None = None) -> Hold:
        """Add a hold (audited). Waits for running erasures of the tenant.
        Raises InvalidJobError / InvalidQuery / TooManyMatches."""
        kind = validate_hold(scope, mailbox, query, reason, tenant_slug)
        audit.validate_actor(actor)
        found: set[int] = set()
        if kind is HoldScope.QUERY:
            assert query is not None
            found = await find_ids(self.backend, tenant_slug, query)
        async with self.db.acquire() as conn, conn.transaction():
            await conn.execute(_SQL["hold_lock"], tenant_slug)
            row = await conn.fetchrow(_SQL["hold_add"], tenant_slug, kind.value, mailbox, query,
                                      reason, actor)
            assert row is not None
            hold = _hold(row)
            if found:
                found = {r["archive_id"] for r in await conn.fetch(
                    _SQL["hold_items_add"], hold.id, tenant_slug, sorted(found))}
            await audit.record(conn, actor=actor, action=audit.AuditAction.HOLD_ADD,
                               tenant_slug=tenant_slug,
                               target={"hold_id": hold.id, "scope": kind.value,
                                       "mailbox": mailbox, "query": query, "reason": reason,
                                       "ids": audit.id_list(sorted(found))},
                               count=len(found))
        return replace(hold, recorded=len(found))

    async def mailbox_known(self, tenant_slug: str, mailbox: str) -> bool:
        """Whether the tenant has archived mail in ``mailbox`` or a mailbox
        of that name registered (a mailbox hold on neither protects nothing
        yet: likely a misspelt name)."""
        return bool(await self.db.fetchval(_SQL["hold_mailbox_known"], tenant_slug, mailbox))

    async def list(self, tenant_slug: str | None, *, include_removed: bool = False) -> list[Hold]:
        """Holds of one tenant (None: every tenant), oldest first."""
        if tenant_slug is not None:
            validate_tenant_slug(tenant_slug)
        rows = await self.db.fetch(_SQL["hold_list"], tenant_slug, include_removed)
        return [_hold(r) for r in rows]

    async def remove(self, hold_id: int, *, actor: str, tenant_slug: str | None = None) -> Hold:
        """Remove an active hold (audited). With ``tenant_slug``, a hold of
        another tenant is not found. Raises HoldNotFound."""
        audit.validate_actor(actor)
        if tenant_slug is not None:
            validate_tenant_slug(tenant_slug)
        async with self.db.acquire() as conn, conn.transaction():
            row = await conn.fetchrow(_SQL["hold_remove"], int(hold_id), tenant_slug, actor)
            if row is None:
                scope = "" if tenant_slug is None else f" in tenant {tenant_slug!r}"
                raise HoldNotFound(f"no active legal hold #{hold_id}{scope}")
            hold = _hold(row)
            await audit.record(conn, actor=actor, action=audit.AuditAction.HOLD_REMOVE,
                               tenant_slug=hold.tenant_slug,
                               target={"hold_id": hold.id, "scope": hold.scope.value,
                                       "mailbox": hold.mailbox, "query": hold.query,
                                       "reason": hold.reason},
                               count=0)
        return hold

    async def by_ids(self, ids: Iterable[int]) -> dict[int, Hold]:
        wanted = set(ids)
        return {h.id: h for h in await self.list(None, include_removed=True) if h.id in wanted}

    async def query_held(self, tenant_slug: str, ids: Iterable[int]) -> QueryHeld:
        """What the tenant's active query holds find now among ``ids``:
        archive id -> hold ids. Raises UnevaluableHold for a hold whose
        query cannot be evaluated: grown too broad, refused by today's
        parser (it was validated when added) or by the search server. Held mail cannot be told
        apart then, so no mail of the tenant may be erased: an erasure
        cannot be undone, a hold that keeps too much can be narrowed."""
        return await self._query_held(tenant_slug, set(ids), None)

    async def _query_held(self, tenant_slug: str, wanted: set[int],
                          only: set[int] | None) -> QueryHeld:
        holds = [row for row in await self.db.fetch(_SQL["query_holds"], tenant_slug)
                 if only is None or row["id"] in only]
        held = QueryHeld(frozenset(row["id"] for row in holds))
        if holds and wanted:
            # Mail not indexed yet (or whose indexing failed) is invisible
            # to a query: it was erased under a hold whose query matches it
            # (a race audit). Kept until the index has it.
            for row in await self.db.fetch(_SQL["not_indexed"], tenant_slug, sorted(wanted)):
                held.setdefault(row["archive_id"], set()).update(held.evaluated)
        for row in holds:
            try:
                found = await find_ids(self.backend, tenant_slug, row["query"])
            except (InvalidQuery, TooManyMatches, IndexRejected) as exc:
                # IndexRejected: the search server refuses the query (a 4xx,
                # an ACL): no better than a query it cannot parse.
                raise UnevaluableHold(
                    f"legal hold #{row['id']} of tenant {tenant_slug!r} cannot be evaluated "
                    f"({exc}): no mail of the tenant is erased until the hold is removed "
                    "or replaced by one that can") from None
            for archive_id in found & wanted:
                held.setdefault(archive_id, set()).add(row["id"])
        return held

    async def newly_held(self, conn: Executor, tenant_slug: str, ids: set[int],
                         evaluated: QueryHeld) -> dict[int, set[int]]:
        """``evaluated`` (what query_held said before an erasure's
        transaction) plus what query holds added since find among ``ids``.
        Run it under the tenant's shared lifecycle lock (``conn``): a hold
        that committed before it is seen here, one that did not waits."""
        current = {row["id"] for row in await conn.fetch(_SQL["query_holds"], tenant_slug)}
        held = {i: set(h) for i, h in evaluated.items()}
        if current - evaluated.evaluated:
            for archive_id, holds in (await self._query_held(
                    tenant_slug, ids, current - evaluated.evaluated)).items():
                held.setdefault(archive_id, set()).update(holds)
        return held


class QueryHeld(dict[int, set[int]]):
    """What query holds find: archive id -> hold ids, and which holds were
    evaluated (``evaluated``), so that an erasure can tell a hold added
    after the evaluation (Holds.newly_held)."""

    def __init__(self, evaluated: frozenset[int]) -> None:
        super().__init__()
        self.evaluated = evaluated


async def held_in(conn: Executor, tenant_slug: str, ids: list[int]) -> dict[int, set[int]]:
    """What the database alone says is held among ``ids`` (tenant and
    mailbox holds, recorded query-hold items): archive id -> hold ids.
    Run it under the tenant's shared lifecycle lock."""
    held: dict[int, set[int]] = {}
    for row in await conn.fetch(_SQL["held"], tenant_slug, ids):
        held.setdefault(row["archive_id"], set()).add(row["hold_id"])
    return held


__all__ = ["Hold", "HoldNotFound", "HoldScope", "Holds", "UnevaluableHold", "held_in",
           "validate_hold"]
