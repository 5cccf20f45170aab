"""Just enough ASGI for a dozen JSON endpoints and one event stream: parsed
requests, responses, routing, and the JSON error shape. No framework: the
API is small, and its only server is hypercorn's trio worker.

Everything here is synchronous except the app itself (``AsgiApp``), which
owns the ASGI conversation, and the request body: it is read only when a
handler asks for it (``Request.json_body``, on routes that declare the
fields they take), at most ``MAX_BODY`` bytes. The app reads nothing else
but the disconnect of an event stream, and answers each request with one
``Response`` or one ``Stream``.
"""

from __future__ import annotations

import json
import logging
import re
from collections.abc import Awaitable, Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from datetime import date, datetime
from urllib.parse import parse_qsl

import trio

from ..errors import DatabaseTransient, DatabaseUnavailable, NexarchError
from ..index.base import IndexUnavailable

log = logging.getLogger("nexarch_events.api")

#: ASGI's dictionaries, read with isinstance checks (no Any past this point).
Scope = Mapping[str, object]
Message = Mapping[str, object]
Receive = Callable[[], Awaitable[Message]]
Send = Callable[[Message], Awaitable[None]]

Write = Callable[[bytes], Awaitable[None]]

#: The largest id Postgres' bigint holds.
MAX_ID = 2**63 - 1
#: Up to 19 digits: ids up to MAX_ID (``/audit?before=``); each parameter's
#: range check bounds the value.
_WHOLE_NUMBER = re.compile(r"[+-]?[0-9]{1,19}")
_ID = re.compile(r"[0-9]{1,19}")
#: The largest request body read; a larger one is refused (413) unread.
MAX_BODY = 64 * 1024
#: Seconds a request body may take to arrive in all (the HTTP server has no
#: read timeout of its own: a body that never completed held its request
#: open for good).
BODY_TIMEOUT = 30.0
#: Seconds a client is asked to wait (Retry-After) when a backend is down.
UNAVAILABLE_RETRY_AFTER_S = 5
_CONTENT_LENGTH = re.compile(r"[0-9]{1,19}")

class ApiError(Exception):
    """Ends a request with ``{"error": message}`` and this status."""

    def __init__(self, status: int, message: str,
                 headers: Sequence[tuple[str, str]] = ()) -> None:
        super().__init__(message)
        self.status = status
        self.message = message
        self.headers = tuple(headers)


@dataclass(frozen=True, slots=True)
class Request:
    method: str
    path: str
    #: Lower-case names; a repeated header's values joined by ", ".
    headers: Mapping[str, str]
    query: Mapping[str, list[str]]
    path_params: Mapping[str, str] = field(default_factory=dict)
    #: HEAD runs the GET handler; the body is left out when sending.
    head: bool = False
    #: The body's reader (read on demand, once) and the fields the route
    #: takes (None: it takes no body).
    body: BodyReader | None = None
    body_fields: frozenset[str] | None = None

    def header(self, name: str) -> str | None:
        return self.headers.get(name.lower())

    def param(self, name: str) -> str | None:
        """A query parameter given at most once (400 if repeated)."""
        values = self.query.get(name)
        if not values:
            return None
        if len(values) > 1:
            raise ApiError(400, f"query parameter {name!r} is given {len(values)} times; "
                                "give it once")
        if "\x00" in values[0]:
            # Postgres text cannot hold NUL: refuse it here, not with a 500.
            raise ApiError(400, f"query parameter {name!r} contains a NUL character")
        return values[0]

    def int_param(self, name: str, default: int, *, low: int, high: int) -> int:
        raw = self.param(name)
        if raw is None:
            return default
        # [0-9], not \d: \d matches every script's digits ("５" is 5 to int()).
        if not _WHOLE_NUMBER.fullmatch(raw):
            raise ApiError(400, f"query parameter {name!r} must be a whole number, "
                                f"got {raw[:40]!r}")
        value = int(raw)
        if not low <= value <= high:
            raise ApiError(400, f"query parameter {name!r} must be {low}..{high}, got {value}")
        return value

    async def json_body(self) -> JsonBody:
        """The body: a JSON object of the route's fields (415 for another
        content type, 413 beyond MAX_BODY, 400 naming what is wrong)."""
        if self.body is None or self.body_fields is None:
            raise TypeError(f"{self.method} {self.path} takes no body")  # a bug: 500
        check_json_content_type(self.header("content-type"))
        return parse_json_object(await self.body.read(), self.body_fields)

    def path_id(self, name: str, what: str) -> int:
        """A bigint id: 1..2**63-1 in ASCII digits (400 otherwise)."""
        raw = self.path_params[name]
        if not _ID.fullmatch(raw) or not 1 <= int(raw) <= MAX_ID:
            raise ApiError(400, f"{what} id must be a whole number 1..{MAX_ID}, got "
                                f"{raw[:40]!r}")
        return int(raw)


