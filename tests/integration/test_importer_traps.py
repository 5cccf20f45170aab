"""The traps real IMAP servers set, each against the scripted server
(tests/support/imap_script.py), which produces what Dovecot will not. Each
test fails without the handling it names (see nexarch_events/importer/sync.py).
"""

from __future__ import annotations

import pytest
import trio

from nexarch_events.aio import Database
from nexarch_events.errors import ImapUnavailable
from nexarch_events.importer.mailboxes import MailboxConfig
from nexarch_events.importer.state import StateStore
from nexarch_events.importer.sync import ImportLimits, run_sync
from nexarch_events.testing import ImportRecorder, record_imports
from tests.support.imap_script import (
    Faults,
    ScriptedImapServer,
    ScriptedMessage,
    open_scripted_imap,
)

TENANT = "acme"
NAME = "inbox"


def message(n: int, tag: str = "") -> bytes:
    return (f"From: a{n}@example.org\r\nTo: b@example.org\r\nSubject: message {n}{tag}\r\n"
            f"Message-ID: <{n}{tag}@example.org>\r\n\r\nbody of message {n}{tag}\r\n").encode()


def messages(uids: list[int], tag: str = "") -> list[ScriptedMessage]:
    return [ScriptedMessage(uid, message(uid, tag)) for uid in uids]


def config_for(server: ScriptedImapServer) -> MailboxConfig:
    return MailboxConfig(tenant_slug=TENANT, name=NAME, host=server.host, port=server.port,
                         tls_mode="plain", username="user", password_ref="env:UNUSED")


async def sync(db: Database, server: ScriptedImapServer, **limits: int) -> object:
    return await run_sync(db.dsn, config_for(server), "secret", imap_timeout=3,
                          limits=ImportLimits(**limits))


async def archived_hashes(db: Database) -> list[bytes]:
    return [bytes(r["sha256"]) for r in await db.fetch(
        "SELECT sha256 FROM mail_archive WHERE tenant_slug = $1 ORDER BY id", TENANT)]


async def locations(db: Database) -> list[tuple[int, int]]:
    return [(r["uidvalidity"], r["uid"]) for r in await db.fetch(
        "SELECT uidvalidity, uid FROM mail_archive_locations WHERE tenant_slug = $1 "
        "ORDER BY uidvalidity, uid", TENANT)]


async def state(db: Database):  # type: ignore[no-untyped-def]
    return await StateStore(db).get(TENANT, NAME)


async def test_first_and_delta_import_in_uid_order(db: Database) -> None:
    async with open_scripted_imap(messages([1, 2, 3])) as server, \
            record_imports(db.dsn) as rec:
        await sync(db, server)
        server.add_message(message(4))
        server.add_message(message(5))
        await sync(db, server)
        await rec.wait_for_imported(count=5)
    assert [e.uid for e in rec.select()] == [1, 2, 3, 4, 5]
    rec.assert_in_uid_order()
    assert len(await archived_hashes(db)) == 5
    assert (await state(db)).last_synced_uid == 5
    # Read-only and PEEK: a sync never sets \\Seen.
    assert server.flag_changes == []
    assert any(c.startswith("EXAMINE") for c in server.commands)
    assert all("BODY.PEEK[]" in c for c in server.commands if c.startswith("UID FETCH")
               and "BODY" in c)


async def test_n_star_returning_the_last_message_is_not_reimported(db: Database) -> None:
    async with open_scripted_imap(messages([1, 2, 3, 4, 5])) as server:
        await sync(db, server)
        before = await db.fetchval("SELECT count(*) FROM mail_index_jobs")
        async with record_imports(db.dsn) as rec:
            await sync(db, server)  # UID SEARCH UID 6:* answers 5
            # An expunged tail: watermark 5, only UIDs 1..3 left.
            server.set_messages(messages([1, 2, 3]), uidvalidity=1)
            await sync(db, server)
            await trio.sleep(0.2)
        assert any("UID SEARCH" in c and "6:*" in c for c in server.commands)
    assert rec.events == []
    assert (await state(db)).last_synced_uid == 5
    assert len(await archived_hashes(db)) == 5
    assert await db.fetchval("SELECT count(*) FROM mail_index_jobs") == before


