"""A lookup of one message's locations must read that message's few
locations, not its mailbox's or its tenant's: on real Postgres, through the
deployed statements and the plans they keep for the session. Counted are
index entries of mail_archive_locations read by one call, in a transaction
of its own (pg_stat_get_xact_tuples_returned), so nothing is timed.

With the tenant (and mailbox) in the same WHERE as the message's id, the
planner chose the primary key's (tenant_slug, mailbox) range, filtered by
archive_id, and kept that plan:
- an import of a message already archived (Gmail's "All Mail" after INBOX,
  a copy in a second folder, every message of a resync after UIDVALIDITY
  changed) read its mailbox's every location: the n-th read n, so a resync
  of a large folder was quadratic;
- the legal-hold check of an erasure or a retention pass read the tenant's
  every location per batch, or the held mailbox's per message;
- the API's message view, its archive listing and an erasure's mailbox list
  read the tenant's every location per call.
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable

import pytest

from nexarch_events.aio import Connection, Database
from nexarch_events.db import sqlfiles
from nexarch_events.importer.state import StateStore
from nexarch_events.lifecycle.holds import Holds, held_in
from tests.support.backends import open_backend
from tests.support.reads import entries_read

TENANT = "acme"
LOCATIONS = "mail_archive_locations"
COUNT = 300
# One import reads the message's few locations, the primary key's conflict
# probe and the sync state: a handful of entries, whatever COUNT is.
ENTRIES_PER_IMPORT = 20


def raw(n: int) -> bytes:
    return (f"From: a{n}@example.org\r\nSubject: cost {n}\r\n"
            f"Message-ID: <cost-{n}@example.org>\r\n\r\nbody {n}\r\n").encode()


async def import_all(conn: Connection, mailbox: str, uidvalidity: int) -> list[int]:
    """Import messages 1..COUNT as UIDs 1..COUNT, each in a transaction of
    its own; the index entries of mail_archive_locations each one read."""
    store = StateStore(conn)
    await store.get_or_create(TENANT, mailbox)
    await store.begin(TENANT, mailbox, uidvalidity, None, COUNT)
    reads = []
    for uid in range(1, COUNT + 1):
        async with entries_read(conn, LOCATIONS) as read:
            await store.import_message(TENANT, mailbox, uidvalidity, uid, "new", raw(uid))
        reads.append(read[0])
    return reads


@pytest.mark.parametrize(("mailbox", "uidvalidity"), [
    ("all-mail", 9),   # the same messages in a second folder
    ("inbox", 8),      # a resync of the first after UIDVALIDITY changed
])
async def test_importing_archived_messages_reads_a_few_entries_each(
        db: Database, mailbox: str, uidvalidity: int) -> None:
    # As autovacuum may leave it: analyzed while empty (a fresh install; the
    # test databases' template). The planner then took the table for a page
    # of nothing and read every location per import until the next ANALYZE
    # (CI under load, when autovacuum had got to the template: 428 entries
    # read; migration 0047). Autovacuum is kept out so that the plan is
    # made from these statistics.
    await db.execute("ALTER TABLE mail_archive_locations SET (autovacuum_enabled = false)")
    await db.execute("VACUUM ANALYZE mail_archive_locations")
    conn = await Connection.open(db.dsn)
    try:
        await import_all(conn, "inbox", 7)
        reads = await import_all(conn, mailbox, uidvalidity)
    finally:
        await conn.aclose()
    assert max(reads) <= ENTRIES_PER_IMPORT, reads[-5:]
    # Counted once for the folder each was new to (the check's purpose); a
    # re-map under a new UIDVALIDITY adds none.
    state = await StateStore(db).get(TENANT, mailbox)
    assert (state.imported_total, state.last_synced_uid, state.last_uidvalidity) == (
        COUNT, COUNT, uidvalidity)


@pytest.fixture
async def located(db: Database) -> list[int]:
    """20,000 messages of the tenant, each in INBOX and in "Legal" (a table
    large enough that reading it whole is not the cheap plan); their ids."""
    await db.execute("""
        WITH a AS (
            INSERT INTO mail_archive (tenant_slug, sha256, size_bytes, raw)
            SELECT $1, sha256(convert_to('m' || n, 'UTF8')), length('m' || n),
                   convert_to('m' || n, 'UTF8')
              FROM generate_series(1, 20000) AS n
            RETURNING id)
        INSERT INTO mail_archive_locations (archive_id, tenant_slug, mailbox, uidvalidity, uid)
        SELECT a.id, $1, box, 1, a.id FROM a, unnest(ARRAY['INBOX', 'Legal']) AS box""",
                     TENANT)
    await db.execute("ANALYZE mail_archive_locations")  # as autovacuum would
    return [r["id"] for r in await db.fetch(
        "SELECT id FROM mail_archive WHERE tenant_slug = $1 ORDER BY id", TENANT)]


async def calls_read_a_few_entries(db: Database, ids: list[int], call: Callable[
        [Connection, list[int]], Awaitable[object]]) -> None:
    """``call`` on batches of 100 ids, past asyncpg's five custom plans into
    the generic one: each reads at most a few entries per message."""
    conn = await Connection.open(db.dsn)
    try:
        for batch in range(8):
            chunk = ids[batch * 100:(batch + 1) * 100]
            async with entries_read(conn, LOCATIONS) as read:
                await call(conn, chunk)
            assert read[0] <= 3 * len(chunk), (batch, read[0])
    finally:
        await conn.aclose()


async def test_the_hold_check_of_a_batch_reads_the_batch_s_locations(
        db: Database, located: list[int]) -> None:
    async with open_backend("postgres", db) as backend:
        hold = await Holds(db, backend).add(TENANT, "mailbox", mailbox="Legal",
                                            reason="case 7", actor="counsel")

    async def check(conn: Connection, chunk: list[int]) -> None:
        assert await held_in(conn, TENANT, chunk) == {i: {hold.id} for i in chunk}

    await calls_read_a_few_entries(db, located, check)


BOTH = ["INBOX", "Legal"]


async def test_a_message_s_locations_are_read_alone(db: Database, located: list[int]) -> None:
    # Archive.locations, behind the API's message view: one id per call.
    query = sqlfiles.queries("archive.sql")["locations"]

    async def check(conn: Connection, chunk: list[int]) -> None:
        for archive_id in chunk:
            rows = await conn.fetch(query, TENANT, archive_id)
            assert [r["mailbox"] for r in rows] == BOTH

    await calls_read_a_few_entries(db, located, check)


async def test_the_mailboxes_of_a_page_are_read_from_its_messages(
        db: Database, located: list[int]) -> None:
    # The API's archive listing.
    query = sqlfiles.queries("importer.sql")["archive_mailboxes"]

    async def check(conn: Connection, chunk: list[int]) -> None:
        rows = await conn.fetch(query, TENANT, chunk)
        assert {r["archive_id"]: r["mailboxes"] for r in rows} == {i: BOTH for i in chunk}

    await calls_read_a_few_entries(db, located, check)


async def test_the_mailboxes_of_an_erasure_are_read_from_its_messages(
        db: Database, located: list[int]) -> None:
    query = sqlfiles.queries("lifecycle.sql")["mailboxes_of"]

    async def check(conn: Connection, chunk: list[int]) -> None:
        assert [r["mailbox"] for r in await conn.fetch(query, TENANT, chunk)] == BOTH

    await calls_read_a_few_entries(db, located, check)


ITEMS = "mail_legal_hold_items"


async def query_holds(db: Database, located: list[int]) -> tuple[int, int]:
    """A query hold that recorded 12,500 of the messages and one that
    recorded 10 (inserted as Holds.add records them, without a search)."""
    ids = []
    for count in (12_500, 10):
        hold_id = await db.fetchval(
            "INSERT INTO mail_legal_holds (tenant_slug, scope, query, reason, created_by)"
            " VALUES ($1, 'query', 'invoice', 'case', 'counsel') RETURNING id", TENANT)
        await db.execute(
            "INSERT INTO mail_legal_hold_items (hold_id, tenant_slug, archive_id)"
            " SELECT $1, $2, unnest($3::bigint[])", hold_id, TENANT, located[-count:])
        ids.append(hold_id)
    await db.execute(f"ANALYZE {ITEMS}")  # as autovacuum would
    return ids[0], ids[1]


async def test_the_hold_check_of_a_batch_reads_the_batch_s_query_hold_items(
        db: Database, located: list[int]) -> None:
    big, small = await query_holds(db, located)
    conn = await Connection.open(db.dsn)
    try:
        for start in (0, 7_400, 19_900, 100, 19_800, 7_500, 200, 19_700):
            chunk = located[start:start + 100]
            async with entries_read(conn, ITEMS) as read:
                held = await held_in(conn, TENANT, chunk)
            assert held == {i: {big} | ({small} if i in located[-10:] else set())
                            for i in chunk if i in located[-12_500:]}
            # A key lookup per message and hold, not every recorded item.
            assert read[0] <= 3 * len(chunk), (start, read[0])
    finally:
        await conn.aclose()


async def test_listing_holds_counts_each_hold_s_own_items(
        db: Database, located: list[int]) -> None:
    big, small = await query_holds(db, located)
    list_holds = sqlfiles.queries("lifecycle.sql")["hold_list"]
    conn = await Connection.open(db.dsn)
    try:
        for _ in range(8):  # past the custom plans
            async with entries_read(conn, ITEMS) as read:
                rows = await conn.fetch(list_holds, TENANT, False)
            assert {r["id"]: r["recorded"] for r in rows} == {big: 12_500, small: 10}
            assert read[0] <= 12_510 + 20, read[0]
    finally:
        await conn.aclose()
