"""IMAP for trio: aioimaplib's protocol layer, run through trio-asyncio.

Only the wire framing of aioimaplib is used (``IMAP4ClientProtocol``: lines,
literals, tagged completion). The commands are issued here, because its
high-level client has no STARTTLS, does not quote user names, leaves EXAMINE
in the wrong state and hangs forever on a BYE during IDLE (aioimaplib #110)
or a connection cut mid-reply. Every call here therefore

- races the command against the connection's loss (a cut fails it at once),
- runs under a trio deadline (a silent server fails it after ``timeout``),
- and after any failure or cancellation marks the session broken: its
  protocol state is unknown, so it is aborted, never reused.

Replies come back raw: untagged lines as ``bytes`` and literals as
``bytearray`` (the framing keeps that distinction, which is what lets a
parser tell a message body from the text around it). Parsing them is
``nexarch_events.importer.protocol``'s job.

Secrets: aioimaplib logs every line it sends at DEBUG, and its password
scrubbing misses quoted passwords; its logger is capped at WARNING here.
"""

from __future__ import annotations

import asyncio
import base64
import binascii
import logging
import math
import re
import ssl
from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from typing import Any, Protocol, TypeVar

import trio
import trio_asyncio  # type: ignore[import-untyped]
from aioimaplib import aioimaplib  # type: ignore[import-untyped]

from ..errors import (
    ImapAuthError,
    ImapCommandError,
    ImapError,
    ImapThrottled,
    ImapTlsError,
    ImapUnavailable,
)
from ..models import escape_controls

log = logging.getLogger(__name__)
logging.getLogger("aioimaplib").setLevel(logging.WARNING)
logging.getLogger("aioimaplib.aioimaplib").setLevel(logging.WARNING)

T = TypeVar("T")

#: A reply line (``bytes``) or a literal's content (``bytearray``).
ReplyPart = bytes | bytearray

#: A literal announced larger than this is read and thrown away, never held
#: (``DiscardedLiteral``): it equals the archive's limit on one message
#: (mail/archive.py's MAX_MESSAGE_BYTES, checked by a test), so nothing the
#: archive would take is discarded, and a server that announces, or sends,
#: gigabytes costs no memory.
MAX_LITERAL_BYTES = 128 * 1024 * 1024
#: A reply line (literals aside) longer than this ends the session. The
#: longest a server needs is a UID SEARCH of a whole folder: about 9 bytes a
#: message, so this bound leaves room for a journal mailbox of over 25
#: million messages.
MAX_LINE_BYTES = 256 * 1024 * 1024
#: Untagged lines one command's reply may gather (a streamed FETCH hands
#: them on instead): past this the session ends. A server that floods a
#: reply with short lines (``* 1 EXISTS`` forever) held every one of them
#: until the command's timeout: 149 MiB in 30 s, 773 MiB of client memory.
#: A LIST of 100,000 folders or the EXPUNGEs of a mailbox of that size fit.
MAX_REPLY_LINES = 1_000_000


class DiscardedLiteral(bytearray):
    """Stands in for a literal of ``size`` bytes that was read and thrown
    away because it exceeded ``limit`` (``MAX_LITERAL_BYTES``). Empty; a
    ``bytearray`` so that the framing and every parser still see a literal."""

    def __init__(self, size: int, limit: int) -> None:
        super().__init__()
        self.size = size
        self.limit = limit

TLS_MODES = ("implicit", "starttls", "plain")

# RFC 5530 codes (and Gmail's THROTTLED) that mean "not now": the command may
# succeed when repeated later. Office 365 adds "Suggested Backoff Time: N
# milliseconds" to the text.
_THROTTLE_CODE = re.compile(rb"^\[(UNAVAILABLE|THROTTLED|LIMIT|INUSE)\b", re.IGNORECASE)
_SUGGESTED_WAIT = re.compile(rb"Suggested Backoff Time:\s*(\d{1,9})\s*(milli)?seconds?",
                             re.IGNORECASE)
_EXISTS_LINE = re.compile(rb"^(?:\* )?\d+ EXISTS\b", re.IGNORECASE)


class SaslLogin(Protocol):
    """A SASL sign-in (``AUTHENTICATE``), built above this boundary (the
    importer's OAuth2 credentials): it picks its mechanism from the server's
    capabilities and says what the server's error challenge meant."""

    @property
    def username(self) -> str:
        """For error messages: who signs in (never a secret)."""
        ...

    def credential(self, capabilities: frozenset[str], host: str, port: int
                   ) -> tuple[str, str, str]:
        """``(mechanism, base64 initial response, base64 answer to an error
        challenge)``; raises ImapAuthError when no mechanism fits."""
        ...

    def describe_failure(self, challenge: str) -> str:
        """The server's base64 error challenge in words."""
        ...


