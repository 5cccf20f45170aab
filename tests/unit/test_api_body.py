"""Request bodies of the hand-written ASGI layer: read once, bounded (a
too-large body is refused without reading it all), JSON objects of the
route's fields only, every refusal naming the problem."""

from __future__ import annotations

from collections.abc import Sequence

import pytest

from nexarch_events.api.asgi import (
    ApiError,
    BodyReader,
    Message,
    check_json_content_type,
    parse_json_object,
)

FIELDS = frozenset({"tenant", "days"})


class Chunks:
    """An ASGI receive() handing out body chunks, counting the calls."""

    def __init__(self, chunks: Sequence[bytes], *, disconnect: bool = False) -> None:
        self.messages: list[Message] = [
            {"type": "http.request", "body": c, "more_body": i < len(chunks) - 1}
            for i, c in enumerate(chunks)]
        if disconnect:
            self.messages[-1] = {"type": "http.disconnect"}
        self.calls = 0

    async def __call__(self) -> Message:
        self.calls += 1
        return self.messages[self.calls - 1]


def refused(status: int, fn: object, *args: object) -> str:
    with pytest.raises(ApiError) as caught:
        fn(*args)  # type: ignore[operator]
    assert caught.value.status == status, caught.value.message
    return caught.value.message


async def refused_read(status: int, reader: BodyReader) -> str:
    with pytest.raises(ApiError) as caught:
        await reader.read()
    assert caught.value.status == status, caught.value.message
    return caught.value.message


async def test_a_body_in_chunks_is_joined_and_read_once() -> None:
    receive = Chunks([b'{"ten', b'ant": "acme"}'])
    reader = BodyReader(receive, None)
    assert await reader.read() == b'{"tenant": "acme"}'
    assert await reader.read() == b'{"tenant": "acme"}'
    assert receive.calls == 2


async def test_a_declared_length_beyond_the_limit_is_refused_unread() -> None:
    receive = Chunks([b"x" * 10])
    message = await refused_read(413, BodyReader(receive, "65537", limit=65536))
    assert "larger than 65536 bytes" in message
    assert receive.calls == 0


async def test_a_body_growing_past_the_limit_is_refused_at_once() -> None:
    # No Content-Length (chunked): reading stops at the chunk that crosses it.
    receive = Chunks([b"x" * 6, b"x" * 6, b"x" * 6, b"x" * 6])
    await refused_read(413, BodyReader(receive, None, limit=10))
    assert receive.calls == 2
    # A Content-Length that lies is no way around the limit either.
    await refused_read(413, BodyReader(Chunks([b"x" * 11]), "3", limit=10))


async def test_a_malformed_length_or_a_disconnect_is_a_bad_request() -> None:
    assert "Content-Length" in await refused_read(400, BodyReader(Chunks([b"{}"]), "12a"))
    assert "went away" in await refused_read(
        400, BodyReader(Chunks([b"{", b""], disconnect=True), None))


def test_only_json_in_utf_8_is_taken() -> None:
    for ok in ("application/json", "Application/JSON; charset=UTF-8",
               'application/json; charset="utf-8"'):
        check_json_content_type(ok)
    for bad in (None, "text/plain", "application/x-www-form-urlencoded",
                "application/json; charset=latin-1", "application/jsonx"):
        assert "application/json" in refused(415, check_json_content_type, bad)


def test_an_object_of_known_fields_is_parsed() -> None:
    body = parse_json_object('{"tenant": "acmé", "days": null}'.encode(), FIELDS)
    assert body.text("tenant") == "acmé"
    assert body.whole_number("days", low=1, high=10, nullable=True) is None


@pytest.mark.parametrize(("raw", "says"), [
    (b"\xff{}", "not valid UTF-8 (byte 0)"),
    (b"{", "not valid JSON"),
    (b"", "not valid JSON"),
    (b'{"days": NaN}', "NaN is not a number"),
    (b'{"days": Infinity}', "Infinity is not a number"),
    (b"[]", "must be a JSON object, got an array"),
    (b"null", "must be a JSON object, got null"),
    (b'"x"', "got a string"),
    (b"1", "got a number"),
    (b'{"tenant": "a", "tenant": "b"}', "gives field 'tenant' twice"),
    (b'{"tenant": "a", "tennant": "b"}', "unknown field(s) 'tennant'"),
    (b"[" * 100_000, "nested too deeply"),
    (b'{"days": 1' + b"0" * 5000 + b"}", "not valid JSON"),
])
def test_bad_bodies_are_refused_naming_the_problem(raw: bytes, says: str) -> None:
    assert says in refused(400, parse_json_object, raw, FIELDS)


