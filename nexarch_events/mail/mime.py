"""MIME to index document: turn the raw bytes of one message into the fields
the search index stores (``parse_message``, then ``to_index_document``).

Extracted: Subject, From, To and Cc (display names and addresses), Date,
Message-ID, the text body (the text/plain parts; the text/html parts reduced
to text when there is no plain text), attachment file names, and the text of
text/* attachments and of attached messages. Headers are RFC 2047 decoded,
parameters RFC 2231 decoded, and any charset Python knows is honoured.

Nothing in a message makes ``parse_message`` raise anything but ``MimeError``,
and that only when there is no message at all (empty input, or binary data
with no header fields). Everything else is repaired and yields a document;
each repair, and each cap below when it bites, adds a human-readable line to
``ParsedMessage.notes``. Every string returned is NUL-free text that encodes
to UTF-8 (what Postgres ``text`` and ``jsonb`` accept).

Caps (so a hostile message costs bounded time and memory):

- ``max_text_chars`` (default ``DEFAULT_MAX_TEXT_CHARS`` = 1,000,000)
  characters for ``body`` and, separately, for ``attachment_text``. A
  gigantic part is sliced *before* it is decoded: at most about
  4 bytes per character of its transfer-decoded content are read.
- ``HTML_INPUT_FACTOR`` (8) bytes of HTML per character of budget are read
  when HTML is reduced to text (linear-time regular expressions, not
  html.parser, which is quadratic on hostile markup in Python 3.11).
- ``MAX_HEADER_CHARS`` (65,536) bytes of each header field value, and
  ``MAX_HEADER_FIELDS`` (10,000) fields per header section.
- ``MAX_PARTS`` (10,000) leaf parts and as many multipart containers.
- ``MAX_DEPTH`` (128) levels of nested multiparts and attached messages.
- ``MAX_ATTACHMENT_NAMES`` (1,000) names of ``MAX_NAME_CHARS`` (1,000) each.
- ``MAX_NOTES`` (100) notes; the last one says how many more there were.

Text is returned as decoded: line breaks stay as the message has them
(usually CRLF; normalising costs more than the rest of the decoding and no
index cares), except that HTML reduced to text has one line per block.

Performance (bench/mime_bench.py): the message is never copied whole and
never walked line by line in Python. Header sections and boundaries are
found by C-level searches (``re``, ``bytes.find``) on the raw buffer, parts
are addressed by offsets into it, fields nobody uses are never copied,
binary attachments are never decoded, and HTML is only reduced to text when
no plain text exists. Everything is linear in the input size.

Thread-safe: no shared mutable state (the indexer parses in worker threads).
"""

from __future__ import annotations

import binascii
import calendar
import codecs
import functools
import itertools
import re
import urllib.parse
from dataclasses import dataclass, field
from datetime import UTC, datetime, timedelta
from email.utils import parsedate_tz
from html import unescape

from ..errors import NexarchError
from ..index.base import IndexDocument
from ..models import MAX_MESSAGE_ID_LENGTH

__all__ = [
    "DEFAULT_MAX_TEXT_CHARS",
    "HTML_INPUT_FACTOR",
    "MAX_ATTACHMENT_NAMES",
    "MAX_DEPTH",
    "MAX_HEADER_CHARS",
    "MAX_HEADER_FIELDS",
    "MAX_NAME_CHARS",
    "MAX_NOTES",
    "MAX_PARTS",
    "Address",
    "MimeError",
    "ParsedMessage",
    "html_to_text",
    "parse_message",
    "to_index_document",
]

#: Characters kept per text field (``body``, ``attachment_text``) by default.
DEFAULT_MAX_TEXT_CHARS = 1_000_000
#: Bytes of one header field's value that are read; the rest is dropped.
MAX_HEADER_CHARS = 65_536
#: Header fields read per header section (only the fields used count:
#: Subject, From, To, Cc, Date, Message-ID, Content-*); the rest are skipped.
MAX_HEADER_FIELDS = 10_000
#: Leaf parts looked at (and, separately, multipart containers split).
MAX_PARTS = 10_000
#: Nesting levels of multiparts and attached messages that are descended.
MAX_DEPTH = 128
MAX_ATTACHMENT_NAMES = 1_000
MAX_NAME_CHARS = 1_000
MAX_NOTES = 100
#: Bytes of HTML read per character of the remaining text budget.
HTML_INPUT_FACTOR = 8

#: Upper bound of bytes per character in any charset we decode (UTF-8,
#: UTF-32, GB 18030): slicing a part to 4 x budget bytes never loses text
#: that the cap would keep.
_BYTES_PER_CHAR = 4
_EPOCH = datetime(1970, 1, 1, tzinfo=UTC)
#: Dates before this are clamped to it (with a note); later ones are kept:
#: mail from before 1970 is real (scanned letters, migrated archives).
_EARLIEST = datetime(1900, 1, 1, tzinfo=UTC)


class MimeError(NexarchError, ValueError):
    """The input is not a mail message at all (empty, or binary without
    header fields), or it could not be parsed within our limits. The message
    names the problem. Retrying cannot help: the job should fail for good."""


@dataclass(frozen=True, slots=True)
class Address:
    #: Decoded display name ("" if none).
    name: str
    #: As written, e.g. "Anna.Muster@Example.org" ("" if unparseable).
    address: str

    def display(self) -> str:
        """The display form: name and <address>, or whichever of them exists."""
        if self.name and self.address:
            return f"{self.name} <{self.address}>"
        return self.name or self.address


@dataclass(frozen=True, slots=True)
class ParsedMessage:
    subject: str
    from_: tuple[Address, ...]
    to: tuple[Address, ...]
    cc: tuple[Address, ...]
    #: Timezone-aware UTC, clamped into [1970-01-01, now + 1 day]; None if
    #: absent or unparseable.
    date: datetime | None
    message_id: str | None
    #: The text/plain parts joined; else the HTML parts reduced to text.
    body: str
    attachment_names: tuple[str, ...]
    #: Text of text/* attachments and attached messages (not the body).
    attachment_text: str
    #: What was repaired or capped, human-readable.
    notes: tuple[str, ...]


# --------------------------------------------------------------------------
# Public entry points


def parse_message(raw: bytes, *, max_text_chars: int = DEFAULT_MAX_TEXT_CHARS,
                  now: datetime | None = None) -> ParsedMessage:
    """Parse one RFC 5322 message.

    Pure computation: blocks on nothing, holds no reference to ``raw``
    afterwards, and the caller owns the returned value. ``now`` (aware)
    is the reference for clamping future dates; default: the current time.

    Raises ``MimeError`` (and nothing else) for input that is not a message.
    ``ValueError``/``TypeError`` mean the *arguments* are wrong (a caller bug),
    never the message.
    """
    if isinstance(raw, bytearray | memoryview):
        raw = bytes(raw)
    if not isinstance(raw, bytes):
        raise TypeError(f"raw must be bytes, got {type(raw).__name__}")
    if isinstance(max_text_chars, bool) or not isinstance(max_text_chars, int) \
            or max_text_chars < 1:
        raise ValueError(f"max_text_chars must be a positive int, got {max_text_chars!r}")
    if now is None:
        now = datetime.now(UTC)
    elif now.tzinfo is None:
        raise ValueError("now must carry a time zone")
    if not raw:
        raise MimeError("empty message (0 bytes)")
    if _NON_SPACE.search(raw) is None:
        raise MimeError(f"empty message ({len(raw)} bytes of whitespace only)")
    try:
        return _Parser(raw, max_text_chars, now).run()
    except MimeError:
        raise
    except (RecursionError, MemoryError) as exc:
        raise MimeError(f"message of {len(raw)} bytes could not be parsed within the "
                        f"limits ({type(exc).__name__})") from exc
    except Exception as exc:
        # A bug of ours, not the message's fault; but one message must never
        # take the worker down. The property tests look for this wording.
        raise MimeError(f"unexpected error parsing message of {len(raw)} bytes: "
                        f"{type(exc).__name__}: {exc}") from exc


