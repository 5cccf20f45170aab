"""The IMAP framing (``_Protocol.data_received``) against aioimaplib's own.

Ours walks a read in a loop where aioimaplib recurses once per line (and
copies the rest of the read each time); everything else is its code. So for
any reply, cut into reads anywhere, both must leave the same trace: the same
parts handed to a streaming FETCH, the same lines and result on the
command, the same leftovers between reads. Plus what only ours survives: a
read of thousands of lines.
"""

from __future__ import annotations

import asyncio
import itertools
import os
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from typing import Any

import pytest
from aioimaplib import aioimaplib  # type: ignore[import-untyped]
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from nexarch_events.aio import imap
from nexarch_events.aio.imap import DiscardedLiteral, _Protocol, _StreamingFetch

EXAMPLES = int(os.environ.get("IMAP_FRAMING_EXAMPLES", "300"))
PROPERTY = settings(max_examples=EXAMPLES, deadline=None,
                    suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large])

ORIGINAL: Callable[[Any, bytes], None] = aioimaplib.IMAP4ClientProtocol.data_received


@contextmanager
def event_loop() -> Iterator[asyncio.AbstractEventLoop]:
    loop = asyncio.new_event_loop()  # commands keep it for their timers; never run
    try:
        yield loop
    finally:
        loop.close()


def start(loop: asyncio.AbstractEventLoop, command: str
          ) -> tuple[_Protocol, Any, list[tuple[str, bytes]]]:
    """A selected session with ``command`` pending (a streaming UID FETCH,
    or a plain LIST), registered as aioimaplib's ``execute`` registers it
    (without sending)."""
    protocol = _Protocol(loop, lambda _exc: None)
    protocol.state = aioimaplib.SELECTED
    parts: list[tuple[str, bytes]] = []  # a line (bytes) or a literal (bytearray)
    if command == "FETCH":
        cmd = _StreamingFetch(lambda part: parts.append((type(part).__name__, bytes(part))),
                              "A1", "1:*",
                              "(UID BODY.PEEK[])", prefix="UID", loop=loop)
    else:
        cmd = aioimaplib.Command(command, "A1", '""', '"*"', loop=loop)
    if aioimaplib.Commands.get(cmd.name).exec == aioimaplib.Exec.is_sync:
        protocol.pending_sync_command = cmd
    else:
        protocol.pending_async_commands[cmd.untagged_resp_name] = cmd
    return protocol, cmd, parts


def feed(reads: list[bytes], receive: Callable[[Any, bytes], None],
         command: str = "FETCH") -> list[object]:
    """Everything observable after each read, with framing ``receive``."""
    with event_loop() as loop:
        protocol, cmd, parts = start(loop, command)
        trace: list[object] = []
        for data in reads:
            receive(protocol, data)
            trace.append((bytes(protocol.incomplete_line),
                          protocol.current_command is cmd,
                          protocol.current_command is None, len(parts)))
        trace.append(parts)
        trace.append((cmd.response.result,
                      [(type(line).__name__, bytes(line)) for line in cmd.response.lines],
                      cmd._event.is_set()))
        return trace


def cut(stream: bytes, points: list[int]) -> list[bytes]:
    edges = sorted({0, len(stream), *(p % (len(stream) + 1) for p in points)})
    return [stream[a:b] for a, b in itertools.pairwise(edges)]


# Bodies that look like framing: CRLFs, parentheses, literal announcements,
# "* " and tagged-looking lines, a trailing "}".
_TRICKY = [b"\r\n", b"(", b")", b"{5}\r\n", b"* 9 FETCH (", b"A1 OK done\r\n", b"}", b"x",
           b"Subject: hi", b"\r\n\r\n"]
bodies = st.lists(st.sampled_from(_TRICKY), max_size=12).map(b"".join)


