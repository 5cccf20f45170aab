"""An in-process stand-in for Manticore Search's HTTP JSON API (trio + h11).

It is a stand-in because no Manticore server runs on the machines these tests
run on (and there is no network to fetch one). It listens on
127.0.0.1:<free port>, keeps tables and documents in memory, and answers the
endpoints the client uses with the status codes and bodies a real server
gives: the canned answers follow mail-notes section 6 (recorded from a real
server) and, where that section is silent, section 3 and the Manticore
manual; each one cites its source beside it. Answers the sources do not
record are marked "not recorded" and kept conservative.

What it does: ``/sql?mode=raw`` (CREATE TABLE [IF NOT EXISTS], DROP TABLE
[IF EXISTS], ALTER TABLE ADD COLUMN, SHOW TABLES, DESC), ``/bulk`` (NDJSON, one aggregated item per
committed batch, the failing batch rolled back, a table switch or an empty
line commits), ``/insert``, ``/replace``, ``/update``, ``/delete``, and
``/search`` (``bool`` with must/should/must_not/filter, ``query_string``
with words, "phrases", -/! exclusion, | and parentheses, ``match``,
``match_phrase``, ``match_all``, ``equals``/``in``/``range`` on attributes,
``any()``/``all()`` on multi-value attributes, ``sort``, ``track_scores``,
``limit``/``offset``/``max_matches`` with the result-window rule,
``_source``, ``highlight`` with ``pre_tags``/``post_tags``, field weights,
``hits.total``).

Tokenizing follows the table's settings where the real server surprises
(Low-level_tokenization.md, Languages_with_continuous_scripts.md):
``charset_table`` (default ``non_cont``: letters, marks and decimal digits
of scripts written with spaces; ``_``, ``²``, ``①`` and every character
not listed separate words), ``ngram_chars`` (``cont``: Chinese, Japanese,
Korean, Thai, one token a character; without it they are separators) and
``regexp_filter`` rules (applied to documents and queries alike). A query
word with no token left matches everything, as on the real server.

What it does NOT do: morphology or stemming (words match exactly, after
lower-casing), real ranking (the score is the sum of
field weight x distinct query words found in the field; no BM25, no
proximity), wildcards, and the query operators a client should never send
from user input: field limits (``@``), proximity/quorum (``~`` ``/``),
strict order (``<<``), exact form (``=``), start/end (``^`` ``$``),
``MAYBE``, ``NEAR/n``, ``NOTNEAR/n``, ``SENTENCE``, ``PARAGRAPH``, zones and
``REGEX``. Those are answered with a query error (HTTP 500), so a client
that leaks user syntax fails loudly here rather than silently searching.
No SQL SELECT, no /cli, no authentication (requests are recorded, so tests
can check the headers a client sends).

Fault injection for tests: ``answer_next`` (any status and body),
``fail_next`` (503), ``hang_next`` (sleep before answering, to trigger
client timeouts), ``drop_next`` (close the connection without answering),
and ``stop()`` (close the listener and every connection: new connections
are refused).
"""

from __future__ import annotations

import fnmatch
import json
import re
import ssl
import unicodedata
from collections.abc import AsyncIterator, Callable
from contextlib import asynccontextmanager
from dataclasses import dataclass, field
from typing import Any, Literal
from urllib.parse import parse_qs, unquote_plus, urlsplit

import h11
import trio

#: Every response (mail-notes 6: "Every response is Content-Type:
#: application/json; charset=UTF-8").
JSON_CONTENT_TYPE = "application/json; charset=UTF-8"

# Data_types.md: the column types CREATE TABLE accepts (mva/mva64 are aliases).
_TYPES = {"text", "string", "int", "integer", "uint", "bigint", "float", "bool",
          "multi", "multi64", "mva", "mva64", "json", "timestamp"}
_INT_TYPES = {"int", "integer", "uint", "bigint", "timestamp"}
_MVA_TYPES = {"multi", "multi64", "mva", "mva64"}
#: Manticore's ``cont`` / ``cjk`` character set: scripts written without spaces.
_CONT_RANGES = ((0x0E00, 0x0E7F), (0x1100, 0x11FF), (0x3040, 0x30FF), (0x3130, 0x318F),
                (0x31F0, 0x31FF), (0x3400, 0x4DBF), (0x4E00, 0x9FFF), (0xAC00, 0xD7AF),
                (0xF900, 0xFAFF), (0xFF66, 0xFF9F), (0x20000, 0x3134F))


def _is_cont(char: str) -> bool:
    return any(lo <= ord(char) <= hi for lo, hi in _CONT_RANGES)


def _is_non_cont(char: str) -> bool:
    category = unicodedata.category(char)
    return (category[0] in "LM" or category == "Nd") and not _is_cont(char)


def _charset_char(spec: str) -> str:
    spec = spec.strip()
    if spec.upper().startswith("U+"):
        return chr(int(spec[2:], 16))
    if len(spec) == 1:
        return spec
    raise ValueError(spec)


@dataclass
class Tokenizer:
    """charset_table + ngram_chars + regexp_filter of one table."""

    #: named sets in charset_table ("non_cont", "cont")
    sets: frozenset[str] = frozenset({"non_cont"})
    #: explicit characters and their mapping
    chars: dict[str, str] = field(default_factory=dict)
    ngram_cont: bool = False
    filters: tuple[tuple[re.Pattern[str], str], ...] = ()

    @classmethod
    def of(cls, options: dict[str, str], filters: list[str]) -> Tokenizer:
        sets: set[str] = set()
        chars: dict[str, str] = {}
        table = options.get("charset_table", "non_cont")
        for entry in (e.strip() for e in table.split(",")):
            name = {"non_cjk": "non_cont", "cjk": "cont"}.get(entry.lower(), entry.lower())
            if name in ("non_cont", "cont"):
                sets.add(name)
                continue
            source, _, target = entry.partition("->")
            if ".." in source:
                lo, hi = (_charset_char(x) for x in source.split(".."))
                if target:
                    tlo = _charset_char(target.split("..")[0])
                    for offset in range(ord(hi) - ord(lo) + 1):
                        chars[chr(ord(lo) + offset)] = chr(ord(tlo) + offset)
                else:
                    for code in range(ord(lo), ord(hi) + 1):
                        chars[chr(code)] = chr(code)
            elif entry:
                char = _charset_char(source)
                chars[char] = _charset_char(target) if target else char
        ngram = options.get("ngram_chars", "").strip().lower() in ("cont", "cjk")
        compiled = []
        for rule in filters:
            pattern, _, replacement = rule.partition("=>")
            compiled.append((re.compile(pattern.strip()), replacement.strip()))
        return cls(frozenset(sets), chars, ngram and int(options.get("ngram_len", "1")) == 1,
                   tuple(compiled))

    def fold(self, char: str) -> str | None:
        """The character as indexed, "" for an n-gram character, None for a separator."""
        if char in self.chars:
            return self.chars[char]
        if "non_cont" in self.sets and _is_non_cont(char):
            return char.lower()
        if _is_cont(char):
            if self.ngram_cont:
                return ""
            if "cont" in self.sets:
                return char
        return None

    def filter(self, text: str) -> str:
        for pattern, replacement in self.filters:
            text = pattern.sub(replacement, text)
        return text

    def spans(self, text: str) -> list[tuple[int, int, str]]:
        """(start, end, token) of every token; ``regexp_filter`` applies to
        each token (the rules here never span a separator). Runs of ASCII
        letters and digits take a fast path (same answer as ``_spans``)."""
        if "non_cont" not in self.sets or any(c.isascii() for c in self.chars):
            return self._spans(text)
        out: list[tuple[int, int, str]] = []
        previous = 0
        for m in _ALNUM.finditer(text):
            gap = text[previous:m.start()]
            if gap and not gap.isspace() and any(self.fold(c) is not None for c in gap):
                return self._spans(text)  # a mark or listed character joins words
            run = m.group()
            if run.isascii():
                out.append((m.start(), m.end(), self.filter(run.lower())))
            else:
                out.extend((m.start() + a, m.start() + b, t) for a, b, t in self._spans(run))
            previous = m.end()
        gap = text[previous:]
        if gap and not gap.isspace() and any(self.fold(c) is not None for c in gap):
            return self._spans(text)
        return out

    def _spans(self, text: str) -> list[tuple[int, int, str]]:
        out: list[tuple[int, int, str]] = []
        start, buf = -1, []

        def flush(end: int) -> None:
            nonlocal start, buf
            if buf:
                token = "".join(buf)
                out.append((start, end, self.filter(token).lower()))
            start, buf = -1, []

        for i, char in enumerate(text):
            folded = self.fold(char)
            if folded is None:
                flush(i)
            elif folded == "":
                flush(i)
                out.append((i, i + 1, char))
            else:
                if not buf:
                    start = i
                buf.append(folded)
        flush(len(text))
        return out

    def tokenize(self, text: str) -> list[str]:
        return [token for _, _, token in self.spans(text)]