class BodyReader:
    """Reads a request body once, at most ``limit`` bytes: a larger
    Content-Length is refused before reading, a body that grows past the
    limit as soon as it does."""

    def __init__(self, receive: Receive, content_length: str | None,
                 limit: int = MAX_BODY) -> None:
        self.receive = receive
        self.content_length = content_length
        self.limit = limit
        self._body: bytes | None = None

    def _too_large(self) -> ApiError:
        return ApiError(413, f"the request body is larger than {self.limit} bytes")

    async def read(self) -> bytes:
        if self._body is not None:
            return self._body
        if self.content_length is not None:
            if not _CONTENT_LENGTH.fullmatch(self.content_length.strip()):
                raise ApiError(400, "the Content-Length header is not a whole number")
            if int(self.content_length) > self.limit:
                raise self._too_large()
        with trio.move_on_after(BODY_TIMEOUT):
            self._body = await self._gather()
            return self._body
        raise ApiError(408, f"the request body did not arrive within {BODY_TIMEOUT:g} s")

    async def _gather(self) -> bytes:
        chunks: list[bytes] = []
        size = 0
        while True:
            message = await self.receive()
            kind = message.get("type")
            if kind == "http.disconnect":
                raise ApiError(400, "the client went away before sending the whole body")
            if kind != "http.request":
                continue
            chunk = message.get("body", b"")
            if not isinstance(chunk, bytes):
                raise ApiError(400, "malformed request body")
            size += len(chunk)
            if size > self.limit:
                raise self._too_large()
            chunks.append(chunk)
            if not message.get("more_body", False):
                break
        return b"".join(chunks)


def check_json_content_type(value: str | None) -> None:
    """application/json (charset, if given, utf-8), else 415."""
    media, _, rest = (value or "").partition(";")
    charset = rest.strip().lower().replace(" ", "")
    if media.strip().lower() != "application/json" \
            or charset not in ("", "charset=utf-8", 'charset="utf-8"'):
        raise ApiError(415, f"the request body must be application/json (UTF-8), got "
                            f"{(value or 'no Content-Type')[:60]!r}")


def _no_duplicates(pairs: list[tuple[str, object]]) -> dict[str, object]:
    out: dict[str, object] = {}
    for key, value in pairs:
        if key in out:
            raise ApiError(400, f"the request body gives field {key[:40]!r} twice; give it once")
        out[key] = value
    return out


def _no_constant(name: str) -> object:
    raise ApiError(400, f"the request body is not valid JSON: {name} is not a number")


def parse_json_object(raw: bytes, fields: frozenset[str]) -> JsonBody:
    """A JSON object holding only ``fields`` (400 naming the problem:
    invalid UTF-8 or JSON, not an object, a repeated or unknown field)."""
    try:
        text = raw.decode("utf-8")
    except UnicodeDecodeError as exc:
        raise ApiError(400, f"the request body is not valid UTF-8 (byte {exc.start})") from None
    try:
        value = json.loads(text, object_pairs_hook=_no_duplicates, parse_constant=_no_constant)
    except RecursionError:
        raise ApiError(400, "the request body is not valid JSON: nested too deeply") from None
    except ValueError as exc:  # JSONDecodeError, and ints beyond Python's digit limit
        raise ApiError(400, f"the request body is not valid JSON: {exc}") from None
    if not isinstance(value, dict):
        raise ApiError(400, f"the request body must be a JSON object, got "
                            f"{_json_kind(value)}")
    unknown = sorted(set(value) - fields)
    if unknown:
        raise ApiError(400, f"unknown field(s) {', '.join(repr(u[:40]) for u in unknown[:5])} "
                            f"in the request body; known: {', '.join(sorted(fields)) or 'none'}")
    return JsonBody(value)


