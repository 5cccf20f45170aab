"""The listener: one dedicated LISTEN connection per process, fanned out to
trio channels.

NOTIFY is a wake-up hint; the tables are the truth. Notifications sent while
the connection is down are gone, so after every (re)connect each subscriber
receives ``RESYNC`` and must act as if woken for everything (drain). The same
marker is delivered when a subscriber's buffer overflowed.

A dead connection is noticed within ``listener_ping_interval +
listener_ping_timeout``: a clean close or reset through asyncpg's termination
callback at once, a half-open socket (no FIN, no RST; packets silently
dropped) by a ping that does not come back in time.
"""

from __future__ import annotations

import json
import logging
import secrets
import time
from collections.abc import Callable, Iterable
from dataclasses import dataclass
from typing import Final, cast

import trio

from ..aio import Connection, ListenConnection
from ..errors import ConfigurationError, DatabaseError, DatabaseTransient, DatabaseUnavailable
from ..models import JSONObject
from ..settings import QueueSettings
from .outage import Outage

log = logging.getLogger(__name__)

#: Channel names: the public event contract, see docs/events.md.
INDEX_JOBS_CHANNEL: Final = "nexarch_index_jobs"
JOB_EVENTS_CHANNEL: Final = "nexarch_job_events"
MAIL_IMPORTED_CHANNEL: Final = "nexarch_mail_imported"
IMPORT_REQUESTS_CHANNEL: Final = "nexarch_import_requests"


@dataclass(frozen=True, slots=True)
class Notification:
    channel: str
    payload: str
    #: time.time() when this process received it (for latency measurements).
    received_at: float

    def json(self) -> JSONObject:
        """The payload parsed; {} if it is not a JSON object (a foreign NOTIFY),
        or holds NaN or Infinity, which no JSON we write does and none we
        send may (an event stream that passed one on died of it), or is
        nested deeper than Python's recursion limit (8,000 bytes of "[" ended
        every event stream and the service: a review)."""
        try:
            value = json.loads(self.payload, parse_constant=_no_constant)
        except (ValueError, RecursionError):
            return {}
        if not isinstance(value, dict) or _deeper_than(value, MAX_PAYLOAD_DEPTH):
            # Nested just under the limit, it parsed, and the event stream's
            # json.dumps of it raised RecursionError (a review).
            return {}
        return cast(JSONObject, value)


#: How deeply a payload may nest (ours: an object holding lists of ids).
MAX_PAYLOAD_DEPTH: Final = 8


def _deeper_than(value: object, limit: int) -> bool:
    """Whether ``value`` nests lists and objects more than ``limit`` deep
    (without recursion: it may be nested a thousand deep)."""
    level: list[object] = [value]
    for _ in range(limit):
        level = [child for item in level if isinstance(item, (dict, list))
                 for child in (item.values() if isinstance(item, dict) else item)]
        if not level:
            return False
    return any(isinstance(item, (dict, list)) for item in level)


def _no_constant(name: str) -> object:
    raise ValueError(f"{name} is not JSON")


class Resync:
    """Notifications may have been missed: drain as if woken for everything."""

    def __repr__(self) -> str:
        return "RESYNC"


RESYNC: Final = Resync()
Event = Notification | Resync
#: Called in the delivery itself (``Listener.on_event``).
EventHandler = Callable[[Event], None]


class Subscription:
    """One consumer's view of one channel. Iterate it, or call ``receive``."""

    def __init__(self, channel: str, buffer: int) -> None:
        self.channel = channel
        self._send, self._recv = trio.open_memory_channel[Event](buffer)
        self._missed = False
        #: notifications dropped because the consumer fell behind.
        self.dropped = 0

    def _push(self, event: Event) -> None:
        try:
            self._send.send_nowait(event)
        except trio.WouldBlock:
            # Dropping is safe only because the consumer will drain: it gets
            # RESYNC once it has caught up with the buffer.
            self._missed = True
            self.dropped += 1
        except trio.ClosedResourceError:
            pass

    async def receive(self) -> Event:
        """The next notification or RESYNC. Blocks until there is one."""
        if self._missed and self._recv.statistics().current_buffer_used == 0:
            self._missed = False
            await trio.lowlevel.checkpoint()
            return RESYNC
        return await self._recv.receive()

    def __aiter__(self) -> Subscription:
        return self

    async def __anext__(self) -> Event:
        try:
            return await self.receive()
        except trio.EndOfChannel:
            raise StopAsyncIteration from None

    def close(self) -> None:
        self._send.close()


