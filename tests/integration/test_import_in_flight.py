"""Two imports of one mailbox in flight (importer/pipeline.py, migration
0026), on real Postgres: the order is kept by the database, so the
watermark only moves over a contiguous committed prefix and notifications
ascend, whatever the two connections do."""

from __future__ import annotations

from collections.abc import AsyncIterator

import pytest
import trio

from nexarch_events.aio import Connection, Database
from nexarch_events.errors import DatabaseError, DatabaseRejected, DatabaseUnavailable
from nexarch_events.importer.pipeline import open_in_flight
from nexarch_events.importer.state import StateStore
from nexarch_events.importer.sync import ImportLimits, run_sync
from nexarch_events.mail.archive import Archived
from nexarch_events.testing import ImportRecorder, record_imports
from tests.integration.test_importer_traps import config_for, messages
from tests.support.imap_script import open_scripted_imap

TENANT = "acme"
NAME = "inbox"
UIDVALIDITY = 7


def raw(n: int) -> bytes:
    return (f"From: a{n}@example.org\r\nSubject: in flight {n}\r\n"
            f"Message-ID: <flight-{n}@example.org>\r\n\r\nbody {n}\r\n").encode()


@pytest.fixture
async def conns(db: Database) -> AsyncIterator[tuple[Connection, Connection]]:
    """Two connections of their own, and a mailbox at UIDVALIDITY 7, watermark 0."""
    store = StateStore(db)
    await store.get_or_create(TENANT, NAME)
    await store.begin(TENANT, NAME, UIDVALIDITY, None, None)
    first = await Connection.open(db.dsn)
    second = await Connection.open(db.dsn)
    try:
        yield first, second
    finally:
        await first.aclose()
        await second.aclose()


async def watermark(db: Database) -> int:
    return (await StateStore(db).get(TENANT, NAME)).last_synced_uid


async def archived(db: Database) -> int:
    return int(await db.fetchval("SELECT count(*) FROM mail_archive WHERE tenant_slug = $1",
                                 TENANT))


async def imported_uids(rec: ImportRecorder) -> list[int | None]:
    await trio.sleep(0.2)  # a notification sent by mistake would arrive by now
    return [e.uid for e in rec.select(event=None)]


async def wait_until_waiting(db: Database, pid: int) -> None:
    """Until backend ``pid`` waits for a lock (what the statement under test does)."""
    with trio.fail_after(10):
        while await db.fetchval("SELECT wait_event_type FROM pg_stat_activity WHERE pid = $1",
                                pid) != "Lock":
            await trio.sleep(0.02)


TURN = "(hashtext($1 || '/' || $2)::bigint << 32) | $3::bigint"


async def test_the_next_import_waits_for_the_one_before_it_and_commits_after_it(
        db: Database, conns: tuple[Connection, Connection]) -> None:
    """UID 1 has begun (it holds its turn) but not reached the watermark
    yet: UID 2 does its archive work, then waits instead of being refused,
    and commits after UID 1."""
    first, second = conns
    done: list[Archived] = []
    second_pid = await second.fetchval("SELECT pg_backend_pid()")

    async def second_import() -> None:
        done.append(await StateStore(second).import_message(
            TENANT, NAME, UIDVALIDITY, 2, "new", raw(2), after=1))

    async with record_imports(db.dsn) as rec, trio.open_nursery() as nursery:
        await first.execute("BEGIN")
        await first.execute(f"SELECT pg_advisory_xact_lock({TURN})", TENANT, NAME, 1)
        nursery.start_soon(second_import)
        await wait_until_waiting(db, second_pid)
        await StateStore(first).import_message(TENANT, NAME, UIDVALIDITY, 1, "new", raw(1),
                                               after=0)
        assert done == [] and await watermark(db) == 0
        await first.execute("COMMIT")
        with trio.fail_after(10):
            while not done:
                await trio.sleep(0.01)
        await rec.wait_for_imported(count=2)
    assert await watermark(db) == 2 and await archived(db) == 2
    assert await imported_uids(rec) == [1, 2]


async def test_an_import_whose_predecessor_rolls_back_is_refused_and_stores_nothing(
        db: Database, conns: tuple[Connection, Connection]) -> None:
    first, second = conns
    errors: list[DatabaseError] = []
    second_pid = await second.fetchval("SELECT pg_backend_pid()")

    async def second_import() -> None:
        try:
            await StateStore(second).import_message(TENANT, NAME, UIDVALIDITY, 2, "new",
                                                    raw(2), after=1)
        except DatabaseError as exc:
            errors.append(exc)

    async with record_imports(db.dsn) as rec, trio.open_nursery() as nursery:
        await first.execute("BEGIN")
        await StateStore(first).import_message(TENANT, NAME, UIDVALIDITY, 1, "new", raw(1),
                                               after=0)
        nursery.start_soon(second_import)
        await wait_until_waiting(db, second_pid)
        await first.execute("ROLLBACK")
    assert [e.sqlstate for e in errors] == ["NXI02"]
    assert "is not next: the watermark is 0, not 1" in str(errors[0])
    assert await watermark(db) == 0 and await archived(db) == 0
    assert await imported_uids(rec) == []


async def test_an_import_that_overtook_the_one_before_it_is_refused(
        db: Database, conns: tuple[Connection, Connection]) -> None:
    """UID 1 was never sent: UID 2 cannot advance from it."""
    with pytest.raises(DatabaseError) as caught:
        await StateStore(conns[1]).import_message(TENANT, NAME, UIDVALIDITY, 2, "new", raw(2),
                                                  after=1)
    assert caught.value.sqlstate == "NXI02"
    assert await watermark(db) == 0 and await archived(db) == 0


