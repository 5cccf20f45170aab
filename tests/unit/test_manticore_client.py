"""Wire-level tests of the Manticore backend against the in-process stand-in
(tests/support/manticore_standin.py): real HTTP over loopback, real httpx,
the stand-in answering with the bodies and status codes a Manticore server
gives (mail-notes 3 and 6). No Manticore runs on these machines."""

from __future__ import annotations

import base64
import json
import socket
import ssl
from collections.abc import AsyncIterator, Iterator
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

import httpx
import pytest
import trio

from nexarch_events.errors import ConfigurationError
from nexarch_events.index.base import (
    IndexDocument,
    IndexRejected,
    IndexUnavailable,
    InvalidQuery,
    SearchQuery,
    SearchResult,
    epoch_seconds,
)
from nexarch_events.index.factory import open_index
from nexarch_events.index.manticore import (
    FIELD_WEIGHTS,
    DuplicateId,
    ManticoreBackend,
    SchemaMismatch,
    TableMissing,
    translate_query,
)
from nexarch_events.settings import Settings
from tests.support.manticore_standin import (
    JSON_CONTENT_TYPE,
    ManticoreStandIn,
    open_manticore_standin,
)

TABLE = "nexarch_mail_acme"
T0 = datetime(2024, 3, 1, tzinfo=UTC)


@pytest.fixture
async def standin() -> AsyncIterator[ManticoreStandIn]:
    async with open_manticore_standin() as server:
        yield server


@pytest.fixture
async def backend(standin: ManticoreStandIn) -> AsyncIterator[ManticoreBackend]:
    # Plain http: verify does nothing here, and building the default verifying
    # context costs ~80 ms a test. The TLS tests below use the defaults.
    async with ManticoreBackend(standin.url, timeout=2.0, verify=False) as client:
        yield client


def doc(archive_id: int, tenant: str = "acme", *, subject: str = "hello",
        body: str = "nothing to see", sender: str = "Bob <bob@example.org>",
        addresses: tuple[str, ...] = ("bob@example.org",), recipients: str = "alice@example.org",
        attachment_names: tuple[str, ...] = (), attachment_text: str = "",
        sent_at: datetime | None = T0, mailboxes: tuple[str, ...] = ("INBOX",),
        size_bytes: int = 100) -> IndexDocument:
    return IndexDocument(archive_id=archive_id, tenant_slug=tenant, subject=subject,
                         sender=sender, sender_addresses=addresses, recipients=recipients,
                         body=body, attachment_names=attachment_names,
                         attachment_text=attachment_text, sent_at=sent_at,
                         mailboxes=mailboxes, size_bytes=size_bytes)


async def ids(backend: ManticoreBackend, text: str, tenant: str = "acme", **filters: Any
              ) -> set[int]:
    result = await backend.search(SearchQuery(tenant, text, limit=1000, **filters))
    return {hit.archive_id for hit in result.hits}


async def raw(standin: ManticoreStandIn, path: str, body: str | bytes,
              content_type: str = "application/json") -> httpx.Response:
    async with httpx.AsyncClient(base_url=standin.url, verify=False) as client:
        return await client.post(path, content=body, headers={"Content-Type": content_type})


# -- schema ------------------------------------------------------------------


async def test_ensure_schema_creates_the_tenant_table_named_from_the_slug(
        standin: ManticoreStandIn, backend: ManticoreBackend) -> None:
    await backend.ensure_schema("acme-corp")

    table = standin.tables["nexarch_mail_acme_corp"]
    assert table.columns == {
        "subject": "text", "body": "text", "sender": "text", "recipients": "text",
        "attachment_names": "text", "attachment_text": "text",
        "sender_address": "string", "sender_ids": "multi64", "mailbox_ids": "multi64",
        "sent_at": "bigint", "dated": "bool", "size_bytes": "bigint",
        "received_at": "bigint", "received": "bool", "version": "bigint", "deleted": "bool",
    }
    assert table.options["morphology"] == "stem_en, libstemmer_de"
    assert table.options["charset_table"].startswith("non_cont, U+00E4, U+00C4->U+00E4")
    assert (table.options["ngram_chars"], table.options["ngram_len"]) == ("cont", "1")
    create, describe = standin.requests  # then DESC checks the columns
    assert describe.body.decode() == "DESC nexarch_mail_acme_corp"
    request = create
    assert (request.path, request.query) == ("/sql", "mode=raw")
    sql = request.body.decode()
    assert sql.startswith("CREATE TABLE IF NOT EXISTS nexarch_mail_acme_corp (")
    assert ";" not in sql  # one statement per request (mail-notes 6)


async def test_ensure_schema_is_idempotent_and_keeps_documents(
        standin: ManticoreStandIn, backend: ManticoreBackend) -> None:
    await backend.ensure_schema("acme")
    await backend.upsert([doc(1)])
    await backend.ensure_schema("acme")

    assert list(standin.tables) == [TABLE]
    assert set(standin.tables[TABLE].docs) == {1}


async def test_a_custom_prefix_names_the_table(standin: ManticoreStandIn) -> None:
    async with ManticoreBackend(standin.url, table_prefix="mail_") as client:
        await client.ensure_schema("a-b-c")
    assert list(standin.tables) == ["mail_a_b_c"]


async def test_manticore_refuses_a_hyphen_in_a_table_name_so_the_slug_is_mapped(
        standin: ManticoreStandIn) -> None:
    reply = await raw(standin, "/sql?mode=raw", "CREATE TABLE acme-corp (subject text)",
                      "text/plain")
    assert reply.status_code == 500
    assert reply.json()["error"].startswith("P02: syntax error")


@pytest.mark.parametrize("slug", ["Acme", "acme_corp", "-acme", "", "a" * 64,
                                  "x (a text); DROP TABLE y", "acme corp"])
async def test_an_invalid_slug_is_rejected_before_any_request(
        standin: ManticoreStandIn, backend: ManticoreBackend, slug: str) -> None:
    for call in (backend.ensure_schema(slug), backend.delete(slug, [1]),
                 backend.document_ids(slug)):
        with pytest.raises(IndexRejected, match="tenant slug"):
            await call
    assert standin.requests == []


@pytest.mark.parametrize(("url", "prefix"), [
    ("ftp://127.0.0.1:9308", "nexarch_mail_"),
    ("not a url", "nexarch_mail_"),
    ("http://127.0.0.1:9308", "Bad-Prefix"),
    ("http://127.0.0.1:9308", "1mail"),
    ("http://127.0.0.1:9308", "mail_`; DROP"),
])
def test_invalid_configuration_is_refused(url: str, prefix: str) -> None:
    with pytest.raises(ConfigurationError):
        ManticoreBackend(url, table_prefix=prefix)


