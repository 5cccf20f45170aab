"""The traps real IMAP servers set, each against the scripted server
(tests/support/imap_script.py), which produces what Dovecot will not. Each
test fails without the handling it names (see nexarch_events/importer/sync.py).
"""

from __future__ import annotations

from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from functools import partial

import pytest
import trio

from nexarch_events.aio import Database, imap
from nexarch_events.aio.imap import ImapEndpoint, ImapSession
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


@asynccontextmanager
async def examined(server: ScriptedImapServer,
                   reply_timeout: float = 10) -> AsyncIterator[ImapSession]:
    """A session of the scripted server's user, its INBOX examined."""
    session = await ImapSession.open(ImapEndpoint(server.host, server.port, "plain",
                                                  timeout=reply_timeout), "user", "secret")
    try:
        await session.examine('"INBOX"')
        yield session
    finally:
        await session.aclose()


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


async def test_a_searched_uid_beyond_uidnext_that_never_arrives_keeps_later_mail_coming(
        db: Database) -> None:
    """UID SEARCH listed UID 4000000000, above the UIDNEXT the server stated,
    and a FETCH of it brought nothing. It was recorded as failed and the
    watermark moved to it, so the mail the server received afterwards (UIDs
    3 and 4) was never imported (a review). Such a UID is recorded without
    passing over it; a real message past UIDNEXT (delivered after EXAMINE)
    still comes in."""
    phantom = 4_000_000_000
    async with open_scripted_imap(messages([1, 2])) as server:
        server.faults.phantom_search_uids = {phantom}
        await sync(db, server)
        assert (await state(db)).last_synced_uid == 2
        server.add_message(message(3))
        server.add_message(message(4))
        await sync(db, server)
        assert [u for _, u in await locations(db)] == [1, 2, 3, 4]
        assert (await state(db)).last_synced_uid == 4
        # Asked for once a run (by the failure retries, not the delta pass
        # too), and no more once the attempts are used up.
        for _ in range(4):
            await sync(db, server, max_failure_attempts=4)
    rows = {f["uid"]: f for f in await StateStore(db).failures(TENANT, NAME)}
    assert list(rows) == [phantom]
    assert rows[phantom]["attempts"] == 4


async def test_a_new_uid_that_failed_at_first_is_imported_once(db: Database) -> None:
    """A message past the UIDNEXT of its run's EXAMINE (delivered since) that
    sent nothing at first is recorded without passing over it. When it comes,
    it came twice: by the next delta pass as new mail and by the failure
    retries as recovered (two events for one message: a review)."""
    async with open_scripted_imap(messages([1, 2, 3]),
                                  faults=Faults(uidnext=3, empty_fetch_uids={3})) as server, \
            record_imports(db.dsn) as rec:
        await sync(db, server)
        assert [f["uid"] for f in await StateStore(db).failures(TENANT, NAME)] == [3]
        server.faults.empty_fetch_uids = set()
        server.add_message(message(4))
        await sync(db, server)
        await rec.wait_for(event="recovered", uid=3)
        await rec.wait_for_imported(count=3)
        await trio.sleep(0.3)
    assert [e.event for e in rec.select(event=None) if e.uid == 3 and e.event != "failed"] \
        == ["recovered"]
    assert [u for _, u in await locations(db)] == [1, 2, 3, 4]
    assert await StateStore(db).failures(TENANT, NAME) == []


async def test_two_messages_under_one_uid_are_both_archived(db: Database) -> None:
    """The server labels message 5's answer UID 7, then sends the real UID 7
    too. The second answer for UID 7 was dropped ("first one kept"), and
    with it message 7, for good: its UID was settled, and asked for again
    the server mislabels again (a review). Now the second message under one
    UID is archived by content; the same answer twice archives nothing."""
    async with open_scripted_imap(messages([5, 7]),
                                  faults=Faults(report_uid={5: 7})) as server:
        await sync(db, server)
        assert len(await archived_hashes(db)) == 2, "a message given under another's UID was lost"
        assert await locations(db) == []  # neither answer is surely message 7
        rows = {f["uid"]: f for f in await StateStore(db).failures(TENANT, NAME)}
        assert list(rows) == [5, 7]
        assert "two different messages" in rows[7]["last_error"]
        assert (await state(db)).last_synced_uid == 7  # later mail goes on
        # The server labels its answers right again: both get their places.
        server.faults.report_uid = {}
        await sync(db, server)
    assert await locations(db) == [(1, 5), (1, 7)]
    assert len(await archived_hashes(db)) == 2
    assert await StateStore(db).failures(TENANT, NAME) == []


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


