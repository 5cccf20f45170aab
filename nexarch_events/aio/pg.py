"""Postgres for trio: asyncpg, run through trio-asyncio.

This module and its siblings in ``aio/`` are the only places that know asyncio
is underneath. Every public coroutine here is a trio coroutine; each database
call is exactly one asyncpg coroutine (the pool lives on the trio side), and a
statement's coroutine is driven by the calling trio task itself (``_drive``),
the rest (connect, close, transactions, LISTEN) run as asyncio tasks through
``aio_as_trio``. asyncpg's exceptions are translated here, once, into
``nexarch_events.errors``. The command timeout is a trio deadline around each
call (``_bounded``), not asyncpg's asyncio timer, as the IMAP side's are.

Cancellation: cancelling a trio call cancels what asyncpg awaits, as
cancelling an asyncio task would; the connection is then closed instead of
going back to the pool.
"""

from __future__ import annotations

import asyncio
import ipaddress
import logging
import os
from collections.abc import AsyncIterator, Awaitable, Callable, Coroutine, Mapping, Sequence
from contextlib import asynccontextmanager
from typing import Any, ParamSpec, TypeVar
from urllib.parse import parse_qs, unquote, urlsplit

import asyncpg
import trio
import trio_asyncio  # type: ignore[import-untyped]

from ..errors import (
    DatabaseError,
    DatabasePoolerError,
    DatabasePrivilegeError,
    DatabaseRejected,
    DatabaseTimedOut,
    DatabaseTransient,
    DatabaseUnavailable,
    DatabaseUrlError,
)

log = logging.getLogger(__name__)

P = ParamSpec("P")
T = TypeVar("T")

#: A result row: read by column name (``row["id"]``) or position.
Row = Mapping[str, Any]

#: How each SQLSTATE is handled: the one place where database errors are
#: sorted (docs/database-errors.md has the same table for operators). Keys
#: are exact codes or class prefixes; the longest matching key wins; a code
#: that matches none is a bug in our code or schema (plain DatabaseError:
#: a worker process stops with exit 70 and the traceback).
SQLSTATE_KINDS: Mapping[str, type[DatabaseError]] = {
    # The session is gone or cannot be had: reconnect, with backoff.
    "08": DatabaseUnavailable,      # connection exception
    "57P": DatabaseUnavailable,     # admin/crash shutdown, cannot connect now,
                                    # database dropped, idle session timeout
    "53300": DatabaseUnavailable,   # too many connections
    "25P03": DatabaseUnavailable,   # idle-in-transaction timeout (ends the session)
    "25P04": DatabaseUnavailable,   # transaction timeout (ends the session)
    "28": DatabaseUnavailable,      # authorization: credentials rotated under us
    "3D000": DatabaseUnavailable,   # database does not exist (yet, or any more)
    # The statement failed, the session is fine: back off and retry.
    "57014": DatabaseTransient,     # query canceled: statement_timeout, pg_cancel_backend
    "57000": DatabaseTransient,     # operator intervention
    "55P03": DatabaseTransient,     # lock not available: lock_timeout, NOWAIT
    "55006": DatabaseTransient,     # object in use
    "40": DatabaseTransient,        # serialization failure 40001, deadlock 40P01,
                                    # statement completion unknown 40003
    "40002": DatabaseRejected,      # ... but a deferred constraint is the data's fault
    "25006": DatabaseUnavailable,   # read-only transaction: a standby, a failover,
                                    # default_transaction_read_only: a new session
                                    # may reach the new primary
    "53": DatabaseTransient,        # insufficient resources: disk full 53100,
                                    # out of memory 53200, configuration limit 53400
    "54000": DatabaseTransient,     # program limit: the NOTIFY queue is full
    "58": DatabaseTransient,        # system error: I/O error 58030
    "72000": DatabaseTransient,     # snapshot too old
    # The operator's to fix (exit 2): a privilege the role lacks.
    "42501": DatabasePrivilegeError,  # insufficient privilege
    # The data of this statement was refused: permanent for that item.
    "22": DatabaseRejected,         # data exception
    "23": DatabaseRejected,         # integrity constraint violation
}


