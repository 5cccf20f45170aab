"""A TCP proxy for fault injection: forwards 127.0.0.1:<port> to an upstream
host:port, and on command turns connections it holds into a black hole.

``blackhole()`` stops forwarding in both directions on every connection open
at that moment (or on one chosen connection), WITHOUT closing either socket:
to both ends the peer simply goes silent (no FIN, no RST), like a half-open
connection after a network partition or a host that vanished. Connections
made afterwards are forwarded normally. The held sockets are closed when the
proxy stops.

``gate(pattern)`` holds the first chunk a client sends that contains
``pattern`` (a query's text, say) until the test opens the gate: the client
waits for its answer, as behind a slow link, with the statements before it
done. A chunk is what one ``recv`` returned; the statements gated on here are
far smaller than one packet.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from urllib.parse import urlsplit, urlunsplit

import trio


class Gate:
    """One held statement: ``reached`` is set once a client sent it (and it
    is held); ``open()`` forwards it."""

    def __init__(self, pattern: bytes, *, from_server: bool = False) -> None:
        self.pattern = pattern
        self.from_server = from_server
        self.reached = trio.Event()
        self._opened = trio.Event()

    def open(self) -> None:
        self._opened.set()


@dataclass(eq=False)
class _Pair:
    client: trio.SocketStream
    upstream: trio.SocketStream
    scope: trio.CancelScope = field(default_factory=trio.CancelScope)
    blackholed: bool = False
    forwarded: int = 0

    @property
    def upstream_port(self) -> int:
        """The local port of the proxy's connection to the server: what the
        server reports as the client's port (pg_stat_activity.client_port)."""
        port: int = self.upstream.socket.getsockname()[1]
        return port


class TcpProxy:
    """Run with ``port = await nursery.start(proxy.run)``; cancel to stop."""

    def __init__(self, upstream_host: str, upstream_port: int) -> None:
        self.upstream_host = upstream_host
        self.upstream_port = upstream_port
        self.port: int | None = None
        self._pairs: list[_Pair] = []
        #: connections accepted so far
        self.accepted = 0
        #: When the server closes a connection, forward everything it sent
        #: but not the close itself: the connection goes silent instead, as
        #: if the FIN were lost (or, for a client, late).
        self.swallow_server_close = False
        self._gates: list[Gate] = []
        #: New connections are accepted and left silent too (``cut_off``).
        self._cut_off = False

    @classmethod
    def for_url(cls, url: str) -> TcpProxy:
        parts = urlsplit(url)
        return cls(parts.hostname or "127.0.0.1", parts.port or 5432)

    def url(self, url: str) -> str:
        """``url`` with its host and port replaced by the proxy's."""
        assert self.port is not None, "the proxy is not running"
        parts = urlsplit(url)
        userinfo = parts.netloc.rpartition("@")[0]
        netloc = f"127.0.0.1:{self.port}"
        return urlunsplit(parts._replace(netloc=f"{userinfo}@{netloc}" if userinfo else netloc))

    @property
    def open_connections(self) -> int:
        return sum(1 for p in self._pairs if not p.blackholed)

    def blackhole(self, *, upstream_port: int | None = None) -> int:
        """Silence every connection open now, or only the one whose server
        side sees ``upstream_port`` as the client port; returns how many."""
        count = 0
        for pair in self._pairs:
            if upstream_port is not None and pair.upstream_port != upstream_port:
                continue
            if not pair.blackholed:
                pair.blackholed = True
                pair.scope.cancel()
                count += 1
        return count

    def cut_off(self) -> int:
        """Silence every connection, those opened from now on too: the
        clients are cut off from the server (a partition), however often
        they reconnect. Returns how many open ones were silenced."""
        self._cut_off = True
        return self.blackhole()

    def gate(self, pattern: bytes, *, from_server: bool = False) -> Gate:
        """Hold the next client chunk containing ``pattern`` (on any
        connection; with ``from_server``, the next server chunk: an answer
        held after the server did the work) until the returned gate is
        opened. One-shot."""
        gate = Gate(pattern, from_server=from_server)
        self._gates.append(gate)
        return gate

    async def run(self, *, task_status: trio.TaskStatus[int] = trio.TASK_STATUS_IGNORED) -> None:
        listeners = await trio.open_tcp_listeners(0, host="127.0.0.1")
        self.port = listeners[0].socket.getsockname()[1]
        async with trio.open_nursery() as nursery:
            await nursery.start(trio.serve_listeners, self._handle, listeners)
            task_status.started(self.port)

    async def _handle(self, client: trio.SocketStream) -> None:
        self.accepted += 1
        try:
            upstream = await trio.open_tcp_stream(self.upstream_host, self.upstream_port)
        except OSError:
            await client.aclose()
            return
        pair = _Pair(client, upstream)
        self._pairs.append(pair)
        if self._cut_off:
            pair.blackholed = True
            pair.scope.cancel()
        try:
            with pair.scope:
                async with trio.open_nursery() as nursery:
                    nursery.start_soon(self._pump, pair, client, upstream, False)
                    nursery.start_soon(self._pump, pair, upstream, client, True)
            if pair.blackholed:
                # Hold both sockets open, silent, until the proxy stops.
                await trio.sleep_forever()
        finally:
            self._pairs.remove(pair)
            with trio.CancelScope(shield=True):
                await client.aclose()
                await upstream.aclose()

    async def _pump(self, pair: _Pair, src: trio.SocketStream, dst: trio.SocketStream,
                    from_server: bool) -> None:
        try:
            while True:
                data = await src.receive_some(65536)
                if not data:
                    break
                await self._pass_gates(data, from_server)
                await dst.send_all(data)
                pair.forwarded += len(data)
        except (trio.BrokenResourceError, trio.ClosedResourceError):
            pass
        if from_server and self.swallow_server_close:
            pair.blackholed = True
        # One side closed: close the pair (a clean close is forwarded as one),
        # or hold it, silent, if it was blackholed.
        pair.scope.cancel()

    async def _pass_gates(self, data: bytes, from_server: bool) -> None:
        for gate in [g for g in self._gates
                     if g.from_server == from_server and g.pattern in data]:
            self._gates.remove(gate)
            gate.reached.set()
            await gate._opened.wait()
