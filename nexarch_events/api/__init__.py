"""The HTTP API and the status page, served by hypercorn's trio worker.

``serve_api`` runs in the service's nursery; ``create_app`` gives the ASGI
app alone (for another server, or tests). Endpoints, auth and the event
stream are described in ``openapi.yaml`` beside this file (served at
``/openapi.yaml``); the status page is ``nexarch_events/static/``.
"""

from __future__ import annotations

import contextlib
import contextvars
import errno
from dataclasses import dataclass, field, replace
from functools import partial
from typing import cast

import trio
from hypercorn.config import Config
from hypercorn.events import Closed, Event, RawData
from hypercorn.trio import tcp_server
from hypercorn.trio.run import worker_serve
from hypercorn.typing import Framework
from hypercorn.utils import wrap_app

from ..aio import Database
from ..errors import ConfigurationError
from ..index.base import IndexBackend
from ..metrics import Metrics
from ..queue.notify import Listener
from ..queue.worker import default_worker_name
from ..settings import Settings
from .asgi import AsgiApp, log
from .events import CHANNELS
from .routes import build_router

#: Connections of the event streams' own pool (set-up and replay reads).
STREAM_POOL_SIZE = 2


@dataclass
class ApiContext:
    """What the API serves from; the caller owns and runs all of it."""

    db: Database
    settings: Settings
    backend: IndexBackend
    #: Already running, listening on (at least) the mail-imported and
    #: job-events channels: every ``/events`` stream subscribes to both.
    listener: Listener
    metrics: Metrics
    #: Seconds of silence after which an event stream sends ": keepalive".
    sse_keepalive_s: float = 15.0
    #: Event streams read their set-up and replays here, never from ``db``:
    #: a burst of streams then waits for these connections, not the
    #: workers'. ``serve_api`` opens a small pool when None (else: ``db``).
    streams_db: Database | None = None
    #: ``/readyz`` pings here: capacity reserved for it, so a busy ``db``
    #: does not make the service look dead. Opened like ``streams_db``.
    probe_db: Database | None = None
    #: The service's name in its connections' application_name
    #: (``nexarch-events/api-streams/<name>``, ``.../api-probe/<name>``).
    name: str | None = None
    #: Writes to clients in flight: ``client_writes.abort()`` (the service's
    #: second signal) ends them at once instead of after WRITE_TIMEOUT.
    client_writes: ClientWrites = field(default_factory=lambda: ClientWrites())


class ClientWrites:
    """The shielded writes to clients of one server (``serve_api``)."""

    def __init__(self) -> None:
        self.scopes: set[trio.CancelScope] = set()
        self.aborted = False

    def abort(self) -> None:
        """Stop now: every write in flight ends, and every later one at once
        (the connection is closed as if the client had gone)."""
        self.aborted = True
        for scope in self.scopes:
            scope.cancel()


#: The server whose connection a hypercorn task serves (set by serve_api;
#: its tasks inherit it).
_WRITES: contextvars.ContextVar[ClientWrites | None] = contextvars.ContextVar(
    "nexarch_api_client_writes", default=None)


def create_app(ctx: ApiContext) -> AsgiApp:
    """The ASGI app. Raises ConfigurationError if the listener lacks a channel."""
    missing = [channel for channel in CHANNELS if channel not in ctx.listener.channels]
    if missing:
        raise ConfigurationError(
            f"the API's listener must listen on {', '.join(CHANNELS)} (missing: "
            f"{', '.join(missing)}): create it with Listener(dsn, channels=(...))")
    return AsgiApp(build_router(ctx))


#: Seconds one write to a client may take. hypercorn writes in a shielded
#: scope with no deadline: a client that stops reading (or its network
#: does) held its connection, an event stream's slot and the server's
#: shutdown for as long as it liked, with no token needed (found by an
#: audit: 200 such connections, each for good; SIGTERM waited for them).
WRITE_TIMEOUT = 30.0


