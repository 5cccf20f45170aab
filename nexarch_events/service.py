"""The queue service: one nursery holds the listener (whose deliveries wake
the workers directly), the workers, the sweeper and the job table's vacuum.
``serve`` is what ``nexarch-events worker`` runs; embedders call it (or
``QueueService``) from their own trio code.

Shutdown: the first SIGTERM/SIGINT (or ``QueueService.shutdown``) stops
claims and gives in-flight jobs ``shutdown_grace`` seconds; unfinished ones
are released with their attempt refunded. A second signal cancels at once
(releases still run, shielded and bounded).
"""

from __future__ import annotations

import dataclasses
import logging
import signal
from collections.abc import Callable, Mapping
from functools import partial

import trio

from .aio import Connection, Database
from .db.migrations import ensure_current, watch_schema
from .index.base import IndexBackend
from .metrics import Metrics
from .queue.jobs import Queue
from .queue.notify import (
    IMPORT_REQUESTS_CHANNEL,
    INDEX_JOBS_CHANNEL,
    JOB_EVENTS_CHANNEL,
    MAIL_IMPORTED_CHANNEL,
    Event,
    Listener,
    Notification,
)
from .queue.sweeper import Sweeper
from .queue.vacuum import VACUUM_TIMEOUT, TableVacuum
from .queue.worker import BatchHandler, WorkerPool, default_worker_name
from .settings import ImportSettings, Settings

log = logging.getLogger(__name__)


class QueueService:
    """Listener + workers + sweeper + vacuum for one process, sharing one pool
    (the vacuum opens a connection of its own for each VACUUM)."""

    def __init__(self, db: Database, settings: Settings,
                 handlers: Mapping[str, BatchHandler], *, name: str | None = None,
                 listen_job_events: bool = False,
                 extra_channels: tuple[str, ...] = ()) -> None:
        # Behind a transaction pooler, LISTEN (and VACUUM) need a direct
        # connection.
        listen_dsn = settings.listen_database_url or db.dsn
        self.settings = settings
        self.queue = Queue(db, settings.queue)
        # Workers need only the wake-up channel; every ack notifies the
        # job-events channel, and listening to it in every worker process
        # would cost each of them a parse per batch for nothing.
        channels: tuple[str, ...] = (INDEX_JOBS_CHANNEL, JOB_EVENTS_CHANNEL) if listen_job_events \
            else (INDEX_JOBS_CHANNEL,)
        channels += extra_channels
        self.pool = WorkerPool(self.queue, handlers, settings.queue, name=name,
                               command_timeout=settings.command_timeout,
                               statement_cache_size=settings.statement_cache_size)
        self.listener = Listener(listen_dsn, settings.queue, channels=channels,
                                 name=self.pool.name)
        self.sweeper = Sweeper(self.queue, self.pool.wakeups, settings.queue)
        # VACUUM runs on a session of its own (it switches statement_timeout
        # off there), so on the direct URL behind a transaction pooler.
        self.vacuum = TableVacuum(self.queue, partial(
            Connection.open, listen_dsn, connect_timeout=min(10.0, settings.command_timeout),
            command_timeout=VACUUM_TIMEOUT, statement_cache_size=0,
            application_name=f"nexarch-events/vacuum/{self.pool.name}"), settings.queue)
        self.listener.on_event(INDEX_JOBS_CHANNEL, self._wake)
        self._cancel = trio.CancelScope()
        #: The HTTP API's port once it listens (serve() with a backend).
        self.api_port: int | None = None
        #: Called by ``cancel``: what else must stop now (the API's writes).
        self.on_cancel: list[Callable[[], None]] = []

    async def run(self, *, task_status: trio.TaskStatus[None] = trio.TASK_STATUS_IGNORED) -> None:
        """Run until ``shutdown`` has finished the workers, or until cancelled.
        Started (for ``nursery.start``) once the listener listens and the
        workers are up."""
        with self._cancel:
            async with trio.open_nursery() as nursery:
                await nursery.start(self.listener.run)
                await nursery.start(self.sweeper.run)
                await nursery.start(self.vacuum.run)
                # Returns once shutdown() has finished every worker; the
                # listener, sweeper and vacuum then have nothing left to serve.
                await self.pool.run(task_status=task_status)
                nursery.cancel_scope.cancel()

    async def shutdown(self, grace: float | None = None) -> None:
        """Graceful stop: see the module docstring. Returns at once."""
        await self.pool.shutdown(grace)

    def cancel(self) -> None:
        """Stop now; in-flight jobs are released (shielded, bounded), and
        what cannot be recorded at once is left to the leases' expiry."""
        self.pool.force()
        for stop_now in self.on_cancel:
            stop_now()
        self._cancel.cancel()

    def _wake(self, event: Event) -> None:
        """Turn an index-channel notification into targeted wake-ups, in the
        listener's delivery (Listener.on_event)."""
        if not isinstance(event, Notification):  # RESYNC
            self.pool.wakeups.wake_all()
            self.sweeper.poke()
            return
        data = event.json()
        ready = data.get("ready")
        if isinstance(ready, int) and ready > 0:
            self.pool.wakeups.wake(ready)
        if data.get("next_due") is not None:
            self.sweeper.poke()


#: Connections of the shared pool kept from mailbox syncs when
#: ``import.max_runs`` is 0 (the sweeper, the API, account discovery).
POOL_KEPT_FROM_RUNS = 2


