"""``nexarch-events demo``: the whole service, fed by a sample mailbox that
lives in this process.

In one trio nursery:

- an IMAP server (``imap_server``) on 127.0.0.1, holding a dozen sample
  messages (``samples``) to begin with;
- that mailbox, registered as ``demo/sample`` (replacing one an earlier run
  left: the server's port and UIDVALIDITY are new each run);
- the service as ``nexarch-events run`` runs it: ``serve(..., importer=True)``
  (workers with the Indexer, listener, sweeper, and the import scheduler,
  which holds IDLE on the mailbox);
- a delivery loop putting ``rate`` new messages a second into the mailbox for
  ``duration`` seconds;
- a watcher measuring each message's arrival -> searchable latency: from just
  before it is put into the mailbox until a search of the index backend for
  its unique token first returns it. It searches when the importer announces
  the message (mail-imported), again after every index job outcome of the
  tenant (job-events), and every 0.25 s in case a notification was missed.

Ends after ``duration`` (plus up to ``DRAIN_SECONDS`` for the last messages)
or on the first SIGINT/SIGTERM (the service's graceful shutdown; a second
signal stops at once), then prints a summary and a search. The mailbox is
unregistered at the end, since its server goes with the demo; the archived
mail stays.
"""

from __future__ import annotations

import contextlib
import hashlib
import importlib
import os
import random
import secrets
import signal
import sys
import time
from collections.abc import AsyncIterator, Mapping
from dataclasses import dataclass, replace
from typing import TextIO
from urllib.parse import urlsplit

import trio

from .aio import Database
from .aio import run as aio_run
from .db.migrations import ensure_current
from .errors import ConfigurationError, JobNotFound, NexarchError
from .importer.mailboxes import MailboxConfig, MailboxRegistry
from .index.base import IndexBackend, SearchQuery, SearchResult
from .index.factory import open_index
from .mail.indexer import Indexer
from .queue.jobs import Queue
from .queue.notify import JOB_EVENTS_CHANNEL, MAIL_IMPORTED_CHANNEL, Event, Listener, Notification
from .queue.worker import BatchHandler
from .service import QueueService, serve
from .settings import ApiToken, Settings
from .testing.imap_server import Faults, ScriptedImapServer
from .testing.samples import SampleMail, sample_mail

TENANT = "demo"
MAILBOX = "sample"
IMAP_USER = "demo"
#: The password travels by reference (``env:``), as an operator's would. Not
#: a NEXARCH_* name: Settings.from_env rejects unknown ones.
PASSWORD_ENV = "DEMO_IMAP_PASSWORD"
#: Messages in the mailbox before the service starts (its first sync).
INITIAL_MESSAGES = 12
FIRST_SYNC_TIMEOUT = 60.0
#: After the last delivery, how long the demo waits for stragglers.
DRAIN_SECONDS = 15.0
#: Search every not-yet-found message at least this often.
POLL_INTERVAL = 0.25


def percentile(values: list[float], q: float) -> float:
    if not values:
        return float("nan")
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, int(q * len(ordered)))]


@dataclass(slots=True)
class Arrival:
    """One message put into the sample mailbox, and what became of it."""

    uid: int
    mail: SampleMail
    #: time.time() just before it was put into the mailbox
    arrived_at: float
    #: False for the messages there before the service started: their
    #: latency is the service's start-up, not arrival -> searchable.
    measured: bool = True
    archive_id: int | None = None
    searchable_at: float | None = None

    @property
    def latency_ms(self) -> float | None:
        if self.searchable_at is None:
            return None
        return (self.searchable_at - self.arrived_at) * 1000


