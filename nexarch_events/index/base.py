"""The search index interface: what a backend must do, and the values it
takes and returns. Backends: ``postgres`` (full-text search in the same
database, the embedded default) and ``manticore`` (Manticore's HTTP JSON API).

Every backend keeps tenants apart: a document belongs to exactly one tenant,
and every search is scoped to exactly one tenant.

Fenced writes (guarantee 15). A worker whose lease was taken over (the
sweeper thought it dead, another worker ran its job again) may still reach
the index afterwards, possibly after a later delete of the same message. So
``upsert`` and ``delete`` take an optional ``fences``: per document, the
queue job on whose behalf it is written (``WriteFence``: job id and lease).
A fenced write is applied only if it cannot undo a later job's effect; how
each backend keeps that promise is argued in its module (postgres: the lease
is checked under a row lock in the writing statement; manticore: the job id
is a version that only grows, deletes leave tombstones). Without fences a
write is unconditional, as before: fine for tools that write alone (tests,
a one-off load), not for workers.
"""

from __future__ import annotations

import html
import re
import unicodedata
from collections.abc import Sequence
from dataclasses import dataclass, field
from datetime import UTC, datetime
from typing import Protocol

from ..errors import NexarchError
from ..models import JobId, LeaseToken, validate_tenant_slug

#: Largest document id: Manticore ids are unsigned 64-bit but misbehave
#: above 2^63-1 (mail-notes 3.4); Postgres bigint stops there too.
MAX_DOCUMENT_ID = 2**63 - 1
MAX_QUERY_LENGTH = 1000
MAX_LIMIT = 1000
MAX_OFFSET = 100_000

#: Backends mark highlighted terms with these private-use characters;
#: ``render_snippet`` turns them into <mark> around HTML-escaped text.
HIGHLIGHT_START = "\ue000"
HIGHLIGHT_END = "\ue001"


class IndexBackendError(NexarchError):
    """Base of index backend errors."""


class IndexUnavailable(IndexBackendError):
    """The index cannot be reached or answered 5xx/timeout: retry later.

    ``outage``: the index could not be reached at all or said it is busy
    (a refused connection, 502/503/429, a lost database connection, a lock
    timeout): nothing to do with the request, so a job that meets it is
    not charged an attempt (``Failure.outage``). A timeout or a 500 may be
    the request's own doing (a huge document): charged, as any failure."""

    def __init__(self, message: str, *, outage: bool = False) -> None:
        super().__init__(message)
        self.outage = outage


class IndexRejected(IndexBackendError):
    """The index refused the request (4xx, schema, bad document): retrying
    will not help; the message says what to fix."""


class InvalidQuery(NexarchError, ValueError):
    """A search request is unacceptable (names the problem)."""


@dataclass(frozen=True, slots=True)
class QueryTerm:
    #: the term's words; several = a phrase. A word is a run of letters,
    #: combining marks and decimal digits (``is_word_char``); a run of a
    #: continuous script (``is_continuous``: Chinese, Japanese, Korean, Thai)
    #: is always a word of its own, which each backend splits as it indexes
    #: such text (Postgres: overlapping bigrams; Manticore: single characters).
    words: tuple[str, ...]
    negated: bool


@dataclass(frozen=True, slots=True)
class ParsedQuery:
    #: AND-ed groups of OR-ed terms
    groups: tuple[tuple[QueryTerm, ...], ...]
    #: the user's terms that hold nothing searchable (only punctuation,
    #: symbols, ``_``, superscripts ...): dropped, and reported as such
    ignored: tuple[str, ...]


#: Scripts written without spaces between words (Manticore's ``cont``
#: character set): Han, Hiragana, Katakana, Hangul, Thai.
_CONTINUOUS = (
    (0x0E00, 0x0E7F),    # Thai
    (0x1100, 0x11FF),    # Hangul Jamo
    (0x3040, 0x30FF),    # Hiragana, Katakana
    (0x3130, 0x318F),    # Hangul compatibility Jamo
    (0x31F0, 0x31FF),    # Katakana phonetic extensions
    (0x3400, 0x4DBF),    # CJK extension A
    (0x4E00, 0x9FFF),    # CJK unified ideographs
    (0xAC00, 0xD7AF),    # Hangul syllables
    (0xF900, 0xFAFF),    # CJK compatibility ideographs
    (0xFF66, 0xFF9F),    # half-width Katakana
    (0x20000, 0x3134F),  # CJK extensions B-H
)
_CONTINUOUS_CLASS = "".join(f"\\U{lo:08x}-\\U{hi:08x}" for lo, hi in _CONTINUOUS)
#: A run of continuous-script characters.
CONTINUOUS_RUN = re.compile(f"[{_CONTINUOUS_CLASS}]+")


