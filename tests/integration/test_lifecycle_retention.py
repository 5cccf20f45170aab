"""Retention with a clock the test controls (``run_pass(now)``), on real
Postgres and both index backends: the received date is the INTERNALDATE,
else the Date header, else the archive time; held mail stays; erased mail
leaves the index through the delete jobs; every pass is audited."""

from __future__ import annotations

import json
from collections.abc import AsyncIterator
from datetime import UTC, datetime, timedelta

import pytest
import trio

from nexarch_events.aio import Database
from nexarch_events.lifecycle import audit
from nexarch_events.lifecycle import retention as retention_module
from nexarch_events.lifecycle.holds import Holds
from nexarch_events.lifecycle.retention import Retention, policies, set_policy
from nexarch_events.mail.archive import Archive, Location
from nexarch_events.mail.indexer import Indexer
from nexarch_events.models import JobStatus
from nexarch_events.service import QueueService
from nexarch_events.settings import QueueSettings, RetentionSettings, Settings
from tests.integration.test_lifecycle import Env
from tests.support.backends import open_backend


def mail(word: str, date: str | None) -> bytes:
    head = f"Date: {date}\r\n" if date else ""
    return (f"From: a@example.org\r\nSubject: {word}\r\n{head}Message-ID: <{word}@x>\r\n\r\n"
            f"text about {word}\r\n").encode()


@pytest.fixture(params=["postgres", "manticore"])
async def env(request: pytest.FixtureRequest, db: Database,
              fast_settings: QueueSettings) -> AsyncIterator[Env]:
    async with open_backend(request.param, db) as backend:
        settings = Settings(queue=fast_settings)
        service = QueueService(db, settings, Indexer(db, backend).handlers())
        async with trio.open_nursery() as nursery:
            await nursery.start(service.run)
            yield Env(db, backend, service.queue)
            nursery.cancel_scope.cancel()


async def test_a_pass_erases_what_was_received_before_the_cutoff(env: Env) -> None:
    archive = Archive(env.db)

    async def store(word: str, date: str | None, internaldate: datetime | None = None,
                    mailbox: str = "INBOX", uid: int = 1) -> int:
        location = Location(mailbox, 1, uid) if internaldate or mailbox != "INBOX" else None
        stored = await archive.store("acme", mail(word, date), location)
        if internaldate is not None:
            await env.db.execute("UPDATE mail_archive_locations SET internaldate = $1 "
                                 "WHERE archive_id = $2", internaldate, stored.archive_id)
        return stored.archive_id

    # INTERNALDATE wins over a recent Date header.
    by_internaldate = await store("alpha", "Tue, 31 Dec 2024 10:00:00 +0000",
                                  datetime(2024, 1, 1, tzinfo=UTC), uid=1)
    # No INTERNALDATE: the Date header.
    old_date = await store("bravo", "Sat, 01 Jun 2024 10:00:00 +0000")
    recent_date = await store("charlie", "Fri, 20 Dec 2024 10:00:00 +0000")
    # Neither: the archive time (now, in real time).
    undated = await store("delta", None)
    # Old, but held.
    held = await store("echo", None, datetime(2023, 1, 1, tzinfo=UTC), mailbox="Legal", uid=2)
    hold = await Holds(env.db, env.backend).add("acme", "mailbox", mailbox="Legal",
                                                reason="case 3", actor="ops")
    # Another tenant without a policy keeps its old mail.
    other = (await archive.store("beta", mail("foxtrot", "Mon, 01 Jan 2001 00:00:00 +0000"))
             ).archive_id
    await env.settle()

    await set_policy(env.db, "acme", 30, actor="ops")
    retention = Retention(env.db, env.backend, RetentionSettings(batch_size=2))
    results = await retention.run_pass(datetime(2025, 1, 1, tzinfo=UTC))
    assert results is not None and [r.tenant_slug for r in results] == ["acme"]
    [first] = results
    assert set(first.erased) == {by_internaldate, old_date}
    assert first.skipped_held == (held,)
    await env.settle()
    for word in ("alpha", "bravo"):
        assert await env.found("acme", word) == set()
    assert await env.found("acme", "charlie") == {recent_date}
    assert await env.found("acme", "echo") == {held}
    assert await env.found("beta", "foxtrot") == {other}

    # Years later the archive time has passed too; the hold still holds.
    later = datetime.now(UTC) + timedelta(days=31)
    [second] = await retention.run_pass(later) or []
    assert set(second.erased) == {recent_date, undated}
    await env.settle()
    assert set(await archive.ids("acme")) == {held}

    await Holds(env.db, env.backend).remove(hold.id, actor="ops")
    [third] = await retention.run_pass(later) or []
    assert third.erased == (held,)
    await env.settle()  # its delete job too (it raced the status check below under load)

    passes = await audit.entries(env.db, tenant_slug="acme",
                                 action=audit.AuditAction.RETENTION_PASS)
    assert [(e.count, e.target["ids"], e.target.get("skipped_held")) for e in passes] == [
        (1, [held], None), (2, sorted([recent_date, undated]), [held]),
        (2, sorted([by_internaldate, old_date]), [held])]
    assert all(e.actor == "retention" and e.target["days"] == 30 for e in passes)
    statuses = await env.queue.statuses(
        [r["delete_job_id"] for r in await env.db.fetch("SELECT delete_job_id FROM mail_erasures")])
    assert set(statuses.values()) == {JobStatus.SUCCEEDED}


