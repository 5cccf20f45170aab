"""The Manticore Search backend, over Manticore's HTTP JSON API (httpx).

This module is the one place that speaks Manticore: it turns httpx and
Manticore failures into ``IndexUnavailable`` (retry later) or
``IndexRejected`` (permanent, the message says what to fix), once, here.
httpx runs on trio natively (through anyio): no asyncio is involved.

Tenancy: one real-time table per tenant, named ``table_prefix`` + the tenant
slug with ``-`` turned into ``_`` (slugs cannot contain ``_``, so two slugs
never share a table). Manticore recommends a table per tenant when isolation
matters (manticoresearch #2321, mail-notes 3.4): a search names exactly one
table, so no query text can reach another tenant's documents.

Schema of a tenant table (``CREATE_TABLE_SQL``):

* ``subject body sender recipients attachment_names attachment_text``:
  ``text`` (indexed and stored), searched and highlighted.
* ``sender_address string``: the first From address, lower-case, for people
  reading the table.
* ``sender_ids multi64`` / ``mailbox_ids multi64``: 63-bit hashes of every
  From address (lower-case) and of every mailbox name the message was seen
  in. A multi-value attribute filtered with ``equals`` on ``any(...)``
  (Filters.md) is exact, works for any number of values, and needs no JSON
  path or string collation rules; the hash keeps arbitrary mailbox names
  (spaces, quotes, non-ASCII) out of every query. Values stay below 2^63
  because of the large-id bugs in mail-notes 3.4. A collision needs two
  names with equal 63-bit hashes (odds around n^2 / 2^64).
* ``sent_at bigint`` (epoch seconds, negative before 1970; Manticore's
  ``timestamp`` is unsigned 32-bit) and ``dated bool``: "no date" is
  ``dated`` false, never a number (0 is 1970-01-01T00:00Z).
  ``size_bytes bigint``.
* ``charset_table`` keeps German umlauts apart from a/o/u and
  ``morphology='stem_en, libstemmer_de'``: the combination a real server
  accepted (mail-notes 6). Characters outside charset_table separate words
  (Low-level_tokenization.md), so the search language
  (``base.is_word_char``) only makes words of what the table indexes.
* ``ngram_chars='cont' ngram_len='1'``: Chinese, Japanese, Korean and Thai
  (written without spaces; outside ``non_cont``) are indexed one character
  a token (Languages_with_continuous_scripts.md); a query word of such a
  script becomes the phrase of its characters (``translate_query``).
* ``regexp_filter``: ä ö ü ß are written out (ae oe ue ss) in documents and
  queries alike, so Grüße finds Gruesse and Straße finds Strasse.

* ``received_at bigint`` and ``received bool``: the server's received date
  (IMAP INTERNALDATE), kept as ``sent_at``/``dated`` are.
* ``version bigint`` and ``deleted bool``: the fence (below).

``ensure_schema`` only creates a missing table (``IF NOT EXISTS``); it does
not change an existing one, except that it adds ``received_at``,
``received``, ``version`` and ``deleted`` to a table made before they
existed (``ALTER TABLE ... ADD COLUMN``; old documents read as received
date unknown, version 0, not deleted).

Fenced writes (``base.WriteFence``, guarantee 15). Manticore cannot check a
lease in Postgres, and it has no conditional replace: ``replace`` overwrites
whatever is there, so a zombie worker's late ``replace`` would bring back a
message a later delete job removed. What it has, per the manual and
mail-notes 3.2/6: ``insert`` refuses an id that exists (409 "duplicate id"),
a delete by query removes only the documents its filters match, and the
lines of one ``/bulk`` against one table are one transaction (all land or
none). Fenced writes are built from those:

* Every document carries ``version`` = the id of the job that wrote it. A
  later job of a message has a larger id (per-key enqueue order), so the
  version of a message only grows as jobs take effect.
* A fenced delete does not remove the document: it writes a **tombstone**
  (``deleted`` true, no text, ``version`` = the delete job's id). Search and
  ``document_ids`` skip tombstones. They stay (one tiny row per erased
  message) until the tenant's table is dropped.
* A write of version V (document or tombstone) never uses ``replace``:
  (1) delete by query ``id = M AND version < V``, which removes only older
  rows; (2) ``insert``, which lands only if nothing is there. If the insert
  meets a row (duplicate id: a concurrent writer got in between, or the row
  is newer), read its version: V or newer means the write is superseded and
  done, writing nothing; older or gone means go round again (bounded, then
  IndexUnavailable: the job is retried).
* Hence the invariant: a row of version W is only ever removed by a writer
  of a version above W, and only inserted where no row is. A zombie's write
  of version V after the delete of version D > V removes nothing (D is not
  older) and inserts nothing (the tombstone is there): the message stays
  unsearchable. A late zombie delete after a newer index leaves the newer
  document alone the same way.

The common case costs what it did: a first index is one ``/bulk`` of
inserts. A re-index costs four requests (the insert meets the old row, read
the versions, delete the older rows, insert), a delete two. Two writes of
the same version (a job and its zombie) keep whichever landed first: the
same archived message, so the same document. Writes without fences are the
old unconditional ``replace`` / delete by id (version 0), for tools that
write alone; they would overwrite a tombstone.
"""

from __future__ import annotations

import hashlib
import json
import logging
import re
import ssl
import string
from collections.abc import Iterable, Sequence
from datetime import UTC, datetime
from types import TracebackType
from typing import Final

import httpx
import trio

from ..errors import ConfigurationError, InvalidJobError
from ..models import validate_tenant_slug
from .base import (
    CONTINUOUS_RUN,
    HIGHLIGHT_END,
    HIGHLIGHT_START,
    MAX_DOCUMENT_ID,
    IndexDocument,
    IndexRejected,
    IndexUnavailable,
    QueryTerm,
    SearchHit,
    SearchQuery,
    SearchResult,
    WriteFence,
    epoch_seconds,
    is_blank_query,
    parse_query,
    parse_user_query,
    render_snippet,
)