_DEFAULT_TOKENIZER = Tokenizer()
_ALNUM = re.compile(r"[^\W_]+")


def tokenize(text: str) -> list[str]:
    """Tokens under the default settings (charset_table non_cont)."""
    return _DEFAULT_TOKENIZER.tokenize(text)


class _Problem(Exception):
    """An error answer: HTTP status and JSON body."""

    def __init__(self, status: int, body: Any) -> None:
        super().__init__(body)
        self.status = status
        self.body = body


def _sql_error(message: str) -> _Problem:
    # mail-notes 6: /sql?mode=raw failures are HTTP 500 with one object.
    return _Problem(500, {"error": message})


def _syntax_error(near: str) -> _Problem:
    # mail-notes 6:
    # {"error":"P02: syntax error, unexpected identifier near 'CREAT TABLE oops (x text)'"}
    return _sql_error(f"P02: syntax error, unexpected identifier near '{near[:60]}'")


@dataclass
class Table:
    name: str
    columns: dict[str, str]
    options: dict[str, str]
    docs: dict[int, dict[str, Any]] = field(default_factory=dict)
    tokenizer: Tokenizer = field(default_factory=Tokenizer)
    #: per document: field -> tokens, for every text column
    tokens: dict[int, dict[str, list[str]]] = field(default_factory=dict)
    #: per document: token -> the fields it occurs in
    where: dict[int, dict[str, set[str]]] = field(default_factory=dict)

    @property
    def text_fields(self) -> list[str]:
        return [n for n, t in self.columns.items() if t == "text"]

    @property
    def attributes(self) -> dict[str, str]:
        return {n: t for n, t in self.columns.items() if t != "text"}

    def normalize(self, doc: Any) -> dict[str, Any]:
        """A full stored document from a request's ``doc`` (missing columns
        get their type's default); unknown columns are refused."""
        if not isinstance(doc, dict):
            raise _BulkError("parse_exception", "'doc' must be an object", 400)
        for key in doc:
            if key not in self.columns:
                # mail-notes 6: {"type":"unknown column: 'nosuchfield'"}; 3.2: → 409
                raise _BulkError(f"unknown column: '{key}'", None, 409)
        out: dict[str, Any] = {}
        for name, kind in self.columns.items():
            value = doc.get(name)
            if kind in ("text", "string"):
                out[name] = value if isinstance(value, str) else ("" if value is None
                                                                  else str(value))
            elif kind in _INT_TYPES:
                out[name] = int(value) if isinstance(value, int | float) else 0
            elif kind in _MVA_TYPES:
                values = value if isinstance(value, list) else []
                # MVA values are kept sorted and unique.
                out[name] = sorted({int(v) for v in values if isinstance(v, int | float)})
            elif kind == "float":
                out[name] = float(value) if isinstance(value, int | float) else 0.0
            elif kind == "bool":
                out[name] = bool(value)
            else:  # json
                out[name] = value if value is not None else {}
        return out

    def put(self, doc_id: int, doc: dict[str, Any]) -> None:
        self.docs[doc_id] = doc
        self.tokens[doc_id] = {f: self.tokenizer.tokenize(doc[f]) for f in self.text_fields}
        where: dict[str, set[str]] = {}
        for name, words in self.tokens[doc_id].items():
            for word in words:
                where.setdefault(word, set()).add(name)
        self.where[doc_id] = where

    def remove(self, doc_id: int) -> bool:
        self.tokens.pop(doc_id, None)
        self.where.pop(doc_id, None)
        return self.docs.pop(doc_id, None) is not None

    def copy(self) -> Table:
        return Table(self.name, self.columns, self.options, dict(self.docs), self.tokenizer,
                     dict(self.tokens), dict(self.where))


class _BulkError(Exception):
    def __init__(self, kind: str, reason: str | None, status: int) -> None:
        super().__init__(kind)
        self.kind = kind
        self.reason = reason
        self.status = status


@dataclass(frozen=True)
class RecordedRequest:
    method: str
    path: str
    query: str
    headers: dict[str, str]
    body: bytes

    def json(self) -> Any:
        return json.loads(self.body)

    def ndjson(self) -> list[Any]:
        return [json.loads(line) for line in self.body.decode().split("\n") if line.strip()]


@dataclass
class _Fault:
    kind: Literal["answer", "hang", "drop", "drip"]
    remaining: int
    endpoint: str | None
    status: int = 503
    body: bytes = b""
    content_type: str = JSON_CONTENT_TYPE
    seconds: float = 0.0


# -- full-text queries -------------------------------------------------------


class _QueryError(Exception):
    pass


@dataclass
class _Ctx:
    """One document as a query sees it."""

    doc_id: int
    tokens: dict[str, list[str]]
    where: dict[str, set[str]]  # token -> fields containing it


class _Node:
    def matches(self, ctx: _Ctx) -> bool:
        raise NotImplementedError

    def positive(self) -> list[tuple[str, frozenset[str] | None]]:
        """(token, fields or None for all) the query looks for (not excluded)."""
        return []


@dataclass
class _All(_Node):
    def matches(self, ctx: _Ctx) -> bool:
        return True


@dataclass
class _Word(_Node):
    tokens: list[str]
    fields: frozenset[str] | None = None

    def matches(self, ctx: _Ctx) -> bool:
        # Several tokens from one query word (a\@b) must all be there.
        for token in self.tokens:
            found = ctx.where.get(token, set())
            if not (found if self.fields is None else found & self.fields):
                return False
        return True

    def positive(self) -> list[tuple[str, frozenset[str] | None]]:
        return [(t, self.fields) for t in self.tokens]


@dataclass
class _Phrase(_Node):
    tokens: list[str]
    fields: frozenset[str] | None = None

    def matches(self, ctx: _Ctx) -> bool:
        n = len(self.tokens)
        for name, words in ctx.tokens.items():
            if self.fields is not None and name not in self.fields:
                continue
            for i in range(len(words) - n + 1):
                if words[i:i + n] == self.tokens:
                    return True
        return False

    def positive(self) -> list[tuple[str, frozenset[str] | None]]:
        return [(t, self.fields) for t in self.tokens]


