"""One message a server cannot serve fails that message, never the mailbox.

On the scripted server (nexarch_events/testing/imap_server.py), three ways
a provider fails one message at the level of the whole command (found by an
audit: before, each stopped the mailbox for good, with nothing recorded):
- it ends the connection whenever it sends that message (a converter that
  crashes on it): every run was cut at the same UID, and the fetch window
  shrank to that one message;
- Dovecot with a corrupt or missing mail file: every other message of the
  FETCH, then ``NO Some messages could not be FETCHed``: the messages that
  did arrive were dropped and the run failed;
- a recorded failure whose message was expunged since, on a server that
  answers NO to a FETCH that names no message: the retry failed every run
  before the delta pass, and never counted an attempt.
"""

from __future__ import annotations

import pytest
import trio

from nexarch_events.aio import Database
from nexarch_events.errors import ImapError
from nexarch_events.importer.state import StateStore
from nexarch_events.testing import record_imports
from tests.integration.test_importer_traps import (
    NAME,
    TENANT,
    locations,
    message,
    messages,
    state,
    sync,
)
from tests.support.imap_script import (
    Faults,
    ScriptedImapServer,
    ScriptedMessage,
    open_scripted_imap,
)


async def runs(db: Database, server: ScriptedImapServer, count: int, **limits: int
               ) -> list[str]:
    """``count`` runs; the errors of those that failed."""
    errors = []
    for _ in range(count):
        try:
            with trio.fail_after(30):
                await sync(db, server, **limits)
        except ImapError as exc:
            errors.append(str(exc))
    return errors


async def failures(db: Database) -> dict[int, tuple[int, str]]:
    return {f["uid"]: (f["attempts"], f["last_error"])
            for f in await StateStore(db).failures(TENANT, NAME)}


async def test_a_message_whose_fetch_always_cuts_the_connection_fails_alone(
        db: Database) -> None:
    async with open_scripted_imap(messages(list(range(1, 11))),
                                  faults=Faults(cut_mid_literal_uid=5)) as server:
        errors = await runs(db, server, 3)
        # Cut with 1-4 in (window 4), cut with none in (window 1), cut
        # alone: UID 5 is recorded and the watermark passes it.
        assert len(errors) == 3
        assert (await state(db)).last_synced_uid == 5
        recorded = await failures(db)
        assert list(recorded) == [5]
        assert "ended the connection" in recorded[5][1]
        server.add_message(message(11))
        errors = await runs(db, server, 1)
        # New mail first; then the retry of 5 is cut again (one more attempt).
        assert [uid for _, uid in await locations(db)] == [1, 2, 3, 4, 6, 7, 8, 9, 10, 11]
        assert (await failures(db))[5][0] == 2 and len(errors) == 1
        server.faults.cut_mid_literal_uid = None
        async with record_imports(db.dsn) as rec:
            assert await runs(db, server, 1) == []
            recovered = await rec.wait_for(event="recovered", count=1)
    assert [e.uid for e in recovered] == [5]
    assert await failures(db) == {}
    assert [uid for _, uid in await locations(db)] == list(range(1, 12))


async def test_a_message_the_server_cannot_read_fails_alone(db: Database) -> None:
    # The size probe and the body fetch both end in NO after the others.
    async with open_scripted_imap(messages(list(range(1, 11))),
                                  faults=Faults(unreadable_uids={5})) as server:
        assert await runs(db, server, 1) == []
        assert [uid for _, uid in await locations(db)] == [1, 2, 3, 4, 6, 7, 8, 9, 10]
        assert (await state(db)).last_synced_uid == 10
        attempts, error = (await failures(db))[5]
        assert attempts == 1 and "could not be FETCHed" in error, error
        server.add_message(message(11))
        assert await runs(db, server, 1) == []  # the retry of 5 alone: refused again
        assert (await failures(db))[5][0] == 2
        assert [uid for _, uid in await locations(db)][-1] == 11
        server.faults.unreadable_uids = set()
        assert await runs(db, server, 1) == []
    assert await failures(db) == {}
    assert [uid for _, uid in await locations(db)] == list(range(1, 12))