logger = logging.getLogger(__name__)

__all__ = ["CREATE_TABLE_SQL", "FIELD_WEIGHTS", "DuplicateId", "ManticoreBackend",
           "SchemaMismatch", "TableMissing", "translate_query"]

# One INFO line per request from httpx is noise in a service's log: its
# warnings still show. (aio/imap.py does the same for aioimaplib.)
logging.getLogger("httpx").setLevel(logging.WARNING)

#: One statement per /sql request (mail-notes 6: multi-statement requests do not
#: behave as documented). ``{table}`` is the only variable part, and it is
#: filled in by ``_ddl`` from a validated slug only.
CREATE_TABLE_SQL: Final = (
    "CREATE TABLE IF NOT EXISTS {table} ("
    "subject text, body text, sender text, recipients text, "
    "attachment_names text, attachment_text text, "
    "sender_address string, sender_ids multi64, mailbox_ids multi64, "
    "sent_at bigint, dated bool, size_bytes bigint, received_at bigint, received bool, "
    "version bigint, deleted bool"
    ") charset_table='non_cont, U+00E4, U+00C4->U+00E4, U+00F6, U+00D6->U+00F6, "
    "U+00FC, U+00DC->U+00FC, U+00DF, U+1E9E->U+00DF' "
    "ngram_chars='cont' ngram_len='1' "
    "regexp_filter='[äÄ] => ae' regexp_filter='[öÖ] => oe' regexp_filter='[üÜ] => ue' "
    "regexp_filter='[ßẞ] => ss' "
    "morphology='stem_en, libstemmer_de'"
)

#: The columns a tenant table must have, by name, as ``DESC`` shows them
#: (``id`` included); ``ensure_schema`` checks an existing table against it.
TABLE_COLUMNS: Final = frozenset({
    "id", "subject", "body", "sender", "recipients", "attachment_names", "attachment_text",
    "sender_address", "sender_ids", "mailbox_ids", "sent_at", "dated", "size_bytes",
    "received_at", "received", "version", "deleted"})
#: Columns ``ensure_schema`` adds to a table made before they existed, and
#: their types (``ALTER TABLE ... ADD COLUMN``).
ADDED_COLUMNS: Final = {"received_at": "bigint", "received": "bool", "version": "bigint",
                        "deleted": "bool"}
#: ``SearchQuery.sort`` as Manticore sorts. Ties: newest first, undated
#: last, then the higher id (as the Postgres backend's "sent_at DESC NULLS
#: LAST, archive_id DESC"). The empty query scores every hit alike, so
#: relevance lists it by date.
_SORTS: Final[dict[str, list[dict[str, str]]]] = {
    "relevance": [{"_score": "desc"}, {"dated": "desc"}, {"sent_at": "desc"}, {"id": "desc"}],
    "sent": [{"dated": "desc"}, {"sent_at": "desc"}, {"id": "desc"}],
    "received": [{"received": "desc"}, {"received_at": "desc"}, {"id": "desc"}],
}
#: Rounds a fenced write goes through while concurrent writers of the same
#: documents keep getting in between (each round: delete older, insert).
_FENCE_ROUNDS: Final = 5

#: subject > sender/recipients > body > attachments (Options.md, field_weights).
FIELD_WEIGHTS: Final[dict[str, int]] = {
    "subject": 10,
    "sender": 5,
    "recipients": 5,
    "body": 3,
    "attachment_names": 2,
    "attachment_text": 1,
}

#: Fields whose highlighted fragments may become the snippet, best first.
_SNIPPET_FIELDS: Final = ("body", "attachment_text", "subject")
#: Manticore's default result window (Pagination.md): paging past it errors
#: unless max_matches covers offset+limit.
_DEFAULT_MAX_MATCHES: Final = 1000
#: document_ids pages by id (keyset), so it never needs an offset at all.
_ID_PAGE: Final = 1000
#: Delete requests carry at most this many ids (a tenant purge stays a
#: series of bounded requests; delete is idempotent, so a partial run is fine).
_DELETE_CHUNK: Final = 5000
#: Largest /bulk request body we send. Manticore refuses requests above its
#: max_packet_size (default 128 MiB) and a huge bulk can outlast any
#: timeout; a single larger document still goes alone (and may be refused).
DEFAULT_MAX_BULK_BYTES: Final = 16 * 1024 * 1024
#: Manticore's messages are echoed into exceptions, bounded.
_MESSAGE_LIMIT: Final = 500

_IDENTIFIER = re.compile(r"[a-z_][a-z0-9_]*")
_PREFIX = re.compile(r"[a-z_][a-z0-9_]{0,63}")

# Bodies that say "this will never work" (mail-notes 3.2 and 6). A 5xx whose
# message matches none of these is treated as a passing failure.
_MISSING_TABLE = re.compile(
    r"unknown local table|table '[^']*' absent|unknown table|index_not_found"
    r"|no such (?:table|index)", re.IGNORECASE)
_PERMANENT = re.compile(
    r"unknown column|syntax error|parse|duplicate id|already exists|no field"
    r"|property missing|out of bounds|not allowed|should be|requires|invalid"
    r"|unsupported|non-computable|P0\d:"
    # A table of another schema (searchd: "sort-by attribute '%s' not found",
    # "unknown attribute", "no such attribute", "not found in schema"):
    # retrying cannot add the column.
    r"|attribute '[^']*' not found|unknown attribute|no such attribute|not found in schema"
    r"|packet too large|too large", re.IGNORECASE)
#: Statuses that mean "busy or in the way", whatever the body says.
_RETRYABLE_STATUS: Final = frozenset({408, 425, 429, 502, 503, 504})
#: Of those, the answers that say the server is down or busy whatever was
#: asked (a timeout may be the request's own doing): IndexUnavailable.outage.
_OUTAGE_STATUS: Final = frozenset({425, 429, 502, 503})
#: One request may take at most this many times the configured timeout in
#: all (the timeout itself bounds each phase: connect, each read, ...).
TOTAL_TIMEOUT_FACTOR: Final = 4