def error_class(sqlstate: str) -> type[DatabaseError]:
    """Our error class for a SQLSTATE (see SQLSTATE_KINDS)."""
    for length in range(len(sqlstate), 0, -1):
        kind = SQLSTATE_KINDS.get(sqlstate[:length])
        if kind is not None:
            return kind
    return DatabaseError


def _log_orphan_error(loop: object, context: dict[str, Any]) -> None:
    """asyncio reports errors nobody awaits here: e.g. a connection lost
    during asyncpg's TLS negotiation of a connect attempt that was already
    abandoned ("Future exception was never retrieved"). trio-asyncio's
    default re-raises them into its nursery, which ends the whole program:
    one orphaned future would take a worker process down. Every call that
    matters is awaited and raises where it is awaited; these are logged."""
    exc = context.get("exception")
    log.warning("asyncio reported an error outside any awaited call: %s%s",
                context.get("message", "unhandled error"),
                f": {type(exc).__name__}: {exc}" if exc is not None else "")


@asynccontextmanager
async def open_loop() -> AsyncIterator[Any]:
    """The asyncio loop every trio program using this package runs inside.

    ``async with open_loop(): ...`` around the code (or use :func:`run`).
    """
    async with trio_asyncio.open_loop() as loop:
        loop.set_exception_handler(_log_orphan_error)
        yield loop


def run(async_fn: Callable[..., Awaitable[T]], *args: Any) -> T:
    """``trio.run`` with the asyncio loop this package needs already open."""

    async def with_loop() -> T:
        async with open_loop():
            return await async_fn(*args)

    return trio.run(with_loop)


def translate(exc: BaseException) -> DatabaseError | None:
    """Our error for an asyncpg/OS error, or None if it is not a database error."""
    if isinstance(exc, asyncpg.PostgresError):
        state = getattr(exc, "sqlstate", None) or ""
        message = f"{type(exc).__name__} (SQLSTATE {state or 'none'}): {exc}"
        if state in ("26000", "42P05") and "__asyncpg_stmt_" in str(exc):
            # Our cached prepared statement is gone from the server session,
            # or another client's of the same name is there: a pooler in
            # transaction mode hands each transaction another one.
            return DatabasePoolerError(
                "the database URL goes through a pooler in transaction mode (PgBouncer?): "
                "set NEXARCH_LISTEN_DATABASE_URL to a direct connection (not through the "
                "pooler) for LISTEN, which also turns prepared-statement caching off "
                f"({message.split(':')[0]})",
                sqlstate=state)
        return error_class(state)(message, sqlstate=state or None,
                                  constraint=getattr(exc, "constraint_name", None))
    if isinstance(exc, asyncpg.exceptions.ClientConfigurationError):
        # The URL's options (sslmode=bogus, a missing sslrootcert): the
        # operator's to fix, exit 2, not a bug's 70.
        return DatabaseUrlError(f"the database URL's options are refused: {exc}")
    if isinstance(exc, asyncpg.exceptions.ConnectionDoesNotExistError):
        return DatabaseUnavailable(f"connection lost: {exc}")
    if isinstance(exc, asyncpg.InternalClientError):
        # The server ended the session (restart, pg_terminate_backend) and
        # asyncpg read the FATAL error before the close: the connection is
        # half-broken ("cannot switch to state ..."). Same as a lost one.
        return DatabaseUnavailable(f"connection unusable: {exc}")
    if isinstance(exc, asyncpg.InterfaceError) and "closed" in str(exc):
        return DatabaseUnavailable(f"connection closed: {exc}")
    if isinstance(exc, asyncio.TimeoutError):
        return DatabaseTimedOut(f"cannot reach Postgres: {type(exc).__name__}: {exc}")
    if isinstance(exc, (OSError, EOFError)):
        return DatabaseUnavailable(f"cannot reach Postgres: {type(exc).__name__}: {exc}")
    return None