@dataclass
class _Not(_Node):
    child: _Node

    def matches(self, ctx: _Ctx) -> bool:
        return not self.child.matches(ctx)


@dataclass
class _And(_Node):
    children: list[_Node]

    def matches(self, ctx: _Ctx) -> bool:
        return all(c.matches(ctx) for c in self.children)

    def positive(self) -> list[tuple[str, frozenset[str] | None]]:
        return [p for c in self.children if not isinstance(c, _Not) for p in c.positive()]


@dataclass
class _Or(_Node):
    children: list[_Node]

    def matches(self, ctx: _Ctx) -> bool:
        return any(c.matches(ctx) for c in self.children)

    def positive(self) -> list[tuple[str, frozenset[str] | None]]:
        return [p for c in self.children for p in c.positive()]


# Operators.md: keywords and characters with a meaning the stand-in does not
# implement (see the module docstring).
_UNSUPPORTED_CHARS = set("@^$~/<=")
_UNSUPPORTED_WORD = re.compile(
    r"MAYBE|SENTENCE|PARAGRAPH|(?:NEAR|NOTNEAR)/\d+|ZONE:.*|ZONESPAN:.*|REGEX.*")


def _lex(query: str) -> list[tuple[str, str]]:
    out: list[tuple[str, str]] = []
    i, n = 0, len(query)
    while i < n:
        c = query[i]
        if c.isspace():
            i += 1
            continue
        if c in "()|":
            out.append(({"(": "LP", ")": "RP", "|": "OR"}[c], c))
            i += 1
            continue
        term_start = i == 0 or query[i - 1].isspace() or query[i - 1] in "(|"
        if c in "-!" and term_start and i + 1 < n and not query[i + 1].isspace():
            out.append(("NOT", c))
            i += 1
            continue
        if c == '"':
            j, buf = i + 1, []
            while j < n and query[j] != '"':
                if query[j] == "\\" and j + 1 < n:
                    buf.append(query[j + 1])
                    j += 2
                    continue
                buf.append(query[j])
                j += 1
            if j >= n:
                raise _QueryError(f"syntax error, unexpected $end near '{query[i:i + 30]}'")
            if j + 1 < n and query[j + 1] in "~/":
                raise _QueryError(f"proximity/quorum operator near '{query[j:j + 20]}' "
                                  "is not supported by the stand-in")
            out.append(("PHRASE", "".join(buf)))
            i = j + 1
            continue
        j, buf = i, []
        while j < n and not query[j].isspace() and query[j] not in '()|"':
            ch = query[j]
            if ch == "\\":
                if j + 1 >= n:
                    raise _QueryError("syntax error, unexpected $end near '\\'")
                buf.append(query[j + 1])  # escaped: a plain character
                j += 2
                continue
            if ch in _UNSUPPORTED_CHARS:
                raise _QueryError(f"syntax error, unexpected '{ch}' near '{query[j:j + 30]}'")
            buf.append(ch)
            j += 1
        word = "".join(buf)
        raw = query[i:j]
        if "\\" not in raw and _UNSUPPORTED_WORD.fullmatch(raw):
            raise _QueryError(f"operator '{raw}' is not supported by the stand-in")
        out.append(("WORD", word))
        i = j
    return out


class _Parser:
    def __init__(self, tokens: list[tuple[str, str]], fields: frozenset[str] | None,
                 tokenizer: Tokenizer) -> None:
        self.tokenizer = tokenizer
        self.tokens = tokens
        self.pos = 0
        self.fields = fields

    def peek(self) -> str | None:
        return self.tokens[self.pos][0] if self.pos < len(self.tokens) else None

    def parse(self) -> _Node:
        node = self.expr()
        if self.pos < len(self.tokens):
            raise _QueryError(f"syntax error, unexpected '{self.tokens[self.pos][1]}'")
        return node

    def expr(self) -> _Node:
        items: list[_Node] = []
        while self.peek() not in (None, "RP"):
            item = self.alternatives()
            if not isinstance(item, _All):
                items.append(item)
        if not items:
            return _All()
        if all(isinstance(i, _Not) for i in items):
            # Operators.md: "Queries containing only negations are not supported
            # by default" (message not recorded).
            raise _QueryError("query is non-computable (single NOT operator)")
        return items[0] if len(items) == 1 else _And(items)

    def alternatives(self) -> _Node:
        options = [self.unary()]
        while self.peek() == "OR":
            self.pos += 1
            if self.peek() in (None, "RP", "OR"):
                raise _QueryError("syntax error, unexpected '|'")
            options.append(self.unary())
        if len(options) == 1:
            return options[0]
        if any(isinstance(o, _Not) for o in options):
            raise _QueryError("syntax error, NOT inside an OR is not supported")
        real = [o for o in options if not isinstance(o, _All)]
        return _Or(real) if real else _All()

    def unary(self) -> _Node:
        if self.peek() == "NOT":
            self.pos += 1
            child = self.primary()
            return child if isinstance(child, _All) else _Not(child)
        return self.primary()

    def primary(self) -> _Node:
        kind = self.peek()
        if kind is None:
            raise _QueryError("syntax error, unexpected $end")
        value = self.tokens[self.pos][1]
        self.pos += 1
        if kind == "WORD":
            # Real server: a word with no token left (all separators) matches
            # everything; the client must never send one.
            words = self.tokenizer.tokenize(value)
            return _Word(words, self.fields) if words else _All()
        if kind == "PHRASE":
            words = self.tokenizer.tokenize(value)
            if not words:
                return _All()
            if len(words) == 1:
                return _Word(words, self.fields)
            return _Phrase(words, self.fields)
        if kind == "LP":
            node = self.expr()
            if self.peek() != "RP":
                raise _QueryError("syntax error, unexpected $end, expecting ')'")
            self.pos += 1
            return node
        raise _QueryError(f"syntax error, unexpected '{value}'")


def parse_query_string(query: str, fields: frozenset[str] | None = None,
                       tokenizer: Tokenizer = _DEFAULT_TOKENIZER) -> _Node:
    return _Parser(_lex(query), fields, tokenizer).parse()


# -- the server --------------------------------------------------------------


