"""What sign-in sends never reaches an error text (found by a security
audit): errors are stored as the mailbox's last_error, logged, printed by
the CLI and returned by GET /mailboxes. And a server's text cannot start a
line of its own in them.

The servers here are scripted on a real socket, each answering the one
command under test wrongly: LOGIN or AUTHENTICATE answered under a tag
never sent (aioimaplib's exception for it quotes the pending command, the
password or the base64 token included), or a refusal that echoes what it
was sent."""

from __future__ import annotations

import base64
import re
import traceback
from collections.abc import AsyncIterator, Callable
from contextlib import asynccontextmanager
from functools import partial

import pytest
import trio

from nexarch_events.aio.imap import ImapEndpoint, ImapSession
from nexarch_events.errors import ImapError
from nexarch_events.importer.sasl import OAuthLogin

PASSWORD = "HUNTER2-imap-pw"
TOKEN = "ya29.SECRET-ACCESS-TOKEN"
CAPS = b"IMAP4rev1 SASL-IR AUTH=XOAUTH2 AUTH=OAUTHBEARER"

#: The answer to the sign-in command (LOGIN or AUTHENTICATE), given its tag.
Answer = Callable[[bytes], bytes]


@asynccontextmanager
async def scripted(answer: Answer, caps: bytes = CAPS) -> AsyncIterator[ImapEndpoint]:
    async def serve(stream: trio.SocketStream) -> None:
        await stream.send_all(b"* OK [CAPABILITY " + caps + b"] ready\r\n")
        buffer = b""
        while data := await stream.receive_some(4096):
            buffer += data
            while b"\r\n" in buffer:
                line, buffer = buffer.split(b"\r\n", 1)
                tag, _, rest = line.partition(b" ")
                if rest.upper().startswith(b"CAPABILITY"):
                    await stream.send_all(b"* CAPABILITY " + caps + b"\r\n" + tag + b" OK\r\n")
                elif rest.upper().startswith((b"LOGIN", b"AUTHENTICATE")):
                    await stream.send_all(answer(tag))

    async with trio.open_nursery() as nursery:
        listeners = await nursery.start(partial(trio.serve_tcp, serve, 0, host="127.0.0.1"))
        port = listeners[0].socket.getsockname()[1]
        yield ImapEndpoint("127.0.0.1", port, tls="plain", timeout=5)
        nursery.cancel_scope.cancel()


def everything_said(exc: BaseException) -> str:
    """The error's text and its whole traceback, chained exceptions too:
    what a log line with exc_info would print."""
    return str(exc) + "".join(traceback.format_exception(exc))


def tokens_in(text: str) -> list[str]:
    """Whatever base64 in ``text`` decodes to (an initial response)."""
    found = []
    for blob in re.findall(r"[A-Za-z0-9+/=]{24,}", text):
        try:
            found.append(base64.b64decode(blob + "=" * (-len(blob) % 4)).decode("latin-1"))
        except ValueError:
            continue
    return found


def stray(tag: bytes) -> bytes:
    return b"ZZZ9 NO [UNAVAILABLE] try later\r\n"


async def test_login_answered_under_a_stray_tag_leaves_the_password_out(aio_loop: None) -> None:
    async with scripted(stray) as endpoint:
        with pytest.raises(ImapError) as failed:
            await ImapSession.open(endpoint, "alice", PASSWORD)
    said = everything_said(failed.value)
    assert "ZZZ9 NO [UNAVAILABLE] try later" in str(failed.value)  # what happened
    assert PASSWORD not in said


@pytest.mark.parametrize("caps", ["XOAUTH2", "OAUTHBEARER"])
async def test_authenticate_answered_under_a_stray_tag_leaves_the_token_out(
        aio_loop: None, caps: str) -> None:
    async with scripted(stray, b"IMAP4rev1 SASL-IR AUTH=" + caps.encode()) as endpoint:
        with pytest.raises(ImapError) as failed:
            await ImapSession.open_sasl(endpoint, OAuthLogin("alice", TOKEN))
    said = everything_said(failed.value)
    assert TOKEN not in said
    assert not [t for t in tokens_in(said) if TOKEN in t]


async def test_a_refusal_that_echoes_the_password_is_stored_without_it(aio_loop: None) -> None:
    def echo(tag: bytes) -> bytes:
        return tag + f' NO [AUTHENTICATIONFAILED] bad password "{PASSWORD}"\r\n'.encode()

    async with scripted(echo) as endpoint:
        with pytest.raises(ImapError) as failed:
            await ImapSession.open(endpoint, "alice", PASSWORD)
    assert "bad password ***" in str(failed.value)  # its quotes went with it
    assert PASSWORD not in everything_said(failed.value)


async def test_a_server_text_with_a_line_feed_stays_one_line(aio_loop: None) -> None:
    def forged(tag: bytes) -> bytes:
        return tag + b" NO try later\n2026-12-03 level=CRITICAL logger=audit FORGED\r\n"

    async with scripted(forged) as endpoint:
        with pytest.raises(ImapError) as failed:
            await ImapSession.open(endpoint, "alice", PASSWORD)
    text = str(failed.value)
    assert "\n" not in text and "\r" not in text
    assert "try later\\x0a2026-12-03 level=CRITICAL" in text