@dataclass(frozen=True, slots=True)
class ImapEndpoint:
    """Where and how to connect. ``tls``: "implicit" (port 993 style),
    "starttls", or "plain" (only when explicitly configured). Certificates
    are always verified when TLS is on: against ``ca_file`` if given, else
    the system's trust store."""

    host: str
    port: int
    tls: str = "implicit"
    ca_file: str | None = None
    #: Longest wait for connect, greeting, login or one command.
    timeout: float = 30.0

    def __post_init__(self) -> None:
        if self.tls not in TLS_MODES:
            raise ValueError(f"tls must be one of {', '.join(TLS_MODES)}, got {self.tls!r}")

    def describe(self) -> str:
        return f"{self.host}:{self.port} ({self.tls})"


def _ssl_context(endpoint: ImapEndpoint) -> ssl.SSLContext:
    ctx = ssl.create_default_context(ssl.Purpose.SERVER_AUTH, cafile=endpoint.ca_file)
    ctx.minimum_version = ssl.TLSVersion.TLSv1_2
    return ctx


def quote(value: str) -> str:
    """An IMAP quoted string (RFC 3501 §4.3). Refuses what a quoted string
    cannot carry, instead of sending something else."""
    if any(ch in value for ch in "\r\n\x00") or not value.isascii():
        raise ImapError("value has CR, LF, NUL or non-ASCII characters, which an IMAP "
                        "quoted string cannot carry")
    return '"' + value.replace("\\", "\\\\").replace('"', '\\"') + '"'