async def test_an_unstable_pass_ends_where_the_messages_end(db: Database) -> None:
    """UIDVALIDITY 0 and ``* 4294967295 EXISTS`` with three messages: the
    pass probed sequence numbers 200 at a time up to the stated count, 21
    million round trips in one run holding a session and a connection (a
    review). It ends after the last message the probe answered for."""
    async with open_scripted_imap(messages([1, 2, 3]),
                                  faults=Faults(uidvalidity=0,
                                                exists_override=4_294_967_295)) as server:
        with trio.fail_after(30):
            await sync(db, server)
        fetches = [c for c in server.commands if c.startswith("FETCH")]
    assert len(await archived_hashes(db)) == 3
    assert len(fetches) == 2, fetches  # a probe, the bodies
    assert "answered for none after message 3" in ((await state(db)).warning or "")


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


# -- issue 10: what providers really do --------------------------------------


async def test_a_substitute_or_a_size_mismatch_is_never_archived_as_the_message(
        db: Database) -> None:
    """Exchange's "Retrieval using the IMAP4 protocol failed" stub and a body
    shorter than RFC822.SIZE fail that message (retried); the stub never gets
    the message's location. A size that disagrees on every attempt is
    archived on the accept_mismatch_after-th one, marked on its location."""
    from tests.support.imap_script import substitute_body

    real = message(2, " quokka")
    short = message(3)
    msgs = [ScriptedMessage(1, message(1)), ScriptedMessage(2, real),
            ScriptedMessage(3, short[:-12], size=len(short)), ScriptedMessage(4, message(4))]
    async with open_scripted_imap(msgs, faults=Faults(substitute_uids={2})) as server, \
            record_imports(db.dsn) as rec:
        await sync(db, server)
        await rec.wait_for_imported(count=2)
        await rec.wait_for(event="failed", count=2)
        assert [e.uid for e in rec.select()] == [1, 4]
        assert (await state(db)).last_synced_uid == 4  # later messages went on
        assert await locations(db) == [(1, 1), (1, 4)]
        assert await db.fetchval("SELECT count(*) FROM mail_archive "
                                 "WHERE position($1 IN raw) > 0", b"Retrieval using") == 0
        rows = {f["uid"]: f for f in await StateStore(db).failures(TENANT, NAME)}
        assert "substitute" in rows[2]["last_error"]
        assert rows[3]["last_error"].startswith("size mismatch: RFC822.SIZE")
        # The server hands over message 2 now; message 3 stays short.
        server.faults.substitute_uids = set()
        await sync(db, server)
        await rec.wait_for(event="recovered", uid=2)
        assert await locations(db) == [(1, 1), (1, 2), (1, 4)]
        assert await db.fetchval("SELECT count(*) FROM mail_archive "
                                 "WHERE position($1 IN raw) > 0", b"quokka") == 1
        rows = {f["uid"]: f for f in await StateStore(db).failures(TENANT, NAME)}
        assert list(rows) == [3] and rows[3]["attempts"] == 2
        # Third attempt, same mismatch: archived, and the location says so.
        await sync(db, server)
        await rec.wait_for(event="recovered", uid=3)
    note = await db.fetchval("SELECT import_note FROM mail_archive_locations WHERE uid = 3")
    assert note is not None and note.startswith("size mismatch: RFC822.SIZE")
    assert await StateStore(db).failures(TENANT, NAME) == []
    raws = [r["raw"] for r in await db.fetch("SELECT raw FROM mail_archive")]
    assert substitute_body(2) not in raws


