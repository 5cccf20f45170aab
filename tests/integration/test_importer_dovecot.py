"""The IMAP importer against a real Dovecot (tests/support/dovecot.py): first
and delta imports, dedup across folders, a UIDVALIDITY change, TLS (implicit
and STARTTLS, trusted and not), a refused login, concurrent mailboxes while
mail keeps arriving, and a 20,000-message mailbox in flat memory.

What the scripted server (test_importer_traps.py) cannot show: that the
importer's commands work on a real server, that it never sets \\Seen there,
and that its memory does not grow with the mailbox.
"""

from __future__ import annotations

import json
import re
import time
import tracemalloc
import uuid
from collections.abc import AsyncIterator, Callable, Iterator
from contextlib import asynccontextmanager

import pytest
import trio

from nexarch_events.aio import Database
from nexarch_events.errors import ImapAuthError, ImapTlsError
from nexarch_events.importer.mailboxes import MailboxConfig
from nexarch_events.importer.state import StateStore, SyncState
from nexarch_events.importer.sync import SyncReport, run_sync
from nexarch_events.queue.notify import MAIL_IMPORTED_CHANNEL
from nexarch_events.testing import ImportRecorder, record_imports
from tests.support.dovecot import Dovecot
from tests.support.mailgen import realistic_messages

TENANT = "acme"
USER = "alice"
_LINE_END = re.compile(rb"\r\n|\r|\n")


def crlf(raw: bytes) -> bytes:
    """A message as IMAP carries it (and the server hands it back): CRLF line ends."""
    return _LINE_END.sub(b"\r\n", raw)


# ---------------------------------------------------------------- helpers


def config_for(dovecot: Dovecot, name: str, folder: str, *, port: int | None = None,
               tls_mode: str = "plain", ca_file: str | None = None) -> MailboxConfig:
    return MailboxConfig(tenant_slug=TENANT, name=name, host=dovecot.host,
                         port=dovecot.port if port is None else port, tls_mode=tls_mode,
                         username=USER, password_ref="env:UNUSED", folder=folder,
                         ca_file=ca_file)


async def sync(db: Database, dovecot: Dovecot, config: MailboxConfig, *,
               password: str | None = None, **kwargs: object) -> SyncReport:
    secret = dovecot.users[USER] if password is None else password
    return await run_sync(db.dsn, config, secret, imap_timeout=10, **kwargs)  # type: ignore[arg-type]


async def state(db: Database, name: str) -> SyncState:
    return await StateStore(db).get(TENANT, name)


async def archive_count(db: Database) -> int:
    count: int = await db.fetchval(
        "SELECT count(*) FROM mail_archive WHERE tenant_slug = $1", TENANT)
    return count


async def locations(db: Database, name: str) -> list[tuple[int, int]]:
    return [(r["uidvalidity"], r["uid"]) for r in await db.fetch(
        "SELECT uidvalidity, uid FROM mail_archive_locations "
        "WHERE tenant_slug = $1 AND mailbox = $2 ORDER BY uidvalidity, uid", TENANT, name)]


async def archive_ids(db: Database, name: str, uidvalidity: int) -> dict[int, int]:
    """UID -> archive id of one mailbox's locations under one UIDVALIDITY."""
    return {r["uid"]: r["archive_id"] for r in await db.fetch(
        "SELECT uid, archive_id FROM mail_archive_locations "
        "WHERE tenant_slug = $1 AND mailbox = $2 AND uidvalidity = $3",
        TENANT, name, uidvalidity)}


async def settle(db: Database, rec: ImportRecorder) -> None:
    """Wait until the recorder has every notification committed so far.

    Postgres delivers notifications in commit order, whoever sent them: a
    marker sent now arrives after everything committed before (so "no event
    arrived" is asserted without sleeping and hoping)."""
    marker = f"marker-{uuid.uuid4().hex[:8]}"
    await db.execute("SELECT pg_notify($1, $2)", MAIL_IMPORTED_CHANNEL,
                     json.dumps({"v": 1, "event": "marker", "tenant": TENANT,
                                 "mailbox": marker}))
    await rec.wait_for(event="marker", mailbox=marker, timeout=10)