def fetch_response(seq: int, uid: int, body: bytes, *, flags_first: bool) -> bytes:
    head = f"* {seq} FETCH (UID {uid} RFC822.SIZE {len(body)} BODY[] {{{len(body)}}}\r\n"
    if flags_first:
        head = f"* {seq} FETCH (FLAGS (\\Seen) UID {uid} BODY[] {{{len(body)}}}\r\n"
    return head.encode() + body + b")\r\n"


@st.composite
def replies(draw: st.DrawFn) -> bytes:
    out = []
    for seq, body in enumerate(draw(st.lists(bodies, min_size=1, max_size=5)), start=1):
        if draw(st.booleans()):
            out.append(f"* {draw(st.integers(1, 50))} FETCH (FLAGS ())\r\n".encode())
        if draw(st.booleans()):
            out.append(f"* {seq + 10} EXISTS\r\n".encode())
        out.append(fetch_response(seq, seq * 7, body, flags_first=draw(st.booleans())))
    out.append(b"A1 OK Fetch completed.\r\n")
    return b"".join(out)


@PROPERTY
@given(replies(), st.lists(st.integers(0, 10_000), max_size=12))
def test_any_reply_cut_anywhere_frames_as_aioimaplib_does(stream: bytes,
                                                           points: list[int]) -> None:
    reads = cut(stream, points)
    assert feed(reads, _Protocol.data_received) == feed(reads, ORIGINAL)


@pytest.mark.parametrize("reads", [
    # A read that ends at the literal's end; an empty literal; CRLF split.
    [b"* 1 FETCH (UID 1 BODY[] {3}\r\n", b"abc", b")\r\nA1 OK done\r\n"],
    [b"* 1 FETCH (UID 1 BODY[] {0}\r\n)\r\nA1 OK done\r\n"],
    [b"* 1 FETCH (UID 1 BODY[] {4}\r", b"\nab", b"\r\n)", b"\r", b"\nA1 OK done\r\n"],
])
def test_edges_frame_as_aioimaplib_does(reads: list[bytes]) -> None:
    assert feed(reads, _Protocol.data_received) == feed(reads, ORIGINAL)


def test_a_transport_handing_over_a_bytearray_frames_as_aioimaplib_does() -> None:
    reads = [bytearray(b"* 1 FETCH (UID 1 BODY[] {3}\r\nabc)\r\nA1 OK done\r\n")]
    trace = feed(reads, _Protocol.data_received)  # type: ignore[arg-type]
    assert trace == feed(reads, ORIGINAL)  # type: ignore[arg-type]
    assert trace[-2] == [("bytes", b"1 FETCH (UID 1 BODY[] {3}"), ("bytearray", b"abc"),
                         ("bytes", b")")]


@pytest.mark.parametrize("reads", [
    [b'* LIST () "/" {5}\r\n', b"INBOX", b"\r\nA1 OK done\r\n"],  # ends at the literal
    [b'* LIST () "/" {5}\r\nIN', b"BOX\r\n* LIST () \"/\" Sent\r\nA1 OK done\r\n"],
])
def test_a_literal_in_a_list_reply_frames_as_aioimaplib_does(reads: list[bytes]) -> None:
    assert feed(reads, _Protocol.data_received, "LIST") == feed(reads, ORIGINAL, "LIST")


def test_thousands_of_lines_in_one_read() -> None:
    burst = b"".join(b"* %d FETCH (FLAGS (\\Seen))\r\n" % n for n in range(1, 20_001))
    reply = burst + fetch_response(1, 1, b"body\r\n", flags_first=False) + b"A1 OK done\r\n"
    with pytest.raises(RecursionError):
        feed([reply], ORIGINAL)  # what the session died of
    trace = feed([reply], _Protocol.data_received)
    result, _lines, done = trace[-1]  # type: ignore[misc]
    assert (result, done) == ("OK", True)
    parts = trace[-2]
    assert isinstance(parts, list) and len(parts) == 20_003  # each flag line, head, body, ")"
    assert parts[-2] == ("bytearray", b"body\r\n")


# -- the bounds aioimaplib does not have ---------------------------------------

SMALL_LITERAL = 24


