"""Erasure, legal holds and their audit, end to end on real Postgres and
both index backends (Manticore: the stand-in, tests/support/manticore_standin.py,
or a real server with MANTICORE_URL): the archive forgets, the worker's
delete job makes the index forget, and search never finds erased mail."""

from __future__ import annotations

import json
from collections.abc import AsyncIterator, Sequence
from typing import Any

import pytest
import trio

from nexarch_events.aio import Database
from nexarch_events.db import sqlfiles
from nexarch_events.index.base import IndexBackend, SearchQuery
from nexarch_events.lifecycle import audit
from nexarch_events.lifecycle.erasure import Eraser, HeldByLegalHold, MessageNotFound
from nexarch_events.lifecycle.holds import HoldNotFound, Holds
from nexarch_events.mail.archive import Archive, Location
from nexarch_events.mail.indexer import Indexer
from nexarch_events.models import JobId, JobStatus
from nexarch_events.queue.jobs import Queue
from nexarch_events.service import QueueService
from nexarch_events.settings import QueueSettings, Settings
from tests.support.backends import open_backend

lifecycle_sql = sqlfiles.queries("lifecycle.sql")


def mail(n: int, word: str, *, date: str = "Mon, 01 Jan 2024 10:00:00 +0000") -> bytes:
    return (f"From: Sender {n} <s{n}@example.org>\r\nTo: r@example.org\r\n"
            f"Subject: note {n} {word}\r\nDate: {date}\r\nMessage-ID: <m{n}@x>\r\n\r\n"
            f"Body of message {n} about {word} and secretword{n}.\r\n").encode()


class Env:
    def __init__(self, db: Database, backend: IndexBackend, queue: Queue) -> None:
        self.db, self.backend, self.queue = db, backend, queue
        self.archive = Archive(db)
        self.eraser = Eraser(db, backend)
        self.holds = Holds(db, backend)

    async def store(self, tenant: str, n: int, word: str, mailbox: str = "INBOX") -> int:
        stored = await self.archive.store(tenant, mail(n, word), Location(mailbox, 1, n))
        return stored.archive_id

    async def settle(self, within: float = 30) -> None:
        """Until no job is pending or processing (the table is the truth)."""
        with trio.fail_after(within):
            while True:
                stats = await self.queue.stats()
                if not stats.counts[JobStatus.PENDING] and not stats.counts[JobStatus.PROCESSING]:
                    return
                await trio.sleep(0.05)

    async def found(self, tenant: str, text: str) -> set[int]:
        result = await self.backend.search(SearchQuery(tenant, text, limit=100))
        return {hit.archive_id for hit in result.hits}

    async def proof(self, jobs: tuple[JobId, ...]) -> set[JobStatus]:
        with trio.fail_after(30):
            return set((await self.eraser.wait_finished(jobs)).values())


@pytest.fixture(params=["postgres", "manticore"])
async def env(request: pytest.FixtureRequest, db: Database,
              fast_settings: QueueSettings) -> AsyncIterator[Env]:
    async with open_backend(request.param, db) as backend:
        settings = Settings(queue=fast_settings).with_queue(batch_size=20)
        service = QueueService(db, settings, Indexer(db, backend).handlers())
        async with trio.open_nursery() as nursery:
            await nursery.start(service.run)
            yield Env(db, backend, service.queue)
            nursery.cancel_scope.cancel()


