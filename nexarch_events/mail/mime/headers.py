"""Header decoding: a header section found in the raw bytes, its fields
read as text, RFC 2047 encoded words, RFC 2231 parameters (Content-Type,
Content-Disposition), Subject and Message-ID. Addresses and dates have
their own modules (addresses.py, dates.py).

Functions, not state: each takes the ``Notes`` of the parse it belongs to
and adds a note for what it repaired."""

from __future__ import annotations

import binascii
import itertools
import re
import urllib.parse
from typing import TypeAlias

from ...models import MAX_MESSAGE_ID_LENGTH
from .charsets import LATIN1_FALLBACK, decode_text
from .limits import MAX_HEADER_CHARS, MAX_HEADER_FIELDS
from .notes import Notes, clean, quote

__all__ = [
    "ATTACHED_FIELDS",
    "PART_FIELDS",
    "QUOTED_PAIR",
    "TOP_FIELDS",
    "FieldSet",
    "Fields",
    "PartHeader",
    "content_params",
    "decode_words",
    "first_field",
    "header_text",
    "message_id",
    "note_header_caps",
    "part_header",
    "read_headers",
    "split_params",
    "subject",
    "unquote",
]

#: Lower-case field name -> the unfolded values, in order.
Fields: TypeAlias = dict[bytes, list[bytes]]
#: The patterns that find some fields: on the first line, on the next lines.
FieldSet: TypeAlias = tuple[re.Pattern[bytes], re.Pattern[bytes]]

_FIELD_NAME = re.compile(rb"[!-9;-~]+[ \t]*:")
_BLANK_LINE = re.compile(rb"\n\r?\n")
#: The first line of a header section that is neither a field nor a
#: continuation line.
_ODD_LINE = re.compile(rb"\n(?![ \t]|[!-9;-~]+[ \t]*:)")
_NOT_CONTINUATION = re.compile(rb"^[^ \t]", re.M)
# Parameters split at ';' outside quotes. No branch can fail once started
# and the alternatives start with different characters, so nothing
# backtracks: linear time on any input.
_SEGMENT = re.compile(r'(?:[^;"\\]+|"(?:[^"\\]+|\\.?)*"?|\\.?)+', re.S)
QUOTED_PAIR = re.compile(r"\\(.)", re.S)
_RFC2231_NAME = re.compile(r"([^*]+)\*(\d{1,3})?(\*)?")
_ENCODED_WORD = re.compile(r"=\?([^?\s]*)\?([qQbB])\?([^?]*)\?=")
_NOT_B64_STR = re.compile(r"[^A-Za-z0-9+/]")
_MESSAGE_ID = re.compile(r"<[^<>\s]{1,998}>")


# --------------------------------------------------------------------------
# Header sections


def _fields(*names: str) -> FieldSet:
    """Finds the header fields of these names (and only those): on the first
    line of a section, and on the lines after it."""
    names_re = rb"(" + "|".join(names).encode() + rb")[ \t]*:([^\n]*(?:\n[ \t][^\n]*)*)"
    return re.compile(names_re, re.I), re.compile(rb"\n" + names_re, re.I)


#: The fields read from a part, the top-level message, an attached message.
PART_FIELDS = _fields("content-type", "content-disposition", "content-transfer-encoding")
TOP_FIELDS = _fields("subject", "from", "to", "cc", "date", "message-id", "content-type",
                     "content-disposition", "content-transfer-encoding")
ATTACHED_FIELDS = _fields("subject", "from", "content-type", "content-disposition",
                          "content-transfer-encoding")


def read_headers(buf: bytes, start: int, end: int, wanted: FieldSet
                 ) -> tuple[Fields, int, bool, bool, list[bytes]]:
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
    fields: Fields = {}
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


def note_header_caps(notes: Notes, too_many: bool, truncated: list[bytes],
                     where: str = "") -> None:
    """The notes for what ``read_headers`` reported as capped."""
    if too_many:
        notes.add(f"more than {MAX_HEADER_FIELDS} header fields{where}; the rest were skipped")
    for name in truncated:
        notes.add(f"header {name.decode('ascii', 'replace').title()}{where} is longer than "
                  f"{MAX_HEADER_CHARS} bytes; the rest was dropped")


# --------------------------------------------------------------------------
# Field values


def header_text(value: bytes, name: str, notes: Notes) -> str:
    """Header bytes as text: ASCII, else UTF-8 (RFC 6532), else windows-1252."""
    try:
        text = value.decode("ascii")
    except UnicodeDecodeError:
        try:
            text = value.decode("utf-8")
        except UnicodeDecodeError:
            text = value.decode("cp1252", LATIN1_FALLBACK)
            notes.add(f"header {name} has 8-bit bytes that are not UTF-8; "
                      f"decoded as windows-1252")
    if "\x00" in text:
        notes.add(f"removed NUL characters from header {name}")
        text = text.replace("\x00", "")
    return text


def first_field(fields: Fields, name: bytes, label: str, notes: Notes) -> str | None:
    """The first value of field ``name`` (lower case) as text; ``label`` is
    its name in notes."""
    values = fields.get(name)
    if not values:
        return None
    return header_text(values[0], label, notes)


def _is_b64(text: str) -> bool:
    """Only base64 alphabet characters (str.isalnum alone admits non-ASCII)."""
    return text.isascii() and (text.isalnum() or
                               text.replace("+", "a").replace("/", "a").isalnum() or not text)


