"""Postgres full-text specifics: languages and Postgres' own limits.

Configuration chosen: german AND english (both snowball stemmers), a query
matching under either. A message is stemmed in one of them when its
function words say so clearly (most of the indexing cost is to_tsvector),
else in both: mail in a German archive mixes both languages, and a short
mail gives too little to tell.
"""

from __future__ import annotations

import pytest

from nexarch_events.aio import Connection, Database
from nexarch_events.index.base import SearchQuery
from nexarch_events.index.postgres import PostgresIndex, detect_configs
from tests.integration.test_index_contract import doc


@pytest.fixture
def index(db: Database) -> PostgresIndex:
    return PostgresIndex(db)


async def found(index: PostgresIndex, text: str) -> list[int]:
    return [h.archive_id for h in (await index.search(SearchQuery("tenant-a", text))).hits]


@pytest.mark.parametrize(("stored", "query"), [
    ("Anbei die Rechnungen für März", "Rechnung"),       # German plural -> singular
    ("Die Rechnung ist bezahlt", "Rechnungen"),           # and back
    ("Wir haben zwei Häuser gekauft", "Haus"),            # umlaut plural
    ("Bitte die Verträge prüfen", "Vertrag"),
    ("Zahlungen wurden gebucht", "Zahlung"),
    ("She was running late", "run"),                      # English inflection
    ("two invoices attached", "invoice"),
    ("the meeting was postponed", "postpone"),
])
async def test_inflected_forms_are_found_in_both_languages(
        index: PostgresIndex, stored: str, query: str) -> None:
    await index.upsert([doc(1, body=stored), doc(2, body="völlig anderer Text, unrelated")])
    assert await found(index, query) == [1]


async def test_only_configured_languages_stem(db: Database) -> None:
    english_only = PostgresIndex(db, configs=("english",))
    await english_only.upsert([doc(1, body="Anbei die Rechnungen")])
    assert await found(english_only, "Rechnung") == []
    assert await found(english_only, "Rechnungen") == [1]


async def test_a_5_mb_mail_indexes_and_its_first_part_is_searchable(index: PostgresIndex) -> None:
    # A tsvector must stay below 1 MB (Postgres' limit): the backend indexes
    # the first max_field_chars of the body, so this neither errors nor loses
    # the beginning.
    words = " ".join(f"w{n}x" for n in range(900_000))  # ~5.4 MB, all distinct words
    body = "aardvarkbeginning " + words
    assert len(body) > 5_000_000
    await index.upsert([doc(1, body=body)])
    assert await found(index, "aardvarkbeginning") == [1]
    assert await found(index, "w10x") == [1]


async def test_configuration_names_are_validated(db: Database) -> None:
    with pytest.raises(ValueError, match="invalid"):
        PostgresIndex(db, configs=("english; DROP TABLE x",))


class _WriterBetweenStatements:
    """The index's database, with another session committing a matching
    document right after each statement the search runs: the race a
    separate count statement loses (issue 13)."""

    def __init__(self, db: Database) -> None:
        self._db = db
        self._next_id = 1000

    async def _commit_one(self) -> None:
        self._next_id += 1
        await PostgresIndex(self._db).upsert([doc(self._next_id, body="walrus arrives")])

    async def fetch(self, sql: str, *args: object) -> object:
        rows = await self._db.fetch(sql, *args)
        await self._commit_one()
        return rows

    async def fetchval(self, sql: str, *args: object) -> object:
        value = await self._db.fetchval(sql, *args)
        await self._commit_one()
        return value


async def test_total_and_hits_come_from_one_snapshot(db: Database) -> None:
    racing = PostgresIndex(_WriterBetweenStatements(db))  # type: ignore[arg-type]
    empty = await racing.search(SearchQuery("tenant-a", "walrus"))
    assert (empty.total, empty.hits) == (0, ())  # never "total 1" with no hits
    past_the_end = await racing.search(SearchQuery("tenant-a", "walrus", offset=100))
    before = past_the_end.total
    assert past_the_end.hits == () and before == 1  # the one committed after the first search
    page = await racing.search(SearchQuery("tenant-a", "walrus", limit=100))
    assert page.total == len(page.hits)


