"""Sync state per (tenant, mailbox), as in the seed (reference/
seed-imapimport-state.go.txt): get-or-create with the default interval, get,
set interval, and the advance, which here is part of each message's import
transaction (``import_message``) so that progress, archive, index job and
notification commit together or not at all.

The state lives only in Postgres: a restart loses nothing.
"""

from __future__ import annotations

import re
from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from dataclasses import dataclass
from datetime import datetime
from typing import overload

from ..aio import Executor, Row
from ..db import sqlfiles
from ..errors import DatabaseError, InvalidJobError, JobNotFound, NexarchError
from ..mail.archive import Archived, content_hash
from ..models import JobId, storable_text, validate_tenant_slug

_SQL = sqlfiles.queries("importer.sql")

DEFAULT_INTERVAL_SECONDS = 300
MAX_INTERVAL_SECONDS = 7 * 24 * 3600
MAILBOX_NAME_PATTERN = r"^[A-Za-z0-9][A-Za-z0-9._@+/-]{0,199}$"


def validate_mailbox_name(name: str) -> str:
    """The operator's name of a registered mailbox (unique per tenant)."""
    if not isinstance(name, str) or not re.fullmatch(MAILBOX_NAME_PATTERN, name):
        raise InvalidJobError(
            f"mailbox name {str(name)[:60]!r} is invalid: use 1-200 of A-Z a-z 0-9 . _ @ + / -, "
            "starting with a letter or digit")
    return name


def validate_interval(seconds: int, *, minimum: int = 1) -> int:
    """A sync interval: ``minimum`` (an account's is 10: every folder signs
    in once per interval) to a week."""
    if isinstance(seconds, bool) or not isinstance(seconds, int) \
            or not minimum <= seconds <= MAX_INTERVAL_SECONDS:
        raise InvalidJobError(f"interval must be {minimum}..{MAX_INTERVAL_SECONDS} seconds, "
                              f"got {seconds!r}")
    return seconds


@dataclass(frozen=True, slots=True)
class SyncState:
    tenant_slug: str
    mailbox_name: str
    last_uidvalidity: int
    last_synced_uid: int
    interval_seconds: int
    imported_total: int = 0
    server_uidnext: int | None = None
    server_exists: int | None = None
    last_run_started_at: datetime | None = None
    last_run_finished_at: datetime | None = None
    last_success_at: datetime | None = None
    last_error: str | None = None
    warning: str | None = None
    sync_requested_at: datetime | None = None
    #: Why the runner does not hold IDLE ("idle unavailable: ..."), or None.
    idle_status: str | None = None
    #: Messages per FETCH (None: the default); adapts to servers that cut replies.
    fetch_window: int | None = None
    last_attempt_at: datetime | None = None

    @classmethod
    def from_row(cls, row: Row) -> SyncState:
        return cls(**{name: row[name] for name in cls.__slots__})


@dataclass(frozen=True, slots=True)
class RunStart:
    """What ``begin`` decided: ``mode`` is first, delta, resync or unstable."""

    mode: str
    last_synced_uid: int
    old_uidvalidity: int
    fetch_window: int | None = None


@dataclass(frozen=True, slots=True)
class PendingFailure:
    uid: int
    attempts: int
    last_error: str


