"""A server that is not on this machine gets TLS, verified, or nothing: an
attacker on the path who answers Postgres' SSLRequest with "N" (no TLS) and
asks for the password in clear text got it, since asyncpg's default
("prefer") falls back to plain text (found by a security audit).

The "server" here is a few lines of the Postgres wire protocol on this
machine's own non-loopback address (real sockets; no Postgres behind it):
it answers "N", then asks for a clear-text password and records whatever
comes."""

from __future__ import annotations

import socket
import struct
from functools import partial

import pytest
import trio

from nexarch_events.aio import Connection
from nexarch_events.errors import DatabaseError

SSL_REQUEST = 80877103


def non_loopback_address() -> str:
    """This machine's address on its first non-loopback interface (a UDP
    "connect" sends nothing; it only picks the route)."""
    with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as probe:
        probe.connect(("192.0.2.1", 9))
        address = str(probe.getsockname()[0])
    assert not address.startswith("127."), f"no non-loopback IPv4 address here ({address})"
    return address


async def read_exactly(stream: trio.SocketStream, size: int) -> bytes:
    data = b""
    while len(data) < size:
        chunk = await stream.receive_some(size - len(data))
        if not chunk:
            raise EOFError
        data += chunk
    return data


async def test_a_server_elsewhere_that_refuses_tls_never_gets_the_password(
        aio_loop: None) -> None:
    host = non_loopback_address()
    heard: list[bytes] = []

    async def attacker(stream: trio.SocketStream) -> None:
        try:
            length = struct.unpack("!I", await read_exactly(stream, 4))[0]
            body = await read_exactly(stream, length - 4)
            if struct.unpack("!I", body[:4])[0] == SSL_REQUEST:
                heard.append(b"SSLRequest")
                await stream.send_all(b"N")
                length = struct.unpack("!I", await read_exactly(stream, 4))[0]
                body = await read_exactly(stream, length - 4)
            heard.append(b"startup")
            await stream.send_all(b"R" + struct.pack("!II", 8, 3))  # clear-text password, please
            kind = await read_exactly(stream, 1)
            length = struct.unpack("!I", await read_exactly(stream, 4))[0]
            heard.append(kind + await read_exactly(stream, length - 4))
        except (EOFError, trio.BrokenResourceError):
            pass

    async with trio.open_nursery() as nursery:
        listeners = await nursery.start(partial(trio.serve_tcp, attacker, 0, host=host))
        port = listeners[0].socket.getsockname()[1]
        with pytest.raises(DatabaseError):
            await Connection.open(f"postgresql://alice:HUNTER2pw@{host}:{port}/archive",
                                  connect_timeout=5)
        # With sslmode=disable the operator chose plain text (a trusted
        # network): then, and only then, it goes out in clear.
        with pytest.raises(DatabaseError):
            await Connection.open(f"postgresql://alice:OPTEDIN@{host}:{port}/archive"
                                  "?sslmode=disable", connect_timeout=5)
        nursery.cancel_scope.cancel()
    assert heard[0] == b"SSLRequest"
    assert not any(b"HUNTER2pw" in h for h in heard), heard
    assert any(b"OPTEDIN" in h for h in heard)


async def test_a_server_that_never_answers_is_unavailable_not_a_crash(aio_loop: None) -> None:
    """However the connect times out (asyncpg's timeout, or the trio bound
    a second later), it is DatabaseUnavailable, which every task backs off
    from; a trio.TooSlowError would end the service (a retry-loop audit
    named the path)."""
    from nexarch_events.errors import DatabaseUnavailable

    async def silent(stream: trio.SocketStream) -> None:
        await trio.sleep_forever()

    async with trio.open_nursery() as nursery:
        listeners = await nursery.start(partial(trio.serve_tcp, silent, 0, host="127.0.0.1"))
        port = listeners[0].socket.getsockname()[1]
        with trio.fail_after(10), pytest.raises(DatabaseUnavailable):
            await Connection.open(f"postgresql://alice@127.0.0.1:{port}/archive",
                                  connect_timeout=0.5)
        nursery.cancel_scope.cancel()
