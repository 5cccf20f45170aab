"""DELETE /messages/{id}, GET /audit, GET|POST /holds, DELETE /holds/{id} and
GET|PUT /retention: erasure, holds and retention through the API, with the
tenant isolation of every other endpoint (another tenant's mail is "not
found", never "forbidden": its existence does not leak). Holds and
retention are changed by admin tokens only (a tenant token: 403). Every
response is checked against openapi.yaml (test_api's client)."""

from __future__ import annotations

import re
import sys
from collections.abc import AsyncIterator
from pathlib import Path

import pytest
import trio

from nexarch_events.aio import Database
from nexarch_events.index.base import SearchQuery
from nexarch_events.lifecycle.holds import Holds
from nexarch_events.models import JobStatus
from nexarch_events.settings import QueueSettings, RetentionSettings
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


# -- holds and retention through the API (admin tokens only) ------------------------

async def audit_of(env: Env, action: str, tenant: str = "acme") -> list[dict[str, object]]:
    response = await env.client.get("/audit", env.tokens.admin,
                                    params={"tenant": tenant, "action": action})
    return list(response.json()["entries"])


async def test_an_admin_adds_and_removes_holds_audited_as_the_token(env: Env) -> None:
    [held, other] = await env.import_mail("acme", "inbox", [message("apiholdword"),
                                                            message("apifreeword")])
    await env.wait_finished([held.job_id, other.job_id])

    added = await env.client.post("/holds", env.tokens.admin, json={
        "tenant": "acme", "scope": "mailbox", "mailbox": "inbox", "reason": "case 7"})
    assert added.status_code == 201, added.text
    hold = added.json()
    assert (hold["tenant"], hold["scope"], hold["mailbox"], hold["query"], hold["reason"],
            hold["created_by"], hold["removed_at"]) == (
        "acme", "mailbox", "inbox", None, "case 7", "ops", None)
    refused = await env.client.request("DELETE", f"/messages/{held.archive_id}",
                                       env.tokens.acme)
    assert refused.status_code == 409
    assert f"legal hold #{hold['id']} on mailbox 'inbox'" in refused.json()["error"]
    # The tenant sees its hold; the other tenant does not.
    listed = (await env.client.get("/holds", env.tokens.acme)).json()["holds"]
    assert [h["id"] for h in listed] == [hold["id"]]
    assert (await env.client.get("/holds", env.tokens.globex)).json()["holds"] == []

    # A query hold records what its query finds now.
    by_query = await env.client.post("/holds", env.tokens.admin, json={
        "tenant": "acme", "scope": "query", "query": "apifreeword", "reason": "case 8"})
    assert by_query.status_code == 201, by_query.text
    assert (by_query.json()["query"], by_query.json()["recorded"]) == ("apifreeword", 1)

    # Scoped to another tenant, the admin does not find acme's hold.
    elsewhere = await env.client.request("DELETE", f"/holds/{hold['id']}", env.tokens.admin,
                                         params={"tenant": "globex"})
    assert elsewhere.status_code == 404
    assert elsewhere.json()["error"] == f"no active legal hold #{hold['id']} in tenant 'globex'"
    removed = await env.client.request("DELETE", f"/holds/{hold['id']}", env.tokens.admin,
                                       params={"tenant": "acme"})
    assert removed.status_code == 200, removed.text
    assert removed.json()["removed_by"] == "ops" and removed.json()["removed_at"] is not None
    again = await env.client.request("DELETE", f"/holds/{hold['id']}", env.tokens.admin)
    assert again.status_code == 404
    unknown = await env.client.request("DELETE", "/holds/987654321", env.tokens.admin)
    assert unknown.status_code == 404
    assert unknown.json()["error"] == "no active legal hold #987654321"
    erased = await env.client.request("DELETE", f"/messages/{held.archive_id}",
                                      env.tokens.acme)
    assert erased.status_code == 202, erased.text

    adds = await audit_of(env, "hold_add")
    assert [(e["actor"], e["count"], e["target"]["hold_id"])  # type: ignore[index]
            for e in adds] == [("ops", 1, by_query.json()["id"]), ("ops", 0, hold["id"])]
    removes = await audit_of(env, "hold_remove")
    assert [(e["actor"], e["target"]["hold_id"]) for e in removes] == [  # type: ignore[index]
        ("ops", hold["id"])]


