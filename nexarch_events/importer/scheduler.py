"""Keeps every enabled mailbox in sync.

One trio task per mailbox (a *runner*). Where the server offers IDLE and a
slot is free (``import.idle_limit``), the runner holds an IDLE connection
and syncs as soon as the server announces anything, re-issuing IDLE every
``import.idle_refresh`` seconds (servers drop IDLE after some minutes), and
every re-IDLE runs a delta sync too. Otherwise it syncs at the mailbox's
persisted interval, with ±10 % jitter so that a thousand mailboxes do not
hit their servers in the same second.

Runs of one mailbox never overlap, also across processes and machines: each
run holds the mailbox's advisory lock (``sync.run_sync``).

A server login (host, port, user name: an account's folders, or mailboxes
registered by hand with the same login) has at most
``import.sessions_per_login`` sessions at once, IDLE and syncs together;
IDLE takes at most one fewer, so the login's other folders still sync at
their interval. INBOX is offered IDLE first.

Failures are per mailbox: a runner logs, records the error on the mailbox
state (also one that happens before a sync starts: the password reference,
connect, TLS, login), and retries with backoff (2 s doubling, capped by
``import.backoff_max`` and the interval; reset by the next successful run).
A bug (any other exception) is not swallowed: it propagates and takes the
scheduler's nursery down.

"Sync now" (``nexarch_import_requests``) wakes a healthy runner at once, or
``request_min_gap`` (default ``REQUEST_MIN_GAP``) after its last run began if
that is later; an IDLE runner drops its IDLE connection for that and
reconnects. A request
never shortens the backoff of a failing mailbox (guarantee 13: one click
must not become a login storm that gets the account locked), and every
attempt clears the request, whatever its outcome.

IDLE that keeps failing (a server that says BYE on every IDLE) is given up
after ``idle_failures`` (default ``IDLE_FAILURES``) failures in a row: the
runner syncs at the interval instead, records "idle unavailable: ..." on the
mailbox state, and tries IDLE again after ``IDLE_RETRY_AFTER`` seconds.
"""

from __future__ import annotations

import contextlib
import logging
import math
import random
from collections.abc import Callable

import trio

from ..aio import Database
from ..aio.imap import ImapSession
from ..errors import ConfigurationError, DatabaseError, ImapError
from ..metrics import Metrics
from ..queue.notify import IMPORT_REQUESTS_CHANNEL, Listener, Notification, Subscription
from ..settings import ImportSettings
from .mailboxes import MailboxConfig, MailboxRegistry
from .signin import SignIn, TokenSources
from .state import MailboxRemoved, StateStore
from .sync import ImportLimits, MailboxBusy, SyncReport, run_sync

log = logging.getLogger(__name__)

Key = tuple[str, str]
#: Called after every run (the service's metrics, the demo's progress).
RunObserver = Callable[[MailboxConfig, SyncReport], None]

_RETRYABLE = (ImapError, DatabaseError, MailboxBusy, ConfigurationError)
#: IDLE failures in a row (each after a successful sync) before a runner
#: falls back to its interval ...
IDLE_FAILURES = 5
#: ... for this many seconds.
IDLE_RETRY_AFTER = 3600.0
_FIRST_BACKOFF = 2.0
#: A "sync now" starts a run no sooner than this many seconds after the
#: previous run began: a burst of requests (a button clicked 20 times) is
#: one or two runs, not one login each.
REQUEST_MIN_GAP = 5.0
#: Reloads of the mailbox list caused by requests start this far apart.
REQUEST_RELOAD_GAP = 1.0
#: The floor between IDLE-driven syncs of one mailbox: none while pushes
#: bring mail; doubling from IDLE_GAP_MIN to IDLE_GAP_MAX while the server
#: wakes the runner and the sync finds nothing (a server that pushes at
#: once after every IDLE made 120 syncs a second: a retry-loop audit). At
#: most the floor of a "sync now": flag changes by another client push too,
#: and mail after a run of them waits no longer than that.
IDLE_GAP_MIN = 0.05
IDLE_GAP_MAX = REQUEST_MIN_GAP


def _next_idle_gap(gap: float, *, woken: bool, found: bool) -> float:
    """The wait before the next IDLE-driven sync, after the last one
    (``found``: it imported something) and the IDLE that followed it
    (``woken``: it ended on a push rather than its timeout)."""
    if found or not woken:
        return 0.0
    return min(IDLE_GAP_MAX, max(IDLE_GAP_MIN, gap * 2))