async def test_erase_one_message(env: Env) -> None:
    a = await env.store("acme", 1, "invoice")
    b = await env.store("acme", 2, "invoice")
    await env.settle()
    assert await env.found("acme", "invoice") == {a, b}
    result = await env.eraser.erase("acme", [a], actor="alice")
    assert result.erased == (a,) and len(result.delete_jobs) == 1
    assert await env.proof(result.delete_jobs) == {JobStatus.SUCCEEDED}
    assert await env.found("acme", "invoice") == {b}
    assert await env.found("acme", "secretword1") == set()
    assert await env.archive.load([("acme", a)]) == {}
    assert await env.archive.locations("acme", a) == []
    # Erasing it again: reported, not an error, nothing counted twice.
    again = await env.eraser.erase("acme", [a], actor="alice")
    assert again.erased == () and again.already_erased == (a,)
    # The audit: who, what, how many; no content.
    rows = await audit.entries(env.db, tenant_slug="acme")
    assert [(r.actor, r.action, r.count) for r in rows] == [
        ("alice", audit.AuditAction.ERASE, 0), ("alice", audit.AuditAction.ERASE, 1)]
    assert rows[1].target["ids"] == [a]
    dumped = json.dumps([r.target for r in rows])
    assert "invoice" not in dumped and "secretword" not in dumped and "Sender" not in dumped


async def test_mail_archived_after_a_tenant_erasures_last_batch_stays_searchable(
        env: Env, monkeypatch: pytest.MonkeyPatch) -> None:
    """After its last batch, erase_tenant dropped every pending index job
    and every document of the tenant: a message archived in between (an
    import run still in flight, an archive call) stayed archived but was
    never found again (a race audit). It is kept whole now, and counted."""
    ids = {await env.store("acme", n, "report") for n in range(1, 4)}
    await env.settle()
    late: list[int] = []
    real_fetch = env.db.fetch

    async def fetch(query: str, *args: object) -> list[Any]:
        rows = await real_fetch(query, *args)
        if not rows and not late and query == lifecycle_sql["ids_page"]:
            late.append(await env.store("acme", 9, "latecomer"))
            # Indexed or not yet: both must survive the erasure's end.
            with trio.move_on_after(0.2):
                while not await env.found("acme", "latecomer"):
                    await trio.sleep(0.02)
        return rows

    monkeypatch.setattr(env.db, "fetch", fetch)
    result = await env.eraser.erase_tenant("acme", actor="carol")
    monkeypatch.undo()
    assert result.erased == len(ids) and late
    await env.proof(result.delete_jobs)
    await env.settle()
    assert await env.archive.ids("acme") == late
    assert await env.found("acme", "latecomer") == set(late)
    assert await env.found("acme", "report") == set()
    entry = (await audit.entries(env.db, tenant_slug="acme"))[0]
    assert entry.target["kept_archived_meanwhile"] == 1


async def test_erase_by_query_lists_then_erases(env: Env) -> None:
    keep = await env.store("acme", 1, "holiday")
    gone = {await env.store("acme", n, "lawsuit") for n in (2, 3, 4)}
    theirs = await env.store("beta", 5, "lawsuit")
    await env.settle()
    listed, none = await env.eraser.erase_query("acme", "lawsuit", actor="bob", dry_run=True)
    assert set(listed) == gone and none is None
    assert await env.found("acme", "lawsuit") == gone  # a dry run erases nothing
    _, result = await env.eraser.erase_query("acme", "lawsuit", actor="bob")
    assert result is not None and set(result.erased) == gone
    assert await env.proof(result.delete_jobs) == {JobStatus.SUCCEEDED}
    assert await env.found("acme", "lawsuit") == set()
    assert await env.found("acme", "holiday") == {keep}
    assert await env.found("beta", "lawsuit") == {theirs}  # the query is the tenant's
    entry = (await audit.entries(env.db, tenant_slug="acme"))[0]
    assert entry.action == audit.AuditAction.ERASE_QUERY and entry.count == 3
    assert entry.target["query"] == "lawsuit"