async def test_tenant_tokens_cannot_change_holds_or_retention(env: Env) -> None:
    holds = Holds(env.db, env.ctx.backend)
    theirs = await holds.add("globex", "tenant", reason="case 9", actor="ops")
    body = {"tenant": "globex", "scope": "tenant", "reason": "mine now"}
    for token, tenant in ((env.tokens.acme, "globex"), (env.tokens.acme, "acme")):
        response = await env.client.post("/holds", token, json={**body, "tenant": tenant})
        assert response.status_code == 403, response.text
        assert "needs an admin token" in response.json()["error"]
    # Refused before the body is read: no hint whether it would parse.
    wrong_type = await env.client.post("/holds", env.tokens.acme, content=b"x",
                                       headers={"content-type": "text/plain"})
    assert wrong_type.status_code == 403
    for token, params in ((env.tokens.acme, {}), (env.tokens.globex, {}),
                          (env.tokens.globex, {"tenant": "globex"})):
        response = await env.client.request("DELETE", f"/holds/{theirs.id}", token,
                                            params=params)
        assert response.status_code == 403, response.text
    assert [h.id for h in await holds.list(None)] == [theirs.id]
    assert await holds.list("acme") == []

    for token in (env.tokens.acme, env.tokens.globex):
        put = await env.client.request("PUT", "/retention", token,
                                       json={"tenant": "globex", "days": 1})
        assert put.status_code == 403
        assert (await env.client.get("/retention", token)).status_code == 403
    shown = (await env.client.get("/retention", env.tokens.admin)).json()
    assert shown["policies"] == []
    assert await audit_of(env, "retention_set", "globex") == []
    assert await audit_of(env, "hold_add", "acme") == []


async def test_bad_holds_are_refused_naming_the_problem(env: Env) -> None:
    cases = [
        ({"tenant": "acme", "scope": "mailbox", "reason": "r"}, "needs the mailbox name"),
        ({"tenant": "acme", "scope": "tenant", "query": "x", "reason": "r"}, "takes no query"),
        ({"tenant": "acme", "scope": "folder", "reason": "r"}, "tenant, mailbox or query"),
        ({"tenant": "Not_A_Slug", "scope": "tenant", "reason": "r"}, "tenant"),
        ({"tenant": "acme", "scope": "tenant", "reason": "   "}, "needs a reason"),
        ({"tenant": "acme", "scope": "tenant"}, "needs field 'reason'"),
        ({"tenant": "acme", "scope": "query", "query": "!!!", "reason": "r"}, "bad hold"),
        ({"tenant": "acme", "scope": "tenant", "reason": "r", "until": "2030"},
         "unknown field(s) 'until'"),
        ({"tenant": "acme", "scope": "tenant", "reason": 5}, "'reason' must be a string"),
    ]
    for body, says in cases:
        response = await env.client.post("/holds", env.tokens.admin, json=body)
        assert response.status_code == 400, (body, response.text)
        assert says in response.json()["error"], (body, response.json())
    assert await Holds(env.db, env.ctx.backend).list(None) == []
    assert await audit_of(env, "hold_add") == []


async def test_request_bodies_are_bounded_json_objects(env: Env) -> None:
    async def put(content: bytes, content_type: str | None = "application/json",
                  **headers: str) -> tuple[int, str]:
        sent = dict(headers)
        if content_type is not None:
            sent["content-type"] = content_type
        response = await env.client.request("PUT", "/retention", env.tokens.admin,
                                            content=content, headers=sent)
        return response.status_code, response.json().get("error", "")

    good = b'{"tenant": "acme", "days": 30}'
    assert (await put(good, "text/plain"))[0] == 415
    assert (await put(good, None))[0] == 415
    assert (await put(good, "application/json; charset=latin-1"))[0] == 415
    status, error = await put(b" " * (64 * 1024) + good)
    assert (status, error) == (413, "the request body is larger than 65536 bytes")

    async def chunked() -> AsyncIterator[bytes]:  # no Content-Length: read until too large
        for _ in range(100):
            yield b" " * 1024

    response = await env.client.http.put("/retention", content=chunked(), headers={
        "authorization": f"Bearer {env.tokens.admin}", "content-type": "application/json"})
    assert response.status_code == 413, response.text
    for raw, says in ((b"\xff", "not valid UTF-8"), (b"{", "not valid JSON"),
                      (b"[1]", "must be a JSON object, got an array"),
                      (b'{"tenant": "acme", "tenant": "acme", "days": 1}', "twice"),
                      (b'{"tenant": "acme", "days": 1, "weeks": 2}', "unknown field(s) 'weeks'"),
                      (b'{"tenant": "acme", "days": NaN}', "NaN is not a number")):
        status, error = await put(raw)
        assert status == 400 and says in error, (raw, error)
    # None of that changed anything; a good body does.
    shown = (await env.client.get("/retention", env.tokens.admin)).json()
    assert shown["policies"] == []
    assert (await put(good))[0] == 200


