"""A statement's asyncpg coroutine is driven by the calling trio task
(aio/pg.py ``_drive``), not by an asyncio Task: what a Task guaranteed must
still hold. Cancellation follows asyncio's rules (one CancelledError, the
coroutine's clean-up runs, the caller gets trio's Cancelled), bodies larger
than a socket buffer go through, and the server's errors and timeouts come out
translated, leaving the connection usable."""

from __future__ import annotations

import asyncio
import os

import pytest
import trio

from nexarch_events.aio import Connection, Database, open_loop
from nexarch_events.aio.pg import _cancel_pending, _drive
from nexarch_events.errors import DatabaseError, DatabaseTimedOut

# -- the driver on its own, with asyncio futures -------------------------------


async def test_a_coroutine_gets_the_results_of_the_futures_it_awaits() -> None:
    async with open_loop():
        loop = asyncio.get_running_loop()

        async def three_steps() -> list[object]:
            first: asyncio.Future[int] = loop.create_future()
            loop.call_later(0.01, first.set_result, 1)
            failing: asyncio.Future[int] = loop.create_future()
            loop.call_soon(failing.set_exception, KeyError("from a future"))
            await asyncio.sleep(0)  # a bare yield: one pass of the loop
            try:
                await failing
            except KeyError as exc:
                caught = str(exc)
            return [await first, caught, await asyncio.sleep(0.01, "slept")]

        assert await _drive(three_steps()) == [1, "'from a future'", "slept"]


async def test_a_trio_cancel_cancels_the_awaited_future_once_and_waits_for_the_clean_up(
        ) -> None:
    async with open_loop():
        loop = asyncio.get_running_loop()
        seen: list[str] = []

        async def cleans_up() -> None:
            try:
                await loop.create_future()  # never done
            except asyncio.CancelledError:
                seen.append("cancelled")
                # The clean-up awaits too; a second cancel would cut it short.
                await asyncio.sleep(0.05)
                seen.append("cleaned up")
                raise

        with trio.move_on_after(0.05) as scope:
            await _drive(cleans_up())
        assert scope.cancelled_caught  # trio's Cancelled, not asyncio's
        assert seen == ["cancelled", "cleaned up"]


async def test_a_coroutine_that_absorbs_the_cancel_returns_its_value() -> None:
    async with open_loop():
        loop = asyncio.get_running_loop()

        async def absorbs() -> str:
            try:
                await loop.create_future()
            except asyncio.CancelledError:
                return "absorbed"
            return "not reached"

        results: list[str] = []
        with trio.fail_after(5):
            async with trio.open_nursery() as nursery:
                with trio.CancelScope() as scope:
                    nursery.start_soon(cancel_soon, scope)
                    results.append(await _drive(absorbs()))  # as asyncio returns it
                    await trio.lowlevel.checkpoint()  # the cancel is delivered here
                    results.append("not reached")
        assert scope.cancelled_caught
        assert results == ["absorbed"]


async def cancel_soon(scope: trio.CancelScope) -> None:
    await trio.sleep(0.02)
    scope.cancel()


async def test_a_cancel_after_the_future_finished_is_thrown_at_the_next_step() -> None:
    # The future is done but its wake-up has not run yet when trio asks to
    # cancel: it cannot be cancelled, so (like an asyncio Task) the driver
    # throws CancelledError into the coroutine at its next step, instead of
    # letting it go on to wait for something else.
    async with open_loop():
        loop = asyncio.get_running_loop()
        first: asyncio.Future[None] = loop.create_future()
        steps: list[str] = []

        async def two_waits() -> None:
            await first
            steps.append("first done")
            await loop.create_future()  # never done: only a cancel ends it
            steps.append("not reached")

        async def finish_and_cancel(scope: trio.CancelScope) -> None:
            await trio.sleep(0.02)
            first.set_result(None)  # its callbacks are only scheduled ...
            scope.cancel()          # ... when the cancel arrives

        with trio.fail_after(5):
            async with trio.open_nursery() as nursery:
                with trio.CancelScope() as scope:
                    nursery.start_soon(finish_and_cancel, scope)
                    await _drive(two_waits())
        assert scope.cancelled_caught
        assert steps == []


