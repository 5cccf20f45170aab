"""``GET /events``: the notification channels as Server-Sent Events, one
caller's tenant only, resumable with ``Last-Event-ID``.

Events: ``imported`` (mail-imported ``imported``/``recovered``/``unstable``),
``failed`` (an import failure, or a job that failed for good), ``indexed``
(jobs that succeeded), ``resync`` (an importer resync, or: notifications
may have been missed), and ``open`` first of all. Each event's ``data`` is
the notification's payload (docs/events.md) plus ``channel``, and
``replayed: true`` when it was read from the tables.

Event ids are a watermark ``"<archive_id>.<job_id>"``: the highest archive
id announced on this stream (new messages only), and the job whose outcome
was announced last. A client that reconnects with ``Last-Event-ID`` first
gets what it missed, read from the tables: archived messages above that
archive id (as ``imported``), then jobs that finished after that job did,
in finish order (as ``indexed``/``failed``); then the live events, with
those the replay already covered left out (a repeat is the same finish:
job, outcome and ``finished_at``; a job retried and finished again is new).
Finish order, not id order: a
retried job finishes long after higher ids, and must not be skipped.

A Last-Event-ID above every id the database has drawn (another
deployment's, or one from before a restore) would pin the watermark above
the real ids: the stream says ``resync`` and goes on from the newest ids.

Not replayed (the tables keep no order for them): import failures, importer
resyncs and sightings of already-archived messages (``duplicate: true``).
Commit order and id order can differ by the length of a transaction, so a
client that drops the connection in exactly that window may miss or see
again one event; ``/queue`` and ``/mailboxes`` are the truth.

When the listener's connection drops, notifications sent meanwhile are
gone: the stream says ``resync`` and replays from its watermark what the
tables recorded, as on a resume. Until that replay is done, live events are
held, not sent: one that arrives before the listener announces the
reconnect (its first channel listens again before its second) would move
the watermark past the missed ones. The replay reads the tables up to now,
which includes every held event (each was committed before it was
notified); then the held ones it did not cover (failures, duplicates,
importer resyncs) follow, in id order.

Order: every subscription gets Postgres' delivery order, which is commit
order. The two channels are merged by arrival time, each event held back
``settle`` seconds so that one that arrived earlier on the other channel
is sent first.
"""

from __future__ import annotations

import heapq
import re
import time
from collections import OrderedDict
from collections.abc import Hashable, Sequence
from dataclasses import dataclass
from datetime import datetime

import trio

from ..aio import Database
from ..errors import DatabaseTransient, DatabaseUnavailable, NexarchError
from ..models import JSONObject, JSONValue
from ..queue.jobs import FinishedJob, Queue
from ..queue.notify import (
    JOB_EVENTS_CHANNEL,
    MAIL_IMPORTED_CHANNEL,
    RESYNC,
    Event,
    Listener,
    Notification,
    Resync,
    Subscription,
)
from .asgi import Write, dumps, log
from .store import ArchivedMessage, allocated_ids, archived_after, newest_archive_id

CHANNELS = (MAIL_IMPORTED_CHANNEL, JOB_EVENTS_CHANNEL)
#: A replay longer than this is skipped: the client gets ``resync`` (reload
#: the state) and a watermark at the newest rows instead.
MAX_REPLAY = 1000
#: Live events waiting for a slow client; past this they are dropped and
#: replayed from the tables (as the listener does with its own buffers).
MAX_PENDING = 10_000
#: At most this many job ids per ``indexed``/``failed`` event, as on the channel.
IDS_PER_EVENT = 200
#: Remembered (kind, id) pairs that were sent, to leave out a live event the
#: replay already covered. Far more than a replay can hold.
SEEN_LIMIT = 20_000
SETTLE_S = 0.02
#: One reconnect gives every subscription a RESYNC: one ``resync`` event
#: is announced for those that come within this many seconds.
RESYNC_QUIET_S = 1.0

#: Why a resume cannot replay (queue.sql, "cursor_lost"), as the client reads it.
_LOST = {
    "pruned": "the job this stream resumed after was pruned (queue.retain_*)",
    "requeued": "the job this stream resumed after was re-queued since, so its first "
                "finish is not known any more",
    "later_pruned": "jobs that finished after the one this stream resumed after were "
                    "pruned (queue.retain_*)",
}