async def test_a_pass_reads_the_archive_in_windows(env: Env,
                                                  monkeypatch: pytest.MonkeyPatch) -> None:
    # Windows of 3 ids (dates read 2 at a time), batches of 2: the expired
    # messages are spread over windows, some windows hold none, and the
    # last window is short; every old one goes, every recent one stays.
    monkeypatch.setattr(retention_module, "SCAN_WINDOW", 3)
    monkeypatch.setattr(retention_module, "DATE_BATCH", 2)
    archive = Archive(env.db)
    old, recent = [], []
    for n in range(14):
        is_old = n % 4 in (0, 3) or n == 13
        date = "Mon, 01 Jan 2001 00:00:00 +0000" if is_old else "Fri, 20 Dec 2024 10:00:00 +0000"
        stored = await archive.store("acme", mail(f"window{n}", date))
        (old if is_old else recent).append(stored.archive_id)
    await env.settle()
    await set_policy(env.db, "acme", 30, actor="ops")
    retention = Retention(env.db, env.backend, RetentionSettings(batch_size=2))
    [result] = await retention.run_pass(datetime(2025, 1, 1, tzinfo=UTC)) or []
    assert sorted(result.erased) == old
    assert await archive.ids("acme") == recent
    dated = await env.db.fetchval("SELECT count(*) FROM mail_archive_dates")
    assert dated == len(recent)  # the erased ones' dates went with them


async def test_a_tenant_hold_stops_retention_and_the_file_sets_days(env: Env) -> None:
    archive = Archive(env.db)
    old = (await archive.store("acme", mail("golf", "Mon, 01 Jan 2001 00:00:00 +0000"))
           ).archive_id
    await env.settle()
    settings = RetentionSettings(days=(("acme", 365),))
    assert [(p.tenant_slug, p.days, p.source) for p in await policies(env.db, settings)] == [
        ("acme", 365, "config")]
    await Holds(env.db, env.backend).add("acme", "tenant", reason="litigation", actor="ops")
    [result] = await Retention(env.db, env.backend, settings).run_pass(
        datetime(2025, 1, 1, tzinfo=UTC)) or []
    assert result.erased == () and result.skipped_held == (old,)
    assert await archive.ids("acme") == [old]
    # The database's setting wins over the file's; clearing it goes back.
    await set_policy(env.db, "acme", 10, actor="ops")
    assert [(p.days, p.source) for p in await policies(env.db, settings)] == [(10, "database")]
    await set_policy(env.db, "acme", None, actor="ops")
    assert [(p.days, p.source) for p in await policies(env.db, settings)] == [(365, "config")]


async def test_a_query_hold_too_broad_to_evaluate_stops_only_its_tenant(
        env: Env, monkeypatch: pytest.MonkeyPatch) -> None:
    """Found by an audit: TooManyMatches from one tenant's query hold ended
    the whole pass (no other tenant's mail expired, the audit row stayed
    open) and, in the service, the retention task and with it the process.
    Scaled down: a query may act on more than 4 matches here (101,000 in
    production)."""
    from nexarch_events.lifecycle import matching
    from nexarch_events.lifecycle.retention import RetentionTask

    monkeypatch.setattr(matching, "MAX_LIMIT", 2)
    monkeypatch.setattr(matching, "MAX_OFFSET", 2)
    old = "Mon, 01 Jan 2001 00:00:00 +0000"
    archive = Archive(env.db)
    await archive.store("acme", mail("budget-1 budget", old))
    zeta = [(await archive.store("zeta", mail(f"other-{n}", old))).archive_id
            for n in range(3)]
    await env.settle()
    await Holds(env.db, env.backend).add("acme", "query", query="budget", reason="case",
                                         actor="legal")
    for n in range(2, 8):  # the query finds more since the hold was added
        await archive.store("acme", mail(f"budget-{n} budget", old))
    await env.settle()
    retention = Retention(env.db, env.backend,
                          RetentionSettings(days=(("acme", 30), ("zeta", 30))))
    results = await retention.run_pass(datetime(2025, 1, 1, tzinfo=UTC)) or []
    by_tenant = {r.tenant_slug: r for r in results}
    assert by_tenant["zeta"].error is None and sorted(by_tenant["zeta"].erased) == zeta
    assert by_tenant["acme"].erased == ()
    assert by_tenant["acme"].error is not None and "budget" in by_tenant["acme"].error
    assert len(await archive.ids("acme")) == 7
    row = await env.db.fetchrow("SELECT count, target FROM mail_audit_log WHERE id = $1",
                                by_tenant["acme"].audit_id)
    assert row["count"] == 0 and "budget" in json.loads(row["target"])["error"]
    # The service's task lives on, pass after pass.
    task = RetentionTask(Retention(env.db, env.backend, RetentionSettings(
        interval=0.05, days=(("acme", 30),))))
    async with trio.open_nursery() as nursery:
        await nursery.start(task.run)
        with trio.fail_after(30):
            while task.passes < 2:
                await trio.sleep(0.02)
        nursery.cancel_scope.cancel()


