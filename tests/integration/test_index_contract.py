"""One contract for every index backend: same documents in, same answers out.

Backends: ``postgres`` (real Postgres) and ``manticore`` (a real Manticore
when MANTICORE_URL is set, otherwise the in-process stand-in that answers as
Manticore's manual documents: tests/support/manticore_standin.py). The
contract covers what both promise; language-specific stemming is tested per
backend (Postgres: test_postgres_index.py).
"""

from __future__ import annotations

from collections.abc import AsyncIterator
from datetime import UTC, datetime, timedelta, timezone

import pytest

from nexarch_events.aio import Database
from nexarch_events.index.base import (
    IndexBackend,
    IndexDocument,
    InvalidQuery,
    SearchQuery,
)
from tests.support.backends import open_backend

T0 = datetime(2024, 3, 1, 12, 0, tzinfo=UTC)


def doc(archive_id: int, tenant: str = "tenant-a", *, subject: str = "", body: str = "",
        sender: str = "Anna Muster <anna@example.org>", recipients: str = "bob@example.org",
        sent_at: datetime | None = T0, mailboxes: tuple[str, ...] = ("INBOX",),
        attachments: tuple[str, ...] = (), attachment_text: str = "",
        received_at: datetime | None = None) -> IndexDocument:
    address = sender.rsplit("<", 1)[-1].rstrip(">").strip().lower()
    return IndexDocument(
        archive_id=archive_id, tenant_slug=tenant, subject=subject, sender=sender,
        sender_addresses=(address,), recipients=recipients, body=body,
        attachment_names=attachments, attachment_text=attachment_text, sent_at=sent_at,
        mailboxes=mailboxes, size_bytes=len(body), received_at=received_at)


#: Every tenant a test here writes to (the fixture removes their tables).
TENANTS = ("tenant-a", "tenant-b", "tenant-c")


@pytest.fixture(params=["postgres", "manticore"])
async def backend(request: pytest.FixtureRequest, db: Database) -> AsyncIterator[IndexBackend]:
    async with open_backend(request.param, db) as opened:
        for tenant in ("tenant-a", "tenant-b"):
            await opened.ensure_schema(tenant)
        try:
            yield opened
        finally:
            # On a real Manticore server the tables outlive the test: drop them.
            drop = getattr(opened, "drop_schema", None)
            if drop is not None:
                for tenant in TENANTS:
                    await drop(tenant)


async def ids(backend: IndexBackend, text: str, tenant: str = "tenant-a",
              **filters: object) -> list[int]:
    result = await backend.search(SearchQuery(tenant, text, **filters))  # type: ignore[arg-type]
    return [hit.archive_id for hit in result.hits]


async def test_a_unique_word_finds_its_message(backend: IndexBackend) -> None:
    await backend.upsert([doc(1, subject="Quarterly report", body="The zebrafish numbers"),
                          doc(2, subject="Lunch", body="Pizza on Friday")])
    assert await ids(backend, "zebrafish") == [1]
    assert await ids(backend, "pizza") == [2]
    assert await ids(backend, "nothinglikethis") == []
    hit = (await backend.search(SearchQuery("tenant-a", "zebrafish"))).hits[0]
    assert hit.subject == "Quarterly report"
    assert hit.sender == "Anna Muster <anna@example.org>"
    assert hit.sent_at == T0
    assert "<mark>" in hit.snippet and "zebrafish" in hit.snippet.lower()


HOSTILE = ["tenant-b", "@tenant_slug tenant-b", '" OR 1=1 --', "') OR ('1'='1", "*", "\\",
           ")(", "^$", "a | b", "NEAR/3 secret", "=secret", "MAYBE secret", "-", '"', "!!",
           "secret*", "@* secret", "<script>", "tenant_slug:tenant-b", "%", "_",
           "secret OR", "OR secret", "--secret", '"secret', "secret\\"]


async def test_tenant_a_never_sees_tenant_b(backend: IndexBackend) -> None:
    await backend.upsert([doc(1, "tenant-a", subject="secret plans", body="alpha"),
                          doc(2, "tenant-b", subject="secret plans", body="beta tenant-b"),
                          doc(3, "tenant-b", subject="other", body="secret")])
    assert await ids(backend, "secret", "tenant-a") == [1]
    assert sorted(await ids(backend, "secret", "tenant-b")) == [2, 3]
    for text in HOSTILE:
        try:
            found = await ids(backend, text, "tenant-a")
        except InvalidQuery:
            continue  # a clear refusal is fine; leaking or crashing is not
        assert set(found) <= {1}, text
    assert await backend.document_ids("tenant-a") == {1}
    assert await backend.document_ids("tenant-b") == {2, 3}