class ManticoreStandIn:
    """Use through ``open_manticore_standin()``."""

    def __init__(self, ssl_context: ssl.SSLContext | None = None) -> None:
        self.ssl_context = ssl_context
        self.port: int = 0
        self.tables: dict[str, Table] = {}
        self.requests: list[RecordedRequest] = []
        self._faults: list[_Fault] = []
        self._scope = trio.CancelScope()
        self._stopped = trio.Event()

    @property
    def url(self) -> str:
        scheme = "https" if self.ssl_context else "http"
        return f"{scheme}://127.0.0.1:{self.port}"

    # -- test controls -------------------------------------------------------

    def answer_next(self, status: int, body: bytes | str | Any, *, count: int = 1,
                    endpoint: str | None = None,
                    content_type: str = JSON_CONTENT_TYPE) -> None:
        """The next ``count`` requests (to ``endpoint``, a path like "/bulk",
        if given) get this answer instead of the real one. A body that is not
        bytes/str is sent as JSON."""
        if isinstance(body, str):
            raw = body.encode()
        elif isinstance(body, bytes):
            raw = body
        else:
            raw = json.dumps(body).encode()
        self._faults.append(_Fault("answer", count, endpoint, status, raw, content_type))

    def fail_next(self, count: int = 1, *, endpoint: str | None = None) -> None:
        """503 for the next ``count`` requests. Not recorded from a server:
        modelled on searchd's "maxed out" refusal."""
        self.answer_next(503, {"error": "server maxed out, retry in a second"},
                         count=count, endpoint=endpoint)

    def hang_next(self, seconds: float, *, count: int = 1, endpoint: str | None = None) -> None:
        """Read the request, then wait ``seconds`` before answering it."""
        self._faults.append(_Fault("hang", count, endpoint, seconds=seconds))

    def drip_next(self, every: float, *, count: int = 1, endpoint: str | None = None) -> None:
        """Answer 200 with a Content-Length of 100,000, then send one byte
        every ``every`` seconds, without end (a server or proxy that stalls
        mid-answer while keeping the connection alive)."""
        self._faults.append(_Fault("drip", count, endpoint, seconds=every))

    def drop_next(self, *, count: int = 1, endpoint: str | None = None) -> None:
        """Read the request, then close the connection without an answer."""
        self._faults.append(_Fault("drop", count, endpoint))

    async def stop(self) -> None:
        """Close the listener and every connection: connections are refused."""
        self._scope.cancel()
        await self._stopped.wait()

    def table(self, name: str) -> Table:
        return self.tables[name]

    def requests_to(self, path: str) -> list[RecordedRequest]:
        return [r for r in self.requests if r.path == path]

    def _take_fault(self, path: str) -> _Fault | None:
        for fault in self._faults:
            if fault.endpoint is None or fault.endpoint == path:
                fault.remaining -= 1
                if fault.remaining <= 0:
                    self._faults.remove(fault)
                return fault
        return None

    # -- HTTP ----------------------------------------------------------------

    async def run(self, *, task_status: trio.TaskStatus[None] = trio.TASK_STATUS_IGNORED
                  ) -> None:
        try:
            with self._scope:
                listeners = await trio.open_tcp_listeners(0, host="127.0.0.1")
                listener = listeners[0]
                self.port = listener.socket.getsockname()[1]
                async with listener, trio.open_nursery() as nursery:
                    task_status.started()
                    while True:
                        stream = await listener.accept()
                        nursery.start_soon(self._connection, stream)
        finally:
            self._stopped.set()

    async def _connection(self, stream: trio.abc.Stream) -> None:
        if self.ssl_context is not None:
            stream = trio.SSLStream(stream, self.ssl_context, server_side=True)
        conn = h11.Connection(h11.SERVER)
        try:
            while True:
                request = await self._read(conn, stream)
                if request is None:
                    return
                self.requests.append(request)
                fault = self._take_fault(request.path)
                if fault is not None and fault.kind == "drop":
                    return
                if fault is not None and fault.kind == "drip":
                    await stream.send_all(b"HTTP/1.1 200 OK\r\nContent-Type: application/"
                                          b"json\r\nContent-Length: 100000\r\n\r\n")
                    while True:  # until the client gives up and closes
                        await stream.send_all(b" ")
                        await trio.sleep(fault.seconds)
                if fault is not None and fault.kind == "hang":
                    await trio.sleep(fault.seconds)
                if fault is not None and fault.kind == "answer":
                    status, body, ctype = fault.status, fault.body, fault.content_type
                else:
                    status, payload = self._dispatch(request)
                    # Compact, like the server's own replies (mail-notes 6).
                    body = json.dumps(payload, ensure_ascii=False,
                                      separators=(",", ":")).encode()
                    ctype = JSON_CONTENT_TYPE
                await self._send(conn, stream, status, body, ctype)
                if conn.our_state is h11.MUST_CLOSE or conn.their_state is h11.MUST_CLOSE:
                    return
                conn.start_next_cycle()
        except (trio.BrokenResourceError, trio.ClosedResourceError, h11.ProtocolError):
            return
        finally:
            with trio.move_on_after(1, shield=True):
                try:
                    await stream.aclose()
                except (trio.BrokenResourceError, trio.ClosedResourceError):
                    pass

    async def _read(self, conn: h11.Connection, stream: trio.abc.Stream
                    ) -> RecordedRequest | None:
        head: h11.Request | None = None
        body = bytearray()
        while True:
            event = conn.next_event()
            if event is h11.NEED_DATA:
                conn.receive_data(bytes(await stream.receive_some(65536)))
                continue
            if isinstance(event, h11.Request):
                head = event
            elif isinstance(event, h11.Data):
                body += event.data
            elif isinstance(event, h11.EndOfMessage):
                assert head is not None
                target = urlsplit(head.target.decode("latin-1"))
                headers = {k.decode().lower(): v.decode("latin-1") for k, v in head.headers}
                return RecordedRequest(head.method.decode(), target.path, target.query,
                                       headers, bytes(body))
            elif isinstance(event, h11.ConnectionClosed):
                return None

    async def _send(self, conn: h11.Connection, stream: trio.abc.Stream, status: int,
                    body: bytes, content_type: str) -> None:
        headers = [("Content-Type", content_type), ("Content-Length", str(len(body)))]
        await stream.send_all(conn.send(h11.Response(status_code=status, headers=headers)))
        await stream.send_all(conn.send(h11.Data(data=body)))
        await stream.send_all(conn.send(h11.EndOfMessage()))

    def _dispatch(self, request: RecordedRequest) -> tuple[int, Any]:
        routes = {
            "/sql": self._sql,
            "/bulk": self._bulk,
            "/insert": self._insert, "/create": self._insert,
            "/replace": self._replace, "/index": self._replace,
            "/update": self._update,
            "/delete": self._delete,
            "/search": self._search,
        }
        handler = routes.get(request.path)
        try:
            if handler is None:
                # Not recorded: the stand-in's answer for endpoints it lacks.
                raise _Problem(501, {"error": f"endpoint {request.path} is not "
                                              "implemented by the stand-in"})
            return handler(request)
        except _Problem as problem:
            return problem.status, problem.body

    # -- /sql?mode=raw -------------------------------------------------------

    def _sql(self, request: RecordedRequest) -> tuple[int, Any]:
        params = parse_qs(request.query)
        text = request.body.decode("utf-8", "replace")
        if text.startswith("query="):  # HTTP.md: the body may be query=<urlencoded>
            text = unquote_plus(text[len("query="):])
        elif "query" in params:
            text = params["query"][0]
        if params.get("mode") != ["raw"]:
            # HTTP.md: plain /sql accepts only SELECT (answer not recorded).
            raise _sql_error("only SELECT queries are supported by /sql; use /sql?mode=raw")
        statements = [s for s in _split_statements(text) if s.strip()]
        if not statements:
            raise _syntax_error(text)
        if len(statements) > 1:
            # mail-notes 6: multi-statement requests do not behave as documented;
            # the stand-in refuses them so a client sends one per request.
            raise _syntax_error(statements[1].strip())
        return 200, self._statement(statements[0].strip())

    def _statement(self, stmt: str) -> Any:
        ok = [{"total": 0, "error": "", "warning": ""}]  # mail-notes 6, DDL success
        m = re.match(r"CREATE\s+TABLE\s+(IF\s+NOT\s+EXISTS\s+)?", stmt, re.IGNORECASE)
        if m:
            return self._create(stmt[m.end():], bool(m.group(1))) or ok
        m = re.fullmatch(r"DROP\s+TABLE\s+(IF\s+EXISTS\s+)?([A-Za-z_]\w*)", stmt,
                         re.IGNORECASE)
        if m:
            name = m.group(2).lower()
            if name not in self.tables:
                if m.group(1):
                    return ok  # mail-notes 6: DROP TABLE IF EXISTS → 200
                # mail-notes 6, verbatim shape
                raise _sql_error(f"DROP TABLE failed: unknown table '{name}'")
            del self.tables[name]
            return ok
        m = re.fullmatch(r"ALTER\s+TABLE\s+([A-Za-z_]\w*)\s+ADD\s+COLUMN\s+([A-Za-z_]\w*)"
                         r"\s+(\w+)", stmt, re.IGNORECASE)
        if m:
            # Updating_table_schema.md: ALTER TABLE ... ADD COLUMN on a real-time
            # table; existing documents read the type's default (0, false, "").
            # Success is the DDL answer (mail-notes 6); the failure texts are
            # not recorded, modelled on DROP TABLE's.
            name, column, kind = m.group(1).lower(), m.group(2).lower(), m.group(3).lower()
            table = self.tables.get(name)
            if table is None:
                raise _sql_error(f"ALTER TABLE failed: unknown table '{name}'")
            if kind not in _TYPES - {"text"}:
                raise _syntax_error(kind)
            if column in table.columns or column == "id":
                raise _sql_error(f"table '{name}': alter failed: '{column}' attribute "
                                 "already exists")
            columns = {**table.columns, column: {"mva": "multi", "mva64": "multi64",
                                                  "integer": "int"}.get(kind, kind)}
            altered = Table(name, columns, table.options, tokenizer=table.tokenizer)
            for doc_id, doc in table.docs.items():
                altered.put(doc_id, altered.normalize(doc))
            self.tables[name] = altered
            return ok
        if re.fullmatch(r"SHOW\s+TABLES", stmt, re.IGNORECASE):
            # mail-notes 6: SHOW gives [{"columns":[…],"data":[…],"total":N,…}]
            data = [{"Table": n, "Type": "rt"} for n in sorted(self.tables)]
            return [{"columns": [{"Table": {"type": "string"}}, {"Type": {"type": "string"}}],
                     "data": data, "total": len(data), "error": "", "warning": ""}]
        m = re.fullmatch(r"(?:DESC|DESCRIBE)\s+([A-Za-z_]\w*)", stmt, re.IGNORECASE)
        if m:
            table = self.tables.get(m.group(1).lower())
            if table is None:
                # Not recorded: modelled on the DROP TABLE answer.
                raise _sql_error(f"no such table '{m.group(1).lower()}'")
            rows = [{"Field": "id", "Type": "bigint", "Properties": ""}]
            for name, kind in table.columns.items():
                # HTTP.md (mode=raw "desc test" example): text is "indexed stored"
                props = "indexed stored" if kind == "text" else ""
                rows.append({"Field": name, "Type": kind, "Properties": props})
            return [{"columns": [{"Field": {"type": "string"}}, {"Type": {"type": "string"}},
                                 {"Properties": {"type": "string"}}],
                     "data": rows, "total": len(rows), "error": "", "warning": ""}]
        raise _syntax_error(stmt)

    def _create(self, rest: str, if_not_exists: bool) -> Any:
        m = re.match(r"[A-Za-z_][A-Za-z0-9_]*", rest)
        if not m:
            raise _syntax_error(rest)
        name = m.group().lower()
        rest = rest[m.end():].lstrip()
        if not rest.startswith("("):
            raise _syntax_error(rest)  # e.g. a '-' in the table name
        depth, end = 0, -1
        for i, ch in enumerate(rest):
            depth += ch == "("
            depth -= ch == ")"
            if depth == 0:
                end = i
                break
        if end < 0:
            raise _syntax_error(rest)
        columns: dict[str, str] = {}
        for part in rest[1:end].split(","):
            words = part.split()
            if len(words) < 2 or not re.fullmatch(r"[A-Za-z_]\w*", words[0]):
                raise _syntax_error(part.strip())
            column, kind = words[0].lower(), words[1].lower()
            flags = {w.lower() for w in words[2:]}
            if kind not in _TYPES or not flags <= {"indexed", "stored", "attribute"}:
                raise _syntax_error(part.strip())
            if column in columns or column == "id":
                # Not recorded verbatim.
                raise _sql_error(f"table '{name}': CREATE TABLE failed: duplicate attribute "
                                 f"name '{column}'")
            columns[column] = {"mva": "multi", "mva64": "multi64",
                               "integer": "int"}.get(kind, kind)
        options: dict[str, str] = {}
        filters: list[str] = []
        tail = rest[end + 1:].strip().rstrip(";").strip()
        for m in re.finditer(r"\s*([A-Za-z_]\w*)\s*=\s*(?:'((?:[^'\\]|\\.)*)'|(\d+))", tail):
            value = m.group(2) if m.group(2) is not None else m.group(3)
            options[m.group(1).lower()] = value
            if m.group(1).lower() == "regexp_filter":
                filters.append(value)  # repeatable, applied in order (regexp_filter docs)
        leftover = re.sub(r"\s*([A-Za-z_]\w*)\s*=\s*(?:'((?:[^'\\]|\\.)*)'|(\d+))", "", tail)
        if leftover.strip():
            raise _syntax_error(leftover.strip())
        if name in self.tables:
            if if_not_exists:
                return None  # mail-notes 6: IF NOT EXISTS → 200
            # mail-notes 6, verbatim shape
            raise _sql_error(f"table '{name}': CREATE TABLE failed: table '{name}' already exists")
        try:
            tokenizer = Tokenizer.of(options, filters)
        except (ValueError, re.error) as exc:
            raise _sql_error(f"table '{name}': CREATE TABLE failed: {exc}") from None
        self.tables[name] = Table(name, columns, options, tokenizer=tokenizer)
        return None

    # -- writes --------------------------------------------------------------

    def _bulk(self, request: RecordedRequest) -> tuple[int, Any]:
        ctype = request.headers.get("content-type", "").split(";")[0].strip().lower()
        if ctype != "application/x-ndjson":
            # mail-notes 6, verbatim
            raise _Problem(400, {"error": {"type": "parse_exception",
                                           "reason": "Content-Type must be application/x-ndjson"},
                                 "status": 400})
        lines = request.body.decode("utf-8", "replace").split("\n")
        items: list[Any] = []
        batch: Table | None = None  # working copy of the table of the open batch
        batch_lines = 0
        counts = {"created": 0, "deleted": 0, "updated": 0}
        last_id = 0

        def commit() -> None:
            nonlocal batch, batch_lines, counts
            if batch is not None:
                self.tables[batch.name] = batch
                # mail-notes 6: ONE aggregated item per committed batch, _id = id of
                # the batch's last line. (Result/status for replace- or delete-only
                # batches are not recorded; the aggregated item keeps "created"/201.)
                items.append({"bulk": {"table": batch.name, "_id": last_id, **counts,
                                       "result": "created", "status": 201}})
            batch, batch_lines = None, 0
            counts = {"created": 0, "deleted": 0, "updated": 0}

        for number, line in enumerate(lines, start=1):
            if not line.strip():
                commit()  # mail-notes 3.2: an empty line commits the batch so far
                continue
            try:
                parsed = json.loads(line)
                if not isinstance(parsed, dict) or len(parsed) != 1:
                    raise ValueError("one operation per line")
            except ValueError:
                # mail-notes 6, verbatim: a broken JSON line → 400
                return 400, {"items": items, "current_line": number,
                             "skipped_lines": batch_lines + 1, "errors": True,
                             "error": "unable to parse: "}
            op, spec = next(iter(parsed.items()))
            spec = spec if isinstance(spec, dict) else {}
            name = str(spec.get("table", spec.get("index", ""))).lower()
            if batch is not None and batch.name != name:
                commit()  # mail-notes 3.2: a switch to another table commits
            try:
                if batch is None:
                    source = self.tables.get(name)
                    if source is None:
                        # mail-notes 6: missing table: {"type":"table 'nosuchtable' absent"}
                        raise _BulkError(f"table '{name}' absent", None, 409)
                    batch = source.copy()
                batch_lines += 1
                last_id = self._apply(batch, op, spec, counts)
            except _BulkError as exc:
                # mail-notes 6: HTTP 500, failing batch rolled back whole, message in
                # items[].<op>.error.type (no reason), top-level "error" repeats it.
                error: dict[str, Any] = {"type": exc.kind, "table": name}
                if exc.reason:
                    error["reason"] = exc.reason
                items.append({op: {"error": error, "status": exc.status}})
                return 500, {"items": items, "current_line": number,
                             "skipped_lines": batch_lines + (batch is None),
                             "errors": True, "error": exc.kind}
        commit()
        # mail-notes 6, success shape (current_line counts the trailing empty line)
        return 200, {"items": items, "current_line": len(lines), "skipped_lines": 0,
                     "errors": False, "error": ""}

    def _apply(self, table: Table, op: str, spec: dict[str, Any],
               counts: dict[str, int]) -> int:
        doc_id = spec.get("id")
        if op in ("insert", "create") and doc_id is None:
            doc_id = max(table.docs, default=0) + 1
        if doc_id is None and op in ("delete", "update") and "query" in spec:
            matched = [i for i in list(table.docs)
                       if self._node(table, spec["query"]).matches(_doc_ctx(table, i))]
            for i in matched:
                if op == "delete":
                    table.remove(i)
            counts["deleted" if op == "delete" else "updated"] += len(matched)
            return matched[-1] if matched else 0
        if isinstance(doc_id, bool) or not isinstance(doc_id, int):
            # mail-notes 3.2: parse_exception → 400
            raise _BulkError("parse_exception", "Document ids should be integer", 400)
        if doc_id < 0:
            raise _BulkError("parse_exception", "Negative document ids are not allowed", 400)
        if op in ("insert", "create"):
            if doc_id in table.docs:
                raise _BulkError(f"duplicate id '{doc_id}'", None, 409)  # mail-notes 6
            table.put(doc_id, table.normalize(spec.get("doc")))
            counts["created"] += 1
        elif op in ("replace", "index"):
            existed = doc_id in table.docs
            table.put(doc_id, table.normalize(spec.get("doc")))
            counts["updated" if existed else "created"] += 1
        elif op == "delete":
            counts["deleted"] += table.remove(doc_id)
        elif op == "update":
            if doc_id in table.docs:
                raw_doc = spec.get("doc")
                update: dict[str, Any] = raw_doc if isinstance(raw_doc, dict) else {}
                table.put(doc_id, table.normalize({**table.docs[doc_id], **update}))
                counts["updated"] += 1
        else:
            raise _BulkError("parse_exception", f"unknown operation '{op}'", 400)
        return doc_id

    def _single(self, request: RecordedRequest) -> tuple[str, Table, Any]:
        try:
            spec = json.loads(request.body)
        except ValueError:
            # Not recorded verbatim: the parse_exception envelope of mail-notes 3.2.
            raise _Problem(400, {"error": {"type": "parse_exception",
                                           "reason": "request body is not JSON"},
                                 "status": 400}) from None
        if not isinstance(spec, dict):
            raise _Problem(400, {"error": {"type": "parse_exception",
                                           "reason": "request body must be an object"},
                                 "status": 400})
        name = str(spec.get("table", spec.get("index", ""))).lower()
        table = self.tables.get(name)
        if table is None:
            # mail-notes 6 (/replace on a missing table), verbatim
            raise _Problem(409, {"error": {"type": "action_request_validation_exception",
                                           "reason": f"table '{name}' absent", "table": name},
                                 "status": 409})
        return name, table, spec

    def _single_write(self, request: RecordedRequest, op: str) -> tuple[str, int, bool]:
        name, table, spec = self._single(request)
        work = table.copy()
        counts = {"created": 0, "deleted": 0, "updated": 0}
        try:
            doc_id = self._apply(work, op, spec, counts)
        except _BulkError as exc:
            # mail-notes 6: {"error":{"type":"action_request_validation_exception",
            # "reason":"duplicate id '2'","table":"emails"},"status":409}
            kind = "parse_exception" if exc.kind == "parse_exception" else \
                "action_request_validation_exception"
            raise _Problem(exc.status, {"error": {"type": kind, "reason": exc.reason or exc.kind,
                                                  "table": name},
                                        "status": exc.status}) from None
        self.tables[name] = work
        return name, doc_id, counts["created"] > 0

    def _insert(self, request: RecordedRequest) -> tuple[int, Any]:
        name, doc_id, _ = self._single_write(request, "insert")
        # mail-notes 6: HTTP 200 with "status":201 in the body
        return 200, {"table": name, "id": doc_id, "created": True, "result": "created",
                     "status": 201}

    def _replace(self, request: RecordedRequest) -> tuple[int, Any]:
        name, doc_id, _ = self._single_write(request, "replace")
        # mail-notes 6: the same answer whether it created or replaced
        return 200, {"table": name, "id": doc_id, "created": False, "result": "updated",
                     "status": 200}

    def _update(self, request: RecordedRequest) -> tuple[int, Any]:
        name, doc_id, _ = self._single_write(request, "update")
        # Not recorded: modelled on the /replace answer.
        return 200, {"table": name, "id": doc_id, "result": "updated"}

    def _delete(self, request: RecordedRequest) -> tuple[int, Any]:
        name, table, spec = self._single(request)
        if "query" in spec and "id" not in spec:
            node = self._node(table, spec["query"])
            matched = [i for i in list(table.docs) if node.matches(_doc_ctx(table, i))]
            for i in matched:
                table.remove(i)
            return 200, {"table": name, "deleted": len(matched)}  # mail-notes 6
        doc_id = spec.get("id")
        found = isinstance(doc_id, int) and table.remove(doc_id)
        # mail-notes 6: found/not found, both HTTP 200
        return 200, {"table": name, "id": doc_id, "found": bool(found),
                     "result": "deleted" if found else "not found"}

    # -- /search -------------------------------------------------------------

    def _search(self, request: RecordedRequest) -> tuple[int, Any]:
        try:
            spec = json.loads(request.body)
        except ValueError:
            raise _Problem(400, {"error": "request body is not JSON"}) from None  # not recorded
        if not isinstance(spec, dict) or not ("table" in spec or "index" in spec):
            raise _Problem(400, {"error": "\"table\" property missing"})  # mail-notes 6
        name = str(spec.get("table", spec.get("index"))).lower()
        table = self.tables.get(name)
        if table is None:
            # mail-notes 6, verbatim
            raise _Problem(500, {"error": f"unknown local table(s) '{name}' in search request"})
        raw_options = spec.get("options")
        options: dict[str, Any] = raw_options if isinstance(raw_options, dict) else {}
        try:
            # Pagination.md: limit/offset, or size/from; max_matches top-level
            # (Pagination.md) or in options (Options.md).
            limit = int(_first(spec, "limit", "size", default=20))
            offset = int(_first(spec, "offset", "from", default=0))
            max_matches = int(_first(spec, "max_matches", default=_first(
                options, "max_matches", default=1000)))
        except (TypeError, ValueError):
            raise _Problem(400, {"error": "limit, offset and max_matches must be integers"}
                           ) from None  # not recorded
        # Manticore's query checks (searchd source): "max_matches can not be less
        # than one", "offset out of bounds (offset=%d, max_matches=%d)". The JSON
        # envelope of these is not recorded; the 500 {"error"} shape of search
        # errors (mail-notes 6) is assumed.
        if max_matches < 1:
            raise _Problem(500, {"error": "max_matches can not be less than one"})
        if offset < 0 or offset >= max_matches:
            raise _Problem(500, {"error": f"offset out of bounds (offset={offset}, "
                                          f"max_matches={max_matches})"})
        if limit < 0:
            raise _Problem(500, {"error": f"limit out of bounds (limit={limit})"})

        query = spec.get("query", {"match_all": {}})
        node = self._node(table, query)
        weights = options.get("field_weights") or {}
        highlight_terms = node.positive()
        full_text = bool(highlight_terms) or _has_full_text(query)

        matched: list[tuple[int, int]] = []
        for doc_id in table.docs:
            ctx = _doc_ctx(table, doc_id)
            if node.matches(ctx):
                score = 1
                if full_text:
                    score = sum(int(weights.get(f, 1)) * len({t for t, fs in highlight_terms
                                                               if (fs is None or f in fs)
                                                               and f in ctx.where.get(t, ())})
                                for f in table.text_fields) * 1000 + 500
                matched.append((doc_id, score))

        sort = spec.get("sort")
        explicit = sort is not None
        keys = self._sort_keys(table, sort)
        matched.sort(key=lambda item: tuple(_key(table, item, k) for k in keys))
        window = matched[:max_matches]  # Pagination.md: the result set window
        page = window[offset:offset + limit]
        # mail-notes 6: "an explicit sort makes _score 1"; Sorting_and_ranking.md
        # shows real scores when the sort itself has _score; track_scores keeps them.
        track = (bool(spec.get("track_scores")) or not explicit
                 or any(attr == "_score" for attr, _ in keys))
        hits = []
        for doc_id, score in page:
            # mail-notes 6: "an explicit sort makes _score 1" (unless track_scores)
            hit: dict[str, Any] = {"_id": doc_id, "_score": score if track else 1,
                                   "_source": self._source(table, doc_id, spec.get("_source"))}
            if "highlight" in spec:
                hit["highlight"] = self._highlight(table, doc_id, spec["highlight"],
                                                   highlight_terms)
            hits.append(hit)
        # mail-notes 6 / Search_results.md: hits.total = all matches
        return 200, {"took": 0, "timed_out": False,
                     "hits": {"total": len(matched), "total_relation": "eq", "hits": hits}}

    def _node(self, table: Table, query: Any) -> _Node:
        """The matcher for a JSON query object (Filters.md, Basic_usage.md)."""
        try:
            return _compile(table, query)
        except _QueryError as exc:
            # Not recorded for JSON; Search_results.md gives the SQL form
            # "index idx: query error: no field 'surname' found in schema".
            raise _Problem(500, {"error": f"table {table.name}: query error: {exc}"}) from None

    def _sort_keys(self, table: Table, sort: Any) -> list[tuple[str, bool]]:
        if sort is None:
            return [("_score", True), ("id", False)]
        entries = sort if isinstance(sort, list) else [sort]
        keys: list[tuple[str, bool]] = []
        for entry in entries:
            if isinstance(entry, str):
                keys.append((entry, entry == "_score"))
                continue
            if not isinstance(entry, dict):
                continue
            for attr, how in entry.items():
                order = how.get("order", "asc") if isinstance(how, dict) else how
                keys.append((attr, str(order).lower() == "desc"))
        for attr, _ in keys:
            if attr not in ("_score", "id") and attr not in table.attributes:
                # mail-notes 6 shape for an unknown attribute
                raise _Problem(500, {"error": f"table {table.name}: unknown column: {attr}"})
        if ("id", False) not in keys and ("id", True) not in keys:
            keys.append(("id", False))
        return keys

    def _source(self, table: Table, doc_id: int, wanted: Any) -> dict[str, Any]:
        doc = table.docs[doc_id]
        names = list(table.columns)
        if wanted is None or wanted is True:
            return dict(doc)
        if wanted is False:
            return {}
        includes: list[str]
        excludes: list[str] = []
        if isinstance(wanted, str):
            includes = [wanted]
        elif isinstance(wanted, list):
            includes = [str(w) for w in wanted]
        elif isinstance(wanted, dict):
            includes = [str(w) for w in wanted.get("includes", [])]
            excludes = [str(w) for w in wanted.get("excludes", [])]
        else:
            includes = []
        # Search_results.md: empty includes = everything; excludes win.
        chosen = [n for n in names
                  if (not includes or any(fnmatch.fnmatchcase(n, p) for p in includes))
                  and not any(fnmatch.fnmatchcase(n, p) for p in excludes)]
        return {n: doc[n] for n in chosen}

    def _highlight(self, table: Table, doc_id: int, options: Any,
                   terms: list[tuple[str, frozenset[str] | None]]) -> dict[str, list[str]]:
        options = options if isinstance(options, dict) else {}
        wanted = options.get("fields")
        if isinstance(wanted, str):
            fields = [f.strip() for f in wanted.split(",")]
        elif isinstance(wanted, list):
            fields = [str(f) for f in wanted]
        elif isinstance(wanted, dict):
            fields = list(wanted)
        else:
            fields = table.text_fields
        # Highlighting.md: pre_tags/post_tags work like before_match/after_match,
        # default <b> and </b>; limit 256 codepoints per field; around 5 words.
        before = str(options.get("pre_tags", options.get("before_match", "<b>")))
        after = str(options.get("post_tags", options.get("after_match", "</b>")))
        limit = int(options.get("limit", 256))
        around = int(options.get("around", 5))
        allow_empty = options.get("no_match_size") == 0 or bool(options.get("allow_empty"))
        out: dict[str, list[str]] = {}
        for name in fields:
            if name not in table.text_fields:
                continue
            wanted_tokens = {t for t, fs in terms if fs is None or name in fs}
            fragments = _fragments(table.tokenizer, table.docs[doc_id][name], wanted_tokens,
                                   before, after, limit, around)
            if fragments:
                out[name] = fragments
            elif not allow_empty and table.docs[doc_id][name]:
                out[name] = [table.docs[doc_id][name][:limit]]
        return out


