"""DELETE /messages/{id}, GET /audit and GET /holds: erasure through the
API, with the tenant isolation of every other endpoint (another tenant's
mail is "not found", never "forbidden": its existence does not leak).
Every response is checked against openapi.yaml (test_api's client)."""

from __future__ import annotations

from collections.abc import AsyncIterator

import pytest

from nexarch_events.aio import Database
from nexarch_events.index.base import SearchQuery
from nexarch_events.lifecycle.holds import Holds
from nexarch_events.models import JobStatus
from nexarch_events.settings import QueueSettings
from tests.integration.test_api import Env, message, open_env


@pytest.fixture
async def env(db: Database, database_url: str,
              fast_settings: QueueSettings) -> AsyncIterator[Env]:
    async with open_env(db, database_url, fast_settings) as opened:
        yield opened


async def found(env: Env, tenant: str, word: str) -> set[int]:
    result = await env.ctx.backend.search(SearchQuery(tenant, word))
    return {hit.archive_id for hit in result.hits}


async def test_a_tenant_erases_its_own_mail_and_nothing_else(env: Env) -> None:
    [mine] = await env.import_mail("acme", "inbox", [message("erasewordone")])
    [theirs] = await env.import_mail("globex", "inbox", [message("erasewordtwo")])
    await env.wait_finished([mine.job_id, theirs.job_id])

    # globex's token cannot see acme's message: 404, the same as a missing one.
    for token, archive_id in ((env.tokens.globex, mine.archive_id),
                              (env.tokens.globex, 987654321)):
        response = await env.client.request("DELETE", f"/messages/{archive_id}", token)
        assert response.status_code == 404
        assert response.json()["error"] == f"no archived message {archive_id} in tenant 'globex'"
    assert await found(env, "acme", "erasewordone") == {mine.archive_id}

    response = await env.client.request("DELETE", f"/messages/{mine.archive_id}",
                                        env.tokens.acme)
    assert response.status_code == 202, response.text
    body = response.json()
    assert body["tenant"] == "acme" and body["archive_id"] == mine.archive_id
    # The proof: the delete job, readable by the same token.
    assert (await env.wait_finished([body["delete_job"]]))[body["delete_job"]] \
        == JobStatus.SUCCEEDED
    job = (await env.client.get(f"/jobs/{body['delete_job']}", env.tokens.acme)).json()
    assert job["job_type"] == "delete" and job["status"] == "succeeded"
    assert await found(env, "acme", "erasewordone") == set()
    again = await env.client.request("DELETE", f"/messages/{mine.archive_id}", env.tokens.acme)
    assert again.status_code == 404

    # An admin erases any tenant's mail, with or without naming the tenant.
    response = await env.client.request("DELETE", f"/messages/{theirs.archive_id}",
                                        env.tokens.admin)
    assert response.status_code == 202 and response.json()["tenant"] == "globex"

    # The audit: each tenant sees its own entries; the admin sees all.
    acme_log = (await env.client.get("/audit", env.tokens.acme)).json()
    assert acme_log["tenant"] == "acme"
    # (the repeated DELETE is audited too: an attempt that erased nothing)
    assert [(e["actor"], e["action"], e["target"]["ids"]) for e in acme_log["entries"]] == [
        ("acme-ui", "erase", []), ("acme-ui", "erase", [mine.archive_id])]
    assert all(e["tenant"] == "acme" for e in acme_log["entries"])
    globex_log = (await env.client.get("/audit", env.tokens.globex)).json()["entries"]
    assert [(e["tenant"], e["actor"], e["count"]) for e in globex_log] == [
        ("globex", "ops", 1)]
    everything = (await env.client.get("/audit", env.tokens.admin)).json()["entries"]
    assert {e["tenant"] for e in everything} == {"acme", "globex"}
    denied = await env.client.get("/audit", env.tokens.acme, params={"tenant": "globex"})
    assert denied.status_code == 403
    assert (await env.client.get("/audit", env.tokens.admin,
                                 params={"action": "nope"})).status_code == 400


async def test_held_mail_is_refused_with_the_hold_named(env: Env) -> None:
    [held] = await env.import_mail("acme", "inbox", [message("holdword")])
    await env.wait_finished([held.job_id])
    hold = await Holds(env.db, env.ctx.backend).add("acme", "mailbox", mailbox="inbox",
                                                    reason="case 5", actor="ops")
    response = await env.client.request("DELETE", f"/messages/{held.archive_id}",
                                        env.tokens.acme)
    assert response.status_code == 409
    assert f"legal hold #{hold.id} on mailbox 'inbox'" in response.json()["error"]
    assert await found(env, "acme", "holdword") == {held.archive_id}
    listed = (await env.client.get("/holds", env.tokens.acme)).json()
    assert [h["id"] for h in listed["holds"]] == [hold.id]
    assert (await env.client.get("/holds", env.tokens.globex)).json()["holds"] == []
