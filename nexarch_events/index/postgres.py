"""Postgres full-text search: the embedded default (same database, nothing
else to run).

Language: a list of text-search configurations, default ``german`` and
``english``. A document is stemmed in its language when its function words
make that clear (``detect_configs``), else under every configuration; a
query matches if it matches under one of them, so "Rechnung" finds
"Rechnungen" (German) and "run" finds "running" (English) in the same
index. Weights: subject (A) > sender and recipients (B) > body (C) >
attachments (D).

Postgres' limits (a tsvector must stay under 1 MB; positions stop at 16,383)
and indexing cost are kept by stemming at most ``stem_chars`` of the body
and of the attachment text (``max_field_chars`` are stored); longer text
stays searchable on its first part.

Search (``nexarch_mail_search``, migration 0023): one statement, so one
snapshot; matches come from the GIN index alone, at most ``count_limit`` are
counted (beyond: ``exact_total`` false) and the first ``rank_limit`` are
ranked by a small vector (subject, people, the body's first 400
characters), the rest following them unranked (every page is cut from
that one order). Sorted by sent or received date, a text query orders every
match by that date first (one row read per match), so the newest come first
even past ``count_limit``. Snippets mark the query's lexemes in Python (``mark_snippet``).

Fenced writes (``base.WriteFence``, guarantee 15). The index lives in the
queue's database, so a fenced ``upsert`` or ``delete`` is one statement that
first takes a share lock on each fence's job row, checks that the job is
still ``processing`` under that lease, and writes only the documents of the
jobs that pass (search.sql). Why that is enough:

* A job's successors, the same job run again after the sweeper reclaimed it
  and every later job of the same message (which waits for the older one,
  guarantee 3), can only start after the lease this write checked has ended:
  by the ack, which runs after this statement on the writer's own behalf,
  or by the reclaim, which skips a row this statement holds locked (FOR
  UPDATE SKIP LOCKED) and, if it got there first, makes the check fail (the
  lock waits for the reclaim to commit, then reads the row again).
* So a write either commits while the lease is held, before any successor
  began, and a later delete removes it; or it finds the lease gone and
  writes nothing. A zombie's late write cannot resurrect a deleted message.

This is the lease check in the writing transaction, without moving the
write into the ack's transaction: the ack stays one statement on the
worker's own connection, and handlers keep their interface (a handler gets
the lease with its ``ClaimedJob``). A write that committed just before the
lease was lost is redone by the job's re-run (writes are idempotent).
"""

from __future__ import annotations

import json
import logging
import re
from collections.abc import Iterator, Sequence

from ..aio import Database
from ..db import sqlfiles
from ..errors import DatabaseError, DatabaseTransient, is_outage
from ..models import validate_tenant_slug
from .base import (
    CONTINUOUS_RUN,
    HIGHLIGHT_END,
    HIGHLIGHT_START,
    IndexDocument,
    IndexRejected,
    IndexUnavailable,
    ParsedQuery,
    QueryTerm,
    SearchHit,
    SearchQuery,
    SearchResult,
    WriteFence,
    is_blank_query,
    is_word_char,
    parse_query,
    render_snippet,
)

log = logging.getLogger(__name__)
_SQL = sqlfiles.queries("search.sql")
_CONFIG_NAME = re.compile(r"[a-z_][a-z0-9_]{0,62}")

DEFAULT_CONFIGS = ("german", "english")
#: Characters of body / attachment text that are stored (see module doc).
DEFAULT_MAX_FIELD_CHARS = 200_000
#: Characters of body / attachment text that are stemmed into the vector:
#: to_tsvector is most of the cost of indexing, and a word past the first
#: 32,000 characters of a body is rarely what someone searches for.
DEFAULT_STEM_CHARS = 32_000

#: Matches a search counts and ranks at most (beyond: "1,000+", ranked
#: among the first 1,000 in storage order). Counting and ranking every
#: match of a common word costs a read of each one's row.
DEFAULT_COUNT_LIMIT = 1000
#: Matches ranked (the first ones in storage order): ranking reads each
#: one's small rank vector.
DEFAULT_RANK_LIMIT = 300