class Tracker:
    """Arrived -> imported -> searchable, per message. No I/O: fed with
    arrivals, notifications and search outcomes."""

    def __init__(self, *, tenant: str = TENANT, mailbox: str = MAILBOX,
                 uidvalidity: int | None = None) -> None:
        self.tenant = tenant
        self.mailbox = mailbox
        self.uidvalidity = uidvalidity
        self.arrivals: dict[int, Arrival] = {}
        #: in the order they were found searchable
        self.found_order: list[Arrival] = []
        #: set (and replaced) on every change worth another search
        self.changed = trio.Event()

    def poke(self) -> None:
        self.changed.set()
        self.changed = trio.Event()

    def arrived(self, uid: int, mail: SampleMail, at: float, *, measured: bool = True
                ) -> Arrival:
        arrival = Arrival(uid, mail, at, measured)
        self.arrivals[uid] = arrival
        self.poke()
        return arrival

    def note(self, event: Event) -> None:
        """A mail-imported or job-events notification (or RESYNC)."""
        if not isinstance(event, Notification):  # RESYNC: anything may have happened
            self.poke()
            return
        data = event.json()
        if data.get("tenant") != self.tenant:
            return
        if event.channel == MAIL_IMPORTED_CHANNEL:
            uid, archive_id = data.get("uid"), data.get("archive_id")
            if data.get("mailbox") != self.mailbox or data.get("event") not in (
                    "imported", "recovered") or not isinstance(archive_id, int):
                return
            if self.uidvalidity is not None and data.get("uidvalidity") != self.uidvalidity:
                return
            arrival = self.arrivals.get(uid) if isinstance(uid, int) else None
            if arrival is not None and arrival.archive_id is None:
                arrival.archive_id = archive_id
        self.poke()

    def to_search(self, now: float) -> list[Arrival]:
        """Messages worth a search: announced as imported, or arrived a
        while ago (the announcement may have been missed)."""
        return [a for a in self.arrivals.values() if a.searchable_at is None
                and (a.archive_id is not None or now - a.arrived_at > 1.0)]

    def found(self, arrival: Arrival, at: float, archive_id: int) -> None:
        if arrival.searchable_at is not None:
            return
        arrival.searchable_at = at
        if arrival.archive_id is None:
            arrival.archive_id = archive_id
        self.found_order.append(arrival)
        self.poke()

    def pending(self, *, measured_only: bool = False) -> list[Arrival]:
        return [a for a in self.arrivals.values() if a.searchable_at is None
                and (a.measured or not measured_only)]

    def latencies_ms(self) -> list[float]:
        return [a.latency_ms for a in self.found_order
                if a.measured and a.latency_ms is not None]

    def counts(self, *, measured_only: bool = True) -> tuple[int, int, int]:
        """(arrived, imported, searchable)."""
        chosen = [a for a in self.arrivals.values() if a.measured or not measured_only]
        return (len(chosen), sum(a.archive_id is not None for a in chosen),
                sum(a.searchable_at is not None for a in chosen))


def status_page_url(settings: Settings, *, port: int | None = None, token: str | None = None,
                    api_module: str = f"{__package__}.api") -> str | None:
    """Where the service's status page is, if the HTTP API exists (a module
    ``api_module`` with ``serve_api``) and is enabled; else None. ``port``:
    the one actually bound (the setting may be 0); ``token`` goes into the
    URL fragment, which the browser never sends to the server."""
    if not settings.api.enabled:
        return None
    try:
        api = importlib.import_module(api_module)
    except ImportError:
        # Absent, or its dependencies are: the service cannot serve it either.
        return None
    if not hasattr(api, "serve_api"):
        return None
    host = settings.api.host
    if host in ("", "0.0.0.0", "::"):
        host = "127.0.0.1"
    elif ":" in host:
        host = f"[{host}]"
    fragment = f"#token={token}" if token else ""
    return f"http://{host}:{settings.api.port if port is None else port}/{fragment}"


def describe_url(url: str) -> str:
    """host:port/database of a database URL, without user or password."""
    parts = urlsplit(url)
    return f"{parts.hostname}:{parts.port or 5432}{parts.path or '/'}"


def latency_line(values: list[float]) -> str:
    if not values:
        return "-"
    return (f"p50 {percentile(values, 0.5):.0f} ms · p90 {percentile(values, 0.9):.0f} ms · "
            f"p99 {percentile(values, 0.99):.0f} ms · max {max(values):.0f} ms "
            f"(min {min(values):.0f} ms, {len(values)} messages)")