_MAX_ID = 2**63 - 1
# [0-9], not \d: \d also matches other scripts' digits, which int() reads.
_WATERMARK = re.compile(r"([0-9]{1,19})\.([0-9]{1,19})")


@dataclass(frozen=True, slots=True)
class Watermark:
    archive_id: int
    job_id: int

    def __str__(self) -> str:
        return f"{self.archive_id}.{self.job_id}"

    @classmethod
    def parse(cls, text: str) -> Watermark:
        """Raises ValueError naming the expected form."""
        found = _WATERMARK.fullmatch(text)
        if found is None or int(found[1]) > _MAX_ID or int(found[2]) > _MAX_ID:
            raise ValueError(f"Last-Event-ID {text[:60]!r} is not an event id of this stream "
                             "(<archive id>.<job id>, e.g. 4001.17)")
        return cls(int(found[1]), int(found[2]))


class StreamSlots:
    """Counts open event streams, in all and per token. Synchronous: the
    count is checked and taken in one step (no await in between)."""

    def __init__(self, total: int, per_token: int) -> None:
        self.total = total
        self.per_token = per_token
        self._open: dict[str, int] = {}

    @property
    def in_use(self) -> int:
        return sum(self._open.values())

    def take(self, token: str) -> str | None:
        """Take a slot for ``token``; None if taken, else why not."""
        if self.in_use >= self.total:
            return f"the server has {self.total} event streams open, its limit " \
                   "(NEXARCH_API_MAX_STREAMS)"
        if self._open.get(token, 0) >= self.per_token:
            return f"token {token!r} has {self.per_token} event streams open, its limit " \
                   "(NEXARCH_API_MAX_STREAMS_PER_TOKEN)"
        self._open[token] = self._open.get(token, 0) + 1
        return None

    def give_back(self, token: str) -> None:
        left = self._open.get(token, 0) - 1
        if left > 0:
            self._open[token] = left
        else:
            self._open.pop(token, None)


class _Merge:
    """The subscriptions' events in arrival order (see the module doc)."""

    def __init__(self, settle: float) -> None:
        self.settle = settle
        self._heap: list[tuple[float, int, str, Event]] = []
        self._seq = 0
        self._changed = trio.Event()
        self.overflows = 0

    def push(self, at: float, channel: str, event: Event) -> None:
        if len(self._heap) >= MAX_PENDING:
            self._heap.clear()
            self.overflows += 1
            channel, event = "", RESYNC
        heapq.heappush(self._heap, (at, self._seq, channel, event))
        self._seq += 1
        self._changed.set()

    async def get(self) -> tuple[str, Event]:
        """The next event once it has settled. Cancelling loses nothing."""
        while True:
            if not self._heap:
                self._changed = trio.Event()
                await self._changed.wait()
                continue
            wait = self._heap[0][0] + self.settle - time.time()
            if wait <= 0:
                _, _, channel, event = heapq.heappop(self._heap)
                return channel, event
            await trio.sleep(wait)


