"""A small in-memory IMAP4rev1 server (trio) with IDLE, for the demo and for tests.

``nexarch-events demo`` serves its sample mailbox with it, in-process; tests
(ours and those of code that embeds nexarch-events) use it for what a real
server will not do on demand: the ``Faults`` below.

    async with open_scripted_imap(user="user", password="secret") as server:
        uid = server.add_message(raw_bytes)   # idling clients get ``* n EXISTS``
        ...  # connect an importer to server.host:server.port, tls "plain"

It listens on 127.0.0.1:<free port> only (no TLS: loopback), logs in with
LOGIN (user and password), and answers the commands an importer sends:
CAPABILITY, LOGIN, EXAMINE/SELECT, UID SEARCH (``ALL`` and ``UID <set>``,
optionally after ``CHARSET x``), UID FETCH (``UID``, ``FLAGS``,
``RFC822.SIZE``, ``BODY[]``, ``BODY.PEEK[]``, ``RFC822``), UID STORE
(recorded only), IDLE/DONE, NOOP and LOGOUT. Anything else gets ``BAD``.
There is one mailbox with mail; sequence numbers are 1-based positions in
``messages``. Mail is added in-process (``add_message``), not by APPEND.

OAuth2 (``token_valid``, e.g. ``TokenEndpoint.is_valid`` of
``nexarch_events.testing.oauth_server``): the server then offers
``AUTHENTICATE`` with ``XOAUTH2`` and ``OAUTHBEARER`` (RFC 7628, with SASL-IR
or after ``+``) and accepts the configured user with a token that
``token_valid`` accepts; any other gets the mechanism's error continuation
(base64 JSON ``{"status": "401", ...}``), then ``NO [AUTHENTICATIONFAILED]``,
as Gmail and Microsoft 365 answer. ``authentications`` and
``refused_tokens`` count them; the token never appears in ``commands``.

``LIST`` (RFC 3501, RFC 6154 SPECIAL-USE, ``RETURN (SPECIAL-USE)`` of
RFC 5258 accepted) answers ``folders``: the mailbox with mail, plus names
that are only listed (selecting one answers ``NO [NONEXISTENT]``), each with
its attributes, so a Gmail-like layout (``[Gmail]/All Mail`` flagged
``\\All``, labels as folders, ``[Gmail]`` itself ``\\Noselect``) can be
discovered end to end. Names are given as the server sends them (modified
UTF-7 for non-ASCII).

UID sets follow RFC 3501: ``*`` is the largest UID in use, so ``n:*`` with n
above it still matches the last message. Only existing UIDs are iterated,
never numeric ranges, so sparse UIDs such as 4000000000 are cheap.

Faults (``Faults``, mutable between connections) bend replies: no or zero
UIDVALIDITY, no UIDNEXT, wrong or descending UIDs in FETCH, FETCH without
data, a connection cut mid-literal, ``* BYE`` after ``+ idling`` and a
server that goes silent at a chosen command; and what providers do:
throttling answers (Office 365's ``NO [UNAVAILABLE] ... Suggested Backoff
Time``, Gmail's ``[THROTTLED]``), Exchange's substitute body for a message
it cannot convert, unsolicited ``FETCH (FLAGS ...)`` without UID, and a
``* BYE`` in the middle of a FETCH reply (bandwidth limits). Like Dovecot,
it announces new mail (``* n EXISTS``) in the reply to any FETCH, SEARCH or
NOOP. ``Faults().uidvalidity`` is also simply the mailbox's UIDVALIDITY.

Not for untrusted clients: it keeps everything in memory and bounds nothing.
"""

from __future__ import annotations

import base64
import binascii
import json
import re
from collections.abc import AsyncIterator, Callable, Iterable, Sequence
from contextlib import asynccontextmanager
from dataclasses import dataclass, field
from typing import Literal

import trio

__all__ = ["Faults", "ListedFolder", "ScriptedImapServer", "ScriptedMessage",
           "open_scripted_imap", "resolve_uid_set", "substitute_body"]

_LITERAL = re.compile(rb"\{(\d+)(\+?)\}$")
_BODY_ITEM = re.compile(r"\bBODY(\.PEEK)?\[\]|\bRFC822(?![.\w])")
_FLAGS_ITEM = re.compile(r"(?<![\w.+-])FLAGS\b")
_SYSTEM_FLAGS = r"\Answered \Flagged \Deleted \Seen \Draft"


@dataclass
class ScriptedMessage:
    uid: int
    body: bytes | None  # None: the server answers ``BODY[] NIL``
    size: int | None = None  # RFC822.SIZE reported; None: len(body), or 0 without a body
    flags: set[str] = field(default_factory=set)
    internaldate: str = "01-Jan-2024 10:00:00 +0000"

    @property
    def reported_size(self) -> int:
        if self.size is not None:
            return self.size
        return len(self.body) if self.body is not None else 0