def to_index_document(parsed: ParsedMessage, *, archive_id: int, tenant_slug: str,
                      mailboxes: tuple[str, ...] = (), size_bytes: int = 0) -> IndexDocument:
    """The index's view of a parsed message. Raises ValueError/InvalidJobError
    for a bad archive id or tenant slug (argument errors, not message ones)."""
    return IndexDocument(
        archive_id=archive_id,
        tenant_slug=tenant_slug,
        subject=parsed.subject,
        sender=", ".join(a.display() for a in parsed.from_),
        sender_addresses=tuple(a.address.lower() for a in parsed.from_ if a.address),
        recipients=", ".join(a.display() for a in parsed.to + parsed.cc),
        body=parsed.body,
        attachment_names=parsed.attachment_names,
        attachment_text=parsed.attachment_text,
        sent_at=parsed.date,
        mailboxes=mailboxes,
        size_bytes=size_bytes,
    )


# --------------------------------------------------------------------------
# Small pure helpers

_NON_SPACE = re.compile(rb"\S")
_FIELD_NAME = re.compile(rb"[!-9;-~]+[ \t]*:")
_BLANK_LINE = re.compile(rb"\n\r?\n")
#: The first line of a header section that is neither a field nor a
#: continuation line.
_ODD_LINE = re.compile(rb"\n(?![ \t]|[!-9;-~]+[ \t]*:)")
_NOT_CONTINUATION = re.compile(rb"^[^ \t]", re.M)
_DELIM_TAIL = re.compile(rb"[ \t]*(?:\r\n|\n|\r|$)")
#: A line that looks like a boundary line ("--" and a token, maybe "--").
_GUESS_BOUNDARY = re.compile(rb"^--([!-~][ -~]{0,199}?)(?:--)?[ \t]*\r?$", re.M)
_MIME_TYPE = re.compile(r"\s*([a-z0-9!#$&^_.+-]+)/([a-z0-9!#$&^_.+-]+)\s*")
# Parameters split at ';' outside quotes. No branch can fail once started
# and the alternatives start with different characters, so nothing
# backtracks: linear time on any input.
_SEGMENT = re.compile(r'(?:[^;"\\]+|"(?:[^"\\]+|\\.?)*"?|\\.?)+', re.S)
_QUOTED_PAIR = re.compile(r"\\(.)", re.S)
_RFC2231_NAME = re.compile(r"([^*]+)\*(\d{1,3})?(\*)?")
_ENCODED_WORD = re.compile(r"=\?([^?\s]*)\?([qQbB])\?([^?]*)\?=")
_NOT_B64_STR = re.compile(r"[^A-Za-z0-9+/]")
#: Deleting these leaves the bytes that have no place in base64 at all.
_B64_CLEAN = b"ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789+/= \t\r\n"
_NOT_B64_OR_PAD = bytes(c for c in range(256) if not (
    48 <= c <= 57 or 65 <= c <= 90 or 97 <= c <= 122 or c in b"+/="))
_CONTROL = bytes(c for c in range(32) if c not in b"\t\n\r\f") + b"\x7f"
_UTF8_SEQUENCE = re.compile(
    rb"[\xc2-\xdf][\x80-\xbf]|[\xe0-\xef][\x80-\xbf]{2}|[\xf0-\xf4][\x80-\xbf]{3}")
_HIGH_BYTES = bytes(range(128))  # translate(None, this) keeps bytes >= 0x80
_META_CHARSET = re.compile(rb"""<meta[^>]{0,512}?charset\s*=\s*["']?\s*([A-Za-z0-9._:-]{1,40})""",
                           re.I)
_DATE = re.compile(
    r"(?:[A-Za-z]{3}, ?)?(\d{1,2}) ([A-Za-z]{3}) (\d{4}) (\d{1,2}):(\d\d)(?::(\d\d))? "
    r"([+-])(\d\d)(\d\d)(?: \([^()]*\))?", re.ASCII)
_MONTHS = {name: number for number, name in enumerate(
    ("jan", "feb", "mar", "apr", "may", "jun", "jul", "aug", "sep", "oct", "nov", "dec"), 1)}
_MESSAGE_ID = re.compile(r"<[^<>\s]{1,998}>")
_SIMPLE_ADDRESS = re.compile(
    r'[ \t]*(?:(?:"((?:[^"\\\x00]|\\[^\x00])*)"|([^"<>()\[\],;:@\\\x00]*?))[ \t]*'
    r'<([^<>\s,;:"()\[\]\\\x00]+)>|([^\s<>()\[\],;:"\\\x00]+@[^\s<>()\[\],;:"\\\x00]+))?'
    r'[ \t]*(?:,|\Z)')
_ADDRESS_TOKEN = re.compile(
    r'"(?:[^"\\]|\\.?)*"?|\((?:[^()\\]|\\.?)*\)?|<[^<>]*>?|[^,"(<]+|,|.', re.S)


def _latin1_fallback(exc: UnicodeError) -> tuple[str, int]:
    # windows-1252 leaves five bytes undefined; read them as ISO-8859-1 does.
    if not isinstance(exc, UnicodeDecodeError):
        raise exc
    return exc.object[exc.start:exc.end].decode("latin-1"), exc.end


codecs.register_error("nexarch-latin1", _latin1_fallback)

#: Labels decoded with the superset mail clients actually mean (as WHATWG
#: does for the web). "us-ascii"/"ascii" with 8-bit bytes get the fallbacks.
_SUPERSETS = {
    "iso-8859-1": "cp1252", "iso8859-1": "cp1252", "iso_8859-1": "cp1252",
    "latin1": "cp1252", "latin-1": "cp1252", "l1": "cp1252", "cp819": "cp1252",
    "iso-8859-9": "cp1254", "latin5": "cp1254", "tis-620": "cp874",
    "gb2312": "gb18030", "gbk": "gb18030", "x-gbk": "gb18030", "euc-cn": "gb18030",
    "euc-kr": "cp949", "ks_c_5601-1987": "cp949", "ks_c_5601": "cp949",
    "shift_jis": "cp932", "shift-jis": "cp932", "sjis": "cp932", "x-sjis": "cp932",
    "big5": "big5hkscs", "utf8": "utf-8", "unicode-1-1-utf-8": "utf-8",
}
#: Labels that say "unknown" in so many words: the fallbacks apply, no note.
_NO_CHARSET = frozenset({"", "us-ascii", "ascii", "x-unknown", "unknown", "unknown-8bit",
                         "x-user-defined", "default", "none", "charset"})
