"""The whole message: the top-level header section read and decoded
(headers.py, addresses.py, dates.py), the parts below it walked
(parts.py), the result assembled into a ``ParsedMessage``; and the index's
view of it (``to_index_document``)."""

from __future__ import annotations

import functools
import re
import unicodedata
from dataclasses import dataclass
from datetime import UTC, datetime

from ...errors import NexarchError
from ...index.base import HIGHLIGHT_END, HIGHLIGHT_START, IndexDocument
from .addresses import Address, addresses
from .dates import header_date
from .headers import TOP_FIELDS, message_id, note_header_caps, read_headers, subject
from .limits import DEFAULT_MAX_TEXT_CHARS
from .notes import Notes
from .parts import walk

__all__ = ["MimeError", "ParsedMessage", "parse_message", "to_index_document"]

_NON_SPACE = re.compile(rb"\S")
_CONTROL = bytes(c for c in range(32) if c not in b"\t\n\r\f") + b"\x7f"


class MimeError(NexarchError, ValueError):
    """The input is not a mail message at all (empty, or binary without
    header fields), or it could not be parsed within our limits. The message
    names the problem. Retrying cannot help: the job should fail for good."""


@dataclass(frozen=True, slots=True)
class ParsedMessage:
    subject: str
    from_: tuple[Address, ...]
    to: tuple[Address, ...]
    cc: tuple[Address, ...]
    #: Timezone-aware UTC, clamped into [1900-01-01, now + 1 day]; None if
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
        return _parse(raw, max_text_chars, now.astimezone(UTC))
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


def _parse(raw: bytes, max_chars: int, now: datetime) -> ParsedMessage:
    """parse_message once the arguments are checked; the stages run in
    this order, which is also the order of the notes."""
    notes = Notes()
    if raw.find(b"\n", 0, 8192) < 0 and raw.find(b"\r", 0, 8192) >= 0:
        raw = raw.replace(b"\r", b"\n")
        notes.add("message has CR line endings; read as LF")
    fields, body_start, has_fields, too_many, truncated = read_headers(
        raw, 0, len(raw), TOP_FIELDS)
    if not has_fields:
        if _is_binary(raw[body_start:body_start + 4096]):
            raise MimeError(f"not a mail message: {len(raw)} bytes of binary data "
                            f"without header fields")
        notes.add("message has no header fields; read as plain text")
    note_header_caps(notes, too_many, truncated)
    subject_text = subject(fields, notes)
    from_ = addresses(fields, b"from", notes)
    to = addresses(fields, b"to", notes)
    cc = addresses(fields, b"cc", notes)
    date = header_date(fields, now, notes)
    mid = message_id(fields, notes)
    contents = walk(raw, body_start, fields, max_chars, notes)
    return ParsedMessage(
        subject=subject_text, from_=from_, to=to, cc=cc, date=date, message_id=mid,
        body=contents.body, attachment_names=contents.attachment_names,
        attachment_text=contents.attachment_text, notes=notes.result())


def _is_binary(sample: bytes) -> bool:
    if b"\x00" in sample:
        return True
    controls = len(sample) - len(sample.translate(None, _CONTROL))
    return controls * 10 > len(sample)


_MARKERS = str.maketrans({HIGHLIGHT_START: "\ufffd", HIGHLIGHT_END: "\ufffd"})


def _searchable(text: str) -> str:
    """Text as the index stores it: composed (NFC), as queries are. Mail in
    decomposed form (macOS writes "u" + U+0308 for "ü", in attachment names
    above all) was found by no query with an umlaut, in either backend
    (found by an audit). The snippet's highlight markers (private-use
    characters) become U+FFFD: in mail text they planted unbalanced <mark>
    tags in snippets."""
    if not text.isascii():
        text = _stream_safe(text)
        if not unicodedata.is_normalized("NFC", text):
            # Never longer than it came (one character can compose to three,
            # U+FB2C): the parse's caps on each field stay caps.
            text = unicodedata.normalize("NFC", text)[:len(text)]
        if HIGHLIGHT_START in text or HIGHLIGHT_END in text:
            text = text.translate(_MARKERS)
    return text


#: After this many combining characters in a row, U+034F (combining
#: grapheme joiner, a starter) goes in: Unicode's Stream-Safe Text Format
#: (UAX #15). CPython's normalisation sorts a run of combining marks by
#: insertion, quadratic in its length: a body of 40,000 alternating marks
#: took 5 s, a 200 KB windows-1258 one 38 s, holding the GIL (a fuzzing
#: audit). No real text has a run this long.
MAX_MARK_RUN = 30


@functools.cache
def _mark_runs() -> re.Pattern[str]:
    """Runs of more than MAX_MARK_RUN non-starters (canonical combining
    class above 0; all of them are in planes 0 and 1)."""
    ranges: list[str] = []
    start = None
    for cp in range(0x20000 + 1):
        inside = cp < 0x20000 and unicodedata.combining(chr(cp)) != 0
        if inside and start is None:
            start = cp
        elif not inside and start is not None:
            ranges.append(f"{re.escape(chr(start))}-{re.escape(chr(cp - 1))}")
            start = None
    return re.compile(f"[{''.join(ranges)}]{{{MAX_MARK_RUN + 1},}}")


def _stream_safe(text: str) -> str:
    return _mark_runs().sub(
        lambda m: "\u034f".join(m.group()[i:i + MAX_MARK_RUN]
                                for i in range(0, len(m.group()), MAX_MARK_RUN)), text)


def to_index_document(parsed: ParsedMessage, *, archive_id: int, tenant_slug: str,
                      mailboxes: tuple[str, ...] = (), size_bytes: int = 0) -> IndexDocument:
    """The index's view of a parsed message (``_searchable`` text). Raises
    ValueError/InvalidJobError for a bad archive id or tenant slug (argument
    errors, not message ones)."""
    return IndexDocument(
        archive_id=archive_id,
        tenant_slug=tenant_slug,
        subject=_searchable(parsed.subject),
        sender=_searchable(", ".join(a.display() for a in parsed.from_)),
        # NFC, as the sender filter's address is (SearchQuery): a header
        # written decomposed must match an address typed composed.
        sender_addresses=tuple(unicodedata.normalize("NFC", a.address).lower()
                               for a in parsed.from_ if a.address),
        recipients=_searchable(", ".join(a.display() for a in parsed.to + parsed.cc)),
        body=_searchable(parsed.body),
        attachment_names=tuple(_searchable(n) for n in parsed.attachment_names),
        attachment_text=_searchable(parsed.attachment_text),
        sent_at=parsed.date,
        mailboxes=mailboxes,
        size_bytes=size_bytes,
    )