class EventStream:
    """One client's stream. ``run`` writes until cancelled (the client left,
    or the server stops); it returns after an ``error`` event if the
    database fails under it."""

    def __init__(self, db: Database, listener: Listener, *, tenant: str | None,
                 resume: Watermark | None, keepalive: float, settle: float = SETTLE_S) -> None:
        self.db = db
        self.listener = listener
        self.queue = Queue(db)
        self.tenant = tenant
        self.resume = resume
        self.keepalive = keepalive
        self._merge = _Merge(settle)
        self._seen: OrderedDict[Hashable, None] = OrderedDict()
        self._mark = resume or Watermark(0, 0)
        self._announced_resync: float | None = None
        self._write: Write | None = None
        #: listener.connections when this stream last caught up with the tables.
        self._synced = 0
        #: Live events that arrived while a replay was due (see the module doc).
        self._held: list[tuple[str, Notification]] = []
        #: No replay has run yet (the first one checks the cursor it starts from).
        self._first_replay = True
        #: The watermark job and why it was lost, once a resync said so.
        self._lost_told: tuple[int, str] | None = None

    async def run(self, write: Write) -> None:
        self._write = write
        try:
            if self.resume is None:
                # Read before subscribing; the replay below covers the gap.
                self._mark = await self._newest()
            subs = [self.listener.subscribe(channel) for channel in CHANNELS]
            self._synced = self.listener.connections
        except NexarchError as exc:
            await self._error(exc)
            return
        # subscribe() hands a connected listener's subscriber a RESYNC at
        # once: that one only says "drain", which the replay below does.
        initial_resync = self.listener.connected
        try:
            async with trio.open_nursery() as nursery:
                for sub in subs:
                    nursery.start_soon(self._forward, sub, initial_resync)
                await self._emit("open", {"v": 1, "event": "open", "tenant": self.tenant,
                                          "resumed": self.resume is not None}, retry_ms=3000)
                try:
                    await self._replay()
                    await self._live()
                except NexarchError as exc:
                    await self._error(exc)
                nursery.cancel_scope.cancel()
        finally:
            for sub in subs:
                self.listener.unsubscribe(sub)

    # -- sources ---------------------------------------------------------------

    async def _forward(self, sub: Subscription, skip_first_resync: bool) -> None:
        first = True
        async for event in sub:
            if first:
                first = False
                if skip_first_resync and isinstance(event, Resync):
                    continue
            at = event.received_at if isinstance(event, Notification) else time.time()
            self._merge.push(at, sub.channel, event)

    async def _newest(self) -> Watermark:
        archive_id = await newest_archive_id(self.db, tenant_slug=self.tenant)
        job_id = await self.queue.last_finished(tenant_slug=self.tenant)
        return Watermark(archive_id, job_id or 0)

    async def _replay(self) -> None:
        """What happened after the watermark, from the tables."""
        first, self._first_replay = self._first_replay, False
        # A fresh stream's first watermark was read from the tables just now;
        # every later one names a job that may have been re-queued or pruned
        # since (a retry while the listener was down moved that job's finish
        # past the watermark, and its outcome was never announced: an audit).
        fresh = first and self.resume is None
        # A cursor from another database first: the resync for a lost job
        # half kept an archive half that was ahead, pinned above every real
        # id, and later replays found nothing (a review).
        if first and self.resume is not None and await self._resynced_if_ahead():
            return
        lost = None if fresh else await self.queue.cursor_lost(
            self._mark.job_id, tenant_slug=self.tenant)
        if lost is not None and (self._mark.job_id, lost) == self._lost_told:
            # Told already, and the watermark could not move past it (job 0
            # of a tenant with no finished job, once anything was pruned):
            # resyncing again on every reconnect skipped every replay (a
            # review). What happened since the resync is replayed.
            lost = None
        if lost is not None:
            # Where the job this stream resumes after stood in finish order
            # cannot be told any more: say so rather than skip. The archive
            # half still holds: what was archived since is replayed below.
            # (It jumped to the newest archive too, and a message archived
            # while the listener was down was never announced: CI under
            # load.)
            newest = await self._newest()
            self._mark = Watermark(self._mark.archive_id, newest.job_id or self._mark.job_id)
            self._lost_told = (self._mark.job_id, lost)
            await self._emit("resync", {
                "v": 1, "event": "resync", "replayed": True,
                "reason": f"{_LOST[lost]}: reload the state (/queue, /mailboxes)"})
        archived = await archived_after(self.db, self._mark.archive_id, tenant_slug=self.tenant,
                                        limit=MAX_REPLAY + 1)
        finished = await self.queue.finished_after(self._mark.job_id, tenant_slug=self.tenant,
                                                   limit=MAX_REPLAY + 1)
        if len(archived) > MAX_REPLAY or len(finished) > MAX_REPLAY:
            newest = await self._newest()
            self._mark = Watermark(max(self._mark.archive_id, newest.archive_id),
                                   newest.job_id or self._mark.job_id)
            await self._emit("resync", {
                "v": 1, "event": "resync", "replayed": True,
                "reason": f"more than {MAX_REPLAY} events were missed: reload the state "
                          "(/queue, /mailboxes)"})
            return
        # Archived messages and finished jobs, merged by when they happened;
        # a message before the jobs of the same moment (it was enqueued first).
        steps: list[tuple[datetime, int, int, ArchivedMessage | list[FinishedJob]]] = []
        steps += [(m.archived_at, 0, m.archive_id, m) for m in archived]
        for group in _job_groups(finished):
            steps.append((group[0].finished_at, 1, group[0].id, group))
        steps.sort(key=lambda step: step[:3])
        for _, _, _, item in steps:
            if isinstance(item, ArchivedMessage):
                await self._replay_archived(item)
            else:
                await self._replay_jobs(item)

    async def _resynced_if_ahead(self) -> bool:
        """A Last-Event-ID above every id this database ever drew (another
        deployment's, or one from before a restore) would pin the watermark
        above the real ids, and a later resume would replay nothing: say so
        (one ``resync``), go on from the newest ids and return True. Both
        halves: a cursor not from this database means nothing here."""
        ceiling = await allocated_ids(self.db)
        if self._mark.archive_id <= ceiling.archive_id and self._mark.job_id <= ceiling.job_id:
            return False
        self._mark = await self._newest()
        await self._emit("resync", {
            "v": 1, "event": "resync", "replayed": True,
            "reason": "Last-Event-ID is ahead of this database (from another deployment, or "
                      "from before a restore): reload the state (/queue, /mailboxes)"})
        return True

    async def _replay_archived(self, message: ArchivedMessage) -> None:
        if not self._first_time(("archived", message.archive_id)):
            return
        self._mark = Watermark(max(self._mark.archive_id, message.archive_id), self._mark.job_id)
        await self._emit("imported", {
            "v": 1, "event": "imported", "tenant": message.tenant_slug,
            "mailbox": message.mailbox, "folder": message.folder,
            "uidvalidity": message.uidvalidity, "uid": message.uid,
            "archive_id": message.archive_id, "duplicate": False,
            "channel": MAIL_IMPORTED_CHANNEL, "replayed": True})

    async def _replay_jobs(self, jobs: list[FinishedJob]) -> None:
        outcome = jobs[0].status.value
        stamp = jobs[0].finish_stamp  # one per group: _job_groups
        ids: list[JSONValue] = [job.id for job in jobs
                                if self._first_time(("job", job.id, outcome, stamp))]
        if not ids:
            return
        self._mark = Watermark(self._mark.archive_id, jobs[-1].id)
        await self._emit("indexed" if outcome == "succeeded" else "failed", {
            "v": 1, "event": outcome, "tenant": jobs[0].tenant_slug, "ids": ids,
            "finished_at": stamp, "channel": JOB_EVENTS_CHANNEL, "replayed": True})

    # -- live ------------------------------------------------------------------

    async def _live(self) -> None:
        while True:
            item: tuple[str, Event] | None = None
            with trio.move_on_after(self.keepalive):
                item = await self._merge.get()
            if item is None:
                await self._send(b": keepalive\n\n")
                continue
            channel, event = item
            if isinstance(event, Notification):
                if self._replay_due():
                    self._hold(channel, event)
                else:
                    await self._on_notification(channel, event)
                continue
            # The listener reconnected (or we fell behind): notifications may
            # be lost. Say so (once: each subscription gets its own RESYNC),
            # then replay what the tables recorded since the watermark.
            now = trio.current_time()
            if self._announced_resync is None or now - self._announced_resync >= RESYNC_QUIET_S:
                self._announced_resync = now
                await self._emit("resync", {
                    "v": 1, "event": "resync",
                    "reason": "notifications may have been missed: what the tables recorded "
                              "follows; reload the rest of the state (/queue, /mailboxes)"})
            # Read first: a connection made during the replay needs its own.
            connections = self.listener.connections
            await self._replay()
            self._synced = connections
            if not self._replay_due():
                await self._release_held()

    def _replay_due(self) -> bool:
        """The listener lost its connection since this stream last replayed:
        it is down, or back but its RESYNC has not been replayed yet."""
        return not self.listener.connected or self.listener.connections != self._synced

    def _hold(self, channel: str, note: Notification) -> None:
        # Past the cap, drop: the replay covers all but the kinds it never
        # replays (as when a slow client's buffer overflows).
        if len(self._held) < MAX_PENDING:
            self._held.append((channel, note))

    async def _release_held(self) -> None:
        """The held events the replay did not cover, in id order."""
        held, self._held = _in_id_order(self._held), []
        for channel, note in held:
            await self._on_notification(channel, note)

    async def _on_notification(self, channel: str, note: Notification) -> None:
        data = note.json()
        tenant = data.get("tenant")
        if not isinstance(tenant, str) or (self.tenant is not None and tenant != self.tenant):
            return
        kind = data.get("event")
        out: JSONObject = {**data, "channel": channel}
        if channel == MAIL_IMPORTED_CHANNEL:
            if kind in ("imported", "recovered", "unstable"):
                archive_id = data.get("archive_id")
                if not isinstance(archive_id, int) or isinstance(archive_id, bool):
                    return
                if data.get("duplicate") is False:
                    # A new message: the replay may have sent it already.
                    if not self._first_time(("archived", archive_id)):
                        return
                    self._mark = Watermark(max(self._mark.archive_id, archive_id),
                                           self._mark.job_id)
                await self._emit("imported", out)
            elif kind == "failed":
                await self._emit("failed", out)
            elif kind == "resync":
                await self._emit("resync", out)
        elif channel == JOB_EVENTS_CHANNEL and kind in ("succeeded", "failed"):
            raw_ids = data.get("ids")
            if not isinstance(raw_ids, list):
                return
            # A job finishes again after a retry: only the same finish is a repeat.
            raw_stamp = data.get("finished_at")
            stamp = raw_stamp if isinstance(raw_stamp, str) else None
            ids = [i for i in raw_ids if isinstance(i, int) and not isinstance(i, bool)
                   and self._first_time(("job", i, kind, stamp))]
            if not ids:
                return
            self._mark = Watermark(self._mark.archive_id, max(ids))
            fresh: list[JSONValue] = list(ids)
            out["ids"] = fresh
            await self._emit("indexed" if kind == "succeeded" else "failed", out)

    # -- output ----------------------------------------------------------------

    def _first_time(self, key: Hashable) -> bool:
        if key in self._seen:
            return False
        self._seen[key] = None
        if len(self._seen) > SEEN_LIMIT:
            self._seen.popitem(last=False)
        return True

    async def _emit(self, kind: str, data: JSONObject, *, retry_ms: int | None = None) -> None:
        retry = "" if retry_ms is None else f"retry: {retry_ms}\n"
        await self._send(f"{retry}id: {self._mark}\nevent: {kind}\ndata: {dumps(data)}\n\n"
                         .encode())

    async def _error(self, exc: NexarchError) -> None:
        # The details (hosts, ports, SQL) go to the log, not to whoever holds
        # a token (found by an audit), as for the other routes (asgi.py).
        log.warning("api: event stream ends: %s", exc)
        if isinstance(exc, DatabaseTransient):
            what = "the database cannot be reached" if isinstance(exc, DatabaseUnavailable) \
                else "the database is busy"
            message = f"temporarily unavailable: {what}; reconnect later"
        else:
            message = f"the event stream failed ({type(exc).__name__}); the server log has " \
                      "the details"
        await self._send(f"event: error\ndata: {dumps({'error': message})}\n\n".encode())

    async def _send(self, chunk: bytes) -> None:
        assert self._write is not None
        await self._write(chunk)