# -- upsert ------------------------------------------------------------------


async def test_upsert_sends_one_bulk_batch_of_replace_lines(
        standin: ManticoreStandIn, backend: ManticoreBackend) -> None:
    await backend.ensure_schema("acme")
    await backend.upsert([
        doc(1, addresses=("Bob@Example.org", "carol@example.org"),
            mailboxes=("INBOX", "Archive")),
        doc(2, sent_at=None),
        doc(3, attachment_names=("a.pdf", "b.txt")),
    ])

    [bulk] = standin.requests_to("/bulk")
    assert bulk.headers["content-type"] == "application/x-ndjson"
    lines = bulk.ndjson()
    assert [list(line) for line in lines] == [["replace"]] * 3
    assert [line["replace"]["id"] for line in lines] == [1, 2, 3]
    stored = standin.tables[TABLE].docs
    assert set(stored) == {1, 2, 3}
    assert stored[1]["sender_address"] == "bob@example.org"
    assert len(stored[1]["sender_ids"]) == 2
    assert len(stored[1]["mailbox_ids"]) == 2
    assert stored[1]["sent_at"] == epoch_seconds(T0)
    assert stored[2]["sent_at"] == 0
    assert stored[3]["attachment_names"] == "a.pdf\nb.txt"


async def test_replaying_a_batch_is_harmless_and_replaces_documents(
        standin: ManticoreStandIn, backend: ManticoreBackend) -> None:
    await backend.ensure_schema("acme")
    batch = [doc(1), doc(2), doc(3)]
    await backend.upsert(batch)
    await backend.upsert(batch)
    await backend.upsert([doc(2, subject="changed")])

    stored = standin.tables[TABLE].docs
    assert set(stored) == {1, 2, 3}
    assert stored[2]["subject"] == "changed"


async def test_upsert_strips_nul_and_lone_surrogates(
        standin: ManticoreStandIn, backend: ManticoreBackend) -> None:
    await backend.ensure_schema("acme")
    await backend.upsert([doc(1, body="pay\x00ment due \udcff now"),
                          doc(2, subject="Grü\x00ße", body="Grüße \udcff 日本 ok"),
                          doc(3, body="Grüße 日本 as sent")])

    docs = standin.tables[TABLE].docs
    assert docs[1]["body"] == "payment due \ufffd now"
    assert (docs[2]["subject"], docs[2]["body"]) == ("Grüße", "Grüße \ufffd 日本 ok")
    assert docs[3]["body"] == "Grüße 日本 as sent"
    assert await ids(backend, "payment") == {1}


async def test_upsert_creates_a_missing_table_and_sends_the_batch_again(
        standin: ManticoreStandIn, backend: ManticoreBackend) -> None:
    await backend.upsert([doc(1), doc(2)])

    # /sql twice: CREATE TABLE IF NOT EXISTS, then DESC checks the columns
    assert [r.path for r in standin.requests] == ["/bulk", "/sql", "/sql", "/bulk"]
    assert set(standin.tables[TABLE].docs) == {1, 2}


async def test_upsert_keeps_tenants_in_their_own_tables(
        standin: ManticoreStandIn, backend: ManticoreBackend) -> None:
    await backend.ensure_schema("acme")
    await backend.ensure_schema("beta")
    await backend.upsert([doc(1), doc(2, "beta"), doc(3)])

    assert set(standin.tables[TABLE].docs) == {1, 3}
    assert set(standin.tables["nexarch_mail_beta"].docs) == {2}


async def test_a_table_that_stays_missing_is_rejected_with_advice(
        standin: ManticoreStandIn, backend: ManticoreBackend) -> None:
    absent = {"items": [{"replace": {"error": {"type": f"table '{TABLE}' absent",
                                               "table": TABLE}, "status": 409}}],
              "current_line": 1, "skipped_lines": 1, "errors": True,
              "error": f"table '{TABLE}' absent"}
    standin.answer_next(500, absent, count=2, endpoint="/bulk")

    with pytest.raises(TableMissing, match="ensure_schema") as caught:
        await backend.upsert([doc(1)])
    assert "absent" in str(caught.value) and "/bulk" in str(caught.value)


async def test_a_failing_batch_is_rolled_back_whole_and_rejected(
        standin: ManticoreStandIn, backend: ManticoreBackend) -> None:
    # A table from an older schema: the batch hits an unknown column.
    reply = await raw(standin, "/sql?mode=raw", f"CREATE TABLE {TABLE} (subject text)",
                      "text/plain")
    assert reply.status_code == 200

    with pytest.raises(IndexRejected, match="unknown column") as caught:
        await backend.upsert([doc(1), doc(2)])
    assert "schema" in str(caught.value)
    assert standin.tables[TABLE].docs == {}


# -- delete ------------------------------------------------------------------


async def test_delete_removes_the_given_ids_and_ignores_unknown_ones(
        standin: ManticoreStandIn, backend: ManticoreBackend) -> None:
    await backend.upsert([doc(i) for i in range(1, 6)])
    await backend.delete("acme", [2, 4, 99, 0, -1])

    assert set(standin.tables[TABLE].docs) == {1, 3, 5}
    [request] = standin.requests_to("/bulk")[-1:]
    assert [line["delete"]["id"] for line in request.ndjson()] == [2, 4, 99]


async def test_delete_on_a_missing_table_or_of_nothing_is_a_no_op(
        standin: ManticoreStandIn, backend: ManticoreBackend) -> None:
    await backend.delete("acme", [1, 2])
    assert [r.path for r in standin.requests] == ["/bulk"]
    await backend.delete("acme", [])
    assert len(standin.requests) == 1


# -- document_ids ------------------------------------------------------------


async def test_document_ids_reads_every_id_past_the_1000_window(
        standin: ManticoreStandIn, backend: ManticoreBackend) -> None:
    await backend.upsert([doc(i) for i in range(1, 2501)])

    assert await backend.document_ids("acme") == set(range(1, 2501))
    searches = [r.json() for r in standin.requests_to("/search")]
    assert len(searches) == 3
    assert all(s.get("offset", 0) == 0 and s["limit"] <= s["max_matches"] for s in searches)


async def test_a_tenant_without_a_table_has_no_document_ids(
        backend: ManticoreBackend) -> None:
    assert await backend.document_ids("acme") == set()