def _first(spec: dict[str, Any], *names: str, default: Any) -> Any:
    for name in names:
        if name in spec:
            return spec[name]
    return default


def _split_statements(text: str) -> list[str]:
    parts: list[str] = []
    buf: list[str] = []
    quote = False
    for i, ch in enumerate(text):
        if ch == "'" and (i == 0 or text[i - 1] != "\\"):
            quote = not quote
        if ch == ";" and not quote:
            parts.append("".join(buf))
            buf = []
            continue
        buf.append(ch)
    parts.append("".join(buf))
    return parts


def _doc_ctx(table: Table, doc_id: int) -> _Ctx:
    return _Ctx(doc_id, table.tokens[doc_id], table.where[doc_id])


def _has_full_text(query: Any) -> bool:
    if isinstance(query, dict):
        for key, value in query.items():
            if key in ("query_string", "match", "match_phrase"):
                return True
            if key == "bool" and isinstance(value, dict):
                return any(_has_full_text(v) for k, v in value.items() if k != "must_not")
            if isinstance(value, list | dict) and _has_full_text(value):
                return True
    if isinstance(query, list):
        return any(_has_full_text(q) for q in query)
    return False


def _key(table: Table, item: tuple[int, int], key: tuple[str, bool]) -> Any:
    doc_id, score = item
    attr, desc = key
    if attr == "_score":
        value: Any = score
    elif attr == "id":
        value = doc_id
    else:
        value = table.docs[doc_id][attr]
        if isinstance(value, str):
            value = value.lower()
        if isinstance(value, list):
            value = tuple(value)
    if isinstance(value, int | float):
        return -value if desc else value
    return _Reverse(value) if desc else value