async def test_hostile_syntax_never_errors_out_of_the_backend(backend: IndexBackend) -> None:
    await backend.upsert([doc(1, subject="secret", body="the secret word")])
    for text in HOSTILE:
        try:
            await backend.search(SearchQuery("tenant-a", text))
        except InvalidQuery:
            pass


async def test_snippets_are_html_safe(backend: IndexBackend) -> None:
    await backend.upsert([doc(1, subject="<b>Hi</b>",
                              body="click <script>alert('x')</script> kangaroo & more")])
    hit = (await backend.search(SearchQuery("tenant-a", "kangaroo"))).hits[0]
    assert "<script>" not in hit.snippet
    assert "kangaroo" in hit.snippet
    assert hit.snippet.replace("<mark>", "").replace("</mark>", "").count("<") == 0


async def test_delete_removes_and_ignores_unknown_ids(backend: IndexBackend) -> None:
    await backend.upsert([doc(1, body="walrus"), doc(2, body="walrus")])
    await backend.delete("tenant-a", [1, 999])
    assert await ids(backend, "walrus") == [2]
    await backend.delete("tenant-b", [2])  # another tenant's delete touches nothing
    assert await ids(backend, "walrus") == [2]


async def test_replaying_a_batch_is_idempotent(backend: IndexBackend) -> None:
    batch = [doc(n, body=f"ostrich number{n}") for n in range(1, 21)]
    await backend.upsert(batch)
    await backend.upsert(batch)
    result = await backend.search(SearchQuery("tenant-a", "ostrich", limit=100))
    assert result.total == 20 and sorted(h.archive_id for h in result.hits) == list(range(1, 21))


async def test_upsert_replaces_the_document(backend: IndexBackend) -> None:
    await backend.upsert([doc(1, subject="old subject", body="llama")])
    await backend.upsert([doc(1, subject="new subject", body="alpaca")])
    assert await ids(backend, "llama") == []
    assert await ids(backend, "alpaca") == [1]
    assert (await backend.search(SearchQuery("tenant-a", "alpaca"))).hits[0].subject \
        == "new subject"


async def test_words_are_anded_phrases_exclusion_or(backend: IndexBackend) -> None:
    await backend.upsert([doc(1, body="red apple pie"), doc(2, body="green apple tart"),
                          doc(3, body="apple red"), doc(4, body="pie crust")])
    assert sorted(await ids(backend, "apple red")) == [1, 3]
    assert await ids(backend, '"red apple"') == [1]
    assert sorted(await ids(backend, "apple -red")) == [2]
    assert sorted(await ids(backend, "tart OR crust")) == [2, 4]


async def test_an_exclusion_beside_words_no_message_has_finds_nothing(
        backend: IndexBackend) -> None:
    # "in" and "und" are stop words of Postgres' english and german
    # configurations: the text search dropped them and kept "not otter",
    # which matched every message without "otter" (found by an audit).
    await backend.upsert([doc(1, body="zebrafinch report"), doc(2, body="otter report"),
                          doc(3, body="badger report")])
    for text in ("in -otter", "und -otter", "in OR -otter", '"in" -otter', "in und -otter"):
        assert await ids(backend, text) == [], text
    assert sorted(await ids(backend, "report -otter")) == [1, 3]


async def test_subject_ranks_above_body(backend: IndexBackend) -> None:
    await backend.upsert([doc(1, subject="weekly", body="the heron was seen"),
                          doc(2, subject="heron sighting", body="nothing else"),
                          doc(3, subject="misc", body="attachments", attachments=("x.txt",),
                              attachment_text="a heron in the attachment")])
    assert await ids(backend, "heron") == [2, 1, 3]


async def test_filters(backend: IndexBackend) -> None:
    await backend.upsert([
        doc(1, body="invoice", sender="Anna <Anna@Example.org>", sent_at=T0,
            mailboxes=("INBOX",)),
        doc(2, body="invoice", sender="Bob <bob@example.org>",
            sent_at=T0 + timedelta(days=10), mailboxes=("Archive/2024", "INBOX")),
        doc(3, body="invoice", sender="Carl <carl@example.org>",
            sent_at=T0 + timedelta(days=20), mailboxes=("Sent",)),
        doc(4, body="invoice", sender="Dora <dora@example.org>", sent_at=None,
            mailboxes=("INBOX",)),
    ])
    assert await ids(backend, "invoice", sender="anna@example.org") == [1]
    assert await ids(backend, "invoice", sender="ANNA@example.ORG") == [1]
    assert sorted(await ids(backend, "invoice", date_from=T0 + timedelta(days=5))) == [2, 3]
    assert sorted(await ids(backend, "invoice", date_from=T0,
                            date_to=T0 + timedelta(days=10))) == [1]
    assert sorted(await ids(backend, "invoice", mailbox="INBOX")) == [1, 2, 4]
    assert await ids(backend, "invoice", mailbox="Archive/2024") == [2]
    assert await ids(backend, "invoice", mailbox="inbox") == []  # names are exact