# -- search ------------------------------------------------------------------


async def test_words_phrases_exclusions_and_or(backend: ManticoreBackend) -> None:
    await backend.upsert([
        doc(1, body="the quarterly invoice march report"),
        doc(2, body="invoice for april"),
        doc(3, body="march madness"),
        doc(4, body="an invoice sent in march"),
    ])

    assert await ids(backend, "invoice march") == {1, 4}
    assert await ids(backend, '"invoice march"') == {1}
    assert await ids(backend, "invoice -april") == {1, 4}
    assert await ids(backend, 'invoice -"invoice march"') == {2, 4}
    assert await ids(backend, "april OR madness") == {2, 3}
    assert await ids(backend, "april or madness invoice") == {2}
    assert await ids(backend, "INVOICE MARCH") == {1, 4}


async def test_subject_matches_rank_above_body_matches(backend: ManticoreBackend) -> None:
    assert FIELD_WEIGHTS["subject"] > FIELD_WEIGHTS["sender"] > FIELD_WEIGHTS["body"] \
        > FIELD_WEIGHTS["attachment_text"]
    await backend.upsert([
        doc(1, subject="budget", body="see below", sent_at=T0),
        # Newer: without the weights it would come first on a tie.
        doc(2, subject="misc", body="the budget is attached", sent_at=T0 + timedelta(days=1)),
        doc(3, subject="misc", body="nothing", attachment_text="budget table",
            sent_at=T0 + timedelta(days=2)),
    ])

    result = await backend.search(SearchQuery("acme", "budget"))
    assert [hit.archive_id for hit in result.hits] == [1, 2, 3]
    assert result.hits[0].score > result.hits[1].score > result.hits[2].score


async def test_hits_carry_fields_and_a_safe_highlighted_snippet(
        backend: ManticoreBackend) -> None:
    await backend.upsert([
        doc(1, subject="Rechnung März", sender="Zoë <zoe@example.org>",
            body="the invoice <script>alert(1)</script> is due"),
        doc(2, subject="Invoice", body="see the attachment", sent_at=None),
    ])

    result = await backend.search(SearchQuery("acme", "invoice"))
    assert result.total == 2
    by_id = {hit.archive_id: hit for hit in result.hits}
    first = by_id[1]
    assert (first.subject, first.sender, first.sent_at) == (
        "Rechnung März", "Zoë <zoe@example.org>", T0)
    assert "<mark>invoice</mark>" in first.snippet
    assert "&lt;script&gt;" in first.snippet and "<script>" not in first.snippet
    # Only the subject matched: its fragment is the snippet.
    assert by_id[2].snippet == "<mark>Invoice</mark>"
    assert by_id[2].sent_at is None


async def test_the_sender_filter_matches_any_from_address_case_insensitively(
        backend: ManticoreBackend) -> None:
    await backend.upsert([
        doc(1, addresses=("a@x.org", "b@y.org"), body="report"),
        doc(2, addresses=("c@z.org",), body="report"),
        doc(3, addresses=(), body="report"),
    ])

    assert await ids(backend, "report", sender="B@Y.org") == {1}
    assert await ids(backend, "report", sender=" a@x.org ") == {1}
    assert await ids(backend, "report", sender="c@z.org") == {2}
    assert await ids(backend, "report", sender="nobody@x.org") == set()


async def test_the_mailbox_filter_is_exact(backend: ManticoreBackend) -> None:
    await backend.upsert([
        doc(1, mailboxes=("INBOX", "Archive/2024 \"Q1\""), body="report"),
        doc(2, mailboxes=("Sent",), body="report"),
    ])

    assert await ids(backend, "report", mailbox='Archive/2024 "Q1"') == {1}
    assert await ids(backend, "report", mailbox="Sent") == {2}
    assert await ids(backend, "report", mailbox="sent") == set()


async def test_the_date_range_is_half_open_and_leaves_out_undated_mail(
        backend: ManticoreBackend) -> None:
    day = timedelta(days=1)
    await backend.upsert([
        doc(1, sent_at=T0, body="report"),
        doc(2, sent_at=T0 + day, body="report"),
        doc(3, sent_at=T0 + 2 * day, body="report"),
        doc(4, sent_at=None, body="report"),
    ])

    assert await ids(backend, "report") == {1, 2, 3, 4}
    assert await ids(backend, "report", date_from=T0 + day, date_to=T0 + 2 * day) == {2}
    assert await ids(backend, "report", date_to=T0 + 2 * day) == {1, 2}
    assert await ids(backend, "report", date_from=T0 + day) == {2, 3}


async def test_paging_past_the_1000_result_window(
        standin: ManticoreStandIn, backend: ManticoreBackend) -> None:
    await backend.upsert([doc(i, body="common words", sent_at=T0 + timedelta(minutes=i))
                          for i in range(1, 2501)])

    page = await backend.search(SearchQuery("acme", "common", offset=1990, limit=20))
    assert page.total == 2500
    # Equal scores: newest first.
    assert [hit.archive_id for hit in page.hits] == list(range(510, 490, -1))
    last = await backend.search(SearchQuery("acme", "common", offset=2490, limit=20))
    assert [hit.archive_id for hit in last.hits] == list(range(10, 0, -1))
    sent = standin.requests_to("/search")[-1].json()
    assert sent["max_matches"] >= sent["offset"] + sent["limit"]


@pytest.mark.parametrize("body", [
    # mail-notes 6, verbatim
    {"error": f"unknown local table(s) '{TABLE}' in search request"},
    # mail-notes 3.2: index_not_found_exception → 404
    {"error": {"type": "index_not_found_exception", "reason": "no such index"}, "status": 404},
])
async def test_searching_a_tenant_without_a_table_finds_nothing(
        standin: ManticoreStandIn, backend: ManticoreBackend, body: Any) -> None:
    # As the Postgres backend answers: a tenant with no table has no mail.
    result = await backend.search(SearchQuery("acme", "invoice"))
    assert (result.total, result.hits) == (0, ())
    await backend.ensure_schema("acme")
    standin.answer_next(404 if "status" in body else 500, body, endpoint="/search")
    result = await backend.search(SearchQuery("acme", "invoice"))
    assert (result.total, result.hits) == (0, ())


# -- the user's query language -------------------------------------------------

