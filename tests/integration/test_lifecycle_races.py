"""An import that adds a location in a held mailbox races an erasure or a
retention batch of the same message: on real Postgres, with the importer's
own statement (mail_archive_store) in a transaction of its own.

Found by an audit: the erasure checked the holds on what was committed,
then its DELETE waited for the import, and deleted the message with its
new location in the held mailbox (the location's insert locks the message
row only KEY SHARE, which that read does not see). Now the erasure locks
its messages first (archived_of, FOR UPDATE): it waits for the import and
then sees the location; an import that comes after the lock waits for the
erasure and archives the message anew."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta

import pytest
import trio

from nexarch_events.aio import Connection, Database
from nexarch_events.index.postgres import PostgresIndex
from nexarch_events.lifecycle import audit
from nexarch_events.lifecycle.erasure import Eraser, HeldByLegalHold
from nexarch_events.lifecycle.holds import Holds
from nexarch_events.lifecycle.retention import Retention, RetentionPolicy
from nexarch_events.mail.archive import Archive, Location
from nexarch_events.queue.jobs import Queue
from nexarch_events.settings import QueueSettings, RetentionSettings, Settings
from tests.integration.test_lifecycle import Env, _run_workers, mail

RAW = (b"From: a@example.org\r\nTo: b@example.org\r\nSubject: x\r\n"
       b"Date: Mon, 01 Jan 2001 10:00:00 +0000\r\nMessage-ID: <race@x>\r\n\r\nbody\r\n")
STORE = "SELECT * FROM mail_archive_store('acme', $1, $2, $3, 'Held', 9, 42)"


async def waiting_for_a_lock(db: Database) -> None:
    """Until some session of this database waits for a row or transaction lock."""
    with trio.fail_after(30):
        while not await db.fetchval(
                "SELECT count(*) FROM pg_locks WHERE NOT granted"
                " AND locktype IN ('transactionid', 'tuple')"
                " AND database IS DISTINCT FROM 0"):
            await trio.sleep(0.02)


@pytest.mark.parametrize("how", ["erase", "retention"])
async def test_a_location_in_a_held_mailbox_added_during_an_erasure_keeps_the_message(
        db: Database, how: str) -> None:
    backend = PostgresIndex(db)
    stored = await Archive(db).store("acme", RAW, Location("Unheld", 1, 1))
    hold = await Holds(db, backend).add("acme", "mailbox", mailbox="Held", reason="case 1",
                                        actor="legal")
    row = await db.fetchrow("SELECT sha256, size_bytes, raw FROM mail_archive WHERE id = $1",
                            stored.archive_id)
    result: dict[str, object] = {}

    async def erase() -> None:
        if how == "erase":
            # An erasure by id refuses held mail (a retention pass skips it).
            with pytest.raises(HeldByLegalHold) as refused:
                await Eraser(db, backend).erase("acme", [stored.archive_id], actor="op")
            result["skipped"] = set(refused.value.held)
        else:
            done = await Retention(db, backend, RetentionSettings()).pass_tenant(
                RetentionPolicy("acme", 30, "database"), datetime.now(UTC) + timedelta(days=1))
            result["skipped"] = set(done.skipped_held)

    importer = await Connection.open(db.dsn)
    try:
        async with trio.open_nursery() as nursery:
            async with importer.transaction():
                imported = await importer.fetchrow(STORE, row["sha256"], row["size_bytes"],
                                                   row["raw"])
                assert (imported["archive_id"], imported["location_added"]) == (
                    stored.archive_id, True)
                nursery.start_soon(erase)
                await waiting_for_a_lock(db)  # the erasure, behind the import
    finally:
        await importer.aclose()
    assert result["skipped"] == {stored.archive_id}
    assert await db.fetchval("SELECT count(*) FROM mail_archive_locations"
                             " WHERE archive_id = $1", stored.archive_id) == 2
    assert hold.active


@pytest.mark.parametrize("arrives", ["after_the_delete", "between_the_lock_and_the_delete"])
async def test_an_import_behind_an_erasure_archives_the_message_anew(
        db: Database, arrives: str) -> None:
    """An import of a message an erasure has locked (archived_of, FOR
    UPDATE) waits for the erasure and archives the message anew, whether it
    comes after the erasure's DELETE or between its lock and its DELETE.
    In the second case its lookup found the locked row, then its
    location's foreign key failed with 23503 once the DELETE committed: a
    "rejected" error for a race, the message left unarchived until a later
    run (a race audit; migration 0036)."""
    stored = await Archive(db).store("acme", RAW, Location("Unheld", 1, 1))
    row = await db.fetchrow("SELECT sha256, size_bytes, raw FROM mail_archive WHERE id = $1",
                            stored.archive_id)
    imported: dict[str, object] = {}

    async def store() -> None:
        imported.update(await db.fetchrow(STORE, row["sha256"], row["size_bytes"], row["raw"]))

    async def delete() -> None:
        await eraser.execute("DELETE FROM mail_archive WHERE id = $1", stored.archive_id)

    eraser = await Connection.open(db.dsn)
    try:
        async with trio.open_nursery() as nursery:
            async with eraser.transaction():
                # What an erasure does first (lifecycle.sql, archived_of), then its delete.
                assert await eraser.fetchval(
                    "SELECT id FROM mail_archive WHERE tenant_slug = 'acme'"
                    " AND id = ANY($1::bigint[]) FOR UPDATE", [stored.archive_id])
                if arrives == "after_the_delete":
                    await delete()
                nursery.start_soon(store)
                await waiting_for_a_lock(db)
                if arrives == "between_the_lock_and_the_delete":
                    await delete()
    finally:
        await eraser.aclose()
    # Not a foreign-key error: the message is archived again, with its location.
    assert imported["created"] is True and imported["archive_id"] != stored.archive_id
    assert await db.fetchval("SELECT mailbox FROM mail_archive_locations") == "Held"


OLD = "Mon, 01 Jan 2001 00:00:00 +0000"


async def test_mail_not_indexed_yet_is_kept_by_a_query_hold_that_may_find_it(
        db: Database, fast_settings: QueueSettings) -> None:
    """A query hold finds mail through the index: a message archived after
    the hold and not indexed yet was erased by retention although the
    hold's query matches it (a race audit). While the index may not have
    it, a query hold keeps it."""
    backend = PostgresIndex(db)
    env = Env(db, backend, Queue(db, fast_settings))
    first = (await env.archive.store("acme", mail(1, "lawsuitword", date=OLD))).archive_id
    unrelated = (await env.archive.store("acme", mail(2, "holiday", date=OLD))).archive_id
    await _run_workers(env, Settings(queue=fast_settings))
    await env.holds.add("acme", "query", query="lawsuitword", reason="case", actor="legal")
    # No worker runs: its index job waits.
    second = (await env.archive.store("acme", mail(3, "lawsuitword", date=OLD))).archive_id
    retention = Retention(db, backend, RetentionSettings(days=(("acme", 30),)))
    [result] = await retention.run_pass(datetime(2025, 1, 1, tzinfo=UTC)) or []
    assert result.erased == (unrelated,)
    assert set(result.skipped_held) == {first, second}
    with pytest.raises(HeldByLegalHold):
        await env.eraser.erase("acme", [second], actor="ops")
    assert sorted(await env.archive.ids("acme")) == [first, second]


async def test_a_query_hold_added_while_an_erasure_runs_is_evaluated_before_it_commits(
        db: Database, fast_settings: QueueSettings, monkeypatch: pytest.MonkeyPatch) -> None:
    """The erasure evaluated the query holds before its transaction; a hold
    added after that (and committed before the erasure's lock) did not
    protect the mail it finds (a race audit)."""
    from nexarch_events.lifecycle.holds import Holds

    backend = PostgresIndex(db)
    env = Env(db, backend, Queue(db, fast_settings))
    # Not indexed yet: the hold, added next, records nothing ...
    target = (await env.archive.store("acme", mail(1, "lawsuitword", date=OLD))).archive_id
    real = Holds.query_held
    added: list[int] = []

    async def then_a_hold_is_added(self: Holds, tenant_slug: str, ids: object) -> object:
        evaluated = await real(self, tenant_slug, ids)  # type: ignore[arg-type]
        hold = await Holds(db, backend).add("acme", "query", query="lawsuitword",
                                            reason="case", actor="legal")
        assert hold.recorded == 0
        added.append(hold.id)
        # ... and the message is indexed before the erasure's transaction.
        await _run_workers(env, Settings(queue=fast_settings))
        return evaluated

    monkeypatch.setattr(Holds, "query_held", then_a_hold_is_added)
    with pytest.raises(HeldByLegalHold) as refused:
        await env.eraser.erase("acme", [target], actor="ops")
    assert refused.value.held == {target: (added[0],)}
    assert await env.archive.ids("acme") == [target]


async def test_a_query_hold_records_only_mail_still_archived(
        db: Database, fast_settings: QueueSettings, monkeypatch: pytest.MonkeyPatch) -> None:
    """A hold whose search found a message that an erasure removed before
    the hold's lock recorded it, and reported it as kept (a race audit)."""
    from nexarch_events.lifecycle import holds as holds_module

    backend = PostgresIndex(db)
    env = Env(db, backend, Queue(db, fast_settings))
    kept = (await env.archive.store("acme", mail(1, "lawsuitword", date=OLD))).archive_id
    gone = (await env.archive.store("acme", mail(2, "lawsuitword", date=OLD))).archive_id
    await _run_workers(env, Settings(queue=fast_settings))
    real = holds_module.find_ids

    async def then_one_is_erased(*args: object) -> set[int]:
        found = await real(*args)  # type: ignore[arg-type]
        await env.eraser.erase("acme", [gone], actor="ops")
        return found

    monkeypatch.setattr(holds_module, "find_ids", then_one_is_erased)
    hold = await env.holds.add("acme", "query", query="lawsuitword", reason="case",
                               actor="legal")
    assert hold.recorded == 1
    assert await db.fetchval("SELECT array_agg(archive_id) FROM mail_legal_hold_items") == [kept]
    [entry] = [e for e in await audit.entries(db, tenant_slug="acme")
               if e.action == audit.AuditAction.HOLD_ADD]
    assert entry.target["ids"] == [kept] and entry.count == 1


async def test_mail_whose_indexing_failed_stays_erasable_under_a_query_hold(
        db: Database, fast_settings: QueueSettings) -> None:
    """Kept while its index job is to run, but not for ever: mail whose
    indexing failed for good (bad input) will never be indexed, and an
    erasure refused for ever is no answer (a review audit). A query hold
    does not see it, as it never did."""
    backend = PostgresIndex(db)
    env = Env(db, backend, Queue(db, fast_settings))
    await env.holds.add("acme", "query", query="lawsuitword", reason="case", actor="legal")
    stored = await env.archive.store("acme", mail(1, "holiday", date=OLD))
    await db.execute("UPDATE mail_index_jobs SET status = 'failed', finished_at = now() "
                     "WHERE id = $1", stored.job_id)
    result = await env.eraser.erase("acme", [stored.archive_id], actor="ops")
    assert result.erased == (stored.archive_id,)