async def test_empty_query_lists_newest_first(backend: IndexBackend) -> None:
    await backend.upsert([doc(n, body=f"m{n}", sent_at=T0 + timedelta(days=n))
                          for n in range(1, 6)])
    assert await ids(backend, "") == [5, 4, 3, 2, 1]
    assert await ids(backend, "", date_to=T0 + timedelta(days=3)) == [2, 1]


async def received_mail(backend: IndexBackend) -> None:
    """Sent and received orders disagree on purpose: 1 was sent first but
    received last; 4 has no received date (not imported from IMAP)."""
    await backend.upsert([
        doc(1, subject="walrus walrus walrus", body="walrus", sent_at=T0,
            received_at=T0 + timedelta(days=30)),
        doc(2, body="walrus", sent_at=T0 + timedelta(days=1),
            received_at=T0 + timedelta(days=2)),
        doc(3, body="walrus", sent_at=T0 + timedelta(days=2),
            received_at=T0 + timedelta(days=10)),
        doc(4, body="walrus", sent_at=T0 + timedelta(days=3), received_at=None),
    ])


async def test_received_date_filters(backend: IndexBackend) -> None:
    await received_mail(backend)
    after = T0 + timedelta(days=5)
    assert sorted(await ids(backend, "walrus", received_from=after)) == [1, 3]
    assert sorted(await ids(backend, "", received_from=after)) == [1, 3]
    assert sorted(await ids(backend, "walrus", received_to=after)) == [2]  # 4: unknown
    assert await ids(backend, "walrus", received_from=T0 + timedelta(days=2),
                     received_to=T0 + timedelta(days=10)) == [2]
    # Combined with the sent-date range.
    assert await ids(backend, "", received_from=after, date_from=T0 + timedelta(days=1)) == [3]
    hit = (await backend.search(SearchQuery("tenant-a", "walrus", received_to=after))).hits[0]
    assert hit.received_at == T0 + timedelta(days=2)


async def test_sort_by_sent_or_received_date(backend: IndexBackend) -> None:
    await received_mail(backend)
    assert await ids(backend, "walrus", sort="received") == [1, 3, 2, 4]  # unknown last
    assert await ids(backend, "", sort="received") == [1, 3, 2, 4]
    assert await ids(backend, "walrus", sort="sent") == [4, 3, 2, 1]
    assert await ids(backend, "", sort="sent") == [4, 3, 2, 1]
    assert (await ids(backend, "walrus"))[0] == 1  # relevance: the subject wins
    assert await ids(backend, "walrus", sort="received", limit=2, offset=1) == [3, 2]
    hits = (await backend.search(SearchQuery("tenant-a", "", sort="received"))).hits
    assert [h.received_at for h in hits] == [T0 + timedelta(days=30), T0 + timedelta(days=10),
                                             T0 + timedelta(days=2), None]


async def test_sorting_by_date_finds_the_newest_beyond_the_counted_matches(
        backend: IndexBackend) -> None:
    """More matches than a backend counts or ranks (Postgres: 1,000 / 300 in
    storage order): the newest received still come first."""
    await backend.upsert([doc(n, body="plankton", sent_at=T0,
                              received_at=T0 + timedelta(minutes=n)) for n in range(1, 1201)])
    assert await ids(backend, "plankton", sort="received", limit=3) == [1200, 1199, 1198]
    assert await ids(backend, "plankton", sort="received", limit=2, offset=1000) == [200, 199]


async def test_paging(backend: IndexBackend) -> None:
    await backend.upsert([doc(n, body="penguin", sent_at=T0 + timedelta(minutes=n))
                          for n in range(1, 26)])
    pages = []
    for offset in range(0, 30, 10):
        result = await backend.search(SearchQuery("tenant-a", "penguin", limit=10,
                                                  offset=offset))
        assert result.total == 25
        pages.append([h.archive_id for h in result.hits])
    assert [len(p) for p in pages] == [10, 10, 5]
    assert sorted(i for page in pages for i in page) == list(range(1, 26))
    past_the_end = await backend.search(SearchQuery("tenant-a", "penguin", offset=100))
    assert past_the_end.total == 25 and past_the_end.hits == ()