async def test_erase_a_whole_tenant(env: Env) -> None:
    await env.db.execute(
        "INSERT INTO mail_import_mailboxes (tenant_slug, name, host, port, tls_mode, username, "
        "password_ref) VALUES ('acme', 'box', 'imap.example.org', 993, 'implicit', 'u', "
        "'env:PW')")
    await env.db.execute("INSERT INTO mail_import_state (tenant_slug, mailbox_name) "
                         "VALUES ('acme', 'box')")
    ids = {await env.store("acme", n, "report") for n in range(1, 8)}
    other = await env.store("beta", 1, "report")
    await env.settle()
    assert await env.found("acme", "report") == ids
    result = await env.eraser.erase_tenant("acme", actor="carol", batch=3)
    assert result.erased == len(ids) and result.unregistered == ("box",)
    assert await env.proof(result.delete_jobs) == {JobStatus.SUCCEEDED}
    assert await env.found("acme", "report") == set()
    assert await env.backend.document_ids("acme") == set()
    assert await env.archive.ids("acme") == []
    assert await env.db.fetchval("SELECT count(*) FROM mail_import_mailboxes") == 0
    assert await env.db.fetchval("SELECT count(*) FROM mail_import_state") == 0
    # Another tenant is untouched.
    assert await env.found("beta", "report") == {other}
    entry = (await audit.entries(env.db, tenant_slug="acme"))[0]
    assert entry.action == audit.AuditAction.ERASE_TENANT and entry.count == len(ids)
    assert await audit.entries(env.db, tenant_slug="beta") == []


async def test_a_tenant_erasure_stopped_by_a_hold_records_what_it_erased(
        env: Env, monkeypatch: pytest.MonkeyPatch) -> None:
    """A hold that arrives while the erasure waits for import runs refuses
    the batches (nothing held is erased); the audit row said a count of 5
    erased all the same (found by an audit). It now says what was erased,
    what was planned, and why it stopped."""
    ids = {await env.store("acme", n, "report") for n in range(1, 6)}
    real_wait = env.eraser._wait_for_runs

    async def a_hold_arrives(tenant: str, mailboxes: Sequence[str], wait: float
                             ) -> tuple[str, ...]:
        await env.holds.add("acme", "tenant", reason="litigation", actor="legal")
        return await real_wait(tenant, mailboxes, wait)

    monkeypatch.setattr(env.eraser, "_wait_for_runs", a_hold_arrives)
    with pytest.raises(HeldByLegalHold):
        await env.eraser.erase_tenant("acme", actor="op", batch=2, run_wait=0.1)
    assert set(await env.archive.ids("acme")) == ids
    [entry] = [e for e in await audit.entries(env.db, tenant_slug="acme")
               if e.action == audit.AuditAction.ERASE_TENANT]
    assert entry.count == 0
    assert entry.target["planned"] == 5 and "legal hold" in str(entry.target["stopped"])


async def test_holds_block_erasure_until_removed(env: Env) -> None:
    inbox = await env.store("acme", 1, "contract", mailbox="INBOX")
    legal = await env.store("acme", 2, "contract", mailbox="Legal")
    merger = await env.store("acme", 3, "merger")
    await env.settle()
    box = await env.holds.add("acme", "mailbox", mailbox="Legal", reason="case 17",
                              actor="dana")
    query = await env.holds.add("acme", "query", query="merger", reason="case 18",
                                actor="dana")
    assert query.recorded == 1
    with pytest.raises(HeldByLegalHold, match=r"legal hold #\d+ on mailbox 'Legal'") as caught:
        await env.eraser.erase("acme", [inbox, legal, merger], actor="eve")
    assert caught.value.held == {legal: (box.id,), merger: (query.id,)}
    # Refused whole: nothing of the mixed set went.
    assert set(await env.archive.ids("acme")) == {inbox, legal, merger}
    with pytest.raises(HeldByLegalHold):
        await env.eraser.erase_query("acme", "merger", actor="eve")
    tenant = await env.holds.add("acme", "tenant", reason="audit 2026", actor="dana")
    with pytest.raises(HeldByLegalHold):
        await env.eraser.erase("acme", [inbox], actor="eve")
    with pytest.raises(HeldByLegalHold, match="active legal hold"):
        await env.eraser.erase_tenant("acme", actor="eve")
    for hold in (box, query, tenant):
        await env.holds.remove(hold.id, actor="dana")
    with pytest.raises(HoldNotFound):
        await env.holds.remove(box.id, actor="dana")
    result = await env.eraser.erase("acme", [inbox, legal, merger], actor="eve")
    assert set(result.erased) == {inbox, legal, merger}
    actions = [e.action.value for e in await audit.entries(env.db, tenant_slug="acme")]
    assert actions == ["erase", "hold_remove", "hold_remove", "hold_remove", "hold_add",
                       "hold_add", "hold_add"]


