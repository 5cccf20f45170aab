"""The scripted IMAP server (tests/support/imap_script.py), driven by a raw
trio socket client so its wire format is checked byte for byte."""

from __future__ import annotations

import re
import socket
import struct
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager

import pytest
import trio

from tests.support.imap_script import (
    Faults,
    ScriptedImapServer,
    ScriptedMessage,
    open_scripted_imap,
    resolve_uid_set,
)

_LITERAL_END = re.compile(rb"\{(\d+)\}$")


class RawClient:
    """Reads whole responses: a line ending in ``{n}`` is joined with its n
    bytes of literal and the rest of the response line."""

    def __init__(self, stream: trio.SocketStream) -> None:
        self.stream = stream
        self.buffer = bytearray()
        self.tags = 0

    async def _fill(self) -> None:
        data = await self.stream.receive_some(65536)
        if not data:
            raise EOFError(bytes(self.buffer))
        self.buffer += data

    async def line(self) -> bytes:
        with trio.fail_after(5):
            return await self._response_line()

    async def _response_line(self) -> bytes:
        while (end := self.buffer.find(b"\r\n")) < 0:
            await self._fill()
        line = bytes(self.buffer[:end])
        del self.buffer[: end + 2]
        if literal := _LITERAL_END.search(line):
            size = int(literal.group(1))
            while len(self.buffer) < size:
                await self._fill()
            data = bytes(self.buffer[:size])
            del self.buffer[:size]
            line += b"\r\n" + data + await self._response_line()
        return line

    async def send(self, data: bytes) -> None:
        await self.stream.send_all(data)

    async def command(self, text: str) -> list[bytes]:
        """Send ``<tag> text``; every response line up to and including the tagged one."""
        self.tags += 1
        tag = f"A{self.tags}"
        await self.send(f"{tag} {text}\r\n".encode())
        lines = []
        while True:
            lines.append(await self.line())
            if lines[-1].startswith(f"{tag} ".encode()):
                return lines

    async def is_silent(self, seconds: float = 0.2) -> bool:
        """Nothing arrives for ``seconds`` and the socket stays open."""
        with trio.move_on_after(seconds):
            await self._fill()
            return False
        return not self.buffer

    async def at_eof(self) -> bytes:
        """Everything left before the server closed the connection."""
        with trio.fail_after(5):
            while data := await self.stream.receive_some(65536):
                self.buffer += data
        return bytes(self.buffer)


@asynccontextmanager
async def connect(server: ScriptedImapServer) -> AsyncIterator[RawClient]:
    stream = await trio.open_tcp_stream(server.host, server.port)
    async with stream:
        client = RawClient(stream)
        assert (await client.line()).startswith(b"* OK ")
        yield client


@asynccontextmanager
async def selected(server: ScriptedImapServer) -> AsyncIterator[RawClient]:
    async with connect(server) as client:
        assert (await client.command('LOGIN user "secret"'))[-1] == b"A1 OK Logged in"
        assert (await client.command('EXAMINE "INBOX"'))[-1].startswith(b"A2 OK ")
        yield client


def messages(*uids: int) -> list[ScriptedMessage]:
    return [ScriptedMessage(uid, f"Subject: {uid}\r\n\r\nbody {uid}\r\n".encode())
            for uid in uids]