async def test_sparse_uids_are_enumerated_not_walked(db: Database) -> None:
    uids = [7, 743_024_218, 743_031_307, 4_000_000_000]
    async with open_scripted_imap(messages(uids)) as server:
        with trio.fail_after(20):
            await sync(db, server)
        fetches = [c for c in server.commands if c.startswith("UID FETCH")]
    # One size probe and one body batch: the UID set names real UIDs only.
    assert len(fetches) == 2, fetches
    assert "7,743024218,743031307,4000000000" in fetches[1]
    assert [u for _, u in await locations(db)] == uids
    assert (await state(db)).last_synced_uid == 4_000_000_000


async def test_uidvalidity_change_resyncs_by_content_hash(db: Database) -> None:
    async with open_scripted_imap(messages([1, 2, 3])) as server:
        await sync(db, server)
        async with record_imports(db.dsn) as rec:
            # Same messages renumbered under a new UIDVALIDITY, plus one new.
            renumbered = [ScriptedMessage(10 + i, message(i)) for i in (1, 2, 3)]
            server.set_messages([*renumbered, ScriptedMessage(14, message(4))],
                                uidvalidity=2)
            await sync(db, server)
            await rec.wait_for_imported(count=4)
    assert len(await archived_hashes(db)) == 4  # no duplicates, one new
    assert await locations(db) == [(1, 1), (1, 2), (1, 3), (2, 11), (2, 12), (2, 13), (2, 14)]
    st = await state(db)
    assert (st.last_uidvalidity, st.last_synced_uid) == (2, 14)
    resync = rec.select(event="resync")
    assert len(resync) == 1 and resync[0].payload["old_uidvalidity"] == 1
    imported = rec.select()
    assert [e.duplicate for e in imported] == [True, True, True, False]
    assert rec.events.index(resync[0]) < rec.events.index(imported[0])
    assert "UIDVALIDITY changed" in (st.warning or "")


async def test_uidvalidity_zero_is_unstable_content_hash_pass(db: Database) -> None:
    async with open_scripted_imap(messages([1, 2, 3]), faults=Faults(uidvalidity=0)) as server:
        await sync(db, server)
        await sync(db, server)  # every run is a full pass ...
    assert len(await archived_hashes(db)) == 3  # ... that never duplicates
    st = await state(db)
    assert st.last_synced_uid == 0 and st.last_uidvalidity == 0
    assert "UIDVALIDITY 0" in (st.warning or "")


async def test_missing_uidvalidity_is_unstable_too(db: Database) -> None:
    async with open_scripted_imap(messages([1, 2]),
                                  faults=Faults(uidvalidity=None, uidnext=None)) as server:
        await sync(db, server)
        assert not any(c.startswith("UID FETCH") for c in server.commands)
    assert len(await archived_hashes(db)) == 2
    assert "UIDVALIDITY none" in ((await state(db)).warning or "")


async def test_uid_zero_in_a_reply_is_never_a_location(db: Database) -> None:
    async with open_scripted_imap(messages([1, 2, 3]),
                                  faults=Faults(report_uid={2: 0})) as server:
        await sync(db, server)
        failures = await StateStore(db).failures(TENANT, NAME)
        assert [f["uid"] for f in failures] == [2]
        # The content is archived (by hash), but UID 0 is nowhere.
        assert len(await archived_hashes(db)) == 3
        assert await locations(db) == [(1, 1), (1, 3)]
        assert "UID 0" in ((await state(db)).warning or "")
        # Fixed server: the failure is retried and imported with its location.
        server.faults.report_uid = {}
        async with record_imports(db.dsn) as rec:
            await sync(db, server)
            await rec.wait_for(event="recovered")
    assert await locations(db) == [(1, 1), (1, 2), (1, 3)]
    assert await StateStore(db).failures(TENANT, NAME) == []
    assert len(await archived_hashes(db)) == 3


async def test_descending_reply_is_imported_in_uid_order(db: Database) -> None:
    async with open_scripted_imap(messages([1, 2, 3, 4]),
                                  faults=Faults(descending_fetch=True)) as server, \
            record_imports(db.dsn) as rec:
        await sync(db, server)
        await rec.wait_for_imported(count=4)
    assert [e.uid for e in rec.select()] == [1, 2, 3, 4]
    assert "out of UID order" in ((await state(db)).warning or "")