@dataclass(frozen=True)
class _Reverse:
    value: Any

    def __lt__(self, other: _Reverse) -> bool:
        return bool(self.value > other.value)


def _fields(table: Table, spec: str) -> frozenset[str] | None:
    # Basic_usage.md: "*" or "_all" for all fields, "f1,f2", "!field" excludes.
    names = [s.strip() for s in spec.split(",") if s.strip()]
    if not names or names in (["*"], ["_all"]):
        return None
    for n in names:
        bare = n.lstrip("!")
        if bare not in table.text_fields:
            raise _QueryError(f"no field '{bare}' found in schema")
    if all(n.startswith("!") for n in names):
        return frozenset(set(table.text_fields) - {n[1:] for n in names})
    return frozenset(n for n in names if not n.startswith("!"))


def _as_list(value: Any) -> list[Any]:
    if value is None:
        return []
    return value if isinstance(value, list) else [value]


def _compile(table: Table, query: Any) -> _Node:
    if not isinstance(query, dict) or len(query) != 1:
        raise _QueryError("a query object must have exactly one key")
    kind, body = next(iter(query.items()))
    if kind == "match_all":
        return _All()
    if kind == "query_string":
        if not isinstance(body, str):
            raise _QueryError("query_string must be a string")
        return parse_query_string(body, tokenizer=table.tokenizer)
    if kind in ("match", "match_phrase"):
        if not isinstance(body, dict) or len(body) != 1:
            raise _QueryError(f"{kind} needs one field specification")
        spec, value = next(iter(body.items()))
        fields = _fields(table, spec)
        operator = "or"
        if isinstance(value, dict):
            operator = str(value.get("operator", "or")).lower()
            value = value.get("query", "")
        words = table.tokenizer.tokenize(str(value))
        if not words:
            return _All()
        if kind == "match_phrase":
            return _Phrase(words, fields) if len(words) > 1 else _Word(words, fields)
        parts: list[_Node] = [_Word([w], fields) for w in words]
        return _And(parts) if operator == "and" else _Or(parts)
    if kind == "bool":
        if not isinstance(body, dict):
            raise _QueryError("bool must be an object")
        must = [_compile(table, q) for q in _as_list(body.get("must"))]
        must += [_compile(table, q) for q in _as_list(body.get("filter"))]
        should = [_compile(table, q) for q in _as_list(body.get("should"))]
        must_not = [_compile(table, q) for q in _as_list(body.get("must_not"))]
        # Filters.md: should counts only when there is no must/must_not.
        children: list[_Node] = list(must) + [_Not(n) for n in must_not]
        if should and not must and not must_not:
            children.append(_Or(should))
        if not children:
            return _All()
        return _And(children)
    if kind in ("equals", "in", "range"):
        return _attribute_filter(table, kind, body)
    raise _QueryError(f"unknown query type '{kind}'")


