"""The importer as operators run it: ``nexarch-events mailbox ...`` and
``nexarch-events run`` in subprocesses, against the real Dovecot."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import trio

from nexarch_events.aio import Database
from nexarch_events.importer.state import StateStore
from nexarch_events.testing import record_imports
from tests.acceptance.test_cli import cli
from tests.support.dovecot import Dovecot
from tests.support.mailgen import realistic_messages


def register(url: str, dovecot: Dovecot, folder: str, name: str = "inbox",
             *extra: str) -> subprocess.CompletedProcess[str]:
    return cli("mailbox", "add", "acme", name, "--host", dovecot.host, "--port",
               str(dovecot.port), "--tls", "starttls", "--ca-file", dovecot.ca_file,
               "--user", "alice", "--password-env", "ALICE_PASSWORD", "--folder", folder,
               *extra, url=url)


def env_for(dovecot: Dovecot, url: str) -> dict[str, str]:
    environ = {k: v for k, v in os.environ.items() if not k.startswith("NEXARCH_")}
    # Any free port for the API: a second suite running beside this one
    # holds 8080, and a ``run`` that cannot bind exits 2 before importing.
    environ.update(NEXARCH_DATABASE_URL=url, NEXARCH_API_PORT="0",
                   ALICE_PASSWORD=dovecot.users["alice"])
    return environ


def tail(log: Path) -> str:
    return log.read_text(errors="replace")[-3000:]


async def exits_early(proc: trio.Process, log: Path, watching: trio.CancelScope) -> None:
    """Fails the test at once, with the service's log, when ``run`` exits
    before the test stops it (instead of a silent wait for mail)."""
    with watching:
        code = await proc.wait()
        raise AssertionError(f"nexarch-events run exited {code} early:\n{tail(log)}")


def test_mailbox_lifecycle(database_url: str, dovecot: Dovecot, imap_folder: str) -> None:
    assert register(database_url, dovecot, imap_folder, "inbox", "--interval", "120")\
        .returncode == 0
    again = register(database_url, dovecot, imap_folder)
    assert again.returncode == 2 and "already has a mailbox named 'inbox'" in again.stderr
    for raw in realistic_messages(3, seed=5):
        dovecot.append("alice", imap_folder, raw)

    synced = cli("mailbox", "sync-now", "acme", "inbox", url=database_url,
                 env={"ALICE_PASSWORD": dovecot.users["alice"]})
    assert synced.returncode == 0, synced.stderr
    report = json.loads(synced.stdout)
    assert (report["imported"], report["last_synced_uid"], report["mode"]) == (3, 3, "first")

    assert cli("mailbox", "set-interval", "acme", "inbox", "60", url=database_url)\
        .returncode == 0
    listed = json.loads(cli("mailbox", "list", "--json", url=database_url).stdout)
    assert [(m["name"], m["interval_seconds"], m["last_synced_uid"], m["imported_total"])
            for m in listed] == [("inbox", 60, 3, 3)]
    # The password is never stored or shown: only the reference's kind.
    assert "password_ref" not in listed[0]
    assert dovecot.users["alice"] not in cli("mailbox", "list", url=database_url).stdout

    # Without the variable the run fails cleanly, naming the variable only.
    failed = cli("mailbox", "sync-now", "acme", "inbox", url=database_url)
    assert failed.returncode == 2 and "ALICE_PASSWORD is not set" in failed.stderr

    assert cli("mailbox", "disable", "acme", "inbox", url=database_url).returncode == 0
    listed = json.loads(cli("mailbox", "list", "--json", url=database_url).stdout)
    assert listed[0]["enabled"] is False
    # Paused: said so in the list (it said "ok"), and a request that no
    # importer would answer is refused (it said "sync requested").
    assert "paused" in cli("mailbox", "list", url=database_url).stdout
    refused = cli("mailbox", "sync-now", "acme", "inbox", "--request", url=database_url)
    assert refused.returncode == 1 and "is paused" in refused.stderr, refused.stderr
    assert cli("mailbox", "enable", "acme", "inbox", url=database_url).returncode == 0
    assert json.loads(cli("mailbox", "list", "--json", url=database_url).stdout)[0]["enabled"]
    assert json.loads(cli("mailbox", "failures", "acme", "inbox", "--json",
                          url=database_url).stdout) == []
    assert cli("mailbox", "disable", "acme", "nosuch", url=database_url).returncode == 1

    assert cli("mailbox", "remove", "acme", "inbox", url=database_url).returncode == 0
    assert json.loads(cli("mailbox", "list", "--json", url=database_url).stdout) == []
    assert cli("mailbox", "remove", "acme", "inbox", url=database_url).returncode == 1


def test_sealed_password_needs_the_key(database_url: str, dovecot: Dovecot,
                                       imap_folder: str, tmp_path: object) -> None:
    import pathlib

    key = cli("mailbox", "new-key", url=None).stdout.strip()
    key_file = pathlib.Path(str(tmp_path)) / "key"
    key_file.write_text(key)
    args = ("mailbox", "add", "acme", "sealed", "--host", dovecot.host, "--port",
            str(dovecot.port), "--tls", "plain", "--user", "alice", "--password-stdin",
            "--folder", imap_folder)
    environ = {k: v for k, v in os.environ.items() if not k.startswith("NEXARCH_")}
    environ["NEXARCH_DATABASE_URL"] = database_url
    no_key = subprocess.run([sys.executable, "-m", "nexarch_events", *args], env=environ,
                            input=dovecot.users["alice"] + "\n", capture_output=True, text=True,
                            timeout=60, check=False)
    assert no_key.returncode == 2 and "NEXARCH_SECRET_KEY_FILE" in no_key.stderr
    environ["NEXARCH_SECRET_KEY_FILE"] = str(key_file)
    added = subprocess.run([sys.executable, "-m", "nexarch_events", *args], env=environ,
                           input=dovecot.users["alice"] + "\n", capture_output=True, text=True,
                           timeout=60, check=False)
    assert added.returncode == 0, added.stderr
    dovecot.append("alice", imap_folder, next(realistic_messages(1, seed=9)))
    synced = cli("mailbox", "sync-now", "acme", "sealed", url=database_url,
                 env={"NEXARCH_SECRET_KEY_FILE": str(key_file)})
    assert synced.returncode == 0, synced.stderr
    assert json.loads(synced.stdout)["imported"] == 1
    # Postgres holds no clear-text password.
    stored = subprocess.run(["psql", database_url, "-Atc",
                             "SELECT password_ref FROM mail_import_mailboxes"],
                            capture_output=True, text=True, check=True).stdout
    assert stored.startswith("sealed:v1:") and dovecot.users["alice"] not in stored


async def test_sigkill_mid_sync_loses_nothing_and_doubles_nothing(
        db: Database, dovecot: Dovecot, imap_folder: str) -> None:
    """SIGKILL the importer while it imports 2,000 messages; after a restart
    every message is archived exactly once and the notifications of both runs
    form one strictly increasing UID sequence."""
    total = 2000
    raws = list(realistic_messages(total, seed=11))
    await trio.to_thread.run_sync(dovecot.append_many, "alice", imap_folder, raws)
    assert register(db.dsn, dovecot, imap_folder).returncode == 0
    command = [sys.executable, "-m", "nexarch_events", "mailbox", "sync-now", "acme", "inbox"]
    environ = env_for(dovecot, db.dsn)
    with trio.fail_after(240):
        async with record_imports(db.dsn) as rec:
            proc = await trio.lowlevel.open_process(command, env=environ,
                                                    stdout=subprocess.DEVNULL,
                                                    stderr=subprocess.DEVNULL)
            await rec.wait_for_imported(count=300, timeout=120)
            proc.send_signal(signal.SIGKILL)
            await proc.wait()
            killed_at = (await StateStore(db).get("acme", "inbox")).last_synced_uid
            assert 300 <= killed_at < total, killed_at

            finished = await trio.run_process(command, env=environ, capture_stdout=True,
                                              capture_stderr=True, check=False)
            assert finished.returncode == 0, finished.stderr.decode()[-2000:]
            await rec.wait_for_imported(count=total, timeout=60)
            await trio.sleep(0.3)  # nothing more may arrive
    uids = [e.uid for e in rec.select()]
    assert uids == sorted(set(uids)) and len(uids) == total  # one increasing sequence
    rec.assert_in_uid_order()
    assert rec.gaps == 0
    assert await db.fetchval("SELECT count(*) FROM mail_archive") == total
    assert await db.fetchval("SELECT count(*) FROM mail_archive_locations") == total
    assert await db.fetchval("SELECT count(*) FROM mail_index_jobs") == total
    assert (await StateStore(db).get("acme", "inbox")).last_synced_uid == total


async def test_run_imports_new_mail_through_idle_within_a_second(
        db: Database, dovecot: Dovecot, imap_folder: str, tmp_path: Path) -> None:
    assert register(db.dsn, dovecot, imap_folder, "inbox", "--interval", "3600").returncode == 0
    dovecot.append("alice", imap_folder, next(realistic_messages(1, seed=21)))
    environ = env_for(dovecot, db.dsn)
    log = tmp_path / "run.log"
    with trio.fail_after(120), log.open("wb") as log_file:
        async with record_imports(db.dsn) as rec, trio.open_nursery() as watch:
            proc = await trio.lowlevel.open_process(
                [sys.executable, "-m", "nexarch_events", "run"], env=environ,
                stdout=subprocess.DEVNULL, stderr=log_file)
            watching = trio.CancelScope()
            watch.start_soon(exits_early, proc, log, watching)
            try:
                await rec.wait_for_imported(count=1, timeout=60)  # the first sync
                # Wait until the importer holds IDLE (a second connection).
                for _ in range(200):
                    if await trio.to_thread.run_sync(dovecot.connection_count, "alice") >= 1:
                        break
                    await trio.sleep(0.05)
                await trio.sleep(0.5)
                latencies = []
                for i in range(3):
                    raw = next(realistic_messages(1, seed=100 + i))
                    started = trio.current_time()
                    uid = await trio.to_thread.run_sync(dovecot.append, "alice", imap_folder,
                                                        raw)
                    await rec.wait_for_imported(uid=uid, timeout=10)
                    latencies.append(trio.current_time() - started)
                # "within a second instead of an interval" (3600 s here).
                # Dovecot itself holds IDLE pushes back 500 ms; the slack on
                # the slowest of three keeps a busy CI machine from flaking.
                assert sorted(latencies)[1] < 1.0, latencies
                assert max(latencies) < 2.0, latencies
                # SIGTERM: a clean exit, no job left processing.
                watching.cancel()
                proc.send_signal(signal.SIGTERM)
                assert await proc.wait() == 0, tail(log)
            finally:
                if proc.returncode is None:
                    proc.kill()
                    await proc.wait()
    rec.assert_in_uid_order()
    assert [e.uid for e in rec.select()] == [1, 2, 3, 4]
    assert await db.fetchval(
        "SELECT count(*) FROM mail_index_jobs WHERE status = 'processing'") == 0


async def test_run_with_a_throttled_a_bye_on_idle_and_a_failing_login_mailbox(
        db: Database) -> None:
    """Three providers' behaviours inside one real ``nexarch-events run``:
    a mailbox throttled at every session's first UID FETCH imports all its
    mail; one whose server says BYE on every IDLE falls back to its interval
    and says so; one with a wrong password is on the state and 20 "sync now"
    requests do not turn into a login storm."""
    from nexarch_events.importer.mailboxes import MailboxConfig, MailboxRegistry
    from tests.integration.test_importer_traps import message, messages
    from tests.support.imap_script import Faults, open_scripted_imap

    def config(name: str, port: int, password_env: str) -> MailboxConfig:
        return MailboxConfig(tenant_slug="acme", name=name, host="127.0.0.1", port=port,
                             tls_mode="plain", username="user",
                             password_ref=f"env:{password_env}")

    environ = {k: v for k, v in os.environ.items() if not k.startswith("NEXARCH_")}
    environ.update(NEXARCH_DATABASE_URL=db.dsn, NEXARCH_API_PORT="0",
                   GOOD_PASSWORD="secret", BAD_PASSWORD="not-the-one")
    throttling = Faults(throttle_command="UID FETCH", throttle_times=1,
                        throttle_backoff_ms=300)
    async with open_scripted_imap(messages(list(range(1, 21))), faults=throttling) as slow, \
            open_scripted_imap(messages([1]), faults=Faults(bye_after_idle="close")) as bye, \
            open_scripted_imap(messages([1])) as locked, record_imports(db.dsn) as rec:
        registry = MailboxRegistry(db)
        await registry.add(config("throttled", slow.port, "GOOD_PASSWORD"),
                           interval_seconds=3600)
        await registry.add(config("bye-on-idle", bye.port, "GOOD_PASSWORD"),
                           interval_seconds=2)
        await registry.add(config("locked", locked.port, "BAD_PASSWORD"),
                           interval_seconds=3600)
        store = StateStore(db)
        proc = await trio.lowlevel.open_process(
            [sys.executable, "-m", "nexarch_events", "run"], env=environ,
            stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
        try:
            with trio.fail_after(90):
                await rec.wait_for_imported(count=21, timeout=60)
                assert slow.throttled >= 1
                while not (await store.get("acme", "locked")).last_error:
                    await trio.sleep(0.1)
                logins = locked.logins
                for _ in range(20):
                    await store.request_sync("acme", "locked")
                    await trio.sleep(0.1)
                await trio.sleep(1.0)
                assert locked.logins - logins <= 2, (logins, locked.logins)
                while not (await store.get("acme", "bye-on-idle")).idle_status:
                    await trio.sleep(0.2)
                uid = bye.add_message(message(2))
                await rec.wait_for_imported(uid=uid, timeout=10)  # at the 2 s interval
            proc.send_signal(signal.SIGTERM)
            assert await proc.wait() == 0
        finally:
            if proc.returncode is None:
                proc.kill()
                await proc.wait()
    throttled = await store.get("acme", "throttled")
    assert (throttled.last_synced_uid, throttled.imported_total, throttled.last_error) == \
        (20, 20, None)
    failing = await store.get("acme", "locked")
    assert failing.last_error is not None and "refused" in failing.last_error
    assert failing.last_synced_uid == 0
    idle = await store.get("acme", "bye-on-idle")
    assert (idle.idle_status or "").startswith("idle unavailable:")
    listed = cli("mailbox", "list", url=db.dsn).stdout
    assert "idle unavailable" in listed and "refused" in listed


async def test_failing_messages_show_in_the_list_and_can_be_retried_or_cleared(
        db: Database) -> None:
    from nexarch_events.importer.mailboxes import MailboxConfig, MailboxRegistry
    from nexarch_events.importer.sync import run_sync
    from tests.integration.test_importer_traps import messages
    from tests.support.imap_script import Faults, open_scripted_imap

    async with open_scripted_imap(messages([1, 2, 3]),
                                  faults=Faults(substitute_uids={2, 3})) as server:
        config = MailboxConfig(tenant_slug="acme", name="inbox", host="127.0.0.1",
                               port=server.port, tls_mode="plain", username="user",
                               password_ref="env:UNUSED")
        await MailboxRegistry(db).add(config)
        await run_sync(db.dsn, config, "secret")
    listed = cli("mailbox", "list", url=db.dsn)
    assert "2 message(s) failing" in listed.stdout, listed.stdout
    retried = cli("mailbox", "failures", "acme", "inbox", "--retry", "2", "--json", url=db.dsn)
    assert retried.returncode == 0, retried.stderr
    assert json.loads(retried.stdout) == {"tenant": "acme", "mailbox": "inbox", "uid": 2,
                                          "action": "retry"}  # was plain text
    cleared = cli("mailbox", "failures", "acme", "inbox", "--clear", "3", url=db.dsn)
    assert cleared.returncode == 0, cleared.stderr
    assert cli("mailbox", "failures", "acme", "inbox", "--clear", "3", url=db.dsn)\
        .returncode == 1  # no such failure any more
    rows = json.loads(cli("mailbox", "failures", "acme", "inbox", "--json", url=db.dsn).stdout)
    assert [(r["uid"], r["attempts"]) for r in rows] == [(2, 0)]
    state = await StateStore(db).get("acme", "inbox")
    assert state.sync_requested_at is not None  # --retry asks running services


def test_sync_now_records_a_password_it_cannot_read_on_the_mailbox(
        database_url: str, dovecot: Dovecot, imap_folder: str) -> None:
    """As the run process does: the failed attempt is on the mailbox state,
    where ``mailbox list`` (and /mailboxes) show it."""
    assert register(database_url, dovecot, imap_folder, "inbox").returncode == 0
    failed = cli("mailbox", "sync-now", "acme", "inbox", url=database_url)
    assert failed.returncode == 2 and "ALICE_PASSWORD is not set" in failed.stderr
    [listed] = json.loads(cli("mailbox", "list", "--json", url=database_url).stdout)
    assert "ALICE_PASSWORD is not set" in (listed["last_error"] or ""), listed
    assert listed["last_attempt_at"] is not None and listed["last_success_at"] is None


def test_registry_commands_give_up_after_the_configured_command_timeout(
        database_url: str) -> None:
    """``mailbox``/``account`` commands use NEXARCH_COMMAND_TIMEOUT like the
    rest: a table another session keeps locked fails them in about that long,
    not after asyncpg's default 60 s."""
    assert cli("migrate", url=database_url).returncode == 0
    locker = subprocess.Popen(
        ["psql", database_url, "-v", "ON_ERROR_STOP=1", "-c",
         "BEGIN; LOCK TABLE mail_import_mailboxes, mail_import_accounts "
         "IN ACCESS EXCLUSIVE MODE; SELECT pg_sleep(120);"],
        stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    try:
        probe = ["psql", database_url, "-Atc",
                 "SELECT count(*) FROM pg_locks l JOIN pg_class c ON c.oid = l.relation "
                 "WHERE c.relname = 'mail_import_mailboxes' AND l.mode = 'AccessExclusiveLock' "
                 "AND l.granted"]
        for _ in range(300):
            if subprocess.run(probe, capture_output=True, text=True, check=True)\
                    .stdout.strip() == "1":
                break
            time.sleep(0.1)
        else:
            raise AssertionError("the locking session did not take its lock")
        for args in (("mailbox", "list"), ("mailbox", "disable", "acme", "inbox"),
                     ("account", "list")):
            # Generous: well below the 60 s default, far above the 1 s set.
            done = cli(*args, url=database_url, timeout=45,
                       env={"NEXARCH_COMMAND_TIMEOUT": "1"})
            assert done.returncode == 3, (args, done.returncode, done.stderr[-500:])
            assert "database" in done.stderr, done.stderr[-500:]
    finally:
        locker.kill()
        locker.wait()