class ImportScheduler:
    """Run with ``nursery.start(scheduler.run)``; cancel to stop."""

    def __init__(self, db: Database, settings: ImportSettings, *, secret_key: str | None = None,
                 listener: Listener | None = None, limits: ImportLimits | None = None,
                 on_run: RunObserver | None = None, metrics: Metrics | None = None,
                 idle_failures: int = IDLE_FAILURES,
                 request_min_gap: float = REQUEST_MIN_GAP,
                 token_sources: TokenSources | None = None) -> None:
        """``token_sources``: OAuth2 token sources shared with the account
        discovery (the service passes one to both); by default the
        scheduler's runners share their own."""
        self.db = db
        self.token_sources = token_sources if token_sources is not None \
            else TokenSources(secret_key=secret_key, db=db)
        self.idle_failures = idle_failures
        self.request_min_gap = request_min_gap
        self.settings = settings
        self.secret_key = secret_key
        self.listener = listener
        self.limits = limits or ImportLimits()
        self.on_run = on_run
        self.metrics = metrics
        self._idle_slots = trio.Semaphore(settings.idle_limit)
        self._logins: dict[tuple[str, int, str], _Login] = {}
        #: Runs at once (``ImportSettings.max_runs``; unlimited when 0 here:
        #: the service sets it from its pool's size).
        self._runs = trio.CapacityLimiter(settings.max_runs or math.inf)
        self._runners: dict[Key, _Runner] = {}
        self._nursery: trio.Nursery | None = None
        self._last_reload = -math.inf
        #: Reads of the mailbox list (for tests and metrics).
        self.reloads = 0

    def login(self, config: MailboxConfig) -> _Login:
        """The session limits of ``config``'s server login."""
        key = (config.host.lower(), config.port, config.username)
        login = self._logins.get(key)
        if login is None:
            login = self._logins[key] = _Login(self.settings.sessions_per_login)
        return login

    @property
    def mailboxes(self) -> list[Key]:
        return sorted(self._runners)

    def idle_mailboxes(self) -> list[Key]:
        return sorted(k for k, r in self._runners.items() if r.idling)

    async def run(self, *, task_status: trio.TaskStatus[None] = trio.TASK_STATUS_IGNORED) -> None:
        sub: Subscription | None = None
        if self.listener is not None:
            sub = self.listener.subscribe(IMPORT_REQUESTS_CHANNEL)
        try:
            async with trio.open_nursery() as nursery:
                self._nursery = nursery
                await self.reload()
                if sub is not None:
                    nursery.start_soon(self._requests, sub)
                task_status.started()
                while True:
                    await trio.sleep(self.settings.reload_interval)
                    try:
                        await self.reload()
                    except DatabaseError as exc:
                        log.warning("importer: cannot re-read mailboxes: %s", exc)
        finally:
            if sub is not None and self.listener is not None:
                self.listener.unsubscribe(sub)

    async def reload(self) -> None:
        """Start runners for new or changed mailboxes, stop removed ones,
        wake those with a pending "sync now"."""
        assert self._nursery is not None
        self._last_reload = trio.current_time()
        self.reloads += 1
        wanted: dict[Key, MailboxConfig] = {}
        requested: set[Key] = set()
        for config, sync_requested in await MailboxRegistry(self.db).scheduled():
            key = (config.tenant_slug, config.name)
            wanted[key] = config
            if sync_requested:
                requested.add(key)
        for key, runner in list(self._runners.items()):
            if wanted.get(key) != runner.config:
                runner.cancel_scope.cancel()
                del self._runners[key]
        for key, config in wanted.items():
            if key not in self._runners:
                runner = _Runner(self, config)
                self._runners[key] = runner
                self._nursery.start_soon(self._run_runner, runner)
            if key in requested:
                self._runners[key].wake()

    @staticmethod
    async def _run_runner(runner: _Runner) -> None:
        try:
            await runner.run()
        finally:
            # Its token source's HTTP connections (bounded: it may be cancelled).
            with trio.move_on_after(5, shield=True):
                await runner.sign_in.aclose()

    async def _requests(self, sub: Subscription) -> None:
        async for item in sub:
            if isinstance(item, Notification):
                payload = item.json()
                if payload.get("event", "sync_requested") != "sync_requested":
                    continue  # e.g. discovery_requested: the discovery's
                runner = self._runners.get((str(payload.get("tenant")),
                                            str(payload.get("mailbox"))))
                if runner is not None:
                    runner.wake()
                    continue
            # No runner (registered after our last reload, or not scheduled:
            # disabled, removed), or RESYNC (requests may have been missed):
            # the table knows. At most one reload per REQUEST_RELOAD_GAP:
            # each reads every tenant's mailboxes, and requests for a
            # disabled mailbox made one each, 670 a second (a retry-loop
            # audit). Requests queue meanwhile; none is lost.
            await trio.sleep_until(self._last_reload + REQUEST_RELOAD_GAP)
            await self._reload_quietly()

    async def _reload_quietly(self) -> None:
        try:
            await self.reload()
        except DatabaseError as exc:
            log.warning("importer: cannot re-read mailboxes: %s", exc)