async def test_greeting_capability_login_examine() -> None:
    async with open_scripted_imap(messages(3, 4, 9)) as server, connect(server) as client:
        assert await client.command("CAPABILITY") == [
            b"* CAPABILITY IMAP4rev1 IDLE UIDPLUS LITERAL+", b"A1 OK Capability completed."]
        assert await client.command('LOGIN user "wrong"') == [
            b"A2 NO [AUTHENTICATIONFAILED] Authentication failed."]
        assert await client.command('LOGIN "user" "secret"') == [b"A3 OK Logged in"]
        assert await client.command('EXAMINE "INBOX"') == [
            rb"* FLAGS (\Answered \Flagged \Deleted \Seen \Draft)",
            b"* OK [PERMANENTFLAGS ()] Flags permitted.",
            b"* 3 EXISTS",
            b"* 0 RECENT",
            b"* OK [UIDVALIDITY 1] UIDs valid",
            b"* OK [UIDNEXT 10] Predicted next UID",
            b"A4 OK [READ-ONLY] EXAMINE completed.",
        ]
        assert (await client.command('EXAMINE "Other"'))[-1].startswith(b"A5 NO [NONEXISTENT]")
        assert await client.command("FROB") == [b"A6 BAD Unknown command FROB"]
        assert await client.command("LOGOUT") == [b"* BYE Logging out",
                                                  b"A7 OK Logout completed."]
        assert await client.at_eof() == b""
    assert server.connections == 1


async def test_uidvalidity_zero_missing_and_no_uidnext() -> None:
    faults = Faults(uidvalidity=0, uidnext=None)
    async with open_scripted_imap(messages(1), faults=faults) as server:
        async with connect(server) as client:
            await client.command('LOGIN user "secret"')
            lines = await client.command("SELECT INBOX")
        assert b"* OK [UIDVALIDITY 0] UIDs valid" in lines
        assert not any(b"UIDNEXT" in line for line in lines)
        assert lines[-1] == b"A2 OK [READ-WRITE] SELECT completed."

        server.faults.uidvalidity = None
        server.faults.uidnext = 77
        async with connect(server) as client:
            await client.command('LOGIN user "secret"')
            lines = await client.command('EXAMINE "INBOX"')
        assert not any(b"UIDVALIDITY" in line for line in lines)
        assert b"* OK [UIDNEXT 77] Predicted next UID" in lines
        assert server.connections == 2


async def test_commands_log_masks_the_password_and_literals_are_read() -> None:
    async with open_scripted_imap(password="pa ss") as server, connect(server) as client:
        assert await client.command('LOGIN user "pa ss"') == [b"A1 OK Logged in"]
        await client.send(b"A2 LOGIN {4}\r\n")
        assert await client.line() == b"+ Ready"
        await client.send(b"user {5+}\r\npa ss\r\n")
        assert await client.line() == b"A2 BAD LOGIN expects a user and a password"
        await client.command("NOOP")
    assert server.commands == ['LOGIN user ***', 'LOGIN "user" ***', "NOOP"]
    assert not any("pa ss" in command for command in server.commands)


def test_resolve_uid_set() -> None:
    uids = [2, 5, 9, 743024218, 4000000000]
    assert resolve_uid_set("5", uids) == {5}
    assert resolve_uid_set("1,5,9,6", uids) == {5, 9}
    assert resolve_uid_set("9:3", uids) == resolve_uid_set("3:9", uids) == {5, 9}
    assert resolve_uid_set("*", uids) == {4000000000}
    assert resolve_uid_set("4000000001:*", uids) == {4000000000}
    assert resolve_uid_set("10:*", uids) == {743024218, 4000000000}
    assert resolve_uid_set("1:*", []) == set()


async def test_range_beyond_the_largest_uid_still_matches_the_last_message() -> None:
    async with open_scripted_imap(messages(1, 2, 3)) as server, selected(server) as client:
        assert await client.command("UID SEARCH UID 5:*") == [
            b"* SEARCH 3", b"A3 OK Search completed."]
        assert await client.command("UID FETCH 5:* (UID RFC822.SIZE)") == [
            b"* 3 FETCH (UID 3 RFC822.SIZE 22)", b"A4 OK Fetch completed."]
    assert server.commands[-2:] == ["UID SEARCH UID 5:*", "UID FETCH 5:* (UID RFC822.SIZE)"]