#: Python codecs that are not mail charsets (escape decoders, DNS codecs, and
#: ones that always fail); "zlib", "base64" etc. are refused as non-text.
_REFUSED_CODECS = frozenset({"unicode-escape", "raw-unicode-escape", "punycode", "idna",
                             "undefined", "charmap", "mbcs", "oem"})
_SURROGATE_FREE = frozenset({
    "utf-8", "ascii", "utf-16", "utf-16-le", "utf-16-be", "utf-32", "utf-32-le", "utf-32-be",
    "gb18030", "gbk", "big5hkscs", "big5", "euc_jp", "euc_kr", "shift_jis", "iso2022_jp",
    "iso2022_kr", "johab", "hz", "tis-620"})
_SURROGATE_FREE_PREFIXES = ("iso8859-", "cp", "mac-", "koi8-", "latin")
#: Decodes as ASCII only in a charset where pure-ASCII bytes are ASCII text:
#: "+" shifts UTF-7, "~{" shifts HZ, ESC $ B shifts ISO-2022-JP.
_ASCII_PROBE = b"Az09 -=.:/\n+AGE- ~{x~} \x1b$B$\"\x1b(B"


@dataclass(frozen=True, slots=True)
class _Codec:
    name: str
    #: Pure-ASCII bytes decode to the same text (false for UTF-7/16/32).
    ascii_compatible: bool
    #: Strict decoding never yields lone surrogates (UTF-7 does): checked
    #: for the charsets mail uses; the rest are cleaned after decoding.
    surrogate_free: bool


@functools.lru_cache(maxsize=256)
def _codec(label: str) -> _Codec | None:
    name = _SUPERSETS.get(label, label)
    try:
        info = codecs.lookup(name)
    except (LookupError, ValueError, TypeError):
        return None
    if info.name in _REFUSED_CODECS:
        return None
    try:
        compatible = _ASCII_PROBE.decode(info.name) == _ASCII_PROBE.decode("ascii")
    except LookupError:
        return None  # a bytes-to-bytes codec: "zlib", "base64", "rot13", ...
    except ValueError:
        compatible = False  # UTF-16, UTF-32: the probe is not even valid
    return _Codec(info.name, compatible,
                  info.name in _SURROGATE_FREE or info.name.startswith(_SURROGATE_FREE_PREFIXES))


def _decode_strict(data: bytes, name: str, final: bool) -> str:
    errors = "nexarch-latin1" if name == "cp1252" else "strict"
    if final:
        return data.decode(name, errors)
    return codecs.getincrementaldecoder(name)(errors).decode(data, final=False)


def _is_b64(text: str) -> bool:
    """Only base64 alphabet characters (str.isalnum alone admits non-ASCII)."""
    return text.isascii() and (text.isalnum() or
                               text.replace("+", "a").replace("/", "a").isalnum() or not text)


def _repair_base64(data: bytes) -> bytes:
    """Decode what can be decoded: stray characters dropped, every run
    between padding decoded on its own (some encoders concatenate), a
    dangling last character dropped."""
    out = []
    for run in data.translate(None, _NOT_B64_OR_PAD).split(b"="):
        rest = len(run) % 4
        if rest == 1:
            run = run[:-1]
        elif rest:
            run += b"=" * (4 - rest)
        if run:
            out.append(binascii.a2b_base64(run))
    return b"".join(out)


def _is_binary(sample: bytes) -> bool:
    if b"\x00" in sample:
        return True
    controls = len(sample) - len(sample.translate(None, _CONTROL))
    return controls * 10 > len(sample)


def _quote(value: str, limit: int = 60) -> str:
    """A value for a note: short, single-line, cleaned."""
    value = " ".join(_clean(value).split())
    if len(value) > limit:
        value = value[:limit] + "…"
    return "'" + value + "'"


def _clean(text: str) -> str:
    """Remove NUL characters and lone surrogates (Postgres rejects both).
    Decoding already removed surrogates (see _Codec.surrogate_free); this
    is the second line of defence for the short fields."""
    if "\x00" in text:
        text = text.replace("\x00", "")
    if not text.isascii():
        try:
            text.encode("utf-8")
        except UnicodeEncodeError:
            text = text.encode("utf-8", "replace").decode("utf-8")
    return text


def _without_nul(text: str) -> str:
    """For the long fields, made of decoded text only: decoding removed the
    surrogates already, and checking 1 MB again is not free."""
    return text.replace("\x00", "") if "\x00" in text else text


def _unquote(value: str) -> str:
    value = value.strip()
    if value.startswith('"'):
        value = value[1:-1] if len(value) > 1 and value.endswith('"') else value[1:]
        if "\\" in value:
            value = _QUOTED_PAIR.sub(r"\1", value)
    return value


def _split_params(value: str) -> tuple[str, list[tuple[str, str]]]:
    """'type; a=b; c="d"' -> ('type', [('a', 'b'), ('c', '"d"')]) with names
    lower-cased and values still quoted. Malformed segments are skipped."""
    segments = _SEGMENT.findall(value)
    if not segments or value.lstrip().startswith(";"):
        head, rest = "", segments
    else:
        head, rest = segments[0], segments[1:]
    params = []
    for segment in rest:
        name, sep, val = segment.partition("=")
        name = name.strip().lower()
        if sep and name:
            params.append((name, val.strip()))
    return head.strip().lower(), params


@dataclass(frozen=True, slots=True)
class _Job:
    """A part still to be visited: a region of a buffer, by offsets."""

    buf: bytes
    start: int
    end: int
    #: Pre-read header fields (the top level), or None to read them here.
    fields: dict[bytes, list[bytes]] | None
    path: str
    depth: int
    ctx: _Context
    default_type: str
    #: The region is a whole message (the top level or message/rfc822).
    message_root: bool


@dataclass(slots=True)
class _Budget:
    """Characters left for one text field; notes the cap once."""

    label: str
    left: int
    cut: bool = False


@dataclass(slots=True)
class _Context:
    """One message: the top level (its text is the body) or an attached
    message (its text goes to attachment_text)."""

    top: bool
    plain: list[str] = field(default_factory=list)
    #: text/html parts (job, transfer encoding, charset, where), reduced to
    #: text only if no plain text turns up.
    html: list[tuple[_Job, str, str, str]] = field(default_factory=list)
    headers_text: str = ""
    #: Index in the attachment text pieces (attached messages only).
    slot: int = -1


def _fields(*names: str) -> tuple[re.Pattern[bytes], re.Pattern[bytes]]:
    """Finds the header fields of these names (and only those): on the first
    line of a section, and on the lines after it."""
    names_re = rb"(" + "|".join(names).encode() + rb")[ \t]*:([^\n]*(?:\n[ \t][^\n]*)*)"
    return re.compile(names_re, re.I), re.compile(rb"\n" + names_re, re.I)