class ImapSession:
    """One logged-in IMAP connection. Not safe for concurrent use: one
    command at a time, from one trio task. Close with :meth:`aclose`."""

    def __init__(self, endpoint: ImapEndpoint, protocol: Any, lost: asyncio.Event) -> None:
        self.endpoint = endpoint
        self._protocol = protocol
        self._lost = lost
        self._broken: str | None = None
        #: What sign-in sent that must never appear in an error (see _redact).
        self._secrets: tuple[str, ...] = ()

    # -- opening -----------------------------------------------------------

    @classmethod
    async def open(cls, endpoint: ImapEndpoint, username: str, password: str) -> ImapSession:
        """Connect, (STARTTLS,) log in. Blocks up to ``endpoint.timeout`` per
        step. Raises ImapUnavailable, ImapTlsError or ImapAuthError. The
        caller owns the session and must ``aclose()`` it."""
        user_arg, password_arg = quote(username), quote(password)

        async def login(session: ImapSession) -> str | None:
            session._keep_secret(password, password_arg)
            result, lines = await session._call(session._command_sync, "LOGIN", user_arg,
                                                password_arg, scrub=password_arg)
            return None if result == "OK" else f"login as {username!r} refused: {_text(lines)}"

        return await cls._open(endpoint, login)

    @classmethod
    async def open_sasl(cls, endpoint: ImapEndpoint, login: SaslLogin) -> ImapSession:
        """Like :meth:`open`, signing in with ``AUTHENTICATE`` (SASL-IR where
        the server offers it). A refusal fails at once with the server's
        reason: the error challenge is answered, never left to time out."""

        async def authenticate(session: ImapSession) -> str | None:
            caps = session.capabilities
            mechanism, initial, ack = login.credential(caps, endpoint.host, endpoint.port)
            session._keep_secret(initial, *_sasl_secrets(initial))
            result, lines, challenges = await session._call(
                session._authenticate, mechanism, initial, ack, "SASL-IR" in caps)
            if result == "OK":
                return None
            why = login.describe_failure(challenges[-1]) if challenges else _text(lines)
            return (f"{mechanism} sign-in as {login.username!r} refused: {why} "
                    f"({_text(lines)})")

        return await cls._open(endpoint, authenticate)

    @classmethod
    async def _open(cls, endpoint: ImapEndpoint,
                    sign_in: Callable[[ImapSession], Awaitable[str | None]]) -> ImapSession:
        holder: list[ImapSession] = []
        try:
            with trio.fail_after(endpoint.timeout):
                protocol, lost = await trio_asyncio.aio_as_trio(_aio_connect)(endpoint)
            session = cls(endpoint, protocol, lost)
            holder.append(session)
            if endpoint.tls == "starttls":
                await session._starttls()
            refused = await sign_in(session)
        except trio.TooSlowError:
            for s in holder:
                s.abort()
            raise ImapUnavailable(f"{endpoint.describe()}: no greeting within "
                                  f"{endpoint.timeout:g} s") from None
        except BaseException as exc:
            for s in holder:
                s.abort()
                if isinstance(exc, ImapError):
                    s._scrub(exc)
            raise
        if refused is not None:
            session.abort()
            raise ImapAuthError(f"{endpoint.describe()}: {session._redact(refused)}")
        protocol.state = aioimaplib.AUTH
        await session._refresh_capabilities()
        return session

    async def _starttls(self) -> None:
        if "STARTTLS" not in self.capabilities:
            self.abort()
            raise ImapTlsError(f"{self.endpoint.describe()}: server does not offer STARTTLS; "
                               "use tls=implicit, or tls=plain only on a trusted network")
        result, lines = await self._call(self._command_sync, "STARTTLS")
        if result != "OK":
            self.abort()
            raise ImapTlsError(f"{self.endpoint.describe()}: STARTTLS refused: {_text(lines)}")
        await self._call(self._upgrade_tls)
        await self._refresh_capabilities()

    # -- the commands the importer needs -----------------------------------

    @property
    def capabilities(self) -> frozenset[str]:
        return frozenset(c.upper() for c in self._protocol.capabilities)

    @property
    def exists_seen(self) -> int:
        """How many ``* n EXISTS`` the server sent on this session so far, in
        any reply (aioimaplib drops those that arrive during FETCH or SEARCH;
        they mean new mail arrived while we were busy)."""
        count: int = self._protocol.exists_seen
        return count

    @property
    def broken(self) -> str | None:
        """Why this session may not be used any more, or None."""
        return self._broken

    async def examine(self, mailbox_arg: str) -> list[ReplyPart]:
        """EXAMINE (read-only SELECT): fetching never changes flags. Returns the
        untagged lines; raises ImapCommandError on NO/BAD (no such mailbox)."""
        lines = await self._ok(f"EXAMINE {mailbox_arg}", self._command_sync, "EXAMINE",
                               mailbox_arg)
        self._protocol.state = aioimaplib.SELECTED
        return lines

    async def uid_search(self, criteria: str) -> list[ReplyPart]:
        """``UID SEARCH <criteria>``, e.g. ``"UID 5:*"`` or ``"ALL"``; returns
        the untagged data (UIDs, without the SEARCH keyword)."""
        return await self._ok(f"UID SEARCH {criteria}", self._uid_search, criteria)

    async def uid_fetch(self, uid_set: str, items: str, *,
                        limit: float | None = None) -> list[ReplyPart]:
        return await self._ok(f"UID FETCH {_short(uid_set)} {items}", self._fetch, uid_set,
                              items, True, limit=limit)

    async def uid_fetch_each(self, uid_set: str, items: str,
                             on_response: Callable[[list[ReplyPart]], Awaitable[None]], *,
                             limit: float | None = None, hold: int | None = None) -> None:
        """``UID FETCH``, handing each FETCH response (its parts, as
        :meth:`uid_fetch` would return them) to ``on_response`` as soon as it
        is complete, while the rest of the reply still arrives; responses in
        server order, one ``on_response`` at a time. A reply cut mid-way
        (``* BYE``, a reset) has had every response completed before the cut
        handed over when ImapUnavailable is raised. If ``on_response``
        raises, the command is abandoned (the session is then broken) and
        the error propagates. Memory: one response at a time is kept by the
        framing, plus what ``on_response`` has not consumed yet: at most
        ``hold`` bytes in two responses or more (one alone is always
        handed over). Past it the session is refused (ImapUnavailable): a
        server that understated its sizes filled memory as fast as the
        network allowed while each message waited for Postgres (a review)."""
        # Parts are grouped into responses where they arrive (on the asyncio
        # side, in the framing's callback), so the consumer wakes once per
        # response, not once per line and literal.
        send, receive = trio.open_memory_channel[list[ReplyPart]](math.inf)
        failed: list[ImapError] = []
        group: list[ReplyPart] = []
        #: complete responses waiting in the channel, and their bytes
        waiting = waiting_bytes = 0

        def put(response: list[ReplyPart]) -> None:
            nonlocal waiting, waiting_bytes
            send.send_nowait(response)
            waiting += 1
            waiting_bytes += _size(response)
            if hold is not None and waiting > 1 and waiting_bytes > hold:
                self._protocol._refuse(
                    f"{waiting_bytes} bytes in {waiting} messages arrived faster than they "
                    f"could be stored, more than {hold}: the server's RFC822.SIZEs were wrong")

        def add(part: ReplyPart) -> None:
            nonlocal group
            if isinstance(part, bytes) and _FETCH_LINE.match(part) and group:
                put(group)  # a response without a closing line
                group = []
            group.append(part)
            if _complete(group):
                put(group)
                group = []

        async def command() -> None:
            nonlocal group
            try:
                await self._ok(f"UID FETCH {_short(uid_set)} {items}", self._fetch, uid_set,
                               items, True, add, limit=limit)
                if group:  # the reply ended inside a response: what there is
                    put(group)
            except ImapError as exc:
                failed.append(exc)
            finally:
                group = []
                send.close()

        consumer_error: list[Exception] = []
        async with trio.open_nursery() as nursery:
            nursery.start_soon(command)
            try:
                async for response in receive:
                    waiting -= 1
                    waiting_bytes -= _size(response)
                    await on_response(response)
            except Exception as exc:
                # Raised below, as itself: not wrapped in the nursery's
                # ExceptionGroup, so callers sort it like any other error.
                consumer_error.append(exc)
                nursery.cancel_scope.cancel()
        if consumer_error:
            raise consumer_error[0]
        if failed:
            raise failed[0]

    async def fetch(self, seq_set: str, items: str, *,
                    limit: float | None = None) -> list[ReplyPart]:
        return await self._ok(f"FETCH {_short(seq_set)} {items}", self._fetch, seq_set, items,
                              False, limit=limit)

    async def list_folders(self) -> list[ReplyPart]:
        """``LIST "" "*"``: every folder, with its special use (RFC 6154)
        where the server can return it (LIST-EXTENDED)."""
        args = ['""', '"*"']
        if {"SPECIAL-USE", "LIST-EXTENDED"} <= self.capabilities:
            args.append("RETURN (SPECIAL-USE)")
        return await self._ok("LIST " + " ".join(args), self._command_async, "LIST", *args)

    async def noop(self) -> list[ReplyPart]:
        return await self._ok("NOOP", self._command_async, "NOOP")

    async def idle(self, max_wait: float) -> list[bytes]:
        """IDLE until the server pushes something other than an untagged OK
        (a keepalive) or ``max_wait`` passes, then DONE. Returns the pushed
        lines (none but keepalives on timeout). A BYE, a cut or a
        server that does not confirm DONE raises ImapUnavailable."""
        if "IDLE" not in self.capabilities:
            raise ImapCommandError(f"{self.endpoint.describe()}: server has no IDLE")
        pushed: list[bytes] = await self._call(self._idle, max_wait,
                                               limit=max_wait + self.endpoint.timeout)
        for line in pushed:
            if line.upper().startswith(b"BYE"):
                self._break("server said BYE during IDLE")
                raise ImapUnavailable(f"{self.endpoint.describe()}: server ended the IDLE "
                                      f"session: {line[:200]!r}")
        return pushed

    async def aclose(self) -> None:
        """LOGOUT, bounded (shielded, at most 2 s); the socket is closed either way."""
        if self._broken is None:
            with trio.move_on_after(2, shield=True):
                try:
                    await self._call(self._command_sync, "LOGOUT", limit=2)
                except ImapError:
                    pass
        self.abort()

    def abort(self) -> None:
        """Drop the connection now."""
        if self._broken is None:
            self._broken = "closed"
        transport = self._protocol.transport
        if transport is not None:
            transport.abort()

    # -- trio side -----------------------------------------------------------

    async def _ok(self, what: str, fn: Callable[..., Awaitable[tuple[str, list[ReplyPart]]]],
                  *args: object, limit: float | None = None) -> list[ReplyPart]:
        """``what`` names the command in errors, as an operator would type it."""
        result, lines = await self._call(fn, *args, limit=limit)
        if result != "OK":
            message = self._redact(f"{self.endpoint.describe()}: {what} answered {result}: "
                                   f"{_text(lines)}")
            last = bytes(lines[-1]) if lines else b""
            code = _THROTTLE_CODE.match(last)
            if result == "NO" and (code is not None or b"throttl" in last.lower()):
                suggested = _SUGGESTED_WAIT.search(last)
                wait = None
                if suggested is not None:
                    wait = int(suggested.group(1)) / (1000 if suggested.group(2) else 1)
                raise ImapThrottled(f"throttled: {message}",
                                    code=code.group(1).decode().upper() if code else "THROTTLED",
                                    wait=wait)
            raise ImapCommandError(message, result=result)
        # The last part is the tagged completion's text.
        return lines[:-1]

    def _keep_secret(self, *secrets: str) -> None:
        # Longest first: a quoted password goes with its quotes, the same
        # way every time (a set's order is not).
        self._secrets = tuple(sorted({s for s in (*self._secrets, *secrets) if len(s) >= 4},
                                     key=lambda s: (-len(s), s)))

    def _redact(self, text: str) -> str:
        """``text`` without what sign-in sent (a password, a token): an
        error text is stored, logged and shown by the API. aioimaplib puts a
        command with its arguments into some of its errors, and a hostile
        server may echo what it was sent."""
        for secret in self._secrets:
            text = text.replace(secret, "***")
        return text

    def _scrub(self, exc: ImapError) -> ImapError:
        exc.args = tuple(self._redact(a) if isinstance(a, str) else a for a in exc.args)
        return exc

    async def _call(self, fn: Callable[..., Awaitable[T]], *args: object,
                    limit: float | None = None, scrub: str | None = None) -> T:
        try:
            return await self._call_unscrubbed(fn, *args, limit=limit, scrub=scrub)
        except ImapError as exc:
            self._scrub(exc)
            raise

    async def _call_unscrubbed(self, fn: Callable[..., Awaitable[T]], *args: object,
                               limit: float | None = None, scrub: str | None = None) -> T:
        if self._broken is not None:
            raise ImapUnavailable(f"{self.endpoint.describe()}: session unusable "
                                  f"({self._broken})")
        if limit is None:
            limit = self.endpoint.timeout
        kwargs = {} if scrub is None else {"scrub": scrub}
        try:
            with trio.fail_after(limit):
                result: T = await trio_asyncio.aio_as_trio(self._race)(fn, *args, **kwargs)
                return result
        except trio.TooSlowError:
            self._break(f"no answer within {limit:g} s")
            raise ImapUnavailable(f"{self.endpoint.describe()}: no answer within "
                                  f"{limit:g} s") from None
        except trio.Cancelled:
            self._break("cancelled mid-command")
            raise
        except ImapError:
            raise
        except Exception as exc:
            self._break(_describe(exc))
            error = _translate(self.endpoint, exc)
            bye = self._protocol.bye
            refused = self._protocol.refused
            if refused and type(error) is ImapUnavailable:
                error = ImapUnavailable(f"{self.endpoint.describe()}: connection closed by this "
                                        f"client: {refused}")
            elif bye and type(error) is ImapUnavailable:
                error = ImapUnavailable(f"{error} (the server said BYE: {bye})")
            # aioimaplib's exception stays out of the chain: its text quotes
            # the command, and a traceback of this error may be logged.
            raise error from (None if _quotes_commands(exc) else exc)

    def _break(self, why: str) -> None:
        if self._broken is None:
            self._broken = why
        transport = self._protocol.transport
        if transport is not None:
            transport.abort()

    async def _refresh_capabilities(self) -> None:
        await self._call(self._protocol.capability)

    # -- asyncio side (run through trio_asyncio) ---------------------------

    async def _race(self, fn: Callable[..., Awaitable[T]], *args: object,
                    **kwargs: object) -> T:
        op = asyncio.ensure_future(fn(*args, **kwargs))
        lost = asyncio.ensure_future(self._lost.wait())
        try:
            await asyncio.wait({op, lost}, return_when=asyncio.FIRST_COMPLETED)
        finally:
            lost.cancel()
            if not op.done():
                op.cancel()
        if op.done() and not op.cancelled():
            return op.result()
        raise ConnectionResetError("connection closed by the server")

    async def _command_sync(self, name: str, *args: str,
                            scrub: str | None = None) -> tuple[str, list[ReplyPart]]:
        p = self._protocol
        cmd = aioimaplib.Command(name, p.new_tag(), *args, loop=p.loop)
        response = await p.execute(cmd, scrub=scrub)
        return response.result, list(response.lines)

    async def _authenticate(self, mechanism: str, initial: str, ack: str, sasl_ir: bool
                            ) -> tuple[str, list[ReplyPart], list[str]]:
        p = self._protocol
        cmd = _SaslCommand(p.new_tag(), mechanism, initial, ack, sasl_ir, p, loop=p.loop)
        response = await p.execute(cmd, scrub=initial)
        return response.result, list(response.lines), cmd.challenges

    async def _command_async(self, name: str, *args: str) -> tuple[str, list[ReplyPart]]:
        p = self._protocol
        cmd = aioimaplib.Command(name, p.new_tag(), *args, loop=p.loop)
        response = await p.execute(cmd)
        return response.result, list(response.lines)

    async def _uid_search(self, criteria: str) -> tuple[str, list[ReplyPart]]:
        p = self._protocol
        cmd = aioimaplib.Command("SEARCH", p.new_tag(), criteria, prefix="UID", loop=p.loop)
        response = await p.execute(cmd)
        return response.result, list(response.lines)

    async def _fetch(self, message_set: str, items: str, by_uid: bool,
                     sink: Callable[[ReplyPart], None] | None = None
                     ) -> tuple[str, list[ReplyPart]]:
        p = self._protocol
        prefix = "UID" if by_uid else None
        cmd = aioimaplib.FetchCommand(p.new_tag(), message_set, items, prefix=prefix,
                                      loop=p.loop) if sink is None else \
            _StreamingFetch(sink, p.new_tag(), message_set, items, prefix=prefix, loop=p.loop)
        response = await p.execute(cmd)
        return response.result, list(response.lines)

    async def _upgrade_tls(self) -> None:
        p = self._protocol
        loop = asyncio.get_running_loop()
        p.transport = await loop.start_tls(p.transport, p, _ssl_context(self.endpoint),
                                           server_hostname=self.endpoint.host,
                                           ssl_handshake_timeout=self.endpoint.timeout)

    async def _idle(self, max_wait: float) -> list[bytes]:
        p = self._protocol
        while not p.idle_queue.empty():
            p.idle_queue.get_nowait()
        cmd = aioimaplib.IdleCommand(p.new_tag(), p.idle_queue, loop=p.loop)
        running = asyncio.ensure_future(p.execute(cmd))
        try:
            started = asyncio.ensure_future(p.wait_for_idle_response())
            await asyncio.wait({running, started}, return_when=asyncio.FIRST_COMPLETED)
            started.cancel()
            if running.done():
                response = running.result()
                raise ImapCommandError(f"IDLE answered {response.result}: "
                                       f"{_text(list(response.lines))}")
            pushed: list[bytes] = []
            ends = p.loop.time() + max_wait
            # Untagged OK lines announce nothing about the mailbox (Dovecot's
            # "* OK Still here" every 2 minutes): IDLE goes on. A server that
            # sent one at once made every IDLE end at once, and each a sync:
            # 120 syncs a second (a retry-loop audit).
            while not pushed or all(_keepalive(line) for line in pushed):
                left = ends - p.loop.time()
                if left <= 0:
                    break
                try:
                    batch = await asyncio.wait_for(p.idle_queue.get(), left)
                except TimeoutError:
                    break
                pushed.extend(bytes(line) for line in batch)
            if any(line.upper().startswith(b"BYE") for line in pushed):
                return pushed
            p.idle_done()
            await running
            while not p.idle_queue.empty():
                pushed.extend(bytes(line) for line in p.idle_queue.get_nowait())
            return pushed
        finally:
            if not running.done():
                running.cancel()