async def test_relevance_pages_list_every_match_once_past_the_ranked_ones(
        backend: IndexBackend) -> None:
    """Postgres ranks the first rank_limit matches; the ranked set grew with
    the page, so pages past it were cut from another order: of 400 matches
    in pages of 20, 20 were listed twice and 100 never (a search audit)."""
    ranked = getattr(backend, "rank_limit", 300)
    count = ranked + 60
    docs = [doc(n, subject="common" if n > ranked else "other", body="common words",
                sent_at=T0 + timedelta(minutes=n)) for n in range(1, count + 1)]
    for start in range(0, count, 100):
        await backend.upsert(docs[start:start + 100])
    listed: list[int] = []
    for offset in range(0, count, 40):
        result = await backend.search(SearchQuery("tenant-a", "common", limit=40,
                                                  offset=offset))
        listed += [hit.archive_id for hit in result.hits]
    assert len(listed) == count and sorted(listed) == list(range(1, count + 1))


async def test_addresses_urls_dates_and_numbers_are_found_by_their_words(
        backend: IndexBackend) -> None:
    """Postgres' parser kept these whole (one lexeme "anna@example.org"),
    queries are read as words: the Postgres backend found none of them, nor
    a message by one of their words (a search audit; Manticore did)."""
    tokens = ["anna@example.org", "https://example.com/path", "report.pdf", "1.2.3", "1.5",
              "2024-01-05", "v1.2", "192.168.1.1", "ABC-123", "+49", "/usr/local/bin",
              "snake_case"]
    await backend.upsert([doc(n, body=f"zz {token} zz", sender="Q <q@q.test>",
                              recipients="r@q.test") for n, token in enumerate(tokens, 1)]
                         + [doc(99, body="zz nothing else zz", sender="Q <q@q.test>",
                                recipients="r@q.test")])
    for n, token in enumerate(tokens, 1):
        assert await ids(backend, token) == [n], token
    assert sorted(await ids(backend, "example")) == [1, 2]
    assert await ids(backend, "report") == [3]
    assert await ids(backend, "local") == [11]
    assert await ids(backend, "case") == [12]


async def test_an_empty_sender_is_no_filter_in_every_backend(backend: IndexBackend) -> None:
    await backend.upsert([doc(1, body="first"), doc(2, body="second", sender="B <b@b.test>")])
    for sender in ("", "  "):
        assert sorted(await ids(backend, "", sender=sender)) == [1, 2]
    assert await ids(backend, "", sender="b@b.test") == [2]


@pytest.mark.parametrize(("kwargs", "message"), [
    ({"limit": 0}, "limit"), ({"limit": 5000}, "limit"), ({"offset": -1}, "offset"),
    ({"text": "x" * 2000}, "limit is 1000"), ({"text": "a\x00b"}, "NUL"),
    ({"date_from": datetime(2024, 1, 1)}, "time zone"),
    ({"date_from": T0, "date_to": T0}, "before"),
    ({"received_to": datetime(2024, 1, 1)}, "time zone"),
    ({"received_from": T0, "received_to": T0}, "received_from must be before"),
    ({"sort": "newest"}, "sort must be one of relevance, sent, received"),
    ({"text": "!! )( ^$"}, "no words to search for"),
    ({"text": "-spam -\"bulk mail\""}, "only excludes words"),
    # Control characters str.isspace() takes for space: they listed every
    # message as "the empty query" (a search audit).
    ({"text": "\x1c\x1d\x1e\x1f"}, "no words to search for"),
    ({"text": "\x85"}, "no words to search for"),
    ({"text": "\u2028"}, "no words to search for"),
    # In range where given, out of it in UTC: a database error before.
    ({"date_from": datetime(1, 1, 1, tzinfo=timezone(timedelta(hours=1)))}, "out of range"),
    ({"received_to": datetime(9999, 12, 31, 23, 59, tzinfo=timezone(timedelta(hours=-5)))},
     "out of range"),
])
def test_bad_queries_are_refused_clearly(kwargs: dict[str, object], message: str) -> None:
    fields: dict[str, object] = {"tenant_slug": "tenant-a", "text": "x"}
    fields.update(kwargs)
    with pytest.raises(InvalidQuery, match=message):
        SearchQuery(**fields)  # type: ignore[arg-type]


# -- issue 12: the same answer on both backends, in every script --------------