@pytest.mark.parametrize(("mode", "uid", "after"), [("new", 2, 2), ("new", 2, 5),
                                                    ("new", 2, -1), ("recovered", 2, 1)])
async def test_after_is_checked(db: Database, conns: tuple[Connection, Connection], mode: str,
                                uid: int, after: int) -> None:
    with pytest.raises(DatabaseRejected, match="an import in flight needs mode new"):
        await StateStore(conns[0]).import_message(TENANT, NAME, UIDVALIDITY, uid, mode,
                                                  raw(uid), after=after)
    assert await archived(db) == 0


class Delayed(StateStore):
    """A real store whose import of one UID is sent late, as a busy client
    or network might: the import after it gets to the database first."""

    def __init__(self, conn: Connection, uid: int, delay: float) -> None:
        super().__init__(conn)
        self.uid, self.delay = uid, delay

    async def import_message(self, *args: object, **kwargs: object) -> Archived:
        if args[3] == self.uid:
            await trio.sleep(self.delay)
        return await super().import_message(*args, **kwargs)  # type: ignore[arg-type]


async def test_an_overtaking_import_is_sent_again_and_results_come_in_order(
        db: Database, conns: tuple[Connection, Connection]) -> None:
    first, second = conns
    settled: list[int] = []
    async with record_imports(db.dsn) as rec:
        async with open_in_flight([Delayed(first, 1, 0.5), StateStore(second)], tenant=TENANT,
                                  mailbox=NAME, uidvalidity=UIDVALIDITY,
                                  on_settled=lambda uid, _: settled.append(uid)) as imports:
            for uid in range(1, 6):
                await imports.submit(uid, uid - 1, raw(uid))
        await rec.wait_for_imported(count=5)
    assert settled == [1, 2, 3, 4, 5]
    assert imports.sent_again >= 1 and imports.most == 2
    assert await imported_uids(rec) == [1, 2, 3, 4, 5]
    assert await watermark(db) == 5 and await archived(db) == 5


async def test_a_lost_connection_stops_every_import_after_it(
        db: Database, conns: tuple[Connection, Connection]) -> None:
    """UID 1's connection is cut while it waits; UID 2 (in flight on the other
    connection, its archive work done) must not commit past it. The error
    comes out as itself, not inside an ExceptionGroup."""
    first, second = conns
    first_pid = await first.fetchval("SELECT pg_backend_pid()")
    second_pid = await second.fetchval("SELECT pg_backend_pid()")
    holder = await Connection.open(db.dsn)
    try:
        await holder.execute(f"SELECT pg_advisory_lock({TURN})", TENANT, NAME, 1)
        async with record_imports(db.dsn) as rec:
            with pytest.raises(DatabaseUnavailable):
                async with open_in_flight([StateStore(first), StateStore(second)],
                                          tenant=TENANT, mailbox=NAME, uidvalidity=UIDVALIDITY,
                                          on_settled=lambda uid, _: None) as imports:
                    await imports.submit(1, 0, raw(1))
                    await imports.submit(2, 1, raw(2))
                    await wait_until_waiting(db, first_pid)
                    await wait_until_waiting(db, second_pid)
                    await holder.execute("SELECT pg_terminate_backend($1)", first_pid)
                    await holder.execute(f"SELECT pg_advisory_unlock({TURN})", TENANT, NAME, 1)
            assert await imported_uids(rec) == []
    finally:
        await holder.aclose()
    assert await watermark(db) == 0 and await archived(db) == 0


async def test_a_first_sync_puts_two_imports_in_flight_and_keeps_the_order(
        db: Database) -> None:
    """Through run_sync, from a URL (a spare opened for the run) and from a
    pool (one of its connections borrowed)."""
    async with open_scripted_imap(messages(list(range(1, 121)))) as server, \
            record_imports(db.dsn) as rec:
        report = await run_sync(db.dsn, config_for(server), "secret", imap_timeout=5)
        assert report.max_in_flight == 2 and report.imported == 120
        await rec.wait_for_imported(count=120)
        server.add_message(raw(121))
        server.add_message(raw(122))
        server.add_message(raw(123))
        server.add_message(raw(124))
        report = await run_sync(db, config_for(server), "secret", imap_timeout=5)
        assert report.max_in_flight == 2 and report.imported == 4
        await rec.wait_for_imported(count=124)
    rec.assert_in_uid_order()
    assert [e.uid for e in rec.select()] == list(range(1, 125))
    assert await watermark(db) == 124 and await archived(db) == 124


async def test_without_a_free_pool_connection_imports_go_one_at_a_time(
        aio_loop: None, database_url: str) -> None:
    """A pool with no connection to spare (the run holds the only one) is
    never waited for: the run imports one at a time, and completely."""
    async with Database.open(database_url, max_size=1) as pool, \
            open_scripted_imap(messages(list(range(1, 21)))) as server:
        report = await run_sync(pool, config_for(server), "secret", imap_timeout=5)
        assert report.imported == 20 and report.max_in_flight == 1
        assert (await StateStore(pool).get(TENANT, NAME)).last_synced_uid == 20


async def test_in_flight_one_means_one_at_a_time(db: Database) -> None:
    async with open_scripted_imap(messages(list(range(1, 21)))) as server:
        report = await run_sync(db.dsn, config_for(server), "secret", imap_timeout=5,
                                limits=ImportLimits(in_flight=1))
    assert report.imported == 20 and report.max_in_flight == 1
    with pytest.raises(ValueError, match="in_flight must be 1 or 2"):
        ImportLimits(in_flight=3)