async def test_a_query_hold_that_no_longer_parses_holds_its_whole_tenant(
        env: Env, monkeypatch: pytest.MonkeyPatch) -> None:
    """A query hold whose query the parser refuses today (validated when it
    was added; the parser changed since) protected only the items recorded
    when it was added: mail it would find now, and everything else of the
    tenant, expired as if there were no hold (a legal hold is there to keep
    mail: an erasure cannot be undone). Now the tenant's erasures stop with
    an error that names the hold; other tenants' passes go on."""
    from nexarch_events.index.base import InvalidQuery
    from nexarch_events.lifecycle import matching
    from nexarch_events.lifecycle.erasure import Eraser
    from nexarch_events.lifecycle.holds import UnevaluableHold

    old = "Mon, 01 Jan 2001 00:00:00 +0000"
    archive = Archive(env.db)
    recorded = (await archive.store("acme", mail("budget-1 budget", old))).archive_id
    await env.settle()
    hold = await Holds(env.db, env.backend).add("acme", "query", query="budget",
                                                reason="case", actor="legal")
    later = (await archive.store("acme", mail("budget-2 budget", old))).archive_id
    other = (await archive.store("acme", mail("unrelated", old))).archive_id
    zeta = (await archive.store("zeta", mail("zeta-old", old))).archive_id
    await env.settle()
    real_check = matching.check_query

    def changed_parser(tenant_slug: str, query: str) -> str:
        if query == "budget":
            raise InvalidQuery("the word 'budget' is reserved (a parser change)")
        return real_check(tenant_slug, query)

    monkeypatch.setattr(matching, "check_query", changed_parser)
    retention = Retention(env.db, env.backend,
                          RetentionSettings(days=(("acme", 30), ("zeta", 30))))
    results = await retention.run_pass(datetime(2025, 1, 1, tzinfo=UTC)) or []
    by_tenant = {r.tenant_slug: r for r in results}
    assert by_tenant["zeta"].erased == (zeta,)
    assert by_tenant["acme"].erased == ()
    error = by_tenant["acme"].error
    assert error is not None and f"#{hold.id}" in error and "reserved" in error
    assert sorted(await archive.ids("acme")) == sorted([recorded, later, other])
    # An erasure by id is refused too, with the same reason.
    with pytest.raises(UnevaluableHold, match=f"#{hold.id}"):
        await Eraser(env.db, env.backend).erase("acme", [other], actor="ops")
    assert sorted(await archive.ids("acme")) == sorted([recorded, later, other])


async def test_a_search_server_that_refuses_a_hold_query_stops_only_its_tenant(
        db: Database, fast_settings: QueueSettings) -> None:
    """Manticore answered the hold's search with 403 (a changed ACL, a proxy):
    IndexRejected escaped the retention task and the service exited, at
    every start (a retry-loop audit). The hold cannot be evaluated: its
    tenant's pass stops with the reason, the others' go on. Manticore is
    the stand-in here (tests/support/manticore_standin.py), answering as
    the real server's HTTP API does, with the 403 injected."""
    from nexarch_events.index.manticore import ManticoreBackend
    from tests.support.manticore_standin import open_manticore_standin

    old = "Mon, 01 Jan 2001 00:00:00 +0000"
    async with open_manticore_standin() as standin:
        backend = ManticoreBackend(standin.url)
        service = QueueService(db, Settings(queue=fast_settings),
                               Indexer(db, backend).handlers())
        try:
            async with trio.open_nursery() as nursery:
                await nursery.start(service.run)
                env = Env(db, backend, service.queue)
                archive = Archive(db)
                kept = (await archive.store("acme", mail("budget", old))).archive_id
                zeta = (await archive.store("zeta", mail("zeta-old", old))).archive_id
                await env.settle()
                await Holds(db, backend).add("acme", "query", query="other", reason="case",
                                             actor="legal")
                standin.answer_next(403, {"error": "permission denied"}, count=50,
                                    endpoint="/search")
                results = await Retention(db, backend, RetentionSettings(
                    days=(("acme", 30), ("zeta", 30)))).run_pass(
                    datetime(2025, 1, 1, tzinfo=UTC)) or []
                nursery.cancel_scope.cancel()
        finally:
            await backend.aclose()
    by_tenant = {r.tenant_slug: r for r in results}
    assert by_tenant["zeta"].erased == (zeta,)
    assert by_tenant["acme"].erased == ()
    error = by_tenant["acme"].error
    assert error is not None and "cannot be evaluated" in error and "403" in error
    assert await archive.ids("acme") == [kept]