async def test_a_server_that_refuses_a_whole_fetch_costs_one_message_per_run(
        db: Database) -> None:
    # Every message unreadable: nothing arrives. The window shrinks to one,
    # then each run records one message and ends: a server that refuses
    # everything for a while does not turn the whole mailbox into failures.
    async with open_scripted_imap(messages([1, 2, 3, 4]),
                                  faults=Faults(unreadable_uids={1, 2, 3, 4})) as server:
        errors = await runs(db, server, 3)
        assert len(errors) == 3 and all("could not be FETCHed" in e for e in errors), errors
        assert list(await failures(db)) == [1, 2]
        server.faults.unreadable_uids = set()
        assert await runs(db, server, 1) == []
    assert await failures(db) == {}
    assert [uid for _, uid in await locations(db)] == [1, 2, 3, 4]


async def test_a_failure_whose_message_is_gone_does_not_block_new_mail(
        db: Database) -> None:
    async with open_scripted_imap(messages([1, 2, 3]),
                                  faults=Faults(empty_fetch_uids={2})) as server:
        assert await runs(db, server, 1) == []
        assert list(await failures(db)) == [2]
        server.set_messages([m for m in server.messages if m.uid != 2], uidvalidity=1)
        server.faults.empty_fetch_uids = set()
        server.faults.no_for_no_match = True
        server.add_message(message(4))
        server.add_message(message(5))
        assert await runs(db, server, 2) == []
        assert [uid for _, uid in await locations(db)] == [1, 3, 4, 5]
        # Each run counts an attempt, so the limit ends the retries.
        assert (await failures(db))[2][0] == 3
        assert await runs(db, server, 1, max_failure_attempts=3) == []
        assert (await failures(db))[2][0] == 3


# -- what a server says that cannot be stored, or is not what it seems -------

async def test_values_postgres_cannot_take_are_no_reason_to_stop(db: Database) -> None:
    # An EXISTS above 2^32-1, INTERNALDATEs that have no UTC time (years
    # 1-9999 only): each failed every run with DatabaseRejected before.
    msgs = messages([1, 2, 3, 4])
    msgs[1].internaldate = "31-Dec-9999 23:59:59 -2359"
    msgs[2].internaldate = "01-Jan-0001 00:00:00 +0100"
    async with open_scripted_imap(
            msgs, faults=Faults(exists_override=99999999999999999999)) as server:
        assert await runs(db, server, 1) == []
    assert [uid for _, uid in await locations(db)] == [1, 2, 3, 4]
    dates = await db.fetch("SELECT uid, internaldate FROM mail_archive_locations ORDER BY uid")
    assert [r["internaldate"] is None for r in dates] == [False, True, True, False]


async def test_a_literal_longer_than_announced_is_never_archived_cut_short(
        db: Database) -> None:
    # The server counts bare LF line ends in {n} and RFC822.SIZE, then sends
    # CRLF: the first n bytes were archived as the message, without a word.
    async with open_scripted_imap(messages([1, 2, 3]),
                                  faults=Faults(lf_counted_uids={2})) as server:
        errors = await runs(db, server, 3)
        assert errors and all("announced a wrong length" in e for e in errors), errors
        assert [uid for _, uid in await locations(db)] == [1, 3]
        recorded = await failures(db)
        assert list(recorded) == [2] and "wrong length" in recorded[2][1]
        raws = [bytes(r["raw"]) for r in await db.fetch("SELECT raw FROM mail_archive")]
        assert sorted(raws) == sorted([message(1), message(3)])
        server.faults.lf_counted_uids = set()
        assert await runs(db, server, 1) == []
    assert await failures(db) == {}
    assert [uid for _, uid in await locations(db)] == [1, 2, 3]