class Demo:
    def __init__(self, url: str, settings: Settings, *, duration: float, rate: float,
                 initial: int = INITIAL_MESSAGES, out: TextIO | None = None,
                 command: str = "nexarch-events", any_port_if_taken: bool = False) -> None:
        self.url = url
        self.command = command
        self.any_port_if_taken = any_port_if_taken
        # An admin token for this run's status page (only its hash is kept
        # in the settings; the token itself goes into the printed URL).
        self.api_token = secrets.token_urlsafe(24)
        digest = hashlib.sha256(self.api_token.encode()).hexdigest()
        self.settings = replace(settings, api=replace(
            settings.api, tokens=(*settings.api.tokens, ApiToken("demo-run", digest, None))))
        self.duration = duration
        self.rate = rate
        self.initial = initial
        self.out = out or sys.stdout
        self.password = secrets.token_urlsafe(16)
        # A new UIDVALIDITY each run, as a server whose mailbox was recreated.
        self.imap = ScriptedImapServer(user=IMAP_USER, password=self.password,
                                       faults=Faults(uidvalidity=int(time.time())))
        self.tracker = Tracker(uidvalidity=self.imap.faults.uidvalidity)
        self.listener = Listener(url, settings.queue,
                                 channels=(MAIL_IMPORTED_CHANNEL, JOB_EVENTS_CHANNEL))
        self.rng = random.Random()
        self.service: QueueService | None = None
        #: cancelled on interrupt: start-up wait, deliveries, drain
        self.running = trio.CancelScope()
        #: cancelled by a second signal: everything
        self.everything = trio.CancelScope()
        self.served = trio.Event()
        self.stopping = False
        self.interrupted = False
        self.started_at: float | None = None
        self.ended_at: float | None = None
        self.stats: Mapping[str, int] = {}
        self.searches: list[tuple[str, SearchResult]] = []

    def say(self, line: str = "") -> None:
        print(line, file=self.out, flush=True)

    # -- running ----------------------------------------------------------

    async def run(self) -> int:
        with trio.open_signal_receiver(signal.SIGINT, signal.SIGTERM) as signals:
            with self.everything:
                async with trio.open_nursery() as nursery:
                    nursery.start_soon(self._on_signals, signals)
                    await self._run()
                    nursery.cancel_scope.cancel()
        return self._summary()

    async def _on_signals(self, signals: AsyncIterator[int]) -> None:
        # While the service runs, its own handler (service.serve) gets the
        # signals; this one covers start-up and the summary.
        async for signum in signals:
            if self.interrupted:
                self.say("second signal: stopping now")
                self.everything.cancel()
                continue
            self._interrupt(signal.Signals(signum).name)
            if self.service is not None and not self.served.is_set():
                await self.service.shutdown()

    def _interrupt(self, why: str) -> None:
        self.interrupted = True
        self.ended_at = time.time()
        self.running.cancel()
        self.say(f"{why}: stopping (in-flight jobs finish first) ...")

    async def _run(self) -> None:
        async with Database.open(self.url, max_size=self.settings.queue.workers + 2,
                                 **self.settings.pool_options()) as db:
            # As `run` does: an older schema is migrated, a newer one refused.
            await ensure_current(db, apply=True)
            async with open_index(self.settings, db) as backend, \
                    trio.open_nursery() as nursery:
                await nursery.start(self.imap.serve)
                for _ in range(self.initial):
                    self._deliver_one(measured=False)
                await self._register(db)
                try:
                    await self._serve_and_deliver(db, backend, nursery)
                finally:
                    # Its server goes with the demo: left registered, it would
                    # only fail in every later `nexarch-events run`.
                    with trio.move_on_after(10, shield=True):
                        with contextlib.suppress(NexarchError):
                            await MailboxRegistry(db).remove(TENANT, MAILBOX)
                nursery.cancel_scope.cancel()  # the IMAP server, listener, watchers

    async def _serve_and_deliver(self, db: Database, backend: IndexBackend,
                                 nursery: trio.Nursery) -> None:
        events = (self.listener.subscribe(MAIL_IMPORTED_CHANNEL),
                  self.listener.subscribe(JOB_EVENTS_CHANNEL))
        await nursery.start(self.listener.run)
        for sub in events:
            nursery.start_soon(self._follow, sub)
        nursery.start_soon(self._search_loop, backend)
        os.environ[PASSWORD_ENV] = self.password
        self.service = await nursery.start(self._serve, Indexer(db, backend).handlers(),
                                           backend)
        self._header(backend)
        with self.running:
            await self._wait_first_sync()
            self.started_at = time.time()
            async with trio.open_nursery() as progress:
                progress.start_soon(self._report)
                await self._deliver()
                await self._drain()
                progress.cancel_scope.cancel()
        if self.ended_at is None:
            self.ended_at = time.time()
        await self._stop_service()
        self.stats = {status.value: n for status, n in
                      (await Queue(db, self.settings.queue).stats()).counts.items()}
        await self._final_searches(backend)

    async def _serve(self, handlers: Mapping[str, BatchHandler], backend: IndexBackend, *,
                     task_status: trio.TaskStatus[QueueService] = trio.TASK_STATUS_IGNORED
                     ) -> None:
        try:
            await serve(self.settings, handlers, dsn=self.url, importer=True, backend=backend,
                        api_any_port_if_taken=self.any_port_if_taken, task_status=task_status)
        finally:
            self.served.set()
        if not self.stopping and not self.interrupted:
            # Only a signal (serve's own handler) ends the service before we do.
            self._interrupt("interrupted")

    async def _register(self, db: Database) -> None:
        registry = MailboxRegistry(db)
        try:
            await registry.remove(TENANT, MAILBOX)  # an earlier run's
        except JobNotFound:
            pass
        await registry.add(MailboxConfig(
            tenant_slug=TENANT, name=MAILBOX, host=self.imap.host, port=self.imap.port,
            tls_mode="plain", username=IMAP_USER, password_ref=f"env:{PASSWORD_ENV}",
            use_idle=True))

    def _header(self, backend: IndexBackend) -> None:
        self.say(f"nexarch-events demo: the whole service on a sample mailbox, "
                 f"{self.duration:g} s at {self.rate:g} new message(s)/s")
        self.say(f"  database     {describe_url(self.url)}")
        self.say(f"  IMAP server  {self.imap.host}:{self.imap.port} (in this process), "
                 f"{self.initial} messages to begin with")
        self.say(f"  mailbox      {TENANT}/{MAILBOX}, imported over IDLE; "
                 f"index backend: {backend.name}")
        port = self.service.api_port if self.service is not None else None
        url = status_page_url(self.settings, port=port, token=self.api_token)
        if url is not None and port is not None:
            self.say(f"  status page  {url}")

    async def _follow(self, sub: AsyncIterator[Event]) -> None:
        async for event in sub:
            self.tracker.note(event)

    async def _search_loop(self, backend: IndexBackend) -> None:
        while True:
            changed = self.tracker.changed
            for arrival in self.tracker.to_search(time.time()):
                result = await backend.search(SearchQuery(TENANT, arrival.mail.token, limit=1))
                if result.hits:
                    self.tracker.found(arrival, time.time(), result.hits[0].archive_id)
            with trio.move_on_after(POLL_INTERVAL):
                await changed.wait()

    def _deliver_one(self, *, measured: bool = True) -> None:
        mail = sample_mail(self.rng)
        arrived_at = time.time()
        uid = self.imap.add_message(mail.raw)
        self.tracker.arrived(uid, mail, arrived_at, measured=measured)

    async def _wait_first_sync(self) -> None:
        began = time.time()
        with trio.move_on_after(FIRST_SYNC_TIMEOUT) as scope:
            while self.tracker.pending():
                await self.tracker.changed.wait()
        if scope.cancelled_caught:
            _, imported, searchable = self.tracker.counts(measured_only=False)
            raise NexarchError(
                f"demo: the first sync of {TENANT}/{MAILBOX} did not finish in "
                f"{FIRST_SYNC_TIMEOUT:g} s ({imported} of {self.initial} imported, "
                f"{searchable} searchable); see the warnings above")
        self.say(f"first sync: {self.initial} messages imported and searchable after "
                 f"{time.time() - began:.1f} s; the importer now IDLEs")
        self.say(f"delivering {self.rate:g} new message(s)/s for {self.duration:g} s "
                 "(latency: arrival in the mailbox -> found by a search for its token)")

    async def _deliver(self) -> None:
        next_at = trio.current_time()
        with trio.move_on_after(self.duration):
            while True:
                await trio.sleep_until(next_at)
                self._deliver_one()
                next_at += 1 / self.rate
        self.ended_at = time.time()

    async def _drain(self) -> None:
        with trio.move_on_after(DRAIN_SECONDS):
            while self.tracker.pending():
                await self.tracker.changed.wait()

    async def _report(self) -> None:
        assert self.started_at is not None
        shown = 0
        tick = trio.current_time()
        while True:
            tick += 1.0
            await trio.sleep_until(tick)
            arrived, imported, searchable = self.tracker.counts()
            new = [a.latency_ms for a in self.tracker.found_order[shown:]
                   if a.measured and a.latency_ms is not None]
            shown = len(self.tracker.found_order)
            if len(new) <= 4:
                latest = ", ".join(f"{ms:.0f}" for ms in new) + " ms" if new else "-"
            else:
                latest = (f"p50 {percentile(new, 0.5):.0f} ms, max {max(new):.0f} ms "
                          f"({len(new)} messages)")
            self.say(f"{time.time() - self.started_at:5.0f} s  arrived {arrived:4d}  "
                     f"imported {imported:4d}  searchable {searchable:4d}   "
                     f"arrival->searchable: {latest}")

    async def _stop_service(self) -> None:
        self.stopping = True
        if self.service is None:
            return
        if not self.served.is_set():
            await self.service.shutdown()
        with trio.move_on_after(self.settings.queue.shutdown_grace + 10):
            await self.served.wait()
            return
        # Stop now: what the workers cannot record at once is left to the
        # leases' expiry (the sweeper re-queues it at the next start).
        self.service.cancel()
        with trio.move_on_after(15):
            await self.served.wait()

    async def _final_searches(self, backend: IndexBackend) -> None:
        found = self.tracker.found_order
        if not found:
            return
        last = found[-1].mail
        with trio.move_on_after(10):
            for text in (last.topic, last.token):
                self.searches.append((text, await backend.search(
                    SearchQuery(TENANT, text, limit=5))))

    # -- the end ----------------------------------------------------------

    def _summary(self) -> int:
        say = self.say
        arrived, imported, searchable = self.tracker.counts()
        say()
        if self.started_at is None:
            say("summary: interrupted before new mail began")
        else:
            ran = (self.ended_at or time.time()) - self.started_at
            say(f"summary: {'interrupted after' if self.interrupted else 'ran for'} "
                f"{ran:.1f} s of new mail")
        say(f"  messages    {arrived} arrived, {imported} imported, {searchable} searchable "
            f"(plus {self.initial} in the mailbox at start)")
        say(f"  latency     arrival -> searchable: {latency_line(self.tracker.latencies_ms())}")
        if self.stats:
            say("  index jobs  " + ", ".join(f"{k} {v}" for k, v in self.stats.items())
                + " (all tenants)")
        for text, result in self.searches:
            shown = f", top {len(result.hits)}" if len(result.hits) < result.total else ""
            say(f'search "{text}" in tenant {TENANT}: {result.total} match(es){shown}')
            for hit in result.hits:
                when = hit.sent_at.strftime("%Y-%m-%d %H:%M") if hit.sent_at else "-"
                snippet = hit.snippet.replace("<mark>", "[").replace("</mark>", "]")
                sender = hit.sender.split(" <", 1)[0]  # the name, where there is one
                say(f"  {hit.archive_id:>8}  {when}  {sender[:24]:<24}  {hit.subject[:60]}")
                say(f"  {'':>8}  {' '.join(snippet.split())[:110]}")
        missing = self.tracker.pending(measured_only=True)
        if missing and not self.interrupted:
            say(f"{len(missing)} message(s) did not become searchable within "
                f"{DRAIN_SECONDS:g} s of the last delivery")
        say(f"mailbox {TENANT}/{MAILBOX} unregistered (its server lived in this process); "
            f"the mail stays archived: {self.command} search --tenant {TENANT} "
            f"{self.searches[0][0] if self.searches else 'Angebot'}")
        return 1 if missing and not self.interrupted else 0