def _json_kind(value: object) -> str:
    if value is None:
        return "null"
    if isinstance(value, bool):
        return "a boolean"
    if isinstance(value, int | float):
        return "a number"
    if isinstance(value, str):
        return "a string"
    return "an array"


class JsonBody:
    """A request body's fields, read with their type checked (400 naming
    the field otherwise)."""

    def __init__(self, fields: Mapping[str, object]) -> None:
        self.fields = fields

    def __contains__(self, name: str) -> bool:
        return name in self.fields

    def _missing(self, name: str) -> ApiError:
        return ApiError(400, f"the request body needs field {name!r}")

    def text(self, name: str, *, required: bool = True, max_length: int = 10_000) -> str | None:
        """A string of 1..max_length characters, no NUL (None if absent or
        null and not required)."""
        value = self.fields.get(name)
        if value is None:
            if required:
                raise self._missing(name)
            return None
        if not isinstance(value, str):
            raise ApiError(400, f"field {name!r} must be a string, got {_json_kind(value)}")
        if not 1 <= len(value) <= max_length:
            raise ApiError(400, f"field {name!r} must be 1..{max_length} characters")
        if "\x00" in value:
            raise ApiError(400, f"field {name!r} contains a NUL character")
        try:
            value.encode("utf-8")
        except UnicodeEncodeError:
            raise ApiError(400, f"field {name!r} contains a lone surrogate (\\ud800-\\udfff)"
                           ) from None
        return value

    def whole_number(self, name: str, *, low: int, high: int, nullable: bool = False
                     ) -> int | None:
        """An integer low..high; null only if ``nullable`` (the field is required)."""
        if name not in self.fields:
            raise self._missing(name)
        value = self.fields[name]
        if value is None and nullable:
            return None
        if isinstance(value, bool) or not isinstance(value, int):
            raise ApiError(400, f"field {name!r} must be a whole number"
                                f"{' or null' if nullable else ''}, got {_json_kind(value)}")
        if not low <= value <= high:
            raise ApiError(400, f"field {name!r} must be {low}..{high}, got {value}")
        return value


@dataclass(frozen=True, slots=True)
class Response:
    status: int
    body: bytes
    content_type: str
    headers: tuple[tuple[str, str], ...] = ()


@dataclass(frozen=True, slots=True)
class Stream:
    """A streamed response (Server-Sent Events). ``run`` writes chunks until
    it returns or the client goes away (then it is cancelled)."""

    run: Callable[[Write], Awaitable[None]]
    content_type: str
    headers: tuple[tuple[str, str], ...] = ()
    status: int = 200
    #: Called once the response is over, however it ended (also when it
    #: never started): gives back what the handler reserved for it.
    on_close: Callable[[], None] | None = None


def _json_default(value: object) -> str:
    if isinstance(value, datetime | date):
        return value.isoformat()
    raise TypeError(f"{type(value).__name__} is not JSON serializable")


def dumps(value: object) -> str:
    """Compact JSON (one line: safe inside an SSE ``data:`` field)."""
    return json.dumps(value, default=_json_default, ensure_ascii=False, separators=(",", ":"),
                      allow_nan=False)


def json_response(value: object, status: int = 200,
                  headers: Sequence[tuple[str, str]] = ()) -> Response:
    return Response(status, dumps(value).encode("utf-8"), "application/json",
                    tuple(headers))


def error_response(error: ApiError) -> Response:
    return json_response({"error": error.message}, error.status, error.headers)


Handler = Callable[[Request], Awaitable[Response | Stream]]


@dataclass(frozen=True, slots=True)
class Route:
    method: str
    pattern: re.Pattern[str]
    handler: Handler
    #: The query parameters this route reads; any other one is a 400 (a
    #: misspelt filter must not silently widen a search). None: the route
    #: reads none and ignores any (probes, the page, its assets).
    params: frozenset[str] | None = None
    #: The fields of the JSON body this route takes (None: no body; one
    #: sent is left unread).
    body: frozenset[str] | None = None