async def test_a_flag_update_naming_its_uid_does_not_stand_for_the_message(
        db: Database) -> None:
    async with open_scripted_imap(messages([1, 2, 3]),
                                  faults=Faults(flag_update_with_uid=True)) as server:
        report = await sync(db, server)
    assert [uid for _, uid in await locations(db)] == [1, 2, 3]
    assert await failures(db) == {}
    assert report.warnings == [], report.warnings  # type: ignore[attr-defined]


async def test_flag_updates_naming_their_uid_in_an_unstable_pass_are_no_failures(
        db: Database) -> None:
    # UIDVALIDITY 0: every run fetches by sequence number; a flag update
    # with a UID was taken for a message without a body.
    async with open_scripted_imap(messages([1, 2, 3]), faults=Faults(
            uidvalidity=0, flag_update_with_uid=True)) as server:
        report = await sync(db, server)
    assert report.failed == 0  # type: ignore[attr-defined]
    assert [w for w in report.warnings if "could not be fetched" in w] == []  # type: ignore[attr-defined]
    assert len(await db.fetch("SELECT id FROM mail_archive")) == 3


async def test_a_body_sent_as_a_quoted_string_is_archived(db: Database) -> None:
    body = b'Subject: tiny "quoted" \\ body'
    async with open_scripted_imap([*messages([1]), ScriptedMessage(2, body)],
                                  faults=Faults(quoted_body_uids={2})) as server:
        assert await runs(db, server, 1) == []
    assert await failures(db) == {}
    raws = {bytes(r["raw"]) for r in await db.fetch("SELECT raw FROM mail_archive")}
    assert body in raws


async def test_an_error_text_with_a_nul_is_still_recorded(db: Database) -> None:
    # Postgres refuses NUL in text: the state's write failed (and was only
    # logged), so the run's error never reached `mailbox list` or the API.
    async with open_scripted_imap(messages([1]), faults=Faults(
            examine_refusal="Mailbox\x00 is locked\x07 by another session")) as server:
        errors = await runs(db, server, 1)
    assert len(errors) == 1
    st = await state(db)
    assert st.last_error is not None and "Mailbox\\x00 is locked\\x07 by" in st.last_error
    assert st.last_run_finished_at is not None


async def test_sizes_stated_wrong_never_make_the_client_hold_more_than_a_batch(
        db: Database) -> None:
    # Found by the importer audit: the probe said 1 byte for each of 40
    # messages of 3 MiB, sent in descending order: one FETCH for all 40,
    # the whole batch held (client RSS 212 -> 348 MiB). Here 12 of 1 MiB
    # and batches of 4 MiB: at most 4 MiB wait for the first UID, the rest
    # comes in smaller windows, run after run.
    body = b"Subject: big\r\n\r\n" + b"x" * (1 << 20)
    msgs = [ScriptedMessage(uid, body + str(uid).encode()) for uid in range(1, 13)]
    async with open_scripted_imap(msgs, faults=Faults(probe_size=1,
                                                      descending_fetch=True)) as server:
        errors = await runs(db, server, 1, batch_bytes=4 << 20)
        assert len(errors) == 1 and "RFC822.SIZEs were wrong" in errors[0], errors
        for _ in range(10):
            if (await state(db)).last_synced_uid == 12:
                break
            await runs(db, server, 1, batch_bytes=4 << 20)
    assert [uid for _, uid in await locations(db)] == list(range(1, 13))
    assert await failures(db) == {}


# -- what the database refuses --------------------------------------------

REFUSE_POISON = """
    CREATE FUNCTION test_refuse_poison() RETURNS trigger LANGUAGE plpgsql AS $$
    BEGIN
        IF position('poison' IN convert_from(NEW.raw, 'UTF8')) > 0 THEN
            RAISE EXCEPTION 'poison refused' USING ERRCODE = 'check_violation';
        END IF;
        RETURN NEW;
    END $$;
    CREATE TRIGGER test_refuse_poison BEFORE INSERT ON mail_archive
        FOR EACH ROW EXECUTE FUNCTION test_refuse_poison();"""


