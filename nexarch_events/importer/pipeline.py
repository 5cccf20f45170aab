"""A mailbox's imports with two transactions in flight, committed in UID order.

A first sync stores one message per transaction. One after the other, the
client's work on a message (receiving, parsing, sending it) and Postgres'
work on the one before it (hashing, compressing, inserting, committing)
never overlapped, and on two cores that left one idle. Here up to two
imports are in flight, each on its own connection (the run's and a spare).

Postgres keeps the order, not this module (migration 0026): an import sent
with ``after`` holds a lock on its own UID for its whole transaction, does
its archive work, then waits for the transaction of ``after`` to end and
advances the watermark only from exactly ``after``. So:

- the watermark still moves over a contiguous committed prefix only (a kill
  at any moment loses nothing; what was in flight is fetched again);
- a commit, and its NOTIFY, always follows its predecessor's: notifications
  per mailbox ascend;
- an import whose predecessor rolled back cannot commit past it.

What this module adds:

- results are handed to ``on_settled`` strictly in submission order;
- an import refused because it overtook its predecessor (it reached the wait
  before that one began; NXI02) or chosen as a deadlock victim (40P01) is
  sent again once everything before it has settled; a second refusal is
  raised like any other error;
- an import whose data Postgres refused (``DatabaseRejected``: a CHECK, a
  value out of range) is handed to ``on_refused`` where it is settled, on
  its own connection (free then): the run records it as that message's
  failure, which advances the watermark past it, and the imports after it
  go on (the next one, refused for overtaking, is sent again);
- any other error of an import is raised where it is settled; whatever is
  still in flight is waited for (it either commits in order or is refused);
- a message with the same content as one in flight waits for it: two inserts
  of one hash wait on each other's transaction, and with the UID locks that
  would be a deadlock Postgres breaks only after ``deadlock_timeout``.

Nothing else may use the run's connection while imports are in flight:
callers ``settle()`` first (the run does so before recording a failure or
writing its state).
"""

from __future__ import annotations

import logging
from collections import deque
from collections.abc import AsyncIterator, Awaitable, Callable, Sequence
from contextlib import AsyncExitStack, asynccontextmanager
from dataclasses import dataclass, field
from datetime import datetime

import trio

from ..aio import Connection, Database
from ..errors import DatabaseError, DatabaseRejected
from ..mail.archive import Archived, content_hash
from .state import StateStore

log = logging.getLogger(__name__)

#: SQLSTATEs that mean "not now", not "not this message": the import is sent
#: again once every import before it has settled.
SEND_AGAIN = frozenset({"NXI02", "40P01"})

#: A batch this small is imported one message at a time on the run's own
#: connection: opening a spare would cost more than it saves.
MIN_BATCH_FOR_SPARE = 4

#: Called with an import's UID, Postgres' refusal of its data, and the
#: connection it ran on (free, and the watermark is right below the UID).
OnRefused = Callable[[int, DatabaseRejected, StateStore], Awaitable[None]]


@dataclass(eq=False)
class _Import:
    uid: int
    after: int
    raw: bytes
    sha256: bytes
    internaldate: datetime | None
    note: str | None
    store: StateStore
    done: trio.Event = field(default_factory=trio.Event)
    result: Archived | None = None
    error: DatabaseError | None = None
    sent: int = 1