async def _protocol_send(self: tcp_server.TCPServer, event: Event) -> None:
    """hypercorn's TCPServer.protocol_send, each write bounded by
    WRITE_TIMEOUT: past it the connection is aborted as if the client had
    gone. The one place this package reaches into hypercorn; checked by
    tests/integration/test_api.py against the installed version."""
    if not isinstance(event, RawData):
        await _hypercorn_protocol_send(self, event)
        return
    writes = _WRITES.get()
    async with self.send_lock:
        try:
            with trio.CancelScope(shield=True) as shielded:
                if writes is not None:
                    writes.scopes.add(shielded)
                    if writes.aborted:
                        shielded.cancel()
                try:
                    with trio.move_on_after(WRITE_TIMEOUT) as timed:
                        await self.stream.send_all(event.data)
                finally:
                    if writes is not None:
                        writes.scopes.discard(shielded)
            if timed.cancelled_caught or shielded.cancelled_caught:
                if timed.cancelled_caught:
                    log.info("api: a client read nothing for %g s; connection closed",
                             WRITE_TIMEOUT)
                await trio.aclose_forcefully(self.stream)
                await self.protocol.handle(Closed())
        except (trio.BrokenResourceError, trio.ClosedResourceError):
            await self.protocol.handle(Closed())


_hypercorn_protocol_send = tcp_server.TCPServer.protocol_send
tcp_server.TCPServer.protocol_send = _protocol_send  # type: ignore[method-assign]


async def serve_api(ctx: ApiContext, *, any_port_if_taken: bool = False,
                    task_status: trio.TaskStatus[int] = trio.TASK_STATUS_IGNORED) -> None:
    """Serve on ``ctx.settings.api.host``/``port`` until cancelled.

    Started (for ``nursery.start``) once the socket listens, with the bound
    port (the chosen one when the setting is 0). Cancellation closes the
    listening socket and every connection, event streams included.

    ``any_port_if_taken`` (the demo): a port that is in use when the socket
    is bound is replaced by any free one, with a warning. Decided at the bind
    itself, since a free port found earlier can be taken in between.
    """
    api = ctx.settings.api
    config = Config()
    host = f"[{api.host}]" if ":" in api.host else api.host
    config.bind = [f"{host}:{api.port}"]
    config.accesslog = None
    config.errorlog = log
    config.include_server_header = False
    # Bound here, not inside hypercorn: a busy port is the user's to fix
    # (exit 2, one line), not an exception group from the server's nursery.
    try:
        try:
            sockets = config.create_sockets()
        except OSError as exc:
            if not (any_port_if_taken and api.port and exc.errno == errno.EADDRINUSE):
                raise
            log.warning("port %d on %s is taken: the status page uses a free port instead "
                        "(choose one with --port)", api.port, api.host)
            config.bind = [f"{host}:0"]
            sockets = config.create_sockets()
    except OSError as exc:
        raise ConfigurationError(
            f"the API cannot listen on {host}:{api.port}: {exc.strerror or exc}; set "
            "NEXARCH_API_PORT (api.port) to a free port, or 0 for any free port") from None
    async with contextlib.AsyncExitStack() as stack:
        for sock in sockets.insecure_sockets:
            stack.callback(sock.close)  # also if a pool below cannot open
            sock.listen(config.backlog)
        # The pools opened here live as long as this call: the caller's ctx
        # is left as it was.
        name = ctx.name or default_worker_name()
        if ctx.streams_db is None:
            ctx = replace(ctx, streams_db=await stack.enter_async_context(Database.open(
                ctx.db.dsn, min_size=0, max_size=STREAM_POOL_SIZE,
                application_name=f"nexarch-events/api-streams/{name}",
                **ctx.settings.pool_options())))
        if ctx.probe_db is None:
            ctx = replace(ctx, probe_db=await stack.enter_async_context(Database.open(
                ctx.db.dsn, min_size=0, max_size=1,
                application_name=f"nexarch-events/api-probe/{name}",
                **ctx.settings.pool_options())))
        app = create_app(ctx)
        _WRITES.set(ctx.client_writes)  # inherited by the server's tasks
        async with trio.open_nursery() as nursery:
            binds: list[str] = await nursery.start(partial(
                worker_serve, wrap_app(cast(Framework, app), config.wsgi_max_body_size, "asgi"),
                config, sockets=sockets))
            port = int(binds[0].rsplit(":", 1)[1])
            log.info("api listening on http://%s:%d", host, port)
            task_status.started(port)


__all__ = ["ApiContext", "ClientWrites", "create_app", "serve_api"]