async def test_retention_is_shown_and_set_through_the_api(env: Env) -> None:
    shown = (await env.client.get("/retention", env.tokens.admin)).json()
    assert shown == {"tenant": None, "interval_s": env.ctx.settings.retention.interval,
                     "policies": []}
    response = await env.client.request("PUT", "/retention", env.tokens.admin,
                                        json={"tenant": "acme", "days": 30})
    assert response.status_code == 200, response.text
    policy = response.json()["policy"]
    assert (policy["tenant"], policy["days"], policy["source"], policy["set_by"]) == (
        "acme", 30, "database", "ops")
    listed = (await env.client.get("/retention", env.tokens.admin)).json()["policies"]
    assert [(p["tenant"], p["days"]) for p in listed] == [("acme", 30)]
    only_globex = await env.client.get("/retention", env.tokens.admin,
                                       params={"tenant": "globex"})
    assert only_globex.json() == {"tenant": "globex",
                                  "interval_s": env.ctx.settings.retention.interval,
                                  "policies": []}
    for body, says in (({"tenant": "acme", "days": 0}, "must be 1..36500, got 0"),
                       ({"tenant": "acme", "days": "30"}, "must be a whole number or null"),
                       ({"tenant": "acme"}, "needs field 'days'"),
                       ({"days": 5}, "needs field 'tenant'"),
                       ({"tenant": "Not_A_Slug", "days": 5}, "bad retention")):
        bad = await env.client.request("PUT", "/retention", env.tokens.admin, json=body)
        assert bad.status_code == 400 and says in bad.json()["error"], (body, bad.text)
    cleared = await env.client.request("PUT", "/retention", env.tokens.admin,
                                       json={"tenant": "acme", "days": None})
    assert cleared.status_code == 200 and cleared.json() == {"tenant": "acme", "policy": None}
    assert (await env.client.get("/retention", env.tokens.admin)).json()["policies"] == []
    entries = await audit_of(env, "retention_set")
    assert [(e["actor"], e["target"]) for e in entries] == [
        ("ops", {"days": None}), ("ops", {"days": 30})]


async def test_clearing_retention_goes_back_to_the_configured_days(
        db: Database, database_url: str, fast_settings: QueueSettings) -> None:
    configured = RetentionSettings(days=(("globex", 90),))
    async with open_env(db, database_url, fast_settings, retention=configured) as env:
        async def shown() -> list[tuple[str, int, str, str | None]]:
            policies = (await env.client.get("/retention", env.tokens.admin)).json()["policies"]
            return [(p["tenant"], p["days"], p["source"], p["set_by"]) for p in policies]

        assert await shown() == [("globex", 90, "config", None)]
        response = await env.client.request("PUT", "/retention", env.tokens.admin,
                                            json={"tenant": "globex", "days": 10})
        assert response.json()["policy"]["source"] == "database"
        assert await shown() == [("globex", 10, "database", "ops")]
        response = await env.client.request("PUT", "/retention", env.tokens.admin,
                                            json={"tenant": "globex", "days": None})
        assert response.status_code == 200
        assert response.json()["policy"] == {"tenant": "globex", "days": 90, "source": "config",
                                             "set_by": None, "set_at": None}
        assert await shown() == [("globex", 90, "config", None)]


async def test_fuzzed_bodies_with_an_admin_token_agree_with_the_spec(
        env: Env, tmp_path: Path) -> None:
    """test_api fuzzes with a tenant token, which the body endpoints refuse
    (403) before reading a body: here schemathesis sends them bodies as an
    admin. PUT /retention's schema says all there is to a valid body, so
    every check runs; a valid-looking hold can still be refused for what a
    schema cannot say (a query of punctuation only, a blank reason), so
    POST /holds runs every check but "valid data is accepted"."""
    schemathesis = Path(sys.executable).with_name("schemathesis")
    runs = ((["--include-path", "/retention"], [], 2),
            (["--include-name", "POST /holds"],
             ["--exclude-checks", "positive_data_acceptance"], 1))
    for include, exclude, operations in runs:
        result = await trio.run_process(
            [str(schemathesis), "run", f"http://127.0.0.1:{env.port}/openapi.yaml",
             "--checks", "all", *exclude, "--max-examples", "15", "--seed", "13",
             "--no-color", "--request-timeout", "60", *include,
             "-H", f"Authorization: Bearer {env.tokens.admin}"],
            capture_stdout=True, capture_stderr=True, check=False, cwd=tmp_path)
        output = result.stdout.decode(errors="replace") + result.stderr.decode(errors="replace")
        assert result.returncode == 0, output[-6000:]
        assert re.search(r"([1-9][0-9]*) generated, \1 passed", output), output[-2000:]
        assert f"Selected: {operations}/" in output, output[-2000:]
    # It did get through: retention was set and holds added, all audited as the token.
    entries = (await env.client.get("/audit", env.tokens.admin,
                                    params={"limit": 1000})).json()["entries"]
    assert {e["action"] for e in entries} >= {"retention_set", "hold_add"}
    assert {e["actor"] for e in entries} == {"ops"}