class StateStore:
    """The seed's Store, over any executor (the pool, or a run's own
    connection that holds the run lock)."""

    def __init__(self, db: Executor) -> None:
        self.db = db

    async def get_or_create(self, tenant_slug: str, mailbox_name: str,
                            mailbox_id: int | None = None) -> SyncState:
        """The mailbox's state, created if missing. ``mailbox_id``: its
        registration; raises MailboxRemoved once that is gone."""
        _check(tenant_slug, mailbox_name)
        for _ in range(3):  # a concurrent create may commit after our snapshot
            row = await self.db.fetchrow(_SQL["state_get_or_create"], tenant_slug, mailbox_name,
                                         mailbox_id)
            if row is not None:
                return SyncState.from_row(row)
            if mailbox_id is not None and not await self.db.fetchval(
                    _SQL["mailbox_registered"], mailbox_id):
                raise MailboxRemoved(tenant_slug, mailbox_name)
        raise JobNotFound(f"sync state of {tenant_slug}/{mailbox_name} could not be created")

    async def get(self, tenant_slug: str, mailbox_name: str) -> SyncState:
        """Raises JobNotFound if the mailbox has no state yet."""
        _check(tenant_slug, mailbox_name)
        row = await self.db.fetchrow(_SQL["state_get"], tenant_slug, mailbox_name)
        if row is None:
            raise JobNotFound(f"no sync state for mailbox {mailbox_name!r} of "
                              f"tenant {tenant_slug!r}")
        return SyncState.from_row(row)

    async def set_interval(self, tenant_slug: str, mailbox_name: str, seconds: int) -> None:
        """Persist the mailbox's sync interval (survives restarts)."""
        _check(tenant_slug, mailbox_name)
        validate_interval(seconds)
        row = await self.db.fetchrow(_SQL["state_set_interval"], tenant_slug, mailbox_name,
                                     seconds)
        if row is None:
            raise JobNotFound(f"no sync state for mailbox {mailbox_name!r} of "
                              f"tenant {tenant_slug!r}")

    async def request_sync(self, tenant_slug: str, mailbox_name: str) -> None:
        """Ask every running scheduler to run this mailbox now."""
        _check(tenant_slug, mailbox_name)
        row = await self.db.fetchrow(_SQL["request_sync"], tenant_slug, mailbox_name)
        if row is None:
            raise JobNotFound(f"no mailbox {mailbox_name!r} in tenant {tenant_slug!r}")

    # -- used by a sync run, on the connection that holds the run lock ------

    async def begin(self, tenant_slug: str, mailbox_name: str, uidvalidity: int | None,
                    uidnext: int | None, exists: int | None, *,
                    mailbox_id: int | None = None) -> RunStart:
        """Decide the run's mode. ``mailbox_id``: the mailbox's
        registration; raises MailboxRemoved once that is gone (a run that
        signed in while it was removed must not create its state again)."""
        with _unless_removed(tenant_slug, mailbox_name):
            row = await self.db.fetchrow(_SQL["begin"], tenant_slug, mailbox_name, uidvalidity,
                                         uidnext, exists, mailbox_id)
        assert row is not None
        return RunStart(row["mode"], row["last_synced_uid"], row["old_uidvalidity"],
                        row["fetch_window"])

    async def import_message(self, tenant_slug: str, mailbox_name: str, uidvalidity: int,
                             uid: int | None, mode: str, raw: bytes, *,
                             internaldate: datetime | None = None,
                             note: str | None = None, after: int | None = None,
                             sha256: bytes | None = None,
                             mailbox_id: int | None = None) -> Archived:
        """Archive + index job + location (with its INTERNALDATE and note) +
        (mode "new") advance to ``uid`` + NOTIFY: one statement, one
        transaction.

        ``after``: the UID this one follows while two imports are in flight
        (importer/pipeline.py): the transaction waits for that one's to end
        and advances only from exactly ``after``, else raises DatabaseError
        with SQLSTATE NXI02 (send it again once that one has settled).
        ``sha256``: ``content_hash(raw)`` if the caller has it already.
        ``mailbox_id``: the run's registration; mode "unstable" raises
        MailboxRemoved once it is gone (without one: once the state is;
        mode "new" raises NXI01 then)."""
        with _unless_removed(tenant_slug, mailbox_name):
            row = await self.db.fetchrow(_SQL["import_message"], tenant_slug, mailbox_name,
                                         uidvalidity, uid, mode,
                                         content_hash(raw) if sha256 is None else sha256,
                                         len(raw), raw, internaldate, note, after,
                                         mailbox_id)
        assert row is not None
        return Archived(archive_id=row["archive_id"], created=row["created"],
                        job_id=None if row["job_id"] is None else JobId(row["job_id"]),
                        location_added=row["location_added"])

    async def record_failure(self, tenant_slug: str, mailbox_name: str, uidvalidity: int,
                             uid: int, error: str, *, retry: bool,
                             mailbox_id: int | None = None) -> int:
        """Remember a message the server would not hand over (and, unless
        ``retry``, advance past it): one transaction. Returns its attempts.
        Raises MailboxRemoved when a retry's registration (``mailbox_id``;
        without one, the mailbox's state) is gone."""
        with _unless_removed(tenant_slug, mailbox_name):
            attempts: int = await self.db.fetchval(_SQL["record_failure"], tenant_slug,
                                                   mailbox_name, uidvalidity, uid,
                                                   _stored(error), retry, mailbox_id)
        return attempts

    async def recorded_failures(self, tenant_slug: str, mailbox_name: str,
                                uidvalidity: int) -> list[PendingFailure]:
        """The failures recorded at ``uidvalidity``, retried or given up, by UID."""
        rows = await self.db.fetch(_SQL["recorded_failures"], tenant_slug, mailbox_name,
                                   uidvalidity)
        return [PendingFailure(r["uid"], r["attempts"], r["last_error"]) for r in rows]

    async def failures(self, tenant_slug: str, mailbox_name: str) -> Sequence[Row]:
        return await self.db.fetch(_SQL["failures"], tenant_slug, mailbox_name)

    async def retry_failure(self, tenant_slug: str, mailbox_name: str, uid: int) -> bool:
        """Reset one recorded failure's attempts (the next runs retry it).
        False if there is no such failure."""
        _check(tenant_slug, mailbox_name)
        return bool(await self.db.fetch(_SQL["failure_retry"], tenant_slug, mailbox_name, uid))

    async def clear_failure(self, tenant_slug: str, mailbox_name: str, uid: int) -> bool:
        """Forget one recorded failure. False if there is no such failure."""
        _check(tenant_slug, mailbox_name)
        return bool(await self.db.fetch(_SQL["failure_clear"], tenant_slug, mailbox_name, uid))

    async def attempt_started(self, tenant_slug: str, mailbox_name: str) -> None:
        """An attempt begins: clears a pending "sync now" (it is answered)."""
        await self.db.execute(_SQL["attempt_started"], tenant_slug, mailbox_name)

    async def failed_before_run(self, tenant_slug: str, mailbox_name: str, error: str, *,
                                mailbox_id: int | None = None) -> None:
        """Record an attempt that failed before reaching the server."""
        await self.get_or_create(tenant_slug, mailbox_name, mailbox_id)
        await self.db.execute(_SQL["failed_before_run"], tenant_slug, mailbox_name,
                              _stored(error))

    async def set_idle_status(self, tenant_slug: str, mailbox_name: str,
                              status: str | None) -> None:
        await self.db.execute(_SQL["set_idle_status"], tenant_slug, mailbox_name,
                              _stored(status))

    async def set_fetch_window(self, tenant_slug: str, mailbox_name: str, window: int) -> None:
        await self.db.execute(_SQL["set_fetch_window"], tenant_slug, mailbox_name, window)

    async def try_run_lock(self, tenant_slug: str, mailbox_name: str) -> bool:
        """The run lock (session level: held until unlocked or the connection
        ends). Only meaningful on a dedicated connection, never a pool."""
        locked: bool = await self.db.fetchval(_SQL["try_run_lock"], tenant_slug, mailbox_name)
        return locked

    async def run_unlock(self, tenant_slug: str, mailbox_name: str) -> bool:
        """True if this session held the lock and released it."""
        unlocked: bool = await self.db.fetchval(_SQL["run_unlock"], tenant_slug, mailbox_name)
        return unlocked

    async def finish(self, tenant_slug: str, mailbox_name: str, *, error: str | None,
                     warning: str | None) -> None:
        await self.db.execute(_SQL["finish"], tenant_slug, mailbox_name, _stored(error),
                              _stored(warning))


#: Errors and warnings in the mailbox state are for people, like last_error.
MAX_STATE_TEXT = 2000


@overload
def _stored(text: str) -> str: ...
@overload
def _stored(text: None) -> None: ...
def _stored(text: str | None) -> str | None:
    """Text for the mailbox state: errors quote what the server said."""
    return None if text is None else storable_text(text, MAX_STATE_TEXT)


@contextmanager
def _unless_removed(tenant_slug: str, mailbox_name: str) -> Iterator[None]:
    """NXI03 (the mailbox's registration or sync state is gone: removed
    while a run was under way) as MailboxRemoved."""
    try:
        yield
    except DatabaseError as exc:
        if exc.sqlstate == "NXI03":
            raise MailboxRemoved(tenant_slug, mailbox_name) from None
        raise


class MailboxRemoved(NexarchError):
    """The mailbox's registration is gone (removed while a run was under
    way): its runner stops, and nothing of it is created again."""

    def __init__(self, tenant_slug: str, mailbox_name: str) -> None:
        super().__init__(f"mailbox {tenant_slug}/{mailbox_name} is not registered any more")


def _check(tenant_slug: str, mailbox_name: str) -> None:
    validate_tenant_slug(tenant_slug)
    validate_mailbox_name(mailbox_name)