@dataclass
class Faults:
    uidvalidity: int | None = 1  # None: no UIDVALIDITY line at all
    uidnext: int | Literal["auto"] | None = "auto"  # None: no UIDNEXT line; auto: max uid + 1
    report_uid: dict[int, int] = field(default_factory=dict)  # FETCH reports value for key
    descending_fetch: bool = False  # FETCH replies in descending UID order
    cut_mid_literal_uid: int | None = None  # send half this BODY[] literal, then close
    bye_after_idle: Literal["close", "hang"] | None = None  # ``* BYE`` after ``+ idling``
    # Sent at once after ``+ idling`` (e.g. ``* OK Still here``, Dovecot's
    # keepalive, or a flag update ``* 1 FETCH (FLAGS (\\Seen))``).
    idle_push: str | None = None
    silent_after: str | None = None  # at this command (e.g. "UID FETCH"): never answer again
    empty_fetch_uids: set[int] = field(default_factory=set)  # FETCH OK but no data for these
    no_idle_capability: bool = False  # IDLE not advertised (and answered BAD)
    # Throttling: the first ``throttle_times`` commands named ``throttle_command``
    # (e.g. "UID FETCH") of each connection answer
    # ``NO [<throttle_code>] Request is throttled.`` plus, unless None,
    # ``Suggested Backoff Time: <throttle_backoff_ms> milliseconds``.
    throttle_command: str | None = None
    throttle_times: int = 1
    throttle_code: str = "UNAVAILABLE"
    throttle_backoff_ms: int | None = 2000
    # BODY[] of these UIDs is Exchange's made-up "Retrieval using the IMAP4
    # protocol failed" message (RFC822.SIZE stays the real message's).
    substitute_uids: set[int] = field(default_factory=set)
    # Every UID FETCH reply starts with ``* 1 FETCH (FLAGS (\Seen))``: no UID.
    unsolicited_flags: bool = False
    # Every UID FETCH reply starts with this many unsolicited flag updates
    # (``* n FETCH (FLAGS (\Seen))``, n = 1, 2, ...), in one write: another
    # client marked that many messages read (RFC 3501 §7.4.2 allows them).
    flag_update_burst: int = 0
    # After this many FETCH responses of one UID FETCH: ``* BYE``, close.
    bye_after_fetch_responses: int | None = None
    # Every UID FETCH: all its responses, then ``* BYE`` and close instead
    # of the tagged OK (a session limit that strikes at the end of a reply).
    bye_instead_of_fetch_ok: bool = False
    # Every UID FETCH reply starts with a tagged line of a tag never sent
    # (``Z999 OK ...``): a server that lost track of its own session.
    stray_tagged_reply: bool = False
    # At this command (e.g. "UID FETCH"): answer with a line that never ends
    # (``* SEARCH 1 1 1 ...`` without CRLF, 64 KiB a write) until the client
    # closes the connection; ``endless_line_sent`` counts the bytes.
    endless_line_at: str | None = None
    # At this command: ``* 1 EXISTS`` lines without end (short lines, 64 KiB
    # a write) until the client closes; ``flood_sent`` counts the bytes.
    untagged_flood_at: str | None = None
    # Messages the server cannot read (Dovecot with a corrupt or missing mail
    # file): a UID FETCH naming any of them answers every other message,
    # then ``NO Some messages could not be FETCHed (Failure)``.
    unreadable_uids: set[int] = field(default_factory=set)
    # A UID FETCH whose set names no message answers ``NO No matching
    # messages`` (RFC 3501 wants OK with no data; some servers say NO).
    no_for_no_match: bool = False
    # BODY[] literals of these UIDs announce (and RFC822.SIZE says) their
    # length with bare LF line ends, but the message goes out with CRLF: a
    # server that counts what it stores, not what it sends.
    lf_counted_uids: set[int] = field(default_factory=set)
    # Before each message's response to a body fetch: a flag update that
    # names its UID (``* n FETCH (UID u FLAGS (\Seen))``), as servers send
    # during UID commands and must with CONDSTORE.
    flag_update_with_uid: bool = False
    # BODY[] of these UIDs is sent as a quoted string (legal for an
    # nstring; the body must have no CR, LF or NUL).
    quoted_body_uids: set[int] = field(default_factory=set)
    # EXAMINE and SELECT answer ``NO <this text>`` (it may hold any byte a
    # server might send, a NUL included).
    examine_refusal: str | None = None
    # A FETCH without a body item (the size probe) states this RFC822.SIZE
    # for every message; a body fetch states the true size.
    probe_size: int | None = None
    # EXAMINE reports this many messages instead of the real count.
    exists_override: int | None = None
    # Called with each command line as received (e.g. to deliver mail mid-sync).
    on_command: Callable[[str], None] | None = None
    # UID SEARCH lists these UIDs too, whatever was asked; no message has
    # them, so a FETCH answers OK with no data (a server whose index is out
    # of step with its store).
    phantom_search_uids: set[int] = field(default_factory=set)