async def test_a_query_hold_holds_what_it_finds_later(env: Env) -> None:
    hold = await env.holds.add("acme", "query", query="merger", reason="case", actor="dana")
    assert hold.recorded == 0
    later = await env.store("acme", 1, "merger")
    await env.settle()
    with pytest.raises(HeldByLegalHold):
        await env.eraser.erase("acme", [later], actor="eve")


async def test_tenants_cannot_erase_or_hold_each_others_mail(env: Env) -> None:
    theirs = await env.store("beta", 1, "private")
    await env.settle()
    with pytest.raises(MessageNotFound):
        await env.eraser.erase("acme", [theirs], actor="mallory")
    assert await env.found("beta", "private") == {theirs}
    hold = await env.holds.add("beta", "tenant", reason="x", actor="dana")
    with pytest.raises(HoldNotFound):
        await env.holds.remove(hold.id, actor="mallory", tenant_slug="acme")
    assert [h.id for h in await env.holds.list("acme")] == []
    assert [h.id for h in await env.holds.list("beta")] == [hold.id]
    assert await audit.entries(env.db, tenant_slug="acme") == []


@pytest.mark.parametrize("backend_name", ["postgres", "manticore"])
async def test_an_erasure_racing_a_claimed_index_job_wins(
        db: Database, fast_settings: QueueSettings, backend_name: str) -> None:
    """The index job is claimed (its worker is mid-write) when the erasure
    commits: the delete job waits behind it and wins; a pending one is
    dropped with the message."""
    async with open_backend(backend_name, db) as backend:
        queue = Queue(db, fast_settings)
        archive = Archive(db)
        claimed_msg = (await archive.store("acme", mail(1, "race"))).archive_id
        [claimed] = await queue.claim(1, "slow-worker")
        pending_msg = (await archive.store("acme", mail(2, "race"))).archive_id
        # The slow worker read the message before the erasure...
        document = await _document(db, backend, claimed_msg)
        result = await Eraser(db, backend).erase("acme", [claimed_msg, pending_msg],
                                                 actor="alice")
        assert set(result.erased) == {claimed_msg, pending_msg}
        # ...the pending index job went with its message; the claimed one stays.
        left = await db.fetch("SELECT message_id, job_type, status FROM mail_index_jobs "
                              "WHERE job_type = 'index' ORDER BY id")
        assert [(r["message_id"], r["status"]) for r in left] == [
            (str(claimed_msg), "processing")]
        # The delete of the claimed message cannot be claimed before it.
        assert [j.message_id for j in await queue.claim(10, "other")] == [str(pending_msg)]
        # ...and writes its document late, then acks.
        await backend.upsert([document])
        await queue.complete([claimed])
        settings = Settings(queue=fast_settings)
        service = QueueService(db, settings, Indexer(db, backend).handlers())
        async with trio.open_nursery() as nursery:
            await nursery.start(service.run)
            with trio.fail_after(30):
                while set((await queue.statuses(list(result.delete_jobs))).values()) - {
                        JobStatus.SUCCEEDED, JobStatus.PROCESSING}:
                    await trio.sleep(0.05)
                # the 'other' claim above holds the second delete: let it lapse
                while (await queue.status(result.delete_jobs[0])).status != JobStatus.SUCCEEDED:
                    await trio.sleep(0.05)
            nursery.cancel_scope.cancel()
        found = await backend.search(SearchQuery("acme", "race"))
        assert claimed_msg not in {h.archive_id for h in found.hits}