class Router:
    def __init__(self) -> None:
        self.routes: list[Route] = []

    def add(self, method: str, path: str, handler: Handler,
            params: Iterable[str] | None = None, body: Iterable[str] | None = None) -> None:
        """``path`` may hold ``{name}`` segments (one path segment each)."""
        regex = re.sub(r"\\\{(\w+)\\\}", r"(?P<\1>[^/]+)", re.escape(path))
        self.routes.append(Route(method, re.compile(regex + r"\Z"), handler,
                                 None if params is None else frozenset(params),
                                 None if body is None else frozenset(body)))

    def match(self, method: str, path: str) -> tuple[Route, dict[str, str]]:
        """The route (HEAD finds the GET route) and its path parameters."""
        allowed: list[str] = []
        for route in self.routes:
            found = route.pattern.match(path)
            if found is None:
                continue
            if route.method == method or (method == "HEAD" and route.method == "GET"):
                return route, found.groupdict()
            allowed.append(route.method)
            if route.method == "GET":
                allowed.append("HEAD")
        if allowed:
            raise ApiError(405, f"{method} is not allowed on {path[:200]}; use "
                                f"{' or '.join(sorted(set(allowed)))}",
                           [("allow", ", ".join(sorted(set(allowed))))])
        raise ApiError(404, f"no such endpoint: {path[:200]} (see /openapi.yaml)")


#: Sent with every response: nothing here may be sniffed, framed or cached.
_COMMON_HEADERS = (("x-content-type-options", "nosniff"), ("referrer-policy", "no-referrer"))


def _parse_request(scope: Scope) -> Request:
    method = scope.get("method")
    path = scope.get("path")
    query = scope.get("query_string", b"")
    raw_headers = scope.get("headers", ())
    if not isinstance(method, str) or not isinstance(path, str) \
            or not isinstance(query, bytes) or not isinstance(raw_headers, Iterable):
        raise ApiError(400, "malformed request")
    headers: dict[str, str] = {}
    for item in raw_headers:
        if not (isinstance(item, tuple | list) and len(item) == 2
                and isinstance(item[0], bytes) and isinstance(item[1], bytes)):
            raise ApiError(400, "malformed request header")
        # latin-1 maps bytes 1:1, so the raw bytes can be recovered (tokens).
        name, value = item[0].decode("latin-1").lower(), item[1].decode("latin-1")
        headers[name] = f"{headers[name]}, {value}" if name in headers else value
    try:
        # surrogateescape, not parse_qsl's default "replace": a percent-encoded
        # byte that is not UTF-8 (%ff) was read as U+FFFD and searched for.
        # The escapes survive into the pairs, so the error can name the field.
        pairs = parse_qsl(query.decode("utf-8"), keep_blank_values=True,
                          strict_parsing=False, max_num_fields=50, errors="surrogateescape")
    except (UnicodeDecodeError, ValueError) as exc:
        raise ApiError(400, f"the query string cannot be parsed: {exc}") from None
    params: dict[str, list[str]] = {}
    for name, value in pairs:
        if not _is_utf8(name):
            raise ApiError(400, "a query parameter name is not valid UTF-8 once "
                                "percent-decoded")
        if not _is_utf8(value):
            raise ApiError(400, f"query parameter {name[:40]!r} is not valid UTF-8 once "
                                "percent-decoded")
        params.setdefault(name, []).append(value)
    return Request(method.upper(), path, headers, params)


def _is_utf8(text: str) -> bool:
    """False if ``text`` holds a byte surrogateescape kept (not UTF-8)."""
    try:
        text.encode("utf-8")
    except UnicodeEncodeError:
        return False
    return True


def _with_cache_default(headers: Sequence[tuple[str, str]]) -> list[tuple[str, str]]:
    """The response's own headers, plus ``cache-control: no-store`` unless it
    sets one (exactly one Cache-Control header either way)."""
    out = list(headers)
    if not any(name == "cache-control" for name, _ in out):
        out.append(("cache-control", "no-store"))
    return out


def _header_list(pairs: Iterable[tuple[str, str]]) -> list[tuple[bytes, bytes]]:
    return [(name.encode("latin-1"), value.encode("latin-1")) for name, value in pairs]