class TableMissing(IndexRejected):
    """The tenant's table does not exist: run ``ensure_schema`` for it."""


class DuplicateId(IndexRejected):
    """An insert met an existing document id (fenced writes expect this)."""


class SchemaMismatch(IndexRejected):
    """The tenant's table exists with other columns than this client writes:
    permanent until it is recreated (and the tenant reindexed)."""


# -- the user's query language -> Manticore query_string ---------------------

# Only ASCII is lowered: enough to defuse the upper-case operator keywords
# (MAYBE, NEAR/n, NOTNEAR/n, SENTENCE, PARAGRAPH, ZONE:, REGEX(...)); the
# table's charset_table does the real case folding for every script.
_ASCII_LOWER = str.maketrans(string.ascii_uppercase, string.ascii_lowercase)


def translate_query(text: str) -> str:
    """Translate the user's search language (``base.parse_user_query``) into a
    Manticore query_string. Every character that is not a letter, digit or
    underscore is a separator, so no Manticore operator (``@ " ( ) | - ! / <
    ^ $ ~ = * ? % \\ '``, ``NEAR/n``, ``MAYBE``, ...) can reach the server
    from user input. A term that falls apart into several words
    (``foo@bar.com``, ``2024-01-05``) becomes a phrase of its words, which is
    how the table tokenizes it when indexing. Raises InvalidQuery when there
    is nothing to search for; the empty query is the caller's (match all).
    """
    parts: list[str] = []
    for group in parse_user_query(text):  # raises InvalidQuery: nothing searchable
        rendered = [_render(term) for term in group]
        parts.append(rendered[0] if len(rendered) == 1 else "(" + " | ".join(rendered) + ")")
    return " ".join(parts)


def _render(term: QueryTerm) -> str:
    tokens: list[str] = []
    for word in term.words:
        if CONTINUOUS_RUN.fullmatch(word):
            tokens.extend(word)  # one token a character, as ngram_len=1 indexed it
        else:
            tokens.append(word.translate(_ASCII_LOWER))
    text = tokens[0] if len(tokens) == 1 else '"' + " ".join(tokens) + '"'
    return "-" + text if term.negated else text


# -- documents ---------------------------------------------------------------


_SURROGATE = re.compile("[\ud800-\udfff]")


def _clean(text: str) -> str:
    """Valid UTF-8 without NUL (mail-notes 3.4, payload hygiene): lone
    surrogates from surrogateescape-decoded mail become U+FFFD.

    The usual text has neither: checked at C speed first (a regex pass over
    every body was 38 % of a worker's own CPU per document,
    bench/manticore_client_profile.py)."""
    if "\x00" in text:
        text = text.replace("\x00", "")
    if text.isascii():
        return text
    try:
        text.encode("utf-8")
    except UnicodeEncodeError:
        return _SURROGATE.sub("\ufffd", text)
    return text


def _hash_id(kind: bytes, value: str) -> int:
    """A stable id in 1..2^63-1 for an address or a mailbox name."""
    digest = hashlib.sha256(kind + b"\x00" + value.encode("utf-8", "surrogatepass")).digest()
    return (int.from_bytes(digest[:8], "big") & MAX_DOCUMENT_ID) or 1


def _sender_key(address: str) -> int:
    return _hash_id(b"sender", address.strip().lower())


def _mailbox_key(name: str) -> int:
    return _hash_id(b"mailbox", name)


def _tombstone_fields(version: int) -> dict[str, object]:
    """A fenced delete's row: no text, no attributes, only its version."""
    return {"subject": "", "body": "", "sender": "", "recipients": "",
            "attachment_names": "", "attachment_text": "", "sender_address": "",
            "sender_ids": [], "mailbox_ids": [], "sent_at": 0, "dated": False,
            "size_bytes": 0, "received_at": 0, "received": False, "version": version,
            "deleted": True}


def _document_fields(doc: IndexDocument, version: int = 0) -> dict[str, object]:
    addresses = [a.strip().lower() for a in doc.sender_addresses if a.strip()]
    return {
        "subject": _clean(doc.subject),
        "body": _clean(doc.body),
        "sender": _clean(doc.sender),
        "recipients": _clean(doc.recipients),
        "attachment_names": _clean("\n".join(doc.attachment_names)),
        "attachment_text": _clean(doc.attachment_text),
        "sender_address": _clean(addresses[0]) if addresses else "",
        "sender_ids": sorted({_sender_key(a) for a in addresses}),
        "mailbox_ids": sorted({_mailbox_key(m) for m in doc.mailboxes}),
        "sent_at": epoch_seconds(doc.sent_at) if doc.sent_at is not None else 0,
        "dated": doc.sent_at is not None,
        "size_bytes": max(0, doc.size_bytes),
        "received_at": epoch_seconds(doc.received_at) if doc.received_at is not None else 0,
        "received": doc.received_at is not None,
        "version": version,
        "deleted": False,
    }


def _version_of(fields: dict[str, object]) -> int:
    version = fields.get("version")
    return version if isinstance(version, int) else 0


def _chunks(lines: Sequence[bytes], limit: int) -> Iterable[bytes]:
    """NDJSON lines joined into request bodies of at most ``limit`` bytes
    (a single longer line is a body of its own)."""
    body: list[bytes] = []
    size = 0
    for line in lines:
        if body and size + len(line) > limit:
            yield b"".join(body)
            body, size = [], 0
        body.append(line)
        size += len(line)
    if body:
        yield b"".join(body)


def _ndjson(lines: Iterable[dict[str, object]]) -> bytes:
    # ensure_ascii=False: plain UTF-8 is a third the size of \uXXXX escapes.
    return "".join(json.dumps(line, ensure_ascii=False) + "\n" for line in lines).encode()


# -- replies -----------------------------------------------------------------