#: Frequent function words: a cheap language guess (``detect_configs``).
_STOP_WORDS = {
    "german": frozenset(
        "der die das und ist nicht ein eine einen dem den des mit für auf sich im zu "
        "von wir ich sie es bitte auch wird sind haben hat bei aus noch wie oder "
        "aber zum zur vom nach über unter uns ihr ihnen diese dieser wenn dass".split()),
    "english": frozenset(
        "the and is are to of in for that with on this it be was were will have has "
        "you we our your at from by as not please can would should been which "
        "there their they them if but an".split()),
}
_LATIN_WORD = re.compile(r"[a-zäöüß]+")
#: Characters of subject and body the language guess reads.
_DETECT_CHARS = 4000


def detect_configs(configs: Sequence[str], subject: str, body: str) -> list[str]:
    """The configurations to stem one message in: its language alone when
    its function words say so clearly (3+ of one language and at least
    three times those of the other), else every configured one. Only
    german and english are told apart; other configurations always stay.
    The query side ORs every configuration, so a message stemmed in one
    language is still found by a query in either."""
    known = [c for c in configs if c in _STOP_WORDS]
    if len(known) < 2:
        return list(configs)
    words = _LATIN_WORD.findall((subject[:500] + " " + body[:_DETECT_CHARS]).lower())
    # Counted in C (map over a frozenset's __contains__): a loop in Python
    # over every word was a third of the client's CPU per indexed message.
    counts = {c: sum(map(_STOP_WORDS[c].__contains__, words)) for c in known}
    best = max(known, key=lambda c: counts[c])
    others = max(counts[c] for c in known if c != best)
    if counts[best] >= 3 and counts[best] >= 3 * others:
        return [c for c in configs if c not in _STOP_WORDS or c == best]
    return list(configs)


def split_continuous(text: str) -> str:
    """Runs of Chinese, Japanese, Korean and Thai as overlapping bigrams plus
    the run's last character ("会议室" -> " 会议 议室 室 "): Postgres' parser
    takes a whole run for one word, so without this a two-character word
    inside a sentence is never found. Every character starts a token, so a
    one-character query finds it as a prefix (``tsquery_text``)."""
    if not _may_hold_continuous(text) or CONTINUOUS_RUN.search(text) is None:
        return text
    return CONTINUOUS_RUN.sub(_bigrams, text)


def _may_hold_continuous(text: str) -> bool:
    """False when ``text`` cannot hold a continuous script: every one of
    them lies above U+0E00, so a text of Latin-1 characters holds none.
    Both checks run in C at memory speed; the regex search they spare cost
    a tenth of a millisecond per message body."""
    if text.isascii():
        return False
    try:
        text.encode("latin-1")
    except UnicodeEncodeError:
        return True
    return False


def _bigrams(match: re.Match[str]) -> str:
    run = match.group()
    grams = [run[i:i + 2] for i in range(len(run) - 1)] + [run[-1]]
    return " " + " ".join(grams) + " "


def _operands(term: QueryTerm) -> list[str]:
    out: list[str] = []
    for word in term.words:
        if CONTINUOUS_RUN.fullmatch(word) is None:
            out.append(f"'{word}'")
        elif len(word) == 1:
            out.append(f"'{word}':*")  # the first character of a bigram, or the last alone
        else:
            out.extend(f"'{word[i:i + 2]}'" for i in range(len(word) - 1))
    return out


def tsquery_text(parsed: ParsedQuery) -> str:
    """The parsed search language as to_tsquery text (see the migration's
    ``nexarch_mail_tsquery``). Words hold only letters, marks and digits
    (``base.is_word_char``), so quoting them needs no escapes; a term of
    several words is a phrase (``<->``), as are the bigrams of a CJK word."""
    parts: list[str] = []
    for group in parsed.groups:
        rendered: list[str] = []
        for term in group:
            phrase = " <-> ".join(_operands(term))
            rendered.append(f"!({phrase})" if term.negated else f"({phrase})")
        parts.append(rendered[0] if len(rendered) == 1 else "(" + " | ".join(rendered) + ")")
    return " & ".join(parts)


#: ASCII bytes that are not word characters become a space; bytes above
#: 0x7f (parts of UTF-8 sequences) stay.
_ASCII_WORDS = bytes(c if c > 0x7f or chr(c).isalnum() or chr(c).isspace() else 0x20
                     for c in range(256))