@pytest.fixture
def make_folder(dovecot: Dovecot) -> Iterator[Callable[[], str]]:
    """More fresh folders of alice's (deleted after the test)."""
    made: list[str] = []

    def make() -> str:
        name = f"t{uuid.uuid4().hex[:10]}"
        dovecot.create_mailbox(USER, name)
        made.append(name)
        return name

    yield make
    for name in made:
        dovecot.delete_mailbox(USER, name)


@asynccontextmanager
async def recording(db: Database) -> AsyncIterator[ImportRecorder]:
    async with record_imports(db.dsn, tenant=TENANT) as rec:
        yield rec
        await settle(db, rec)


# ---------------------------------------------------------------- tests


async def test_first_import_then_delta_never_sets_seen(
        db: Database, dovecot: Dovecot, imap_folder: str) -> None:
    first = list(realistic_messages(5, seed=11))
    later = list(realistic_messages(3, seed=11, start=5))
    config = config_for(dovecot, "inbox", imap_folder)
    with trio.fail_after(60):
        assert dovecot.append_many(USER, imap_folder, first) == [1, 2, 3, 4, 5]
        uidvalidity = dovecot.uidvalidity(USER, imap_folder)
        async with recording(db) as rec:
            report = await sync(db, dovecot, config)
            await settle(db, rec)
            assert (report.mode, report.imported, report.duplicates) == ("first", 5, 0)
            assert [e.uid for e in rec.select()] == [1, 2, 3, 4, 5]
            assert all(e.uidvalidity == uidvalidity and not e.duplicate and e.mailbox == "inbox"
                       for e in rec.select())
            assert await archive_count(db) == 5
            assert await locations(db, "inbox") == [(uidvalidity, u) for u in range(1, 6)]
            st = await state(db, "inbox")
            assert (st.last_uidvalidity, st.last_synced_uid) == (uidvalidity, 5)
            assert st.last_error is None and st.warning is None
            # The archive holds exactly the bytes the server has.
            stored = {bytes(r["raw"]) for r in await db.fetch(
                "SELECT raw FROM mail_archive WHERE tenant_slug = $1", TENANT)}
            assert stored == {crlf(raw) for raw in first}

            assert dovecot.append_many(USER, imap_folder, later) == [6, 7, 8]
            report = await sync(db, dovecot, config)
            await settle(db, rec)
            assert (report.mode, report.imported) == ("delta", 3)
            assert [e.uid for e in rec.select()] == [1, 2, 3, 4, 5, 6, 7, 8]

            report = await sync(db, dovecot, config)  # nothing new: nothing happens
            await settle(db, rec)
            assert (report.mode, report.imported) == ("delta", 0)
            assert [e.uid for e in rec.select()] == [1, 2, 3, 4, 5, 6, 7, 8]
            assert [e.event for e in rec.events if e.event != "marker"] == ["imported"] * 8
        rec.assert_in_uid_order()
        assert rec.gaps == 0
        assert await archive_count(db) == 8
        assert await locations(db, "inbox") == [(uidvalidity, u) for u in range(1, 9)]
        st = await state(db, "inbox")
        assert (st.last_synced_uid, st.imported_total) == (8, 8)
        assert await db.fetchval("SELECT count(*) FROM mail_index_jobs") == 8
        # EXAMINE + BODY.PEEK[]: three runs later, no message is \Seen.
        flags = dovecot.flags(USER, imap_folder)
        assert sorted(flags) == list(range(1, 9))
        assert not any("\\Seen" in f for f in flags.values()), flags