async def test_only_the_same_size_mismatch_on_every_attempt_is_archived(
        db: Database) -> None:
    """A body cut at another length on each attempt is a server failing, not
    a wrong size count: the third mismatch of any kind was archived as the
    message (a review). Now only the same mismatch on
    accept_mismatch_after attempts in a row is; the count restarts when the
    result changes."""
    full = message(2, " the whole body")

    def cut_by(n: int) -> list[ScriptedMessage]:
        return [ScriptedMessage(1, message(1)),
                ScriptedMessage(2, full[:-n], size=len(full))]

    async with open_scripted_imap(cut_by(12)) as server:
        for n in (12, 10, 10):  # 1st, then another length twice: a streak of 2
            server.set_messages(cut_by(n), uidvalidity=1)
            await sync(db, server)
            assert await locations(db) == [(1, 1)], f"archived when cut by {n}"
        [row] = await StateStore(db).failures(TENANT, NAME)
        assert row["last_error"].endswith("(the same on 2 attempts in a row)")
        await sync(db, server)  # the same a third time in a row: archived
    assert await locations(db) == [(1, 1), (1, 2)]
    note = await db.fetchval("SELECT import_note FROM mail_archive_locations WHERE uid = 2")
    assert note == (f"size mismatch: RFC822.SIZE {len(full)}, received {len(full) - 10} bytes"
                    " (archived after 3 attempts with the same result)")


@pytest.mark.parametrize(("code", "backoff_ms"), [("UNAVAILABLE", 300), ("THROTTLED", None),
                                                  ("LIMIT", 50), ("INUSE", None)])
async def test_a_throttled_session_still_imports_everything(
        db: Database, code: str, backoff_ms: int | None) -> None:
    """Every session's first UID FETCH is throttled (Office 365, Gmail):
    the command is repeated in the same session after the suggested wait."""
    faults = Faults(throttle_command="UID FETCH", throttle_times=1, throttle_code=code,
                    throttle_backoff_ms=backoff_ms)
    async with open_scripted_imap(messages(list(range(1, 61))), faults=faults) as server:
        with trio.fail_after(30):
            report = await run_sync(db.dsn, config_for(server), "secret", imap_timeout=3,
                                    limits=ImportLimits(throttle_default_wait=0.1,
                                                        throttle_min_wait=0.05))
        assert server.throttled == 1 and server.connections == 1
    assert report.throttled == 1  # type: ignore[attr-defined]
    st = await state(db)
    assert (st.last_synced_uid, st.imported_total, st.last_error) == (60, 60, None)


async def test_a_server_that_stays_throttled_fails_the_run_clearly(db: Database) -> None:
    """... and a suggested wait of 0 ms is not obeyed below the floor (five
    commands within 2 ms before: a retry-loop audit)."""
    from nexarch_events.errors import ImapThrottled

    faults = Faults(throttle_command="UID FETCH", throttle_times=1000, throttle_backoff_ms=0)
    async with open_scripted_imap(messages([1, 2]), faults=faults) as server:
        started = trio.current_time()
        with trio.fail_after(30), pytest.raises(ImapThrottled):
            await run_sync(db.dsn, config_for(server), "secret", imap_timeout=3,
                           limits=ImportLimits(throttle_retries=3, throttle_min_wait=0.3))
        assert trio.current_time() - started >= 3 * 0.3
        assert server.throttled == 4  # the first try and three retries
    error = (await state(db)).last_error or ""
    assert error.startswith("throttled:") and "UNAVAILABLE" in error
    assert "UID FETCH 1:2 (UID RFC822.SIZE) answered NO" in error
    # No Python reprs: no True/False/None, no b'...'.
    assert not any(token in error for token in (" True", " False", "None", "b'", "b\""))


async def test_mail_announced_during_a_sync_is_imported_by_the_same_run(
        db: Database) -> None:
    """A message delivered while the run fetches is announced by ``* n
    EXISTS`` inside a FETCH reply (aioimaplib drops it): another pass."""
    delivered: list[int] = []

    async with open_scripted_imap(messages([1, 2, 3])) as server:
        def deliver(line: str) -> None:
            if line.startswith("UID FETCH") and "BODY" in line and not delivered:
                delivered.append(server.add_message(message(4)))

        server.faults.on_command = deliver
        report = await sync(db, server)
    assert delivered == [4]
    assert report.passes == 2  # type: ignore[attr-defined]
    assert (await state(db)).last_synced_uid == 4


async def test_mail_announced_during_the_retries_is_imported_by_the_same_run(
        db: Database) -> None:
    """The run retries a recorded failure last; a message delivered then is
    announced by ``* n EXISTS`` in that FETCH's reply, and was left for the
    next refresh (up to 20 minutes for an IDLE runner: a review)."""
    delivered: list[int] = []
    async with open_scripted_imap(messages([1, 2, 3]),
                                  faults=Faults(empty_fetch_uids={2})) as server:
        await sync(db, server)
        assert [f["uid"] for f in await StateStore(db).failures(TENANT, NAME)] == [2]

        def deliver(line: str) -> None:
            if line.startswith("UID FETCH 2 ") and not delivered:
                delivered.append(server.add_message(message(4)))

        server.faults.on_command = deliver
        await sync(db, server)
    assert delivered == [4]
    assert (await state(db)).last_synced_uid == 4
    assert [u for _, u in await locations(db)] == [1, 3, 4]