@pytest.mark.parametrize(("subject", "body", "expected"), [
    ("Rechnung", "Anbei die Rechnung für den März, bitte bis Freitag zahlen. Das ist "
                 "nicht viel.", ["german"]),
    ("Invoice", "Please find the invoice for March attached, it is due on Friday and "
                "we would like to have it paid.", ["english"]),
    ("Hi", "Kurz: ok", ["german", "english"]),                # too little to tell
    ("Re", "Die Rechnung is attached and the Vertrag ist unterschrieben, the "
           "end", ["german", "english"]),                       # a mix
])
def test_each_message_is_stemmed_in_its_language_when_it_is_clear(
        subject: str, body: str, expected: list[str]) -> None:
    assert detect_configs(("german", "english"), subject, body) == expected
    assert detect_configs(("english",), subject, body) == ["english"]
    assert detect_configs(("german", "english", "simple"), subject, body) \
        == [*expected, "simple"]


async def test_a_message_stemmed_in_one_language_is_found_from_either(
        index: PostgresIndex) -> None:
    german = ("Anbei die Rechnungen für den März. Bitte prüfen Sie die Unterlagen und "
              "schicken Sie uns eine Bestätigung.")
    english = "Please find the invoices attached, we would like to have them paid by Friday."
    await index.upsert([doc(1, body=german), doc(2, body=english)])
    assert await found(index, "Rechnung") == [1]
    assert await found(index, "invoice") == [2]
    assert await found(index, "Rechnungen invoice") == []


async def test_only_the_first_stem_chars_are_searchable_but_all_is_stored(db: Database) -> None:
    index = PostgresIndex(db, stem_chars=1000)
    body = "aardvarkbeginning " + "filler " * 500 + "zebraending"
    await index.upsert([doc(1, body=body)])
    assert await found(index, "aardvarkbeginning") == [1]
    assert await found(index, "zebraending") == []
    stored = await db.fetchval("SELECT body FROM mail_search_documents WHERE archive_id = 1")
    assert stored == body


async def test_bodies_and_vectors_are_stored_with_lz4_where_the_server_has_it(
        db: Database, index: PostgresIndex) -> None:
    # lz4 costs a third of pglz's CPU per stored document (migration 0023).
    # A server built without lz4 (the README's embedded one is) migrates all
    # the same and keeps pglz: each server checks its own branch, none skips.
    has_lz4 = await db.fetchval(
        "SELECT 'lz4' = ANY (enumvals) FROM pg_settings WHERE name = 'default_toast_compression'")
    body = " ".join(f"word{n}x" for n in range(5000))  # large enough to be compressed
    await index.upsert([doc(1, body=body)])
    row = await db.fetchrow("SELECT pg_column_compression(body) AS body, "
                            "pg_column_compression(search) AS search FROM mail_search_documents")
    assert row is not None
    expected = "lz4" if has_lz4 else "pglz"
    assert (row["body"], row["search"]) == (expected, expected)


async def test_an_index_write_commits_without_waiting_for_its_wal_flush(db: Database) -> None:
    # Its job's ack, a synchronous commit after it, flushes it (search.sql).
    # The setting is compared with the session's own, which a throwaway test
    # server (the README's embedded one) already sets to off.
    async with db.acquire() as conn:
        await conn.execute("SET synchronous_commit = remote_apply")
        async with conn.transaction():
            await PostgresIndex(conn).upsert([doc(1, body="walrus")])  # type: ignore[arg-type]
            assert await conn.fetchval("SHOW synchronous_commit") == "off"
        # For that transaction only: the session keeps its own setting.
        assert await conn.fetchval("SHOW synchronous_commit") == "remote_apply"
        await conn.execute("RESET synchronous_commit")