async def test_same_bytes_in_two_folders_are_archived_once(
        db: Database, dovecot: Dovecot, imap_folder: str,
        make_folder: Callable[[], str]) -> None:
    raws = list(realistic_messages(4, seed=22))
    other = make_folder()
    with trio.fail_after(60):
        dovecot.append_many(USER, imap_folder, raws)
        dovecot.append_many(USER, other, raws[::-1])  # other order, other UIDs
        uv_a = dovecot.uidvalidity(USER, imap_folder)
        uv_b = dovecot.uidvalidity(USER, other)
        async with recording(db) as rec:
            await sync(db, dovecot, config_for(dovecot, "inbox-a", imap_folder))
            await sync(db, dovecot, config_for(dovecot, "inbox-b", other))
        a, b = rec.select(mailbox="inbox-a"), rec.select(mailbox="inbox-b")
        assert [(e.uid, e.duplicate) for e in a] == [(u, False) for u in (1, 2, 3, 4)]
        assert [(e.uid, e.duplicate) for e in b] == [(u, True) for u in (1, 2, 3, 4)]
        rec.assert_in_uid_order()
    assert await archive_count(db) == 4
    assert await db.fetchval("SELECT count(*) FROM mail_index_jobs") == 4
    in_a = await archive_ids(db, "inbox-a", uv_a)
    in_b = await archive_ids(db, "inbox-b", uv_b)
    assert sorted(in_a) == sorted(in_b) == [1, 2, 3, 4]
    # Message i of folder a is message 5-i of folder b: one row, two locations.
    assert all(in_a[uid] == in_b[5 - uid] for uid in (1, 2, 3, 4))
    assert len(set(in_a.values())) == 4
    # The events name the same archive rows the locations do.
    assert {e.uid: e.archive_id for e in b} == in_b
    assert (await state(db, "inbox-b")).last_synced_uid == 4


async def test_uidvalidity_change_resyncs_without_duplicates(
        db: Database, dovecot: Dovecot, imap_folder: str) -> None:
    raws = list(realistic_messages(3, seed=33))
    extra = next(realistic_messages(1, seed=33, start=3))
    config = config_for(dovecot, "inbox", imap_folder)
    with trio.fail_after(60):
        dovecot.append_many(USER, imap_folder, raws)
        old = dovecot.uidvalidity(USER, imap_folder)
        await sync(db, dovecot, config)
        assert await locations(db, "inbox") == [(old, 1), (old, 2), (old, 3)]
        before = await archive_ids(db, "inbox", old)

        new = dovecot.recreate_mailbox(USER, imap_folder, [*raws, extra])
        assert new != old
        async with recording(db) as rec:
            report = await sync(db, dovecot, config)
        assert report.mode == "resync"
    assert await archive_count(db) == 4  # the three again, plus one new
    assert await locations(db, "inbox") == [(old, 1), (old, 2), (old, 3),
                                            (new, 1), (new, 2), (new, 3), (new, 4)]
    after = await archive_ids(db, "inbox", new)
    assert all(after[uid] == before[uid] for uid in (1, 2, 3))
    resync = rec.select(event="resync")
    assert len(resync) == 1
    assert resync[0].payload["old_uidvalidity"] == old
    assert resync[0].payload["uidvalidity"] == new
    assert resync[0].payload["unstable"] is False
    imported = rec.select()
    assert [(e.uid, e.uidvalidity, e.duplicate) for e in imported] == [
        (1, new, True), (2, new, True), (3, new, True), (4, new, False)]
    assert rec.events.index(resync[0]) < rec.events.index(imported[0])
    rec.assert_in_uid_order()
    st = await state(db, "inbox")
    assert (st.last_uidvalidity, st.last_synced_uid) == (new, 4)
    assert st.last_error is None


