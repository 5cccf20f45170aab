"""Schema migrations: ``sql/migrations/NNNN_name.sql``, applied in order.

Safe to run from many processes at once: a session advisory lock serializes
them, and each migration runs in its own transaction together with the row
that records it, so a crash leaves either both or neither.
"""

from __future__ import annotations

import hashlib
import logging

import trio

from ..aio import Database
from ..errors import DatabaseError, DatabaseTransient, MigrationError
from . import sqlfiles

log = logging.getLogger(__name__)

#: Advisory lock key: the first 8 bytes of sha256("nexarch_events.migrate").
_LOCK_KEY = int.from_bytes(hashlib.sha256(b"nexarch_events.migrate").digest()[:8], "big",
                           signed=True)

_LOCK = "SELECT pg_advisory_xact_lock($1)"
_LIMITS = "SELECT set_config('lock_timeout', $1, true), set_config('statement_timeout', '0', true)"

_BOOTSTRAP = """
CREATE TABLE IF NOT EXISTS nexarch_schema_migrations (
    version    integer PRIMARY KEY,
    name       text NOT NULL,
    sha256     text NOT NULL,
    applied_at timestamptz NOT NULL DEFAULT now()
)
"""


#: How long a migration waits for a lock on a table another session holds
#: (a long transaction, a pg_dump) before it gives up with nothing applied:
#: every other session's statements on that table queue behind the waiting
#: DDL, so the wait must be short (an upgrade audit: reads stalled for as
#: long as the migration waited).
LOCK_TIMEOUT_S = 10
#: A migration's statements may run long on a large archive (an index or a
#: constraint built over every row): the connection's command timeout
#: (NEXARCH_COMMAND_TIMEOUT) does not bound them, this does.
STATEMENT_TIMEOUT_S = 24 * 3600.0
#: How often a running service reads the schema's version (``watch_schema``).
SCHEMA_CHECK_INTERVAL_S = 30.0


def _digest(sql: str) -> str:
    return hashlib.sha256(sql.encode("utf-8")).hexdigest()


def _pending(done: dict[int, str]) -> list[int]:
    """The known migrations ``done`` (version → digest) lacks. Raises
    MigrationError when the database has one this program does not know (a
    newer version migrated it) or one that changed since it was applied."""
    known = {version: _digest(sql) for version, _, sql in sqlfiles.migrations()}
    newer = sorted(set(done) - set(known))
    if newer:
        raise MigrationError(
            f"the database's schema is newer than this version of nexarch-events: it has "
            f"migration(s) {', '.join(f'{v:04d}' for v in newer)}, this version knows up to "
            f"{max(known):04d}; run the newer version (README, \"Upgrading\")")
    changed = sorted(v for v in done if done[v] != known[v])
    if changed:
        raise MigrationError(
            f"migration {changed[0]:04d} was changed after it was applied; add a new "
            "migration instead of editing an applied one")
    return sorted(set(known) - set(done))


async def migrate(db: Database) -> list[int]:
    """Apply every pending migration; return the versions applied now.

    Blocks while another process migrates (advisory lock). Raises
    MigrationError if a migration that was already applied has changed
    since, if the schema is newer than this program, or if a table lock
    was not had within LOCK_TIMEOUT_S (nothing is applied then).
    """
    applied_now: list[tuple[int, str]] = []
    # One transaction for the whole run, under a transaction-level advisory
    # lock: it can never outlive the transaction (a session lock could stay
    # held on a pooled connection if the unlock were interrupted), and DDL is
    # transactional in Postgres, so a failed run leaves nothing half applied.
    try:
        async with db.acquire() as conn, conn.transaction():
            await conn.execute_long(STATEMENT_TIMEOUT_S, _LOCK, _LOCK_KEY)
            await conn.execute(_LIMITS, f"{LOCK_TIMEOUT_S}s")
            await conn.execute(_BOOTSTRAP)
            rows = await conn.fetch("SELECT version, sha256 FROM nexarch_schema_migrations")
            pending = set(_pending({row["version"]: row["sha256"] for row in rows}))
            for version, name, sql in sqlfiles.migrations():
                if version not in pending:
                    continue
                await conn.execute_long(STATEMENT_TIMEOUT_S, sql)
                await conn.execute(
                    "INSERT INTO nexarch_schema_migrations (version, name, sha256) "
                    "VALUES ($1, $2, $3)", version, name, _digest(sql))
                applied_now.append((version, name))
    except DatabaseTransient as exc:
        if exc.sqlstate != "55P03":
            raise
        raise MigrationError(
            f"a migration waited {LOCK_TIMEOUT_S} s for a table another session holds (a long "
            "transaction, a pg_dump?): nothing was applied; try again when it is done "
            f"({exc})") from None
    # Said once it is committed: a run that fails applies none of them.
    for version, name in applied_now:
        log.info("migration applied version=%04d name=%s", version, name)
    return [version for version, _ in applied_now]


async def ensure_current(db: Database, *, apply: bool = False) -> list[int]:
    """Check that the schema is this program's; in the usual case (it is)
    only one read, no lock and no DDL, so a role that may not create tables
    passes. A database never migrated is migrated (the README's first
    step, ``mailbox add``, ended with a missing table before, as a bug). An
    older schema is migrated with ``apply`` (``run`` and ``worker``), else
    refused: a command run from an operator's laptop must not upgrade the
    schema under a fleet of the older version (an upgrade audit). A newer
    schema is always refused (MigrationError)."""
    try:
        rows = await db.fetch("SELECT version, sha256 FROM nexarch_schema_migrations")
    except DatabaseError as exc:
        if exc.sqlstate != "42P01":  # undefined_table: never migrated
            raise
        return await migrate(db)
    pending = _pending({row["version"]: row["sha256"] for row in rows})
    if not pending:
        return []
    if apply:
        return await migrate(db)
    raise MigrationError(
        f"the database's schema is older than this version of nexarch-events (migration(s) "
        f"{', '.join(f'{v:04d}' for v in pending)} pending): run `nexarch-events migrate` "
        "first, once the services of the older version are stopped (README, \"Upgrading\")")


async def watch_schema(db: Database, *, interval: float = SCHEMA_CHECK_INTERVAL_S) -> None:
    """For a running service: returns never; raises MigrationError once the
    schema has a migration this program does not know (a newer version
    migrated it under us). Before, an older process kept running and its
    importer failed every run on a function the migration had replaced,
    with WARNINGs only. A read that fails is tried again at the next
    interval (the service's other parts report outages)."""
    while True:
        await trio.sleep(interval)
        try:
            rows = await db.fetch("SELECT version, sha256 FROM nexarch_schema_migrations")
        except DatabaseTransient:
            continue
        _pending({row["version"]: row["sha256"] for row in rows})