async def test_no_false_alarms_and_honest_counters(db: Database) -> None:
    """Unsolicited FLAGS updates without UID are not an anomaly; a resync
    re-map is not counted as imported; an unstable pass is."""
    async with open_scripted_imap(messages([1, 2, 3]),
                                  faults=Faults(unsolicited_flags=True)) as server:
        await sync(db, server)
        st = await state(db)
        assert (st.warning, st.imported_total) == (None, 3)
        server.set_messages([*(ScriptedMessage(10 + i, message(i)) for i in (1, 2, 3)),
                             ScriptedMessage(14, message(4))], uidvalidity=2)
        await sync(db, server)
        assert (await state(db)).imported_total == 4  # 3 re-mapped, 1 new
    await db.execute("DELETE FROM mail_import_state")
    async with open_scripted_imap(messages([1, 2, 5], tag="u"),
                                  faults=Faults(uidvalidity=0)) as server:
        await sync(db, server)
        await sync(db, server)
    assert (await state(db)).imported_total == 3


async def test_a_burst_of_flag_updates_in_one_read_costs_nothing(db: Database) -> None:
    """5,000 unsolicited flag updates in one write before each FETCH reply
    (another client marked a folder read): aioimaplib's framing recursed once
    per line and lost the session to a RecursionError past about 1,000."""
    async with open_scripted_imap(messages([1, 2, 3]),
                                  faults=Faults(flag_update_burst=5000)) as server:
        report = await sync(db, server)
    st = await state(db)
    assert (st.last_synced_uid, st.warning, st.last_error) == (3, None, None)
    assert report.imported == 3  # type: ignore[attr-defined]


async def test_internaldate_is_stored_with_the_location(db: Database) -> None:
    msgs = [ScriptedMessage(1, message(1), internaldate="17-Jul-1996 02:44:25 -0700")]
    async with open_scripted_imap(msgs) as server:
        await sync(db, server)
    got = await db.fetchval("SELECT internaldate FROM mail_archive_locations WHERE uid = 1")
    assert got is not None and got.isoformat() == "1996-07-17T09:44:25+00:00"


async def test_a_cut_costs_at_most_the_message_in_flight(db: Database) -> None:
    """Each message commits as soon as its literal is complete, not after
    the whole batch: a cut at message 7 of a batch of 10 keeps 1-6."""
    async with open_scripted_imap(messages(list(range(1, 11))),
                                  faults=Faults(cut_mid_literal_uid=7)) as server, \
            record_imports(db.dsn) as rec:
        with trio.fail_after(10), pytest.raises(ImapUnavailable):
            await sync(db, server)
        await rec.wait_for_imported(count=6)
        assert (await state(db)).last_synced_uid == 6
        server.faults.cut_mid_literal_uid = None
        await sync(db, server)
        await rec.wait_for_imported(count=10)
    assert [e.uid for e in rec.select()] == list(range(1, 11))
    assert len(await archived_hashes(db)) == 10


async def test_a_server_that_cuts_every_fetch_reply_still_imports_everything(
        db: Database) -> None:
    """``* BYE`` after the third response of every UID FETCH (a bandwidth
    limit): what arrived is kept, the window shrinks, every run progresses."""
    async with open_scripted_imap(messages(list(range(1, 61))),
                                  faults=Faults(bye_after_fetch_responses=3)) as server, \
            record_imports(db.dsn) as rec:
        errors: list[str] = []
        with trio.fail_after(120):
            for _ in range(40):
                try:
                    await sync(db, server)
                except ImapUnavailable as exc:
                    errors.append(str(exc))
                if (await state(db)).last_synced_uid == 60:
                    break
        await rec.wait_for_imported(count=60)
    st = await state(db)
    assert st.last_synced_uid == 60 and st.imported_total == 60
    assert [e.uid for e in rec.select()] == list(range(1, 61))
    assert len(await archived_hashes(db)) == 60
    assert errors and "cut after" in errors[0]
    assert "the server said BYE: Bandwidth limit exceeded" in errors[0]
    assert st.fetch_window is not None and st.fetch_window < 200