async def test_implicit_tls_and_starttls_verify_the_certificate(
        db: Database, dovecot: Dovecot, imap_folder: str) -> None:
    raws = list(realistic_messages(2, seed=44))
    implicit = config_for(dovecot, "tls-implicit", imap_folder, port=dovecot.tls_port,
                          tls_mode="implicit", ca_file=str(dovecot.ca_file))
    untrusted = config_for(dovecot, "tls-untrusted", imap_folder, port=dovecot.tls_port,
                           tls_mode="implicit")
    starttls = config_for(dovecot, "tls-starttls", imap_folder, tls_mode="starttls",
                          ca_file=str(dovecot.ca_file))
    with trio.fail_after(60):
        dovecot.append_many(USER, imap_folder, raws)

        report = await sync(db, dovecot, implicit)
        assert report.imported == 2
        st = await state(db, "tls-implicit")
        assert (st.last_synced_uid, st.last_error) == (2, None)

        # The throwaway CA is in no system trust store: refused, and said so.
        with pytest.raises(ImapTlsError, match="certificate not trusted"):
            await sync(db, dovecot, untrusted)
        st = await state(db, "tls-untrusted")
        assert st.last_error is not None and "certificate not trusted" in st.last_error
        assert st.last_synced_uid == 0 and st.last_success_at is None
        assert await locations(db, "tls-untrusted") == []

        report = await sync(db, dovecot, starttls)
        assert report.imported == 2 and report.duplicates == 2
        st = await state(db, "tls-starttls")
        assert (st.last_synced_uid, st.last_error) == (2, None)
    assert await archive_count(db) == 2


async def test_wrong_password_is_an_auth_error_on_the_state(
        db: Database, dovecot: Dovecot, imap_folder: str) -> None:
    wrong = "not-alice-" + uuid.uuid4().hex
    config = config_for(dovecot, "inbox", imap_folder)
    with trio.fail_after(30):
        dovecot.append(USER, imap_folder, next(realistic_messages(1, seed=55)))
        with pytest.raises(ImapAuthError) as caught:
            await sync(db, dovecot, config, password=wrong)
        assert wrong not in str(caught.value)
        st = await state(db, "inbox")
        assert st.last_error is not None and "refused" in st.last_error
        assert wrong not in st.last_error
        assert st.last_success_at is None and st.last_synced_uid == 0
        assert await archive_count(db) == 0

        # The right password afterwards: imported, and the error is cleared.
        await sync(db, dovecot, config)
        st = await state(db, "inbox")
        assert (st.last_synced_uid, st.last_error) == (1, None)


async def test_concurrent_mailboxes_while_mail_arrives(
        db: Database, dovecot: Dovecot, imap_folder: str,
        make_folder: Callable[[], str]) -> None:
    folders = {"inbox-a": imap_folder, "inbox-b": make_folder(), "inbox-c": make_folder()}
    configs = [config_for(dovecot, name, folder) for name, folder in folders.items()]
    rounds, per_round = 3, 20
    next_number = 0

    def append_round(start: int) -> None:
        for i, folder in enumerate(folders.values()):
            dovecot.append_many(USER, folder, realistic_messages(
                per_round, seed=66, start=start + i * per_round))

    async def sync_all() -> None:
        async with trio.open_nursery() as nursery:
            for config in configs:
                nursery.start_soon(sync, db, dovecot, config)

    with trio.fail_after(180):
        async with recording(db) as rec:
            for _ in range(rounds):
                # Mail arrives (from a thread) while all three mailboxes sync.
                async with trio.open_nursery() as nursery:
                    nursery.start_soon(trio.to_thread.run_sync, append_round, next_number)
                    nursery.start_soon(sync_all)
                next_number += per_round * len(folders)
            await sync_all()  # whatever arrived after the last round's runs
    rec.assert_in_uid_order()
    assert rec.gaps == 0
    total = 0
    for name, folder in folders.items():
        uids = await trio.to_thread.run_sync(dovecot.uids, USER, folder)
        uidvalidity = await trio.to_thread.run_sync(dovecot.uidvalidity, USER, folder)
        assert len(uids) == rounds * per_round
        events = rec.select(mailbox=name)
        assert [e.uid for e in events] == uids, name  # each exactly once, ascending
        assert not any(e.duplicate for e in events)
        assert await locations(db, name) == [(uidvalidity, u) for u in uids]
        st = await state(db, name)
        assert (st.last_synced_uid, st.imported_total, st.last_error) == (uids[-1], len(uids),
                                                                          None)
        total += len(uids)
    assert {e.event for e in rec.events} == {"imported", "marker"}
    assert await archive_count(db) == total
    assert await db.fetchval(
        "SELECT count(DISTINCT sha256) FROM mail_archive WHERE tenant_slug = $1",
        TENANT) == total
    assert await db.fetchval("SELECT count(*) FROM mail_index_jobs") == total


