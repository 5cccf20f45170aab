"""The archive: once per tenant and content hash, atomically with its index job."""

from __future__ import annotations

import pytest
import trio

from nexarch_events.aio import Database
from nexarch_events.errors import DatabaseError, InvalidJobError
from nexarch_events.mail.archive import MAX_MESSAGE_BYTES, Archive, Location
from nexarch_events.queue.jobs import Queue

MSG = b"From: a@example.org\r\nMessage-ID: <same@x>\r\nSubject: hi\r\n\r\nbody one\r\n"
OTHER_BODY = MSG.replace(b"body one", b"body two")


async def count(db: Database, table: str) -> int:
    queries = {"archive": "SELECT count(*) FROM mail_archive",
               "jobs": "SELECT count(*) FROM mail_index_jobs",
               "locations": "SELECT count(*) FROM mail_archive_locations"}
    return int(await db.fetchval(queries[table]))


async def test_store_archives_once_and_enqueues_one_index_job(db: Database) -> None:
    archive = Archive(db)
    first = await archive.store("acme", MSG)
    assert first.created and first.job_id is not None
    again = await archive.store("acme", MSG)
    assert (again.archive_id, again.created, again.job_id) == (first.archive_id, False, None)
    assert await count(db, "archive") == 1 and await count(db, "jobs") == 1
    job = await Queue(db).status(first.job_id)
    assert (job.job_type, job.tenant_slug, job.message_id) == ("index", "acme",
                                                               str(first.archive_id))


async def test_bodies_are_stored_with_lz4_where_the_server_has_it(db: Database) -> None:
    # Migration 0015: lz4 costs markedly less Postgres CPU per archived body
    # than pglz. A server built without lz4 (the README's embedded one is)
    # keeps pglz: each server checks its own branch, none skips.
    has_lz4 = await db.fetchval(
        "SELECT 'lz4' = ANY (enumvals) FROM pg_settings WHERE name = 'default_toast_compression'")
    body = b"".join(b"line %d of a long message body\r\n" % n for n in range(2000))
    stored = await Archive(db).store("acme", MSG.replace(b"body one\r\n", body))
    compression = await db.fetchval(
        "SELECT pg_column_compression(raw) FROM mail_archive WHERE id = $1", stored.archive_id)
    assert compression == ("lz4" if has_lz4 else "pglz")


async def test_same_message_id_different_bytes_are_two_messages(db: Database) -> None:
    archive = Archive(db)
    a = await archive.store("acme", MSG)
    b = await archive.store("acme", OTHER_BODY)
    assert a.archive_id != b.archive_id and a.created and b.created


async def test_same_bytes_in_three_folders_is_one_message_three_locations(db: Database) -> None:
    archive = Archive(db)
    results = [await archive.store("acme", MSG, Location(box, 7, uid))
               for box, uid in [("INBOX", 1), ("[Gmail]/All Mail", 40), ("Important", 3)]]
    assert len({r.archive_id for r in results}) == 1
    assert [r.created for r in results] == [True, False, False]
    assert all(r.location_added for r in results)
    seen = await archive.locations("acme", results[0].archive_id)
    assert {(s.mailbox, s.uidvalidity, s.uid) for s in seen} == {
        ("INBOX", 7, 1), ("[Gmail]/All Mail", 7, 40), ("Important", 7, 3)}
    again = await archive.store("acme", MSG, Location("INBOX", 7, 1))
    assert not again.location_added
    assert await count(db, "jobs") == 1


async def test_tenants_are_apart(db: Database) -> None:
    archive = Archive(db)
    a = await archive.store("tenant-a", MSG)
    b = await archive.store("tenant-b", MSG)
    assert a.archive_id != b.archive_id and a.created and b.created
    assert set(await archive.load([("tenant-a", b.archive_id)])) == set()
    loaded = await archive.load([("tenant-b", b.archive_id)])
    assert loaded[b.archive_id].raw == MSG
    # A location can only point at a message of its own tenant (composite FK).
    with pytest.raises(DatabaseError) as info:
        await db.execute("INSERT INTO mail_archive_locations (archive_id, tenant_slug, mailbox, "
                         "uidvalidity, uid) VALUES ($1, 'tenant-a', 'INBOX', 1, 1)",
                         b.archive_id)
    assert info.value.sqlstate == "23503"


async def test_archive_and_job_are_one_transaction(db: Database) -> None:
    # Make the job insert fail: neither the message nor the job may remain.
    await db.execute("""
        CREATE FUNCTION refuse() RETURNS trigger LANGUAGE plpgsql AS
        $$ BEGIN RAISE EXCEPTION 'queue refuses'; END $$;
        CREATE TRIGGER refuse BEFORE INSERT ON mail_index_jobs
            FOR EACH ROW EXECUTE FUNCTION refuse();""")
    with pytest.raises(DatabaseError, match="queue refuses"):
        await Archive(db).store("acme", MSG, Location("INBOX", 1, 1))
    assert await count(db, "archive") == 0 and await count(db, "locations") == 0


async def test_concurrent_stores_of_the_same_bytes(db: Database) -> None:
    archive = Archive(db)
    results = []

    async def store(uid: int) -> None:
        results.append(await archive.store("acme", MSG, Location("INBOX", 1, uid)))

    async with trio.open_nursery() as nursery:
        for uid in range(1, 21):
            nursery.start_soon(store, uid)
    assert len({r.archive_id for r in results}) == 1
    assert sum(r.created for r in results) == 1
    assert await count(db, "archive") == 1 and await count(db, "jobs") == 1
    assert await count(db, "locations") == 20


async def test_delete_enqueues_the_index_removal(db: Database) -> None:
    archive = Archive(db)
    stored = await archive.store("acme", MSG, Location("INBOX", 1, 1))
    assert await archive.delete("tenant-b", stored.archive_id) is None
    job_id = await archive.delete("acme", stored.archive_id)
    assert job_id is not None
    job = await Queue(db).status(job_id)
    assert (job.job_type, job.message_id) == ("delete", str(stored.archive_id))
    assert await count(db, "archive") == 0 and await count(db, "locations") == 0


@pytest.mark.parametrize(("tenant", "raw", "location", "message"), [
    ("acme", b"", None, "empty"),
    ("Acme", MSG, None, "tenant slug"),
    ("acme", "text, not bytes", None, "must be bytes"),
    ("acme", MSG, ("", 1, 1), "mailbox name"),
    ("acme", MSG, ("INBOX", 1, 0), "UID 0"),
    ("acme", MSG, ("INBOX", 2**32, 1), "UIDVALIDITY"),
])
async def test_bad_input_is_refused_and_writes_nothing(
        db: Database, tenant: str, raw: bytes, location: tuple[str, int, int] | None,
        message: str) -> None:
    with pytest.raises(InvalidJobError, match=message):
        await Archive(db).store(tenant, raw, Location(*location) if location else None)
    assert await count(db, "archive") == 0


async def test_oversized_message_is_refused(db: Database) -> None:
    with pytest.raises(InvalidJobError, match=str(MAX_MESSAGE_BYTES)):
        await Archive(db).store("acme", b"x" * (MAX_MESSAGE_BYTES + 1))
