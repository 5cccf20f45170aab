"""One sync run of one mailbox.

EXAMINE (read-only) → decide the mode from UIDVALIDITY (``mail_import_begin``)
→ retry recorded per-message failures → enumerate the real UIDs above the
watermark with UID SEARCH (a sparse mailbox is never walked as a number range;
``n:*``'s habit of returning the last message is filtered) → probe sizes in
chunks → fetch bodies with ``BODY.PEEK[]`` in batches bounded by count and
bytes (memory stays flat however large the mailbox) → per message ONE
transaction: archive (dedup by content hash), index job, location, advance,
NOTIFY (``StateStore.import_message``).

Nothing a server says is taken on trust:

- UIDVALIDITY 0 or absent: an *unstable* pass: every message fetched by
  sequence number, archived by content hash (no duplicates), the watermark
  left alone, a warning on the mailbox state.
- A FETCH response with UID 0, no UID, or a UID we did not ask for: never
  mapped to a location. Bodies with no trustworthy UID are archived by content
  only; the UID we asked for is recorded as a failure and retried.
- Responses out of UID order are imported in UID order (notifications per
  mailbox must ascend), with a warning.
- ``BODY[] NIL``, an empty body, or no data at all: a per-message failure,
  recorded in the same transaction that advances past it, retried every run;
  later messages go on.

A crash at any point loses at most the message in flight: everything before
it committed with its advance; nothing after it was written.
"""

from __future__ import annotations

import logging
from collections.abc import AsyncIterator, Iterator, Sequence
from contextlib import asynccontextmanager
from dataclasses import dataclass, field

import trio

from ..aio import Connection, Database
from ..aio.imap import ImapSession
from ..errors import ConfigurationError, DatabaseError, ImapError, NexarchError
from ..mail.archive import MAX_MESSAGE_BYTES
from .mailboxes import MailboxConfig
from .protocol import (
    MAX_UID,
    FetchedItem,
    mailbox_argument,
    parse_examine,
    parse_fetch,
    parse_search,
    uid_set,
)
from .signin import SignIn
from .state import StateStore

log = logging.getLogger(__name__)

_SIZES = "(UID RFC822.SIZE)"
_BODIES = "(UID RFC822.SIZE BODY.PEEK[])"


class MailboxBusy(NexarchError):
    """Another run of this mailbox (in this or another process) holds its lock."""


@dataclass(frozen=True, slots=True)
class ImportLimits:
    #: UIDs per size probe. Also bounds reply lines per command: aioimaplib
    #: parses a reply recursively, line by line (aioimaplib #118).
    probe_chunk: int = 200
    #: A body batch holds at most this many messages ...
    batch_messages: int = 50
    #: ... and this many bytes (a larger message is fetched alone).
    batch_bytes: int = 8 * 1024 * 1024
    #: A failed message is retried by this many runs, then left recorded for
    #: an operator.
    max_failure_attempts: int = 10
    #: Longest wait for one body batch.
    fetch_timeout: float = 300.0


@dataclass(slots=True)
class SyncReport:
    tenant_slug: str
    mailbox_name: str
    mode: str = ""
    uidvalidity: int | None = None
    #: Messages whose advance committed (new to the archive or not).
    imported: int = 0
    #: Of those, already in the archive (same bytes elsewhere, or a resync).
    duplicates: int = 0
    #: Earlier failures imported now.
    recovered: int = 0
    #: Messages recorded as failures in this run.
    failed: int = 0
    #: Bodies archived by content only (their UID could not be trusted).
    untrusted: int = 0
    last_synced_uid: int = 0
    warnings: list[str] = field(default_factory=list)

    def warn(self, text: str) -> None:
        if text not in self.warnings:
            log.warning("mailbox %s/%s: %s", self.tenant_slug, self.mailbox_name, text)
            self.warnings.append(text)

    @property
    def warning(self) -> str | None:
        return "; ".join(self.warnings) if self.warnings else None