async def _translated(call: Awaitable[T]) -> T:
    """``call``'s result; asyncpg's and the socket's errors as ours."""
    try:
        return await call
    except Exception as exc:
        ours = translate(exc)
        if ours is None:
            raise
        raise ours from exc


async def _hop(fn: Callable[P, Awaitable[T]], *args: P.args, **kwargs: P.kwargs) -> T:
    """``fn`` as an asyncio Task (``aio_as_trio``)."""
    result: T = await _translated(trio_asyncio.aio_as_trio(fn)(*args, **kwargs))
    return result


class _TimedConnection(asyncpg.Connection):
    """asyncpg's connection, carrying its command timeout for trio's side.

    asyncpg would arm an asyncio timer for every statement (its
    ``command_timeout``). Under trio-asyncio that timer costs a pass of the
    loop to arm, one of four per statement, and once cancelled it stays in
    the loop's heap until its deadline passes (trio-asyncio never prunes
    cancelled timers): at 1,000 statements a second and a 60 s timeout,
    60,000 dead timers (bench/README.md, "The stack's own price"). So our
    connections are opened without asyncpg's timeout, and ``_bounded``
    applies this one with a trio deadline instead; when it expires the
    statement's future is cancelled, and asyncpg asks the server to cancel
    the statement, as its own timeout did."""

    __slots__ = ("nx_command_timeout",)
    nx_command_timeout: float | None


def _timeout_of(target: asyncpg.Connection) -> float | None:
    timeout: float | None = getattr(target, "nx_command_timeout", None)
    return timeout


async def _bounded(target: asyncpg.Connection, call: Awaitable[T]) -> T:
    """``call`` (one asyncpg call on ``target``), raising DatabaseTimedOut
    if it takes longer than ``target``'s command timeout."""
    timeout = _timeout_of(target)
    if timeout is None:
        return await call
    with trio.move_on_after(timeout):
        return await call
    raise DatabaseTimedOut(f"Postgres did not answer within the command timeout "
                           f"({timeout:g} s, NEXARCH_COMMAND_TIMEOUT): a half-open "
                           f"connection, or a statement that runs too long")


async def _call(target: asyncpg.Connection, fn: Callable[P, Awaitable[T]],
                *args: P.args, **kwargs: P.kwargs) -> T:
    """``_hop`` of one of ``target``'s own calls (a transaction's BEGIN,
    LISTEN), bounded by ``target``'s command timeout."""
    return await _bounded(target, _hop(fn, *args, **kwargs))


async def _statement(target: asyncpg.Connection, method: str, *args: object) -> Any:
    """One asyncpg statement method (fetch, fetchrow, fetchval, execute) of
    ``target``, driven from the calling trio task (``_drive``); errors
    translated; bounded by the connection's command timeout (``_bounded``).
    While an earlier statement's cancel is still pending on the connection
    (after a trio cancel or a command timeout), asyncpg first waits for it
    under ``asyncio.timeout``, which only works inside an asyncio Task: that
    one call goes through ``aio_as_trio``."""
    fn = getattr(target, method)
    call = _hop(fn, *args) if _cancel_pending(target) else _translated(_drive(fn(*args)))
    return await _bounded(target, call)


def _cancel_pending(target: asyncpg.Connection) -> bool:
    """asyncpg's protocol is still cancelling a statement (or cannot say:
    then assume it is, and take the Task's way, which is always right)."""
    is_cancelling = getattr(getattr(target, "_protocol", None), "_is_cancelling", None)
    return is_cancelling is None or bool(is_cancelling())


def _set_none(fut: asyncio.Future[None]) -> None:
    if not fut.done():
        fut.set_result(None)