_PART_FIELDS = _fields("content-type", "content-disposition", "content-transfer-encoding")
_TOP_FIELDS = _fields("subject", "from", "to", "cc", "date", "message-id", "content-type",
                      "content-disposition", "content-transfer-encoding")
_ATTACHED_FIELDS = _fields("subject", "from", "content-type", "content-disposition",
                           "content-transfer-encoding")


def _read_headers(buf: bytes, start: int, end: int,
                  wanted: tuple[re.Pattern[bytes], re.Pattern[bytes]]
                  ) -> tuple[dict[bytes, list[bytes]], int, bool, bool, list[bytes]]:
    """The header section of buf[start:end].

    Returns (the fields ``wanted`` matches: lower-case name -> unfolded
    values in order, offset where the body starts, whether the section has
    any field, whether more than MAX_HEADER_FIELDS wanted fields were
    skipped, names of fields cut at MAX_HEADER_CHARS). A blank line ends the
    section; so does a line that is neither a field nor a continuation,
    which starts the body (as in the stdlib parser).

    A few C-level searches do the work: no Python code runs per line, and
    fields nobody wants are never even copied. Past MAX_HEADER_FIELDS
    wanted fields, the rest are skipped."""
    pos = start
    if buf.startswith(b"From ", pos, end) and _FIELD_NAME.match(buf, pos, end) is None:
        nl = buf.find(b"\n", pos, end)  # an mbox separator line
        pos = end if nl < 0 else nl + 1
    if pos < end and (buf[pos] == 32 or buf[pos] == 9):
        # Continuation lines with nothing to continue: skipped, as the
        # stdlib does.
        m = _NOT_CONTINUATION.search(buf, pos, end)
        pos = end if m is None else m.start()
    if buf.startswith(b"\n", pos, end):
        return {}, pos + 1, False, False, []
    if buf.startswith(b"\r\n", pos, end):
        return {}, pos + 2, False, False, []
    blank = _BLANK_LINE.search(buf, pos, end)
    if blank is None:
        section_end = body = end
    else:
        section_end, body = blank.start() + 1, blank.end()
    # Patterns that start with "\n" let the engine skip to line breaks fast;
    # the first line has none before it in range, so it is matched apart.
    if _FIELD_NAME.match(buf, pos, section_end) is None:
        section_end = body = pos  # not a field: the body starts here
    else:
        # (Up to the last line break: the blank line is not an odd line.)
        odd = _ODD_LINE.search(buf, pos, section_end - 1 if blank is not None else end)
        if odd is not None:
            section_end = body = odd.start() + 1
    first_line, next_lines = wanted
    m = first_line.match(buf, pos, section_end)
    pairs = [m.groups()] if m is not None else []
    if section_end - pos <= 65_536:
        pairs += next_lines.findall(buf, pos, section_end)
    else:  # a huge section: stop early rather than build a huge list
        pairs += [m.groups() for m in itertools.islice(
            next_lines.finditer(buf, pos, section_end), MAX_HEADER_FIELDS + 1)]
    fields: dict[bytes, list[bytes]] = {}
    truncated: list[bytes] = []
    for name, value in pairs[:MAX_HEADER_FIELDS]:
        name = name.lower()
        if len(value) > MAX_HEADER_CHARS:
            value = value[:MAX_HEADER_CHARS]
            truncated.append(name)
        if b"\n" in value:  # unfolding removes the line breaks only
            value = value.replace(b"\r\n", b"").replace(b"\n", b"")
        if value.endswith(b"\r"):
            value = value[:-1]
        values = fields.get(name)
        if values is None:
            fields[name] = [value]
        else:
            values.append(value)
    return fields, body, section_end > pos, len(pairs) > MAX_HEADER_FIELDS, truncated


def _find_delimiter(buf: bytes, delim: bytes, pos: int, start: int, end: int
                    ) -> tuple[int, int, bool] | None:
    """Next boundary line at or after pos: (line start, offset after the
    line, is it the closing one). Lenient like the stdlib: whitespace may
    follow the boundary; anything else means it is not a boundary line."""
    if pos == start and buf.startswith(delim, start, end):
        found = _delimiter_line(buf, start, len(delim), end)
        if found is not None:
            return found
    line_delim = b"\n" + delim
    find = buf.find
    for _ in range(64):
        i = find(line_delim, pos, end)
        if i < 0:
            return None
        found = _delimiter_line(buf, i + 1, len(delim), end)
        if found is not None:
            return found
        pos = i + 1
    # Many lines start like a boundary but are none ("--ab" for "a"): let the
    # regular expression engine skip them in C rather than loop here.
    m = _delimiter_pattern(delim).search(buf, pos, end)
    return None if m is None else (m.start() + 1, m.end(), m.group(1) is not None)


def _delimiter_line(buf: bytes, i: int, n: int, end: int) -> tuple[int, int, bool] | None:
    """(i, offset after the line, closing?) if buf[i:] is a boundary line
    whose boundary ("--" included) is n bytes long."""
    j = i + n
    if buf.startswith(b"--", j, end):
        m = _DELIM_TAIL.match(buf, j + 2, end)
        if m is not None:
            return i, m.end(), True
    m = _DELIM_TAIL.match(buf, j, end)
    return None if m is None else (i, m.end(), False)


@functools.lru_cache(maxsize=32)
def _delimiter_pattern(delim: bytes) -> re.Pattern[bytes]:
    return re.compile(rb"\n" + re.escape(delim) + rb"(--)?[ \t]*(?:\r\n|\n|\r|\Z)")


# --------------------------------------------------------------------------
# HTML
#
# Not html.parser: on Python 3.11 it is quadratic on unclosed tags ("<a " x
# 10,000 -- 30 KB -- takes 25 s; fixed upstream only in 2025). These three
# regular expressions are linear on any input: every branch, once its first
# characters match, cannot fail (unterminated constructs run to the end),
# and alternatives start with different characters, so nothing backtracks.

#: Elements whose content is not text: dropped with their content. <head>
#: holds no visible text but its <title>, so dropping these drops the head.
_HTML_HIDDEN = re.compile(
    r"<!--.*?(?:-->|\Z)|<(script|style|title|template)\b.*?(?:</\1\s*>|\Z)",
    re.S | re.I)
_HTML_TAG = re.compile(
    r"""<(/?)([a-zA-Z][a-zA-Z0-9:-]*)(?:[^>"']+|"[^"]*"?|'[^']*'?)*>?|<[!?][^>]*>?""")
_HTML_BREAK = frozenset({
    "br", "p", "div", "li", "tr", "h1", "h2", "h3", "h4", "h5", "h6", "table", "blockquote",
    "hr", "pre", "ul", "ol", "dl", "dd", "dt", "section", "article", "header", "footer",
    "address", "center", "form", "fieldset", "figure", "figcaption", "main", "nav", "aside",
    "body", "html", "head", "caption", "tbody", "thead", "tfoot"})
_HTML_SPACE = frozenset({"td", "th", "img", "input", "button", "select", "option", "label"})


#: What a tag becomes: a line break, a space, or (inline tags) nothing.
_HTML_TAG_TEXT = {name: "\x1e" for name in _HTML_BREAK} | {name: " " for name in _HTML_SPACE}


