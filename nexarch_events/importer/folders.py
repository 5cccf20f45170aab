"""Which folders of an account are archived: ``LIST`` replies read (RFC 3501
section 7.2.2, RFC 5258 extended data, RFC 6154 SPECIAL-USE flags), folder
names decoded from modified UTF-7, and the operator's rules applied.

Pure functions over the parts the IMAP boundary returns: no I/O.

The rules, in order:
1. Folders that cannot be opened (``\\Noselect``, ``\\NonExistent``) are skipped.
2. Where a folder is flagged ``\\All`` (Gmail's "All Mail": every message of
   the account, whatever its labels) and ``all_mail_only`` is on (default),
   that folder alone is archived: Gmail's labels are folders over the same
   messages, and archiving each would fetch every message once per label.
3. Folders flagged with an excluded special use (default ``\\Trash``,
   ``\\Junk``, ``\\Drafts``) are skipped.
4. Folders whose decoded name matches an excluded pattern are skipped
   (case-insensitive shell patterns; a pattern is tried against the full name
   and against the name below a leading ``INBOX`` + delimiter, for servers
   that keep every folder under INBOX). The defaults name the usual trash,
   junk and draft folders of servers without SPECIAL-USE.
5. ``include`` patterns win over 3 and 4 (not over 1).
"""

from __future__ import annotations

import base64
import binascii
import fnmatch
import re
from collections.abc import Iterable, Sequence
from dataclasses import dataclass

from ..aio.imap import DiscardedLiteral
from ..errors import ImapProtocolError

DEFAULT_EXCLUDED_USES = frozenset({"\\Trash", "\\Junk", "\\Drafts"})
DEFAULT_EXCLUDED_PATTERNS = (
    "Trash", "Trash/*", "Deleted Items", "Deleted Messages", "Junk", "Junk E-mail",
    "Junk Email", "Spam", "Bulk Mail", "Drafts", "Papierkorb", "Gelöschte Elemente",
    "Gelöschte Objekte", "Junk-E-Mail", "Entwürfe",
)
# The boundary hands over the untagged lines without "* " and, for LIST,
# aioimaplib also drops the keyword: both forms are read.
_LIST = re.compile(rb"^(?:LIST )?\(([^)]*)\) (NIL|\"(?:[^\"\\]|\\.)\") ?(.*)$",
                   re.IGNORECASE | re.S)
_LITERAL = re.compile(rb"^\{(\d+)\+?\}$")
_ATOM = re.compile(rb"^([^\s(){%*\"\\\]]+)")
_QUOTED = re.compile(rb'^"((?:[^"\\]|\\.)*)"')
_CONTROL = re.compile("[\x00-\x1f\x7f]")
#: The longest folder name archived (mail_import_mailboxes.folder).
MAX_FOLDER_CHARS = 1000


@dataclass(frozen=True, slots=True)
class Folder:
    """One ``LIST`` entry."""

    #: The name as the server sent it (modified UTF-7): what EXAMINE is given.
    wire_name: str
    #: The name for people: decoded (CLI, API, status page, events).
    name: str
    #: The hierarchy delimiter, None for a flat namespace (NIL).
    delimiter: str | None
    #: Name attributes and special uses, e.g. ``\\HasNoChildren``, ``\\Sent``,
    #: with their IMAP capitalisation normalised (``\\All``, ``\\Noselect``).
    flags: frozenset[str]

    def has(self, flag: str) -> bool:
        return flag.lower() in {f.lower() for f in self.flags}


@dataclass(frozen=True, slots=True)
class FolderRules:
    """What an operator excludes (see the module docstring)."""

    excluded_uses: frozenset[str] = DEFAULT_EXCLUDED_USES
    excluded_patterns: tuple[str, ...] = DEFAULT_EXCLUDED_PATTERNS
    include_patterns: tuple[str, ...] = ()
    all_mail_only: bool = True


def decode_mailbox_name(wire: str) -> str:
    """Modified UTF-7 (RFC 3501 section 5.1.3) to text. A malformed name is
    an error naming it, not a guess: the decoded name is shown to people and
    must round-trip to the folder the server meant."""
    out: list[str] = []
    i = 0
    while i < len(wire):
        ch = wire[i]
        if ch != "&":
            if not 0x20 <= ord(ch) <= 0x7E:
                raise ImapProtocolError(f"folder name {wire[:80]!r} has a raw non-ASCII "
                                        "character (modified UTF-7 expected)")
            out.append(ch)
            i += 1
            continue
        end = wire.find("-", i + 1)
        if end < 0:
            raise ImapProtocolError(f"folder name {wire[:80]!r}: '&' shift never ends")
        chunk = wire[i + 1:end]
        if not chunk:
            out.append("&")
        else:
            b64 = chunk.replace(",", "/")
            try:
                raw = base64.b64decode(b64 + "=" * (-len(b64) % 4), validate=True)
                text = raw.decode("utf-16-be")
            except (binascii.Error, UnicodeDecodeError, ValueError):
                raise ImapProtocolError(f"folder name {wire[:80]!r} is not valid modified "
                                        "UTF-7") from None
            out.append(text)
        i = end + 1
    return "".join(out)


