"""Reading IMAP replies (RFC 3501) the importer relies on, and writing the
arguments it sends. Pure functions over the raw parts the boundary returns
(``bytes`` lines, ``bytearray`` literals): no I/O, fully unit-tested.

Nothing a server says is taken on trust: numbers outside RFC 3501's ranges
come back as None (the caller decides what "unknown" means), and replies that
do not parse raise ImapProtocolError naming the offending text.
"""

from __future__ import annotations

import base64
import re
from array import array
from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from datetime import UTC, datetime, timedelta, timezone

from ..aio.imap import DiscardedLiteral
from ..errors import ImapProtocolError

MAX_UID = 2**32 - 1

_UIDVALIDITY = re.compile(rb"\[UIDVALIDITY (\d+)\]", re.IGNORECASE)
_UIDNEXT = re.compile(rb"\[UIDNEXT (\d+)\]", re.IGNORECASE)
_EXISTS = re.compile(rb"^(\d+) EXISTS\b", re.IGNORECASE)
_FETCH_START = re.compile(rb"^(\d+) FETCH \(", re.IGNORECASE)
_ITEM_UID = re.compile(rb"[( ]UID (\d+)", re.IGNORECASE)
_ITEM_SIZE = re.compile(rb"[( ]RFC822\.SIZE (\d+)", re.IGNORECASE)
_BODY_LITERAL = re.compile(rb"[( ]BODY\[\](?:<\d+>)? \{(\d+)\}$", re.IGNORECASE)
_BODY_NIL = re.compile(rb"[( ]BODY\[\](?:<\d+>)? NIL", re.IGNORECASE)
_BODY_QUOTED = re.compile(rb'[( ]BODY\[\](?:<\d+>)? "((?:[^"\\]|\\.)*)"', re.IGNORECASE)
#: What may follow a literal inside a FETCH response: the response's end,
#: or the next data item. Anything else means the literal was not as long
#: as the server announced (e.g. it counted bare LF line ends, then sent
#: CRLF), so the bytes taken for the message are not the message.
_AFTER_LITERAL = re.compile(
    rb"^(?:\)| (?:UID|RFC822\.SIZE|RFC822|INTERNALDATE|FLAGS|BODY|BINARY|MODSEQ|X-[A-Z0-9-]+)\b)",
    re.IGNORECASE)
_ITEM_INTERNALDATE = re.compile(
    rb'[( ]INTERNALDATE "\s?(\d{1,2})-([A-Za-z]{3})-(\d{4}) (\d{2}):(\d{2}):(\d{2}) '
    rb'([+-])(\d{2})(\d{2})"', re.IGNORECASE)
_MONTHS = {m: i for i, m in enumerate(
    (b"jan", b"feb", b"mar", b"apr", b"may", b"jun", b"jul", b"aug", b"sep", b"oct", b"nov",
     b"dec"), start=1)}
# Exchange / Office 365 answer a message they cannot convert with a made-up
# one (OfflineIMAP #62); its Subject names the failure.
_SUBSTITUTE_SUBJECT = re.compile(
    rb"^Subject:[ \t]*Retrieval using the IMAP4 protocol failed", re.IGNORECASE | re.MULTILINE)


@dataclass(frozen=True, slots=True)
class MailboxStatus:
    """What EXAMINE said. None: absent, zero or out of range."""

    uidvalidity: int | None
    uidnext: int | None
    exists: int | None
    #: The raw UIDVALIDITY token when it was present but unusable (e.g. 0).
    uidvalidity_raw: int | None = None