async def test_one_pass_at_a_time(env: Env) -> None:
    await set_policy(env.db, "acme", 30, actor="ops")
    retention = Retention(env.db, env.backend, RetentionSettings())
    async with env.db.acquire() as conn:
        assert await conn.fetchval("SELECT pg_try_advisory_lock(1312902723, 0)")
        assert await retention.run_pass(datetime(2025, 1, 1, tzinfo=UTC)) is None
        await conn.fetchval("SELECT pg_advisory_unlock(1312902723, 0)")
    results = await retention.run_pass(datetime(2025, 1, 1, tzinfo=UTC))
    assert results is not None and [r.erased for r in results] == [()]


async def test_the_service_runs_a_pass_at_start(db: Database, database_url: str,
                                                fast_settings: QueueSettings) -> None:
    """``serve`` with a backend (what `run` does) holds the retention task in
    its nursery: the configured days apply without any command."""
    from functools import partial

    from nexarch_events.index.postgres import PostgresIndex
    from nexarch_events.service import serve
    from nexarch_events.settings import ApiSettings

    old = (await Archive(db).store("acme", mail("hotel", "Mon, 01 Jan 2001 00:00:00 +0000"))
           ).archive_id
    settings = Settings(queue=fast_settings, api=ApiSettings(enabled=False),
                        retention=RetentionSettings(days=(("acme", 30),)))
    backend = PostgresIndex(db)
    async with trio.open_nursery() as nursery:
        service = await nursery.start(partial(
            serve, settings, Indexer(db, backend).handlers(), dsn=database_url,
            backend=backend))
        with trio.fail_after(30):
            # until the pass has completed its audit row
            while not [e for e in await audit.entries(db, tenant_slug="acme") if e.count]:
                await trio.sleep(0.05)
        service.cancel()
    assert await Archive(db).ids("acme") == []
    [entry] = await audit.entries(db, tenant_slug="acme")
    assert entry.action == audit.AuditAction.RETENTION_PASS and entry.target["ids"] == [old]


async def test_a_tenant_whose_erasure_the_database_refuses_stops_only_its_own_pass(
        env: Env) -> None:
    """An erasure the database refuses for its data (SQLSTATE class 22/23: a
    CHECK, a trigger of the operator's) escaped the retention task, and the
    service stopped, at every start. It is permanent for that tenant's
    pass: the audit row says why, the other tenants' passes go on. The
    refusal is real: a trigger raising check_violation for one tenant."""
    old = "Mon, 01 Jan 2001 00:00:00 +0000"
    archive = Archive(env.db)
    kept = (await archive.store("acme", mail("acme-old", old))).archive_id
    gone = (await archive.store("zeta", mail("zeta-old", old))).archive_id
    await env.settle()
    await env.db.execute("""
        CREATE FUNCTION test_refuse_acme() RETURNS trigger LANGUAGE plpgsql AS $$
        BEGIN RAISE EXCEPTION 'acme mail is frozen' USING ERRCODE = 'check_violation'; END $$;
        CREATE TRIGGER test_refuse_acme BEFORE DELETE ON mail_archive
            FOR EACH ROW WHEN (OLD.tenant_slug = 'acme') EXECUTE FUNCTION test_refuse_acme();
    """)
    try:
        retention = Retention(env.db, env.backend,
                              RetentionSettings(days=(("acme", 30), ("zeta", 30))))
        results = await retention.run_pass(datetime(2025, 1, 1, tzinfo=UTC)) or []
    finally:
        await env.db.execute("DROP TRIGGER test_refuse_acme ON mail_archive; "
                             "DROP FUNCTION test_refuse_acme()")
    by_tenant = {r.tenant_slug: r for r in results}
    assert by_tenant["zeta"].erased == (gone,)
    assert by_tenant["acme"].erased == ()
    error = by_tenant["acme"].error
    assert error is not None and "23514" in error and "acme mail is frozen" in error
    assert await archive.ids("acme") == [kept]
    row = await env.db.fetchrow("SELECT target FROM mail_audit_log WHERE id = $1",
                                by_tenant["acme"].audit_id)
    assert row is not None and "acme mail is frozen" in json.loads(row["target"])["error"]
