from __future__ import annotations

import trio

from nexarch_events.queue.notify import RESYNC, Notification, Subscription


def note(n: int) -> Notification:
    return Notification("ch", str(n), 0.0)


async def test_overflow_is_reported_as_resync_after_the_buffer() -> None:
    sub = Subscription("ch", buffer=2)
    for n in range(5):
        sub._push(note(n))
    assert sub.dropped == 3
    assert await sub.receive() == note(0)
    assert await sub.receive() == note(1)
    assert await sub.receive() is RESYNC
    sub._push(note(9))
    assert await sub.receive() == note(9)


async def test_no_resync_without_overflow() -> None:
    sub = Subscription("ch", buffer=4)
    sub._push(note(1))
    assert await sub.receive() == note(1)
    with trio.move_on_after(0.05) as scope:
        await sub.receive()
    assert scope.cancelled_caught


def test_foreign_payloads_parse_to_empty() -> None:
    assert Notification("ch", "not json", 0.0).json() == {}
    assert Notification("ch", "[1]", 0.0).json() == {}
    # NaN and Infinity are no JSON we write, and an event stream that
    # passed one on died of it (found by an audit).
    for payload in ('{"v": 1, "error": NaN}', '{"x": Infinity}', '{"x": -Infinity}'):
        assert Notification("ch", payload, 0.0).json() == {}
    assert Notification("ch", '{"v": 1}', 0.0).json() == {"v": 1}
    # Nested past the recursion limit (a NOTIFY payload may hold 8,000 bytes):
    # json.loads raises RecursionError, which ended every event stream.
    for payload in ("[" * 7990, '{"v": ' + "[" * 7990, "{" * 7990):
        assert Notification("ch", payload, 0.0).json() == {}
    # Nested just under it, it parsed, and passing it on (json.dumps) raised.
    under = '{"v": 1, "x": ' + "[" * 990 + "]" * 990 + "}"
    assert Notification("ch", under, 0.0).json() == {}
    ours = '{"v": 1, "event": "failed", "ids": [1, 2], "extra": {"a": [{"b": [3]}]}}'
    assert Notification("ch", ours, 0.0).json()["ids"] == [1, 2]