def is_continuous(char: str) -> bool:
    code = ord(char)
    return any(lo <= code <= hi for lo, hi in _CONTINUOUS)


def is_word_char(char: str) -> bool:
    """Letters, combining marks and decimal digits: what both backends index
    (Manticore's charset_table ``non_cont`` + ``ngram_chars='cont'``; Postgres'
    parser). Everything else separates words: punctuation, symbols, ``_``,
    superscripts and circled numbers (``²`` ``①``), which Python's ``\\w``
    would take for word characters but Manticore does not."""
    category = unicodedata.category(char)
    return category[0] in "LM" or category == "Nd"


def split_words(text: str) -> tuple[str, ...]:
    """The words of ``text`` as the search language sees them (see QueryTerm)."""
    words: list[str] = []
    current: list[str] = []
    current_cont = False
    for char in text:
        if not is_word_char(char):
            if current:
                words.append("".join(current))
                current = []
            continue
        cont = is_continuous(char)
        if current and cont != current_cont:
            words.append("".join(current))
            current = []
        current.append(char)
        current_cont = cont
    if current:
        words.append("".join(current))
    return tuple(words)


def _scan(text: str) -> list[tuple[str, bool, bool]]:
    """Split the user's text into (raw, quoted, negated) terms."""
    terms: list[tuple[str, bool, bool]] = []
    i, n = 0, len(text)
    while i < n:
        if text[i].isspace():
            i += 1
            continue
        negated = False
        if text[i] == "-" and i + 1 < n and not text[i + 1].isspace():
            negated = True
            i += 1
        if text[i] == '"':
            end = text.find('"', i + 1)
            if end < 0:  # an unclosed quote runs to the end of the text
                end = n
            terms.append((text[i + 1:end], True, negated))
            i = end + 1
            continue
        j = i
        while j < n and not text[j].isspace() and text[j] != '"':
            j += 1
        terms.append((text[i:j], False, negated))
        i = j
    return terms


def parse_query(text: str) -> ParsedQuery:
    """The search language every backend understands, as AND-ed groups of
    OR-ed terms: words are AND-ed; ``"a phrase"``; ``-word`` / ``-"a phrase"``
    excludes; ``OR`` (any case) between two terms makes an alternative.
    Only letters, marks and digits make words (``is_word_char``); a term
    without any is dropped and listed in ``ignored``, never searched as
    "anything". Does not raise: ``parse_user_query`` says what is missing.
    """
    groups: list[list[QueryTerm]] = []
    ignored: list[str] = []
    pending_or = False
    for raw, quoted, negated in _scan(unicodedata.normalize("NFC", text)):
        if not quoted and not negated and raw.lower() == "or":
            pending_or = True
            continue
        words = split_words(raw)
        if not words:
            shown = ("-" if negated else "") + (f'"{raw}"' if quoted else raw)
            if shown.strip('"-'):
                ignored.append(shown)
            continue
        term = QueryTerm(words, negated)
        if pending_or and not negated and groups and not groups[-1][0].negated:
            groups[-1].append(term)
        else:
            groups.append([term])
        pending_or = False
    return ParsedQuery(tuple(tuple(g) for g in groups), tuple(ignored))


def parse_user_query(text: str) -> list[list[QueryTerm]]:
    """``parse_query``'s groups; raises InvalidQuery when a non-empty query has
    no word to search for (naming the terms it ignored), or only excludes."""
    parsed = parse_query(text)
    groups = [list(g) for g in parsed.groups]
    if not any(not group[0].negated for group in groups):
        if groups:
            raise InvalidQuery("the query only excludes words: add at least one word "
                               "to search for")
        named = ", ".join(repr(t) for t in parsed.ignored[:10])
        raise InvalidQuery("the query has no words to search for (punctuation, symbols and "
                           "search operators are ignored" + (f": {named}" if named else "")
                           + ")")
    return groups