HOSTILE = [
    "@subject x", '"', ")(", "\\", "*", "^$", "a | b", "MAYBE", "NEAR/3", "=exact",
    "!@#$%^&*()", "invoice NEAR/3 march", "invoice MAYBE march", '"invoice march"~5',
    '"invoice march"/1', "invoice << march", "@(subject,body) invoice", "@!subject beta",
    "ZONE:(h3) invoice", "REGEX(/inv.*/)", "invoice*", "*voice", "inv?ice", "%", "-invoice",
    "- invoice", "--invoice", "OR", "invoice OR", "OR invoice", "invoice OR OR march",
    "\\\\invoice\\", "'; DROP TABLE nexarch_mail_beta; --", '{"match_all": {}}',
    "invoice\nbeta", "SENTENCE PARAGRAPH", "=\"invoice\"", "^invoice$", "invoice^2",
    "(invoice | beta) @sender beta", "ÄÖÜ ß",
    "a" * 1000, "\" OR \"", "@@relaxed @nosuchfield invoice",
]


@pytest.mark.parametrize(("text", "expected"), [
    ("invoice march", "invoice march"),
    ('"invoice march"', '"invoice march"'),
    ("invoice -april", "invoice -april"),
    ('invoice -"end of march"', 'invoice -"end of march"'),
    ("april OR may june", "(april | may) june"),
    ("a or b or c", "(a | b | c)"),
    ("foo@bar.com", '"foo bar com"'),
    ("@subject x", "subject x"),
    ("NEAR/3 MAYBE =exact", '"near 3" maybe exact'),
    ("a | b", "a b"),
    ('unclosed "quote here', 'unclosed "quote here"'),
    # Only ASCII is lowered (operator keywords); the table's charset_table folds the rest.
    ("Größe ÄRGER", "größe Ärger"),
])
def test_translate_query(text: str, expected: str) -> None:
    assert translate_query(text) == expected


@pytest.mark.parametrize("text", ['"', ")(", "\\", "*", "^$", "", "   ", "OR", "-invoice",
                                  '-"a b" -c'])
def test_queries_with_nothing_to_search_for_are_invalid(text: str) -> None:
    with pytest.raises(InvalidQuery):
        translate_query(text)


@pytest.mark.parametrize("text", HOSTILE)
async def test_hostile_queries_never_reach_manticore_as_syntax(
        backend: ManticoreBackend, text: str) -> None:
    await backend.upsert([doc(1, body="invoice march ÄÖÜ ß", subject="beta test")])
    try:
        result = await backend.search(SearchQuery("acme", text))
    except InvalidQuery:
        return
    assert isinstance(result, SearchResult)


async def test_punctuated_words_are_searched_literally(backend: ManticoreBackend) -> None:
    await backend.upsert([
        doc(1, body="write to foo@bar.com about the 2024-01-05 meeting"),
        doc(2, body="foo and bar at the com"),
    ])

    assert await ids(backend, "foo@bar.com") == {1}
    assert await ids(backend, "2024-01-05") == {1}
    assert await ids(backend, "@foo bar") == {1, 2}


async def test_a_tenant_never_sees_another_tenants_mail_whatever_the_query(
        standin: ManticoreStandIn, backend: ManticoreBackend) -> None:
    await backend.upsert([doc(i, "alpha", subject="invoice march", body="alpha mail")
                          for i in (1, 2, 3)])
    await backend.upsert([doc(i, "beta", subject="invoice march beta", body="beta mail")
                          for i in (101, 102, 103)])
    before = len(standin.requests)

    for text in [*HOSTILE, "invoice", "beta", "invoice OR beta", "mail", "beta mail"]:
        try:
            result = await backend.search(SearchQuery("alpha", text, limit=1000))
        except InvalidQuery:
            continue
        assert {hit.archive_id for hit in result.hits} <= {1, 2, 3}, text
    assert await ids(backend, "beta", "alpha") == set()
    assert await ids(backend, "invoice", "beta") == {101, 102, 103}
    tables = {r.json()["table"] for r in standin.requests[before:] if r.path == "/search"}
    assert tables == {"nexarch_mail_alpha", "nexarch_mail_beta"}


# -- error mapping -----------------------------------------------------------

HTML = "text/html"
TEXT = "text/plain"


@pytest.mark.parametrize(("status", "body", "content_type", "error", "fragment"), [
    # mail-notes 6: search errors are HTTP 500 with a plain string
    (500, {"error": f"table {TABLE}: unknown column: nosuchattr"}, None,
     IndexRejected, "unknown column: nosuchattr"),
    (500, {"error": "offset out of bounds (offset=1000, max_matches=1000)"}, None,
     IndexRejected, "offset out of bounds"),
    (500, {"error": f"table {TABLE}: query error: syntax error, unexpected ')'"}, None,
     IndexRejected, "syntax error"),
    (400, {"error": "\"table\" property missing"}, None, IndexRejected, "property missing"),
    # A table of another schema (searchd's message for a missing sort
    # attribute): permanent, not "retry later"
    (500, {"error": f"table {TABLE}: sort-by attribute 'dated' not found"}, None,
     IndexRejected, "sort-by attribute"),
    # 5xx without a documented permanent message: try again later
    (500, {"error": "internal error: worker pool exhausted"}, None,
     IndexUnavailable, "worker pool exhausted"),
    (500, {"unexpected": "shape"}, None, IndexUnavailable, "HTTP 500"),
    (503, {"error": "server maxed out, retry in a second"}, None, IndexUnavailable, "maxed out"),
    (429, {"error": "too many requests"}, None, IndexUnavailable, "too many requests"),
    (502, "<html><body>Bad Gateway</body></html>", HTML, IndexUnavailable, "non-JSON"),
    (500, "Internal Server Error", TEXT, IndexUnavailable, "non-JSON"),
    (200, "<html>captive portal</html>", HTML, IndexUnavailable, "non-JSON"),
    (200, "", TEXT, IndexUnavailable, "empty"),
    (200, {"took": 0}, None, IndexUnavailable, "hits"),
    (400, "Bad Request", TEXT, IndexRejected, "non-JSON"),
    (301, "", TEXT, IndexRejected, "HTTP 301"),
])
async def test_search_errors_map_to_unavailable_or_rejected(
        standin: ManticoreStandIn, backend: ManticoreBackend, status: int, body: Any,
        content_type: str | None, error: type[Exception], fragment: str) -> None:
    await backend.ensure_schema("acme")
    standin.answer_next(status, body, endpoint="/search",
                        content_type=content_type or JSON_CONTENT_TYPE)

    with pytest.raises(IndexUnavailable if error is IndexUnavailable else IndexRejected
                       ) as caught:
        await backend.search(SearchQuery("acme", "invoice"))
    assert type(caught.value) is error
    assert "/search" in str(caught.value)
    assert fragment in str(caught.value)