def test_fields_are_typed_and_bounded() -> None:
    def body(text: str) -> object:
        return parse_json_object(text.encode(), FIELDS)

    def text_error(raw: str, **kw: object) -> str:
        return refused(400, lambda: body(raw).text("tenant", **kw))  # type: ignore[attr-defined]

    def days_error(raw: str) -> str:
        return refused(400, lambda: body(raw).whole_number(  # type: ignore[attr-defined]
            "days", low=1, high=10, nullable=True))

    assert text_error("{}") == "the request body needs field 'tenant'"
    assert "must be a string, got a number" in text_error('{"tenant": 5}')
    assert "1..3 characters" in text_error('{"tenant": "abcd"}', max_length=3)
    assert "1..3 characters" in text_error('{"tenant": ""}', max_length=3)
    assert "NUL" in text_error('{"tenant": "a\\u0000"}')
    assert "lone surrogate" in text_error('{"tenant": "\\ud800"}')
    assert body('{"days": 3}').text("tenant", required=False) is None  # type: ignore[attr-defined]
    assert days_error("{}") == "the request body needs field 'days'"
    assert "whole number or null, got a boolean" in days_error('{"days": true}')
    assert "got a number" in days_error('{"days": 1.5}')
    assert "must be 1..10, got 11" in days_error('{"days": 11}')


async def test_a_body_that_never_completes_is_refused_after_the_timeout(
        monkeypatch: pytest.MonkeyPatch) -> None:
    # The HTTP server has no read timeout: a body that stopped after 5 of
    # 100 bytes held its request open for good (found by an audit).
    import trio

    from nexarch_events.api import asgi

    monkeypatch.setattr(asgi, "BODY_TIMEOUT", 0.2)
    first = True

    async def receive() -> Message:
        nonlocal first
        if first:
            first = False
            return {"type": "http.request", "body": b"12345", "more_body": True}
        await trio.sleep_forever()
        raise AssertionError("unreachable")

    with trio.fail_after(5):
        message = await refused_read(408, BodyReader(receive, "100"))
    assert "did not arrive within 0.2 s" in message


@pytest.mark.parametrize(("error", "status", "shown", "hidden"), [
    ("database", 503, "the database cannot be reached", "nexarch_secret_db"),
    ("index", 503, "the search index is unavailable or busy", "manticore.internal"),
    ("other", 500, "the request failed (DatabaseRejected)", "violates check constraint"),
])
async def test_backend_errors_name_no_internals(error: str, status: int, shown: str,
                                                hidden: str) -> None:
    # Found by an audit: database names, hosts and SQL reached any token
    # holder in 503 and 500 bodies; they belong in the log.
    import json

    from nexarch_events.api.asgi import AsgiApp, Router
    from nexarch_events.errors import DatabaseRejected, DatabaseUnavailable
    from nexarch_events.index.base import IndexUnavailable

    raised = {"database": DatabaseUnavailable('database "nexarch_secret_db" does not exist'),
              "index": IndexUnavailable("http://manticore.internal:9308 refused"),
              "other": DatabaseRejected('value violates check constraint "x" (SQL: ...)')}

    async def handler(request: object) -> object:
        raise raised[error]

    router = Router()
    router.add("GET", "/x", handler)  # type: ignore[arg-type]
    sent: list[Message] = []

    async def send(message: Message) -> None:
        sent.append(message)

    async def receive() -> Message:
        return {"type": "http.request", "body": b"", "more_body": False}

    scope = {"type": "http", "method": "GET", "path": "/" + "y" * 5000, "query_string": b"",
             "headers": []}
    await AsgiApp(router)(scope, receive, send)
    assert sent[0]["status"] == 404
    assert len(json.loads(sent[-1]["body"])["error"]) < 300  # the path, cut short
    sent.clear()
    await AsgiApp(router)({**scope, "path": "/x"}, receive, send)
    body = json.loads(sent[-1]["body"])["error"]
    assert sent[0]["status"] == status and shown in body and hidden not in body, body