def discarding(trace: list[object], limit: int) -> list[object]:
    """aioimaplib's trace as ours must look with literals over ``limit``
    skipped: each such literal handed over empty, as a DiscardedLiteral."""

    def part(kind: str, data: bytes) -> tuple[str, bytes]:
        if kind == "bytearray" and len(data) > limit:
            return ("DiscardedLiteral", b"")
        return (kind, data)

    *reads, parts, (result, lines, done) = trace  # type: ignore[misc]
    return [*reads, [part(*p) for p in parts],  # type: ignore[has-type]
            (result, [part(*line) for line in lines], done)]


@PROPERTY
@given(replies(), st.lists(st.integers(0, 10_000), max_size=12))
def test_a_literal_over_the_limit_is_skipped_and_nothing_else_changes(
        stream: bytes, points: list[int]) -> None:
    reads = cut(stream, points)
    with pytest.MonkeyPatch.context() as patch:
        patch.setattr(imap, "MAX_LITERAL_BYTES", SMALL_LITERAL)
        ours = feed(reads, _Protocol.data_received)
    assert ours == discarding(feed(reads, ORIGINAL), SMALL_LITERAL)


def test_a_discarded_literal_says_how_large_it_was(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(imap, "MAX_LITERAL_BYTES", 10)
    body = b"x" * 1000
    seen: list[object] = []
    with event_loop() as loop:
        protocol, cmd, _parts = start(loop, "FETCH")
        cmd._sink = seen.append
        reply = fetch_response(1, 7, body, flags_first=False) + b"A1 OK done\r\n"
        for i in range(0, len(reply), 100):
            protocol.data_received(reply[i:i + 100])
            if i + 100 < len(reply) - 20:
                assert not protocol.incomplete_line  # nothing of the body is held
        assert cmd.response.result == "OK"
    (literal,) = [p for p in seen if isinstance(p, bytearray)]
    assert isinstance(literal, DiscardedLiteral)
    assert (literal.size, literal.limit, len(literal)) == (1000, 10, 0)


class _Transport:
    aborted = False

    def abort(self) -> None:
        self.aborted = True


@pytest.mark.parametrize("read_size", [7, 1000])  # many reads / one read holds it all
def test_a_line_over_the_limit_closes_the_connection(monkeypatch: pytest.MonkeyPatch,
                                                     read_size: int) -> None:
    monkeypatch.setattr(imap, "MAX_LINE_BYTES", 100)
    with event_loop() as loop:
        protocol, cmd, parts = start(loop, "FETCH")
        protocol.transport = transport = _Transport()
        endless = b"* 1 FETCH (UID 1 FLAGS (" + b"\\Seen " * 100
        for i in range(0, len(endless), read_size):
            protocol.data_received(endless[i:i + read_size])
        assert transport.aborted
        assert protocol.refused == "the server sent a line of more than 100 bytes"
        assert not protocol.incomplete_line
        protocol.data_received(b")\r\nA1 OK done\r\n")  # after the abort: ignored
        assert parts == [] and cmd.response.result != "OK"


def test_a_line_of_many_reads_just_under_the_limit_is_whole(
        monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(imap, "MAX_LINE_BYTES", 4000)
    line = b"* 1 FETCH (UID 1 FLAGS (" + b"\\Seen " * 600 + b"))"
    assert len(line) <= 4000
    reads = [line[i:i + 3] for i in range(0, len(line), 3)] + [b"\r\nA1 OK done\r\n"]
    assert feed(reads, _Protocol.data_received) == feed(reads, ORIGINAL)


# -- untagged lines ------------------------------------------------------------

ORIGINAL_UNTAGGED: Callable[[Any, bytes], Any] = aioimaplib.IMAP4ClientProtocol._untagged_response
_UNTAGGED = [b"* 3 FETCH (FLAGS (\\Seen))", b"* 4 EXPUNGE", b"* SEARCH 1 2 3", b"* 7 EXISTS",
             b'* LIST (\\HasNoChildren) "/" INBOX', b'* LIST () "/" "a*b"', b"* 0 RECENT",
             b"* OK [ALERT] maintenance at 2 am", b"* CAPABILITY IMAP4rev1 IDLE"]


def untagged(receive: Callable[[Any, bytes], Any], command: str,
             lines: list[bytes]) -> tuple[object, ...]:
    with event_loop() as loop:
        protocol, cmd, parts = start(loop, command)
        returned = [receive(protocol, line) is cmd for line in lines]
        return returned, [(type(x).__name__, bytes(x)) for x in cmd.response.lines], parts


@given(st.sampled_from(["FETCH", "LIST", "SEARCH", "NOOP"]),
       st.lists(st.sampled_from(_UNTAGGED), max_size=8))
def test_untagged_lines_go_where_aioimaplib_sends_them(command: str,
                                                       lines: list[bytes]) -> None:
    assert untagged(_Protocol._untagged_response, command, lines) \
        == untagged(ORIGINAL_UNTAGGED, command, lines)


@pytest.mark.parametrize("command", ["LIST", "NOOP"])
def test_only_the_leading_asterisk_of_an_untagged_line_goes(command: str) -> None:
    line = b'* LIST (\\HasNoChildren) "/" "Kunden * 2024"'
    _returned, ours, _parts = untagged(_Protocol._untagged_response, command, [line])
    _returned, theirs, _parts = untagged(ORIGINAL_UNTAGGED, command, [line])
    assert b'"Kunden * 2024"' in ours[0][1]
    assert b'"Kunden 2024"' in theirs[0][1]  # what lost the folder's mail


def test_a_search_of_a_million_uids_in_many_reads_is_one_line() -> None:
    """A first sync's UID SEARCH of a large folder: one line of megabytes,
    arriving in 64 KiB reads, under the default limit."""
    uids = b" ".join(b"%d" % n for n in range(1, 1_000_001))
    reply = b"* SEARCH " + uids + b"\r\nA1 OK done\r\n"
    assert len(reply) < imap.MAX_LINE_BYTES
    with event_loop() as loop:
        protocol, cmd, _parts = start(loop, "SEARCH")
        for i in range(0, len(reply), 65536):
            protocol.data_received(reply[i:i + 65536])
        assert protocol.refused is None
        assert cmd.response.result == "OK"
        assert [bytes(line) for line in cmd.response.lines[:-1]] == [uids]


def test_bare_line_feeds_do_not_make_a_long_line_quadratic(
        monkeypatch: pytest.MonkeyPatch) -> None:
    """A line spanning reads is gathered without re-copying it per read,
    even when every read holds a bare LF (no CRLF): the partial line is
    the same object, grown in place."""
    monkeypatch.setattr(imap, "MAX_LINE_BYTES", 1 << 20)
    with event_loop() as loop:
        protocol, _cmd, _parts = start(loop, "SEARCH")
        protocol.data_received(b"* SEARCH 1")
        protocol.data_received(b" 2\n 3")
        gathered = protocol.incomplete_line
        for _ in range(100):
            protocol.data_received(b" 4\n 5\r")
            protocol.data_received(b"\x00 6")  # after a CR: no LF, the line goes on
            assert protocol.incomplete_line is gathered
        assert bytes(gathered).startswith(b"* SEARCH 1 2\n 3 4\n 5\r\x00 6")


@pytest.mark.parametrize("reads", [
    [b"* SEARCH 1", b" 2\r", b"\nA1 OK done\r\n"],          # CRLF across two reads
    [b"* SEARCH 1", b" 2\n3\r", b"\nA1 OK done\r\n"],       # a bare LF, then CRLF across
    [b"* SEARCH 1", b" 2", b" 3\r\nA1 OK done\r\n"],
])
def test_line_ends_across_reads_frame_as_aioimaplib_does(reads: list[bytes]) -> None:
    assert feed(reads, _Protocol.data_received, "SEARCH") \
        == feed(reads, ORIGINAL, "SEARCH")