async def _drive(coro: Coroutine[Any, Any, T]) -> T:
    """Run an asyncio coroutine to its end inside the calling trio task.

    What ``aio_as_trio`` does, without wrapping the coroutine in an asyncio
    Task: the coroutine's steps run right here, and the task sleeps (in
    trio) only while an asyncio future it awaits is pending; the future's
    done callback, run by trio-asyncio's loop, wakes it. A statement thus
    costs one pass of the loop (its reply) instead of three (the task's
    first step, its wake-up, its done callback): 0.05 ms less CPU per call,
    a quarter of the hop (bench/README.md, "The statement path").

    Cancellation keeps asyncio's rules, as the Task would: a trio cancel
    cancels the future awaited (or, if that is done already, throws
    CancelledError into the coroutine at its next step) once; the coroutine
    runs its own clean-up to the end, and if it ends in CancelledError the
    caller gets trio's Cancelled.
    """
    # Like the Task's first step, which never ran in a cancelled scope: a
    # statement is not even sent then.
    try:
        await trio.lowlevel.checkpoint_if_cancelled()
    except BaseException:
        coro.close()
        raise
    task = trio.lowlevel.current_task()
    raise_cancel: Callable[[], Any] | None = None
    must_cancel = False
    error: BaseException | None = None
    waited = False
    try:
        while True:
            if must_cancel:
                error, must_cancel = asyncio.CancelledError(), False
            try:
                yielded = coro.send(None) if error is None else coro.throw(error)
            except StopIteration as stop:
                result: T = stop.value
                return result
            except asyncio.CancelledError:
                if raise_cancel is not None:
                    raise_cancel()
                raise
            error = None
            bare = yielded is None
            if bare:
                # A bare yield (asyncio.sleep(0)): one pass of the loop.
                yielded = asyncio.get_running_loop().create_future()
                yielded.get_loop().call_soon(_set_none, yielded)
            elif getattr(yielded, "_asyncio_future_blocking", None) is None:
                error = RuntimeError(f"asyncio coroutine yielded {yielded!r}, not a future")
                continue
            fut: asyncio.Future[Any] = yielded
            fut._asyncio_future_blocking = False
            if fut.done():
                continue
            fut.add_done_callback(lambda _: trio.lowlevel.reschedule(task))

            def abort(raise_cancel_arg: Callable[[], Any], fut: asyncio.Future[Any] = fut,
                      bare: bool = bare) -> trio.lowlevel.Abort:
                nonlocal raise_cancel, must_cancel
                if raise_cancel is None:
                    raise_cancel = raise_cancel_arg
                    # A bare yield awaits no future of the coroutine's: the
                    # Task throws CancelledError at its next step (a review:
                    # cancelling our own placeholder lost the cancel).
                    must_cancel = True if bare else not fut.cancel()
                return trio.lowlevel.Abort.FAILED  # woken by the future, whatever it became

            waited = True
            await trio.lowlevel.wait_task_rescheduled(abort)
    finally:
        if not waited:
            # Ended (asyncpg raised, e.g. an argument it cannot encode or a
            # closed connection) before awaiting anything: still a schedule
            # point, as the Task's hop always was (a review: a loop of such
            # calls starved every other task).
            await trio.lowlevel.cancel_shielded_checkpoint()


class Executor:
    """fetch/fetchrow/fetchval/execute: a pool (Database) or one Connection."""

    async def fetch(self, query: str, *args: object) -> list[Row]:
        rows: list[Row] = await self._run("fetch", query, *args)
        return rows

    async def fetchrow(self, query: str, *args: object) -> Row | None:
        row: Row | None = await self._run("fetchrow", query, *args)
        return row

    async def fetchval(self, query: str, *args: object) -> Any:
        return await self._run("fetchval", query, *args)

    async def execute(self, query: str, *args: object) -> str:
        status: str = await self._run("execute", query, *args)
        return status

    async def _run(self, method: str, *args: object) -> Any:
        """One asyncpg ``Connection`` method call, in one hop."""
        raise NotImplementedError