async def sync_once(store: StateStore, config: MailboxConfig, session: ImapSession,
                    limits: ImportLimits = ImportLimits()) -> SyncReport:
    """One run over an open session, on the executor that holds the run
    lock. Raises ImapError / DatabaseError on failure; everything committed
    before that stays committed."""
    tenant, name = config.tenant_slug, config.name
    report = SyncReport(tenant, name)
    status = parse_examine(await session.examine(mailbox_argument(config.folder)))
    start = await store.begin(tenant, name, status.uidvalidity, status.uidnext, status.exists)
    report.mode, report.uidvalidity = start.mode, status.uidvalidity
    report.last_synced_uid = start.last_synced_uid
    if start.mode == "unstable":
        said = "none" if status.uidvalidity_raw is None else str(status.uidvalidity_raw)
        report.warn(f"server sent UIDVALIDITY {said}: UIDs cannot be trusted; every run "
                    "is a full pass that archives by content hash")
        await _unstable_pass(store, config, session, status.exists or 0, limits, report)
        return report
    assert status.uidvalidity is not None
    if start.mode == "resync":
        report.warn(f"UIDVALIDITY changed from {start.old_uidvalidity} to "
                    f"{status.uidvalidity}: full resync, archived messages re-mapped "
                    "by content hash")
    run = _Run(store, config, session, limits, report, status.uidvalidity)
    await run.retry_failures()
    await run.import_above(start.last_synced_uid)
    return report


class _Run:
    def __init__(self, store: StateStore, config: MailboxConfig, session: ImapSession,
                 limits: ImportLimits, report: SyncReport, uidvalidity: int) -> None:
        self.store, self.config, self.session = store, config, session
        self.limits, self.report, self.uidvalidity = limits, report, uidvalidity

    async def retry_failures(self) -> None:
        pending = await self.store.pending_failures(
            self.config.tenant_slug, self.config.name, self.uidvalidity,
            self.limits.max_failure_attempts)
        if not pending:
            return
        uids = [p.uid for p in pending]
        await self._import(uids, retry=True)

    async def import_above(self, watermark: int) -> None:
        if watermark >= MAX_UID:
            return
        found = parse_search(await self.session.uid_search(f"UID {watermark + 1}:*"))
        # "n:*" includes the highest UID even when it is below n (RFC 3501
        # §9, seq-range): that message is already imported. UID 0 and
        # out-of-range values are not UIDs.
        uids = sorted({u for u in found if watermark < u <= MAX_UID})
        if len(uids) != len(found) and any(u == 0 or u > MAX_UID for u in found):
            self.report.warn("UID SEARCH returned UID 0 or a value above 2^32-1 (ignored)")
        await self._import(uids, retry=False)

    async def _import(self, uids: Sequence[int], *, retry: bool) -> None:
        for chunk in _chunks(uids, self.limits.probe_chunk):
            sizes = await self._probe(chunk)
            for batch in _batches(chunk, sizes, self.limits):
                await self._fetch_and_store(batch, retry=retry)

    async def _probe(self, uids: Sequence[int]) -> dict[int, int]:
        items = parse_fetch(await self.session.uid_fetch(uid_set(uids), _SIZES))
        wanted = set(uids)
        return {i.uid: i.size or 0 for i in items if i.uid in wanted}

    async def _fetch_and_store(self, uids: Sequence[int], *, retry: bool) -> None:
        parts = await self.session.uid_fetch(uid_set(uids), _BODIES,
                                             limit=self.limits.fetch_timeout)
        items = parse_fetch(parts)
        del parts
        by_uid: dict[int, FetchedItem] = {}
        order: list[int] = []
        wanted = set(uids)
        for item in items:
            if item.uid is None or item.uid == 0:
                await self._untrusted(item)
            elif item.uid not in wanted:
                # E.g. the last message, sent for "n:*"; it is fetched by its
                # own UID when it is due.
                self.report.warn(f"FETCH returned UID {item.uid}, which was not asked for "
                                 "(ignored)")
            elif item.uid in by_uid:
                self.report.warn(f"FETCH returned UID {item.uid} twice (first one kept)")
            else:
                by_uid[item.uid] = item
                order.append(item.uid)
        if order != sorted(order):
            self.report.warn("FETCH responses came out of UID order; imported in UID order")
        del items
        for uid in uids:
            got = by_uid.pop(uid, None)
            problem = _problem(got)
            if problem is not None:
                await self._failed(uid, problem, retry=retry)
                continue
            assert got is not None and got.body is not None
            if got.size is not None and got.size != len(got.body):
                self.report.warn(f"UID {uid}: RFC822.SIZE {got.size} but {len(got.body)} "
                                 "bytes received")
            archived = await self.store.import_message(
                self.config.tenant_slug, self.config.name, self.uidvalidity, uid,
                "recovered" if retry else "new", got.body)
            if retry:
                self.report.recovered += 1
            else:
                self.report.imported += 1
                self.report.duplicates += not archived.created
                self.report.last_synced_uid = uid

    async def _untrusted(self, item: FetchedItem) -> None:
        self.report.warn("FETCH returned a message with UID 0 or no UID: UIDs of this "
                         "mailbox are not trusted; its content is archived without a location "
                         "and the UID asked for is retried")
        if item.body:
            await self.store.import_message(self.config.tenant_slug, self.config.name,
                                            self.uidvalidity, None, "unstable", item.body)
            self.report.untrusted += 1

    async def _failed(self, uid: int, problem: str, *, retry: bool) -> None:
        attempts = await self.store.record_failure(
            self.config.tenant_slug, self.config.name, self.uidvalidity, uid, problem,
            retry=retry)
        self.report.failed += 1
        if not retry:
            self.report.last_synced_uid = uid
        log.warning("mailbox %s/%s: UID %d not imported (attempt %d): %s",
                    self.config.tenant_slug, self.config.name, uid, attempts, problem)


