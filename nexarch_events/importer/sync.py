"""One sync run of one mailbox.

EXAMINE (read-only) → decide the mode from UIDVALIDITY (``mail_import_begin``)
→ enumerate the real UIDs above the
watermark with UID SEARCH (a sparse mailbox is never walked as a number range;
``n:*``'s habit of returning the last message is filtered) → probe sizes in
chunks → fetch bodies with ``BODY.PEEK[]`` in batches bounded by count and
bytes (memory stays flat however large the mailbox) → per message ONE
transaction: archive (dedup by content hash), index job, location, advance,
NOTIFY (``StateStore.import_message``); new messages two at a time on two
connections, committed in UID order by Postgres (``pipeline.py``) → retry
recorded per-message failures (after new mail, so that one the server
cannot send never keeps newer mail out).

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
- A body whose length differs from the RFC822.SIZE the server reported for
  it, or a server-made substitute (Exchange's "Retrieval using the IMAP4
  protocol failed" message): the same kind of failure, never archived as
  the message. If a server keeps sending the same length that disagrees with
  its own RFC822.SIZE, the body is archived on the ``accept_mismatch_after``-th
  attempt, its location marked ``size mismatch: ...`` (an honest server
  whose size count is simply wrong would otherwise never be archived). A
  substitute is never archived; after ``max_failure_attempts`` it waits for
  an operator (``mailbox failures --retry/--clear``).
- A UID the server lists but sends nothing for, at or above the UIDNEXT it
  stated: recorded as failed *without* passing over it (a phantom UID
  4000000000 would otherwise lift the watermark above all later mail); a
  recorded failure is then asked for only by the failure retries.
- One UID answered with two different messages: both archived by content
  without a location, the UID recorded as failed.
- A message the server cannot serve at all (it ends the connection at it
  every time, or answers NO: Dovecot with a corrupt mail file, a recorded
  failure expunged since): a per-message failure too, never a mailbox that
  stops (``_Run._fetch``).
- Throttling (``NO [UNAVAILABLE]``, ``[THROTTLED]``, ``[LIMIT]``,
  ``[INUSE]``): the same command is repeated in the same session after the
  server's suggested wait (at least ``throttle_min_wait``, at most
  ``throttle_max_wait``), at most
  ``throttle_retries`` times; then the run fails with a "throttled" error.
- ``* n EXISTS`` inside any reply (mail arrived while we were busy): another
  delta pass before the run ends, so an IDLE runner never re-enters IDLE
  with mail the server will not announce again.
- An unsolicited ``* n FETCH (FLAGS (...))`` without UID (RFC 3501 §7.4.2)
  is a flag update, not an anomaly: ignored.

A crash at any point costs at most the messages in flight (two): everything
before them committed with its advance; they are fetched again.
"""

from __future__ import annotations

import logging
import re
from collections.abc import AsyncIterator, Awaitable, Callable, Iterator, Sequence
from contextlib import asynccontextmanager
from dataclasses import dataclass, field, replace
from typing import ParamSpec, TypeVar

import trio

from ..aio import Connection, Database
from ..aio.imap import ImapSession, ReplyPart
from ..errors import (
    ConfigurationError,
    DatabaseError,
    DatabaseRejected,
    ImapCommandError,
    ImapError,
    ImapProtocolError,
    ImapThrottled,
    ImapUnavailable,
    NexarchError,
)
from ..mail.archive import MAX_MESSAGE_BYTES, Archived
from .mailboxes import MailboxConfig
from .pipeline import InFlightImports, SpareConnections, open_in_flight
from .protocol import (
    MAX_UID,
    FetchedItem,
    is_substitute,
    mailbox_argument,
    parse_examine,
    parse_fetch,
    parse_search,
    uid_set,
)
from .signin import SignIn
from .state import PendingFailure, StateStore

log = logging.getLogger(__name__)
T = TypeVar("T")
P = ParamSpec("P")

_SIZES = "(UID RFC822.SIZE)"
_BODIES = "(UID RFC822.SIZE INTERNALDATE BODY.PEEK[])"
_MISMATCH = "size mismatch"
_DOUBLED = ("the server answered this UID with two different messages (both archived "
            "without a location)")