async def test_body_nil_and_empty_fail_one_message_and_retry(db: Database) -> None:
    msgs = [ScriptedMessage(1, message(1)), ScriptedMessage(2, None, size=120),
            ScriptedMessage(3, b"", size=80), ScriptedMessage(4, message(4))]
    async with open_scripted_imap(msgs, faults=Faults(empty_fetch_uids={5})) as server, \
            record_imports(db.dsn) as rec:
        server.add_message(message(5))
        await sync(db, server)
        await rec.wait_for_imported(count=2)
        failed = await rec.wait_for(event="failed", count=3)
        assert [e.uid for e in rec.select()] == [1, 4]
        assert sorted(e.uid or 0 for e in failed) == [2, 3, 5]
        assert (await state(db)).last_synced_uid == 5  # later messages went on
        rows = {f["uid"]: f for f in await StateStore(db).failures(TENANT, NAME)}
        assert "BODY[] NIL" in rows[2]["last_error"]
        assert "empty body although RFC822.SIZE is 80" in rows[3]["last_error"]
        assert "no data" in rows[5]["last_error"]
        # The server now hands them over: the next run imports them.
        server.set_messages([ScriptedMessage(1, message(1)), ScriptedMessage(2, message(2)),
                             ScriptedMessage(3, message(3)), ScriptedMessage(4, message(4)),
                             ScriptedMessage(5, message(5))], uidvalidity=1)
        server.faults.empty_fetch_uids = set()
        await sync(db, server)
        recovered = await rec.wait_for(event="recovered", count=3)
    assert sorted(e.uid or 0 for e in recovered) == [2, 3, 5]
    assert len(await archived_hashes(db)) == 5
    assert await StateStore(db).failures(TENANT, NAME) == []


async def test_cut_mid_literal_ends_the_run_and_the_next_resumes(db: Database) -> None:
    async with open_scripted_imap(messages([1, 2, 3, 4, 5, 6]),
                                  faults=Faults(cut_mid_literal_uid=5)) as server:
        # Batches of two: 1-2 and 3-4 commit, the batch of 5 is cut.
        try:
            with trio.fail_after(10):
                await sync(db, server, batch_messages=2)
        except ImapUnavailable as exc:
            error = str(exc)
        else:
            raise AssertionError("a cut mid-literal must fail the run")
        st = await state(db)
        assert st.last_synced_uid == 4
        assert st.last_error is not None and "connection" in st.last_error
        assert error
        server.faults.cut_mid_literal_uid = None
        async with record_imports(db.dsn) as rec:
            await sync(db, server, batch_messages=2)
            await rec.wait_for_imported(count=2)
    assert [e.uid for e in rec.select()] == [5, 6]
    assert len(await archived_hashes(db)) == 6
    assert (await state(db)).last_error is None


async def test_silent_server_ends_the_run_with_a_clear_error(db: Database) -> None:
    async with open_scripted_imap(messages([1, 2]),
                                  faults=Faults(silent_after="UID SEARCH")) as server:
        with trio.fail_after(15):
            try:
                await sync(db, server)
            except ImapUnavailable as exc:
                assert "no answer within" in str(exc)
            else:
                raise AssertionError("a silent server must fail the run")
    st = await state(db)
    assert st.last_error is not None and "no answer within" in st.last_error
    assert st.last_synced_uid == 0


async def test_recorder_sees_nothing_of_other_tenants(db: Database) -> None:
    rec = ImportRecorder(tenant="other")
    async with open_scripted_imap(messages([1])) as server:
        await sync(db, server)
    assert rec.events == []


async def test_starttls_is_required_when_configured(db: Database) -> None:
    """tls=starttls against a server that does not offer it must fail, never
    fall back to sending the password in clear text."""
    from dataclasses import replace

    from nexarch_events.errors import ImapTlsError

    async with open_scripted_imap(messages([1])) as server:
        cfg = replace(config_for(server), tls_mode="starttls")
        with trio.fail_after(10), pytest.raises(ImapTlsError, match="does not offer STARTTLS"):
            await run_sync(db, cfg, "secret", imap_timeout=3)
        assert not any(c.startswith("LOGIN") for c in server.commands)
        # Implicit TLS against a plain-text server fails too, promptly.
        cfg = replace(config_for(server), tls_mode="implicit")
        with trio.fail_after(10), pytest.raises(ImapUnavailable):
            await run_sync(db, cfg, "secret", imap_timeout=3)
    assert (await state(db)).last_error  # the last failure is on the mailbox state