@pytest.mark.parametrize(("status", "body", "outage"), [
    (503, {"error": "server maxed out, retry in a second"}, True),
    (429, {"error": "too many requests"}, True),
    (502, "<html><body>Bad Gateway</body></html>", True),
    (503, "Service Unavailable", True),
    # May be the request's own doing (a huge document): charged as a failure.
    (500, {"error": "internal error: worker pool exhausted"}, False),
    (500, "Internal Server Error", False),
    (504, "Gateway Timeout", False),
])
async def test_only_a_server_that_is_down_or_busy_is_an_outage(
        standin: ManticoreStandIn, backend: ManticoreBackend, status: int, body: Any,
        outage: bool) -> None:
    """IndexUnavailable.outage decides whether a job that met it is charged
    an attempt (models.Failure.outage): only answers that say the server is
    down or busy whatever was asked are outages."""
    await backend.ensure_schema("acme")
    standin.answer_next(status, body, endpoint="/bulk",
                        content_type=TEXT if isinstance(body, str) else JSON_CONTENT_TYPE)
    with pytest.raises(IndexUnavailable) as caught:
        await backend.upsert([doc(1)])
    assert caught.value.outage is outage


async def test_a_server_that_refuses_connections_is_an_outage() -> None:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        port = probe.getsockname()[1]  # closed again: nothing listens there
    async with ManticoreBackend(f"http://127.0.0.1:{port}") as down:
        with pytest.raises(IndexUnavailable, match="cannot connect") as caught:
            await down.upsert([doc(1)])
    assert caught.value.outage is True


@pytest.mark.parametrize(("status", "body", "error", "fragment"), [
    # mail-notes 6, verbatim: a failing batch
    (500, {"items": [{"replace": {"error": {"type": "duplicate id '1'", "table": TABLE},
                                  "status": 409}}],
           "current_line": 2, "skipped_lines": 2, "errors": True, "error": "duplicate id '1'"},
     DuplicateId, "duplicate id '1'"),  # an IndexRejected the fenced writes tell apart
    (500, {"items": [{"replace": {"error": {"type": "unknown column: 'nosuchfield'",
                                            "table": TABLE}, "status": 409}}],
           "current_line": 1, "skipped_lines": 1, "errors": True,
           "error": "unknown column: 'nosuchfield'"},
     IndexRejected, "unknown column: 'nosuchfield'"),
    (400, {"items": [], "current_line": 1, "skipped_lines": 1, "errors": True,
           "error": "unable to parse: "}, IndexRejected, "unable to parse"),
    (400, {"error": {"type": "parse_exception",
                     "reason": "Content-Type must be application/x-ndjson"}, "status": 400},
     IndexRejected, "Content-Type must be application/x-ndjson"),
    # a 200 that still reports errors
    (200, {"items": [], "current_line": 1, "skipped_lines": 1, "errors": True,
           "error": "unable to parse: "}, IndexRejected, "unable to parse"),
    (503, "Service Unavailable", IndexUnavailable, "HTTP 503"),
])
async def test_bulk_errors_map_to_unavailable_or_rejected(
        standin: ManticoreStandIn, backend: ManticoreBackend, status: int, body: Any,
        error: type[Exception], fragment: str) -> None:
    await backend.ensure_schema("acme")
    standin.answer_next(status, body, endpoint="/bulk",
                        content_type=TEXT if isinstance(body, str) else JSON_CONTENT_TYPE)

    with pytest.raises(error) as caught:
        await backend.upsert([doc(1)])
    assert type(caught.value) is error
    assert "/bulk" in str(caught.value) and fragment in str(caught.value)


@pytest.mark.parametrize(("status", "body", "error", "fragment"), [
    # mail-notes 6: /sql?mode=raw failure is HTTP 500 with one object
    (500, {"error": "P02: syntax error, unexpected identifier near 'CREAT TABLE oops'"},
     IndexRejected, "P02: syntax error"),
    (500, {"error": f"table '{TABLE}': CREATE TABLE failed: table '{TABLE}' already exists"},
     IndexRejected, "already exists"),
    (500, {"error": "Fuzzy search requires min_infix_len to be set"}, IndexRejected,
     "requires min_infix_len"),
    # a result-set array whose error field is set
    (200, [{"total": 0, "error": "unknown option 'foo'", "warning": ""}], IndexRejected,
     "unknown option 'foo'"),
    # mail-notes 6: /cli without Buddy (someone pointed us at the wrong thing)
    (501, {"error": "can not process /cli endpoint without buddy"}, IndexUnavailable,
     "without buddy"),
])
async def test_sql_errors_map_to_unavailable_or_rejected(
        standin: ManticoreStandIn, backend: ManticoreBackend, status: int, body: Any,
        error: type[Exception], fragment: str) -> None:
    standin.answer_next(status, body, endpoint="/sql")

    with pytest.raises(error) as caught:
        await backend.ensure_schema("acme")
    assert type(caught.value) is error
    assert "/sql" in str(caught.value) and fragment in str(caught.value)


async def test_credentials_are_sent_but_never_shown(standin: ManticoreStandIn) -> None:
    secret = "s3cr3t-passw0rd"
    async with ManticoreBackend(standin.url, auth=("indexer", secret)) as client:
        await client.ensure_schema("acme")
        standin.answer_next(401, {"error": "access denied"}, endpoint="/search")
        with pytest.raises(IndexRejected, match="credentials") as caught:
            await client.search(SearchQuery("acme", "invoice"))

    expected = "Basic " + base64.b64encode(f"indexer:{secret}".encode()).decode()
    assert standin.requests[0].headers["authorization"] == expected
    assert secret not in str(caught.value) and secret not in repr(client)
    assert "indexer" not in str(caught.value)


async def test_credentials_in_the_url_are_not_shown(standin: ManticoreStandIn) -> None:
    url = standin.url.replace("http://", "http://indexer:hunter2@")
    async with ManticoreBackend(url) as client:
        standin.fail_next()
        with pytest.raises(IndexUnavailable) as caught:
            await client.ensure_schema("acme")
    assert "hunter2" not in str(caught.value) and "hunter2" not in repr(client)


# -- transport failures -------------------------------------------------------