@dataclass(frozen=True, slots=True)
class IndexDocument:
    """One archived message as the index sees it."""

    #: The archive's id; the document id in every backend (1 .. 2^63-1).
    archive_id: int
    tenant_slug: str
    subject: str
    #: Display form, "Name <address>" joined by ", ".
    sender: str
    #: Lower-case addresses of the From header, for exact filtering.
    sender_addresses: tuple[str, ...]
    #: To and Cc, display form.
    recipients: str
    body: str
    attachment_names: tuple[str, ...]
    attachment_text: str
    #: Date header (any date from 1900 to 9999 is kept as it is), or None if
    #: absent/unparseable: "no date" is explicit in every backend, never 0.
    sent_at: datetime | None
    #: Names of the mailboxes the message was seen in.
    mailboxes: tuple[str, ...] = ()
    size_bytes: int = 0
    #: When a server received it (the earliest IMAP INTERNALDATE of its
    #: locations), or None (never imported from IMAP, or not reported).
    received_at: datetime | None = None

    def __post_init__(self) -> None:
        if not 1 <= self.archive_id <= MAX_DOCUMENT_ID:
            raise ValueError(f"archive id {self.archive_id} outside 1..2^63-1")
        validate_tenant_slug(self.tenant_slug)


@dataclass(frozen=True, slots=True)
class WriteFence:
    """The queue job a fenced write is made for (see the module doc).

    ``job_id`` orders the writes of one message (a later job of a message
    has a larger id: per-key enqueue order, guarantee 3); ``lease`` is the
    claim the writer holds, and proves it still holds the job."""

    job_id: JobId
    lease: LeaseToken

    def __post_init__(self) -> None:
        if not 1 <= self.job_id <= MAX_DOCUMENT_ID:
            raise ValueError(f"job id {self.job_id} outside 1..2^63-1")


def is_blank_query(text: str) -> bool:
    """The empty query (every message that passes the filters): nothing, or
    only spaces, tabs and line breaks. Not ``str.isspace``, which also
    takes the control characters U+001C..U+001F and U+0085 for space: a
    query of those listed every message (a search audit); it has no word
    to search for, and is refused as such."""
    return all(char in "\t\n\r\f\v" or unicodedata.category(char) == "Zs" for char in text)


@dataclass(frozen=True, slots=True)
class SearchQuery:
    tenant_slug: str
    #: The user's query (``parse_user_query``): words, "quoted phrases",
    #: -excluded, OR. Never interpreted as backend syntax. Empty: every
    #: message that passes the filters, newest first.
    text: str
    #: Only mail from this address (case-insensitive, exact).
    sender: str | None = None
    #: sent_at >= date_from and sent_at < date_to.
    date_from: datetime | None = None
    date_to: datetime | None = None
    #: Only mail seen in this mailbox.
    mailbox: str | None = None
    limit: int = 20
    offset: int = 0
    #: received_at >= received_from and received_at < received_to (mail
    #: without a received date is outside every such range).
    received_from: datetime | None = None
    received_to: datetime | None = None
    #: ``relevance`` (text queries: best first; the empty query: as ``sent``),
    #: ``sent`` (newest Date first, undated last) or ``received`` (newest
    #: received date first, unknown last). Ties: the higher archive id first.
    sort: str = "relevance"

    def __post_init__(self) -> None:
        validate_tenant_slug(self.tenant_slug)
        if not isinstance(self.text, str):
            raise InvalidQuery("query text must be a string")
        if len(self.text) > MAX_QUERY_LENGTH:
            raise InvalidQuery(f"query is {len(self.text)} characters; the limit is "
                               f"{MAX_QUERY_LENGTH}")
        if "\x00" in self.text:
            raise InvalidQuery("query contains a NUL character")
        if not is_blank_query(self.text):
            parse_user_query(self.text)  # same rule in every backend
        if not 1 <= self.limit <= MAX_LIMIT:
            raise InvalidQuery(f"limit must be 1..{MAX_LIMIT}, got {self.limit}")
        if not 0 <= self.offset <= MAX_OFFSET:
            raise InvalidQuery(f"offset must be 0..{MAX_OFFSET}, got {self.offset}")
        for name in ("date_from", "date_to", "received_from", "received_to"):
            value = getattr(self, name)
            if value is not None and value.tzinfo is None:
                raise InvalidQuery(f"{name} must carry a time zone")
            if value is not None:
                try:
                    value.astimezone(UTC)
                except OverflowError:
                    raise InvalidQuery(f"{name} {value.isoformat()} is out of range: in UTC "
                                       "it falls outside the years 1 to 9999") from None
        if self.date_from and self.date_to and self.date_from >= self.date_to:
            raise InvalidQuery("date_from must be before date_to")
        if self.received_from and self.received_to and self.received_from >= self.received_to:
            raise InvalidQuery("received_from must be before received_to")
        if self.sort not in SORT_ORDERS:
            raise InvalidQuery(f"sort must be one of {', '.join(SORT_ORDERS)}, "
                               f"got {self.sort!r}")
        if isinstance(self.sender, str):
            # Addresses are stored NFC (mail/mime/message.py): an address
            # typed or pasted decomposed (u + U+0308) must still match. An
            # empty one is no filter, in every backend (the API's rule; the
            # Postgres backend dropped it, Manticore matched nothing).
            sender = unicodedata.normalize("NFC", self.sender).strip()
            object.__setattr__(self, "sender", sender or None)


