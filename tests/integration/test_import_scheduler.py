"""The import scheduler: IDLE, re-IDLE after a BYE, the interval, "sync now",
the IDLE limit, and runs that never overlap. Against the scripted server
(tests/support/imap_script.py), which can say BYE mid-IDLE; the real-Dovecot
IDLE path is in tests/acceptance/test_importer_cli.py."""

from __future__ import annotations

from collections.abc import AsyncIterator
from contextlib import asynccontextmanager

import pytest
import trio

from nexarch_events.aio import Connection, Database
from nexarch_events.errors import ImapUnavailable
from nexarch_events.importer.mailboxes import MailboxConfig, MailboxRegistry
from nexarch_events.importer.scheduler import ImportScheduler
from nexarch_events.importer.state import StateStore
from nexarch_events.importer.sync import MailboxBusy, run_sync
from nexarch_events.queue.notify import IMPORT_REQUESTS_CHANNEL, Listener
from nexarch_events.settings import ImportSettings, QueueSettings
from nexarch_events.testing import record_imports
from tests.integration.test_importer_traps import message, messages
from tests.support.imap_script import Faults, ScriptedImapServer, open_scripted_imap

PASSWORD_ENV = "NEXARCH_TEST_SCRIPTED_PASSWORD"


@pytest.fixture(autouse=True)
def scripted_password(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv(PASSWORD_ENV, "secret")


def config(server: ScriptedImapServer, name: str = "inbox", *,
           use_idle: bool = True) -> MailboxConfig:
    return MailboxConfig(tenant_slug="acme", name=name, host=server.host, port=server.port,
                         tls_mode="plain", username="user", password_ref=f"env:{PASSWORD_ENV}",
                         use_idle=use_idle)


@asynccontextmanager
async def scheduler(db: Database, *, idle_failures: int = 1000, request_min_gap: float = 0.0,
                    **settings: float) -> AsyncIterator[ImportScheduler]:
    listener = Listener(db.dsn, QueueSettings(listener_ping_interval=0.5,
                                              listener_ping_timeout=0.5),
                        channels=(IMPORT_REQUESTS_CHANNEL,))
    sched = ImportScheduler(db, ImportSettings(**{"imap_timeout": 2, "reload_interval": 0.5,
                                                  **settings}),  # type: ignore[arg-type]
                            listener=listener, idle_failures=idle_failures,
                            request_min_gap=request_min_gap)
    async with trio.open_nursery() as nursery:
        await nursery.start(listener.run)
        await nursery.start(sched.run)
        yield sched
        nursery.cancel_scope.cancel()


async def wait_idle(sched: ImportScheduler, count: int = 1) -> None:
    with trio.fail_after(10):
        while len(sched.idle_mailboxes()) < count:
            await trio.sleep(0.02)


@pytest.mark.parametrize("bye", ["close", "hang"])
async def test_idle_push_and_reconnect_after_bye(db: Database, bye: str) -> None:
    async with open_scripted_imap(messages([1])) as server, \
            record_imports(db.dsn) as rec:
        await MailboxRegistry(db).add(config(server), interval_seconds=3600)
        async with scheduler(db, backoff_max=0.2) as sched:
            await rec.wait_for_imported(uid=1)
            await wait_idle(sched)
            started = trio.current_time()
            server.add_message(message(2))
            await rec.wait_for_imported(uid=2, timeout=5)
            assert trio.current_time() - started < 1.0  # pushed, not polled
            # The server drops IDLE with a BYE: the runner reconnects and
            # goes on (aioimaplib alone would hang forever, #110).
            connections = server.connections
            server.faults.bye_after_idle = bye  # type: ignore[assignment]
            server.add_message(message(3))
            await rec.wait_for_imported(uid=3, timeout=10)
            server.faults.bye_after_idle = None
            server.add_message(message(4))
            await rec.wait_for_imported(uid=4, timeout=15)
            assert server.connections > connections
    rec.assert_in_uid_order()
    assert [e.uid for e in rec.select()] == [1, 2, 3, 4]


@pytest.mark.parametrize(("push", "most"), [("* OK Still here", 2),
                                            ("* 1 FETCH (FLAGS (\\Seen))", 12)])
async def test_a_server_that_pushes_at_once_after_every_idle_is_not_synced_in_a_loop(
        db: Database, push: str, most: int) -> None:
    """A push right after every IDLE ended each IDLE at once, and each was a
    sync: 1,238 syncs in 10 s from one mailbox (a retry-loop audit). An
    untagged OK is a keepalive (IDLE goes on); pushes whose syncs find
    nothing are followed at a growing floor (doubling from 50 ms to the
    "sync now" floor). Mail still comes in at once."""
    async with open_scripted_imap(messages([1]), faults=Faults(idle_push=push)) as server, \
            record_imports(db.dsn) as rec:
        await MailboxRegistry(db).add(config(server), interval_seconds=3600)
        async with scheduler(db) as sched:
            await rec.wait_for_imported(uid=1)
            await wait_idle(sched)
            examines = len([c for c in server.commands if "EXAMINE" in c])
            await trio.sleep(3)
            syncs = len([c for c in server.commands if "EXAMINE" in c]) - examines
            assert syncs <= most, syncs
            server.faults.idle_push = None
            server.add_message(message(2))
            await rec.wait_for_imported(uid=2, timeout=10)


async def test_sync_requests_for_an_unscheduled_mailbox_do_not_reload_in_a_loop(
        db: Database) -> None:
    """A "sync now" for a mailbox with no runner (disabled) re-read every
    tenant's mailboxes each time: 6,699 reloads in 10 s (a retry-loop
    audit). At most one per REQUEST_RELOAD_GAP; a mailbox registered since
    the last reload is still picked up by its request."""
    from nexarch_events.importer.scheduler import REQUEST_RELOAD_GAP

    async with open_scripted_imap(messages([1])) as server, record_imports(db.dsn) as rec:
        registry = MailboxRegistry(db)
        await registry.add(config(server, "off"), interval_seconds=3600)
        await registry.set_enabled("acme", "off", False)
        async with scheduler(db) as sched:  # which reloads every 0.5 s anyway
            before = sched.reloads
            started = trio.current_time()
            for _ in range(300):
                await StateStore(db).request_sync("acme", "off")
            await trio.sleep(1.5)
            elapsed = trio.current_time() - started
            assert sched.reloads - before <= elapsed / 0.5 + elapsed / REQUEST_RELOAD_GAP + 2, \
                sched.reloads - before
            await registry.add(config(server, "new"), interval_seconds=3600)
            await StateStore(db).request_sync("acme", "new")
            await rec.wait_for_imported(uid=1, timeout=10)


async def test_interval_when_the_server_has_no_idle(db: Database) -> None:
    async with open_scripted_imap(messages([1]), faults=Faults(no_idle_capability=True)) \
            as server, record_imports(db.dsn) as rec:
        await MailboxRegistry(db).add(config(server), interval_seconds=1)
        async with scheduler(db) as sched:
            await rec.wait_for_imported(uid=1)
            server.add_message(message(2))
            with trio.fail_after(5):  # the 1 s interval (±10 %), not a push
                await rec.wait_for_imported(uid=2)
            assert sched.idle_mailboxes() == []
            idles = [c for c in server.commands if c == "IDLE"]
            assert idles == []


async def test_sync_now_wakes_an_interval_runner(db: Database) -> None:
    async with open_scripted_imap(messages([1])) as server, record_imports(db.dsn) as rec:
        await MailboxRegistry(db).add(config(server, use_idle=False), interval_seconds=3600)
        async with scheduler(db):
            await rec.wait_for_imported(uid=1)
            server.add_message(message(2))
            await trio.sleep(0.3)
            assert len(rec.select()) == 1  # the interval is an hour
            await StateStore(db).request_sync("acme", "inbox")
            await rec.wait_for_imported(uid=2, timeout=5)


async def test_idle_limit_leaves_the_rest_on_their_interval(db: Database) -> None:
    async with open_scripted_imap(messages([1])) as one, \
            open_scripted_imap(messages([1])) as two, record_imports(db.dsn) as rec:
        await MailboxRegistry(db).add(config(one, "one"), interval_seconds=3600)
        await MailboxRegistry(db).add(config(two, "two"), interval_seconds=3600)
        async with scheduler(db, idle_limit=1) as sched:
            await rec.wait_for_imported(count=2)
            await wait_idle(sched)
            await trio.sleep(0.3)
            assert len(sched.idle_mailboxes()) == 1
            assert sched.mailboxes == [("acme", "one"), ("acme", "two")]


async def test_one_login_never_holds_more_sessions_than_its_limit(db: Database) -> None:
    """One connection per folder in IDLE: an account of 14 folders used up
    Dovecot's 10 per user and address (Gmail allows 15), the other folders
    failed with "[LIMIT]" for as long as the service ran, and so did the
    user's own mail client (an accounts audit). Here 8 mailboxes of one
    login, at most 3 sessions: 2 of them in IDLE, every one imported."""
    async with open_scripted_imap(messages([1, 2, 3])) as server, \
            record_imports(db.dsn) as rec:
        for n in range(8):
            await MailboxRegistry(db).add(config(server, f"box{n}"), interval_seconds=3600)
        async with scheduler(db, sessions_per_login=3) as sched:
            await rec.wait_for_imported(count=24)
            await wait_idle(sched, 2)
            await trio.sleep(0.5)
            assert len(sched.idle_mailboxes()) == 2
            assert server.most_open <= 3, server.most_open


async def test_a_run_waits_for_the_mailbox_lock(db: Database) -> None:
    async with open_scripted_imap(messages(list(range(1, 41)))) as server:
        cfg = config(server)
        holder = await Connection.open(db.dsn)
        try:
            assert await StateStore(holder).try_run_lock("acme", "inbox")
            with pytest.raises(MailboxBusy):
                await run_sync(db.dsn, cfg, "secret", lock_wait=0.3)
        finally:
            await holder.aclose()  # a dead holder's lock goes with its connection
        # Two runs at once: they take turns; every message once, in order.
        async with record_imports(db.dsn) as rec:
            async with trio.open_nursery() as nursery:
                for _ in range(2):
                    nursery.start_soon(lambda: run_sync(db.dsn, cfg, "secret",
                                                        lock_wait=10, imap_timeout=5))
            await rec.wait_for_imported(count=40)
            await trio.sleep(0.2)
    assert [e.uid for e in rec.select()] == list(range(1, 41))
    assert await db.fetchval("SELECT count(*) FROM mail_archive") == 40



async def test_pooled_runs_never_leave_the_lock_behind(db: Database) -> None:
    """The scheduler borrows pool connections for its runs: neither a clean
    run, a failed one nor a cancelled one may return a connection that still
    holds the mailbox's lock (the next run would wait forever)."""
    async def advisory_locks() -> int:
        # pg_locks is server-wide: count this test's database only (other
        # tests and services on a shared server hold advisory locks too).
        count: int = await db.fetchval(
            "SELECT count(*) FROM pg_locks WHERE locktype = 'advisory' AND granted"
            " AND database = (SELECT oid FROM pg_database WHERE datname = current_database())")
        return count

    async with open_scripted_imap(messages([1, 2])) as server:
        cfg = config(server)
        await run_sync(db, cfg, "secret")
        assert await advisory_locks() == 0
        server.faults.silent_after = "UID SEARCH"
        with trio.move_on_after(0.5) as cancelled:  # cancelled mid-run
            await run_sync(db, cfg, "secret", imap_timeout=30)
        assert cancelled.cancelled_caught
        with trio.move_on_after(0.5):  # again: the lock must be free
            await run_sync(db, cfg, "secret", imap_timeout=30)
        with pytest.raises(ImapUnavailable):  # a failed run
            await run_sync(db, cfg, "secret", imap_timeout=0.3)
        assert await advisory_locks() == 0
        server.faults.silent_after = None
        server.add_message(message(3))
        with trio.fail_after(5):
            report = await run_sync(db, cfg, "secret", lock_wait=1)
    assert report.last_synced_uid == 3


async def test_idle_is_reissued_on_schedule(db: Database) -> None:
    """Servers drop IDLE after some minutes: the runner ends IDLE (DONE)
    every idle_refresh seconds, runs a delta sync and IDLEs again."""
    async with open_scripted_imap(messages([1])) as server, record_imports(db.dsn) as rec:
        await MailboxRegistry(db).add(config(server), interval_seconds=3600)
        async with scheduler(db, idle_refresh=0.3) as sched:
            await rec.wait_for_imported(uid=1)
            await wait_idle(sched)
            with trio.fail_after(10):
                while server.commands.count("DONE") < 3:
                    await trio.sleep(0.05)
            # Each refresh re-examined the mailbox (a delta sync) on the
            # same connection, and IDLE was issued again after it.
            assert server.commands.count("IDLE") >= 3
            assert server.connections == 1


async def test_a_paused_mailbox_stops_and_resumes(db: Database) -> None:
    async with open_scripted_imap(messages([1])) as server, record_imports(db.dsn) as rec:
        registry = MailboxRegistry(db)
        await registry.add(config(server), interval_seconds=3600)
        async with scheduler(db) as sched:  # re-reads registrations every 0.5 s
            await rec.wait_for_imported(uid=1)
            await registry.set_enabled("acme", "inbox", False)
            with trio.fail_after(5):
                while sched.mailboxes:
                    await trio.sleep(0.05)
            server.add_message(message(2))
            await trio.sleep(1.0)
            assert [e.uid for e in rec.select()] == [1]  # paused: nothing imported
            await registry.set_enabled("acme", "inbox", True)
            await rec.wait_for_imported(uid=2, timeout=5)


async def test_a_removed_mailbox_is_not_imported_again_by_its_running_idle_runner(
        db: Database) -> None:
    """After `mailbox remove` (or an erasure that unregisters it), the
    mailbox's IDLE runner lived until the next reload; the next push made
    it create the sync state again and import the whole mailbox from UID 1,
    erased mail included (a race audit)."""
    async with open_scripted_imap(messages([1])) as server, record_imports(db.dsn) as rec:
        registry = MailboxRegistry(db)
        await registry.add(config(server), interval_seconds=3600)
        async with scheduler(db, reload_interval=3600) as sched:
            await rec.wait_for_imported(uid=1)
            await wait_idle(sched)
            await registry.remove("acme", "inbox")
            server.add_message(message(2))
            with trio.fail_after(10):  # the push wakes the runner, which stops
                while sched.idle_mailboxes():
                    await trio.sleep(0.05)
            await trio.sleep(1.0)
    assert [e.uid for e in rec.select()] == [1]
    assert await db.fetchval("SELECT count(*) FROM mail_import_state") == 0
    assert await db.fetchval("SELECT count(*) FROM mail_archive") == 1


async def test_a_state_asked_for_while_its_mailbox_is_removed_is_not_made_again(
        db: Database) -> None:
    """A runner's get-or-create of its state, racing `mailbox remove`: its
    snapshot still saw the registration, its insert waited for the removal
    to delete the state row, then made it again (CI under stress-ng: a
    removed mailbox with a state row). It waits for the removal now, and
    makes nothing."""
    from nexarch_events.db import sqlfiles
    from nexarch_events.importer.state import MailboxRemoved, SyncState

    async with open_scripted_imap(messages([1])) as server:
        await MailboxRegistry(db).add(config(server), interval_seconds=3600)
    registered = await MailboxRegistry(db).get("acme", "inbox")
    remover = await Connection.open(db.dsn)
    outcome: list[SyncState | MailboxRemoved] = []
    try:
        await remover.execute("BEGIN")
        assert await remover.fetchrow(sqlfiles.queries("importer.sql")["mailbox_remove"],
                                      "acme", "inbox") is not None

        async def ask() -> None:
            try:
                outcome.append(await StateStore(db).get_or_create("acme", "inbox",
                                                                  registered.id))
            except MailboxRemoved as exc:
                outcome.append(exc)

        async with trio.open_nursery() as nursery:
            nursery.start_soon(ask)
            await trio.sleep(0.5)  # the ask waits for the removal
            await remover.execute("COMMIT")
    finally:
        await remover.aclose()
    # What its snapshot saw, or that the mailbox is gone; never a new row.
    assert len(outcome) == 1, outcome
    assert await db.fetchval("SELECT count(*) FROM mail_import_state") == 0


# -- issue 10 -----------------------------------------------------------------


async def test_sync_requests_never_bypass_the_backoff_of_a_failing_mailbox(
        db: Database) -> None:
    """A wrong password plus 20 "sync now" within seconds: a handful of
    logins, not one per request (nor one every few milliseconds)."""
    async with open_scripted_imap(messages([1]), password="not-the-one") as server:
        await MailboxRegistry(db).add(config(server), interval_seconds=3600)
        async with scheduler(db):
            with trio.fail_after(10):
                while server.logins < 1:
                    await trio.sleep(0.02)
            for _ in range(20):
                await StateStore(db).request_sync("acme", "inbox")
                await trio.sleep(0.15)
            logins = server.logins
            assert 1 <= logins <= 4, logins
            # Every attempt answers the requests made before it.
            with trio.fail_after(20):
                while (await StateStore(db).get("acme", "inbox")).sync_requested_at:
                    await trio.sleep(0.1)
    st = await StateStore(db).get("acme", "inbox")
    assert st.last_error is not None and "refused" in st.last_error
    assert st.last_attempt_at is not None


async def test_a_password_that_cannot_be_resolved_is_on_the_state(db: Database) -> None:
    async with open_scripted_imap(messages([1])) as server:
        cfg = config(server)
        from dataclasses import replace
        await MailboxRegistry(db).add(replace(cfg, password_ref="env:NEXARCH_TEST_NO_SUCH_VAR"),
                                      interval_seconds=3600)
        async with scheduler(db):
            await StateStore(db).request_sync("acme", "inbox")
            with trio.fail_after(10):
                while not (await StateStore(db).get("acme", "inbox")).last_error:
                    await trio.sleep(0.05)
            for _ in range(10):
                await StateStore(db).request_sync("acme", "inbox")
            await trio.sleep(1.0)
        assert server.connections == 0
    st = await StateStore(db).get("acme", "inbox")
    assert "NEXARCH_TEST_NO_SUCH_VAR" in (st.last_error or "")


async def test_mail_delivered_during_the_sync_of_an_idle_runner_comes_at_once(
        db: Database) -> None:
    """The server announces it inside a FETCH reply, not again in IDLE."""
    async with open_scripted_imap(messages([1, 2])) as server, record_imports(db.dsn) as rec:
        delivered: list[int] = []

        def deliver(line: str) -> None:
            if line.startswith("UID FETCH") and "BODY" in line and not delivered:
                delivered.append(server.add_message(message(3)))

        server.faults.on_command = deliver
        await MailboxRegistry(db).add(config(server), interval_seconds=3600)
        async with scheduler(db) as sched:
            await wait_idle(sched)
            await rec.wait_for_imported(uid=3, timeout=2)
    assert [e.uid for e in rec.select()] == [1, 2, 3]


async def test_idle_that_keeps_failing_falls_back_to_the_interval_visibly(
        db: Database) -> None:
    """BYE on every IDLE: after a few tries the runner syncs at the
    interval, and the state says why. The backoff resets after each
    successful sync, so the tries come every ~2 s, not 2, 4, 8, ..."""
    async with open_scripted_imap(messages([1]), faults=Faults(bye_after_idle="close")) \
            as server, record_imports(db.dsn) as rec:
        await MailboxRegistry(db).add(config(server), interval_seconds=1)
        async with scheduler(db, idle_failures=3) as sched:
            with trio.fail_after(20):
                while not (await StateStore(db).get("acme", "inbox")).idle_status:
                    await trio.sleep(0.1)
            status = (await StateStore(db).get("acme", "inbox")).idle_status or ""
            assert status.startswith("idle unavailable:") and "BYE" in status
            idles = server.commands.count("IDLE")
            server.add_message(message(2))
            await rec.wait_for_imported(uid=2, timeout=5)  # the 1 s interval
            await trio.sleep(1.5)
            assert server.commands.count("IDLE") == idles  # not tried again for now
            assert sched.idle_mailboxes() == []


async def test_a_burst_of_sync_requests_on_a_healthy_idle_mailbox_is_one_or_two_runs(
        db: Database) -> None:
    """Each request would drop IDLE and log in again; requests within
    request_min_gap of the last run wait for it instead."""
    async with open_scripted_imap(messages([1])) as server, record_imports(db.dsn) as rec:
        await MailboxRegistry(db).add(config(server), interval_seconds=3600)
        async with scheduler(db, request_min_gap=2.0) as sched:
            await rec.wait_for_imported(uid=1)
            await wait_idle(sched)
            logins = server.logins
            server.add_message(message(2))  # pushed through IDLE: a run
            await rec.wait_for_imported(uid=2, timeout=5)
            for _ in range(20):
                await StateStore(db).request_sync("acme", "inbox")
                await trio.sleep(0.05)
            server.add_message(message(3))
            await rec.wait_for_imported(uid=3, timeout=10)
            await trio.sleep(0.5)
            assert server.logins - logins <= 2, server.logins - logins


async def runs_holding_the_lock(db: Database) -> int:
    held: int = await db.fetchval(
        "SELECT count(*) FROM pg_locks WHERE locktype = 'advisory' AND granted "
        "AND classid = 1312902721::oid")  # importer/state.py's run lock
    return held


async def test_runs_at_once_are_bounded_by_max_runs(db: Database) -> None:
    """Each run holds a pool connection for its whole length: five first
    syncs at once with max_runs 2 run two at a time (the run locks in
    pg_locks say how many run), and all five complete."""
    async with open_scripted_imap(messages(list(range(1, 301)))) as server, \
            record_imports(db.dsn) as rec:
        for n in range(5):
            await MailboxRegistry(db).add(config(server, f"box{n}", use_idle=False),
                                          interval_seconds=3600)
        most = 0
        async with scheduler(db, max_runs=2):
            with trio.fail_after(60):
                while len(rec.select()) < 5 * 300:
                    most = max(most, await runs_holding_the_lock(db))
                    await trio.sleep(0.005)
    assert most == 2
    assert {e.mailbox for e in rec.select()} == {f"box{n}" for n in range(5)}


async def test_the_lag_metric_leaves_out_paused_mailboxes_and_gone_folders(
        db: Database) -> None:
    """nexarch_import_lag_seconds read every state row: a paused mailbox
    and a folder gone from its account looked more behind every second,
    for ever (an accounts audit). A mailbox synced without registration
    (an embedder's) is still reported."""
    from nexarch_events.db import sqlfiles

    async with open_scripted_imap(messages([1])) as server:
        registry = MailboxRegistry(db)
        for name in ("live", "paused", "gone"):
            await registry.add(config(server, name), interval_seconds=3600)
    await registry.set_enabled("acme", "paused", False)
    await db.execute("UPDATE mail_import_mailboxes SET folder_gone_at = now() "
                     "WHERE name = 'gone'")
    await db.execute("INSERT INTO mail_import_state (tenant_slug, mailbox_name) "
                     "VALUES ('acme', 'embedded')")
    rows = await db.fetch(sqlfiles.queries("importer.sql")["lag"])
    assert [r["mailbox_name"] for r in rows] == ["embedded", "live"]
