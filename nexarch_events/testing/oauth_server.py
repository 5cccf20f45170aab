"""A local OAuth2 token endpoint for tests (RFC 6749 sections 4.4 and 6).

It answers the client-credentials and refresh-token grants over real HTTP
on a loopback port, counts requests, and can be told to refuse, fail or
expire, so sign-in code is tested against the wire rather than a mock:

    endpoint = TokenEndpoint(client_id="app", client_secret="s3cret")
    async with trio.open_nursery() as nursery:
        await nursery.start(endpoint.serve)
        ...  # OAuthClient(token_url=endpoint.url, client_id="app", ...)
        assert endpoint.is_valid(token)

Tokens are random; ``is_valid`` is what a scripted IMAP server asks when a
client authenticates with one. A real IMAP server asks over HTTP: the
endpoint also answers RFC 7662 token introspection at ``introspection_url``
(Dovecot's oauth2 passdb with ``introspection_mode = post``).
"""

from __future__ import annotations

import base64
import json
import secrets
import time
import urllib.parse
from dataclasses import dataclass, field

import h11
import trio
from cryptography import x509
from cryptography.exceptions import InvalidSignature
from cryptography.hazmat.primitives import hashes
from cryptography.hazmat.primitives.asymmetric import padding, rsa


@dataclass
class TokenEndpoint:
    client_id: str
    client_secret: str
    #: Refresh tokens it accepts (the refresh-token grant); empty: only the
    #: client-credentials grant is served.
    refresh_tokens: set[str] = field(default_factory=set)
    #: ``expires_in`` of the tokens it issues.
    lifetime: int = 3600
    #: Issue a new refresh token with every refresh (as Microsoft does); the
    #: old one stops working.
    rotate: bool = False
    #: Answer every request with this OAuth error (``invalid_grant`` ...) and 400.
    refuse: str | None = None
    #: With ``refuse``: the error_description quotes the request's form,
    #: secrets and all (some providers' diagnostics do).
    echo_form: bool = False
    #: Answer every request with this HTTP status (e.g. 503) instead.
    fail_status: int | None = None
    #: Answer 200 with ``Content-Encoding: gzip`` on a body that is not gzip
    #: (a broken proxy or provider): the client cannot decode it.
    garbled_encoding: bool = False
    retry_after: int | None = None
    #: Whose tokens these are: what the introspection endpoint reports as
    #: ``username`` (an IMAP server validating a token asks it).
    subject: str = "alice"
    #: A PEM certificate: the client may prove itself with a JWT assertion
    #: signed by its key (RFC 7523) instead of the secret; the signature,
    #: audience, issuer and lifetime are checked.
    client_certificate: str | None = None
    #: Every request's form fields, in order (secrets included: a test tool).
    requests: list[dict[str, str]] = field(default_factory=list)
    url: str = ""
    introspection_url: str = ""
    #: Introspection requests answered (tokens a server checked).
    introspections: int = 0
    _tokens: set[str] = field(default_factory=set)

    def is_valid(self, token: str) -> bool:
        return token in self._tokens

    def expire_all(self) -> None:
        """Revoke every token issued so far (as if their lifetime ran out)."""
        self._tokens.clear()

    async def serve(self, *, task_status: trio.TaskStatus[str] = trio.TASK_STATUS_IGNORED
                    ) -> None:
        """Serve on 127.0.0.1 (a free port) until cancelled; ``url`` is set
        and returned through ``task_status`` once it listens."""
        listeners = await trio.open_tcp_listeners(0, host="127.0.0.1")
        port = listeners[0].socket.getsockname()[1]
        self.url = f"http://127.0.0.1:{port}/oauth2/token"
        self.introspection_url = f"http://127.0.0.1:{port}/oauth2/introspect"
        async with trio.open_nursery() as nursery:
            nursery.start_soon(trio.serve_listeners, self._connection, listeners)
            task_status.started(self.url)

    async def _connection(self, stream: trio.SocketStream) -> None:
        conn = h11.Connection(h11.SERVER)
        async with stream:
            while True:
                request, body = await _read_request(conn, stream)
                if request is None:
                    return
                status, headers, payload = self._answer(request, body)
                data = json.dumps(payload).encode()
                if self.garbled_encoding:
                    headers = [*headers, ("content-encoding", "gzip")]
                headers = [("content-type", "application/json"),
                           ("content-length", str(len(data))), *headers]
                await stream.send_all(conn.send(h11.Response(status_code=status,
                                                             headers=headers)) or b"")
                await stream.send_all(conn.send(h11.Data(data=data)) or b"")
                await stream.send_all(conn.send(h11.EndOfMessage()) or b"")
                if conn.our_state is not h11.DONE or conn.their_state is not h11.DONE:
                    return
                try:
                    conn.start_next_cycle()
                except h11.LocalProtocolError:
                    return

    def _answer(self, request: h11.Request, body: bytes
                ) -> tuple[int, list[tuple[str, str]], dict[str, object]]:
        form = dict(urllib.parse.parse_qsl(body.decode("utf-8", "replace")))
        if request.target.startswith(b"/oauth2/introspect"):
            self.introspections += 1
            token = form.get("token", "")
            if not self.is_valid(token):
                return 200, [], {"active": False}
            return 200, [], {"active": True, "username": self.subject, "token_type": "Bearer"}
        self.requests.append(form)
        if request.method != b"POST" or not request.target.startswith(b"/oauth2/token"):
            return 404, [], {"error": "not_found"}
        if self.fail_status is not None:
            extra = [("retry-after", str(self.retry_after))] if self.retry_after else []
            return self.fail_status, extra, {"error": "temporarily_unavailable"}
        if self.refuse is not None:
            said = "refused by the test endpoint"
            if self.echo_form:
                said += ": invalid request " + " ".join(f"{k}={v}" for k, v in form.items())
            return 400, [], {"error": self.refuse, "error_description": said}
        if form.get("client_id") != self.client_id:
            return 400, [], {"error": "invalid_client", "error_description": "unknown client"}
        grant = form.get("grant_type")
        answer: dict[str, object]
        if grant == "client_credentials":
            if not self._authenticated(form):
                return 401, [], {"error": "invalid_client",
                                 "error_description": "client authentication failed"}
            answer = {}
        elif grant == "refresh_token":
            if form.get("refresh_token") not in self.refresh_tokens:
                return 400, [], {"error": "invalid_grant",
                                 "error_description": "the refresh token is not valid"}
            answer = {}
            if self.rotate:
                self.refresh_tokens.discard(form["refresh_token"])
                fresh = secrets.token_urlsafe(24)
                self.refresh_tokens.add(fresh)
                answer["refresh_token"] = fresh
        else:
            return 400, [], {"error": "unsupported_grant_type"}
        token = secrets.token_urlsafe(32)
        self._tokens.add(token)
        answer |= {"access_token": token, "token_type": "Bearer", "expires_in": self.lifetime}
        return 200, [], answer


    def _authenticated(self, form: dict[str, str]) -> bool:
        if "client_assertion" not in form:
            return form.get("client_secret") == self.client_secret
        if self.client_certificate is None or form.get("client_assertion_type") != \
                "urn:ietf:params:oauth:client-assertion-type:jwt-bearer":
            return False
        try:
            head, body, signature = form["client_assertion"].split(".")
            claims = json.loads(_unb64(body))
            public_key = x509.load_pem_x509_certificate(
                self.client_certificate.encode()).public_key()
            assert isinstance(public_key, rsa.RSAPublicKey)
            public_key.verify(_unb64(signature), f"{head}.{body}".encode(),
                              padding.PKCS1v15(), hashes.SHA256())
        except (ValueError, AssertionError, InvalidSignature):
            return False
        now = time.time()
        lifetime_ok = bool(claims.get("nbf", now) - 60 <= now < claims.get("exp", 0))
        return (claims.get("aud") == self.url and claims.get("iss") == self.client_id
                and claims.get("sub") == self.client_id and lifetime_ok)


def _unb64(text: str) -> bytes:
    return base64.urlsafe_b64decode(text + "=" * (-len(text) % 4))


async def _read_request(conn: h11.Connection, stream: trio.SocketStream
                        ) -> tuple[h11.Request | None, bytes]:
    request: h11.Request | None = None
    body = bytearray()
    while True:
        try:
            event = conn.next_event()
        except h11.RemoteProtocolError:
            return None, b""
        if event is h11.NEED_DATA:
            try:
                data = await stream.receive_some(65536)
            except trio.BrokenResourceError:
                return None, b""
            conn.receive_data(data)
            if not data and conn.their_state is h11.IDLE:
                return None, b""
            continue
        if isinstance(event, h11.Request):
            request = event
        elif isinstance(event, h11.Data):
            body += event.data
            if len(body) > 1_000_000:
                return None, b""
        elif isinstance(event, h11.EndOfMessage):
            return request, bytes(body)
        elif isinstance(event, h11.ConnectionClosed):
            return None, b""
