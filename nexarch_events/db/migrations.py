"""Schema migrations: ``sql/migrations/NNNN_name.sql``, applied in order.

Safe to run from many processes at once: a session advisory lock serializes
them, and each migration runs in its own transaction together with the row
that records it, so a crash leaves either both or neither.
"""

from __future__ import annotations

import hashlib
import logging

from ..aio import Database
from ..errors import DatabaseError, MigrationError
from . import sqlfiles

log = logging.getLogger(__name__)

#: Advisory lock key: the first 8 bytes of sha256("nexarch_events.migrate").
_LOCK_KEY = int.from_bytes(hashlib.sha256(b"nexarch_events.migrate").digest()[:8], "big",
                           signed=True)

_BOOTSTRAP = """
CREATE TABLE IF NOT EXISTS nexarch_schema_migrations (
    version    integer PRIMARY KEY,
    name       text NOT NULL,
    sha256     text NOT NULL,
    applied_at timestamptz NOT NULL DEFAULT now()
)
"""


def _digest(sql: str) -> str:
    return hashlib.sha256(sql.encode("utf-8")).hexdigest()


async def migrate(db: Database) -> list[int]:
    """Apply every pending migration; return the versions applied now.

    Blocks while another process migrates (advisory lock). Raises
    MigrationError if a migration that was already applied has changed since.
    """
    applied_now: list[int] = []
    # One transaction for the whole run, under a transaction-level advisory
    # lock: it can never outlive the transaction (a session lock could stay
    # held on a pooled connection if the unlock were interrupted), and DDL is
    # transactional in Postgres, so a failed run leaves nothing half applied.
    async with db.acquire() as conn, conn.transaction():
        await conn.execute("SELECT pg_advisory_xact_lock($1)", _LOCK_KEY)
        await conn.execute(_BOOTSTRAP)
        rows = await conn.fetch("SELECT version, name, sha256 FROM nexarch_schema_migrations")
        done = {row["version"]: (row["name"], row["sha256"]) for row in rows}
        for version, name, sql in sqlfiles.migrations():
            digest = _digest(sql)
            if version in done:
                if done[version][1] != digest:
                    raise MigrationError(
                        f"migration {version:04d}_{name} was changed after it was applied; "
                        "add a new migration instead of editing an applied one")
                continue
            await conn.execute(sql)
            await conn.execute(
                "INSERT INTO nexarch_schema_migrations (version, name, sha256) "
                "VALUES ($1, $2, $3)", version, name, digest)
            log.info("migration applied version=%04d name=%s", version, name)
            applied_now.append(version)
    return applied_now



async def ensure_current(db: Database) -> list[int]:
    """``migrate`` if anything is pending; in the usual case (nothing is)
    only one read, no lock and no DDL, so a role that may not create tables
    passes. For the CLI's commands: on a database never migrated, ``mailbox
    add`` (the README's first step) and every other command ended with a
    missing table, as a bug (exit 70; an operator audit)."""
    try:
        rows = await db.fetch("SELECT version, sha256 FROM nexarch_schema_migrations")
    except DatabaseError as exc:
        if exc.sqlstate != "42P01":  # undefined_table: never migrated
            raise
        return await migrate(db)
    done = {row["version"]: row["sha256"] for row in rows}
    if all(done.get(version) == _digest(sql) for version, _, sql in sqlfiles.migrations()):
        return []
    return await migrate(db)
