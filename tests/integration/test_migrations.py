"""Migrations: ordered, recorded, idempotent, safe when processes race."""

from __future__ import annotations

import pytest
import trio

from nexarch_events.aio import Database
from nexarch_events.db import sqlfiles
from nexarch_events.db.migrations import migrate
from nexarch_events.errors import MigrationError


async def test_migrate_applies_everything_once(aio_loop: None, empty_database_url: str) -> None:
    versions = [v for v, _, _ in sqlfiles.migrations()]
    async with Database.open(empty_database_url) as db:
        assert await migrate(db) == versions
        assert await migrate(db) == []
        rows = await db.fetch("SELECT version FROM nexarch_schema_migrations ORDER BY version")
        assert [r["version"] for r in rows] == versions
        assert await db.fetchval("SELECT to_regclass('mail_index_jobs') IS NOT NULL")


async def test_concurrent_migrations_apply_each_migration_once(
        aio_loop: None, empty_database_url: str) -> None:
    applied: list[list[int]] = []

    async def one() -> None:
        async with Database.open(empty_database_url, max_size=1) as db:
            applied.append(await migrate(db))

    async with trio.open_nursery() as nursery:
        for _ in range(5):
            nursery.start_soon(one)
    versions = [v for v, _, _ in sqlfiles.migrations()]
    assert sorted(applied, key=len) == [[]] * 4 + [versions]


async def test_a_changed_applied_migration_is_refused(db: Database) -> None:
    await db.execute("UPDATE nexarch_schema_migrations SET sha256 = 'edited' WHERE version = 1")
    with pytest.raises(MigrationError, match="was changed after it was applied"):
        await migrate(db)


def test_migration_files_are_numbered_without_gaps() -> None:
    versions = [v for v, _, _ in sqlfiles.migrations()]
    assert versions == list(range(1, len(versions) + 1))