@dataclass
class _AttrTest(_Node):
    test: Callable[[int], bool]

    def matches(self, ctx: _Ctx) -> bool:
        return self.test(ctx.doc_id)


def _attribute_filter(table: Table, kind: str, body: Any) -> _Node:
    """equals / in / range (Filters.md), with any()/all() on multi-value
    attributes; strings compare case-insensitively (Filters.md: collation
    libc_ci by default)."""
    if not isinstance(body, dict) or len(body) != 1:
        raise _QueryError(f"{kind} needs one attribute")
    raw_attr, value = next(iter(body.items()))
    m = re.fullmatch(r"(any|all)\((\w+)\)", raw_attr)
    mode, attr = (m.group(1), m.group(2)) if m else ("any", raw_attr)
    if attr != "id" and attr not in table.attributes:
        # mail-notes 6, verbatim shape
        raise _Problem(500, {"error": f"table {table.name}: unknown column: {attr}"})
    multi = attr != "id" and table.attributes[attr] in _MVA_TYPES

    def fold(v: Any) -> Any:
        return v.lower() if isinstance(v, str) else v

    if kind == "range":
        bounds = value if isinstance(value, dict) else {}

        def check(v: Any) -> bool:
            return (("gte" not in bounds or v >= bounds["gte"])
                    and ("gt" not in bounds or v > bounds["gt"])
                    and ("lte" not in bounds or v <= bounds["lte"])
                    and ("lt" not in bounds or v < bounds["lt"]))
    else:
        wanted = {fold(v) for v in (_as_list(value) if kind == "in" else [value])}

        def check(v: Any) -> bool:
            return fold(v) in wanted

    def test(doc_id: int) -> bool:
        raw = doc_id if attr == "id" else table.docs[doc_id][attr]
        results = [check(v) for v in (raw if isinstance(raw, list) else [raw])]
        if multi and mode == "all":
            return bool(results) and all(results)
        return any(results)

    return _AttrTest(test)