@dataclass(frozen=True, slots=True)
class FetchedItem:
    """One ``* n FETCH (...)`` response."""

    seq: int
    #: The UID the server reported, None if it reported none.
    uid: int | None
    size: int | None
    #: The message bytes; None for ``BODY[] NIL`` or no body item at all.
    body: bytes | None
    #: INTERNALDATE (the server's received date), if asked for and valid.
    internaldate: datetime | None = None
    #: The body was larger than the client holds (``DiscardedLiteral``:
    #: its size and the limit); ``body`` is None then.
    discarded: DiscardedLiteral | None = None
    #: The response carries a BODY[] item (a literal, a quoted string or
    #: NIL). Without one it is no answer to a body fetch: a flag update
    #: that names its UID (usual during UID commands, mandatory with
    #: CONDSTORE) must not stand for the message.
    body_item: bool = False

    @property
    def answers_body(self) -> bool:
        """A reply to a body request: a BODY[] item, or a body too large to
        hold (read and discarded). Anything else, with or without its UID,
        is a flag update and not ours to take for the message."""
        return self.body_item or self.discarded is not None

    @property
    def flags_only(self) -> bool:
        """No UID and no message: e.g. an unsolicited flag update (RFC 3501
        §7.4.2), legal at any time and not ours to read."""
        return self.uid is None and self.body is None and self.discarded is None


def _nz(value: int) -> int | None:
    return value if 1 <= value <= MAX_UID else None


def parse_examine(lines: Iterable[bytes | bytearray]) -> MailboxStatus:
    uidvalidity = uidnext = exists = raw = None
    for line in lines:
        if isinstance(line, bytearray):
            continue
        if m := _UIDVALIDITY.search(line):
            raw = int(m.group(1))
            uidvalidity = _nz(raw)
        elif m := _UIDNEXT.search(line):
            uidnext = _nz(int(m.group(1)))
        elif m := _EXISTS.match(line):
            # A count above 2^32-1 is no count (Postgres could not take it).
            exists = int(m.group(1)) if int(m.group(1)) <= MAX_UID else None
    return MailboxStatus(uidvalidity, uidnext, exists,
                         uidvalidity_raw=raw if uidvalidity is None else None)


def parse_search(lines: Iterable[bytes | bytearray]) -> array[int]:
    """UIDs of a UID SEARCH reply, as given (unsorted, maybe with 0s: the
    caller filters). ``lines`` are the reply's untagged data; aioimaplib
    hands them over without the ``SEARCH`` keyword, other clients with it.
    An ``array`` keeps a million UIDs at 8 MB, not 36."""
    found: array[int] = array("Q")
    for line in lines:
        if isinstance(line, bytearray):
            raise ImapProtocolError("UID SEARCH reply holds a literal")
        tokens = line.split()
        if tokens and tokens[0].upper() == b"SEARCH":
            tokens = tokens[1:]
        for token in tokens:
            if not token.isdigit() or len(token) > 10:
                raise ImapProtocolError(f"UID SEARCH reply holds {token[:40]!r}, not a UID")
            found.append(int(token))
    return found


def parse_fetch(parts: Sequence[bytes | bytearray]) -> list[FetchedItem]:
    """The FETCH responses in ``parts``, in the order the server sent them."""
    items: list[FetchedItem] = []
    i = 0
    n = len(parts)
    while i < n:
        part = parts[i]
        if isinstance(part, bytearray):
            raise ImapProtocolError("FETCH reply has a literal outside any FETCH response")
        start = _FETCH_START.match(part)
        if start is None:
            i += 1  # other untagged data (e.g. "* 3 EXPUNGE") is not ours to read
            continue
        seq = int(start.group(1))
        text = bytes(part)
        body: bytes | None = None
        discarded: DiscardedLiteral | None = None
        body_item = False
        i += 1
        # A response continues over literals and the line after each until
        # its closing parenthesis. Literals are replaced by a placeholder, so
        # the regexes below only ever read the response's own text.
        while text.rstrip().endswith(b"}"):
            if i >= n or not isinstance(parts[i], bytearray):
                raise ImapProtocolError(f"FETCH response for message {seq} announces a "
                                        "literal that never came")
            is_body = _BODY_LITERAL.search(text.rstrip()) is not None
            if is_body:
                literal = parts[i]
                body_item = True
                if isinstance(literal, DiscardedLiteral):
                    discarded = literal
                else:
                    body = bytes(literal)
            size = len(parts[i])
            text += b" <literal>"
            i += 1
            following = parts[i] if i < n else None
            if is_body and not (isinstance(following, bytes)
                                and _AFTER_LITERAL.match(following)):
                raise ImapProtocolError(
                    f"FETCH response for message {seq}: the reply goes on past its "
                    f"{size}-byte literal ({bytes(following or b'')[:20]!r}...): the server "
                    "announced a wrong length, so the bytes received are not the message")
            if isinstance(following, bytes) and not _FETCH_START.match(following):
                text += following
                i += 1
            else:
                break
        if _BODY_NIL.search(text):
            body, body_item = None, True
        elif quoted := _BODY_QUOTED.search(text):
            # An nstring may be a quoted string: "" or a short message.
            body, body_item = re.sub(rb"\\(.)", rb"\1", quoted.group(1)), True
        uid_m = _ITEM_UID.search(text)
        size_m = _ITEM_SIZE.search(text)
        items.append(FetchedItem(
            seq=seq,
            uid=int(uid_m.group(1)) if uid_m else None,
            size=int(size_m.group(1)) if size_m else None,
            body=body,
            internaldate=_internaldate(text),
            discarded=discarded,
            body_item=body_item))
    return items