async def _document(db: Database, backend: IndexBackend, archive_id: int):  # type: ignore[no-untyped-def]
    from nexarch_events.mail import mime

    stored = (await Archive(db).load([("acme", archive_id)]))[archive_id]
    parsed = mime.parse_message(stored.raw)
    return mime.to_index_document(parsed, archive_id=archive_id, tenant_slug="acme",
                                  mailboxes=(), size_bytes=stored.size_bytes)


@pytest.mark.parametrize("backend_name", ["postgres", "manticore"])
async def test_verify_reports_erased_mail_still_indexed_and_repair_fixes_both_ways(
        db: Database, fast_settings: QueueSettings, backend_name: str) -> None:
    from nexarch_events.reindex import repair, verify

    async with open_backend(backend_name, db) as backend:
        archive = Archive(db)
        env = Env(db, backend, Queue(db, fast_settings))
        ids = [(await archive.store("acme", mail(n, "verify"))).archive_id for n in (1, 2, 3)]
        await _run_workers(env, Settings(queue=fast_settings))
        # Erased while no worker runs, and its delete job then failed for
        # good: the archive forgot it, the index did not.
        result = await Eraser(db, backend).erase("acme", [ids[0]], actor="ops")
        await db.execute("UPDATE mail_index_jobs SET status = 'failed', finished_at = now() "
                         "WHERE id = $1", result.delete_jobs[0])
        # And one live message lost its document.
        await backend.delete("acme", [ids[1]])
        report = await verify(db, backend, "acme")
        assert (report.missing, report.extra, report.erased) == ((ids[1],), (ids[0],), (ids[0],))
        assert not report.consistent
        assert await env.found("acme", "secretword1") == {ids[0]}
        assert len(await repair(db, report)) == 2
        # Repaired again before the workers ran: the jobs are queued
        # already, and a second copy of each would only double the work.
        assert await repair(db, await verify(db, backend, "acme")) == []
        await _run_workers(env, Settings(queue=fast_settings))
        after = await verify(db, backend, "acme")
        assert after.consistent and after.erased == ()
        assert await env.found("acme", "verify") == {ids[1], ids[2]}


async def _run_workers(env: Env, settings: Settings) -> None:
    """Workers until the queue has nothing left to do."""
    service = QueueService(env.db, settings, Indexer(env.db, env.backend).handlers())
    async with trio.open_nursery() as nursery:
        await nursery.start(service.run)
        await env.settle()
        nursery.cancel_scope.cancel()


async def test_a_hold_waits_for_an_erasure_in_flight(db: Database) -> None:
    """An erasure's transaction holds the tenant's lifecycle lock shared:
    a hold added meanwhile commits only after it, so the erasure's hold
    check can never have missed a hold that was already in force."""
    from nexarch_events.index.postgres import PostgresIndex

    holds = Holds(db, PostgresIndex(db))
    done = trio.Event()

    async def add() -> None:
        await holds.add("acme", "tenant", reason="late", actor="dana")
        done.set()

    async with db.acquire() as conn, trio.open_nursery() as nursery:
        async with conn.transaction():
            await conn.execute("SELECT pg_advisory_xact_lock_shared(1312902722, hashtext('acme'))")
            nursery.start_soon(add)
            with trio.fail_after(30):  # until the hold is seen waiting for the lock
                while not await db.fetchval(
                        "SELECT count(*) FROM pg_locks WHERE locktype = 'advisory' "
                        "AND NOT granted AND database = (SELECT oid FROM pg_database "
                        "WHERE datname = current_database())"):
                    await trio.sleep(0.02)
            assert not done.is_set()
            assert await holds.list("acme") == []
        with trio.fail_after(30):
            await done.wait()
    assert [h.reason for h in await holds.list("acme")] == ["late"]