async def test_a_server_that_ends_every_fetch_with_bye_still_imports_everything(
        db: Database) -> None:
    """``* BYE`` instead of the tagged OK of every UID FETCH: the window
    shrinks to one message, and the size probe of that one message was cut
    after its size every time, so its body was never asked for: no progress,
    ever (a review). One message is fetched without a probe."""
    async with open_scripted_imap(messages(list(range(1, 6))),
                                  faults=Faults(bye_instead_of_fetch_ok=True)) as server:
        with trio.fail_after(60):
            for _ in range(15):
                try:
                    await sync(db, server)
                except ImapUnavailable:
                    pass
                if (await state(db)).last_synced_uid == 5:
                    break
    assert [u for _, u in await locations(db)] == [1, 2, 3, 4, 5]
    assert await StateStore(db).failures(TENANT, NAME) == []


async def test_a_cut_counts_only_the_responses_asked_for(db: Database) -> None:
    """Unsolicited flag updates before the cut are not responses to the
    request: the window shrinks to what the server really delivered."""
    async with open_scripted_imap(messages(list(range(1, 61))),
                                  faults=Faults(bye_after_fetch_responses=3,
                                                flag_update_burst=20)) as server:
        with pytest.raises(ImapUnavailable) as cut:
            await sync(db, server)
    assert "cut after 3 of 60 message(s)" in str(cut.value)
    assert (await state(db)).fetch_window == 3


async def test_a_message_without_a_date_header_is_dated_by_internaldate(
        db: Database) -> None:
    from nexarch_events.index.base import SearchQuery
    from nexarch_events.index.postgres import PostgresIndex
    from nexarch_events.mail.indexer import Indexer
    from nexarch_events.queue.jobs import Queue

    undated = b"From: a@example.org\r\nSubject: no date here\r\n\r\nwombat\r\n"
    msgs = [ScriptedMessage(1, undated, internaldate="02-Mar-2021 08:00:00 +0100")]
    async with open_scripted_imap(msgs) as server:
        await sync(db, server)
    backend = PostgresIndex(db)
    jobs = await Queue(db).claim(10, "test")
    failures = await Indexer(db, backend).index_batch(jobs)
    assert failures == {}
    hits = (await backend.search(SearchQuery(TENANT, "wombat"))).hits
    assert len(hits) == 1
    assert hits[0].sent_at is not None and hits[0].sent_at.isoformat() == \
        "2021-03-02T07:00:00+00:00"


async def test_an_error_while_consuming_a_streamed_fetch_comes_out_as_itself(
        db: Database) -> None:
    """A database error while storing a streamed message must reach the
    scheduler as that error (it sorts errors by type), not wrapped in an
    ExceptionGroup; the session is broken afterwards (its reply was abandoned)."""
    from nexarch_events.errors import DatabaseUnavailable

    async with open_scripted_imap(messages([1, 2, 3])) as server, \
            examined(server, reply_timeout=3) as session:
        seen: list[int] = []

        async def on_response(parts: list[bytes | bytearray]) -> None:
            seen.append(len(parts))
            raise DatabaseUnavailable("the database went away")

        with trio.fail_after(10), pytest.raises(DatabaseUnavailable):
            await session.uid_fetch_each("1:3", "(UID BODY.PEEK[])", on_response)
        assert seen == [3]  # the first response: line, literal, closing line
        assert session.broken is not None


async def test_a_streamed_fetch_holds_at_most_its_bound_for_a_slow_consumer(
        db: Database) -> None:
    """Bodies complete faster than Postgres stores them: every complete
    response waited in memory, so a server that understated its sizes (a
    batch of 50 "1-byte" messages of 128 MiB) could fill memory and take the
    process down (a review). Past ``hold`` bytes in two responses or more
    the session is refused; what arrived is handed over first."""
    big = [ScriptedMessage(u, message(u) + b"x" * (1 << 20)) for u in range(1, 21)]
    handed: list[int] = []

    async def on_response(parts: list[bytes | bytearray]) -> None:
        handed.append(sum(len(p) for p in parts))
        await trio.sleep(0.2)  # Postgres, slowly

    async with open_scripted_imap(big) as server, examined(server) as session:
        with trio.fail_after(30), \
                pytest.raises(ImapUnavailable, match="faster than they could be stored"):
            await session.uid_fetch_each("1:20", "(UID BODY.PEEK[])", on_response,
                                         hold=4 << 20)
    assert 2 <= len(handed) < 20
    handed.clear()
    # One response alone is always handed over, whatever the bound.
    async with open_scripted_imap(big[:1]) as server, examined(server) as session:
        with trio.fail_after(30):
            await session.uid_fetch_each("1", "(UID BODY.PEEK[])", on_response, hold=1)
    assert len(handed) == 1 and handed[0] > 1 << 20