#: A recorded size mismatch and how many attempts in a row gave exactly it.
_STREAK = re.compile(r"(.*?)(?: \(the same on (\d+) attempts in a row\))?", re.DOTALL)


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
    #: A body whose length disagrees with RFC822.SIZE is archived (marked)
    #: on this attempt, if every attempt before failed the same way.
    accept_mismatch_after: int = 3
    #: A throttled command is repeated this many times in the session ...
    throttle_retries: int = 4
    #: ... after the server's suggested wait, capped at this many seconds ...
    throttle_max_wait: float = 60.0
    #: ... or after this long when the server suggests nothing; never
    #: sooner than this (a suggested 0 ms was obeyed: five commands within
    #: 2 ms, a retry-loop audit).
    throttle_default_wait: float = 5.0
    throttle_min_wait: float = 1.0
    #: Delta passes per run while the server keeps announcing new mail.
    max_passes: int = 10
    #: After a cut reply the fetch window (messages per FETCH, at most
    #: probe_chunk) halves; it doubles again after this many clean replies.
    window_grow_after: int = 4
    #: New messages in flight at once, each on its own connection, committed
    #: in UID order (importer/pipeline.py): 2, or 1 for one at a time.
    in_flight: int = 2

    def __post_init__(self) -> None:
        # 3 measured slower than 2 (bench/README.md, "Two in flight").
        if self.in_flight not in (1, 2):
            raise ValueError(f"in_flight must be 1 or 2, got {self.in_flight!r}")


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
    #: Commands the server throttled (each one waited and repeated).
    throttled: int = 0
    #: Delta passes (more than one: mail arrived during the run).
    passes: int = 0
    #: The most new messages that were in flight at once (2: a second
    #: connection overlapped their transactions; importer/pipeline.py).
    max_in_flight: int = 0
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
                    limits: ImportLimits = ImportLimits(),
                    spare: SpareConnections | None = None) -> SyncReport:
    """One run over an open session, on the executor that holds the run
    lock. Raises ImapError / DatabaseError on failure; everything committed
    before that stays committed. ``spare``: where a second connection for
    new messages in flight comes from (None: one at a time)."""
    tenant, name = config.tenant_slug, config.name
    report = SyncReport(tenant, name)
    folder = mailbox_argument(config.folder, wire=config.folder_wire)
    status = parse_examine(await patiently(limits, report, session.examine, folder))
    start = await store.begin(tenant, name, status.uidvalidity, status.uidnext, status.exists,
                              mailbox_id=config.id)
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
    window = _Window(store, tenant, name, start.fetch_window, limits)
    run = _Run(store, config, session, limits, report, status.uidvalidity, window,
               spare if limits.in_flight > 1 else None, status.uidnext)
    # The failures recorded before this run (not those it records).
    await run.load_failures()

    async def delta_passes() -> None:
        while True:
            seen = session.exists_seen
            await run.import_above(report.last_synced_uid)
            report.passes += 1
            # EXISTS during the pass: mail arrived after our UID SEARCH. The
            # server will not announce it again, so fetch it now.
            if session.exists_seen == seen or report.passes >= limits.max_passes:
                return

    await delta_passes()
    # Recorded failures after new mail: a message the server cannot send
    # may end the session when it is asked for again, and must not keep
    # newer mail out.
    seen = session.exists_seen
    await run.retry_failures()
    if session.exists_seen != seen and report.passes < limits.max_passes:
        # Mail announced during the retries (an IDLE runner would otherwise
        # wait for the next refresh: a review).
        await delta_passes()
    return report