def _truncate(text: str) -> str:
    text = " ".join(text.split())
    return text if len(text) <= _MESSAGE_LIMIT else text[:_MESSAGE_LIMIT] + "..."


def _error_of(node: object) -> str | None:
    """The message of one Manticore error node: a string, or an object with
    ``type``/``reason`` (single-document endpoints and /bulk items)."""
    if isinstance(node, str):
        return node or None
    if isinstance(node, dict):
        kind, reason = node.get("type"), node.get("reason")
        texts = [t for t in (kind, reason) if isinstance(t, str) and t]
        return ": ".join(texts) or None
    return None


def _manticore_message(payload: object) -> str | None:
    """Manticore's own error text in a reply, whatever shape it came in."""
    messages: list[str] = []
    if isinstance(payload, dict):
        top = _error_of(payload.get("error"))
        if top:
            messages.append(top)
        items = payload.get("items")
        if isinstance(items, list):
            for item in items:
                if not isinstance(item, dict):
                    continue
                for result in item.values():
                    if isinstance(result, dict):
                        text = _error_of(result.get("error"))
                        if text and text not in messages:
                            messages.append(text)
    elif isinstance(payload, list):  # /sql?mode=raw: one result set per statement
        for result in payload:
            if isinstance(result, dict):
                text = _error_of(result.get("error"))
                if text and text not in messages:
                    messages.append(text)
    return "; ".join(messages) if messages else None


def _failed(payload: object) -> bool:
    """Whether a 2xx reply still reports a failure in its body: at the top,
    or in one /bulk item (an error, or a status of 300 or more, whatever
    the top-level ``errors`` says)."""
    if isinstance(payload, dict):
        if payload.get("errors") or _error_of(payload.get("error")) is not None:
            return True
        items = payload.get("items")
        return isinstance(items, list) and any(_item_failed(i) for i in items)
    if isinstance(payload, list):
        return _manticore_message(payload) is not None
    return False


def _item_failed(item: object) -> bool:
    if not isinstance(item, dict):
        return True
    for result in item.values():
        if not isinstance(result, dict) or _error_of(result.get("error")) is not None:
            return True
        status = result.get("status")
        if isinstance(status, int) and not isinstance(status, bool) and status >= 300:
            return True
    return False


def _bulk_applied(payload: object) -> bool:
    """A /bulk 2xx that says what it applied: ``errors`` false and one item
    per operation. Anything else (``{}``, ``[]``, no items: a proxy or the
    wrong service answering) is no proof that the batch was applied."""
    return (isinstance(payload, dict) and payload.get("errors") is False
            and isinstance(payload.get("items"), list) and bool(payload["items"]))


def _from_epoch(seconds: int | None) -> datetime | None:
    """A stored epoch second as a date; None where there is none (a value no
    date can have reads as unknown rather than failing the whole search)."""
    if seconds is None:
        return None
    try:
        return datetime.fromtimestamp(seconds, UTC)
    except (OverflowError, OSError, ValueError):
        return None


def _describe(exc: BaseException) -> tuple[str, bool]:
    """The messages along an exception's cause chain (trio reports a failed
    TLS handshake as a bare BrokenResourceError caused by the ssl.SSLError),
    and whether TLS was the problem."""
    texts: list[str] = []
    tls = False
    seen: set[int] = set()
    node: BaseException | None = exc
    while node is not None and id(node) not in seen:
        seen.add(id(node))
        tls = tls or isinstance(node, ssl.SSLError)
        text = str(node)
        if text and text not in texts:
            texts.append(text)
        node = node.__cause__ or node.__context__
    return _truncate("; ".join(texts) or type(exc).__name__), tls


def _int(value: object) -> int | None:
    if isinstance(value, bool):
        return None
    if isinstance(value, int):
        return value
    if isinstance(value, str) and value.isdigit():  # older servers quote _id
        return int(value)
    return None


def _str(value: object) -> str:
    return value if isinstance(value, str) else ""


