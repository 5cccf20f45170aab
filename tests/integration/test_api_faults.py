"""Faults of the HTTP API found by an audit (/work/audit-api), each against
the real server, real Postgres and, for the outage, a real TCP proxy that
is stopped under the server: a cursor ahead of the database, database
details leaking into the event stream, 503 without Retry-After, invalid
UTF-8 in a query parameter, and large ids refused by ``/audit``."""

from __future__ import annotations

from collections.abc import AsyncIterator

import httpx
import pytest
import trio

from nexarch_events.aio import Database
from nexarch_events.api import ApiContext, serve_api
from nexarch_events.index.postgres import PostgresIndex
from nexarch_events.metrics import Metrics
from nexarch_events.queue.notify import JOB_EVENTS_CHANNEL, MAIL_IMPORTED_CHANNEL, Listener
from nexarch_events.settings import QueueSettings, Settings
from tests.integration.test_api import (
    KEEPALIVE_S,
    Env,
    EventReader,
    Tokens,
    api_settings,
    check_against_spec,
    imported_ids,
    job_ids,
    message,
    open_env,
    open_events,
)
from tests.support.tcp_proxy import TcpProxy


@pytest.fixture
async def env(db: Database, database_url: str,
              fast_settings: QueueSettings) -> AsyncIterator[Env]:
    async with open_env(db, database_url, fast_settings) as opened:
        yield opened


@pytest.mark.parametrize("ahead", ["archive", "job", "archive, job half lost"])
async def test_a_last_event_id_ahead_of_the_database_is_resynced(env: Env, ahead: str) -> None:
    """A Last-Event-ID from another deployment or a database restored from
    a backup was accepted, and its archive half pinned every later event id
    above the real ones, so a resume from them never replayed a message.
    Either half above what this database ever allocated: one ``resync``,
    then the stream goes on from the newest ids. Also when the job half
    names a job whose place can no longer be told (job 0, once anything
    was pruned): that resync kept the archive half ahead (a review)."""
    [old] = await env.import_mail("acme", "inbox", [message("before-future")])
    await env.wait_finished([old.job_id])
    assert old.job_id is not None
    cursor = {"archive": f"{old.archive_id + 1000}.{old.job_id}",
              "job": f"{old.archive_id}.{old.job_id + 1000}",
              "archive, job half lost": f"{old.archive_id + 1000}.0"}[ahead]
    if ahead == "archive, job half lost":
        await env.db.execute("UPDATE mail_index_jobs_pruned SET max_id = 1, "
                             "max_finished_at = now(), max_finished_id = 1")
    async with open_events(env, env.tokens.acme, last_id=cursor) as events:
        opened = await events.next()
        assert (opened.event, opened.data["resumed"]) == ("open", True)
        resync = await events.next(within=5)
        [new] = await env.import_mail("acme", "inbox", [message("after-future")])
        got = [resync, *await events.until(lambda e: e.event == "indexed"
                                           and new.job_id in e.data["ids"])]
    assert resync.event == "resync", [(e.event, e.id) for e in got]
    assert resync.data["replayed"] is True and "ahead" in resync.data["reason"]
    assert resync.id == f"{old.archive_id}.{old.job_id}"
    assert [e.event for e in got].count("resync") == 1
    assert imported_ids(got) == [new.archive_id] and job_ids(got) == [new.job_id]
    assert got[-1].id == f"{new.archive_id}.{new.job_id}"
    # ... so a resume from the stream's last id replays what came after it.
    [away] = await env.import_mail("acme", "inbox", [message("while-away")])
    await env.wait_finished([away.job_id])
    async with open_events(env, env.tokens.acme, last_id=got[-1].id) as events:
        await events.next()
        replayed = await events.until(lambda e: e.event == "indexed")
    assert imported_ids(replayed) == [away.archive_id] and job_ids(replayed) == [away.job_id]


async def test_a_database_outage_shows_no_address_and_says_when_to_retry(
        db: Database, database_url: str, fast_settings: QueueSettings) -> None:
    """With Postgres unreachable, ``/events`` sent the driver's error to any
    token holder (the database's host and port: found by an audit), and
    503 answers carried no Retry-After."""
    tokens = Tokens()
    proxy = TcpProxy.for_url(database_url)
    proxy_scope = trio.CancelScope()

    async def run_proxy(*, task_status: trio.TaskStatus[int] = trio.TASK_STATUS_IGNORED
                        ) -> None:
        with proxy_scope:
            await proxy.run(task_status=task_status)

    async with trio.open_nursery() as nursery:
        proxy_port = await nursery.start(run_proxy)
        async with Database.open(proxy.url(database_url), command_timeout=2) as proxied:
            listener = Listener(database_url, fast_settings,
                                channels=(MAIL_IMPORTED_CHANNEL, JOB_EVENTS_CHANNEL))
            ctx = ApiContext(db=proxied, settings=Settings(api=api_settings(tokens.settings())),
                             backend=PostgresIndex(proxied), listener=listener,
                             metrics=Metrics(), sse_keepalive_s=KEEPALIVE_S)
            await nursery.start(listener.run)
            port = await nursery.start(serve_api, ctx)
            async with httpx.AsyncClient(base_url=f"http://127.0.0.1:{port}",
                                         timeout=30) as http:
                admin = {"Authorization": f"Bearer {tokens.admin}"}
                assert (await http.get("/queue", headers=admin)).status_code == 200
                proxy_scope.cancel()  # every connection through it, and new ones, fail
                with trio.fail_after(20):
                    down = await http.get("/queue", headers=admin)
                check_against_spec("GET", "/queue", down)
                assert down.status_code == 503, down.text
                assert down.headers["retry-after"] == "5"
                async with http.stream("GET", "/events", headers={
                        "Authorization": f"Bearer {tokens.acme}"}) as response:
                    assert response.status_code == 200
                    error = await EventReader(response).next(within=20)
            nursery.cancel_scope.cancel()
    assert error.event == "error"
    assert error.data == {"error": "temporarily unavailable: the database cannot be reached; "
                                   "reconnect later"}
    assert str(proxy_port) not in down.text


async def test_invalid_utf8_in_a_query_parameter_is_refused_by_name(env: Env) -> None:
    """``%ff`` was decoded to U+FFFD and searched for (200): a client's
    encoding bug must not silently change what it asked for."""
    headers = {"Authorization": f"Bearer {env.tokens.acme}"}
    for query, name in (("q=%ff", "q"), ("q=secret&sender=%ff%fe", "sender"),
                        ("q=%ed%a0%80", "q")):  # an encoded surrogate is not UTF-8 either
        response = await env.client.http.get(f"/search?{query}", headers=headers)
        check_against_spec("GET", "/search", response)
        assert response.status_code == 400, (query, response.text)
        assert f"query parameter {name!r}" in response.json()["error"]
        assert "UTF-8" in response.json()["error"]
    # Valid percent-encoded UTF-8 still reads as before.
    fine = await env.client.http.get("/search?q=%C3%BCber", headers=headers)
    assert fine.status_code == 200, fine.text


async def test_audit_before_takes_ids_up_to_the_largest_bigint(env: Env) -> None:
    """``before`` took 1..12 digits, though the spec allows ids up to 2**63-1."""
    for before in (10**12, 2**63 - 1):
        response = await env.client.get("/audit", env.tokens.admin,
                                        params={"before": str(before)})
        assert response.status_code == 200, (before, response.text)
    too_big = await env.client.get("/audit", env.tokens.admin,
                                   params={"before": str(2**63)})
    assert too_big.status_code == 400 and "'before'" in too_big.json()["error"]