LARGE_COUNT = 20_000
# The mailbox is about 62 MiB; the importer holds at most one batch (by
# count and bytes) at a time and peaks near 17 MiB here (traced). Half the
# mailbox's size would mean it is being gathered, not streamed.
LARGE_PEAK_LIMIT = 32 * 1024 * 1024


def small_message(n: int) -> bytes:
    """A unique plain message of 2-5 KB."""
    head = (f"From: Sender {n % 97} <sender{n % 97}@example.org>\r\n"
            f"To: alice@example.org\r\n"
            f"Subject: bulk message {n}\r\n"
            f"Message-ID: <bulk{n}@nexarch.example>\r\n"
            f"Date: Mon, 01 Jan 2024 00:00:00 +0000\r\n"
            f"Content-Type: text/plain; charset=us-ascii\r\n\r\n")
    line = f"line of bulk message {n}: the quick brown fox jumps over the lazy dog\r\n"
    lines = 25 + (n * 7919) % 35  # 25..59 lines: about 2-5 KB
    return (head + line * lines).encode("ascii")


@pytest.mark.slow
# Its own bounds (120 s to fill the folder, 900 s to import) are what it
# allows; pytest's 300 s default cut it short on a loaded machine.
@pytest.mark.timeout(1100)
async def test_large_mailbox_in_flat_memory(
        db: Database, dovecot: Dovecot, imap_folder: str) -> None:
    total_bytes = sum(len(small_message(n)) for n in range(LARGE_COUNT))
    with trio.fail_after(120):
        uids = await trio.to_thread.run_sync(
            dovecot.append_many, USER, imap_folder, (small_message(n) for n in range(LARGE_COUNT)))
    assert len(uids) == LARGE_COUNT
    config = config_for(dovecot, "large", imap_folder)
    with trio.fail_after(900):
        tracemalloc.start()
        try:
            started = time.monotonic()
            report = await sync(db, dovecot, config)
            elapsed = time.monotonic() - started
            _, peak = tracemalloc.get_traced_memory()
        finally:
            tracemalloc.stop()
    print(f"\n{LARGE_COUNT} messages ({total_bytes / 2**20:.1f} MiB) in {elapsed:.1f} s: "
          f"{LARGE_COUNT / elapsed:.0f} messages/s; traced peak {peak / 2**20:.1f} MiB")
    assert (report.mode, report.imported, report.failed) == ("first", LARGE_COUNT, 0)
    assert await archive_count(db) == LARGE_COUNT
    row = await db.fetchrow(
        "SELECT count(*) AS n, count(DISTINCT uid) AS uids, count(DISTINCT archive_id) AS ids, "
        "min(uid) AS first, max(uid) AS last FROM mail_archive_locations "
        "WHERE tenant_slug = $1 AND mailbox = 'large'", TENANT)
    assert row is not None
    assert (row["n"], row["uids"], row["ids"]) == (LARGE_COUNT,) * 3
    assert (row["first"], row["last"]) == (uids[0], uids[-1])
    assert await db.fetchval(
        "SELECT sum(size_bytes) FROM mail_archive WHERE tenant_slug = $1", TENANT) == total_bytes
    st = await state(db, "large")
    assert (st.last_synced_uid, st.imported_total, st.last_error) == (max(uids), LARGE_COUNT,
                                                                      None)
    assert peak < LARGE_PEAK_LIMIT, (
        f"traced memory peaked at {peak / 2**20:.1f} MiB while importing "
        f"{total_bytes / 2**20:.1f} MiB: the mailbox is being held in memory")