#: Characters above ASCII met so far: separators (to a space) and word
#: characters (kept).
_SEPARATORS: set[str] = set()
_KEPT: set[str] = set()


def words_only(text: str) -> str:
    """``text`` with every character that is not a word character replaced
    by a space. Postgres' parser keeps e-mail addresses, host names, URLs,
    file names, versions, dates and decimals whole (``anna@example.org`` is
    one lexeme), but the search language reads a query as words (letters,
    marks, digits; ``base.split_words``): "anna@example.org" is the phrase
    anna example org, and "example" alone is one of its words. A document
    split the same way is found by both (a search audit: none of them was).
    ASCII is mapped as bytes (in C); the few distinct other characters of a
    text are classified once each."""
    out = text.encode("utf-8", "surrogatepass").translate(_ASCII_WORDS).decode(
        "utf-8", "surrogatepass")
    if out.isascii():
        return out
    others = set(out) - _KEPT
    for char in others - _SEPARATORS:
        if char.isascii() or is_word_char(char) or char.isspace():
            _KEPT.add(char)
        else:
            _SEPARATORS.add(char)
    for char in others & _SEPARATORS:
        out = out.replace(char, " ")
    return out


def _vector_text(stored: str, stem_chars: int | None = None) -> str | None:
    """What the vector is built from (the first ``stem_chars``, split into
    words as queries are, continuous scripts into bigrams), or None when
    that is the stored text itself."""
    text = stored if stem_chars is None or len(stored) <= stem_chars else stored[:stem_chars]
    split = split_continuous(words_only(text))
    return None if split == stored else split


_LEXEME = re.compile(r"'((?:[^']|'')*)'")
#: Characters a snippet shows before the first match, and in all.
_SNIPPET_LEAD = 60
_SNIPPET_CHARS = 240


def mark_snippet(text: str, lexemes: str | None) -> str:
    """About 240 characters of ``text`` around the first word that matches
    the query, matches between the highlight markers. ``lexemes`` is the
    query's ``querytree`` text. A word matches when it begins with one of
    the query's lexemes: Snowball stems are prefixes of most inflected forms
    ('invoic' of "invoices", 'rechnung' of "Rechnungen"); a CJK bigram
    matches inside a run. Approximate by design: ts_headline is exact but
    re-parses every hit under every language, which cost most of a search."""
    stems = sorted({m.group(1).replace("''", "'") for m in _LEXEME.finditer(lexemes or "")}
                   - {""}, key=len, reverse=True)
    if not stems:
        return text[:200]
    words = re.compile("|".join(
        # A word starts after anything but a letter or digit: "_" separates
        # words as it does in documents (words_only), unlike \b.
        re.escape(stem) if CONTINUOUS_RUN.fullmatch(stem) else rf"(?<![^\W_]){re.escape(stem)}"
        for stem in stems), re.IGNORECASE)
    first = next(_marked_words(words, text), None)
    if first is None:
        return text[:200]
    start = max(0, first[0] - _SNIPPET_LEAD)
    if start:
        space = text.find(" ", start)
        start = space + 1 if 0 <= space < first[0] else first[0]
    end = min(len(text), start + _SNIPPET_CHARS)
    if end < len(text):
        space = text.rfind(" ", first[1], end)
        end = space if space > 0 else end
    window, done = text[start:end], 0
    out: list[str] = []
    for left, right in _marked_words(words, window):
        out += (window[done:left], HIGHLIGHT_START, window[left:right], HIGHLIGHT_END)
        done = right
    out.append(window[done:])
    return ("… " if start else "") + "".join(out) + (" …" if end < len(text) else "")


_WORD_CHARS = re.compile(r"[^\W_]*")


def _marked_words(words: re.Pattern[str], text: str) -> Iterator[tuple[int, int]]:
    r"""Spans of the words to mark, left to right, without overlap: a word
    from a stem (``words`` matches the stems alone) to the end of its run
    of word characters and, for a CJK stem, from the start of that run.
    The same spans as r"\bSTEM\w*" and r"\w*STEM\w*" but in linear time:
    the leading \w* of the latter backtracked over every position of a
    long run (a token, a hex dump, unpunctuated CJK), quadratically, per
    stem and hit, in the event loop."""
    reverse: str | None = None
    pos = 0
    while (found := words.search(text, pos)) is not None:
        start = found.start()
        if CONTINUOUS_RUN.fullmatch(found.group()):
            # Back to the start of the run: the run read right to left.
            if reverse is None:
                reverse = text[::-1]
            back = len(text) - start
            start = max(pos, start - (_run_end(reverse, back) - back))
        pos = _run_end(text, found.end())
        yield start, pos