def _problem(item: FetchedItem | None) -> str | None:
    if item is None:
        return "the server returned no data for this UID"
    if item.body is None:
        return f"the server sent BODY[] NIL (RFC822.SIZE {item.size})"
    if not item.body:
        return ("the server sent an empty body"
                + (f" although RFC822.SIZE is {item.size}" if item.size else ""))
    if len(item.body) > MAX_MESSAGE_BYTES:
        return f"message is {len(item.body)} bytes; the archive's limit is {MAX_MESSAGE_BYTES}"
    return None


async def _unstable_pass(store: StateStore, config: MailboxConfig, session: ImapSession,
                         exists: int, limits: ImportLimits, report: SyncReport) -> None:
    """Every message, by sequence number, archived by content hash. UIDs are
    recorded as locations only when they look like UIDs; none is trusted for
    the watermark."""
    for first in range(1, exists + 1, limits.probe_chunk):
        last = min(exists, first + limits.probe_chunk - 1)
        probe = parse_fetch(await session.fetch(f"{first}:{last}", _SIZES))
        sizes = {i.seq: i.size or 0 for i in probe}
        seqs = list(range(first, last + 1))
        for batch in _batches(seqs, sizes, limits):
            items = parse_fetch(await session.fetch(uid_set(batch), _BODIES,
                                                    limit=limits.fetch_timeout))
            for item in sorted(items, key=lambda i: i.seq):
                if _problem(item) is not None:
                    report.warn(f"message {item.seq} (UID {item.uid}) could not be fetched: "
                                f"{_problem(item)}")
                    report.failed += 1
                    continue
                assert item.body is not None
                uid = item.uid if item.uid is not None and 1 <= item.uid <= MAX_UID else None
                archived = await store.import_message(config.tenant_slug, config.name, 0, uid,
                                                      "unstable", item.body)
                report.imported += archived.created or archived.location_added
                report.duplicates += not archived.created


def _chunks(items: Sequence[int], size: int) -> Iterator[Sequence[int]]:
    for i in range(0, len(items), size):
        yield items[i:i + size]


def _batches(keys: Sequence[int], sizes: dict[int, int],
             limits: ImportLimits) -> Iterator[list[int]]:
    """Consecutive groups of ``keys`` within the batch limits."""
    batch: list[int] = []
    total = 0
    for key in keys:
        size = sizes.get(key, 0)
        if batch and (len(batch) >= limits.batch_messages
                      or total + size > limits.batch_bytes):
            yield batch
            batch, total = [], 0
        batch.append(key)
        total += size
    if batch:
        yield batch


