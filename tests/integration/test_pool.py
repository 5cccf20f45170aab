"""The trio-side connection pool (aio/pg.py ``Database``) against a real
Postgres: bounded size, connections reused, and never reused when they
cannot be trusted (cancelled mid-statement, killed, left in a transaction)."""

from __future__ import annotations

import secrets

import pytest
import trio

from nexarch_events.aio import Database
from nexarch_events.errors import DatabaseUnavailable


def app_name() -> str:
    return f"pooltest-{secrets.token_hex(4)}"


async def backends(db: Database, name: str) -> list[int]:
    rows = await db.fetch("SELECT pid FROM pg_stat_activity WHERE application_name = $1 "
                          "ORDER BY pid", name)
    return [row["pid"] for row in rows]


async def test_calls_reuse_one_connection_and_never_exceed_max_size(
        aio_loop: None, database_url: str, db: Database) -> None:
    name = app_name()
    async with Database.open(database_url, min_size=1, max_size=2,
                             application_name=name) as pool:
        first = {await pool.fetchval("SELECT pg_backend_pid()") for _ in range(20)}
        assert len(first) == 1  # one caller at a time: one connection, reused
        peak = 0

        async def busy() -> None:
            await pool.execute("SELECT pg_sleep(0.3)")

        async def watch() -> None:
            nonlocal peak
            for _ in range(20):
                active = await db.fetchval(
                    "SELECT count(*) FROM pg_stat_activity WHERE application_name = $1 "
                    "AND query LIKE 'SELECT pg_sleep%' AND state = 'active'", name)
                peak = max(peak, active)
                await trio.sleep(0.05)

        async with trio.open_nursery() as nursery:
            for _ in range(6):
                nursery.start_soon(busy)
            nursery.start_soon(watch)
        assert peak == 2
        assert len(await backends(db, name)) == 2
    assert await backends(db, name) == []  # closed with the pool


async def test_a_call_cancelled_mid_statement_does_not_hand_its_connection_on(
        aio_loop: None, database_url: str, db: Database) -> None:
    name = app_name()
    async with Database.open(database_url, max_size=1, application_name=name) as pool:
        before = await pool.fetchval("SELECT pg_backend_pid()")
        with trio.move_on_after(0.3):
            await pool.execute("SELECT pg_sleep(30)")
        # The next call runs at once on a fresh session, not behind the
        # cancelled statement on the old one.
        with trio.fail_after(10):
            after = await pool.fetchval("SELECT pg_backend_pid()")
        assert after != before
        assert await pool.fetchval("SELECT 41 + 1") == 42


async def test_a_killed_connection_fails_one_call_and_is_replaced(
        aio_loop: None, database_url: str, db: Database) -> None:
    name = app_name()
    async with Database.open(database_url, max_size=1, application_name=name) as pool:
        victim = await pool.fetchval("SELECT pg_backend_pid()")
        assert await db.fetchval("SELECT pg_terminate_backend($1)", victim)
        await trio.sleep(0.2)
        try:
            # The pool may notice the closed socket before the call; if not,
            # this one call fails as unavailable.
            await pool.fetchval("SELECT 1")
        except DatabaseUnavailable:
            pass
        assert await pool.fetchval("SELECT pg_backend_pid()") != victim
        assert await backends(db, name) != [victim]


async def test_a_transaction_left_open_is_rolled_back_before_reuse(
        aio_loop: None, database_url: str, db: Database) -> None:
    async with Database.open(database_url, max_size=1) as pool:
        await pool.execute("CREATE TABLE pool_probe (n int)")
        async with pool.acquire() as conn:
            await conn.execute("BEGIN")
            await conn.execute("INSERT INTO pool_probe VALUES (1)")
            pid = await conn.fetchval("SELECT pg_backend_pid()")
        # Same session, but the insert was never committed.
        assert await pool.fetchval("SELECT pg_backend_pid()") == pid
        assert await pool.fetchval("SELECT count(*) FROM pool_probe") == 0


async def test_bad_sizes_are_refused(aio_loop: None, database_url: str) -> None:
    with pytest.raises(ValueError, match="pool sizes"):
        async with Database.open(database_url, min_size=3, max_size=2):
            pass


async def test_a_server_that_does_not_answer_the_connect_is_an_outage(aio_loop: None) -> None:
    """asyncpg's connect timeout is the same TimeoutError as a statement's:
    it was sorted as a statement that ran too long (charged to the job that
    met it), where it is the server out of reach (a review audit)."""
    import socket

    from nexarch_events.aio import Connection
    from nexarch_events.errors import DatabaseTimedOut, is_outage

    with socket.socket() as silent:  # accepts (the kernel does), never answers
        silent.bind(("127.0.0.1", 0))
        silent.listen(8)
        port = silent.getsockname()[1]
        with pytest.raises(DatabaseUnavailable) as caught:
            await Connection.open(f"postgresql://u@127.0.0.1:{port}/db?sslmode=disable",
                                  connect_timeout=0.5)
    assert not isinstance(caught.value, DatabaseTimedOut)
    assert is_outage(caught.value)