def import_settings(settings: Settings) -> ImportSettings:
    """The importer's settings with ``max_runs`` resolved: as configured, or
    the pool's size minus ``POOL_KEPT_FROM_RUNS`` (at least 1). A run holds
    a pool connection for its whole length; with one run per mailbox and no
    bound, a first sync of as many large folders as the pool has connections
    left the sweeper (stale jobs, due retries) and the API waiting for one
    until a run ended."""
    runs = settings.importer.max_runs or max(1, settings.pool_size - POOL_KEPT_FROM_RUNS)
    return dataclasses.replace(settings.importer, max_runs=runs)


async def serve(settings: Settings, handlers: Mapping[str, BatchHandler], *,
                dsn: str, name: str | None = None, importer: bool = False,
                backend: IndexBackend | None = None, api_any_port_if_taken: bool = False,
                task_status: trio.TaskStatus[QueueService] = trio.TASK_STATUS_IGNORED) -> None:
    """Migrate, then run until SIGTERM/SIGINT has stopped it: the queue
    service, and in the same nursery the IMAP import scheduler (``importer``),
    the retention passes (when ``backend`` is given) and the HTTP API (when
    ``backend`` is given and settings.api.enabled).

    The importer and the API stop with the workers: each message's import is
    one transaction, so cancelling it mid-run loses nothing. The API's bound
    port is ``service.api_port`` once started; ``api_any_port_if_taken``
    (the demo) binds any free port when the configured one is in use."""
    from .importer.accounts import AccountDiscovery
    from .importer.scheduler import ImportScheduler
    from .importer.signin import TokenSources

    api = backend is not None and settings.api.enabled
    channels: tuple[str, ...] = ()
    if importer:
        channels += (IMPORT_REQUESTS_CHANNEL,)
    if api:
        channels += (MAIL_IMPORTED_CHANNEL,)
    name = name or default_worker_name()
    async with Database.open(dsn, max_size=settings.pool_size,
                             connect_timeout=min(10.0, settings.command_timeout),
                             application_name=f"nexarch-events/pool/{name}",
                             **settings.pool_options()) as db:
        # Migrated only when behind: a role that may not create tables runs a
        # current schema (an upgrade audit: exit 70 at every start before).
        await ensure_current(db, apply=True)
        service = QueueService(db, settings, handlers, name=name, listen_job_events=api,
                               extra_channels=channels)
        metrics = Metrics()
        metrics.listener_reconnects = lambda: service.listener.reconnects
        metrics.pruned_jobs = lambda: service.sweeper.pruned
        metrics.vacuums = lambda: service.vacuum.vacuums
        metrics.vacuum_seconds = lambda: service.vacuum.seconds
        service.pool.metrics = metrics
        async with trio.open_nursery() as nursery:
            nursery.start_soon(_on_signals, service)
            # A newer version migrated the schema under us: stop (exit 1),
            # rather than run on with parts of our SQL gone.
            nursery.start_soon(watch_schema, db)
            await nursery.start(_run_then_stop, service, nursery.cancel_scope)
            # The importer once the listener heard itself: behind a pooler
            # that it cannot listen through, the service refuses to start,
            # and an importer started beside the check could leave a
            # mailbox's run lock on one of the pooler's server connections.
            if importer:
                # One OAuth2 token per account for its discovery and all its
                # folders (a provider may rotate the refresh token on use).
                tokens = TokenSources(secret_key=settings.secret_key, db=db)
                scheduler = ImportScheduler(db, import_settings(settings),
                                            secret_key=settings.secret_key,
                                            listener=service.listener, metrics=metrics,
                                            token_sources=tokens)
                nursery.start_soon(scheduler.run)
                # Registered accounts: their folders become mailboxes the
                # scheduler picks up (a new folder's "sync now" wakes it).
                nursery.start_soon(AccountDiscovery(db, settings.importer,
                                                    secret_key=settings.secret_key,
                                                    listener=service.listener,
                                                    token_sources=tokens).run)
            if backend is not None:
                # Retention beside the sweeper: a pass at start, then every
                # retention.interval (one pass at a time across processes).
                from .lifecycle.retention import Retention, RetentionTask

                nursery.start_soon(RetentionTask(
                    Retention(db, backend, settings.retention),
                    reconnect_max=settings.queue.reconnect_max).run)
            if api:
                from .api import ApiContext, serve_api

                assert backend is not None
                ctx = ApiContext(db, settings, backend, service.listener, metrics, name=name)
                service.on_cancel.append(ctx.client_writes.abort)
                service.api_port = await nursery.start(partial(
                    serve_api, ctx, any_port_if_taken=api_any_port_if_taken))
            log.info("service running name=%s workers=%d batch_size=%d importer=%s api=%s",
                     service.pool.name, settings.queue.workers, settings.queue.batch_size,
                     importer, f"{settings.api.host}:{service.api_port}" if api else "off")
            task_status.started(service)


async def _run_then_stop(service: QueueService, scope: trio.CancelScope, *,
                         task_status: trio.TaskStatus[None] = trio.TASK_STATUS_IGNORED) -> None:
    await service.run(task_status=task_status)
    scope.cancel()  # the signal watcher


async def _on_signals(service: QueueService) -> None:
    with trio.open_signal_receiver(signal.SIGTERM, signal.SIGINT) as signals:
        count = 0
        async for signum in signals:
            count += 1
            if count == 1:
                log.info("signal %s: shutting down (grace %.1fs); again to force",
                         signal.Signals(signum).name, service.settings.queue.shutdown_grace)
                await service.shutdown()
            else:
                log.warning("second signal: stopping now")
                service.cancel()