async def test_erasing_a_tenant_waits_for_its_import_run_in_flight(db: Database) -> None:
    """A run holds its mailbox's run lock: the erasure unregisters the
    mailbox, waits for the run to end, then erases (or says it is still
    running)."""
    from nexarch_events.index.postgres import PostgresIndex

    for name in ("box", "box2"):
        await db.execute(
            "INSERT INTO mail_import_mailboxes (tenant_slug, name, host, port, tls_mode, "
            "username, password_ref) VALUES ('acme', $1, 'imap.example.org', 993, 'implicit', "
            "'u', 'env:PW')", name)
    await Archive(db).store("acme", mail(1, "x"))
    eraser = Eraser(db, PostgresIndex(db))
    outcome: list[tuple[str, ...]] = []

    async def erase() -> None:
        outcome.append((await eraser.erase_tenant("acme", actor="ops")).still_running)

    async with db.acquire() as run, trio.open_nursery() as nursery:
        assert await run.fetchval("SELECT pg_try_advisory_lock(1312902721, hashtext('acme/box'))")
        nursery.start_soon(erase)
        with trio.fail_after(30):  # unregistered first...
            while await db.fetchval("SELECT count(*) FROM mail_import_mailboxes"):
                await trio.sleep(0.02)
        # ...and nothing erased while the run goes on.
        assert await Archive(db).ids("acme") != [] and outcome == []
        await run.fetchval("SELECT pg_advisory_unlock(1312902721, hashtext('acme/box'))")
    assert outcome == [()]
    assert await Archive(db).ids("acme") == []

    # A run that does not end in time is reported.
    await db.execute(
        "INSERT INTO mail_import_mailboxes (tenant_slug, name, host, port, tls_mode, "
        "username, password_ref) VALUES ('acme', 'box', 'imap.example.org', 993, 'implicit', "
        "'u', 'env:PW')")
    async with db.acquire() as run:
        assert await run.fetchval("SELECT pg_try_advisory_lock(1312902721, hashtext('acme/box'))")
        result = await eraser.erase_tenant("acme", actor="ops", run_wait=0.3)
        assert result.still_running == ("box",)
        await run.fetchval("SELECT pg_advisory_unlock(1312902721, hashtext('acme/box'))")


async def test_an_erasure_can_unregister_the_mailboxes_its_mail_came_from(db: Database) -> None:
    """Re-import brings erased mail back only from a registered mailbox:
    --unregister-mailboxes removes the ones the erased mail was seen in."""
    from nexarch_events.index.postgres import PostgresIndex

    for name in ("box", "other"):
        await db.execute(
            "INSERT INTO mail_import_mailboxes (tenant_slug, name, host, port, tls_mode, "
            "username, password_ref) VALUES ('acme', $1, 'imap.example.org', 993, 'implicit', "
            "'u', 'env:PW')", name)
        await db.execute("INSERT INTO mail_import_state (tenant_slug, mailbox_name) "
                         "VALUES ('acme', $1)", name)
    archive = Archive(db)
    gone = (await archive.store("acme", mail(1, "x"), Location("box", 1, 1))).archive_id
    kept = (await archive.store("acme", mail(2, "x"), Location("other", 1, 1))).archive_id
    result = await Eraser(db, PostgresIndex(db)).erase("acme", [gone], actor="ops",
                                                       unregister_mailboxes=True)
    assert result.erased == (gone,) and result.unregistered == ("box",)
    rows = await db.fetch("SELECT name FROM mail_import_mailboxes ORDER BY name")
    assert [r["name"] for r in rows] == ["other"]
    states = await db.fetch("SELECT mailbox_name FROM mail_import_state ORDER BY 1")
    assert [r["mailbox_name"] for r in states] == ["other"]
    assert await archive.ids("acme") == [kept]