class Connection(Executor):
    """One connection: from ``Database.acquire`` (returned to the pool when
    the block ends) or from ``Connection.open`` (owned by the caller, who
    closes it)."""

    def __init__(self, conn: asyncpg.Connection) -> None:
        self._target = conn

    async def _run(self, method: str, *args: object) -> Any:
        return await _statement(self._target, method, *args)

    async def execute_long(self, seconds: float, query: str, *args: object) -> str:
        """``execute`` bounded by ``seconds`` instead of the connection's
        command timeout: a migration's DDL over a large table."""
        status: str = await _hop(self._target.execute, query, *args, timeout=seconds)
        return status

    @classmethod
    async def open(cls, dsn: str, *, connect_timeout: float = 10.0,
                   command_timeout: float | None = 60.0,
                   application_name: str | None = None,
                   statement_cache_size: int = 100) -> Connection:
        """A dedicated connection, e.g. one per worker task: no pool
        acquire/release on its hot path. ``command_timeout`` bounds every
        statement on it (a half-open socket raises DatabaseUnavailable);
        ``application_name`` names it in pg_stat_activity;
        ``statement_cache_size=0`` behind a transaction pooler."""
        return cls(await _open_conn(dsn, connect_timeout, command_timeout=command_timeout,
                                    statement_cache_size=statement_cache_size,
                                    server_settings=_server_settings(application_name)))

    async def aclose(self) -> None:
        """Close politely, bounded; drop the socket if that does not finish."""
        with trio.move_on_after(2, shield=True) as scope:
            try:
                await _hop(self._target.close)
            except DatabaseError:
                pass
        if scope.cancelled_caught:
            self.abort()

    def abort(self) -> None:
        self._target.terminate()

    @asynccontextmanager
    async def transaction(self) -> AsyncIterator[Connection]:
        """A transaction: committed when the block ends, rolled back on error
        or cancellation (the rollback is shielded and bounded)."""
        tx = self._target.transaction()
        await _call(self._target, tx.start)
        try:
            yield self
        except BaseException:
            with trio.move_on_after(5, shield=True):
                await _hop(tx.rollback)
            raise
        await _call(self._target, tx.commit)


def tls_default(dsn: str, environ: Mapping[str, str] | None = None) -> dict[str, Any]:
    """What to pass asyncpg for TLS when the URL says nothing: ``ssl=True``
    (TLS required, certificate and host name verified against the system's
    trust store) for a server that is not on this machine. asyncpg's own
    default, "prefer", takes any certificate and falls back to plain text,
    so an attacker on the path could answer "no TLS" and read the password
    (a security audit). A URL with ``sslmode`` (or PGSSLMODE) decides for
    itself: ``sslmode=disable`` on a trusted private network, ``require``
    for TLS without verification, ``verify-full`` with ``sslrootcert``."""
    env = os.environ if environ is None else environ
    parts = urlsplit(dsn)
    query = parse_qs(parts.query)
    if "sslmode" in query or env.get("PGSSLMODE"):
        return {}
    hosts = [h for h in query.get("host", [])]
    netloc = parts.netloc.rpartition("@")[2]
    for host in netloc.split(","):
        if host.startswith("["):
            hosts.append(host[1:].partition("]")[0])
        elif host:
            hosts.append(unquote(host.rpartition(":")[0] if host.count(":") == 1 else host))
    if not hosts:
        hosts = [env.get("PGHOST", "")]
    return {} if all(_on_this_machine(h) for h in hosts) else {"ssl": True}