@dataclass(frozen=True)
class ListedFolder:
    """One ``LIST`` entry: the name as sent (modified UTF-7), its attributes
    (e.g. ``("\\HasNoChildren", "\\All")``) and the hierarchy delimiter."""

    name: str
    attributes: tuple[str, ...] = ("\\HasNoChildren",)
    delimiter: str = "/"


#: What a refused OAuth2 sign-in sends before NO (RFC 7628 section 3.2.2).
_OAUTH_ERROR = base64.b64encode(json.dumps(
    {"status": "401", "schemes": "bearer", "scope": "https://mail.google.com/"}).encode()
    ).decode()
OAUTH_MECHANISMS = ("XOAUTH2", "OAUTHBEARER")


class _BadCommand(Exception):
    """Answered ``<tag> BAD <message>``."""


class _Disconnect(Exception):
    """End the connection (close the socket)."""


def resolve_uid_set(spec: str, uids: Iterable[int]) -> set[int]:
    """The existing UIDs matched by ``spec`` (``1,5,9``, ``3:7``, ``7:3``, ``5:*``, ``*``)."""
    existing = list(uids)
    top = max(existing, default=0)

    def number(text: str) -> int:
        if text == "*":
            return top
        if not text.isdigit():
            raise _BadCommand(f"Invalid UID set: {spec}")
        return int(text)

    selected: set[int] = set()
    for part in spec.split(","):
        first, colon, last = part.partition(":")
        low = number(first)
        high = number(last) if colon else low
        low, high = min(low, high), max(low, high)
        selected.update(uid for uid in existing if low <= uid <= high)
    return selected


def _quote(text: str) -> str:
    return '"' + text.replace("\\", "\\\\").replace('"', '\\"') + '"'


def _tokenize(text: str) -> list[tuple[str, str]]:
    """Split a command into (value, raw) tokens: quoted strings are unquoted,
    parenthesized and bracketed groups (``BODY.PEEK[]``, ``(UID FLAGS)``) stay whole."""
    tokens: list[tuple[str, str]] = []
    i, end = 0, len(text)
    while i < end:
        if text[i] == " ":
            i += 1
            continue
        start = i
        if text[i] == '"':
            chars: list[str] = []
            i += 1
            while i < end and text[i] != '"':
                if text[i] == "\\" and i + 1 < end:
                    i += 1
                chars.append(text[i])
                i += 1
            if i >= end:
                raise _BadCommand("Unterminated quoted string")
            i += 1
            tokens.append(("".join(chars), text[start:i]))
            continue
        depth = 0
        while i < end and (depth > 0 or text[i] != " "):
            depth += (text[i] in "([") - (text[i] in ")]")
            i += 1
        tokens.append((text[start:i], text[start:i]))
    return tokens


class _Reader:
    def __init__(self, stream: trio.SocketStream) -> None:
        self._stream = stream
        self._buffer = bytearray()

    async def _fill(self) -> bool:
        data = await self._stream.receive_some(65536)
        self._buffer += data
        return bool(data)

    async def readline(self) -> bytes | None:
        """The next line without its CRLF; None at end of stream."""
        while (newline := self._buffer.find(b"\n")) < 0:
            if not await self._fill():
                return None
        line = bytes(self._buffer[:newline])
        del self._buffer[: newline + 1]
        return line.removesuffix(b"\r")

    async def read_exactly(self, count: int) -> bytes | None:
        while len(self._buffer) < count:
            if not await self._fill():
                return None
        data = bytes(self._buffer[:count])
        del self._buffer[:count]
        return data


@dataclass(eq=False)
class _Connection:
    stream: trio.SocketStream
    reader: _Reader
    authenticated: bool = False
    selected: bool = False
    read_only: bool = True
    exists_sent: int = 0
    line: str = ""  # the current command as logged
    throttled: int = 0  # commands throttled on this connection

    async def send(self, data: str | bytes) -> None:
        if isinstance(data, str):
            data = data.encode() + b"\r\n"
        await self.stream.send_all(data)