async def test_a_hanging_server_times_out_as_unavailable(standin: ManticoreStandIn) -> None:
    async with ManticoreBackend(standin.url, timeout=0.3) as client:
        standin.hang_next(10, endpoint="/sql")
        with trio.fail_after(5):
            start = trio.current_time()
            with pytest.raises(IndexUnavailable, match=r"no answer within 0\.3 s"):
                await client.ensure_schema("acme")
            assert trio.current_time() - start < 3
            await client.ensure_schema("acme")  # the next request is answered
    assert "nexarch_mail_acme" in standin.tables


async def test_an_answer_dripped_a_byte_at_a_time_times_out_in_all(
        standin: ManticoreStandIn) -> None:
    """httpx's timeout is per read: each byte restarted it, and a worker
    waited as long as the server kept dripping (found by an audit). The
    whole request is bounded by TOTAL_TIMEOUT_FACTOR x the timeout."""
    async with ManticoreBackend(standin.url, timeout=0.3) as client:
        await client.ensure_schema("acme")
        standin.drip_next(0.1, endpoint="/search")
        with trio.fail_after(10):
            with pytest.raises(IndexUnavailable, match=r"longer than 1\.2 s in all"):
                await client.search(SearchQuery("acme", "invoice"))


@pytest.mark.parametrize("body", [
    {}, [], {"status": "ok"}, {"items": [], "errors": False},
    # item-level failures under errors: false (or no "errors" at all)
    {"items": [{"replace": {"_id": 1, "status": 409, "error": "version conflict"}}]},
    {"items": [{"replace": {"_id": 1, "status": 500}}], "errors": False},
])
async def test_a_bulk_answer_that_does_not_say_it_applied_the_batch_is_no_success(
        standin: ManticoreStandIn, backend: ManticoreBackend, body: Any) -> None:
    # Found by an audit: any 2xx without a top-level "errors" was success,
    # so the job was acked with nothing indexed.
    await backend.ensure_schema("acme")
    standin.answer_next(200, body, endpoint="/bulk")
    with pytest.raises((IndexUnavailable, IndexRejected)):
        await backend.upsert([doc(1)])
    assert standin.tables[TABLE].docs == {}


@pytest.mark.parametrize("status", [429, 503])
async def test_a_busy_answer_naming_a_table_is_busy_not_missing(
        standin: ManticoreStandIn, backend: ManticoreBackend, status: int) -> None:
    # Found by an audit: the missing-table text won over the status, so an
    # unfenced delete (the erasure's re-check) was a no-op reported done,
    # and a search found nothing instead of saying "unavailable".
    await backend.ensure_schema("acme")
    await backend.upsert([doc(1)])
    busy = {"error": f"table '{TABLE}' absent, retry in a second"}
    standin.answer_next(status, busy, endpoint="/bulk")
    with pytest.raises(IndexUnavailable, match=f"HTTP {status}"):
        await backend.delete("acme", [1])
    standin.answer_next(status, busy, endpoint="/search")
    with pytest.raises(IndexUnavailable, match=f"HTTP {status}"):
        await backend.search(SearchQuery("acme", "hello"))
    assert set(standin.tables[TABLE].docs) == {1}


@pytest.mark.parametrize("body", [b"[" * 200_000 + b"]" * 200_000])
async def test_an_answer_nested_too_deep_to_read_is_unavailable(
        standin: ManticoreStandIn, backend: ManticoreBackend, body: bytes) -> None:
    await backend.ensure_schema("acme")
    standin.answer_next(200, body, endpoint="/search")
    with pytest.raises(IndexUnavailable, match="non-JSON"):
        await backend.search(SearchQuery("acme", "hello"))


@pytest.mark.parametrize("seconds", [2**62, -(2**62), 10**12])
async def test_a_stored_date_no_calendar_has_reads_as_unknown(
        standin: ManticoreStandIn, backend: ManticoreBackend, seconds: int) -> None:
    # One such row made every search that listed it fail (OSError, ValueError).
    await backend.ensure_schema("acme")
    await backend.upsert([doc(1, body="invoice")])
    standin.tables[TABLE].docs[1]["sent_at"] = seconds
    [hit] = (await backend.search(SearchQuery("acme", "invoice"))).hits
    assert hit.archive_id == 1 and hit.sent_at is None


async def test_an_empty_description_of_a_table_is_no_other_schema(
        standin: ManticoreStandIn, backend: ManticoreBackend) -> None:
    # A DESC answered with an empty result set was taken for "another
    # schema": a permanent error that failed the tenant's jobs for good.
    await backend.ensure_schema("acme")
    # (the CREATE TABLE IF NOT EXISTS before it gets the same, its usual answer)
    standin.answer_next(200, [{"total": 0, "error": "", "warning": ""}], count=2,
                        endpoint="/sql")
    with pytest.raises(IndexUnavailable, match="without the table's columns"):
        await backend.ensure_schema("acme")
    await backend.ensure_schema("acme")


async def test_a_refused_connection_is_unavailable(standin: ManticoreStandIn,
                                                   backend: ManticoreBackend) -> None:
    await backend.ensure_schema("acme")
    await standin.stop()

    with trio.fail_after(5):
        with pytest.raises(IndexUnavailable, match="cannot connect"):
            await backend.search(SearchQuery("acme", "invoice"))
        with pytest.raises(IndexUnavailable, match="cannot connect"):
            await backend.upsert([doc(1)])


async def test_a_connection_closed_without_an_answer_is_unavailable(
        standin: ManticoreStandIn, backend: ManticoreBackend) -> None:
    await backend.ensure_schema("acme")
    standin.drop_next(endpoint="/bulk")

    with trio.fail_after(5):
        with pytest.raises(IndexUnavailable, match="mid-request"):
            await backend.upsert([doc(1)])
        await backend.upsert([doc(1)])
    assert set(standin.tables[TABLE].docs) == {1}


async def test_a_503_then_success(standin: ManticoreStandIn, backend: ManticoreBackend) -> None:
    standin.fail_next(endpoint="/sql")
    with pytest.raises(IndexUnavailable, match="HTTP 503"):
        await backend.ensure_schema("acme")
    await backend.ensure_schema("acme")
    assert TABLE in standin.tables


async def test_https_to_a_plain_http_server_fails_as_unavailable(
        standin: ManticoreStandIn) -> None:
    url = standin.url.replace("http://", "https://")
    async with ManticoreBackend(url, timeout=2.0) as client:
        with trio.fail_after(5), pytest.raises(IndexUnavailable, match="TLS"):
            await client.ensure_schema("acme")
    assert standin.tables == {}