def _html_tag(m: re.Match[str]) -> str:
    name = m.group(2)  # None for <!DOCTYPE>, <![if ...]>, <?xml ...?>
    return "" if name is None else _HTML_TAG_TEXT.get(name.lower(), "")


def html_to_text(html: str, max_chars: int = DEFAULT_MAX_TEXT_CHARS) -> tuple[str, bool]:
    """Visible text of an HTML document: script, style, title (the head)
    and comments dropped, link text kept, entities decoded, whitespace
    collapsed, one line per block element. Linear time on any input.
    Returns (text, cut): cut is True if the text was capped at max_chars."""
    text = _HTML_HIDDEN.sub(" ", html) if "<" in html else html
    text = _HTML_TAG.sub(_html_tag, text)
    if "&" in text:
        text = unescape(text)
    text = "\n".join(filter(None, [" ".join(chunk.split()) for chunk in text.split("\x1e")]))
    if len(text) > max_chars:
        return text[:max_chars], True
    return text, False


# --------------------------------------------------------------------------
# The parser


class _Parser:
    def __init__(self, raw: bytes, max_chars: int, now: datetime) -> None:
        self.raw = raw
        self.max_chars = max_chars
        self.now = now.astimezone(UTC)
        self.notes: list[str] = []
        self.notes_dropped = 0
        self.body = _Budget("body", max_chars)
        self.attachment = _Budget("attachment text", max_chars)
        self.attachment_pieces: list[str] = []
        self.names: list[str] = []
        self.names_dropped = 0
        self.leaves = 0
        self.containers = 0
        self.stopped = False
        self.depth_noted = False
        #: Bytes we may materialise decoding encoded message/rfc822 parts.
        self.decode_budget = len(raw) + (1 << 20)

    def note(self, text: str) -> None:
        if len(self.notes) < MAX_NOTES - 1:
            text = _clean(text)
            if text not in self.notes:
                self.notes.append(text)
        else:
            self.notes_dropped += 1

    # ---- top level

    def run(self) -> ParsedMessage:
        raw = self.raw
        if raw.find(b"\n", 0, 8192) < 0 and raw.find(b"\r", 0, 8192) >= 0:
            raw = self.raw = raw.replace(b"\r", b"\n")
            self.note("message has CR line endings; read as LF")
        fields, body_start, has_fields, too_many, truncated = _read_headers(
            raw, 0, len(raw), _TOP_FIELDS)
        if not has_fields:
            if _is_binary(raw[body_start:body_start + 4096]):
                raise MimeError(f"not a mail message: {len(raw)} bytes of binary data "
                                f"without header fields")
            self.note("message has no header fields; read as plain text")
        self.note_header_caps(too_many, truncated)
        subject = self.subject(fields)
        from_ = self.addresses(fields, b"from")
        to = self.addresses(fields, b"to")
        cc = self.addresses(fields, b"cc")
        date = self.date(fields)
        message_id = self.message_id(fields)

        top = _Context(top=True)
        contexts = [top]
        stack = [_Job(raw, body_start, len(raw), fields, "", 0, top, "text/plain", True)]
        while stack and not self.stopped:
            self.visit(stack.pop(), stack, contexts)

        body = self.context_text(top, self.body)
        for ctx in contexts[1:]:
            self.attachment_pieces[ctx.slot] = self.context_text(ctx, self.attachment)
        attachment_text = "\n".join(p for p in self.attachment_pieces if p)
        if self.names_dropped:
            self.note(f"only the first {MAX_ATTACHMENT_NAMES} attachment names kept "
                      f"({MAX_ATTACHMENT_NAMES + self.names_dropped} in total)")
        notes = self.notes
        if self.notes_dropped:
            notes = [*notes, f"{self.notes_dropped} more notes omitted"]
        return ParsedMessage(
            subject=subject, from_=from_, to=to, cc=cc, date=date, message_id=message_id,
            body=_without_nul(body[:self.max_chars]), attachment_names=tuple(self.names),
            attachment_text=_without_nul(attachment_text[:self.max_chars]),
            notes=tuple(notes))

    def note_header_caps(self, too_many: bool, truncated: list[bytes], where: str = "") -> None:
        if too_many:
            self.note(f"more than {MAX_HEADER_FIELDS} header fields{where}; "
                      f"the rest were skipped")
        for name in truncated:
            self.note(f"header {name.decode('ascii', 'replace').title()}{where} is longer than "
                      f"{MAX_HEADER_CHARS} bytes; the rest was dropped")

    # ---- headers

    def header_text(self, value: bytes, name: str) -> str:
        """Header bytes as text: ASCII, else UTF-8 (RFC 6532), else windows-1252."""
        try:
            text = value.decode("ascii")
        except UnicodeDecodeError:
            try:
                text = value.decode("utf-8")
            except UnicodeDecodeError:
                text = value.decode("cp1252", "nexarch-latin1")
                self.note(f"header {name} has 8-bit bytes that are not UTF-8; "
                          f"decoded as windows-1252")
        if "\x00" in text:
            self.note(f"removed NUL characters from header {name}")
            text = text.replace("\x00", "")
        return text

    def first(self, fields: dict[bytes, list[bytes]], name: bytes, label: str) -> str | None:
        values = fields.get(name)
        if not values:
            return None
        return self.header_text(values[0], label)

    def subject(self, fields: dict[bytes, list[bytes]]) -> str:
        value = self.first(fields, b"subject", "Subject")
        if value is None:
            return ""
        return _clean(" ".join(self.decode_words(value, "header Subject").split()))

    def decode_words(self, value: str, where: str) -> str:
        """RFC 2047: decode encoded-words, drop whitespace between adjacent
        ones, and join adjacent words of one charset before decoding (mailers
        split multi-byte characters across words)."""
        if "=?" not in value:
            return value
        out: list[str] = []
        pending = bytearray()
        pending_charset: str | None = None
        last = 0
        for m in _ENCODED_WORD.finditer(value):
            between = value[last:m.start()]
            if between and (pending_charset is None or not between.isspace()):
                if pending_charset is not None:
                    out.append(self.decode_text(bytes(pending), pending_charset, where))
                    pending_charset = None
                out.append(between)
            last = m.end()
            charset = m.group(1).partition("*")[0].lower()
            text = m.group(3)
            if m.group(2) in "bB":
                stripped = text.rstrip("=")
                cleaned = stripped if _is_b64(stripped) else _NOT_B64_STR.sub("", stripped)
                rest = len(cleaned) % 4
                if rest == 1 or cleaned != stripped:
                    self.note(f"broken encoded-word {_quote(m.group(0))} in {where}; "
                              f"decoded what was readable")
                if rest == 1:
                    cleaned = cleaned[:-1]
                elif rest:
                    cleaned += "=" * (4 - rest)
                data = binascii.a2b_base64(cleaned)
            else:
                data = binascii.a2b_qp(text.encode("utf-8", "replace"), header=True)
            if pending_charset is not None and charset != pending_charset:
                out.append(self.decode_text(bytes(pending), pending_charset, where))
                pending_charset = None
            if pending_charset is None:
                pending = bytearray(data)
                pending_charset = charset
            else:
                pending += data
        if pending_charset is not None:
            out.append(self.decode_text(bytes(pending), pending_charset, where))
        out.append(value[last:])
        return "".join(out)

    def addresses(self, fields: dict[bytes, list[bytes]], field_name: bytes
                  ) -> tuple[Address, ...]:
        values = fields.get(field_name)
        if not values:
            return ()
        label = field_name.decode().title()
        result: list[Address] = []
        for value in values:
            text = self.header_text(value, label)
            simple = _simple_addresses(text)
            if simple is None:
                for tokens in _split_address_list(text):
                    parsed = self.address(tokens, label)
                    if parsed is not None:
                        result.append(parsed)
                continue
            for name, address in simple:
                if "=?" in name:
                    name = _clean(" ".join(self.decode_words(name, f"header {label}").split()))
                result.append(Address(name=name[:MAX_NAME_CHARS],
                                      address=address[:MAX_NAME_CHARS]))
        return tuple(result)

    def address(self, tokens: list[str], label: str) -> Address | None:
        """One address from its tokens (quoted strings, comments, <angle>,
        plain text). Group syntax ("team: a@b, c@d;") is flattened."""
        name_parts: list[str] = []
        comments: list[str] = []
        angle: str | None = None
        spec_parts: list[str] = []
        for token in tokens:
            c = token[0]
            if c == '"':
                name_parts.append(_unquote(token))
                spec_parts.append(token)
            elif c == "(":
                comments.append((token[1:-1] if token.endswith(")") else token[1:]).strip())
            elif c == "<":
                angle = token[1:-1] if token.endswith(">") else token[1:]
            else:
                text = token
                if ":" in text and angle is None and "@" not in text.partition(":")[0]:
                    # "group name:" starts a group; what precedes is its name.
                    text = text.rpartition(":")[2]
                    name_parts.clear()
                    spec_parts.clear()
                text = text.replace(";", " ")
                if angle is None:
                    name_parts.append(text)
                    spec_parts.append(text)
        comment = " ".join(c for c in comments if c)
        if angle is not None:
            address = "".join(angle.split())
            if ":" in address:  # obsolete source route "@a,@b:user@host"
                address = address.rpartition(":")[2]
            name = " ".join(" ".join(name_parts).split()) or comment
        else:
            spec = "".join("".join(spec_parts).split())
            if "@" in spec:
                address, name = spec, comment
            else:
                address = ""
                name = " ".join(" ".join(name_parts).split()) or comment
        if name:
            name = _clean(" ".join(self.decode_words(name, f"header {label}").split()))
        address = _clean(address)
        if not name and not address:
            return None
        return Address(name=name[:MAX_NAME_CHARS], address=address[:MAX_NAME_CHARS])

    def date(self, fields: dict[bytes, list[bytes]]) -> datetime | None:
        value = self.first(fields, b"date", "Date")
        if value is None:
            return None
        value = " ".join(value.split())
        if not value:
            return None
        low = int((_EARLIEST - _EPOCH).total_seconds())
        high = int(self.now.timestamp()) + 86_400
        parts: tuple[int, int, int, int, int, int, int, int, int, int | None] | None
        m = _DATE.fullmatch(value)
        month_number = _MONTHS.get(m.group(2).lower()) if m is not None else None
        if m is not None and month_number is not None:
            # The usual form, without the stdlib's slower parser.
            day, _month, year, hour, minute, second, sign, zh, zm = m.groups()
            offset = (int(zh) * 3600 + int(zm) * 60) * (-1 if sign == "-" else 1)
            parts = (int(year), month_number, int(day), int(hour), int(minute),
                     int(second or 0), 0, 1, -1, offset)
        else:
            try:
                parts = parsedate_tz(value)
            except Exception:  # the stdlib date parser has raised on odd input before
                parts = None
        seconds: int | None = None
        if parts is not None:
            year, month, day, hour, minute, second = parts[:6]
            if (1 <= month <= 12 and 1 <= day <= 31 and 0 <= hour <= 24 and 0 <= minute <= 59
                    and 0 <= second <= 60 and abs(parts[9] or 0) <= 99 * 3600):
                if year < _EARLIEST.year:
                    seconds = low - 1
                elif year > 9999:
                    seconds = high + 1
                else:
                    seconds = calendar.timegm(
                        (year, month, day, hour, minute, second, 0, 0, 0)) - (parts[9] or 0)
        else:
            try:
                iso: datetime | None = datetime.fromisoformat(value)
            except ValueError:
                iso = None
            if iso is not None:
                if iso.tzinfo is None:
                    iso = iso.replace(tzinfo=UTC)
                seconds = int((iso - _EPOCH).total_seconds())
        if seconds is None:
            self.note(f"Date {_quote(value)} could not be parsed")
            return None
        if seconds < low:
            self.note(f"Date {_quote(value)} clamped to {_EARLIEST.date().isoformat()}")
            return _EARLIEST
        if seconds > high:
            clamped = _EPOCH + timedelta(seconds=high)
            self.note(f"Date {_quote(value)} clamped to {clamped.isoformat()} (now + 1 day)")
            return clamped
        return _EPOCH + timedelta(seconds=seconds)

    def message_id(self, fields: dict[bytes, list[bytes]]) -> str | None:
        value = self.first(fields, b"message-id", "Message-ID")
        if value is None:
            return None
        m = _MESSAGE_ID.search(value)
        text = m.group(0) if m else (value.split() or [""])[0]
        return _clean(text)[:MAX_MESSAGE_ID_LENGTH] or None

    # ---- parameters

    def params(self, value: str, where: str) -> tuple[str, dict[str, str]]:
        """Content-Type / Content-Disposition: (lower-case value, parameters
        with RFC 2231 sections and charsets decoded)."""
        head, raw_params = _split_params(value)
        plain: dict[str, str] = {}
        sections: dict[str, list[tuple[int, bool, str]]] = {}
        for name, val in raw_params:
            m = _RFC2231_NAME.fullmatch(name)
            if m is None:
                plain.setdefault(name, _unquote(val))
            else:
                extended = m.group(2) is None or m.group(3) is not None
                number = int(m.group(2)) if m.group(2) is not None else 0
                sections.setdefault(m.group(1), []).append((number, extended, val))
        for name, items in sections.items():
            items.sort(key=lambda item: item[0])
            charset = ""
            data = bytearray()
            for index, (_number, extended, val) in enumerate(items):
                if extended:
                    val = _unquote(val)
                    if index == 0 and val.count("'") >= 2:
                        charset, _language, val = val.split("'", 2)
                    data += urllib.parse.unquote_to_bytes(val)
                else:
                    data += _unquote(val).encode("utf-8")
            # RFC 2231 wins over a plain parameter of the same name (clients
            # send both: an ASCII fallback and the real name).
            plain[name] = self.decode_text(bytes(data), charset, f"parameter {name} of {where}")
        return head, plain

    # ---- text decoding

    def decode_text(self, data: bytes, charset: str, where: str, final: bool = True) -> str:
        """Bytes in a declared charset as text. Unknown or wrong charsets fall
        back to UTF-8, else windows-1252; a note says which. ``final=False``:
        the data was cut, an incomplete last character is dropped."""
        label = charset.strip().strip("\"'").lower()
        codec = None
        unknown = False
        if label not in _NO_CHARSET:
            codec = _codec(label) if len(label) <= 64 else None
            unknown = codec is None
        if (codec is None or codec.ascii_compatible) and data.isascii():
            return data.decode("ascii")
        text = None
        if codec is not None:
            try:
                text = _decode_strict(data, codec.name, final)
            except (ValueError, LookupError, TypeError):
                pass
            else:
                if not codec.surrogate_free:
                    text = _clean(text)
        if text is None:
            text, used = self.fallback_decode(data, final)
            if unknown:
                self.note(f"unknown charset {_quote(label)} in {where}, decoded as {used}")
            elif codec is not None:
                self.note(f"{where} is not valid {label}; decoded as {used}")
            elif used != "UTF-8":
                self.note(f"{where} has 8-bit text but no charset; decoded as {used}")
        return text

    @staticmethod
    def fallback_decode(data: bytes, final: bool) -> tuple[str, str]:
        """UTF-8 if valid, else UTF-8 with replacement if it is mostly UTF-8
        (damaged), else windows-1252 (mislabelled Latin text, which has next
        to no valid UTF-8 sequences). Returns (text, what was used)."""
        try:
            return _decode_strict(data, "utf-8", final), "UTF-8"
        except ValueError:
            pass
        valid = sum(len(s) for s in _UTF8_SEQUENCE.findall(data))
        high = len(data.translate(None, _HIGH_BYTES))
        if valid * 2 >= high:
            return data.decode("utf-8", "replace"), "UTF-8 with replacement"
        return data.decode("cp1252", "nexarch-latin1"), "windows-1252"

    def transfer_decode(self, job: _Job, start: int, cte: str, limit: int, where: str
                        ) -> tuple[bytes, bool]:
        """The part's content, transfer-decoded, about ``limit`` bytes at most:
        the encoded form is sliced *before* decoding. Returns (data, cut)."""
        buf, end = job.buf, job.end
        if cte == "base64":
            # 4 characters per 3 bytes, plus a line break per 76 characters.
            span = limit * 4 // 3 + limit // 19 + 64
            cut = end - start > span
            chunk = buf[start:start + span] if cut else buf[start:end]
            if not cut:
                # Stray characters (which the decoder skips) or padding in
                # the middle (where it stops) mean the data is damaged.
                pad = chunk.find(b"=")
                if not chunk.translate(None, _B64_CLEAN) and (
                        pad < 0 or pad >= len(chunk.rstrip(b"= \t\r\n"))):
                    try:
                        return binascii.a2b_base64(chunk), False
                    except binascii.Error:
                        pass  # a missing "=": repaired silently, no harm done
                else:
                    self.note(f"invalid base64 in {where}; decoded what was readable")
            return _repair_base64(chunk), cut
        if cte == "quoted-printable":
            span = 3 * limit + 3
            cut = end - start > span
            chunk = buf[start:start + span] if cut else buf[start:end]
            data = binascii.a2b_qp(chunk)
            # The decoder keeps invalid escapes as they are: any "=" beyond
            # the encoded ones (=3D) means there was one. Counting is cheap.
            if not cut and b"=" in data and \
                    data.count(b"=") > chunk.count(b"=3D") + chunk.count(b"=3d"):
                self.note(f"invalid quoted-printable in {where}; kept undecodable "
                          f"sequences as they are")
            return data, cut
        if cte not in ("", "7bit", "8bit", "binary"):
            self.note(f"unknown Content-Transfer-Encoding {_quote(cte)} in {where}; "
                      f"read as is")
        cut = end - start > limit
        return (buf[start:start + limit] if cut else buf[start:end]), cut

    def take_text(self, budget: _Budget, job: _Job, start: int, cte: str, charset: str,
                  html: bool, where: str) -> str:
        """Text of one leaf part, charged to ``budget``; notes when capped."""
        if budget.left <= 0:
            if not budget.cut:
                budget.cut = True
                self.note(f"{budget.label} truncated to {self.max_chars} characters; "
                          f"{where} and later parts skipped")
            return ""
        factor = HTML_INPUT_FACTOR if html else _BYTES_PER_CHAR
        data, cut = self.transfer_decode(job, start, cte, factor * budget.left + 16, where)
        if html and not charset:
            m = _META_CHARSET.search(data, 0, 4096)
            if m is not None:
                charset = m.group(1).decode("ascii")
        # Line breaks stay as they are (CRLF mostly): normalising them would
        # cost more than the rest of the decoding, and no index cares.
        text = self.decode_text(data, charset, where, final=not cut)
        if html:
            text, html_cut = html_to_text(text, budget.left)
            cut = cut or html_cut
        if "\x00" in text:
            self.note(f"removed {text.count(chr(0))} NUL characters from {where}")
            text = text.replace("\x00", "")
        if len(text) > budget.left:
            text = text[:budget.left]
            cut = True
        if cut:
            budget.cut = True
            self.note(f"{budget.label} truncated to {self.max_chars} characters ({where} "
                      f"is {job.end - start} bytes{' of HTML' if html else ''})")
        budget.left -= len(text) + 1
        return text  # decode_text removed any surrogates, the NULs are gone

    def context_text(self, ctx: _Context, budget: _Budget) -> str:
        """A message's text: its plain parts, else its HTML parts as text."""
        texts = [ctx.headers_text] if ctx.headers_text else []
        if any(not t.isspace() for t in ctx.plain):  # (texts are never empty)
            texts += ctx.plain
        elif ctx.html:
            for job, cte, charset, where in ctx.html:
                text = self.take_text(budget, job, job.start, cte, charset, True, where)
                if text:
                    texts.append(text)
        return "\n".join(texts)

    # ---- the MIME tree

    def visit(self, job: _Job, stack: list[_Job], contexts: list[_Context]) -> None:
        fields = job.fields
        start = job.start
        path = job.path
        if job.message_root:
            where = f"part {path}.1" if path else "part 1"
            container = f"the message in part {path}" if path else "the message"
        else:
            where = container = f"part {path}"
        if fields is None:
            wanted = _ATTACHED_FIELDS if job.message_root else _PART_FIELDS
            fields, start, _has_fields, too_many, truncated = _read_headers(
                job.buf, job.start, job.end, wanted)
            self.note_header_caps(too_many, truncated, f" in {container}")
            if job.message_root:
                self.attached_headers(fields, job.ctx)
        ctype = job.default_type
        params: dict[str, str] = {}
        raw_ctype = self.first(fields, b"content-type", "Content-Type")
        if raw_ctype is not None:
            head, params = self.params(raw_ctype, where)
            m = _MIME_TYPE.match(head)
            if m is not None:
                ctype = f"{m.group(1)}/{m.group(2)}"
            else:
                ctype = "text/plain"
                self.note(f"invalid Content-Type {_quote(raw_ctype)} in {where}; "
                          f"read as text/plain")
        disposition = ""
        dparams: dict[str, str] = {}
        raw_disposition = self.first(fields, b"content-disposition", "Content-Disposition")
        if raw_disposition is not None:
            disposition, dparams = self.params(raw_disposition, where)
        cte = (self.first(fields, b"content-transfer-encoding",
                          "Content-Transfer-Encoding") or "").strip().lower()
        filename = dparams.get("filename") or params.get("name") or ""
        if filename:
            filename = _clean(" ".join(self.decode_words(filename, where).split()))
        maintype, _, subtype = ctype.partition("/")

        if maintype == "multipart":
            if self.split_multipart(job, start, params.get("boundary", ""), ctype,
                                    container, stack):
                return
            maintype, subtype = "text", "plain"
        elif ctype in ("message/rfc822", "message/global"):
            if filename:
                self.add_name(filename)
            self.attached_message(job, start, cte, where, stack, contexts)
            return

        self.leaves += 1
        if self.leaves > MAX_PARTS:
            self.note(f"message has more than {MAX_PARTS} parts; the rest were skipped")
            self.stopped = True
            return
        if filename:
            self.add_name(filename)
        if maintype != "text":
            return  # binary content is never decoded
        charset = params.get("charset", "")
        attachment = disposition == "attachment" or bool(filename)
        ctx = job.ctx
        if not attachment and subtype == "html":
            ctx.html.append((_Job(job.buf, start, job.end, None, path, job.depth, ctx,
                                  ctype, False), cte, charset, where))
        elif not attachment and subtype == "plain":
            text = self.take_text(self.body if ctx.top else self.attachment, job, start, cte,
                                  charset, False, where)
            if text:
                ctx.plain.append(text)
        else:
            text = self.take_text(self.attachment, job, start, cte, charset,
                                  subtype == "html", where)
            if text:
                self.attachment_pieces.append(text)

    def too_deep(self, job: _Job) -> bool:
        if job.depth < MAX_DEPTH:
            return False
        if not self.depth_noted:
            self.depth_noted = True
            self.note(f"MIME structure nested deeper than {MAX_DEPTH} levels; "
                      f"the inner parts were skipped")
        return True

    def split_multipart(self, job: _Job, start: int, boundary: str, ctype: str, where: str,
                        stack: list[_Job]) -> bool:
        """Push the parts of a multipart; False if it has to be read as text."""
        if self.too_deep(job):
            return True
        buf, end = job.buf, job.end
        found = None
        if boundary:
            delim = b"--" + boundary.encode("utf-8", "replace")
            found = _find_delimiter(buf, delim, start, start, end)
        if found is None:
            # Missing or wrong: mailers that get it wrong still write the
            # boundary lines they meant, so use the first one in the body.
            problem = (f"boundary {_quote(boundary)} of {where} never occurs" if boundary
                       else f"{ctype} without boundary in {where}")
            m = _GUESS_BOUNDARY.search(buf, start, min(end, start + 65_536))
            guess = m.group(1) if m is not None else b""
            if guess:
                delim = b"--" + guess
                found = _find_delimiter(buf, delim, start, start, end)
            if found is None:
                self.note(f"{problem}; read as plain text")
                return False
            self.note(f"{problem}; used {_quote(guess.decode('latin-1'))} found in the body")
        self.containers += 1
        if self.containers > MAX_PARTS:
            self.note(f"message has more than {MAX_PARTS} multipart containers; "
                      f"the rest were skipped")
            self.stopped = True
            return True
        regions: list[tuple[int, int]] = []
        _line, pos, closed = found
        room = MAX_PARTS - self.leaves + 1
        while not closed and len(regions) <= room:
            found = _find_delimiter(buf, delim, pos, start, end)
            if found is None:
                regions.append((pos, end))
                self.note(f"{ctype} in {where} has no closing boundary; read to the end")
                break
            line, after, closed = found
            stop = line  # the line break before a boundary belongs to it
            if stop > pos and buf[stop - 1] == 10:
                stop -= 1
            if stop > pos and buf[stop - 1] == 13:
                stop -= 1
            regions.append((pos, stop))
            pos = after
        default = "message/rfc822" if ctype == "multipart/digest" else "text/plain"
        prefix = job.path + "." if job.path else ""
        for number in range(len(regions), 0, -1):
            s, e = regions[number - 1]
            stack.append(_Job(buf, s, e, None, f"{prefix}{number}", job.depth + 1, job.ctx,
                              default, False))
        return True

    def attached_message(self, job: _Job, start: int, cte: str, where: str,
                         stack: list[_Job], contexts: list[_Context]) -> None:
        if self.too_deep(job):
            return
        buf, end = job.buf, job.end
        if cte in ("base64", "quoted-printable"):
            if end - start > self.decode_budget:
                self.note(f"attached message in {where} skipped: decoding it would "
                          f"exceed the memory limit")
                return
            data, _cut = self.transfer_decode(job, start, cte, end - start, where)
            self.decode_budget -= len(data)
            buf, start, end = data, 0, len(data)
        ctx = _Context(top=False, slot=len(self.attachment_pieces))
        self.attachment_pieces.append("")
        contexts.append(ctx)
        stack.append(_Job(buf, start, end, None, job.path or "1", job.depth + 1, ctx,
                          "text/plain", True))

    def attached_headers(self, fields: dict[bytes, list[bytes]], ctx: _Context) -> None:
        """An attached message's Subject and From, searchable with its text."""
        lines = []
        subject = self.subject(fields)
        if subject:
            lines.append(f"Subject: {subject}")
        sender = ", ".join(a.display() for a in self.addresses(fields, b"from"))
        if sender:
            lines.append(f"From: {sender}")
        ctx.headers_text = "\n".join(lines)

    def add_name(self, name: str) -> None:
        if len(self.names) >= MAX_ATTACHMENT_NAMES:
            self.names_dropped += 1
        elif name:
            self.names.append(name[:MAX_NAME_CHARS])