async def test_a_cancel_during_a_bare_yield_is_thrown_at_the_next_step() -> None:
    # A bare yield (asyncio.sleep(0)) awaits no future of the coroutine's:
    # cancelling the driver's own placeholder for it lost the cancel, and
    # the coroutine ran on to its end in a cancelled scope (a review).
    async with open_loop():
        loop = asyncio.get_running_loop()
        seen: list[str] = []

        async def bare_yield(scope: trio.CancelScope) -> str:
            loop.call_soon(scope.cancel)  # lands while the driver waits
            await asyncio.sleep(0)
            seen.append("after the bare yield")
            await asyncio.sleep(3)
            seen.append("slept")
            return "value"

        with trio.fail_after(2):
            with trio.CancelScope() as scope:
                await _drive(bare_yield(scope))
        assert scope.cancelled_caught
        assert seen == []


async def test_asyncio_cancelled_error_without_a_trio_cancel_is_passed_on() -> None:
    async with open_loop():
        loop = asyncio.get_running_loop()

        async def cancelled_inside() -> None:
            fut: asyncio.Future[None] = loop.create_future()
            loop.call_soon(fut.cancel)
            await fut

        with pytest.raises(asyncio.CancelledError):
            await _drive(cancelled_inside())


# -- real statements -----------------------------------------------------------


async def test_a_body_larger_than_the_socket_buffers_goes_both_ways(
        aio_loop: None, db: Database) -> None:
    body = os.urandom(8 * 1024 * 1024)
    assert await db.fetchval("SELECT $1::bytea", body) == body
    assert await db.fetchval("SELECT md5($1::bytea)", body) is not None


async def test_a_cancelled_statement_stops_on_the_server_and_the_connection_goes_on(
        aio_loop: None, database_url: str, db: Database) -> None:
    conn = await Connection.open(database_url, application_name="drive-cancel")
    try:
        pid = await conn.fetchval("SELECT pg_backend_pid()")
        with trio.fail_after(10):
            with trio.move_on_after(0.3) as scope:
                await conn.execute("SELECT pg_sleep(30)")
        assert scope.cancelled_caught
        # asyncpg sent a cancel request: the server is not running it any more.
        with trio.fail_after(10):
            while await db.fetchval(
                    "SELECT count(*) FROM pg_stat_activity WHERE pid = $1 AND state = 'active'",
                    pid):
                await trio.sleep(0.05)
        assert await conn.fetchval("SELECT 41 + 1") == 42
        assert await conn.fetchval("SELECT pg_backend_pid()") == pid
    finally:
        await conn.aclose()


async def test_server_errors_and_timeouts_are_translated_and_leave_the_connection_usable(
        aio_loop: None, database_url: str) -> None:
    conn = await Connection.open(database_url, command_timeout=0.3)
    try:
        assert not _cancel_pending(conn._target)  # statements take the driven path
        with pytest.raises(DatabaseError) as raised:
            await conn.execute("SELEC 1")
        assert raised.value.sqlstate == "42601"
        with trio.fail_after(10), pytest.raises(DatabaseTimedOut):
            await conn.execute("SELECT pg_sleep(5)")
        # The call after the timeout waited for asyncpg's cancel in a Task.
        assert await conn.fetchval("SELECT 'still here'") == "still here"
        assert not _cancel_pending(conn._target)
    finally:
        await conn.aclose()