async def test_a_query_of_unsearchable_terms_finds_nothing_and_names_them(
        backend: IndexBackend) -> None:
    # Manticore's charset_table makes _, ², ① and (without ngram_chars) CJK
    # separators, and a query with no term left matches everything there.
    await backend.upsert([doc(1, body="invoice ① number_one x²"), doc(2, body="other mail")])
    for text in ("①", "_", "²", "① _ ²", '"①"', "__ OR ②"):
        with pytest.raises(InvalidQuery, match="no words to search for") as caught:
            await backend.search(SearchQuery("tenant-a", text))
        assert text.split()[0].strip('"') in str(caught.value)
    assert await ids(backend, "会议") == []  # no CJK mail: nothing, never everything
    mixed = await backend.search(SearchQuery("tenant-a", "invoice ① _"))
    assert [h.archive_id for h in mixed.hits] == [1]
    assert mixed.ignored == ("①", "_")
    assert await ids(backend, "number") == [1]  # _ separates words, as in both engines
    assert await ids(backend, "other ②") == [2]


async def test_chinese_japanese_korean_words_are_found_inside_sentences(
        backend: IndexBackend) -> None:
    await backend.upsert([
        doc(1, subject="通知", body="明天下午三点开会讨论预算。"),
        doc(2, body="来週の会議は東京で行います。"),
        doc(3, body="회의는 내일 오전입니다"),
        doc(4, body="会计部门 and the accounting team"),
    ])
    assert await ids(backend, "讨论") == [1]
    assert await ids(backend, "预算") == [1]
    assert await ids(backend, "开会讨论") == [1]
    assert await ids(backend, "讨算") == []  # not adjacent: not the word
    assert await ids(backend, "会議") == [2]
    assert await ids(backend, "東京") == [2]
    assert await ids(backend, "議") == [2]  # one character
    assert await ids(backend, "회의") == [3]
    assert await ids(backend, "会计 accounting") == [4]
    assert await ids(backend, "通知 预算") == [1]
    assert sorted(await ids(backend, "讨论 OR 東京")) == [1, 2]


async def test_dates_from_1900_to_9999_are_kept_and_no_date_is_not_1970(
        backend: IndexBackend) -> None:
    moon = datetime(1969, 7, 20, 20, 17, tzinfo=UTC)
    epoch = datetime(1970, 1, 1, tzinfo=UTC)
    early = datetime(1905, 3, 1, 8, 0, tzinfo=UTC)
    future = datetime(2500, 1, 1, tzinfo=UTC)
    await backend.upsert([doc(1, body="letter", sent_at=moon), doc(2, body="letter",
                                                                    sent_at=epoch),
                          doc(3, body="letter", sent_at=early), doc(4, body="letter",
                                                                    sent_at=None),
                          doc(5, body="letter", sent_at=future)])
    hits = {h.archive_id: h.sent_at
            for h in (await backend.search(SearchQuery("tenant-a", "letter"))).hits}
    assert hits == {1: moon, 2: epoch, 3: early, 4: None, 5: future}
    assert await ids(backend, "") == [5, 2, 1, 3, 4]  # newest first, undated last
    assert sorted(await ids(backend, "letter", date_to=epoch + timedelta(seconds=1))) \
        == [1, 2, 3]
    assert await ids(backend, "letter", date_from=datetime(1960, 1, 1, tzinfo=UTC),
                     date_to=epoch) == [1]
    assert sorted(await ids(backend, "letter", date_from=epoch)) == [2, 5]
    assert await ids(backend, "letter", date_to=datetime(1906, 1, 1, tzinfo=UTC)) == [3]


async def test_a_tenant_without_a_table_yet_has_no_hits(backend: IndexBackend) -> None:
    await backend.upsert([doc(1, body="invoice")])
    for text in ("invoice", ""):
        result = await backend.search(SearchQuery("tenant-c", text))
        assert (result.total, result.hits) == (0, ())
    assert await backend.document_ids("tenant-c") == set()
    await backend.delete("tenant-c", [1])  # nothing to delete, no error
    assert await ids(backend, "invoice") == [1]


async def test_german_spellings_are_folded_alike(backend: IndexBackend) -> None:
    await backend.upsert([doc(1, body="Viele Grüße aus der Hauptstraße"),
                          doc(2, body="Viele Gruesse aus der Hauptstrasse"),
                          doc(3, subject="Herr Müller", body="Termin"),
                          doc(4, subject="Herr Mueller", body="Termin"),
                          doc(5, body="Gras und Strauss")])
    for text in ("Grüße", "Gruesse", "GRÜSSE", "Hauptstraße", "Hauptstrasse",
                 '"Grüße aus"', '"gruesse aus"'):
        assert sorted(await ids(backend, text)) == [1, 2], text
    for text in ("Müller", "Mueller", "MÜLLER"):
        assert sorted(await ids(backend, text)) == [3, 4], text