def _keepalive(line: bytes) -> bool:
    """An untagged OK during IDLE: a keepalive or a notice, no mail event."""
    return line[:3].upper() in (b"OK", b"OK ")


class _SaslCommand(aioimaplib.Command):  # type: ignore[misc]
    """``AUTHENTICATE`` that answers the server's continuations: the first
    (empty) one with the credential when there is no SASL-IR, an error
    challenge with the mechanism's acknowledgement, after which the server
    completes the command with NO. aioimaplib appends a continuation to the
    pending command and calls ``flush``; it answers none by itself."""

    def __init__(self, tag: str, mechanism: str, initial: str, ack: str, sasl_ir: bool,
                 protocol: Any, loop: asyncio.AbstractEventLoop) -> None:
        args = (mechanism, initial) if sasl_ir else (mechanism,)
        super().__init__("AUTHENTICATE", tag, *args, loop=loop)
        self._protocol = protocol
        self._unsent: str | None = None if sasl_ir else initial
        self._ack = ack
        self.challenges: list[str] = []

    def flush(self) -> None:
        line = self._resp_lines[-1] if self._resp_lines else b""
        if not isinstance(line, bytes) or not line.startswith(b"+"):
            return
        if self._unsent is not None:
            answer, self._unsent = self._unsent, None
        else:
            self.challenges.append(line[1:].strip().decode("ascii", "replace"))
            answer = self._ack
        self._protocol.transport.write(answer.encode("ascii") + b"\r\n")