async def test_understated_sizes_still_import_everything(db: Database) -> None:
    """Every size probe says 1 byte, so the batches are as long as they may
    be; the bodies are 256 KiB and the bound is small. Each run keeps what
    arrived, and the mailbox is imported in full, each message once."""
    msgs = [ScriptedMessage(u, message(u) + b"y" * (256 << 10)) for u in range(1, 31)]
    async with open_scripted_imap(msgs, faults=Faults(probe_size=1)) as server:
        with trio.fail_after(120):
            for _ in range(30):
                try:
                    await sync(db, server, batch_bytes=512 << 10)
                except ImapUnavailable:
                    pass  # refused past the bound (when Postgres is the slower)
                if (await state(db)).last_synced_uid == 30:
                    break
    assert [u for _, u in await locations(db)] == list(range(1, 31))
    assert len(await archived_hashes(db)) == 30


# -- sizes a server states or sends are not trusted ----------------------------

async def test_a_body_over_the_archives_limit_is_discarded_as_it_arrives(
        db: Database, monkeypatch: pytest.MonkeyPatch) -> None:
    """A server that says RFC822.SIZE 1000 and sends megabytes: the body is
    skipped as it arrives (never held: the framing's limit is the
    archive's, lowered here to 1 MiB), that message fails with its real
    size, and the messages after it are imported."""
    monkeypatch.setattr(imap, "MAX_LITERAL_BYTES", 1 << 20)
    huge = message(2) + b"x" * (3 << 20)
    msgs = [ScriptedMessage(1, message(1)), ScriptedMessage(2, huge, size=1000),
            ScriptedMessage(3, message(3))]
    async with open_scripted_imap(msgs) as server, record_imports(db.dsn) as rec:
        await sync(db, server)
        await rec.wait_for_imported(count=2)
        await rec.wait_for(event="failed", uid=2)
    assert [e.uid for e in rec.select()] == [1, 3]
    assert (await state(db)).last_synced_uid == 3
    rows = {f["uid"]: f for f in await StateStore(db).failures(TENANT, NAME)}
    assert rows[2]["last_error"] == (f"message is {len(huge)} bytes; the archive's limit is "
                                     f"{1 << 20} (read and discarded, RFC822.SIZE 1000)")
    assert await db.fetchval("SELECT count(*) FROM mail_archive") == 2


async def test_a_line_that_never_ends_closes_the_session_at_the_limit(
        db: Database, monkeypatch: pytest.MonkeyPatch) -> None:
    """A server that answers UID SEARCH with a line without end: the client
    closes the connection once the line passes MAX_LINE_BYTES (lowered here
    to 1 MiB) and says why, instead of buffering until memory runs out or
    the command's timeout."""
    monkeypatch.setattr(imap, "MAX_LINE_BYTES", 1 << 20)
    faults = Faults(endless_line_at="UID SEARCH")
    async with open_scripted_imap(messages([1, 2]), faults=faults) as server:
        with trio.fail_after(20), pytest.raises(ImapUnavailable) as failed:
            await sync(db, server)
        sent = server.endless_line_sent
    assert "connection closed by this client: the server sent a line of more than " \
           f"{1 << 20} bytes" in str(failed.value)
    # Closed at the limit (plus what socket buffers held), not at a timeout:
    # a client that kept reading would have taken gigabytes in 3 s.
    assert 1 << 20 < sent < 64 << 20
    assert "line of more than" in ((await state(db)).last_error or "")


