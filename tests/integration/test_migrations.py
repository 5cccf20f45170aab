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


# -- upgrades (an upgrade audit: a mixed fleet, locks, roles) ---------------

async def test_a_schema_newer_than_this_program_is_refused(db: Database) -> None:
    """A newer version migrated the database: an older process kept running
    (its importer failed every run on a function the migration replaced),
    and an older `migrate` said "schema is up to date"."""
    from nexarch_events.db.migrations import ensure_current

    await db.execute("INSERT INTO nexarch_schema_migrations (version, name, sha256) "
                     "VALUES (9000, 'from_the_future', 'x')")
    for check in (migrate(db), ensure_current(db), ensure_current(db, apply=True)):
        with pytest.raises(MigrationError, match=r"newer than this version.*9000"):
            await check


async def test_a_running_service_stops_when_the_schema_moves_past_it(db: Database) -> None:
    from nexarch_events.db.migrations import watch_schema

    with trio.move_on_after(0.5) as current:
        await watch_schema(db, interval=0.1)
    assert current.cancelled_caught  # nothing to say while the schema is ours
    await db.execute("INSERT INTO nexarch_schema_migrations (version, name, sha256) "
                     "VALUES (9000, 'from_the_future', 'x')")
    with trio.fail_after(10), pytest.raises(MigrationError, match="newer than"):
        await watch_schema(db, interval=0.1)


async def test_commands_refuse_an_older_schema_and_the_service_migrates_it(
        db: Database, monkeypatch: pytest.MonkeyPatch) -> None:
    """Every command migrated on start: one `search` from a laptop with a
    newer version upgraded production under the running fleet. (A newer
    version is one more migration here: a real one may not run twice.)"""
    from nexarch_events.db import migrations
    from nexarch_events.db.migrations import ensure_current

    known = sqlfiles.migrations()
    newer = (len(known) + 1, "a_newer_version", "CREATE TABLE test_newer (id integer)")
    monkeypatch.setattr(migrations.sqlfiles, "migrations", lambda: [*known, newer])
    with pytest.raises(MigrationError, match=rf"older than this version.*{newer[0]:04d}.*migrate"):
        await ensure_current(db)
    assert await ensure_current(db, apply=True) == [newer[0]]
    assert await ensure_current(db) == []


async def test_a_migration_that_cannot_have_its_lock_gives_up_with_nothing_applied(
        db: Database, monkeypatch: pytest.MonkeyPatch) -> None:
    """A reader's open transaction (a report, a pg_dump) on a table a
    migration alters: the migration waited for it without bound, every
    other statement on the table queued behind it, and after the command
    timeout it failed as "database unreachable", having logged as applied
    what it rolled back."""
    from nexarch_events.db import migrations

    known = sqlfiles.migrations()
    future = (len(known) + 1, "needs_the_jobs_table",
              "ALTER TABLE mail_index_jobs ADD COLUMN test_probe integer")
    monkeypatch.setattr(migrations.sqlfiles, "migrations", lambda: [*known, future])
    monkeypatch.setattr(migrations, "LOCK_TIMEOUT_S", 1)
    async with db.acquire() as reader, reader.transaction():
        await reader.fetchval("SELECT count(*) FROM mail_index_jobs")
        with trio.fail_after(20), pytest.raises(MigrationError,
                                                match="waited 1 s for a table"):
            await migrate(db)
    assert await db.fetchval("SELECT count(*) FROM nexarch_schema_migrations "
                             "WHERE version = $1", future[0]) == 0
    assert await migrate(db) == [future[0]]  # once the reader is done


async def test_the_service_runs_as_a_role_that_may_not_create_tables(
        db: Database, database_url: str) -> None:
    """PostgreSQL 15 gives a new role no CREATE on schema public; the
    service ran `migrate` at every start, whose bootstrap CREATE TABLE
    failed: exit 70, "this is a bug"."""
    from nexarch_events.db.migrations import ensure_current
    from tests.acceptance.test_cli import cli

    role = "nexarch_test_runner"
    await db.execute(f"DROP ROLE IF EXISTS {role}")
    await db.execute(f"CREATE ROLE {role} LOGIN")
    try:
        await db.execute(f"REVOKE CREATE ON SCHEMA public FROM {role}, PUBLIC")
        await db.execute(f"GRANT SELECT ON nexarch_schema_migrations TO {role}")
        url = database_url.replace("postgres@", f"{role}@", 1)
        async with Database.open(url, max_size=1) as as_role:
            assert await ensure_current(as_role, apply=True) == []
        # A privilege it lacks is the operator's to grant: exit 2, not a bug's 70.
        result = await trio.to_thread.run_sync(lambda: cli("stats", url=url))
        assert result.returncode == 2, result.stderr
        assert "permission denied" in result.stderr and "Traceback" not in result.stderr
    finally:
        await db.execute(f"REASSIGN OWNED BY {role} TO CURRENT_USER")
        await db.execute(f"DROP OWNED BY {role}")
        await db.execute(f"DROP ROLE {role}")