async def _aio_connect(endpoint: ImapEndpoint) -> tuple[Any, asyncio.Event]:
    loop = asyncio.get_running_loop()
    lost = asyncio.Event()
    protocol = _Protocol(loop, lambda _exc: lost.set())
    ctx = _ssl_context(endpoint) if endpoint.tls == "implicit" else None
    try:
        await loop.create_connection(lambda: protocol, endpoint.host, endpoint.port, ssl=ctx,
                                     ssl_handshake_timeout=endpoint.timeout if ctx else None)
    except ssl.SSLCertVerificationError as exc:
        raise ImapTlsError(f"{endpoint.describe()}: certificate not trusted: "
                           f"{exc.verify_message}; pass the CA with ca_file") from exc
    except (OSError, ssl.SSLError) as exc:
        raise ImapUnavailable(f"{endpoint.describe()}: cannot connect: "
                              f"{type(exc).__name__}: {exc}") from exc
    # The greeting makes aioimaplib ask for CAPABILITY; NONAUTH after both.
    # Until it is returned the connection is this function's to close: the
    # greeting's timeout cancels it here, before any session holds it (a
    # server that never greets leaked one socket per attempt).
    greeted = asyncio.ensure_future(protocol.wait(f"{aioimaplib.NONAUTH}|{aioimaplib.AUTH}"))
    gone = asyncio.ensure_future(lost.wait())
    try:
        try:
            await asyncio.wait({greeted, gone}, return_when=asyncio.FIRST_COMPLETED)
        finally:
            gone.cancel()
            if not greeted.done():
                greeted.cancel()
        if not greeted.done() or greeted.cancelled():
            raise ImapUnavailable(
                f"{endpoint.describe()}: connection closed before the greeting")
    except BaseException:
        protocol.transport.abort()
        raise
    return protocol, lost