async def _open_conn(dsn: str, connect_timeout: float, *, command_timeout: float | None,
                     **options: Any) -> asyncpg.Connection:
    """A new connection within ``connect_timeout`` (asyncpg's own timeout;
    a second more on the trio side in case that one does not fire). Either
    way, no connection in time is DatabaseUnavailable, which every task
    backs off from, never a TooSlowError that ends the service. Its
    statements are bounded by ``command_timeout`` on trio's side
    (``_TimedConnection``), not by asyncpg's."""
    with trio.move_on_after(connect_timeout + 1):
        try:
            conn = await _hop(_connect, dsn, timeout=connect_timeout,
                              connection_class=_TimedConnection, **options)
            assert isinstance(conn, _TimedConnection)
            conn.nx_command_timeout = command_timeout
        except DatabaseTimedOut as exc:
            # asyncpg's connect timeout is the same TimeoutError as a
            # statement's: this one is the server out of reach, an outage
            # (errors.is_outage), not a statement that ran too long.
            raise DatabaseUnavailable(f"cannot reach Postgres: no connection within "
                                      f"{connect_timeout:g} s") from exc
        return conn
    raise DatabaseUnavailable(f"cannot reach Postgres: no connection within "
                              f"{connect_timeout + 1:g} s")


async def _connect(dsn: str, **options: Any) -> asyncpg.Connection:
    """asyncpg.connect, with TLS verified by default (``tls_default``)."""
    conn: asyncpg.Connection = await asyncpg.connect(dsn, **tls_default(dsn), **options)
    return conn


def _on_this_machine(host: str) -> bool:
    if not host or host.startswith("/") or host == "localhost":
        return True  # a Unix socket, or the loopback interface
    try:
        return ipaddress.ip_address(host).is_loopback
    except ValueError:
        return False


def _server_settings(application_name: str | None) -> dict[str, str] | None:
    # Postgres keeps the first 63 bytes (NAMEDATALEN); asyncpg would pass a
    # longer one through and the server cuts it mid-character.
    if application_name is None:
        return None
    return {"application_name": application_name.encode()[:63].decode(errors="ignore")}