async def test_the_command_timeout_is_kept_on_trios_clock_and_arms_no_asyncio_timer(
        aio_loop: None, database_url: str) -> None:
    """asyncpg's own command timeout armed an asyncio timer per statement:
    one more pass of trio-asyncio's loop each, and the cancelled timers
    stayed in the loop's heap until their deadline (60 s of them by
    default). The timeout is trio's now; it still ends a statement that
    runs too long, on a pool as on a connection, and a BEGIN/COMMIT too."""
    import trio_asyncio

    loop = trio_asyncio.current_loop.get()
    async with Database.open(database_url, max_size=1, command_timeout=60.0) as pool:
        conn = await Connection.open(database_url, command_timeout=60.0)
        try:
            timers = len(loop._timers)  # trio-asyncio's heap: what grew before
            for n in range(300):
                assert await pool.fetchval("SELECT $1::int", n) == n
                assert await conn.fetchval("SELECT $1::int", n) == n
                async with conn.transaction():
                    await conn.execute("SELECT 1")
            # A few belong to asyncpg's statement cache (one per prepared
            # statement); with asyncpg's timeout there were 1,500 more.
            assert len(loop._timers) - timers < 20
        finally:
            await conn.aclose()
    async with Database.open(database_url, max_size=1, command_timeout=0.3) as pool:
        pid = await pool.fetchval("SELECT pg_backend_pid()")
        with trio.fail_after(10), pytest.raises(DatabaseTimedOut) as raised:
            await pool.execute("SELECT pg_sleep(5)")
        assert "NEXARCH_COMMAND_TIMEOUT" in str(raised.value)
        assert "0.3 s" in str(raised.value)
        # Cancelled on the server, not left running behind the pool's back.
        assert await pool.fetchval("SELECT 'next'") == "next"
        conn = await Connection.open(database_url, command_timeout=10.0)
        try:
            with trio.fail_after(10):
                while await conn.fetchval(
                        "SELECT count(*) FROM pg_stat_activity WHERE pid = $1 "
                        "AND query LIKE 'SELECT pg_sleep%' AND state = 'active'", pid):
                    await trio.sleep(0.05)
        finally:
            await conn.aclose()
        # A statement inside a transaction is bounded too, and the block rolls back.
        async with pool.acquire() as lent:
            with trio.fail_after(10), pytest.raises(DatabaseTimedOut):
                async with lent.transaction():
                    await lent.execute("SELECT pg_sleep(5)")


async def test_a_call_in_a_cancelled_scope_sends_nothing_and_keeps_its_connection(
        aio_loop: None, database_url: str, db: Database) -> None:
    await db.execute("CREATE TABLE drive_probe (n int)")
    async with Database.open(database_url, max_size=1) as pool:
        pid = await pool.fetchval("SELECT pg_backend_pid()")
        conn = await Connection.open(database_url)
        try:
            with trio.CancelScope() as scope:
                scope.cancel()
                await pool.execute("INSERT INTO drive_probe VALUES (1)")
            assert scope.cancelled_caught
            with trio.CancelScope() as scope:
                scope.cancel()
                await conn.execute("INSERT INTO drive_probe VALUES (2)")
            assert scope.cancelled_caught
            assert await db.fetchval("SELECT count(*) FROM drive_probe") == 0
            # Nothing was cancelled on the server: the pooled session goes on.
            assert await pool.fetchval("SELECT pg_backend_pid()") == pid
            assert await conn.fetchval("SELECT 1") == 1
        finally:
            await conn.aclose()


async def test_a_statement_that_fails_before_it_is_sent_still_lets_other_tasks_run(
        aio_loop: None, database_url: str, db: Database) -> None:
    # asyncpg refuses an argument it cannot encode (for a statement it has
    # prepared already) without awaiting anything: such a call must still
    # be a schedule point, or a loop of them starves every other task (a
    # review: 0 runs of another task in 500 calls).
    conn = await Connection.open(database_url)
    try:
        assert await conn.fetchval("SELECT $1::int", 1) == 1
        for executor in (conn, db):
            await executor.fetchval("SELECT $1::int", 1)
            ticks = 0

            async def other() -> None:
                nonlocal ticks
                while True:
                    ticks += 1
                    await trio.lowlevel.checkpoint()

            async with trio.open_nursery() as nursery:
                nursery.start_soon(other)
                await trio.lowlevel.checkpoint()
                start = ticks
                for _ in range(50):
                    with pytest.raises(DatabaseError):
                        await executor.fetchval("SELECT $1::int", "not a number")
                assert ticks - start >= 25
                nursery.cancel_scope.cancel()
    finally:
        await conn.aclose()