class _Protocol(aioimaplib.IMAP4ClientProtocol):  # type: ignore[misc]
    """aioimaplib's framing, counting the EXISTS it would otherwise drop."""

    def __init__(self, *args: Any) -> None:
        super().__init__(*args)
        self.exists_seen = 0
        #: The text of a ``* BYE`` the server sent (why it is about to close).
        self.bye: str | None = None
        #: The start of a line the next read continues (a bytearray while it
        #: spans several reads).
        self.incomplete_line: bytes | bytearray = b""
        #: Why the framing closed the connection itself (a reply it refuses).
        self.refused: str | None = None
        # An oversized literal being skipped: bytes still to come, its
        # stand-in and the command it goes to.
        self._skip = 0
        self._skipped: DiscardedLiteral | None = None
        self._skip_cmd: Any = None

    def data_received(self, data: bytes) -> None:
        """aioimaplib's framing, walked in a loop instead of its recursion
        (one call per line: a read of more than about 1,000 short lines,
        e.g. a burst of flag updates or EXPUNGEs, raised RecursionError and
        cost the session; and every line copied the rest of the read, so a
        read of n lines cost O(n^2)), and without its DEBUG line that
        formatted every read (bodies included) whether logged or not.
        The same methods are called in the same order as there.

        Two bounds aioimaplib does not have: a literal over
        ``MAX_LITERAL_BYTES`` is skipped as it arrives and handed over as a
        ``DiscardedLiteral``, and a line over ``MAX_LINE_BYTES`` closes the
        connection (``refused`` says why). A line that spans reads is
        gathered in a bytearray, not re-copied on every read."""
        if self.refused is not None:
            return
        pending = self.incomplete_line
        if pending and b"\r\n" not in data and not (pending[-1:] == b"\r"
                                                   and data[:1] == b"\n"):
            # The line does not end in this read (nor across its start).
            if not isinstance(pending, bytearray):
                pending = self.incomplete_line = bytearray(pending)
            pending += data
            if len(pending) > MAX_LINE_BYTES:
                self._refuse_long_line()
            return
        # Lines must be bytes whatever the transport hands over: a
        # bytearray is what a literal's content is (ReplyPart).
        raw = b"".join((pending, data)) if pending else bytes(data)
        view = memoryview(raw)  # literal slices without copies
        cmd: Any = self.current_command  # type: ignore[has-type]
        pos = 0
        line = b""
        try:
            while True:
                if self._skip:
                    pos = self._skip_literal(raw, pos)
                    if self._skip:
                        raise aioimaplib.IncompleteRead(cmd)
                if pos == len(raw):
                    if self.pending_sync_command is not None:
                        self.pending_sync_command.flush()
                    if cmd is not None and cmd.wait_data():
                        raise aioimaplib.IncompleteRead(cmd)
                    break
                if cmd is not None and cmd.wait_literal_data():
                    pos = len(raw) - len(cmd.append_literal_data(view[pos:]))
                    if cmd.wait_literal_data():
                        raise aioimaplib.IncompleteRead(cmd)
                end = raw.find(b"\r\n", pos)
                if end < 0:
                    if len(raw) - pos > MAX_LINE_BYTES:
                        self._refuse_long_line()
                        return
                    raise aioimaplib.IncompleteRead(cmd, raw[pos:])
                line = raw[pos:end]
                pos = end + 2
                handled = self._handle_line(line, cmd)
                literal = aioimaplib.literal_data_re.match(line)
                if literal:
                    if handled is None:
                        handled = aioimaplib.Command("NIL", "unused")
                    size = int(literal.group("size"))
                    if size > MAX_LITERAL_BYTES:
                        self._skip = size
                        self._skipped = DiscardedLiteral(size, MAX_LITERAL_BYTES)
                        self._skip_cmd = handled
                    else:
                        handled.begin_literal_data(size)
                    cmd = handled
                elif handled is not None and handled.wait_data():
                    cmd = handled
                else:
                    cmd = None
        except aioimaplib.IncompleteRead as incomplete:
            self.current_command = incomplete.cmd
            self.incomplete_line = incomplete.data
        except aioimaplib.AioImapException as exc:
            # E.g. a tagged reply to no command sent: raised out of here, it
            # reached asyncio as a fatal transport error and the session
            # ended as "closed by the server". Ours to close, with the reason.
            # Not aioimaplib's text: it quotes the pending command, LOGIN's
            # password included. The line the server sent says what happened.
            self._refuse(f"the server broke the protocol ({type(exc).__name__}) with the line "
                         f"{_one_line(bytes(line))[:200]!r}")
        else:
            self.incomplete_line = b""
            self.current_command = None

    def _skip_literal(self, raw: bytes, pos: int) -> int:
        """Skip what ``raw`` holds of an oversized literal from ``pos``; once
        all of it has gone by, hand its stand-in to its command."""
        taken = min(self._skip, len(raw) - pos)
        self._skip -= taken
        cmd = self._skip_cmd
        if self._skip:
            cmd._reset_timer()  # data is arriving: the command is not stuck
        else:
            cmd.append_to_resp(self._skipped)
            self._skip_cmd = self._skipped = None
        return pos + taken

    def _refuse_long_line(self) -> None:
        self._refuse(f"the server sent a line of more than {MAX_LINE_BYTES} bytes")

    def _refuse(self, why: str) -> None:
        self.refused = why
        self.incomplete_line = b""
        if self.transport is not None:
            self.transport.abort()

    def _untagged_response(self, line: bytes) -> Any:
        """aioimaplib's, except that only the leading ``* `` goes: its
        ``line.replace(b"* ", b"")`` removed every one, so a folder listed
        as ``"* Wichtig"`` came out as "Wichtig" and its mail was never
        archived. Counts EXISTS and keeps a BYE's text."""
        if _EXISTS_LINE.match(line):
            self.exists_seen += 1
        elif line[:6].upper() == b"* BYE ":
            self.bye = bytes(line[6:206]).decode("utf-8", "replace")
        if line.startswith(b"* "):
            line = line[2:]
        if self.pending_sync_command is not None:
            return self._gather(self.pending_sync_command, line)
        match = aioimaplib.message_data_re.match(line)
        if match:  # "3 FETCH ...", "3 EXPUNGE": the whole line
            name, text = match.group(1), line
        else:  # "SEARCH 1 2", "LIST (...) ...": what follows the name
            name, _, text = line.partition(b" ")
        command = self.pending_async_commands.get(name.decode("ascii", "replace").upper())
        if command is not None:
            return self._gather(command, text)
        # Servers may send untagged data at any time; NOOP collects it.
        command = self.pending_async_commands.get("NOOP")
        if command is not None:
            return self._gather(command, line)
        return command

    def _gather(self, command: Any, line: bytes) -> Any:
        """``line`` for ``command``'s reply, counted against
        ``MAX_REPLY_LINES`` (a streamed FETCH keeps none of them)."""
        if not isinstance(command, _StreamingFetch):
            gathered = getattr(command, "_nexarch_lines", 0) + 1
            command._nexarch_lines = gathered
            if gathered > MAX_REPLY_LINES:
                self._refuse(f"the server sent more than {MAX_REPLY_LINES} untagged lines in "
                             f"the reply to {command.name}")
                return None
        command.append_to_resp(line)
        return command