async def test_a_message_the_database_refuses_fails_alone(db: Database) -> None:
    """A trigger stands for any refusal of one message's data by Postgres
    (a CHECK, a value out of range). Before, the run failed at that UID,
    every run: the mailbox imported nothing after it, ever. Now the message
    is a recorded failure, retried on later runs, and the rest goes on, with
    two imports in flight and the notifications still in UID order."""
    await db.execute(REFUSE_POISON)
    msgs = messages(list(range(1, 13)))
    for uid in (3, 4, 9):
        msgs[uid - 1] = ScriptedMessage(uid, message(uid, " poison"))
    async with open_scripted_imap(msgs) as server, record_imports(db.dsn) as rec:
        with trio.fail_after(30):
            report = await sync(db, server)
        assert report.max_in_flight == 2  # type: ignore[attr-defined]
        expected = [1, 2, 5, 6, 7, 8, 10, 11, 12]
        assert [uid for _, uid in await locations(db)] == expected
        recorded = await failures(db)
        assert list(recorded) == [3, 4, 9]
        assert all(attempts == 1 and "database refused the message" in error
                   and "poison refused" in error and "23514" in error
                   for attempts, error in recorded.values()), recorded
        assert (await state(db)).last_synced_uid == 12
        await rec.wait_for_imported(count=len(expected))
        await rec.wait_for(count=3, event="failed")
        assert [(e.event, e.uid) for e in rec.events if e.event in ("imported", "failed")] \
            == [("failed" if uid in (3, 4, 9) else "imported", uid) for uid in range(1, 13)]

        assert await runs(db, server, 1) == []  # retried, refused again
        assert {uid: a for uid, (a, _) in (await failures(db)).items()} == {3: 2, 4: 2, 9: 2}
        await db.execute("DROP TRIGGER test_refuse_poison ON mail_archive")
        assert await runs(db, server, 1) == []
    assert await failures(db) == {}
    assert [uid for _, uid in await locations(db)] == list(range(1, 13))


@pytest.mark.parametrize("batch_messages", [5, 6])
async def test_a_refusal_settled_at_the_end_of_a_batch_does_not_stop_the_next(
        db: Database, batch_messages: int) -> None:
    # The refused message was the one before last of a batch, settled
    # after the last was sent: the next batch must follow the last, not it.
    await db.execute(REFUSE_POISON)
    msgs = messages(list(range(1, 16)))
    poison = {batch_messages - 1, 2 * batch_messages - 1}
    for uid in poison:
        msgs[uid - 1] = ScriptedMessage(uid, message(uid, " poison"))
    async with open_scripted_imap(msgs) as server:
        with trio.fail_after(30):
            report = await sync(db, server, batch_messages=batch_messages)
    assert report.max_in_flight == 2  # type: ignore[attr-defined]
    assert sorted(await failures(db)) == sorted(poison)
    assert [uid for _, uid in await locations(db)] == \
        [uid for uid in range(1, 16) if uid not in poison]
    assert (await state(db)).last_synced_uid == 15


async def test_a_message_the_database_refuses_fails_alone_in_an_unstable_pass(
        db: Database) -> None:
    await db.execute(REFUSE_POISON)
    msgs = messages([1, 2, 3])
    msgs[1] = ScriptedMessage(2, message(2, " poison"))
    async with open_scripted_imap(msgs, faults=Faults(uidvalidity=0)) as server:
        report = await sync(db, server)
    assert report.failed == 1  # type: ignore[attr-defined]
    assert any("could not be archived" in w and "poison refused" in w
               for w in report.warnings), report.warnings  # type: ignore[attr-defined]
    assert len(await db.fetch("SELECT id FROM mail_archive")) == 2