async def test_sparse_uids_search() -> None:
    async with open_scripted_imap(messages(7, 743024218, 4000000000)) as server, \
            selected(server) as client:
        assert (await client.command("UID SEARCH ALL"))[0] == b"* SEARCH 7 743024218 4000000000"
        assert (await client.command("UID SEARCH CHARSET utf-8 UID 8:*"))[0] == (
            b"* SEARCH 743024218 4000000000")
        assert (await client.command("UID SEARCH UID 1,4000000000"))[0] == (
            b"* SEARCH 4000000000")
        assert await client.command("UID SEARCH UID 1:6") == [
            b"* SEARCH", b"A6 OK Search completed."]
        assert (await client.command("UID SEARCH FROM x"))[-1].startswith(b"A7 BAD ")


async def test_fetch_bodies_and_nil_body() -> None:
    mailbox = [ScriptedMessage(1, b"hello"), ScriptedMessage(2, None),
               ScriptedMessage(5, b"abc", size=999)]
    async with open_scripted_imap(mailbox) as server, selected(server) as client:
        assert await client.command("UID FETCH 1,2,5 (UID RFC822.SIZE BODY.PEEK[])") == [
            b"* 1 FETCH (UID 1 RFC822.SIZE 5 BODY[] {5}\r\nhello)",
            b"* 2 FETCH (UID 2 RFC822.SIZE 0 BODY[] NIL)",
            b"* 3 FETCH (UID 5 RFC822.SIZE 999 BODY[] {3}\r\nabc)",
            b"A3 OK Fetch completed.",
        ]
        assert server.flag_changes == []
        lines = await client.command("UID FETCH 1 (UID FLAGS BODY[])")
        assert lines[0] == b"* 1 FETCH (UID 1 FLAGS () BODY[] {5}\r\nhello)"
        assert server.flag_changes == ["UID FETCH 1 (UID FLAGS BODY[])"]
        assert (await client.command("UID STORE 1 +FLAGS (\\Seen)"))[-1].startswith(b"A5 NO ")
        assert len(server.flag_changes) == 2


async def test_descending_fetch_report_uid_and_empty_fetch() -> None:
    faults = Faults(descending_fetch=True, report_uid={2: 0}, empty_fetch_uids={3})
    async with open_scripted_imap(messages(1, 2, 3, 4), faults=faults) as server, \
            selected(server) as client:
        assert await client.command("UID FETCH 1:* (UID)") == [
            b"* 4 FETCH (UID 4)", b"* 2 FETCH (UID 0)", b"* 1 FETCH (UID 1)",
            b"A3 OK Fetch completed."]


async def test_cut_mid_literal_closes_after_half_the_body() -> None:
    mailbox = [ScriptedMessage(1, b"first"), ScriptedMessage(2, b"0123456789")]
    faults = Faults(cut_mid_literal_uid=2)
    async with open_scripted_imap(mailbox, faults=faults) as server:
        async with selected(server) as client:
            await client.send(b"A3 UID FETCH 1:2 (UID BODY.PEEK[])\r\n")
            assert await client.line() == b"* 1 FETCH (UID 1 BODY[] {5}\r\nfirst)"
            assert await client.at_eof() == b"* 2 FETCH (UID 2 BODY[] {10}\r\n01234"
        # The server survives and serves the next connection.
        async with selected(server) as client:
            assert (await client.command("UID FETCH 1 (UID)"))[0] == b"* 1 FETCH (UID 1)"
        assert server.connections == 2


async def test_client_disconnect_mid_reply_does_not_crash_the_server() -> None:
    big = ScriptedMessage(1, b"x" * 4_000_000)
    async with open_scripted_imap([big]) as server:
        async with selected(server) as client:
            await client.send(b"A3 UID FETCH 1 (BODY.PEEK[])\r\n")
        async with selected(server) as client:
            assert (await client.command("NOOP")) == [b"A3 OK NOOP completed."]