def _simple_addresses(value: str) -> list[tuple[str, str]] | None:
    """The common forms only ('Name <a@b>', '"Last, First" <a@b>', 'a@b'),
    as (name, address) pairs; None if anything else is in the list."""
    result = []
    pos = 0
    end = len(value)
    match = _SIMPLE_ADDRESS.match
    while pos < end:
        m = match(value, pos)
        if m is None:
            return None
        pos = m.end()
        quoted, plain, angle, bare = m.groups()
        if bare is not None:
            result.append(("", bare))
        elif angle is not None:
            if quoted is not None:
                name = _QUOTED_PAIR.sub(r"\1", quoted) if "\\" in quoted else quoted
            else:
                name = plain or ""
            result.append((" ".join(name.split()), angle))
        elif not m.group(0).strip(", \t"):
            continue  # an empty item (", ,")
        else:
            return None
    return result


def _split_address_list(value: str) -> list[list[str]]:
    """Tokens of each comma-separated item of an address list (commas inside
    quotes, comments and angle brackets do not separate)."""
    items: list[list[str]] = []
    current: list[str] = []
    for token in _ADDRESS_TOKEN.findall(value):
        if token == ",":
            if current:
                items.append(current)
            current = []
        elif not token.isspace():
            current.append(token)
    if current:
        items.append(current)
    return items