@pytest.fixture(scope="module")
def self_signed(tmp_path_factory: pytest.TempPathFactory) -> Iterator[tuple[Path, Path]]:
    """A throwaway self-signed certificate for 127.0.0.1, made with the
    ``cryptography`` package (a dependency), so no tool can be missing."""
    import ipaddress

    from cryptography import x509
    from cryptography.hazmat.primitives import hashes, serialization
    from cryptography.hazmat.primitives.asymmetric import ec
    from cryptography.x509.oid import NameOID

    key = ec.generate_private_key(ec.SECP256R1())
    name = x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, "127.0.0.1")])
    now = datetime.now(UTC)
    certificate = (
        x509.CertificateBuilder().subject_name(name).issuer_name(name)
        .public_key(key.public_key()).serial_number(x509.random_serial_number())
        .not_valid_before(now - timedelta(minutes=5))
        .not_valid_after(now + timedelta(days=2))
        .add_extension(x509.SubjectAlternativeName(
            [x509.IPAddress(ipaddress.ip_address("127.0.0.1"))]), critical=False)
        .sign(key, hashes.SHA256()))
    folder = tmp_path_factory.mktemp("tls")
    cert, key_path = folder / "cert.pem", folder / "key.pem"
    cert.write_bytes(certificate.public_bytes(serialization.Encoding.PEM))
    key_path.write_bytes(key.private_bytes(serialization.Encoding.PEM,
                                           serialization.PrivateFormat.PKCS8,
                                           serialization.NoEncryption()))
    yield cert, key_path


async def test_certificates_are_verified_by_default(self_signed: tuple[Path, Path]) -> None:
    cert, key = self_signed
    context = ssl.create_default_context(ssl.Purpose.CLIENT_AUTH)
    context.load_cert_chain(cert, key)
    async with open_manticore_standin(ssl_context=context) as server:
        assert server.url.startswith("https://")
        async with ManticoreBackend(server.url, timeout=2.0) as default:
            with trio.fail_after(5), pytest.raises(IndexUnavailable,
                                                   match="TLS handshake failed") as caught:
                await default.ensure_schema("acme")
        assert "CERTIFICATE_VERIFY_FAILED" in str(caught.value)
        assert server.tables == {}

        async with ManticoreBackend(server.url, timeout=2.0, verify=str(cert)) as trusting:
            await trusting.ensure_schema("acme")
        assert TABLE in server.tables


def test_an_unreadable_ca_bundle_is_a_configuration_error(tmp_path: Path) -> None:
    with pytest.raises(ConfigurationError, match="CA bundle"):
        ManticoreBackend("https://127.0.0.1:9308", verify=str(tmp_path / "missing.pem"))


# -- the stand-in answers like Manticore (mail-notes 6) -----------------------


async def test_standin_canned_answers(standin: ManticoreStandIn) -> None:
    """The stand-in's own answers, checked against mail-notes 6, so the tests
    above stand on recorded shapes."""
    create = await raw(standin, "/sql?mode=raw", "CREATE TABLE emails (title text, n bigint)",
                       TEXT)
    assert (create.status_code, create.json()) == (200, [{"total": 0, "error": "",
                                                          "warning": ""}])
    assert create.headers["content-type"] == "application/json; charset=UTF-8"
    again = await raw(standin, "/sql?mode=raw", "CREATE TABLE emails (title text)", TEXT)
    assert (again.status_code, again.json()) == (500, {
        "error": "table 'emails': CREATE TABLE failed: table 'emails' already exists"})
    drop = await raw(standin, "/sql?mode=raw", "DROP TABLE nosuch", TEXT)
    assert (drop.status_code, drop.json()) == (
        500, {"error": "DROP TABLE failed: unknown table 'nosuch'"})

    bulk = "\n".join(json.dumps({"insert": {"table": "emails", "id": i,
                                            "doc": {"title": f"t{i}"}}})
                     for i in (1, 2, 3)) + "\n"
    ok = await raw(standin, "/bulk", bulk, "application/x-ndjson")
    assert (ok.status_code, ok.json()) == (200, {
        "items": [{"bulk": {"table": "emails", "_id": 3, "created": 3, "deleted": 0,
                            "updated": 0, "result": "created", "status": 201}}],
        "current_line": 4, "skipped_lines": 0, "errors": False, "error": ""})
    wrong_type = await raw(standin, "/bulk", bulk, "application/json")
    assert (wrong_type.status_code, wrong_type.json()) == (400, {
        "error": {"type": "parse_exception",
                  "reason": "Content-Type must be application/x-ndjson"}, "status": 400})
    dup = ('{"insert":{"table":"emails","id":9,"doc":{"title":"x"}}}\n'
           '{"insert":{"table":"emails","id":1,"doc":{"title":"y"}}}\n')
    failed = await raw(standin, "/bulk", dup, "application/x-ndjson")
    assert (failed.status_code, failed.json()) == (500, {
        "items": [{"insert": {"error": {"type": "duplicate id '1'", "table": "emails"},
                              "status": 409}}],
        "current_line": 2, "skipped_lines": 2, "errors": True, "error": "duplicate id '1'"})
    assert 9 not in standin.tables["emails"].docs  # the batch was rolled back whole
    broken = await raw(standin, "/bulk", "{not json\n", "application/x-ndjson")
    assert (broken.status_code, broken.json()) == (400, {
        "items": [], "current_line": 1, "skipped_lines": 1, "errors": True,
        "error": "unable to parse: "})
    committed_first = ('{"insert":{"table":"emails","id":7,"doc":{}}}\n\n'
                       '{"insert":{"table":"emails","id":1,"doc":{}}}\n')
    partly = await raw(standin, "/bulk", committed_first, "application/x-ndjson")
    assert partly.status_code == 500
    assert 7 in standin.tables["emails"].docs  # an empty line committed the first batch
    absent = await raw(standin, "/bulk", '{"replace":{"table":"nosuchtable","id":1,"doc":{}}}',
                       "application/x-ndjson")
    assert absent.status_code == 500
    assert absent.json()["items"][0]["replace"]["error"]["type"] == "table 'nosuchtable' absent"

    insert_dup = await raw(standin, "/insert", '{"table":"emails","id":2,"doc":{"title":"z"}}')
    assert (insert_dup.status_code, insert_dup.json()) == (409, {
        "error": {"type": "action_request_validation_exception",
                  "reason": "duplicate id '2'", "table": "emails"}, "status": 409})
    insert_new = await raw(standin, "/insert", '{"table":"emails","id":20,"doc":{"title":"z"}}')
    assert (insert_new.status_code, insert_new.json()) == (200, {
        "table": "emails", "id": 20, "created": True, "result": "created", "status": 201})
    replace = await raw(standin, "/replace", '{"table":"emails","id":6,"doc":{"title":"r"}}')
    assert (replace.status_code, replace.json()) == (200, {
        "table": "emails", "id": 6, "created": False, "result": "updated", "status": 200})
    replace_missing = await raw(standin, "/replace",
                                '{"table":"nosuchtable","id":6,"doc":{"title":"r"}}')
    assert (replace_missing.status_code, replace_missing.json()) == (409, {
        "error": {"type": "action_request_validation_exception",
                  "reason": "table 'nosuchtable' absent", "table": "nosuchtable"},
        "status": 409})
    deleted = await raw(standin, "/delete", '{"table":"emails","id":6}')
    assert deleted.json() == {"table": "emails", "id": 6, "found": True, "result": "deleted"}
    not_found = await raw(standin, "/delete", '{"table":"emails","id":6}')
    assert not_found.json() == {"table": "emails", "id": 6, "found": False,
                                "result": "not found"}
    by_query = await raw(standin, "/delete",
                         '{"table":"emails","query":{"match":{"*":"t3"}}}')
    assert by_query.json() == {"table": "emails", "deleted": 1}

    missing = await raw(standin, "/search", '{"table":"nosuchtable","query":{"match_all":{}}}')
    assert (missing.status_code, missing.json()) == (500, {
        "error": "unknown local table(s) 'nosuchtable' in search request"})
    column = await raw(standin, "/search", '{"table":"emails","query":{"equals":{"nosuchattr":1}}}')
    assert (column.status_code, column.json()) == (500, {
        "error": "table emails: unknown column: nosuchattr"})
    no_table = await raw(standin, "/search", '{"query":{"match_all":{}}}')
    assert (no_table.status_code, no_table.json()) == (400, {"error": "\"table\" property missing"})
    window = await raw(standin, "/search", '{"table":"emails","offset":1000,"limit":10}')
    assert window.status_code == 500
    assert window.json()["error"] == "offset out of bounds (offset=1000, max_matches=1000)"
    hits = await raw(standin, "/search", json.dumps({
        "table": "emails", "query": {"query_string": "t1"},
        "highlight": {"fields": ["title"], "pre_tags": "[", "post_tags": "]"}}))
    assert hits.status_code == 200
    body = hits.json()
    assert body["hits"]["total"] == 1 and body["hits"]["total_relation"] == "eq"
    assert body["hits"]["hits"][0]["_id"] == 1
    assert body["hits"]["hits"][0]["highlight"] == {"title": ["[t1]"]}
    leaked = await raw(standin, "/search", '{"table":"emails","query":{"query_string":"@x y"}}')
    assert leaked.status_code == 500  # user syntax reaching the server fails loudly here