async def test_a_reply_flooded_with_short_lines_closes_the_session_at_the_limit(
        db: Database, monkeypatch: pytest.MonkeyPatch) -> None:
    """A server that answers EXAMINE with ``* 1 EXISTS`` forever: every line
    was kept for the reply until the command's timeout (773 MiB of client
    memory in 30 s; found by the importer audit). The client closes the
    connection once the reply passes MAX_REPLY_LINES (lowered here to
    20,000) and says why."""
    monkeypatch.setattr(imap, "MAX_REPLY_LINES", 20_000)
    faults = Faults(untagged_flood_at="EXAMINE")
    async with open_scripted_imap(messages([1, 2]), faults=faults) as server:
        with trio.fail_after(20), pytest.raises(ImapUnavailable) as failed:
            await sync(db, server)
        sent = server.flood_sent
    assert "more than 20000 untagged lines in the reply to EXAMINE" in str(failed.value)
    # Closed at the limit (plus what socket buffers held), not at a timeout.
    assert 20_000 * 12 < sent < 64 << 20
    faults.untagged_flood_at = None
    async with open_scripted_imap(messages([1, 2]), faults=faults) as server:
        await sync(db, server)
    assert (await state(db)).last_synced_uid == 2


async def test_a_reply_the_client_cannot_place_ends_the_session_with_the_reason(
        db: Database, caplog: pytest.LogCaptureFixture) -> None:
    """A tagged reply to a command never sent: aioimaplib raised out of the
    framing, asyncio reported a fatal error in data_received and closed the
    connection, and the run said "connection closed by the server". Now the
    client closes it, says why, and the next run starts over as after any
    cut."""
    faults = Faults(stray_tagged_reply=True)
    async with open_scripted_imap(messages([1, 2]), faults=faults) as server:
        with trio.fail_after(20), pytest.raises(ImapUnavailable) as failed:
            await sync(db, server)
        assert "connection closed by this client: the server broke the protocol (Abort) " \
               "with the line 'Z999 OK Fetch completed.'" in str(failed.value)
        assert not [r for r in caplog.records if "data_received" in r.getMessage()]
        server.faults.stray_tagged_reply = False
        await sync(db, server)
    assert (await state(db)).last_synced_uid == 2


@pytest.mark.parametrize("added_again", [False, True])
async def test_an_unstable_pass_stops_once_its_mailbox_is_removed(
        db: Database, monkeypatch: pytest.MonkeyPatch, added_again: bool) -> None:
    """UIDVALIDITY 0: every message is imported by content hash, with no
    watermark for the database to check, and the pass went on archiving
    after its mailbox was removed mid-pass (erase --unregister-mailboxes:
    the mail it had just erased came back). Also when a mailbox of the name
    was added again meanwhile (how settings are changed): the old run went
    on into the new registration (a review audit)."""
    from dataclasses import replace

    from nexarch_events.importer.mailboxes import MailboxRegistry
    from nexarch_events.importer.state import MailboxRemoved

    registry = MailboxRegistry(db)
    real_import = StateStore.import_message
    calls = 0

    async def removed_after_the_first(self: StateStore, *args: object,
                                      **kwargs: object) -> object:
        nonlocal calls
        calls += 1
        if calls == 2:
            await registry.remove(TENANT, NAME)
            if added_again:
                await registry.add(config)
        return await real_import(self, *args, **kwargs)  # type: ignore[arg-type]

    async with open_scripted_imap(messages([1, 2, 3, 4]),
                                  faults=Faults(uidvalidity=0)) as server:
        config = config_for(server)
        registered = replace(config, id=await registry.add(config))
        monkeypatch.setattr(StateStore, "import_message", removed_after_the_first)
        with pytest.raises(MailboxRemoved):
            await run_sync(db.dsn, registered, "secret", imap_timeout=3)
    assert calls == 2
    assert len(await archived_hashes(db)) == 1
    assert await db.fetchval("SELECT count(*) FROM mail_import_state") == int(added_again)


@pytest.mark.parametrize("added_again", [False, True])
async def test_a_retry_under_way_when_its_mailbox_is_removed_records_nothing(
        db: Database, monkeypatch: pytest.MonkeyPatch, added_again: bool) -> None:
    """A failure refused again by a run's retry was recorded whether or not
    its mailbox was still there: a row of a removed mailbox, which a mailbox
    added again under the name inherits (or, added again during the run,
    is given at once: a review audit)."""
    from dataclasses import replace

    from nexarch_events.importer.mailboxes import MailboxRegistry
    from nexarch_events.importer.state import MailboxRemoved

    registry = MailboxRegistry(db)
    real_record = StateStore.record_failure

    async def removed_before_a_retry(self: StateStore, *args: object, retry: bool,
                                     **kwargs: object) -> int:
        if retry:
            await registry.remove(TENANT, NAME)
            if added_again:
                await registry.add(config)
        return await real_record(self, *args, retry=retry, **kwargs)  # type: ignore[arg-type]

    async with open_scripted_imap(messages([1, 2, 3]),
                                  faults=Faults(unreadable_uids={2})) as server:
        config = config_for(server)
        registered = replace(config, id=await registry.add(config))
        await run_sync(db.dsn, registered, "secret", imap_timeout=3)
        assert await db.fetchval("SELECT count(*) FROM mail_import_failures") == 1
        monkeypatch.setattr(StateStore, "record_failure", removed_before_a_retry)
        with pytest.raises(MailboxRemoved):
            await run_sync(db.dsn, registered, "secret", imap_timeout=3)
    assert await db.fetchval("SELECT count(*) FROM mail_import_failures") == 0
    assert await db.fetchval("SELECT count(*) FROM mail_import_state") == int(added_again)