class ManticoreBackend:
    """IndexBackend on Manticore Search's HTTP JSON API.

    Owns one httpx.AsyncClient (connection pool) until ``aclose``. Every
    method blocks on HTTP round trips bounded by ``timeout`` seconds per
    phase (connect, write, read); cancelling a call abandons the request and
    its connection. TLS certificates are verified unless ``verify=False``
    (``verify`` may name a CA bundle file). ``auth`` is sent as HTTP Basic
    auth and never appears in messages, logs or ``repr``.

    ``transport`` replaces the network (tests); ``verify`` then does nothing.
    """

    name = "manticore"
    fences_in_database = False  # the Indexer re-checks erasures after each write

    def __init__(self, base_url: str, *, table_prefix: str = "nexarch_mail_",
                 timeout: float = 30.0, transport: httpx.AsyncBaseTransport | None = None,
                 verify: bool | str = True, auth: tuple[str, str] | None = None,
                 max_bulk_bytes: int = DEFAULT_MAX_BULK_BYTES) -> None:
        try:
            url = httpx.URL(base_url)
        except (httpx.InvalidURL, TypeError):
            # Not the parser's text: it may quote a password ("Invalid port:
            # 'hunter2'" for one with an unencoded "#").
            raise ConfigurationError(
                "Manticore URL is invalid (a password with #, /, ? or @ must be "
                "percent-encoded)") from None
        if url.scheme not in ("http", "https") or not url.host:
            raise ConfigurationError(
                "Manticore URL must be http://host:port or https://host:port, got scheme "
                f"{url.scheme!r}")
        if not _PREFIX.fullmatch(table_prefix):
            raise ConfigurationError(
                f"Manticore table prefix {table_prefix!r} is invalid: use a-z, 0-9 and _, "
                "starting with a letter or _, at most 64 characters")
        if not timeout > 0:
            raise ConfigurationError(f"Manticore timeout must be positive, got {timeout!r}")
        if max_bulk_bytes < 1024:
            raise ConfigurationError(f"Manticore max_bulk_bytes must be >= 1024, got "
                                     f"{max_bulk_bytes!r}")
        self._max_bulk_bytes = max_bulk_bytes
        # Only scheme, host and port ever appear in messages: never userinfo.
        host = f"[{url.host}]" if ":" in url.host else url.host
        port = f":{url.port}" if url.port else ""
        self._where = f"{url.scheme}://{host}{port}"
        self._prefix = table_prefix
        self._timeout = timeout
        tls: bool | ssl.SSLContext
        if isinstance(verify, bool):
            tls = verify
        else:
            # httpx 0.28 deprecates verify=<path>: build the context here.
            try:
                tls = ssl.create_default_context(cafile=verify)
            except (OSError, ssl.SSLError) as exc:
                raise ConfigurationError(
                    f"Manticore CA bundle {verify!r} cannot be loaded: {exc}") from None
        self._client = httpx.AsyncClient(
            base_url=url,
            timeout=httpx.Timeout(timeout),
            verify=tls,
            auth=auth,
            transport=transport,
            headers={"Accept": "application/json"},
            follow_redirects=False,
        )

    def __repr__(self) -> str:
        return f"ManticoreBackend({self._where!r}, table_prefix={self._prefix!r})"

    async def __aenter__(self) -> ManticoreBackend:
        return self

    async def __aexit__(self, exc_type: type[BaseException] | None,
                        exc: BaseException | None, tb: TracebackType | None) -> None:
        await self.aclose()

    async def aclose(self) -> None:
        """Close the connection pool (idempotent)."""
        await self._client.aclose()

    # -- tables --------------------------------------------------------------

    def table_name(self, tenant_slug: str) -> str:
        """The tenant's table; raises IndexRejected for an invalid slug."""
        try:
            validate_tenant_slug(tenant_slug)
        except InvalidJobError as exc:
            raise IndexRejected(f"Manticore: {exc}") from None
        return self._prefix + tenant_slug.replace("-", "_")

    @staticmethod
    def _ddl(template: str, table: str) -> str:
        # The one place SQL text varies: a table name from a validated slug and
        # a validated prefix, checked once more against the identifier grammar.
        if not _IDENTIFIER.fullmatch(table):
            raise AssertionError(f"not a safe table name: {table!r}")
        return template.format(table=table)

    async def ensure_schema(self, tenant_slug: str) -> None:
        """Create the tenant's table unless it exists (idempotent), then check
        that its columns are the ones this client writes: raises
        SchemaMismatch (permanent) for a table of another schema."""
        table = self.table_name(tenant_slug)
        await self._call("/sql", self._ddl(CREATE_TABLE_SQL, table).encode(),
                         "text/plain; charset=utf-8", params={"mode": "raw"})
        await self._check_columns(table)

    async def _check_columns(self, table: str) -> None:
        """Raise SchemaMismatch unless the table has this client's columns;
        add the fence's columns to a table made before them."""
        reply = await self._call("/sql", self._ddl("DESC {table}", table).encode(),
                                 "text/plain; charset=utf-8", params={"mode": "raw"})
        found: set[str] = set()
        if isinstance(reply, list):
            for result in reply:
                rows = result.get("data") if isinstance(result, dict) else None
                for row in rows if isinstance(rows, list) else []:
                    if isinstance(row, dict) and isinstance(row.get("Field"), str):
                        found.add(row["Field"].lower())
        if "id" not in found:
            # Every table has an id: an answer without it described nothing
            # (an empty result set), which is no proof of another schema.
            raise IndexUnavailable(f"{self._label('/sql')}: DESC {table} answered without "
                                   "the table's columns; retry later")
        if TABLE_COLUMNS - found <= set(ADDED_COLUMNS):
            # A table from before fenced writes: add their columns (existing
            # documents read as version 0, not deleted).
            for column in sorted(TABLE_COLUMNS - found):
                await self._call(
                    "/sql", self._ddl(f"ALTER TABLE {{table}} ADD COLUMN {column} "
                                      f"{ADDED_COLUMNS[column]}", table).encode(),
                    "text/plain; charset=utf-8", params={"mode": "raw"})
                found.add(column)
        missing = sorted(TABLE_COLUMNS - found)
        if missing:
            raise SchemaMismatch(
                f"{self._label('/sql')}: table {table} has another schema (missing "
                f"{', '.join(missing)}); ensure_schema only creates missing tables: drop "
                "it and reindex the tenant")

    async def _search_call(self, table: str, request: dict[str, object]) -> object:
        """POST /search; a table made before the fence's columns (filtering
        on ``deleted`` names an unknown column) gets them, and the request is
        sent once more, so search works before the first write upgraded it."""
        body = json.dumps(request).encode()
        try:
            return await self._call("/search", body, "application/json")
        except TableMissing:
            raise
        except IndexRejected as exc:
            if "unknown column" not in str(exc) or not any(
                    column in str(exc) for column in ADDED_COLUMNS):
                raise
            logger.info("Manticore table %s predates fenced writes: adding %s", table,
                        ", ".join(ADDED_COLUMNS))
            await self._check_columns(table)
            return await self._call("/search", body, "application/json")

    async def drop_schema(self, tenant_slug: str) -> None:
        """Drop the tenant's table and every document in it (idempotent)."""
        table = self.table_name(tenant_slug)
        await self._call("/sql", self._ddl("DROP TABLE IF EXISTS {table}", table).encode(),
                         "text/plain; charset=utf-8", params={"mode": "raw"})

    # -- writes --------------------------------------------------------------

    async def upsert(self, documents: Sequence[IndexDocument],
                     fences: Sequence[WriteFence] | None = None) -> None:
        """Write documents by archive id.

        Unfenced: ``replace`` (insert or overwrite), one /bulk request per
        tenant and at most ``max_bulk_bytes`` of documents (a larger batch is
        sent in several requests, each one Manticore transaction; a retry
        replays the whole batch, harmlessly). Fenced: versioned writes that
        never overwrite a newer version (module doc). When the tenant's
        table is missing, this creates it (``ensure_schema``) and sends the
        request once more: indexing a new tenant's first message needs no
        separate provisioning step.
        """
        if fences is not None and len(fences) != len(documents):
            raise ValueError(f"{len(fences)} fences for {len(documents)} documents: one each")
        by_tenant: dict[str, list[tuple[IndexDocument, WriteFence | None]]] = {}
        for n, doc in enumerate(documents):
            by_tenant.setdefault(doc.tenant_slug, []).append(
                (doc, fences[n] if fences is not None else None))
        for slug, pairs in by_tenant.items():
            table = self.table_name(slug)
            if fences is not None:
                await self._write_versioned(slug, table, [
                    (doc.archive_id, _document_fields(doc, int(fence.job_id)))
                    for doc, fence in pairs if fence is not None], delete_first=False)
                continue
            lines = [_ndjson([{"replace": {"table": table, "id": doc.archive_id,
                                           "doc": _document_fields(doc)}}])
                     for doc, _ in pairs]
            for body in _chunks(lines, self._max_bulk_bytes):
                await self._bulk_creating(slug, table, body)

    async def _bulk_creating(self, slug: str, table: str, body: bytes) -> object:
        """POST /bulk; a missing table is created and the request sent again."""
        try:
            return await self._call("/bulk", body, "application/x-ndjson")
        except TableMissing:
            logger.info("Manticore table %s is missing: creating it", table)
            await self.ensure_schema(slug)
            return await self._call("/bulk", body, "application/x-ndjson")

    async def _write_versioned(self, slug: str, table: str,
                               rows: list[tuple[int, dict[str, object]]], *,
                               delete_first: bool) -> None:
        """Write each (id, fields) unless a row of its version or newer is
        there; never remove a newer row (module doc: fenced writes)."""
        remaining = [(doc_id, fields) for doc_id, fields in rows if 1 <= doc_id <= MAX_DOCUMENT_ID]
        for round_ in range(_FENCE_ROUNDS):
            if not remaining:
                return
            if round_ > 0 or delete_first:
                # Only rows older than the one to write go.
                deletes = [_ndjson([{"delete": {"table": table, "query": {"bool": {"must": [
                    {"equals": {"id": doc_id}},
                    {"range": {"version": {"lt": fields["version"]}}}]}}}}])
                    for doc_id, fields in remaining]
                for body in _chunks(deletes, self._max_bulk_bytes):
                    await self._bulk_creating(slug, table, body)
            inserts = [_ndjson([{"insert": {"table": table, "id": doc_id, "doc": fields}}])
                       for doc_id, fields in remaining]
            try:
                for body in _chunks(inserts, self._max_bulk_bytes):
                    await self._bulk_creating(slug, table, body)
                return
            except DuplicateId:
                # Some id is taken (the failed chunk was rolled back whole):
                # keep the rows whose current version is older than ours.
                current = await self._versions(table, [doc_id for doc_id, _ in remaining])
                remaining = [(doc_id, fields) for doc_id, fields in remaining
                             if current.get(doc_id, -1) < _version_of(fields)]
        if remaining:
            raise IndexUnavailable(
                f"{self._label('/bulk')}: documents {sorted(i for i, _ in remaining)[:10]} of "
                f"table {table} kept being rewritten by concurrent writers for "
                f"{_FENCE_ROUNDS} rounds; retry later")

    async def _versions(self, table: str, ids: Sequence[int]) -> dict[int, int]:
        """The stored version of each of these ids that has a row (tombstones
        included)."""
        out: dict[int, int] = {}
        for start in range(0, len(ids), _ID_PAGE):
            chunk = sorted(set(ids[start:start + _ID_PAGE]))
            try:
                reply = await self._call("/search", json.dumps({
                    "table": table, "query": {"bool": {"must": [{"in": {"id": chunk}}]}},
                    "limit": len(chunk), "max_matches": max(_DEFAULT_MAX_MATCHES, len(chunk)),
                    "_source": ["version"]}).encode(), "application/json")
            except TableMissing:
                return out
            for hit in self._hits(reply, "/search")[2]:
                doc_id = _int(hit.get("_id"))
                source = hit.get("_source")
                version = _int(source.get("version")) if isinstance(source, dict) else None
                if doc_id is not None:
                    out[doc_id] = version if version is not None else 0
        return out

    async def delete(self, tenant_slug: str, archive_ids: Sequence[int],
                     fences: Sequence[WriteFence] | None = None) -> None:
        """Remove documents by id; unknown ids, and a missing table, are no-ops.
        Fenced: write tombstones of the jobs' versions instead (module doc),
        creating a missing table, so a zombie's late write finds them."""
        table = self.table_name(tenant_slug)
        if fences is not None:
            if len(fences) != len(archive_ids):
                raise ValueError(f"{len(fences)} fences for {len(archive_ids)} ids: one each")
            newest: dict[int, int] = {}
            for archive_id, fence in zip(archive_ids, fences, strict=True):
                newest[int(archive_id)] = max(newest.get(int(archive_id), 0), int(fence.job_id))
            await self._write_versioned(tenant_slug, table, [
                (archive_id, _tombstone_fields(version))
                for archive_id, version in sorted(newest.items())], delete_first=True)
            return
        ids = sorted({i for i in archive_ids
                      if isinstance(i, int) and not isinstance(i, bool)
                      and 1 <= i <= MAX_DOCUMENT_ID})
        for start in range(0, len(ids), _DELETE_CHUNK):
            chunk = ids[start:start + _DELETE_CHUNK]
            body = _ndjson({"delete": {"table": table, "id": i}} for i in chunk)
            try:
                await self._call("/bulk", body, "application/x-ndjson")
            except TableMissing:
                return  # no table, no documents: nothing left to delete

    # -- reads ---------------------------------------------------------------

    async def document_ids(self, tenant_slug: str) -> set[int]:
        """Every document id of the tenant, read in pages of 1000 by id
        (keyset paging: the offset stays 0, far from the max_matches window)."""
        table = self.table_name(tenant_slug)
        ids: set[int] = set()
        last = 0
        while True:
            try:
                reply = await self._search_call(table, {
                    "table": table,
                    # Tombstones (fenced deletes) are not documents.
                    "query": {"bool": {"must": [{"range": {"id": {"gt": last}}},
                                                {"equals": {"deleted": 0}}]}},
                    "sort": [{"id": "asc"}],
                    "limit": _ID_PAGE,
                    "max_matches": _ID_PAGE,
                    "_source": ["sent_at"],
                })
            except TableMissing:
                return ids  # no table yet: no documents (as in Postgres)
            page = [i for i in (_int(h.get("_id")) for h in self._hits(reply, "/search")[2])
                    if i is not None]
            ids.update(page)
            if len(page) < _ID_PAGE or max(page) <= last:
                return ids
            last = max(page)

    async def search(self, query: SearchQuery) -> SearchResult:
        """Ranked hits of the query's tenant (its table and nothing else).

        One /search request: the total and the hits come from one reply, so
        from one snapshot of the table. A tenant without a table has no
        documents: 0 hits, as in Postgres. Raises InvalidQuery (nothing to
        search for), IndexRejected, IndexUnavailable.
        """
        table = self.table_name(query.tenant_slug)
        ignored: tuple[str, ...] = ()
        if not is_blank_query(query.text):
            translated = translate_query(query.text)
            ignored = parse_query(query.text).ignored
            if not translated.strip():
                # Manticore matches everything when no term is left: never send that.
                return SearchResult(total=0, ignored=ignored)
            must: list[dict[str, object]] = [{"query_string": translated}]
        else:
            must = [{"match_all": {}}]  # the empty query lists everything, newest first
        # Tombstones of fenced deletes (module doc) are never hits.
        must.append({"equals": {"deleted": 0}})
        must_not: list[dict[str, object]] = []
        if query.date_from is not None or query.date_to is not None:
            bounds: dict[str, int] = {}
            if query.date_from is not None:
                bounds["gte"] = epoch_seconds(query.date_from)
            if query.date_to is not None:
                bounds["lt"] = epoch_seconds(query.date_to)
            must.append({"range": {"sent_at": bounds}})
            # Mail without a date is outside every range (its sent_at means nothing).
            must.append({"equals": {"dated": 1}})
        if query.received_from is not None or query.received_to is not None:
            received: dict[str, int] = {}
            if query.received_from is not None:
                received["gte"] = epoch_seconds(query.received_from)
            if query.received_to is not None:
                received["lt"] = epoch_seconds(query.received_to)
            must.append({"range": {"received_at": received}})
            must.append({"equals": {"received": 1}})
        if query.sender is not None:
            must.append({"equals": {"any(sender_ids)": _sender_key(query.sender)}})
        if query.mailbox is not None:
            must.append({"equals": {"any(mailbox_ids)": _mailbox_key(query.mailbox)}})
        boolean: dict[str, object] = {"must": must}
        if must_not:
            boolean["must_not"] = must_not
        request = {
            "table": table,
            "query": {"bool": boolean},
            "sort": _SORTS[query.sort],  # ties as in Postgres (_SORTS)
            "track_scores": True,
            "limit": query.limit,
            "offset": query.offset,
            # Paging past the default window errors unless max_matches covers
            # offset+limit (Pagination.md, mail-notes 3.2).
            "max_matches": max(_DEFAULT_MAX_MATCHES, query.offset + query.limit),
            "_source": ["subject", "sender", "sent_at", "dated", "received_at", "received"],
            "highlight": {
                "fields": list(_SNIPPET_FIELDS),
                "pre_tags": HIGHLIGHT_START,
                "post_tags": HIGHLIGHT_END,
            },
            "options": {"field_weights": FIELD_WEIGHTS},
        }
        try:
            reply = await self._search_call(table, request)
        except TableMissing:
            return SearchResult(total=0, ignored=ignored)
        total, exact, raw_hits = self._hits(reply, "/search")
        hits: list[SearchHit] = []
        for raw in raw_hits:
            archive_id = _int(raw.get("_id"))
            if archive_id is None:
                raise self._unavailable("/search", 200, "a hit without a numeric _id")
            found = raw.get("_source")
            source: dict[str, object] = found if isinstance(found, dict) else {}
            score = raw.get("_score")
            sent = _int(source.get("sent_at"))
            dated = source.get("dated")
            received_at = _int(source.get("received_at"))
            hits.append(SearchHit(
                archive_id=archive_id,
                score=float(score) if isinstance(score, int | float) else 0.0,
                subject=_str(source.get("subject")),
                sender=_str(source.get("sender")),
                sent_at=_from_epoch(sent) if dated in (True, 1) else None,
                snippet=render_snippet(self._snippet(raw.get("highlight"))),
                received_at=(_from_epoch(received_at)
                             if source.get("received") in (True, 1) else None),
            ))
        return SearchResult(total=total, hits=tuple(hits), ignored=ignored, exact_total=exact)

    @staticmethod
    def _snippet(highlight: object) -> str:
        """The first field with a highlighted match, else the body's start."""
        if not isinstance(highlight, dict):
            return ""
        fragments: dict[str, list[str]] = {}
        for name in _SNIPPET_FIELDS:
            value = highlight.get(name)
            if isinstance(value, str):
                value = [value]
            if isinstance(value, list):
                fragments[name] = [f for f in value if isinstance(f, str) and f.strip()]
        for name in _SNIPPET_FIELDS:
            marked = [f for f in fragments.get(name, []) if HIGHLIGHT_START in f]
            if marked:
                return " … ".join(f.strip() for f in marked)
        return " … ".join(f.strip() for f in fragments.get("body", []))

    def _hits(self, reply: object, path: str) -> tuple[int, bool, list[dict[str, object]]]:
        """(total, exact, hits): ``total_relation`` "gte" makes the total a
        lower bound (Manticore stopped counting, e.g. at a cutoff)."""
        hits = reply.get("hits") if isinstance(reply, dict) else None
        if not isinstance(hits, dict):
            raise self._unavailable(path, 200, "a reply without 'hits'")
        total = _int(hits.get("total"))
        items = hits.get("hits", [])
        if total is None or not isinstance(items, list):
            raise self._unavailable(path, 200, "'hits' without 'total' or 'hits'")
        exact = hits.get("total_relation", "eq") != "gte"
        return total, exact, [h for h in items if isinstance(h, dict)]

    # -- HTTP ----------------------------------------------------------------

    def _label(self, path: str) -> str:
        return f"Manticore at {self._where} POST {path}"

    def _unavailable(self, path: str, status: int, what: str) -> IndexUnavailable:
        return IndexUnavailable(f"{self._label(path)}: HTTP {status} with {what}; "
                                "retry later", outage=status in _OUTAGE_STATUS)

    async def _call(self, path: str, content: bytes, content_type: str, *,
                    params: dict[str, str] | None = None) -> object:
        """POST and return the parsed JSON of a successful reply; translate
        every failure into IndexUnavailable / IndexRejected / TableMissing."""
        label = self._label(path)
        try:
            # httpx's timeout is per phase: a server that drips its answer a
            # byte at a time restarts the read timeout with every byte. The
            # whole request is bounded too (found by an audit: a worker
            # waited for as long as the server kept dripping).
            with trio.fail_after(self._timeout * TOTAL_TIMEOUT_FACTOR):
                response = await self._client.post(
                    path, content=content, params=params,
                    headers={"Content-Type": content_type})
        except trio.TooSlowError:
            raise IndexUnavailable(
                f"{label}: the answer took longer than "
                f"{self._timeout * TOTAL_TIMEOUT_FACTOR:g} s in all; retry later") from None
        except httpx.TimeoutException as exc:
            raise IndexUnavailable(
                f"{label}: no answer within {self._timeout:g} s "
                f"({type(exc).__name__}); retry later") from exc
        except httpx.ConnectError as exc:
            detail, tls = _describe(exc)
            if tls:
                raise IndexUnavailable(
                    f"{label}: TLS handshake failed (certificates are verified; pass "
                    f"verify=<CA bundle> for a private CA): {detail}") from exc
            raise IndexUnavailable(f"{label}: cannot connect: {detail}; retry later",
                                   outage=True) from exc
        except httpx.TransportError as exc:
            detail, _ = _describe(exc)
            raise IndexUnavailable(
                f"{label}: the connection failed mid-request ({detail}); retry later") from exc
        except httpx.HTTPError as exc:
            detail, _ = _describe(exc)
            raise IndexUnavailable(f"{label}: {detail}") from exc

        status = response.status_code
        try:
            payload: object = json.loads(response.content)
        except (ValueError, RecursionError):  # nesting deeper than Python's stack
            payload = None
        if payload is None:
            snippet = _truncate(response.content[:200].decode("utf-8", "replace"))
            what = f"a non-JSON body ({response.headers.get('content-type', 'no content type')}"
            what += f": {snippet!r})" if snippet else ", empty)"
            if 200 <= status < 300 or status >= 500 or status in _RETRYABLE_STATUS:
                raise self._unavailable(path, status, what)
            raise IndexRejected(f"{label}: HTTP {status} with {what}")
        if 200 <= status < 300 and not _failed(payload):
            if path == "/bulk" and not _bulk_applied(payload):
                snippet = _truncate(response.content[:200].decode("utf-8", "replace"))
                raise self._unavailable(path, status, f"an answer that does not say the "
                                        f"batch was applied ({snippet!r})")
            return payload
        message = _manticore_message(payload)
        raise self._classify(path, status, message)

    def _classify(self, path: str, status: int, message: str | None) -> Exception:
        label = self._label(path)
        said = f"Manticore said: {_truncate(message)}" if message else "no error message"
        if status in (401, 403):
            return IndexRejected(f"{label}: HTTP {status}, authentication or permission "
                                 f"refused; check the configured credentials ({said})")
        if status in _RETRYABLE_STATUS:
            # Before the text: a busy server's message may name a table
            # ("... absent, retry in a second"); "missing" would make a
            # delete a no-op and a search empty (found by an audit).
            return IndexUnavailable(f"{label}: HTTP {status}, busy or unreachable; retry "
                                    f"later ({said})", outage=status in _OUTAGE_STATUS)
        if message and re.search(r"duplicate id", message, re.IGNORECASE):
            return DuplicateId(f"{label}: HTTP {status}, a document id exists ({said})")
        if message and _MISSING_TABLE.search(message):
            return TableMissing(f"{label}: the tenant's table does not exist; run "
                                f"ensure_schema for the tenant first ({said})")
        if 300 <= status < 400:
            return IndexRejected(f"{label}: HTTP {status} redirect; point the URL at "
                                 f"Manticore itself ({said})")
        if message and _PERMANENT.search(message):
            hint = ""
            if "unknown column" in message:
                hint = ("; the table's schema does not match this client (ensure_schema "
                        "only creates missing tables: recreate the table and reindex)")
            return IndexRejected(f"{label}: HTTP {status}, request refused{hint} ({said})")
        if 400 <= status < 500:
            return IndexRejected(f"{label}: HTTP {status}, request refused ({said})")
        if status >= 500:
            return IndexUnavailable(f"{label}: HTTP {status}; retry later ({said})")
        # A 2xx whose body reports an error nobody documented.
        return IndexRejected(f"{label}: HTTP {status} reporting a failure ({said})")

    async def drop_tenant(self, tenant_slug: str) -> None:
        """Drop the tenant's table (``DROP TABLE IF EXISTS`` over /sql?mode=raw)."""
        await self.drop_schema(tenant_slug)