class Database(Executor):
    """A pool of connections, kept on the trio side. Owned by whoever opened
    it (``Database.open``).

    Why not asyncpg's own pool: its acquire and release are asyncio work of
    their own (a shielded task per release, timeouts, a queue), which cost
    more CPU than the query itself for the one-row statements this service
    runs most (measured in bench/enqueue_bench.py: about 0.4 ms per call on
    a 2-core machine, against 0.15 ms for the trio->asyncio hop). Here a call
    takes an idle connection under a trio semaphore and makes exactly one hop:
    the statement itself.

    Pooled connections keep no session state (no SET, no LISTEN - the
    listener has its own connection), so a connection goes back as it is,
    after a ROLLBACK if a transaction was left open. One that broke, whose
    call was cancelled mid-statement, or that belongs to an expired
    generation (see ``_run``) is closed instead and replaced on a later call.
    What needs session state for a while (a session advisory lock) takes a
    ``session()``.
    """

    def __init__(self, dsn: str, *, max_size: int, connect: Callable[[], Awaitable[Any]],
                 session_connect: Callable[[], Awaitable[Any]] | None = None) -> None:
        self.dsn = dsn
        self._connect = connect
        self._session_connect = session_connect
        # Direct session connections are bounded like the pool's own.
        self._session_slots = trio.Semaphore(max_size)
        self._slots = trio.Semaphore(max_size)
        self._idle: list[tuple[int, asyncpg.Connection]] = []
        self._generation = 0
        self._closed = False

    @classmethod
    @asynccontextmanager
    async def open(cls, dsn: str, *, min_size: int = 1, max_size: int = 10,
                   connect_timeout: float = 10.0,
                   command_timeout: float | None = 60.0,
                   application_name: str | None = None,
                   statement_cache_size: int = 100,
                   session_dsn: str | None = None) -> AsyncIterator[Database]:
        """Open a pool; blocks until ``min_size`` connections are up.

        Connections that break (Postgres restarted, network cut) are replaced
        on a later call; the failing call raises DatabaseUnavailable.
        ``command_timeout`` bounds every statement, so a half-open connection
        (no FIN, no RST) raises DatabaseUnavailable too instead of hanging
        until the kernel gives up (minutes). When ``dsn`` is a transaction
        pooler: ``statement_cache_size=0``, and ``session_dsn`` the server
        itself, for ``session()``.
        """
        if not 0 <= min_size <= max_size or max_size < 1:
            raise ValueError(f"pool sizes must satisfy 0 <= min ({min_size}) <= max "
                             f"({max_size}) and max >= 1")

        def connector(url: str, cache: int, name: str | None) -> Callable[[], Awaitable[Any]]:
            async def connect() -> Any:
                return await _open_conn(url, connect_timeout, command_timeout=command_timeout,
                                        statement_cache_size=cache,
                                        server_settings=_server_settings(name))
            return connect

        connect = connector(dsn, statement_cache_size, application_name)
        db = cls(dsn, max_size=max_size, connect=connect, session_connect=None if (
            session_dsn is None) else connector(
                session_dsn, 100, application_name and f"{application_name}/session"))
        try:
            for _ in range(min_size):
                db._idle.append((db._generation, await connect()))
            yield db
        finally:
            db._closed = True
            idle, db._idle = db._idle, []
            with trio.move_on_after(5, shield=True):
                for _, conn in idle:
                    await _close_quietly(conn)
            for _, conn in idle:
                conn.terminate()  # no-op for the ones that closed

    async def _take(self, *, wait: bool = True,
                    statement_follows: bool = False) -> tuple[int, Any]:
        """A slot and a connection in it. ``wait=False``: raises
        trio.WouldBlock at once if every slot is taken.
        ``statement_follows``: a free slot is taken without a pass through
        trio's scheduler (Semaphore.acquire always makes one: 0.07 ms of CPU
        per call, bench/enqueue_bench.py), as the statement (``_drive``) is
        the call's schedule point; a call in a cancelled scope takes nothing."""
        if self._closed:
            raise DatabaseUnavailable("the connection pool is closed")
        if not wait:
            self._slots.acquire_nowait()
        elif statement_follows:
            await trio.lowlevel.checkpoint_if_cancelled()
            try:
                self._slots.acquire_nowait()
            except trio.WouldBlock:
                await self._slots.acquire()
        else:
            await self._slots.acquire()
        try:
            while self._idle:
                generation, conn = self._idle.pop()
                if generation == self._generation and not conn.is_closed():
                    return generation, conn
                conn.terminate()
            return self._generation, await self._connect()
        except BaseException:
            self._slots.release()
            raise

    async def _give(self, generation: int, conn: Any, *, reusable: bool) -> None:
        try:
            if (reusable and not self._closed and generation == self._generation
                    and not conn.is_closed()):
                if conn.is_in_transaction():
                    with trio.move_on_after(5, shield=True):
                        await _hop(conn.execute, "ROLLBACK")
                    reusable = not conn.is_in_transaction()
                if reusable:
                    self._idle.append((generation, conn))
                    return
            conn.terminate()
        except DatabaseError:
            conn.terminate()
        finally:
            self._slots.release()

    async def _run(self, method: str, *args: object) -> Any:
        generation, conn = await self._take(statement_follows=True)
        reusable = False
        try:
            result = await _statement(conn, method, *args)
            reusable = True
            return result
        except DatabaseUnavailable as exc:
            if exc.sqlstate is not None:
                # The server answered, but the session is of no use (a
                # read-only server after a failover): a broken socket makes
                # asyncpg drop its connection, this does not. Replace them all
                # at their next use, so the pool finds the new primary.
                self._generation += 1
            raise
        except DatabaseError:
            reusable = True  # the server answered: the session is fine
            raise
        finally:
            # Cancelled mid-statement, or anything unexpected: do not reuse.
            await self._give(generation, conn, reusable=reusable)

    @asynccontextmanager
    async def acquire(self) -> AsyncIterator[Connection]:
        generation, conn = await self._take()
        async with self._lent(generation, conn) as lent:
            yield lent

    @asynccontextmanager
    async def acquire_nowait(self) -> AsyncIterator[Connection | None]:
        """A connection if the pool has one without waiting for another
        caller to give one back (an idle one, or room to open one), else
        None. For work that can do without: it never queues behind the
        pool's other users."""
        try:
            generation, conn = await self._take(wait=False)
        except trio.WouldBlock:
            yield None
            return
        async with self._lent(generation, conn) as lent:
            yield lent

    @asynccontextmanager
    async def _lent(self, generation: int, conn: Any) -> AsyncIterator[Connection]:
        reusable = False
        try:
            yield Connection(conn)
            reusable = True
        except DatabaseUnavailable:
            raise
        except DatabaseError:
            reusable = True
            raise
        finally:
            await self._give(generation, conn, reusable=reusable)


    @asynccontextmanager
    async def session(self) -> AsyncIterator[Connection]:
        """One connection for the whole block, whose session state (a
        session advisory lock) lasts as long: one of the pool's, or - when
        the pool goes through a transaction pooler, which runs each statement
        on whichever server connection is free, so a lock would stay behind
        on one nobody owns - a connection of its own to ``session_dsn``,
        closed at the end (the server then drops whatever it still held)."""
        if self._session_connect is None:
            async with self.acquire() as conn:
                yield conn
            return
        if self._closed:
            raise DatabaseUnavailable("the connection pool is closed")
        async with self._session_slots:
            own = Connection(await self._session_connect())
            try:
                yield own
            finally:
                await own.aclose()