#: The orders a search can list its hits in (``SearchQuery.sort``).
SORT_ORDERS = ("relevance", "sent", "received")


@dataclass(frozen=True, slots=True)
class SearchHit:
    archive_id: int
    score: float
    subject: str
    sender: str
    sent_at: datetime | None
    #: HTML-safe: text is escaped, matches are wrapped in <mark>...</mark>.
    snippet: str
    received_at: datetime | None = None


@dataclass(frozen=True, slots=True)
class SearchResult:
    #: Matches in total (for paging), not just this page.
    total: int
    hits: tuple[SearchHit, ...] = field(default_factory=tuple)
    #: The query's terms that were dropped as unsearchable (``ParsedQuery``).
    ignored: tuple[str, ...] = ()
    #: False when ``total`` is a lower bound: the backend stopped counting
    #: there (Postgres counts up to 1,000 beyond the page: show "1,000+").
    exact_total: bool = True


class IndexBackend(Protocol):
    """What the workers and the search command need from an index."""

    name: str
    #: True when the backend's fenced writes check the job's lease and the
    #: erasures in the database itself, in the write's own transaction
    #: (Postgres). False: the Indexer looks up erased mail after each write
    #: and deletes it again (Manticore, which cannot read Postgres).
    fences_in_database: bool

    async def ensure_schema(self, tenant_slug: str) -> None:
        """Create what this tenant's documents need (idempotent)."""

    async def upsert(self, documents: Sequence[IndexDocument],
                     fences: Sequence[WriteFence] | None = None) -> None:
        """Insert or replace documents (idempotent: replaying a batch is
        harmless). All of one call may be one transaction. ``fences``, one
        per document: write a document only where its job's write cannot
        undo a later job's (module doc); a fenced-out document is skipped
        silently (its job's ack is refused anyway). Raises IndexUnavailable
        (retry) or IndexRejected (permanent)."""

    async def delete(self, tenant_slug: str, archive_ids: Sequence[int],
                     fences: Sequence[WriteFence] | None = None) -> None:
        """Remove documents; ids not in the index are ignored. ``fences``,
        one per id, as for ``upsert``: a delete never removes what a later
        job wrote."""

    async def search(self, query: SearchQuery) -> SearchResult:
        """Ranked hits of exactly one tenant. Raises InvalidQuery."""

    async def document_ids(self, tenant_slug: str) -> set[int]:
        """Every document id of a tenant (for verify-index)."""

    async def aclose(self) -> None:
        """Release connections."""

    async def drop_tenant(self, tenant_slug: str) -> None:
        """Remove every document of a tenant, and its table where the
        backend keeps one per tenant (erasure of a whole tenant;
        idempotent). A later write for the tenant starts afresh. Called
        when the archive holds nothing of the tenant; a backend that can
        (Postgres) spares, in the same statement, documents of mail
        archived since."""


def render_snippet(marked: str) -> str:
    """Escape a backend's snippet for HTML, then turn the highlight markers
    into <mark> tags: mail text can never inject markup."""
    escaped = html.escape(marked.replace("\x00", ""), quote=False)
    return escaped.replace(HIGHLIGHT_START, "<mark>").replace(HIGHLIGHT_END, "</mark>")


def epoch_seconds(value: datetime) -> int:
    """Seconds since 1970 as a signed 64-bit integer: negative before 1970
    (Manticore's ``timestamp`` is unsigned 32-bit, so the index keeps a bigint).
    "No date" is not a number: callers keep it apart (Manticore: ``dated``)."""
    return int(value.astimezone(UTC).timestamp())


#: Dates the index keeps as they are (``IndexDocument.sent_at``).
EARLIEST_DATE = datetime(1900, 1, 1, tzinfo=UTC)
LATEST_DATE = datetime(9999, 12, 31, 23, 59, 59, tzinfo=UTC)