class ScriptedImapServer:
    """Run with ``await nursery.start(server.serve)`` or ``open_scripted_imap()``."""

    def __init__(self, messages: list[ScriptedMessage] | None = None, *,
                 faults: Faults | None = None, user: str = "user",
                 password: str = "secret", mailbox: str = "INBOX",
                 folders: Sequence[ListedFolder] | None = None,
                 token_valid: Callable[[str], bool] | None = None,
                 oauth_mechanisms: Sequence[str] = OAUTH_MECHANISMS) -> None:
        """``folders``: what LIST answers (default: ``mailbox`` alone).
        ``token_valid``: offer OAuth2 sign-in, accepting the tokens it
        accepts (with ``oauth_mechanisms``); LOGIN keeps working."""
        self.messages: list[ScriptedMessage] = list(messages or [])
        self.folders = list(folders) if folders is not None else [ListedFolder(mailbox)]
        #: SPECIAL-USE and LIST-EXTENDED are announced when folders are scripted.
        self._special_use = folders is not None
        self.token_valid = token_valid
        self.oauth_mechanisms = tuple(m.upper() for m in oauth_mechanisms)
        #: AUTHENTICATE commands received, and those refused for their token
        self.authentications = 0
        self.refused_tokens = 0
        self.faults = faults if faults is not None else Faults()
        self.user = user
        self.password = password
        self.mailbox = mailbox
        self.host = "127.0.0.1"
        self.port = 0
        #: every command received, tag stripped; LOGIN passwords as ***; "DONE" ends IDLE
        self.commands: list[str] = []
        #: accepted connections so far; open now, and the most open at once
        self.connections = 0
        self.open_now = 0
        self.most_open = 0
        #: Bytes of the never-ending line sent (``Faults.endless_line_at``).
        self.endless_line_sent = 0
        #: Bytes of untagged lines sent (``Faults.untagged_flood_at``).
        self.flood_sent = 0
        #: LOGIN commands received (refused ones included)
        self.logins = 0
        #: commands answered with a throttling NO
        self.throttled = 0
        #: commands that would set \Seen: STOREs and non-PEEK BODY[]/RFC822 fetches
        self.flag_changes: list[str] = []
        self._changed = trio.Event()

    # -- the mailbox, changed by tests ------------------------------------

    def add_message(self, body: bytes, *, uid: int | None = None) -> int:
        """Append a message (UID default: max + 1); idling clients get ``* n EXISTS``."""
        if uid is None:
            uid = max((m.uid for m in self.messages), default=0) + 1
        elif any(m.uid == uid for m in self.messages):
            raise ValueError(f"UID {uid} is already in the mailbox")
        self.messages.append(ScriptedMessage(uid, body))
        self._notify()
        return uid

    def set_messages(self, messages: list[ScriptedMessage], *,
                     uidvalidity: int | None) -> None:
        """Replace the mailbox content and its UIDVALIDITY (None: not reported)."""
        self.messages = list(messages)
        self.faults.uidvalidity = uidvalidity
        self._notify()

    def _notify(self) -> None:
        self._changed.set()
        self._changed = trio.Event()

    def _capabilities(self) -> str:
        idle = "" if self.faults.no_idle_capability else " IDLE"
        auth = "" if self.token_valid is None else " SASL-IR" + "".join(
            f" AUTH={m}" for m in self.oauth_mechanisms)
        listing = " SPECIAL-USE LIST-EXTENDED" if self._special_use else ""
        return f"IMAP4rev1{idle} UIDPLUS LITERAL+{listing}{auth}"

    def _silent(self, name: str) -> bool:
        return self._named(self.faults.silent_after, name)

    @staticmethod
    def _named(wanted: str | None, name: str) -> bool:
        return wanted is not None and " ".join(wanted.upper().split()) == name

    async def _endless_line(self, connection: _Connection) -> None:
        await connection.send(b"* SEARCH")
        chunk = b" 1" * 32768
        while True:  # until the client closes (BrokenResourceError ends it)
            await connection.send(chunk)
            self.endless_line_sent += len(chunk)

    async def _untagged_flood(self, connection: _Connection) -> None:
        chunk = b"* 1 EXISTS\r\n" * 5000
        while True:  # until the client closes (BrokenResourceError ends it)
            await connection.send(chunk)
            self.flood_sent += len(chunk)

    # -- serving ----------------------------------------------------------

    async def serve(self, *, task_status: trio.TaskStatus[int] = trio.TASK_STATUS_IGNORED
                    ) -> None:
        """Listen on 127.0.0.1:<free port>; ``started(port)`` once bound."""
        listeners = await trio.open_tcp_listeners(0, host=self.host)
        self.port = listeners[0].socket.getsockname()[1]
        async with trio.open_nursery() as nursery:
            await nursery.start(trio.serve_listeners, self._handle, listeners)
            task_status.started(self.port)

    async def _handle(self, stream: trio.SocketStream) -> None:
        self.connections += 1
        self.open_now += 1
        self.most_open = max(self.most_open, self.open_now)
        connection = _Connection(stream, _Reader(stream))
        try:
            await self._converse(connection)
        except* (_Disconnect, trio.BrokenResourceError, trio.ClosedResourceError):
            # The client went away; also when the read that saw it ran in a
            # nursery of its own (IDLE), which wraps it in an exception group.
            pass
        finally:
            self.open_now -= 1
            with trio.CancelScope(shield=True):
                await stream.aclose()

    async def _hang(self, connection: _Connection) -> None:
        """Read and discard everything, answer nothing, keep the socket open."""
        while await connection.stream.receive_some(65536):
            pass
        raise _Disconnect

    async def _read_command(self, connection: _Connection) -> str | None:
        """One command, literals (``{n}`` and ``{n+}``) inlined as quoted strings."""
        parts: list[str] = []
        while True:
            line = await connection.reader.readline()
            if line is None:
                return None
            literal = _LITERAL.search(line)
            if literal is None:
                parts.append(line.decode(errors="replace"))
                return "".join(parts)
            parts.append(line[: literal.start()].decode(errors="replace"))
            if not literal.group(2):
                await connection.send("+ Ready")
            data = await connection.reader.read_exactly(int(literal.group(1)))
            if data is None:
                return None
            parts.append(_quote(data.decode(errors="replace")))

    async def _converse(self, connection: _Connection) -> None:
        if self._silent("GREETING"):
            await self._hang(connection)
        await connection.send(f"* OK [CAPABILITY {self._capabilities()}] Scripted IMAP ready.")
        while True:
            text = await self._read_command(connection)
            if text is None:
                return
            tag = text.split(" ", 1)[0] or "*"
            try:
                tokens = _tokenize(text)
                if len(tokens) < 2:
                    self.commands.append(text)
                    raise _BadCommand("Missing tag or command")
                tag = tokens[0][0]
                name, args = tokens[1][0].upper(), [value for value, _ in tokens[2:]]
                if name == "UID" and args:
                    name, args = f"UID {args[0].upper()}", args[1:]
                connection.line = text[len(tokens[0][1]):].lstrip(" ")
                if name == "LOGIN" and len(tokens) >= 4:
                    connection.line = f"LOGIN {tokens[2][1]} ***"
                if name == "AUTHENTICATE" and len(tokens) >= 4:
                    connection.line = f"AUTHENTICATE {tokens[2][1]} ***"
                self.commands.append(connection.line)
                if self.faults.on_command is not None:
                    self.faults.on_command(connection.line)
                if self._silent(name):
                    await self._hang(connection)
                if self._named(self.faults.endless_line_at, name):
                    await self._endless_line(connection)
                if self._named(self.faults.untagged_flood_at, name):
                    await self._untagged_flood(connection)
                if await self._throttle(connection, tag, name):
                    continue
                await self._dispatch(connection, tag, name, args)
            except _BadCommand as error:
                await connection.send(f"{tag} BAD {error}")

    async def _dispatch(self, connection: _Connection, tag: str, name: str,
                        args: list[str]) -> None:
        if name in ("EXAMINE", "SELECT", "IDLE", "LIST") and not connection.authenticated:
            raise _BadCommand("Not logged in.")
        if (name.startswith("UID ") or name == "FETCH") and not connection.selected:
            raise _BadCommand("No mailbox selected.")
        if name == "CAPABILITY":
            await connection.send(f"* CAPABILITY {self._capabilities()}")
            await connection.send(f"{tag} OK Capability completed.")
        elif name == "LOGIN":
            await self._login(connection, tag, args)
        elif name == "AUTHENTICATE" and self.token_valid is not None:
            await self._authenticate(connection, tag, args)
        elif name == "LIST":
            await self._list(connection, tag, args)
        elif name in ("EXAMINE", "SELECT"):
            await self._select(connection, tag, name, args)
        elif name == "UID SEARCH":
            await self._uid_search(connection, tag, args)
        elif name == "UID FETCH":
            await self._uid_fetch(connection, tag, args)
        elif name == "FETCH":
            await self._uid_fetch(connection, tag, args, by_sequence=True)
        elif name == "UID STORE":
            self.flag_changes.append(connection.line)
            if connection.read_only:
                await connection.send(f"{tag} NO [READ-ONLY] Mailbox is read-only.")
            else:
                await connection.send(f"{tag} OK Store completed.")
        elif name == "IDLE" and not self.faults.no_idle_capability:
            await self._idle(connection, tag)
        elif name == "NOOP":
            await self._report_exists(connection)
            await connection.send(f"{tag} OK NOOP completed.")
        elif name == "LOGOUT":
            await connection.send("* BYE Logging out")
            await connection.send(f"{tag} OK Logout completed.")
            raise _Disconnect
        else:
            raise _BadCommand(f"Unknown command {name}")

    async def _throttle(self, connection: _Connection, tag: str, name: str) -> bool:
        wanted = self.faults.throttle_command
        if wanted is None or " ".join(wanted.upper().split()) != name \
                or connection.throttled >= self.faults.throttle_times:
            return False
        connection.throttled += 1
        self.throttled += 1
        text = "Request is throttled."
        if self.faults.throttle_backoff_ms is not None:
            text += f" Suggested Backoff Time: {self.faults.throttle_backoff_ms} milliseconds"
        await connection.send(f"{tag} NO [{self.faults.throttle_code}] {text}")
        return True

    async def _login(self, connection: _Connection, tag: str, args: list[str]) -> None:
        if connection.authenticated or len(args) != 2:
            raise _BadCommand("LOGIN expects a user and a password")
        self.logins += 1
        if args != [self.user, self.password]:
            await connection.send(f"{tag} NO [AUTHENTICATIONFAILED] Authentication failed.")
            return
        connection.authenticated = True
        await connection.send(f"{tag} OK Logged in")

    async def _authenticate(self, connection: _Connection, tag: str, args: list[str]) -> None:
        if connection.authenticated or not 1 <= len(args) <= 2:
            raise _BadCommand("AUTHENTICATE expects a mechanism and an initial response")
        mechanism = args[0].upper()
        if mechanism not in self.oauth_mechanisms:
            await connection.send(f"{tag} NO [CANNOT] Unsupported mechanism {mechanism}")
            return
        self.authentications += 1
        if len(args) == 2:
            response = args[1]
        else:
            await connection.send("+ ")
            line = await connection.reader.readline()
            if line is None:
                raise _Disconnect
            response = line.decode(errors="replace")
        user, token = _sasl_bearer(mechanism, response)
        assert self.token_valid is not None
        if user == self.user and token is not None and self.token_valid(token):
            connection.authenticated = True
            await connection.send(f"{tag} OK [CAPABILITY {self._capabilities()}] Logged in")
            return
        self.refused_tokens += 1
        # The error continuation must be answered (an empty line, or %x01)
        # before the command completes.
        await connection.send(f"+ {_OAUTH_ERROR}")
        if await connection.reader.readline() is None:
            raise _Disconnect
        await connection.send(f"{tag} NO [AUTHENTICATIONFAILED] Invalid credentials "
                              "(Failure)")

    async def _list(self, connection: _Connection, tag: str, args: list[str]) -> None:
        # LIST reference pattern [RETURN (SPECIAL-USE)]: the flags are sent
        # either way (as Gmail does); only "*" and exact names are matched.
        if len(args) < 2:
            raise _BadCommand("LIST expects a reference and a pattern")
        pattern = args[1]
        for folder in self.folders:
            if pattern in ("*", folder.name) or (pattern == "%" and folder.delimiter
                                                 not in folder.name):
                await connection.send(f"* LIST ({' '.join(folder.attributes)}) "
                                      f"{_quote(folder.delimiter)} {_quote(folder.name)}")
        await connection.send(f"{tag} OK List completed.")

    async def _select(self, connection: _Connection, tag: str, name: str,
                      args: list[str]) -> None:
        if len(args) != 1:
            raise _BadCommand(f"{name} expects a mailbox name")
        wanted = args[0]
        if self.faults.examine_refusal is not None:
            connection.selected = False
            await connection.send(f"{tag} NO {self.faults.examine_refusal}")
            return
        if wanted != self.mailbox and not (wanted.upper() == "INBOX" == self.mailbox.upper()):
            connection.selected = False
            await connection.send(f"{tag} NO [NONEXISTENT] Mailbox doesn't exist: {wanted}")
            return
        connection.selected, connection.read_only = True, name == "EXAMINE"
        connection.exists_sent = len(self.messages)
        permanent = "()" if connection.read_only else f"({_SYSTEM_FLAGS} \\*)"
        lines = [f"* FLAGS ({_SYSTEM_FLAGS})",
                 f"* OK [PERMANENTFLAGS {permanent}] Flags permitted.",
                 f"* {self.faults.exists_override or len(self.messages)} EXISTS",
                 "* 0 RECENT"]
        if self.faults.uidvalidity is not None:
            lines.append(f"* OK [UIDVALIDITY {self.faults.uidvalidity}] UIDs valid")
        uidnext = self.faults.uidnext
        if uidnext == "auto":
            uidnext = max((m.uid for m in self.messages), default=0) + 1
        if uidnext is not None:
            lines.append(f"* OK [UIDNEXT {uidnext}] Predicted next UID")
        mode = "READ-ONLY" if connection.read_only else "READ-WRITE"
        lines.append(f"{tag} OK [{mode}] {name} completed.")
        await connection.send("".join(f"{line}\r\n" for line in lines).encode())

    async def _uid_search(self, connection: _Connection, tag: str, args: list[str]) -> None:
        if len(args) >= 2 and args[0].upper() == "CHARSET":
            args = args[2:]
        if not args:
            raise _BadCommand("SEARCH expects criteria")
        everything = {m.uid for m in self.messages}
        found = set(everything)
        criteria = iter(args)
        for key in criteria:
            if key.upper() == "UID":
                found &= resolve_uid_set(next(criteria, ""), everything)
            elif key.upper() != "ALL":
                raise _BadCommand(f"Unsupported search key {key}")
        found |= self.faults.phantom_search_uids
        await connection.send(" ".join(["* SEARCH", *map(str, sorted(found))]))
        await self._report_exists(connection)
        await connection.send(f"{tag} OK Search completed.")

    async def _uid_fetch(self, connection: _Connection, tag: str, args: list[str], *,
                         by_sequence: bool = False) -> None:
        if len(args) < 2:
            raise _BadCommand("UID FETCH expects a UID set and data items")
        items = " ".join(args[1:]).upper()
        body_item = _BODY_ITEM.search(items)
        if by_sequence:
            # A sequence set is a set over positions 1..n.
            seqs = resolve_uid_set(args[0], range(1, len(self.messages) + 1))
            chosen = {m.uid for seq, m in enumerate(self.messages, start=1) if seq in seqs}
        else:
            chosen = resolve_uid_set(args[0], (m.uid for m in self.messages))
        positions = {id(m): seq for seq, m in enumerate(self.messages, start=1)}
        found = sorted((m for m in self.messages if m.uid in chosen), key=lambda m: m.uid,
                       reverse=self.faults.descending_fetch)
        if not found and self.faults.no_for_no_match:
            await connection.send(f"{tag} NO No matching messages")
            return
        unreadable = [m for m in found if m.uid in self.faults.unreadable_uids]
        found = [m for m in found if m.uid not in self.faults.unreadable_uids]
        if body_item is not None and not body_item.group(0).startswith("BODY.PEEK"):
            self.flag_changes.append(connection.line)
            if not connection.read_only:
                for message in found:
                    message.flags.add("\\Seen")
        if self.faults.unsolicited_flags and self.messages:
            await connection.send("* 1 FETCH (FLAGS (\\Seen))")
        if self.faults.stray_tagged_reply:
            await connection.send("Z999 OK Fetch completed.")
        if self.faults.flag_update_burst:
            await connection.send("\r\n".join(f"* {n} FETCH (FLAGS (\\Seen))" for n in
                                                range(1, self.faults.flag_update_burst + 1)))
        responses = 0
        for message in found:
            if message.uid in self.faults.empty_fetch_uids:
                continue
            if responses == self.faults.bye_after_fetch_responses:
                await connection.send("* BYE Bandwidth limit exceeded, closing.")
                raise _Disconnect
            responses += 1
            if body_item is not None and self.faults.flag_update_with_uid:
                await connection.send(f"* {positions[id(message)]} FETCH (UID {message.uid} "
                                      "FLAGS (\\Seen))")
            parts = [f"UID {self.faults.report_uid.get(message.uid, message.uid)}"]
            if _FLAGS_ITEM.search(items):
                parts.append(f"FLAGS ({' '.join(sorted(message.flags))})")
            if "RFC822.SIZE" in items:
                size = message.reported_size
                if body_item is None and self.faults.probe_size is not None:
                    size = self.faults.probe_size
                elif message.uid in self.faults.lf_counted_uids and message.body is not None:
                    size = len(message.body.replace(b"\r\n", b"\n"))
                parts.append(f"RFC822.SIZE {size}")
            if "INTERNALDATE" in items:
                parts.append(f'INTERNALDATE "{message.internaldate}"')
            head = f"* {positions[id(message)]} FETCH ({' '.join(parts)}"
            if body_item is None:
                await connection.send(f"{head})")
                continue
            name = "RFC822" if body_item.group(0) == "RFC822" else "BODY[]"
            if message.body is None:
                await connection.send(f"{head} {name} NIL)")
                continue
            body = message.body
            if message.uid in self.faults.substitute_uids:
                body = substitute_body(message.uid)
            if message.uid in self.faults.quoted_body_uids:
                quoted = body.decode().replace("\\", "\\\\").replace('"', '\\"')
                await connection.send(f'{head} {name} "{quoted}")')
                continue
            announced = len(body)
            if message.uid in self.faults.lf_counted_uids:
                announced = len(body.replace(b"\r\n", b"\n"))
            start = f"{head} {name} {{{announced}}}\r\n".encode()
            if message.uid == self.faults.cut_mid_literal_uid:
                await connection.send(start + body[: len(body) // 2])
                raise _Disconnect
            await connection.send(start + body + b")\r\n")
        await self._report_exists(connection)
        if unreadable:
            await connection.send(f"{tag} NO Some messages could not be FETCHed (Failure)")
            return
        if self.faults.bye_instead_of_fetch_ok:
            await connection.send("* BYE Session limit reached, closing.")
            raise _Disconnect
        await connection.send(f"{tag} OK Fetch completed.")

    async def _report_exists(self, connection: _Connection) -> None:
        if connection.selected and connection.exists_sent != len(self.messages):
            connection.exists_sent = len(self.messages)
            await connection.send(f"* {connection.exists_sent} EXISTS")

    async def _push_exists(self, connection: _Connection) -> None:
        while True:
            changed = self._changed
            await self._report_exists(connection)
            await changed.wait()

    async def _idle(self, connection: _Connection, tag: str) -> None:
        await connection.send("+ idling")
        if self.faults.bye_after_idle is not None:
            await connection.send("* BYE Server shutting down.")
            if self.faults.bye_after_idle == "close":
                raise _Disconnect
            await self._hang(connection)
        if self.faults.idle_push is not None:
            await connection.send(self.faults.idle_push)
        async with trio.open_nursery() as nursery:
            nursery.start_soon(self._push_exists, connection)
            line = await connection.reader.readline()
            nursery.cancel_scope.cancel()
        if line is None:
            raise _Disconnect
        done = line.decode(errors="replace")
        self.commands.append(done)
        if self._silent("DONE"):
            await self._hang(connection)
        if done.strip().upper() != "DONE":
            raise _BadCommand("Expected DONE")
        await connection.send(f"{tag} OK Idle completed.")


def _sasl_bearer(mechanism: str, response: str) -> tuple[str | None, str | None]:
    """The user and bearer token of an XOAUTH2 or OAUTHBEARER initial
    response (None for what is missing or malformed)."""
    try:
        text = base64.b64decode(response.strip(), validate=True).decode("utf-8")
    except (binascii.Error, UnicodeDecodeError, ValueError):
        return None, None
    fields = text.split("\x01")
    user: str | None = None
    token: str | None = None
    if mechanism == "OAUTHBEARER":
        # gs2-header "n,a=<user>,": the authorization identity, escaped.
        for part in fields[0].split(","):
            if part.startswith("a="):
                user = part[2:].replace("=2C", ",").replace("=3D", "=")
    for part in fields[1 if mechanism == "OAUTHBEARER" else 0:]:
        if part.startswith("user=") and mechanism == "XOAUTH2":
            user = part[5:]
        elif part.startswith("auth=Bearer "):
            token = part[len("auth=Bearer "):]
    return user, token


def substitute_body(uid: int) -> bytes:
    """What Exchange / Office 365 send instead of a message they cannot convert."""
    return (f"From: Microsoft Exchange <postmaster@example.com>\r\n"
            f"Subject: Retrieval using the IMAP4 protocol failed for the following message: "
            f"{uid}\r\nContent-Type: text/plain\r\n\r\n"
            "The server couldn't retrieve the following message:\r\n\r\n"
            "The message hasn't been deleted. You might be able to view it using Outlook.\r\n"
            ).encode()


@asynccontextmanager
async def open_scripted_imap(messages: list[ScriptedMessage] | None = None, *,
                             faults: Faults | None = None, user: str = "user",
                             password: str = "secret", mailbox: str = "INBOX",
                             folders: Sequence[ListedFolder] | None = None,
                             token_valid: Callable[[str], bool] | None = None,
                             oauth_mechanisms: Sequence[str] = OAUTH_MECHANISMS,
                             ) -> AsyncIterator[ScriptedImapServer]:
    """Serve on 127.0.0.1:<free port> for the block; cancelled on exit."""
    server = ScriptedImapServer(messages, faults=faults, user=user, password=password,
                                mailbox=mailbox, folders=folders, token_valid=token_valid,
                                oauth_mechanisms=oauth_mechanisms)
    async with trio.open_nursery() as nursery:
        await nursery.start(server.serve)
        yield server
        nursery.cancel_scope.cancel()