def _in_id_order(events: list[tuple[str, Notification]]) -> list[tuple[str, Notification]]:
    """Per channel, the events that carry an id (an archive id, a job's
    ids) sorted by it, in the places such events took; the rest stay."""
    out = list(events)
    for channel in CHANNELS:
        places = [n for n, (ch, note) in enumerate(out)
                  if ch == channel and _event_id(note) is not None]
        ordered = sorted((out[n] for n in places), key=lambda item: _event_id(item[1]) or 0)
        for place, item in zip(places, ordered, strict=True):
            out[place] = item
    return out


def _event_id(note: Notification) -> int | None:
    data = note.json()
    if note.channel == MAIL_IMPORTED_CHANNEL:
        found = data.get("archive_id") if data.get("duplicate") is False else None
        return found if isinstance(found, int) and not isinstance(found, bool) else None
    ids = data.get("ids")
    numbers = [i for i in ids if isinstance(i, int) and not isinstance(i, bool)] \
        if isinstance(ids, list) else []
    return min(numbers) if numbers else None


def _job_groups(jobs: Sequence[FinishedJob]) -> list[list[FinishedJob]]:
    """Consecutive jobs of one outcome, tenant and finish time (one ack, as
    the channel would have announced them), at most IDS_PER_EVENT each."""
    groups: list[list[FinishedJob]] = []
    for job in jobs:
        last = groups[-1] if groups else None
        if last is not None and len(last) < IDS_PER_EVENT and last[0].status == job.status \
                and last[0].tenant_slug == job.tenant_slug \
                and last[0].finished_at == job.finished_at:
            last.append(job)
        else:
            groups.append([job])
    return groups