async def patiently(limits: ImportLimits, report: SyncReport,
                    fn: Callable[P, Awaitable[T]], *args: P.args, **kwargs: P.kwargs) -> T:
    """``fn(*args, **kwargs)``, repeated after the server's suggested wait while it is
    throttled (at most ``limits.throttle_retries`` times). Blocks in
    trio.sleep between attempts; cancellation ends the wait."""
    attempt = 0
    while True:
        try:
            return await fn(*args, **kwargs)
        except ImapThrottled as exc:
            report.throttled += 1
            if attempt >= limits.throttle_retries:
                raise ImapThrottled(f"{exc} (still throttled after {attempt} retries)",
                                    code=exc.code, wait=exc.wait) from None
            attempt += 1
            wait = exc.wait if exc.wait is not None else limits.throttle_default_wait
            wait = max(limits.throttle_min_wait, min(wait, limits.throttle_max_wait))
            log.info("mailbox %s/%s: server throttles (%s); retrying in %.1f s",
                     report.tenant_slug, report.mailbox_name, exc.code, wait)
            await trio.sleep(wait)


class _Window:
    """Messages per FETCH. Providers end sessions mid-reply on bandwidth
    limits (Gmail: ``* BYE`` inside a FETCH reply); asking for the same 200
    again would be cut again, forever. Persisted on the mailbox state."""

    def __init__(self, store: StateStore, tenant: str, name: str, size: int | None,
                 limits: ImportLimits) -> None:
        self.store, self.tenant, self.name = store, tenant, name
        self.full = max(1, limits.probe_chunk)
        self.size = min(size or self.full, self.full)
        self.grow_after = limits.window_grow_after
        self.clean_replies = 0

    async def cut(self, received: int) -> int:
        """A reply was cut after ``received`` responses: at least halve (the
        server demonstrably delivers ``received`` at a time)."""
        self.clean_replies = 0
        new = max(1, min(self.size // 2, received))
        if new != self.size:
            self.size = new
            with trio.move_on_after(5, shield=True):
                try:
                    await self.store.set_fetch_window(self.tenant, self.name, new)
                except DatabaseError as exc:
                    log.warning("mailbox %s/%s: cannot store the fetch window: %s",
                                self.tenant, self.name, exc)
        return self.size

    async def clean(self) -> None:
        if self.size >= self.full:
            return
        self.clean_replies += 1
        if self.clean_replies >= self.grow_after:
            self.clean_replies = 0
            self.size = min(self.full, self.size * 2)
            await self.store.set_fetch_window(self.tenant, self.name, self.size)


class _Run:
    def __init__(self, store: StateStore, config: MailboxConfig, session: ImapSession,
                 limits: ImportLimits, report: SyncReport, uidvalidity: int,
                 window: _Window, spare: SpareConnections | None,
                 uidnext: int | None = None) -> None:
        self.store, self.config, self.session = store, config, session
        self.limits, self.report, self.uidvalidity = limits, report, uidvalidity
        #: UIDNEXT as the server stated it at EXAMINE (None: not stated).
        self.uidnext = uidnext
        self.window = window
        self.spare = spare
        self.pending: dict[int, PendingFailure] = {}
        #: UIDs with a recorded failure at this UIDVALIDITY (retried or given
        #: up): never fetched by a delta pass, only by ``retry_failures``.
        self.recorded: set[int] = set()
        #: New messages in flight (during a body batch of a delta pass).
        self.imports: InFlightImports | None = None
        #: The UID the next new message follows: the watermark once
        #: everything sent or recorded before it has committed.
        self.after = 0

    async def _imap(self, fn: Callable[P, Awaitable[T]], *args: P.args,
                    **kwargs: P.kwargs) -> T:
        return await patiently(self.limits, self.report, fn, *args, **kwargs)

    async def load_failures(self) -> None:
        recorded = await self.store.recorded_failures(
            self.config.tenant_slug, self.config.name, self.uidvalidity)
        self.pending = {p.uid: p for p in recorded
                        if p.attempts < self.limits.max_failure_attempts}
        self.recorded = {p.uid for p in recorded}

    async def retry_failures(self) -> None:
        """Fetch the failures ``load_failures`` found again."""
        if self.pending:
            await self._import(sorted(self.pending), retry=True)

    async def import_above(self, watermark: int) -> None:
        if watermark >= MAX_UID:
            return
        found = parse_search(await self._imap(self.session.uid_search,
                                              f"UID {watermark + 1}:*"))
        # "n:*" includes the highest UID even when it is below n (RFC 3501
        # §9, seq-range): that message is already imported. UID 0 and
        # out-of-range values are not UIDs.
        # A recorded failure above the watermark was not passed over (see
        # ``_failed``): ``retry_failures`` asks for it, once a run and up to
        # the attempts limit; a delta pass fetching it too counted attempts
        # without limit, and imported it twice when it came (a review).
        uids = sorted({u for u in found if watermark < u <= MAX_UID and u not in self.recorded})
        if len(uids) != len(found) and any(u == 0 or u > MAX_UID for u in found):
            self.report.warn("UID SEARCH returned UID 0 or a value above 2^32-1 (ignored)")
        self.after = watermark
        await self._import(uids, retry=False)

    async def _import(self, uids: Sequence[int], *, retry: bool) -> None:
        i = 0
        while i < len(uids):
            chunk = uids[i:i + min(self.limits.probe_chunk, self.window.size)]
            # Sizes only group messages into batches: one message needs none.
            # A server that ends the session after one response (the window
            # shrank to 1) cut the probe after its size every time, and the
            # message never came (a review); its body alone is kept.
            sizes = await self._probe(chunk, retry=retry) if len(chunk) > 1 else {}
            limits = replace(self.limits,
                             batch_messages=min(self.limits.batch_messages, self.window.size))
            for batch in _batches(chunk, sizes, limits):
                await self._fetch_and_store(batch, retry=retry)
            i += len(chunk)

    async def _fetch(self, uids: Sequence[int], items: str,
                     on_item: Callable[[FetchedItem], Awaitable[None]], *, retry: bool,
                     limit: float | None = None) -> str | None:
        """One UID FETCH, each response parsed and handed to ``on_item`` as
        it completes. A reply cut mid-way shrinks the fetch window (persisted)
        and fails the run with an error that says so; clean replies grow it.

        A server that cannot serve one message fails that message, never the
        mailbox (what does not arrive becomes a per-message failure):
        - cut again while sending one message alone (the window shrank to it
          after a cut at it), or a recorded failure: that message is
          recorded (an attempt counted), and the run ends (the session is
          gone);
        - NO after some of the messages (Dovecot, a corrupt mail file): the
          ones that arrived are kept, and the NO's text is returned for the
          caller to record the rest with;
        - NO with nothing: for several messages the window shrinks to one
          and the run ends; for one new message it is recorded and the run
          ends (a server that refuses everything for a while costs one
          message per run, not the mailbox); for a recorded failure the
          text is returned (an attempt is counted)."""
        received = 0
        wanted = set(uids)

        async def on_response(parts: list[ReplyPart]) -> None:
            nonlocal received
            for item in parse_fetch(parts):
                # Responses to the request only: not unsolicited flag updates.
                received += item.uid in wanted and (item.size is not None or item.answers_body)
                await on_item(item)

        try:
            # Bodies waiting for Postgres: a batch holds batch_bytes by the
            # probe's sizes; twice that leaves room for a server that counts
            # bare LFs, none for one that understates.
            await self._imap(self.session.uid_fetch_each, uid_set(uids), items, on_response,
                             limit=limit, hold=2 * self.limits.batch_bytes)
        except ImapThrottled:
            raise
        except (ImapUnavailable, ImapProtocolError) as exc:
            # A reply that breaks the protocol (a literal longer than the
            # server said) ends the session like a cut: what came before it
            # is kept, the rest is asked for again in smaller windows.
            await self._settle()
            if len(uids) == 1 and received == 0 and (retry or self.window.size == 1):
                await self._failed(uids[0], "the server ended the connection while sending "
                                   f"this message, asked for alone ({exc})", retry=retry)
                raise ImapUnavailable(f"{exc}; cut again at UID {uids[0]}, asked for alone: "
                                      "recorded as failed") from None
            shrunk = await self.window.cut(received)
            raise ImapUnavailable(f"{exc}; the reply was cut after {received} of {len(uids)} "
                                  f"message(s): asking for {shrunk} per FETCH from now "
                                  "on") from None
        except ImapCommandError as exc:
            if exc.result != "NO":
                raise
            await self._settle()
            if received == 0 and len(uids) > 1:
                shrunk = await self.window.cut(0)
                raise ImapCommandError(f"{exc}; none of {len(uids)} message(s) arrived: "
                                       f"asking for {shrunk} per FETCH from now on",
                                       result="NO") from None
            if received == 0 and not retry:
                await self._failed(uids[0], f"the server refused it ({exc})", retry=False)
                raise ImapCommandError(f"{exc}; UID {uids[0]} recorded as failed",
                                       result="NO") from None
            return f"the server did not send it ({exc})"
        if self.window.size < self.window.full:
            # clean() may write the window on the run's connection.
            await self._settle()
        await self.window.clean()
        return None

    async def _probe(self, uids: Sequence[int], *, retry: bool) -> dict[int, int]:
        wanted = set(uids)
        sizes: dict[int, int] = {}

        async def on_item(item: FetchedItem) -> None:
            if item.uid in wanted and item.size is not None:
                sizes[item.uid] = item.size

        # A refusal after some sizes: the rest count as 0 here and fail when
        # their bodies do not come either.
        await self._fetch(uids, _SIZES, on_item, retry=retry)
        return sizes

    async def _fetch_and_store(self, uids: Sequence[int], *, retry: bool) -> None:
        """Bodies of ``uids`` (ascending). Each message commits as soon as
        its response is complete and every UID before it is settled, so a
        cut costs at most the message in flight; responses that come out of
        UID order wait for the ones before them (notifications per mailbox
        must ascend).

        Those waiting hold at most ``batch_bytes``: the batch was sized by
        the probe's RFC822.SIZEs, which a server may state wrong (1 byte for
        3 MiB messages, then sent in descending order: the whole batch was
        held). Past it the reply is abandoned like a cut (the window
        shrinks to what arrived)."""
        wanted = set(uids)
        arrived: dict[int, FetchedItem] = {}
        waiting_bytes = 0
        settled: set[int] = set()
        #: UIDs answered with two different messages: neither is theirs.
        doubled: set[int] = set()
        order: list[int] = []
        next_index = 0

        async def settle_ready() -> None:
            nonlocal next_index, waiting_bytes
            while next_index < len(uids) and (uids[next_index] in arrived
                                              or uids[next_index] in doubled):
                uid = uids[next_index]
                next_index += 1
                got = arrived.pop(uid, None)
                if got is None:
                    await self._failed(uid, _DOUBLED, retry=retry, arrived=True)
                else:
                    waiting_bytes -= len(got.body or b"")
                    await self._store(uid, got, retry=retry)
                settled.add(uid)

        async def on_item(item: FetchedItem) -> None:
            nonlocal waiting_bytes
            if item.flags_only or not item.answers_body:
                # A flag update, with or without its UID: no answer to ours.
                return
            if item.uid is None or item.uid == 0:
                await self._untrusted(item)
            elif item.uid not in wanted:
                # E.g. the last message, sent for "n:*"; it is fetched by its
                # own UID when it is due.
                self.report.warn(f"FETCH returned UID {item.uid}, which was not asked for "
                                 "(ignored)")
            elif item.uid in arrived and item.body == arrived[item.uid].body:
                self.report.warn(f"FETCH returned UID {item.uid} twice (the same message)")
            elif item.uid in arrived or item.uid in settled or item.uid in doubled:
                # Two messages under one UID: the server mislabelled one
                # (e.g. UID 5's answer said UID 7, then UID 7 came). The
                # second was dropped, and with it the real message 7 (a
                # review). Both are archived by content, without a location
                # (nothing new if the archive has one already), and the UID
                # is a failure, asked for again. One already stored under the
                # UID stays there.
                said = f"FETCH returned UID {item.uid} twice with different messages: " \
                       "archived without a location, the UID is retried"
                first = arrived.pop(item.uid, None)
                if first is not None:
                    waiting_bytes -= len(first.body or b"")
                    doubled.add(item.uid)
                    await self._unplaced(first, said)
                await self._unplaced(item, said)
                await settle_ready()
            else:
                arrived[item.uid] = item
                waiting_bytes += len(item.body or b"")
                if order and item.uid < order[-1]:
                    self.report.warn("FETCH responses came out of UID order; imported in "
                                     "UID order")
                order.append(item.uid)
                await settle_ready()
                if waiting_bytes > self.limits.batch_bytes:
                    raise ImapUnavailable(
                        f"{waiting_bytes} bytes of messages arrived ahead of UID "
                        f"{uids[next_index]}, more than a batch's {self.limits.batch_bytes}: "
                        "the server's RFC822.SIZEs were wrong; reply abandoned")

        async with self._in_flight(len(uids), retry=retry):
            refused = await self._fetch(uids, _BODIES, on_item, retry=retry,
                                        limit=self.limits.fetch_timeout)
            for uid in uids[next_index:]:
                got = arrived.pop(uid, None)
                if uid in doubled:
                    await self._failed(uid, _DOUBLED, retry=retry, arrived=True)
                elif got is None:
                    await self._failed(uid, refused or _problem(None) or "", retry=retry)
                else:
                    await self._store(uid, got, retry=retry)

    @asynccontextmanager
    async def _in_flight(self, batch: int, *, retry: bool) -> AsyncIterator[None]:
        """New messages of this batch go through ``self.imports``: up to two
        in flight when a spare connection is to be had, else one at a time
        (the same path, so the same order guarantee). Retries of recorded
        failures are imported one at a time on the run's connection."""
        if retry:
            yield
            return
        spare = self.spare.borrow(batch, self.limits.in_flight - 1) \
            if self.spare is not None else _no_spare()
        async with spare as extra, open_in_flight(
                [self.store, *extra],
                tenant=self.config.tenant_slug, mailbox=self.config.name,
                uidvalidity=self.uidvalidity, on_settled=self._imported,
                on_refused=self._refused) as imports:
            self.imports = imports
            try:
                yield
            finally:
                self.imports = None
                self.report.max_in_flight = max(self.report.max_in_flight, imports.most)

    async def _settle(self) -> None:
        """Before anything else uses the run's connection: wait for the
        messages in flight (one of them may be on it)."""
        if self.imports is not None:
            await self.imports.settle()

    async def _refused(self, uid: int, exc: DatabaseRejected, store: StateStore) -> None:
        # One message's data, not the mailbox: the run goes on past it, and
        # later runs try it again (mode "recovered"), as for a message the
        # server would not hand over. Recorded on the refused import's own
        # connection (free now; everything before it has settled), and
        # ``self.after`` stays: the imports after it were sent already.
        await self._record(store, uid, refusal(exc), retry=False)

    def _imported(self, uid: int, archived: Archived) -> None:
        self.report.imported += 1
        self.report.duplicates += not archived.created
        self.report.last_synced_uid = uid

    async def _store(self, uid: int, got: FetchedItem, *, retry: bool) -> None:
        problem = _problem(got)
        note = None
        if problem is None:
            assert got.body is not None
            problem = _suspicious(got)
            streak = self._mismatch_streak(uid, problem) if problem is not None else 0
            if problem is not None and streak >= self.limits.accept_mismatch_after:
                note = f"{problem} (archived after {streak} attempts with the same result)"
                problem = None
            elif streak > 1:
                problem = f"{problem} (the same on {streak} attempts in a row)"
        if problem is not None:
            await self._failed(uid, problem, retry=retry, arrived=True)
            return
        assert got.body is not None
        if note is not None:
            self.report.warn(f"UID {uid}: {note}")
        if retry:
            try:
                await self.store.import_message(
                    self.config.tenant_slug, self.config.name, self.uidvalidity, uid,
                    "recovered", got.body, internaldate=got.internaldate, note=note)
            except DatabaseRejected as exc:
                await self._failed(uid, refusal(exc), retry=True)
                return
            self.report.recovered += 1
            return
        assert self.imports is not None
        await self.imports.submit(uid, self.after, got.body, internaldate=got.internaldate,
                                  note=note)
        self.after = uid

    def _mismatch_streak(self, uid: int, problem: str) -> int:
        """For a size mismatch: how many attempts in a row, this one
        included, gave exactly ``problem`` (the same RFC822.SIZE and the same
        length received; the count is kept in the recorded error). Any other
        problem: 0. Any mismatch on the third attempt was archived, even
        truncations of a different length each time, or after failures of
        another kind (a review)."""
        if not problem.startswith(_MISMATCH):
            return 0
        before = self.pending.get(uid)
        match = _STREAK.fullmatch(before.last_error) if before is not None else None
        if match is None or match.group(1) != problem:
            return 1
        return int(match.group(2) or 1) + 1

    async def _untrusted(self, item: FetchedItem) -> None:
        self.report.warn("FETCH returned a message with UID 0 or no UID: UIDs of this "
                         "mailbox are not trusted; its content is archived without a location "
                         "and the UID asked for is retried")
        await self._unplaced(item, None)

    async def _unplaced(self, item: FetchedItem, warning: str | None) -> None:
        """Archive ``item``'s body by content, without a location; ``warning``
        is said if that archived something new."""
        if not item.body:
            return
        await self._settle()
        try:
            archived = await self.store.import_message(
                self.config.tenant_slug, self.config.name, self.uidvalidity, None, "unstable",
                item.body, mailbox_id=self.config.id)
        except DatabaseRejected as exc:
            self.report.warn(f"a message without a trusted UID could not be archived: "
                             f"{refusal(exc)}")
            return
        if warning is None or archived.created:
            self.report.untrusted += 1
            if warning is not None:
                self.report.warn(warning)

    async def _failed(self, uid: int, problem: str, *, retry: bool,
                      arrived: bool = False) -> None:
        """Record ``uid``'s failure (and, unless ``retry``, advance past it),
        once everything in flight has settled.

        A UID of which nothing ``arrived``, at or above the UIDNEXT the
        server stated, is recorded without advancing past it: nothing shows
        it exists. A server that listed UID 4000000000 in its UID SEARCH and
        then had no such message moved the watermark there, and the mail it
        received later (UIDs 7, 8, ...) was never imported (a review)."""
        if not retry and not arrived and self.uidnext is not None and uid >= self.uidnext:
            self.report.warn(
                f"the server listed UID {uid}, at or above its UIDNEXT {self.uidnext}, and "
                "sent nothing for it: recorded as failed without passing over it (mail "
                "below it still comes in)")
            retry = True
            self.recorded.add(uid)
        await self._settle()
        await self._record(self.store, uid, problem, retry=retry)
        if not retry:
            self.after = uid

    async def _record(self, store: StateStore, uid: int, problem: str, *, retry: bool) -> None:
        attempts = await store.record_failure(
            self.config.tenant_slug, self.config.name, self.uidvalidity, uid, problem,
            retry=retry, mailbox_id=self.config.id)
        self.report.failed += 1
        if not retry:
            self.report.last_synced_uid = uid
        log.warning("mailbox %s/%s: UID %d not imported (attempt %d): %s",
                    self.config.tenant_slug, self.config.name, uid, attempts, problem)


@asynccontextmanager
async def _no_spare() -> AsyncIterator[list[StateStore]]:
    yield []


def _problem(item: FetchedItem | None) -> str | None:
    if item is None:
        return "the server returned no data for this UID"
    if item.discarded is not None:
        return (f"message is {item.discarded.size} bytes; the archive's limit is "
                f"{item.discarded.limit} (read and discarded, RFC822.SIZE {item.size})")
    if item.body is None:
        return f"the server sent BODY[] NIL (RFC822.SIZE {item.size})"
    if not item.body:
        return ("the server sent an empty body"
                + (f" although RFC822.SIZE is {item.size}" if item.size else ""))
    if len(item.body) > MAX_MESSAGE_BYTES:
        return f"message is {len(item.body)} bytes; the archive's limit is {MAX_MESSAGE_BYTES}"
    return None


def refusal(exc: DatabaseRejected) -> str:
    """A message's failure when Postgres refused its data."""
    return f"the database refused the message: {exc}"


def _suspicious(item: FetchedItem) -> str | None:
    """Why a body that did arrive is not the message, or None."""
    assert item.body is not None
    if is_substitute(item.body):
        return ("the server sent a substitute instead of the message (\"Retrieval using the "
                f"IMAP4 protocol failed\", {len(item.body)} bytes, RFC822.SIZE {item.size})")
    if item.size is not None and item.size != len(item.body):
        return f"{_MISMATCH}: RFC822.SIZE {item.size}, received {len(item.body)} bytes"
    return None


async def _unstable_pass(store: StateStore, config: MailboxConfig, session: ImapSession,
                         exists: int, limits: ImportLimits, report: SyncReport) -> None:
    """Every message, by sequence number, archived by content hash. UIDs are
    recorded as locations only when they look like UIDs; none is trusted for
    the watermark."""
    for first in range(1, exists + 1, limits.probe_chunk):
        last = min(exists, first + limits.probe_chunk - 1)
        probe = parse_fetch(await patiently(limits, report, session.fetch,
                                            f"{first}:{last}", _SIZES))
        # Sequence numbers have no gaps: none past the last one probed.
        end = max((i.seq for i in probe if first <= i.seq <= last), default=first - 1)
        sizes = {i.seq: i.size or 0 for i in probe}
        seqs = list(range(first, end + 1))
        for batch in _batches(seqs, sizes, limits):
            items = parse_fetch(await patiently(limits, report, session.fetch, uid_set(batch),
                                                _BODIES, limit=limits.fetch_timeout))
            answered = set()
            for item in sorted(items, key=lambda i: i.seq):
                if not item.answers_body or item.seq not in batch:
                    continue  # a flag update (with its UID or without), not our answer
                answered.add(item.seq)
                problem = _problem(item) or _suspicious(item)
                if problem is not None:
                    # No UID to record a failure under: the next pass (every
                    # run is a full pass) tries it again.
                    report.warn(f"message {item.seq} (UID {item.uid}) could not be fetched: "
                                f"{problem}")
                    report.failed += 1
                    continue
                assert item.body is not None
                uid = item.uid if item.uid is not None and 1 <= item.uid <= MAX_UID else None
                try:
                    archived = await store.import_message(
                        config.tenant_slug, config.name, 0, uid, "unstable", item.body,
                        internaldate=item.internaldate, mailbox_id=config.id)
                except DatabaseRejected as exc:
                    report.warn(f"message {item.seq} (UID {item.uid}) could not be archived: "
                                f"{refusal(exc)}")
                    report.failed += 1
                    continue
                report.imported += archived.created or archived.location_added
                report.duplicates += not archived.created
            if len(answered) < len(batch):
                report.warn("the server sent no body for some messages (tried again on the "
                            "next pass)")
                report.failed += len(batch) - len(answered)
        if end < last:
            # EXISTS 4294967295 with three messages was 21 million probes in
            # one run (a review). Expunged since EXAMINE, never there, or not
            # answered for: the next pass (every run is one) looks again.
            report.warn(f"the server announced {exists} messages and answered for none "
                        f"after message {end}: the pass ends there")
            return


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
    runs; behind a transaction pooler, a direct one of the run's own: see
    ``Database.session``) or a URL (a connection of the run's own). New
    messages are imported two at a time where a second connection is to be
    had (``limits.in_flight``; see importer/pipeline.py): from the pool if
    one is free at once, or opened for the run from the URL."""
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
        spare = SpareConnections(db, connect_timeout=connect_timeout)
        try:
            return await _locked_run(store, config, sign_in, session, limits, imap_timeout,
                                     spare)
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
            await spare.aclose()


async def _locked_run(store: StateStore, config: MailboxConfig, sign_in: SignIn,
                      session: ImapSession | None, limits: ImportLimits,
                      imap_timeout: float, spare: SpareConnections) -> SyncReport:
    # A run that fails before mail_import_begin (connect, TLS, login,
    # EXAMINE) must still find a state row to record its error on.
    await store.get_or_create(config.tenant_slug, config.name, config.id)
    await store.attempt_started(config.tenant_slug, config.name)
    own = session is None
    try:
        if session is None:
            session = await sign_in.open(config.endpoint(timeout=imap_timeout))
        report = await sync_once(store, config, session, limits, spare)
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
        # session(): the run lock is a session lock, which a transaction
        # pooler would leave behind on a server connection nobody owns.
        async with db.session() as conn:
            yield conn