async def test_a_query_whose_words_postgres_drops_never_widens_to_everything(
        index: PostgresIndex, db: Database) -> None:
    """A word that leaves no lexeme in any configuration (stop words, a lone
    combining mark) beside an exclusion: nothing, as the exclusion alone,
    for search and for the erasure and hold queries that use it."""
    from nexarch_events.lifecycle.matching import find_ids

    await index.upsert([doc(1, body="zebrafinch report"), doc(2, body="otter report")])
    for text in ("in -otter", "\u0301 -otter", "in OR -otter", "the -otter",
                 "die der das -otter"):
        assert await found(index, text) == [], text
        assert await find_ids(index, "tenant-a", text) == set(), text
    assert await found(index, "zebrafinch -otter") == [1]
    assert await found(index, "in report -otter") == [1]  # the stop word alone drops


async def test_a_lock_timeout_is_an_outage_of_the_index_not_a_refusal_of_its_data(
        db: Database, database_url: str) -> None:
    """Any database error but "connection lost" was IndexRejected: under a
    lock or statement timeout (a vacuum full, an operator's ALTER) the
    indexer bisected the batch and failed each of its jobs for good, and
    the API answered a search with 500. A transient error is an outage:
    the jobs retry, the API says 503. The lock is real, held by another
    session; the index's sessions run with lock_timeout = 300ms."""
    from nexarch_events.index.base import IndexRejected, IndexUnavailable
    from tests.integration.test_faults import alter_database

    await PostgresIndex(db).upsert([doc(1, body="first words")])
    await alter_database(db, "lock_timeout", "300ms")
    async with Database.open(database_url, max_size=2) as timed, db.acquire() as holder:
        index = PostgresIndex(timed)
        async with holder.transaction():
            await holder.execute("LOCK TABLE mail_search_documents IN ACCESS EXCLUSIVE MODE")
            with pytest.raises(IndexUnavailable, match="55P03"):
                await index.upsert([doc(2, body="second words")])
            with pytest.raises(IndexUnavailable, match="55P03"):
                await index.delete("tenant-a", [1])
            with pytest.raises(IndexUnavailable, match="55P03"):
                await index.search(SearchQuery("tenant-a", "first"))
        await index.upsert([doc(2, body="second words")])
        assert await found(index, "second") == [2]
        # The data's fault stays permanent: a CHECK the row breaks.
        await holder.execute("ALTER TABLE mail_search_documents ADD CONSTRAINT test_no_zebra "
                             "CHECK (body NOT LIKE '%zebra%') NOT VALID")
        with pytest.raises(IndexRejected, match="23514"):
            await index.upsert([doc(3, body="a zebra")])


async def test_a_relevance_page_is_the_same_page_when_parallel_plans_are_cheap(
        db: Database) -> None:
    """Pages are slices of one order: storage order, which a parallel plan
    does not keep (Gather returns the workers' rows as they come). With
    parallel plans made cheap, one page asked for ten times listed other
    messages (a review: 5 contents in 8 calls); migration 0048 keeps the
    search in one process."""
    await db.execute("""
        INSERT INTO mail_search_documents (
            tenant_slug, archive_id, subject, sender, sender_addresses, recipients, body,
            attachment_names, attachment_text, sent_at, received_at, mailboxes, size_bytes,
            search)
        SELECT 'acme', n, 'subject ' || n, 'x', ARRAY['a@example.org'], '',
               repeat('common body ', 40), '', '', now() - n * interval '1 minute', now(),
               ARRAY['INBOX'], 10, to_tsvector('simple', 'common ' || (n % 97) || ' body')
          FROM generate_series(1, 40000) AS n""")
    await db.execute("VACUUM ANALYZE mail_search_documents")
    conn = await Connection.open(db.dsn)
    try:
        for setting in ("parallel_setup_cost = 0", "parallel_tuple_cost = 0",
                        "min_parallel_table_scan_size = 0", "min_parallel_index_scan_size = 0",
                        "max_parallel_workers_per_gather = 4"):
            await conn.execute(f"SET {setting}")
        index = PostgresIndex(conn)
        pages = set()
        for _ in range(10):
            result = await index.search(SearchQuery("acme", "common", limit=50, offset=400))
            pages.add(tuple(hit.archive_id for hit in result.hits))
    finally:
        await conn.aclose()
    assert len(pages) == 1, [page[:5] for page in pages]