async def test_a_client_reset_during_idle_does_not_crash_the_server() -> None:
    # A reset (not a clean close) while the server reads for DONE: the read
    # fails inside IDLE's own nursery, so it arrives as an exception group.
    # The demo's server is this one, in the demo's process: on Ctrl-C it
    # ended the whole demo with exit 70 ("internal error").
    async with open_scripted_imap(messages(1)) as server:
        async with selected(server) as client:
            await client.send(b"A3 IDLE\r\n")
            assert await client.line() == b"+ idling"
            # SO_LINGER 0: closing sends RST instead of FIN.
            client.stream.socket.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER,
                                            struct.pack("ii", 1, 0))
        await trio.sleep(0.1)
        async with selected(server) as client:
            assert (await client.command("NOOP")) == [b"A3 OK NOOP completed."]


async def test_idle_reports_new_messages_then_done() -> None:
    async with open_scripted_imap(messages(1, 2)) as server, selected(server) as client:
        await client.send(b"A3 IDLE\r\n")
        assert await client.line() == b"+ idling"
        assert await client.is_silent()
        assert server.add_message(b"new") == 3
        assert await client.line() == b"* 3 EXISTS"
        assert server.add_message(b"newer", uid=10) == 10
        assert await client.line() == b"* 4 EXISTS"
        await client.send(b"DONE\r\n")
        assert await client.line() == b"A3 OK Idle completed."
        assert (await client.command("UID FETCH 10 (UID)"))[0] == b"* 4 FETCH (UID 10)"
        server.add_message(b"while not idling")
        assert await client.command("NOOP") == [b"* 5 EXISTS", b"A4 OK NOOP completed."]
        assert server.commands[-4:] == ["IDLE", "DONE", "UID FETCH 10 (UID)", "NOOP"]


async def test_no_idle_capability() -> None:
    async with open_scripted_imap(faults=Faults(no_idle_capability=True)) as server, \
            selected(server) as client:
        assert (await client.command("CAPABILITY"))[0] == b"* CAPABILITY IMAP4rev1 UIDPLUS LITERAL+"
        assert (await client.command("IDLE"))[-1].startswith(b"A4 BAD ")


async def test_bye_after_idle_close() -> None:
    faults = Faults(bye_after_idle="close")
    async with open_scripted_imap(messages(1), faults=faults) as server, \
            selected(server) as client:
        await client.send(b"A3 IDLE\r\n")
        assert await client.line() == b"+ idling"
        assert await client.at_eof() == b"* BYE Server shutting down.\r\n"


async def test_bye_after_idle_hang() -> None:
    faults = Faults(bye_after_idle="hang")
    async with open_scripted_imap(messages(1), faults=faults) as server, \
            selected(server) as client:
        await client.send(b"A3 IDLE\r\n")
        assert await client.line() == b"+ idling"
        assert await client.line() == b"* BYE Server shutting down."
        await client.send(b"DONE\r\nA4 NOOP\r\n")
        assert await client.is_silent()


@pytest.mark.parametrize("command", ["UID FETCH", "login", "EXAMINE"])
async def test_silent_after(command: str) -> None:
    async with open_scripted_imap(messages(1), faults=Faults(silent_after=command)) as server, \
            connect(server) as client:
        script = ['LOGIN user "secret"', 'EXAMINE "INBOX"', "UID SEARCH ALL",
                  "UID FETCH 1 (UID)", "NOOP"]
        for text in script:
            await client.send(f"T {text}\r\n".encode())
            if text.upper().startswith(command.upper()):
                break
            while not (await client.line()).startswith(b"T "):
                pass
        await client.send(b"T2 NOOP\r\n")
        assert await client.is_silent()
        assert server.commands[-1].upper().startswith(command.upper())


async def test_set_messages_renumbers() -> None:
    async with open_scripted_imap(messages(1, 2, 3)) as server:
        server.set_messages(messages(100, 200), uidvalidity=42)
        async with selected(server) as client:
            assert (await client.command("UID FETCH 1:* (UID)"))[:2] == [
                b"* 1 FETCH (UID 100)", b"* 2 FETCH (UID 200)"]
        assert server.faults.uidvalidity == 42