def _fragments(tokenizer: Tokenizer, text: str, wanted: set[str], before: str, after: str,
               limit: int, around: int) -> list[str]:
    spans = tokenizer.spans(text)
    hits = [i for i, (_, _, w) in enumerate(spans) if w in wanted]
    if not hits:
        return []
    windows: list[list[int]] = []
    for i in hits:
        lo, hi = max(0, i - around), min(len(spans) - 1, i + around)
        if windows and lo <= windows[-1][1] + 1:
            windows[-1][1] = max(windows[-1][1], hi)
        else:
            windows.append([lo, hi])
    fragments: list[str] = []
    used = 0
    for lo, hi in windows:
        start, end = spans[lo][0], spans[hi][1]
        if fragments and used + (end - start) > limit:
            break
        pieces, cursor = [], start
        for i in range(lo, hi + 1):
            s, e, w = spans[i]
            if w in wanted:
                pieces.append(text[cursor:s])
                pieces.append(before + text[s:e] + after)
                cursor = e
        pieces.append(text[cursor:end])
        fragments.append("".join(pieces))
        used += end - start
    return fragments


@asynccontextmanager
async def open_manticore_standin(*, ssl_context: ssl.SSLContext | None = None
                                 ) -> AsyncIterator[ManticoreStandIn]:
    """Start a stand-in on 127.0.0.1:<free port>; stopped on exit."""
    standin = ManticoreStandIn(ssl_context)
    async with trio.open_nursery() as nursery:
        await nursery.start(standin.run)
        try:
            yield standin
        finally:
            nursery.cancel_scope.cancel()