def run_demo(url: str, settings: Settings, *, duration: float, rate: float,
             initial: int = INITIAL_MESSAGES, out: TextIO | None = None,
             command: str = "nexarch-events", any_port_if_taken: bool = False) -> int:
    """Blocks for about ``duration`` seconds plus start-up and shutdown, or
    until SIGINT/SIGTERM (handled: the summary is printed and 0 returned).
    Returns the exit code: 0, or 1 if a delivered message never became
    searchable. Runs its own trio loop (``aio.run``); sets ``PASSWORD_ENV``
    in this process's environment; writes to ``out`` (default stdout).
    ``command`` runs this CLI (for the closing hint), as the user ran it;
    ``any_port_if_taken``: the status page takes any free port when its
    configured one is in use at the moment it binds."""
    if not duration > 0:
        raise ConfigurationError(f"demo: --duration must be a positive number of seconds, "
                                 f"got {duration!r}")
    if not 0 < rate <= 1000:
        raise ConfigurationError(f"demo: --rate must be above 0 and at most 1000 messages/s, "
                                 f"got {rate!r}")
    if not 1 <= initial <= 10_000:
        raise ConfigurationError("demo: the initial message count must be 1..10000")
    demo = Demo(url, settings, duration=duration, rate=rate, initial=initial, out=out,
                command=command, any_port_if_taken=any_port_if_taken)
    return aio_run(demo.run)