# -- OAuth2 sign-in and LIST ---------------------------------------------------------------

def _xoauth2(user: str, token: str) -> str:
    import base64
    return base64.b64encode(f"user={user}\x01auth=Bearer {token}\x01\x01".encode()).decode()


def _oauthbearer(user: str, token: str) -> str:
    import base64
    return base64.b64encode(
        f"n,a={user},\x01host=h\x01port=1\x01auth=Bearer {token}\x01\x01".encode()).decode()


async def test_authenticate_accepts_valid_tokens_only() -> None:
    from nexarch_events.testing.imap_server import ListedFolder

    valid = {"good-token"}
    async with open_scripted_imap(token_valid=valid.__contains__,
                                  folders=[ListedFolder("INBOX")]) as server:
        async with connect(server) as client:
            caps = (await client.command("CAPABILITY"))[0]
            assert b"AUTH=XOAUTH2 AUTH=OAUTHBEARER" in caps and b"SASL-IR" in caps
            assert b"SPECIAL-USE" in caps
            # A refused token: the error continuation, answered, then NO.
            await client.send(f"A2 AUTHENTICATE XOAUTH2 {_xoauth2('user', 'bad')}\r\n"
                              .encode())
            assert (await client.line()).startswith(b"+ ey")  # base64 JSON
            await client.send(b"\r\n")
            assert (await client.line()).startswith(b"A2 NO [AUTHENTICATIONFAILED]")
            # The right token for another user is refused too.
            await client.send(f"A3 AUTHENTICATE OAUTHBEARER {_oauthbearer('eve', 'good-token')}"
                              "\r\n".encode())
            assert (await client.line()).startswith(b"+ ")
            await client.send(b"AQ==\r\n")
            assert (await client.line()).startswith(b"A3 NO ")
            # Without SASL-IR: the response after an empty continuation.
            await client.send(b"A4 AUTHENTICATE OAUTHBEARER\r\n")
            assert await client.line() == b"+ "
            await client.send(f"{_oauthbearer('user', 'good-token')}\r\n".encode())
            assert (await client.line()).startswith(b"A4 OK ")
            client.tags = 4
            assert (await client.command('EXAMINE "INBOX"'))[-1].startswith(b"A5 OK ")
        assert (server.authentications, server.refused_tokens) == (3, 2)
        assert not any("good-token" in c or "bad" in c for c in server.commands)


async def test_list_answers_the_scripted_folders_with_their_special_use() -> None:
    from nexarch_events.testing.imap_server import ListedFolder

    folders = [ListedFolder("INBOX"), ListedFolder("[Gmail]", ("\\HasChildren", "\\Noselect")),
               ListedFolder("[Gmail]/All Mail", ("\\All", "\\HasNoChildren")),
               ListedFolder("Pl&AOQ-ne")]
    async with open_scripted_imap(folders=folders, mailbox="[Gmail]/All Mail") as server, \
            connect(server) as client:
        assert (await client.command('LIST "" "*"'))[-1].startswith(b"A1 BAD ")  # not signed in
        await client.command('LOGIN user "secret"')
        assert await client.command('LIST "" "*" RETURN (SPECIAL-USE)') == [
            b'* LIST (\\HasNoChildren) "/" "INBOX"',
            b'* LIST (\\HasChildren \\Noselect) "/" "[Gmail]"',
            b'* LIST (\\All \\HasNoChildren) "/" "[Gmail]/All Mail"',
            b'* LIST (\\HasNoChildren) "/" "Pl&AOQ-ne"',
            b"A3 OK List completed."]
        assert (await client.command('EXAMINE "[Gmail]/All Mail"'))[-1].startswith(b"A4 OK ")
        assert (await client.command('EXAMINE "INBOX"'))[-1].startswith(b"A5 NO [NONEXISTENT]")
