"""Testing helpers for code that embeds nexarch-events: record the
mail-imported notifications (docs/events.md) in the order Postgres delivered
them, wait for them, and assert on their order.

    async with record_imports(dsn) as recorder:
        ...  # append mail, run the importer
        await recorder.wait_for_imported(tenant="acme", mailbox="inbox", count=3)
        recorder.assert_in_uid_order()

With pytest (and pytest-trio) the ``nexarch_import_recorder`` fixture does the
same (``nexarch_events.testing.pytest_plugin``; it needs ``nexarch_database_url``).
"""

from __future__ import annotations

from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from dataclasses import dataclass

import trio

from ..models import JSONObject
from ..queue.notify import MAIL_IMPORTED_CHANNEL, Listener, Notification
from ..settings import QueueSettings


@dataclass(frozen=True, slots=True)
class ImportEvent:
    """One mail-imported notification. ``event``: imported, recovered,
    unstable, failed or resync (docs/events.md)."""

    event: str
    tenant: str
    mailbox: str
    uidvalidity: int
    uid: int | None
    archive_id: int | None
    duplicate: bool
    payload: JSONObject
    received_at: float
    #: The IMAP folder's decoded name (None: the mailbox is not registered,
    #: or the
    #: notification was sent by a version without the field).
    folder: str | None = None

    @classmethod
    def parse(cls, note: Notification) -> ImportEvent:
        p = note.json()

        def num(key: str) -> int | None:
            value = p.get(key)
            return value if isinstance(value, int) else None

        folder = p.get("folder")
        return cls(event=str(p.get("event", "")), tenant=str(p.get("tenant", "")),
                   mailbox=str(p.get("mailbox", "")), uidvalidity=num("uidvalidity") or 0,
                   uid=num("uid"), archive_id=num("archive_id"),
                   duplicate=bool(p.get("duplicate", False)), payload=p,
                   received_at=note.received_at,
                   folder=folder if isinstance(folder, str) else None)


class ImportRecorder:
    """Every mail-imported notification since it started, in delivery order.
    ``gaps`` counts listener reconnects after the first connection: events
    sent during one are gone (NOTIFY is not stored), so a test that cares
    should assert ``gaps == 0``."""

    def __init__(self, *, tenant: str | None = None) -> None:
        self.tenant = tenant
        self.events: list[ImportEvent] = []
        self.gaps = 0
        self._changed = trio.Event()

    def _record(self, event: ImportEvent) -> None:
        if self.tenant is None or event.tenant == self.tenant:
            self.events.append(event)
            self._changed.set()
            self._changed = trio.Event()

    def select(self, *, event: str | None = "imported", tenant: str | None = None,
               mailbox: str | None = None) -> list[ImportEvent]:
        return [e for e in self.events
                if (event is None or e.event == event)
                and (tenant is None or e.tenant == tenant)
                and (mailbox is None or e.mailbox == mailbox)]

    async def wait_for(self, *, count: int = 1, event: str | None = "imported",
                       tenant: str | None = None, mailbox: str | None = None,
                       uid: int | None = None,
                       timeout: float = 10.0,  # noqa: ASYNC109 - a test must not hang forever
                       ) -> list[ImportEvent]:
        """Block until ``count`` matching events arrived (or one with ``uid``);
        returns the matching events. Raises TimeoutError naming what it saw."""
        def matching() -> list[ImportEvent]:
            found = self.select(event=event, tenant=tenant, mailbox=mailbox)
            return [e for e in found if uid is None or e.uid == uid]

        with trio.move_on_after(timeout):
            while len(matching()) < count:
                await self._changed.wait()
            return matching()
        raise TimeoutError(
            f"waited {timeout:g} s for {count} {event or 'any'} event(s)"
            f"{f' of {tenant}' if tenant else ''}{f'/{mailbox}' if mailbox else ''}"
            f"{f' with UID {uid}' if uid is not None else ''}; got {len(matching())} "
            f"(all events so far: {len(self.events)})")

    async def wait_for_imported(self, *, tenant: str | None = None, mailbox: str | None = None,
                                count: int = 1, uid: int | None = None,
                                timeout: float = 10.0,  # noqa: ASYNC109
                                ) -> list[ImportEvent]:
        return await self.wait_for(count=count, event="imported", tenant=tenant,
                                   mailbox=mailbox, uid=uid, timeout=timeout)

    def assert_in_uid_order(self) -> None:
        """Per (tenant, mailbox, UIDVALIDITY), ``imported`` events ascend
        strictly by UID: no repeats, no step back (docs/events.md). A
        ``resync`` of the mailbox starts its sequences over: a UIDVALIDITY
        that comes back (a mailbox restored from a backup) is imported
        again from its first UID."""
        last: dict[tuple[str, str, int], int] = {}
        for e in self.select(event=None):
            if e.event == "resync":
                for key in [k for k in last if k[:2] == (e.tenant, e.mailbox)]:
                    del last[key]
                continue
            if e.event != "imported":
                continue
            key = (e.tenant, e.mailbox, e.uidvalidity)
            assert e.uid is not None, f"imported event without UID: {e.payload}"
            previous = last.get(key)
            if previous is not None and e.uid <= previous:
                raise AssertionError(
                    f"{e.tenant}/{e.mailbox} (UIDVALIDITY {e.uidvalidity}): UID {e.uid} "
                    f"arrived after UID {previous}")
            last[key] = e.uid


@asynccontextmanager
async def record_imports(dsn: str, *, tenant: str | None = None,
                         settings: QueueSettings | None = None
                         ) -> AsyncIterator[ImportRecorder]:
    """A recorder listening on its own connection. Blocks until it listens,
    so everything committed after entry is recorded. Needs the asyncio loop
    (``nexarch_events.aio.open_loop``) around it."""
    recorder = ImportRecorder(tenant=tenant)
    listener = Listener(dsn, settings, channels=(MAIL_IMPORTED_CHANNEL,))
    sub = listener.subscribe(MAIL_IMPORTED_CHANNEL, buffer=1_000_000)

    async def pump() -> None:
        first = True
        async for item in sub:
            if isinstance(item, Notification):
                recorder._record(ImportEvent.parse(item))
            elif first:
                first = False
            else:
                recorder.gaps += 1

    async with trio.open_nursery() as nursery:
        nursery.start_soon(pump)
        await nursery.start(listener.run)
        try:
            yield recorder
        finally:
            nursery.cancel_scope.cancel()