def decode_words(value: str, where: str, notes: Notes) -> str:
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
                out.append(decode_text(bytes(pending), pending_charset, where, notes))
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
                notes.add(f"broken encoded-word {quote(m.group(0))} in {where}; "
                          f"decoded what was readable")
            if rest == 1:
                cleaned = cleaned[:-1]
            elif rest:
                cleaned += "=" * (4 - rest)
            data = binascii.a2b_base64(cleaned)
        else:
            data = binascii.a2b_qp(text.encode("utf-8", "replace"), header=True)
        if pending_charset is not None and charset != pending_charset:
            out.append(decode_text(bytes(pending), pending_charset, where, notes))
            pending_charset = None
        if pending_charset is None:
            pending = bytearray(data)
            pending_charset = charset
        else:
            pending += data
    if pending_charset is not None:
        out.append(decode_text(bytes(pending), pending_charset, where, notes))
    out.append(value[last:])
    return "".join(out)


def subject(fields: Fields, notes: Notes) -> str:
    """The decoded Subject, whitespace collapsed ("" if none)."""
    value = first_field(fields, b"subject", "Subject", notes)
    if value is None:
        return ""
    return clean(" ".join(decode_words(value, "header Subject", notes).split()))


def message_id(fields: Fields, notes: Notes) -> str | None:
    """The Message-ID with its angle brackets, else its first word."""
    value = first_field(fields, b"message-id", "Message-ID", notes)
    if value is None:
        return None
    m = _MESSAGE_ID.search(value)
    text = m.group(0) if m else (value.split() or [""])[0]
    return clean(text)[:MAX_MESSAGE_ID_LENGTH] or None


# --------------------------------------------------------------------------
# Parameters


def unquote(value: str) -> str:
    """A quoted string's content (a missing closing quote tolerated)."""
    value = value.strip()
    if value.startswith('"'):
        value = value[1:-1] if len(value) > 1 and value.endswith('"') else value[1:]
        if "\\" in value:
            value = QUOTED_PAIR.sub(r"\1", value)
    return value


def split_params(value: str) -> tuple[str, list[tuple[str, str]]]:
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


def content_params(value: str, where: str, notes: Notes) -> tuple[str, dict[str, str]]:
    """Content-Type / Content-Disposition: (lower-case value, parameters
    with RFC 2231 sections and charsets decoded)."""
    head, raw_params = split_params(value)
    plain: dict[str, str] = {}
    sections: dict[str, list[tuple[int, bool, str]]] = {}
    for name, val in raw_params:
        m = _RFC2231_NAME.fullmatch(name)
        if m is None:
            plain.setdefault(name, unquote(val))
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
                val = unquote(val)
                if index == 0 and val.count("'") >= 2:
                    charset, _language, val = val.split("'", 2)
                data += urllib.parse.unquote_to_bytes(val)
            else:
                data += unquote(val).encode("utf-8")
        # RFC 2231 wins over a plain parameter of the same name (clients
        # send both: an ASCII fallback and the real name).
        plain[name] = decode_text(bytes(data), charset, f"parameter {name} of {where}", notes)
    return head, plain


# --------------------------------------------------------------------------
# A part's Content-* fields

_MIME_TYPE = re.compile(r"\s*([a-z0-9!#$&^_.+-]+)/([a-z0-9!#$&^_.+-]+)\s*")


#: What a part's Content-* fields say: (lower-case "type/subtype", the
#: Content-Type parameters, lower-case Content-Disposition value, lower-case
#: Content-Transfer-Encoding, decoded file name). A plain tuple, not a
#: dataclass: it is built for every part, and a frozen dataclass costs
#: about 1% of the parse time (bench/mime_bench.py).
PartHeader: TypeAlias = tuple[str, dict[str, str], str, str, str]


def part_header(fields: Fields, default_type: str, where: str, notes: Notes) -> PartHeader:
    """A part's (type, Content-Type parameters, disposition, transfer
    encoding, file name); see ``PartHeader``. No Content-Type:
    ``default_type``; an invalid one: text/plain, with a note. File names
    are Content-Disposition's filename, else Content-Type's name ("" if
    neither)."""
    ctype = default_type
    params: dict[str, str] = {}
    raw_ctype = first_field(fields, b"content-type", "Content-Type", notes)
    if raw_ctype is not None:
        head, params = content_params(raw_ctype, where, notes)
        m = _MIME_TYPE.match(head)
        if m is not None:
            ctype = f"{m.group(1)}/{m.group(2)}"
        else:
            ctype = "text/plain"
            notes.add(f"invalid Content-Type {quote(raw_ctype)} in {where}; read as text/plain")
    disposition = ""
    dparams: dict[str, str] = {}
    raw_disposition = first_field(fields, b"content-disposition", "Content-Disposition", notes)
    if raw_disposition is not None:
        disposition, dparams = content_params(raw_disposition, where, notes)
    cte = (first_field(fields, b"content-transfer-encoding", "Content-Transfer-Encoding",
                       notes) or "").strip().lower()
    filename = dparams.get("filename") or params.get("name") or ""
    if filename:
        filename = clean(" ".join(decode_words(filename, where, notes).split()))
    return ctype, params, disposition, cte, filename