class Listener:
    """Owns the LISTEN connection; run it in a nursery with ``nursery.start``.

    ``run`` returns to ``nursery.start`` once the first connection listens;
    after that it reconnects by itself, forever, with backoff.
    """

    def __init__(self, dsn: str, settings: QueueSettings | None = None, *,
                 channels: Iterable[str] = (INDEX_JOBS_CHANNEL, JOB_EVENTS_CHANNEL),
                 name: str | None = None) -> None:
        self.dsn = dsn
        #: pg_stat_activity's application_name of the LISTEN connection.
        self.application_name = f"nexarch-events/listener/{name}" if name \
            else "nexarch-events/listener"
        self.settings = settings or QueueSettings()
        self.channels = tuple(channels)
        self._subscribers: dict[str, list[Subscription]] = {c: [] for c in self.channels}
        self._handlers: dict[str, list[EventHandler]] = {c: [] for c in self.channels}
        #: what a handler raised: a bug, which ends ``run``
        self._handler_error: Exception | None = None
        #: set when the current connection is lost, or a handler raised
        self._lost: trio.Event | None = None
        self._connected = False
        self._connected_event = trio.Event()
        self._conn: ListenConnection | None = None
        #: completed connections (the first one included).
        self.connections = 0
        self.reconnects = 0

    @property
    def connected(self) -> bool:
        return self._connected

    @property
    def backend_pid(self) -> int | None:
        """The server process id of the LISTEN connection (for tests and ops)."""
        return self._conn.backend_pid if self._conn is not None and self._connected else None

    def subscribe(self, channel: str, *, buffer: int = 4096) -> Subscription:
        """A new subscription to one of this listener's channels. It receives
        RESYNC after each (re)connect, the first one included."""
        if channel not in self._subscribers:
            raise ValueError(f"channel {channel!r} is not one of {self.channels}")
        sub = Subscription(channel, buffer)
        self._subscribers[channel].append(sub)
        if self._connected:
            sub._push(RESYNC)
        return sub

    def on_event(self, channel: str, handler: EventHandler) -> None:
        """Call ``handler`` with each notification on ``channel``, and with
        RESYNC after each (re)connect, in the delivery itself: no buffer and
        no task in between. For a consumer that only sets events (the
        workers' wake-ups: a subscription's pump task cost each job a trio
        scheduling round, 0.16 ms p50 of the wake path, issue 11). It runs on
        the trio thread inside the LISTEN connection's callback, so it must
        not block. An exception it raises is a bug: ``run`` raises it, as a
        task's exception would end its nursery."""
        if channel not in self._handlers:
            raise ValueError(f"channel {channel!r} is not one of {self.channels}")
        self._handlers[channel].append(handler)
        if self._connected:
            self._call(handler, RESYNC)

    def _call(self, handler: EventHandler, event: Event) -> None:
        if self._handler_error is not None:
            return
        try:
            handler(event)
        except Exception as exc:
            self._handler_error = exc
            if self._lost is not None:
                self._lost.set()

    def unsubscribe(self, sub: Subscription) -> None:
        subs = self._subscribers.get(sub.channel, [])
        if sub in subs:
            subs.remove(sub)
        sub.close()

    async def wait_connected(self) -> None:
        """Block until the listener is connected (returns at once if it is)."""
        while not self._connected:
            await self._connected_event.wait()

    def _deliver(self, channel: str, payload: str) -> None:
        self._fan_out(channel, Notification(channel, payload, time.time()))

    def _fan_out(self, channel: str, event: Event) -> None:
        """``event`` to every handler and subscriber of ``channel``."""
        for handler in self._handlers.get(channel, ()):
            self._call(handler, event)
        for sub in self._subscribers.get(channel, ()):
            sub._push(event)

    async def run(self, *, task_status: trio.TaskStatus[None] = trio.TASK_STATUS_IGNORED) -> None:
        """Listen forever. Cancellation closes the connection and returns."""
        s = self.settings
        outage = Outage("listener", log, first_delay=s.reconnect_min, max_delay=s.reconnect_max)
        started = False
        while True:
            connected_at: float | None = None
            lost_by: DatabaseError = DatabaseUnavailable("the LISTEN connection ended")
            try:
                conn = await ListenConnection.connect(
                    self.dsn, connect_timeout=s.listener_ping_timeout * 2,
                    command_timeout=s.listener_ping_timeout * 2,
                    application_name=self.application_name)
            except (DatabaseTransient, trio.TooSlowError) as exc:
                await trio.sleep(outage.failed(exc))
                continue
            lost = self._lost = trio.Event()
            conn.on_lost(lost.set)
            try:
                if not await self._hears_itself(conn):
                    message = (
                        f"the LISTEN connection did not receive its own notification within "
                        f"{s.listener_ping_timeout:g}s: the database URL seems to go through a "
                        f"pooler in transaction mode (PgBouncer), where LISTEN cannot work; set "
                        f"NEXARCH_LISTEN_DATABASE_URL to a direct connection to Postgres")
                    if not started:
                        # Never report ready with a listener that hears nothing.
                        raise ConfigurationError(message)
                    raise DatabaseUnavailable(message)
                for channel in self.channels:
                    await conn.listen(channel, self._deliver)
                self._conn = conn
                self._connected = True
                self._connected_event.set()
                self._connected_event = trio.Event()
                self.connections += 1
                if self.connections > 1:
                    self.reconnects += 1
                connected_at = trio.current_time()
                log.info("listener connected backend_pid=%s channels=%s",
                         conn.backend_pid, ",".join(self.channels))
                # Everything committed from here on is notified; whatever came
                # before (or while we were away) is found by draining.
                for channel in self.channels:
                    self._fan_out(channel, RESYNC)
                if not started:
                    started = True
                    task_status.started()
                await self._watch(conn, lost)
            except DatabaseError as exc:
                # Whatever broke on this connection, the remedy is the same:
                # a fresh connection, and a RESYNC for every subscriber.
                lost_by = exc
            finally:
                self._connected = False
                self._conn = None
                conn.abort()
            if self._handler_error is not None:
                # Outside the try: even a handler's DatabaseError is a bug of
                # the handler, not a lost connection to reconnect for ever.
                raise self._handler_error
            # The backoff starts over only after a connection that lasted: one
            # killed as soon as it listens (a watchdog, a failover loop) was
            # reconnected every reconnect_min, each with a RESYNC for every
            # subscriber and a WARNING (77 in 10 s: a retry-loop audit).
            if connected_at is not None and \
                    trio.current_time() - connected_at >= max(s.listener_ping_interval, 1.0):
                outage.ok()
            await trio.sleep(outage.failed(lost_by))

    async def _hears_itself(self, conn: ListenConnection) -> bool:
        """LISTEN on a channel of this connection's own, NOTIFY it from
        another connection, as the workers' wake-ups come, and wait up to
        listener_ping_timeout for the notification. Behind a pooler in
        transaction mode the LISTEN ran on a server connection this client
        no longer holds, and the notification never comes back to us: that
        is what this finds out before anyone relies on it. (A NOTIFY on the
        listening connection itself could pass: the pooler may hand it the
        same server connection again.)"""
        s = self.settings
        token = secrets.token_hex(8)
        channel = f"nexarch_self_check_{token}"
        heard = trio.Event()

        def on_check(_channel: str, payload: str) -> None:
            if payload == token:
                heard.set()

        await conn.listen(channel, on_check)
        try:
            sender = await Connection.open(
                self.dsn, connect_timeout=s.listener_ping_timeout * 2,
                command_timeout=s.listener_ping_timeout * 2, statement_cache_size=0,
                application_name=f"{self.application_name}/check")
        except trio.TooSlowError:
            raise DatabaseUnavailable("the listener's self-check could not connect in time") \
                from None
        try:
            await sender.execute("SELECT pg_notify($1, $2)", channel, token)
        finally:
            await sender.aclose()
        with trio.move_on_after(s.listener_ping_timeout):
            await heard.wait()
        return heard.is_set()

    async def _watch(self, conn: ListenConnection, lost: trio.Event) -> None:
        """Return when the connection is dead: closed, reset, or silent."""
        s = self.settings
        while True:
            with trio.move_on_after(s.listener_ping_interval):
                await lost.wait()
            if self._handler_error is not None:
                return
            if lost.is_set() or conn.is_closed():
                log.warning("listener connection closed by the server or the network")
                return
            with trio.move_on_after(s.listener_ping_timeout) as scope:
                await conn.ping()
            if scope.cancelled_caught:
                log.warning("listener connection silent for %.1fs (half-open?); reconnecting",
                            s.listener_ping_timeout)
                return