# -- issue 12: operating a real server -------------------------------------------


async def test_a_table_of_another_schema_is_a_permanent_error(
        standin: ManticoreStandIn, backend: ManticoreBackend) -> None:
    # A table from before the 'dated' column, as an older release created it.
    old = ("CREATE TABLE nexarch_mail_acme (subject text, body text, sender text, "
           "recipients text, attachment_names text, attachment_text text, "
           "sender_address string, sender_ids multi64, mailbox_ids multi64, "
           "sent_at bigint, size_bytes bigint)")
    response = await raw(standin, "/sql?mode=raw", old, "text/plain")
    assert response.status_code == 200
    with pytest.raises(SchemaMismatch, match="missing dated") as caught:
        await backend.ensure_schema("acme")
    assert isinstance(caught.value, IndexRejected)
    assert "retry" not in str(caught.value)


async def test_bulk_requests_stay_below_the_size_limit(standin: ManticoreStandIn) -> None:
    async with ManticoreBackend(standin.url, timeout=2.0, max_bulk_bytes=4096) as backend:
        await backend.ensure_schema("acme")
        docs = [doc(n, body=f"word{n} " + "x" * 1500) for n in range(1, 11)]
        await backend.upsert(docs)
    bulks = standin.requests_to("/bulk")
    assert len(bulks) >= 4
    assert all(len(r.body) <= 4096 for r in bulks)
    assert set(standin.tables[TABLE].docs) == set(range(1, 11))


async def test_the_request_timeout_is_a_setting(standin: ManticoreStandIn) -> None:
    settings = Settings.from_env({"NEXARCH_INDEX_BACKEND": "manticore",
                                  "NEXARCH_MANTICORE_URL": standin.url,
                                  "NEXARCH_MANTICORE_TIMEOUT": "0.3"})
    assert settings.manticore_timeout == 0.3
    with pytest.raises(ConfigurationError, match="manticore_timeout"):
        Settings.from_env({"NEXARCH_MANTICORE_TIMEOUT": "0"})
    async with open_index(settings, None) as opened:  # type: ignore[arg-type]
        standin.hang_next(2.0, endpoint="/search")
        with pytest.raises(IndexUnavailable, match=r"no answer within 0\.3 s"):
            await opened.search(SearchQuery("acme", "invoice"))


def test_httpx_logs_no_info_line_per_request() -> None:
    import logging

    assert logging.getLogger("httpx").getEffectiveLevel() >= logging.WARNING


async def test_a_total_marked_gte_is_reported_as_a_lower_bound(
        standin: ManticoreStandIn, backend: ManticoreBackend) -> None:
    """Manticore says whether ``hits.total`` is exact (``total_relation``
    "eq") or a lower bound ("gte", e.g. past a cutoff): the latter must not
    reach the user as an exact count."""
    await backend.ensure_schema("acme")
    await backend.upsert([doc(1, subject="invoice")])
    exact = await backend.search(SearchQuery("acme", "invoice"))
    assert (exact.total, exact.exact_total) == (1, True)
    standin.answer_next(200, {"took": 0, "timed_out": False, "hits": {
        "total": 1000, "total_relation": "gte", "hits": [{"_id": 1, "_score": 1,
                                                          "_source": {"subject": "invoice"}}]}},
                        endpoint="/search")
    bound = await backend.search(SearchQuery("acme", "invoice"))
    assert (bound.total, bound.exact_total, [h.archive_id for h in bound.hits]) == (
        1000, False, [1])


def test_an_invalid_url_is_refused_without_quoting_it() -> None:
    # httpx's message quoted the password: "Invalid port: 'hunter2'".
    with pytest.raises(ConfigurationError) as refused:
        ManticoreBackend("http://indexer:hunter2#x@manticore:9308")
    assert "hunter2" not in str(refused.value) and "percent-encoded" in str(refused.value)