def parse_list(parts: Sequence[bytes | bytearray], *,
               unreadable: list[str] | None = None) -> list[Folder]:
    """The ``LIST`` responses in ``parts`` (other untagged data is skipped).
    A name may come as an atom, a quoted string or a literal. With
    ``unreadable``, a folder whose name is not valid modified UTF-7 (a raw
    "&", say), or cannot be archived (empty, a control character, over
    ``MAX_FOLDER_CHARS``, a name listed before), is left out and the reason
    added there, so one bad name does not cost the account its other
    folders; without it, it raises."""
    folders: list[Folder] = []
    seen: set[str] = set()

    def add(folder: Folder) -> None:
        problem = folder_problem(folder.name)
        if problem is None and folder.name in seen:
            problem = f"folder name {folder.name[:80]!r} is listed twice (first one kept)"
        if problem is not None:
            if unreadable is None:
                raise ImapProtocolError(problem)
            unreadable.append(problem)
            return
        seen.add(folder.name)
        folders.append(folder)

    i, n = 0, len(parts)
    while i < n:
        part = parts[i]
        i += 1
        if isinstance(part, bytearray):
            continue  # a literal of a response that is not ours
        match = _LIST.match(bytes(part).rstrip(b"\r\n"))
        if match is None:
            continue
        flag_text, delim_text, rest = match.groups()
        flags = frozenset(_flag(f) for f in flag_text.decode("ascii", "replace").split())
        delimiter = None if delim_text.upper() == b"NIL" else _unquote(delim_text[1:-1])
        literal = _LITERAL.match(rest.strip())
        if literal:
            if i >= n or not isinstance(parts[i], bytearray):
                raise ImapProtocolError("LIST response announces a literal name that never came")
            name_part = parts[i]
            if isinstance(name_part, DiscardedLiteral):
                raise ImapProtocolError(f"LIST response names a folder with {name_part.size} "
                                        "bytes")
            raw_name = bytes(name_part)
            i += 1
            if i < n and isinstance(parts[i], bytes) and not _LIST.match(bytes(parts[i])):
                i += 1  # the rest of the line after the literal (extended data)
        else:
            raw_name = _astring(rest)
        try:
            wire = raw_name.decode("ascii")
        except UnicodeDecodeError:
            # Some servers send UTF-8 names (RFC 6855 UTF8=ACCEPT) unasked.
            wire_text = raw_name.decode("utf-8", "replace")
            add(Folder(wire_name=wire_text, name=wire_text, delimiter=delimiter, flags=flags))
            continue
        try:
            name = decode_mailbox_name(wire)
        except ImapProtocolError as exc:
            if unreadable is None:
                raise
            unreadable.append(str(exc))
            continue
        add(Folder(wire_name=wire, name=name, delimiter=delimiter, flags=flags))
    return folders


def folder_problem(name: str) -> str | None:
    """Why a (decoded) folder name cannot be archived, or None."""
    if not name:
        return "a folder with an empty name"
    if len(name) > MAX_FOLDER_CHARS:
        return (f"folder name {name[:80]!r}... has {len(name)} characters; the limit is "
                f"{MAX_FOLDER_CHARS}")
    if _CONTROL.search(name):
        return f"folder name {name[:80]!r} has a control character"
    return None


_KNOWN_FLAGS = {f.lower(): f for f in (
    "\\All", "\\Archive", "\\Drafts", "\\Flagged", "\\Junk", "\\Sent", "\\Trash",
    "\\Noselect", "\\NonExistent", "\\Noinferiors", "\\HasChildren", "\\HasNoChildren",
    "\\Marked", "\\Unmarked", "\\Subscribed", "\\Remote", "\\Important")}


def _flag(text: str) -> str:
    return _KNOWN_FLAGS.get(text.lower(), text)


def _unquote(raw: bytes) -> str:
    return re.sub(rb"\\(.)", rb"\1", raw).decode("ascii", "replace")


def _astring(rest: bytes) -> bytes:
    quoted = _QUOTED.match(rest)
    if quoted:
        return re.sub(rb"\\(.)", rb"\1", quoted.group(1))
    atom = _ATOM.match(rest)
    if atom:
        return atom.group(1)
    raise ImapProtocolError(f"LIST response has no folder name: {rest[:80]!r}")


def select_folders(folders: Iterable[Folder], rules: FolderRules = FolderRules()
                   ) -> list[Folder]:
    """The folders to archive, in the server's order (see the module docstring)."""
    openable = [f for f in folders if not (f.has("\\Noselect") or f.has("\\NonExistent"))]
    if rules.all_mail_only:
        everything = [f for f in openable if f.has("\\All")]
        if everything:
            return everything[:1]
    chosen: list[Folder] = []
    for folder in openable:
        if _matches(folder, rules.include_patterns):
            chosen.append(folder)
            continue
        if any(folder.has(use) for use in rules.excluded_uses):
            continue
        if _matches(folder, rules.excluded_patterns):
            continue
        chosen.append(folder)
    return chosen


def _matches(folder: Folder, patterns: Sequence[str]) -> bool:
    names = [folder.name]
    if folder.delimiter:
        prefix = "INBOX" + folder.delimiter
        if folder.name.upper().startswith(prefix.upper()):
            names.append(folder.name[len(prefix):])
    for pattern in patterns:
        p = pattern.casefold()
        if folder.delimiter and folder.delimiter != "/":
            # Patterns are written with "/"; match the server's delimiter.
            p = p.replace("/", folder.delimiter)
        if any(fnmatch.fnmatchcase(name.casefold(), p) for name in names):
            return True
    return False