async def _close_quietly(conn: Any) -> None:
    try:
        await _hop(conn.close)
    except DatabaseError:
        conn.terminate()


class ListenConnection:
    """A dedicated LISTEN connection (never pooled).

    Notifications and the loss of the connection are reported through plain
    callbacks, which run on the trio thread (inside trio-asyncio's loop), so
    they may call trio's ``*_nowait`` methods but must not block.
    """

    def __init__(self, conn: asyncpg.Connection) -> None:
        self._conn = conn

    @classmethod
    async def connect(cls, dsn: str, *, connect_timeout: float,
                      command_timeout: float | None = None,
                      application_name: str | None = None) -> ListenConnection:
        return cls(await _open_conn(dsn, connect_timeout, command_timeout=command_timeout,
                                    server_settings=_server_settings(application_name)))

    async def listen(self, channel: str, callback: Callable[[str, str], None]) -> None:
        def on_notification(_conn: object, _pid: int, chan: str, payload: object) -> None:
            callback(chan, str(payload))

        await _call(self._conn, self._conn.add_listener, channel, on_notification)

    def on_lost(self, callback: Callable[[], None]) -> None:
        self._conn.add_termination_listener(lambda _conn: callback())

    async def ping(self) -> None:
        """One round trip, bounded by the connection's command timeout. The
        caller bounds it tighter: a half-open socket never answers."""
        await _call(self._conn, self._conn.fetchval, "SELECT 1")

    @property
    def backend_pid(self) -> int:
        pid: int = self._conn.get_server_pid()
        return pid

    def is_closed(self) -> bool:
        closed: bool = self._conn.is_closed()
        return closed

    def abort(self) -> None:
        """Drop the socket now, without a goodbye (for a connection that hangs)."""
        self._conn.terminate()


def execute_sync(dsn: str, statements: Sequence[str]) -> None:
    """Run statements on a fresh connection from synchronous code (no trio
    running): for test fixtures and command-line set-up only."""

    async def go() -> None:
        conn = await _connect(dsn)
        try:
            for statement in statements:
                await conn.execute(statement)
        finally:
            await conn.close()

    try:
        asyncio.run(go())
    except Exception as exc:
        ours = translate(exc)
        if ours is None:
            raise
        raise ours from exc