class _StreamingFetch(aioimaplib.FetchCommand):  # type: ignore[misc]
    """A FETCH whose reply parts go to ``sink`` as they arrive. Of its own
    lines it keeps only those since the last FETCH response began (all the
    framing needs to tell whether a response is complete), so a batch's
    bodies are never all held at once."""

    def __init__(self, sink: Callable[[ReplyPart], None], *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self._sink = sink

    def append_to_resp(self, line: ReplyPart, result: str = "Pending") -> None:
        if result == "Pending":
            if isinstance(line, bytes) and _FETCH_LINE.match(line):
                self._resp_lines.clear()
            self._sink(line if isinstance(line, bytearray) else bytes(line))
        super().append_to_resp(line, result)


_FETCH_LINE = re.compile(rb"^\d+ FETCH \(", re.IGNORECASE)


def _complete(group: list[ReplyPart]) -> bool:
    """Whether the FETCH response in ``group`` has ended: its text (literals
    left out) closes every parenthesis it opened, and it does not end
    announcing a literal."""
    if not group or not isinstance(group[-1], bytes) or group[-1].rstrip().endswith(b"}"):
        return False
    text = b"".join(p for p in group if isinstance(p, bytes))
    return text.count(b"(") <= text.count(b")")


def _size(response: list[ReplyPart]) -> int:
    """Bytes a response holds (its lines and literals)."""
    return sum(len(p) for p in response if isinstance(p, (bytes, bytearray)))


def _short(message_set: str) -> str:
    return message_set if len(message_set) <= 60 else message_set[:57] + "..."


def _translate(endpoint: ImapEndpoint, exc: BaseException) -> ImapError:
    where = endpoint.describe()
    if isinstance(exc, ssl.SSLCertVerificationError):
        return ImapTlsError(f"{where}: certificate not trusted: {exc.verify_message}")
    if isinstance(exc, ssl.SSLError):
        return ImapTlsError(f"{where}: TLS failed: {exc}")
    if isinstance(exc, (OSError, EOFError, asyncio.TimeoutError, aioimaplib.CommandTimeout)):
        return ImapUnavailable(f"{where}: connection lost: {_describe(exc)}")
    if isinstance(exc, aioimaplib.AioImapException):
        return ImapUnavailable(f"{where}: protocol state lost: {_describe(exc)}")
    return ImapUnavailable(f"{where}: {_describe(exc)}")


def _quotes_commands(exc: BaseException) -> bool:
    """aioimaplib's exceptions: their texts quote the command, arguments
    and all (LOGIN's password)."""
    return isinstance(exc, (aioimaplib.AioImapException, aioimaplib.CommandTimeout))


def _describe(exc: BaseException) -> str:
    """An exception for an error text: aioimaplib's by type only."""
    if _quotes_commands(exc):
        return type(exc).__name__
    return f"{type(exc).__name__}: {exc}"


def _one_line(raw: bytes) -> str:
    """A server's text as one line: control characters (a bare LF would
    start a forged line in a log) written as escapes."""
    return escape_controls(raw.decode("utf-8", "replace"))


def _sasl_secrets(initial: str) -> list[str]:
    """The token inside a base64 SASL initial response (XOAUTH2,
    OAUTHBEARER: ``auth=Bearer <token>``), for _redact."""
    try:
        decoded = base64.b64decode(initial, validate=True).decode("utf-8", "replace")
    except (ValueError, binascii.Error):
        return []
    return re.findall(r"auth=Bearer ([^\x01]+)", decoded)


def _text(lines: list[ReplyPart]) -> str:
    if not lines:
        return "(no text)"
    return _one_line(bytes(lines[-1]))[:300]