async def test_a_mailbox_removed_while_its_run_signs_in_is_not_imported(
        db: Database, monkeypatch: pytest.MonkeyPatch) -> None:
    """A run that signed in while its mailbox was removed (mailbox remove,
    erase --unregister-mailboxes, a tenant's erasure) created the sync
    state again and imported the whole mailbox: erased mail came back, and
    a mailbox added again under the name inherited the watermark and
    skipped its new account's first messages (a race audit). The removal
    here comes right before the run begins, as it did there."""
    from dataclasses import replace

    from nexarch_events.importer.mailboxes import MailboxRegistry
    from nexarch_events.importer.state import MailboxRemoved

    registry = MailboxRegistry(db)
    real_begin = StateStore.begin

    async def removed_first(self: StateStore, *args: object, **kwargs: object) -> object:
        await registry.remove(TENANT, NAME)
        return await real_begin(self, *args, **kwargs)  # type: ignore[arg-type]

    async with open_scripted_imap(messages([1, 2, 3])) as server:
        config = config_for(server)
        registered = replace(config, id=await registry.add(config))
        monkeypatch.setattr(StateStore, "begin", removed_first)
        with pytest.raises(MailboxRemoved):
            await run_sync(db.dsn, registered, "secret", imap_timeout=3)
        monkeypatch.undo()
        assert await archived_hashes(db) == []
        assert await db.fetchval("SELECT count(*) FROM mail_import_state") == 0
        # Its runner's other paths do not create the state again either.
        with pytest.raises(MailboxRemoved):
            await StateStore(db).get_or_create(TENANT, NAME, registered.id)
        assert await db.fetchval("SELECT count(*) FROM mail_import_state") == 0

        # A state row a removed mailbox left behind (an older version) does
        # not carry over to a mailbox added again under the name.
        await db.execute("INSERT INTO mail_import_state (tenant_slug, mailbox_name, "
                         "last_uidvalidity, last_synced_uid, imported_total) "
                         "VALUES ($1, $2, 1, 3, 3)", TENANT, NAME)
        again = replace(config, id=await registry.add(config))
        fresh = await state(db)
        assert (fresh.last_uidvalidity, fresh.last_synced_uid, fresh.imported_total) == (0, 0, 0)
        await run_sync(db.dsn, again, "secret", imap_timeout=3)
        assert len(await archived_hashes(db)) == 3


async def test_a_server_that_never_greets_leaves_no_socket_open(aio_loop: None) -> None:
    """The greeting's timeout cancelled the connect after the TCP connection
    was made and before the session held it: nobody closed the socket. A
    tarpit, or a server stuck after accept, leaked one per attempt until the
    process ran out of file descriptors (an audit: 36 → 70 fds in 9 min)."""
    accepted = 0
    closed = 0

    async def silent(stream: trio.SocketStream) -> None:
        nonlocal accepted, closed
        accepted += 1
        try:
            while await stream.receive_some(4096):
                pass
        except trio.BrokenResourceError:
            pass
        closed += 1

    async with trio.open_nursery() as nursery:
        listeners = await nursery.start(partial(trio.serve_tcp, silent, 0, host="127.0.0.1"))
        port = listeners[0].socket.getsockname()[1]
        for _ in range(3):
            with pytest.raises(ImapUnavailable, match="no greeting within"):
                await ImapSession.open(ImapEndpoint("127.0.0.1", port, "plain", timeout=0.3),
                                       "user", "secret")
        with trio.move_on_after(5):
            while closed < 3:
                await trio.sleep(0.02)
        nursery.cancel_scope.cancel()
    assert (accepted, closed) == (3, 3)