def _internaldate(text: bytes) -> datetime | None:
    """INTERNALDATE (RFC 3501 date-time), None if absent or impossible."""
    m = _ITEM_INTERNALDATE.search(text)
    if m is None:
        return None
    day, month, year, hh, mm, ss, sign, oh, om = m.groups()
    number = _MONTHS.get(month.lower())
    if number is None:
        return None
    offset = timedelta(hours=int(oh), minutes=int(om)) * (1 if sign == b"+" else -1)
    try:
        when = datetime(int(year), number, int(day), int(hh), int(mm), int(ss),
                        tzinfo=timezone(offset))
        # Stored in UTC: 31-Dec-9999 -2359 or 01-Jan-0001 +0100 has none.
        when.astimezone(UTC)
    except (ValueError, OverflowError):
        return None
    return when


def is_substitute(body: bytes) -> bool:
    """True if ``body`` is a server-made stand-in for a message (Exchange's
    "Retrieval using the IMAP4 protocol failed"), judged on its header."""
    head = body[:16384]
    end = head.find(b"\r\n\r\n")
    if end < 0:
        end = head.find(b"\n\n")
    return _SUBSTITUTE_SUBJECT.search(head if end < 0 else head[:end]) is not None


def uid_set(uids: Sequence[int]) -> str:
    """A compact UID set for ascending ``uids``: ``1:3,7,9:10``. Built from
    real UIDs only: a sparse mailbox is never walked as a number range."""
    if not uids:
        raise ValueError("empty UID set")
    out: list[str] = []
    first = prev = uids[0]
    for uid in uids[1:]:
        if uid <= prev:
            raise ValueError("UIDs must be strictly ascending")
        if uid == prev + 1:
            prev = uid
            continue
        out.append(f"{first}:{prev}" if first != prev else str(first))
        first = prev = uid
    out.append(f"{first}:{prev}" if first != prev else str(first))
    return ",".join(out)


def mailbox_argument(name: str, *, wire: str | None = None) -> str:
    """A mailbox name as an IMAP argument: modified UTF-7 (RFC 3501 §5.1.3),
    quoted. ``wire``: the name as the server listed it, given back as it
    was (quoted): a server that lists a name in another form (raw UTF-8, a
    non-canonical encoding) knows the folder by that form only."""
    for text in (name, wire):
        if text is not None and (not text or any(ch in text for ch in "\r\n\x00")):
            raise ImapProtocolError(f"mailbox name {text[:60]!r} is empty or has CR, LF "
                                    "or NUL")
    if wire is not None:
        return _quoted(wire)
    out: list[str] = []
    pending: list[str] = []

    def flush() -> None:
        if pending:
            raw = "".join(pending).encode("utf-16-be")
            out.append("&" + base64.b64encode(raw).decode().rstrip("=").replace("/", ",") + "-")
            pending.clear()

    for ch in name:
        if 0x20 <= ord(ch) <= 0x7E:
            flush()
            out.append("&-" if ch == "&" else ch)
        else:
            pending.append(ch)
    flush()
    return _quoted("".join(out))


def _quoted(text: str) -> str:
    return '"' + text.replace("\\", "\\\\").replace('"', '\\"') + '"'