class InFlightImports:
    """Imports of one mailbox (mode "new") in flight on ``stores`` (one
    import per store at a time), settled in order. Open with
    :func:`open_in_flight`."""

    def __init__(self, nursery: trio.Nursery, stores: Sequence[StateStore], *, tenant: str,
                 mailbox: str, uidvalidity: int,
                 on_settled: Callable[[int, Archived], None],
                 on_refused: OnRefused | None = None) -> None:
        if not stores:
            raise ValueError("imports in flight need at least one connection")
        self._nursery = nursery
        self._free: deque[StateStore] = deque(stores)
        self._queue: deque[_Import] = deque()
        self.tenant, self.mailbox, self.uidvalidity = tenant, mailbox, uidvalidity
        self._on_settled = on_settled
        self._on_refused = on_refused
        #: Imports sent again (overtaken, or a deadlock victim): diagnostics.
        self.sent_again = 0
        #: The most imports that were in flight at once.
        self.most = 0

    async def submit(self, uid: int, after: int, raw: bytes, *,
                     internaldate: datetime | None = None, note: str | None = None) -> None:
        """Send the import of ``uid``, which follows ``after`` (the UID the
        watermark is at once everything submitted before has committed).
        Returns once it is sent; waits first for the oldest import to settle
        when every connection is busy (raising its error, if any)."""
        sha256 = content_hash(raw)
        if any(item.sha256 == sha256 for item in self._queue):
            await self.settle()
        while not self._free:
            await self._settle_oldest()
        item = _Import(uid, after, raw, sha256, internaldate, note, self._free.popleft())
        self._queue.append(item)
        self.most = max(self.most, len(self._queue))
        self._nursery.start_soon(self._send, item)

    async def settle(self) -> None:
        """Wait for every import in flight, in order (raising the first error)."""
        while self._queue:
            await self._settle_oldest()

    async def drain(self) -> list[DatabaseError]:
        """Settle everything in flight without raising: the errors, in
        order. After the first, the rest are only waited for (they commit in
        order or are refused by it) and not sent again."""
        errors: list[DatabaseError] = []
        while self._queue:
            try:
                await self._settle_oldest()
            except DatabaseError as exc:
                errors.append(exc)
                for item in self._queue:
                    await item.done.wait()
                self._queue.clear()
        return errors

    async def _send(self, item: _Import) -> None:
        try:
            item.result = await self._import(item)
        except DatabaseError as exc:
            item.error = exc
        finally:
            item.done.set()

    async def _import(self, item: _Import) -> Archived:
        return await item.store.import_message(
            self.tenant, self.mailbox, self.uidvalidity, item.uid, "new", item.raw,
            internaldate=item.internaldate, note=item.note, after=item.after,
            sha256=item.sha256)

    async def _settle_oldest(self) -> None:
        item = self._queue[0]
        await item.done.wait()
        if item.error is not None and item.error.sqlstate in SEND_AGAIN and item.sent == 1:
            # Everything before it has settled, so the order cannot refuse
            # it again; the store is free (its import ended).
            item.sent += 1
            self.sent_again += 1
            log.debug("mailbox %s/%s: UID %d sent again (%s)", self.tenant, self.mailbox,
                      item.uid, item.error.sqlstate)
            try:
                item.result, item.error = await self._import(item), None
            except DatabaseError as exc:
                item.error = exc
        if isinstance(item.error, DatabaseRejected) and self._on_refused is not None:
            await self._on_refused(item.uid, item.error, item.store)
            item.error = None
        if item.error is not None:
            raise item.error
        self._queue.popleft()
        self._free.append(item.store)
        if item.result is not None:
            self._on_settled(item.uid, item.result)


@asynccontextmanager
async def open_in_flight(stores: Sequence[StateStore], *, tenant: str, mailbox: str,
                         uidvalidity: int, on_settled: Callable[[int, Archived], None],
                         on_refused: OnRefused | None = None
                         ) -> AsyncIterator[InFlightImports]:
    """Imports in flight for the block; every one is settled before it
    ends, also when the block fails (what was sent commits, in order, or is
    refused). Errors come out as themselves, never as an ExceptionGroup: the
    block's own first, else the first import's."""
    errors: list[Exception] = []
    async with trio.open_nursery() as nursery:
        imports = InFlightImports(nursery, stores, tenant=tenant, mailbox=mailbox,
                                  uidvalidity=uidvalidity, on_settled=on_settled,
                                  on_refused=on_refused)
        try:
            yield imports
        except Exception as exc:
            errors.append(exc)
        errors.extend(await imports.drain())
    if errors:
        raise errors[0]


class SpareConnections:
    """Where a run's extra import connections come from, for one run.

    A pool: some of its connections for a batch, those free at once (never
    waited for: a busy pool imports one at a time). A URL: connections of
    the run's own, opened at the first batch that uses them and closed by
    ``aclose``. A connection that cannot be had means fewer in flight, with
    one INFO line per run."""

    def __init__(self, db: Database | str, *, connect_timeout: float = 10.0) -> None:
        self.db = db
        self.connect_timeout = connect_timeout
        self._own: list[Connection] = []
        self._unavailable = False

    @asynccontextmanager
    async def borrow(self, batch: int, wanted: int) -> AsyncIterator[list[StateStore]]:
        """Up to ``wanted`` spares for a batch of ``batch`` messages."""
        if batch < MIN_BATCH_FOR_SPARE or self._unavailable:
            wanted = 0
        async with AsyncExitStack() as stack:
            stores: list[StateStore] = []
            try:
                while len(stores) < wanted:
                    if isinstance(self.db, Database):
                        conn = await stack.enter_async_context(self.db.acquire_nowait())
                        if conn is None:
                            break
                        stores.append(StateStore(conn))
                    else:
                        if len(self._own) == len(stores):
                            self._own.append(await Connection.open(
                                self.db, connect_timeout=self.connect_timeout))
                        stores.append(StateStore(self._own[len(stores)]))
            except DatabaseError as exc:
                self._unavailable = True
                log.info("no more connections for this run's imports (%d in flight): %s",
                         len(stores) + 1, exc)
            yield stores

    async def aclose(self) -> None:
        own, self._own = self._own, []
        for conn in own:
            await conn.aclose()