class _Login:
    """One server login's sessions: ``sessions`` for any, ``idle`` for the
    IDLE connections among them (one fewer)."""

    def __init__(self, sessions: int) -> None:
        self.sessions = trio.CapacityLimiter(sessions)
        self.idle = trio.Semaphore(sessions - 1)


class _Runner:
    def __init__(self, scheduler: ImportScheduler, config: MailboxConfig) -> None:
        self.scheduler = scheduler
        self.config = config
        self.cancel_scope = trio.CancelScope()
        self.idling = False
        self._wake = trio.Event()
        self._idle_scope: trio.CancelScope | None = None
        self._backoff = _FIRST_BACKOFF
        #: IDLE is not tried before this trio time (server without IDLE, or
        #: IDLE kept failing).
        self._no_idle_until = float("-inf")
        self._idle_failures = 0
        self._idle_status_shown = False
        self._last_run = float("-inf")
        #: Kept across sessions: an OAuth2 token is fetched once and reused.
        self.sign_in = SignIn(config, secret_key=scheduler.secret_key,
                              shared=scheduler.token_sources)

    @property
    def _server_has_idle(self) -> bool:
        return trio.current_time() >= self._no_idle_until

    def wake(self) -> None:
        self._wake.set()
        if self._idle_scope is not None:
            self._drop_idle_soon(self._idle_scope)

    def _drop_idle_soon(self, scope: trio.CancelScope) -> None:
        # Dropping IDLE costs a reconnect and a login: not sooner than
        # REQUEST_MIN_GAP after the last run began.
        scope.deadline = min(scope.deadline, self._last_run + self.scheduler.request_min_gap)

    async def run(self) -> None:
        s = self.scheduler.settings
        with self.cancel_scope:
            # Spread the first runs of many mailboxes a little; INBOX first,
            # so that it is the folder of a login that gets IDLE.
            inbox = self.config.folder.upper() == "INBOX"
            await trio.sleep(random.uniform(0, 0.2) + (0 if inbox else 0.3))
            login = self.scheduler.login(self.config)
            while True:
                # A request pending now is answered by this attempt.
                self._wake = trio.Event()
                try:
                    if self.config.use_idle and self._server_has_idle \
                            and self._try_idle_slots(login):
                        try:
                            async with login.sessions:
                                await self._idle_loop()
                        finally:
                            login.idle.release()
                            self.scheduler._idle_slots.release()
                        continue
                    await self._sync()
                    await self._wait(await self._interval() * random.uniform(0.9, 1.1))
                except MailboxRemoved:
                    # Removed while this runner ran (the reload that drops
                    # it may be half a minute away): nothing of it is
                    # created or imported again.
                    log.info("importer: mailbox %s was removed; its runner stops",
                             self.config.describe())
                    return
                except _RETRYABLE as exc:
                    delay = min(self._backoff, s.backoff_max,
                                float(await self._interval_or(300)))
                    self._backoff *= 2
                    log.warning("importer: mailbox %s: %s; retry in %.0f s",
                                self.config.describe(), exc, delay)
                    # Not self._wait(): a "sync now" must not cut the backoff
                    # short (guarantee 13). The attempt after it serves it.
                    await trio.sleep(delay * random.uniform(0.8, 1.2))

    def _try_idle_slots(self, login: _Login) -> bool:
        """Both IDLE slots (the process's, the login's), or neither."""
        try:
            self.scheduler._idle_slots.acquire_nowait()
        except trio.WouldBlock:
            return False
        try:
            login.idle.acquire_nowait()
        except trio.WouldBlock:
            self.scheduler._idle_slots.release()
            return False
        return True

    async def _record_failure(self, error: str) -> None:
        try:
            await StateStore(self.scheduler.db).failed_before_run(
                self.config.tenant_slug, self.config.name, error, mailbox_id=self.config.id)
        except (DatabaseError, MailboxRemoved) as db_exc:
            log.warning("importer: mailbox %s: cannot record %r: %s",
                        self.config.describe(), error, db_exc)

    async def _set_idle_status(self, status: str | None) -> None:
        try:
            await StateStore(self.scheduler.db).set_idle_status(
                self.config.tenant_slug, self.config.name, status)
        except DatabaseError as exc:
            log.warning("importer: mailbox %s: cannot record IDLE status: %s",
                        self.config.describe(), exc)

    async def _sync(self, session: ImapSession | None = None) -> SyncReport:
        s = self.scheduler.settings
        self._wake = trio.Event()
        self._last_run = trio.current_time()
        metrics = self.scheduler.metrics
        # A run of its own opens a session: one of the login's. In IDLE, the
        # IDLE connection's (held already).
        own_session = self.scheduler.login(self.config).sessions if session is None \
            else contextlib.nullcontext()
        try:
            async with own_session, self.scheduler._runs:
                report = await run_sync(self.scheduler.db, self.config, self.sign_in,
                                        session=session, limits=self.scheduler.limits,
                                        imap_timeout=s.imap_timeout, lock_wait=s.lock_wait)
        except _RETRYABLE:
            if metrics is not None:
                metrics.count_import_run(self.config.tenant_slug, self.config.name, ok=False,
                                         imported=0)
            raise
        self._backoff = _FIRST_BACKOFF  # a success ends a failure streak
        if metrics is not None:
            metrics.count_import_run(self.config.tenant_slug, self.config.name, ok=True,
                                     imported=report.imported + report.recovered)
        if self.scheduler.on_run is not None:
            self.scheduler.on_run(self.config, report)
        return report

    async def _idle_loop(self) -> None:
        """Sync, IDLE until the server announces something, repeat. Returns
        when the IDLE connection was given up on purpose (a "sync now", a
        server without IDLE, or a token about to expire: the next session
        signs in with a fresh one); raises when it broke."""
        s = self.scheduler.settings
        store = StateStore(self.scheduler.db)
        await store.get_or_create(self.config.tenant_slug, self.config.name, self.config.id)
        await store.attempt_started(self.config.tenant_slug, self.config.name)
        session = await self._open()
        deadline = self.sign_in.session_deadline()
        ends_at = math.inf if deadline is None else trio.current_time() + deadline
        try:
            if "IDLE" not in session.capabilities:
                log.info("importer: %s: server has no IDLE; syncing at the interval",
                         self.config.describe())
                self._no_idle_until = trio.current_time() + IDLE_RETRY_AFTER
                self._idle_status_shown = True
                await self._set_idle_status("idle unavailable: the server does not offer "
                                            "IDLE; syncing at the interval")
                return
            self.idling = True
            idle_gap = 0.0
            while True:
                if idle_gap:
                    await trio.sleep_until(self._last_run + idle_gap)
                report = await self._sync(session)
                left = ends_at - trio.current_time()
                if left <= 0:
                    return  # sign in anew before the server drops a stale token
                with trio.CancelScope() as scope:
                    self._idle_scope = scope
                    if self._wake.is_set():
                        self._drop_idle_soon(scope)
                    try:
                        pushed = await session.idle(min(s.idle_refresh,
                                                        float(await self._interval()), left))
                    except ImapError as exc:
                        await self._idle_failed(exc)
                        raise
                    idle_gap = _next_idle_gap(idle_gap, woken=bool(pushed),
                                              found=report.imported + report.recovered > 0)
                self._idle_scope = None
                if not scope.cancelled_caught:
                    self._idle_failures = 0
                    if self._idle_status_shown:
                        self._idle_status_shown = False
                        await self._set_idle_status(None)
                if scope.cancelled_caught:
                    return  # woken mid-IDLE: the session is gone; reconnect, sync
        finally:
            self.idling = False
            self._idle_scope = None
            await session.aclose()

    async def _open(self) -> ImapSession:
        """A signed-in session for IDLE. A failure to get one (a secret that
        cannot be read, a refused token, connect, TLS, login) is written to
        the mailbox state here, since no run will record it."""
        s = self.scheduler.settings
        try:
            return await self.sign_in.open(self.config.endpoint(timeout=s.imap_timeout))
        except (ImapError, ConfigurationError) as exc:
            with trio.move_on_after(5, shield=True):
                await self._record_failure(str(exc))
            raise

    async def _idle_failed(self, exc: ImapError) -> None:
        self._idle_failures += 1
        failures = self.scheduler.idle_failures
        if self._idle_failures < failures:
            return
        self._idle_failures = 0
        self._no_idle_until = trio.current_time() + IDLE_RETRY_AFTER
        log.warning("importer: mailbox %s: IDLE failed %d times in a row (%s); syncing at "
                    "the interval, IDLE again in %.0f s", self.config.describe(), failures,
                    exc, IDLE_RETRY_AFTER)
        self._idle_status_shown = True
        await self._set_idle_status(f"idle unavailable: {exc}; syncing at the interval")

    async def _interval(self) -> int:
        state = await StateStore(self.scheduler.db).get_or_create(
            self.config.tenant_slug, self.config.name, self.config.id)
        return state.interval_seconds

    async def _interval_or(self, default: int) -> int:
        try:
            return await self._interval()
        except (DatabaseError, MailboxRemoved):
            return default

    async def _wait(self, seconds: float) -> None:
        """Up to ``seconds``; a "sync now" ends it early, but not sooner than
        REQUEST_MIN_GAP after the last run began."""
        with trio.move_on_after(seconds):
            await self._wake.wait()
            await trio.sleep_until(self._last_run + self.scheduler.request_min_gap)