def _run_end(text: str, pos: int) -> int:
    """Where the run of word characters at ``pos`` ends (``pos`` if none)."""
    run = _WORD_CHARS.match(text, pos)
    assert run is not None  # \w* matches the empty string
    return run.end()


def _fence_arrays(fences: Sequence[WriteFence] | None, count: int
                  ) -> tuple[list[int] | None, list[object] | None]:
    """The fence as the statements take it: job ids and leases, or NULLs."""
    if fences is None:
        return None, None
    if len(fences) != count:
        raise ValueError(f"{len(fences)} fences for {count} documents: one each")
    return [f.job_id for f in fences], [f.lease for f in fences]


def _log_fenced(what: str, sent: int, written: int,
                fences: Sequence[WriteFence] | None) -> None:
    if fences is not None and written < sent:
        log.info("fenced %s: %d of %d document(s) not written, their job's lease was taken "
                 "over (jobs %s)", what, sent - written, sent,
                 sorted({f.job_id for f in fences})[:20])


class PostgresIndex:
    name = "postgres"
    #: Fenced writes check the job's lease in the same statement (above):
    #: the Indexer need not look for erased mail after writing.
    fences_in_database = True

    def __init__(self, db: Database, *, configs: Sequence[str] = DEFAULT_CONFIGS,
                 max_field_chars: int = DEFAULT_MAX_FIELD_CHARS,
                 stem_chars: int = DEFAULT_STEM_CHARS, detect_language: bool = True,
                 count_limit: int = DEFAULT_COUNT_LIMIT,
                 rank_limit: int = DEFAULT_RANK_LIMIT) -> None:
        if not configs:
            raise ValueError("at least one text-search configuration is needed")
        for config in configs:
            if not _CONFIG_NAME.fullmatch(config):
                raise ValueError(f"text-search configuration name {config!r} is invalid")
        self.db = db
        self.configs = list(configs)
        self.max_field_chars = max_field_chars
        self.stem_chars = min(stem_chars, max_field_chars)
        self.detect_language = detect_language
        self.count_limit = count_limit
        self.rank_limit = rank_limit

    async def ensure_schema(self, tenant_slug: str) -> None:
        # One shared table, created by the migrations; tenants are rows.
        validate_tenant_slug(tenant_slug)

    async def upsert(self, documents: Sequence[IndexDocument],
                     fences: Sequence[WriteFence] | None = None) -> None:
        if not documents:
            return
        job_ids, leases = _fence_arrays(fences, len(documents))
        cap, stem = self.max_field_chars, self.stem_chars
        docs = list(documents)
        configs = [",".join(detect_configs(self.configs, d.subject, d.body)
                            if self.detect_language else self.configs) for d in docs]
        subjects = [d.subject[:10_000] for d in docs]
        senders = [d.sender[:10_000] for d in docs]
        recipients = [d.recipients[:50_000] for d in docs]
        names = [" ".join(d.attachment_names)[:10_000] for d in docs]
        try:
            written = await self.db.fetch(
                _SQL["upsert"],
                [d.tenant_slug for d in docs], [d.archive_id for d in docs],
                subjects, senders,
                [json.dumps(list(d.sender_addresses)) for d in docs],
                recipients, [d.body[:cap] for d in docs], names,
                [d.attachment_text[:cap] for d in docs], [d.sent_at for d in docs],
                [json.dumps(list(d.mailboxes)) for d in docs],
                [d.size_bytes for d in docs],
                configs,
                [_vector_text(s) for s in subjects],
                [_vector_text(f"{s} {r}") for s, r in zip(senders, recipients, strict=True)],
                [_vector_text(d.body[:cap], stem) for d in docs],
                [_vector_text(f"{n} {d.attachment_text[:cap]}", stem + 10_000)
                 for n, d in zip(names, docs, strict=True)],
                job_ids, leases, [d.received_at for d in docs])
        except DatabaseTransient as exc:
            # 54000 here is a vector over Postgres' limit (this statement
            # sends no NOTIFY): the data's fault. Any other transient error
            # (a lock or statement timeout, a deadlock, a full disk) is an
            # outage: retried, never bisected into permanent failures.
            if exc.sqlstate != "54000":
                raise IndexUnavailable(f"postgres index: {exc}",
                                       outage=is_outage(exc)) from exc
            raise IndexRejected(f"postgres index refused the batch: {exc}") from exc
        except DatabaseError as exc:
            # 22xxx: data the text type refuses.
            raise IndexRejected(f"postgres index refused the batch: {exc}") from exc
        _log_fenced("upsert", len(docs), len(written), fences)

    async def delete(self, tenant_slug: str, archive_ids: Sequence[int],
                     fences: Sequence[WriteFence] | None = None) -> None:
        validate_tenant_slug(tenant_slug)
        job_ids, leases = _fence_arrays(fences, len(archive_ids))
        try:
            await self.db.fetch(_SQL["delete"], tenant_slug, [int(i) for i in archive_ids],
                                job_ids, leases)
        except DatabaseTransient as exc:
            raise IndexUnavailable(f"postgres index: {exc}", outage=is_outage(exc)) from exc

    async def search(self, query: SearchQuery) -> SearchResult:
        parsed = parse_query(query.text)
        text = tsquery_text(parsed)
        if not is_blank_query(query.text) and not text:
            # SearchQuery refuses such a query; never widen it to "everything".
            return SearchResult(total=0, ignored=parsed.ignored)
        sender = query.sender.strip().lower() if query.sender else None
        # Count (and, for text, rank) at most this many matches; one more
        # tells "more than that" apart. Paging further raises the bound.
        cap = max(self.count_limit, query.offset + query.limit) + 1
        # Relevance ranks the first rank_limit matches, the same set for
        # every page (the rest follow unranked: migration 0044); a date
        # sort orders every match, and ranks as far as the page reaches.
        rank = self.rank_limit if query.sort == "relevance" \
            else max(self.rank_limit, query.offset + query.limit)
        try:
            # One statement: total and page from one snapshot (see search.sql).
            if text:
                rows = await self.db.fetch(
                    _SQL["search_text"], self.configs, query.tenant_slug, text, sender,
                    query.date_from, query.date_to, query.mailbox, query.limit, query.offset,
                    cap, rank, query.received_from, query.received_to, query.sort)
            else:
                # The empty query has no relevance: newest sent first, or
                # newest received first.
                rows = await self.db.fetch(
                    _SQL["search_all"], query.tenant_slug, sender, query.date_from,
                    query.date_to, query.mailbox, query.limit, query.offset, cap,
                    query.received_from, query.received_to, query.sort)
        except DatabaseTransient as exc:
            raise IndexUnavailable(f"postgres index: {exc}", outage=is_outage(exc)) from exc
        hits = tuple(
            SearchHit(archive_id=r["archive_id"], score=float(r["score"]), subject=r["subject"],
                      sender=r["sender"], sent_at=r["sent_at"], received_at=r["received_at"],
                      snippet=render_snippet(mark_snippet(r["body_head"] or "", r["lexemes"])))
            for r in rows if r["archive_id"] is not None)
        counted = int(rows[0]["total"]) if rows else 0
        return SearchResult(total=min(counted, cap - 1), hits=hits, ignored=parsed.ignored,
                            exact_total=counted < cap)

    async def document_ids(self, tenant_slug: str) -> set[int]:
        validate_tenant_slug(tenant_slug)
        out: set[int] = set()
        after = 0
        while True:
            rows = await self.db.fetch(_SQL["ids_page"], tenant_slug, after, 10_000)
            out.update(r["archive_id"] for r in rows)
            if len(rows) < 10_000:
                return out
            after = rows[-1]["archive_id"]

    async def aclose(self) -> None:
        """The pool belongs to the caller."""

    async def drop_tenant(self, tenant_slug: str) -> None:
        """Delete every document of the tenant (one shared table)."""
        validate_tenant_slug(tenant_slug)
        try:
            await self.db.execute(_SQL["drop_tenant"], tenant_slug)
        except DatabaseTransient as exc:
            raise IndexUnavailable(f"postgres index: {exc}", outage=is_outage(exc)) from exc