class AsgiApp:
    """The ASGI callable: route, run the handler, translate errors once."""

    def __init__(self, router: Router) -> None:
        self.router = router

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        kind = scope.get("type")
        if kind == "lifespan":
            await self._lifespan(receive, send)
            return
        if kind != "http":  # websockets: not offered
            if kind == "websocket":
                await send({"type": "websocket.close", "code": 1003})
            return
        result = await self._respond(scope, receive)
        head = scope.get("method") == "HEAD"
        if isinstance(result, Response):
            await self._send_response(send, result, head=head)
            return
        try:
            if head:
                await self._send_response(
                    send, Response(result.status, b"", result.content_type, result.headers),
                    head=True, length=False)
            else:
                await self._send_stream(receive, send, result)
        finally:
            if result.on_close is not None:
                result.on_close()

    async def _respond(self, scope: Scope, receive: Receive) -> Response | Stream:
        try:
            request = _parse_request(scope)
            route, params = self.router.match(request.method, request.path)
            if route.params is not None and set(request.query) - route.params:
                unknown = sorted(set(request.query) - route.params)
                known = ", ".join(sorted(route.params)) or "none"
                raise ApiError(400, f"unknown query parameter(s) "
                                    f"{', '.join(repr(u[:40]) for u in unknown[:5])} on "
                                    f"{request.path}; known: {known}")
            body = None if route.body is None \
                else BodyReader(receive, request.header("content-length"))
            return await route.handler(Request(request.method, request.path, request.headers,
                                               request.query, params,
                                               head=request.method == "HEAD",
                                               body=body, body_fields=route.body))
        except ApiError as exc:
            return error_response(exc)
        except (DatabaseTransient, IndexUnavailable) as exc:
            # The details (database names, SQL, hosts) go to the log, not to
            # whoever holds a token (found by an audit). A statement or lock
            # timeout is an outage too, not a failed request (500).
            log.warning("api: a backend is unavailable: %s", exc)
            what = "the search index is unavailable or busy" if isinstance(exc, IndexUnavailable) \
                else "the database cannot be reached" if isinstance(exc, DatabaseUnavailable) \
                else "the database is busy"
            return error_response(ApiError(
                503, f"temporarily unavailable: {what}; retry later",
                [("retry-after", str(UNAVAILABLE_RETRY_AFTER_S))]))
        except NexarchError as exc:
            log.exception("api: request failed")
            return error_response(ApiError(500, f"the request failed ({type(exc).__name__}); "
                                                "the server log has the details"))
        except Exception as exc:
            # A bug must cost one request, not the server; the log has the traceback.
            log.exception("api: unexpected error")
            return error_response(ApiError(500, f"internal error ({type(exc).__name__}); "
                                                "the server log has the details"))

    async def _send_response(self, send: Send, response: Response, *, head: bool = False,
                             length: bool = True) -> None:
        """``head``: the headers a GET would get, and no body."""
        headers = [("content-type", response.content_type), *_COMMON_HEADERS,
                   *_with_cache_default(response.headers)]
        if length:
            headers.insert(1, ("content-length", str(len(response.body))))
        await send({"type": "http.response.start", "status": response.status,
                    "headers": _header_list(headers)})
        await send({"type": "http.response.body", "body": b"" if head else response.body,
                    "more_body": False})

    async def _send_stream(self, receive: Receive, send: Send, stream: Stream) -> None:
        headers = [("content-type", stream.content_type), *_COMMON_HEADERS,
                   *_with_cache_default(stream.headers)]
        await send({"type": "http.response.start", "status": stream.status,
                    "headers": _header_list(headers)})

        async def write(chunk: bytes) -> None:
            await send({"type": "http.response.body", "body": chunk, "more_body": True})

        async with trio.open_nursery() as nursery:
            async def watch_disconnect() -> None:
                while True:
                    message = await receive()
                    if message.get("type") == "http.disconnect":
                        nursery.cancel_scope.cancel()
                        return

            nursery.start_soon(watch_disconnect)
            await stream.run(write)
            await send({"type": "http.response.body", "body": b"", "more_body": False})
            nursery.cancel_scope.cancel()

    async def _lifespan(self, receive: Receive, send: Send) -> None:
        while True:
            message = await receive()
            if message.get("type") == "lifespan.startup":
                await send({"type": "lifespan.startup.complete"})
            elif message.get("type") == "lifespan.shutdown":
                await send({"type": "lifespan.shutdown.complete"})
                return