async def acquire_run_lock(store: StateStore, tenant_slug: str, mailbox_name: str, *,
                           wait: float) -> None:
    """Take the mailbox's run lock (``store`` must sit on a dedicated
    connection). Waits up to ``wait`` seconds, then raises MailboxBusy."""
    with trio.move_on_after(wait):
        while True:
            if await store.try_run_lock(tenant_slug, mailbox_name):
                return
            await trio.sleep(0.05)
    raise MailboxBusy(f"mailbox {tenant_slug}/{mailbox_name} is being synced by another run "
                      f"(waited {wait:g} s)")


async def run_sync(db: Database | str, config: MailboxConfig, sign_in: SignIn | str, *,
                   session: ImapSession | None = None, limits: ImportLimits = ImportLimits(),
                   imap_timeout: float = 30.0, lock_wait: float = 30.0,
                   connect_timeout: float = 10.0) -> SyncReport:
    """A complete run: one Postgres connection that holds the mailbox's run
    lock for the run's length (so runs of one mailbox never overlap,
    anywhere), an IMAP session (``session``, or a new one closed at the end),
    the sync, and the outcome written to the mailbox state. Raises
    MailboxBusy, ImapError, DatabaseError or ConfigurationError (a secret
    cannot be read); the error is on the state too. ``sign_in`` opens the
    session when none is given; a string is a password to sign in with.

    ``db``: a pool (a warm connection is borrowed: no connect, statements
    already planned - about 15 ms less per run, which matters for IDLE-driven
    runs) or a URL (a connection of the run's own)."""
    if isinstance(sign_in, str):
        sign_in = SignIn(config, secret_key=None, password=sign_in)
    async with _run_connection(db, connect_timeout) as conn:
        store = StateStore(conn)
        try:
            await acquire_run_lock(store, config.tenant_slug, config.name, wait=lock_wait)
        except MailboxBusy:
            raise
        except BaseException:
            # Cancelled or broken mid-acquire: whether the server granted the
            # lock is unknown, so this connection must not be reused.
            conn.abort()
            raise
        try:
            return await _locked_run(store, config, sign_in, session, limits, imap_timeout)
        finally:
            # A pooled connection must not go back holding the lock: unlock,
            # and if that cannot be confirmed, drop the connection (the
            # server then releases the lock).
            unlocked = False
            with trio.move_on_after(5, shield=True):
                try:
                    unlocked = await store.run_unlock(config.tenant_slug, config.name)
                except DatabaseError:
                    pass
            if not unlocked:
                conn.abort()


async def _locked_run(store: StateStore, config: MailboxConfig, sign_in: SignIn,
                      session: ImapSession | None, limits: ImportLimits,
                      imap_timeout: float) -> SyncReport:
    # A run that fails before mail_import_begin (connect, TLS, login,
    # EXAMINE) must still find a state row to record its error on.
    await store.get_or_create(config.tenant_slug, config.name)
    own = session is None
    try:
        if session is None:
            session = await sign_in.open(config.endpoint(timeout=imap_timeout))
        report = await sync_once(store, config, session, limits)
    except (ImapError, DatabaseError, ConfigurationError) as exc:
        with trio.move_on_after(5, shield=True):
            try:
                await store.finish(config.tenant_slug, config.name, error=str(exc),
                                   warning=None)
            except DatabaseError:
                pass
        raise
    finally:
        if own and session is not None:
            await session.aclose()
    await store.finish(config.tenant_slug, config.name, error=None, warning=report.warning)
    return report


@asynccontextmanager
async def _run_connection(db: Database | str,
                          connect_timeout: float) -> AsyncIterator[Connection]:
    if isinstance(db, str):
        conn = await Connection.open(db, connect_timeout=connect_timeout)
        try:
            yield conn
        finally:
            await conn.aclose()
    else:
        async with db.acquire() as conn:
            yield conn
