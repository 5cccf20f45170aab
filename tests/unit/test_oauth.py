"""OAuth2 tokens for IMAP sign-in: both grants against a real local token
endpoint (nexarch_events.testing.oauth_server, over loopback HTTP), the
cache and refresh-ahead on an injected clock, the backoff that keeps a
refused or failing endpoint from being hammered, and answers that must not
be trusted (scripted with an httpx transport)."""

from __future__ import annotations

import base64
import json
import logging
from collections.abc import AsyncIterator
from datetime import UTC, datetime, timedelta

import httpx
import pytest
import trio

from nexarch_events.errors import ConfigurationError, OAuthRefused, OAuthUnavailable
from nexarch_events.importer.oauth import (
    CLIENT_ASSERTION_TYPE,
    MIN_LIFETIME_S,
    REFUSED_FLOOR_S,
    OAuthClient,
    TokenSource,
)
from nexarch_events.testing.oauth_server import TokenEndpoint

SECRET = "client-s3cret-NOT-FOR-LOGS"
REFRESH = "refresh-t0ken-NOT-FOR-LOGS"
ENV = {"APP_SECRET": SECRET, "APP_REFRESH": REFRESH}


class Clock:
    def __init__(self) -> None:
        self.now = 1000.0

    def __call__(self) -> float:
        return self.now


@pytest.fixture
async def endpoint() -> AsyncIterator[TokenEndpoint]:
    server = TokenEndpoint(client_id="archive-app", client_secret=SECRET,
                           refresh_tokens={REFRESH})
    async with trio.open_nursery() as nursery:
        await nursery.start(server.serve)
        yield server
        nursery.cancel_scope.cancel()


def source(endpoint: TokenEndpoint, clock: Clock, *, refresh: bool = False) -> TokenSource:
    client = OAuthClient(token_url=endpoint.url, client_id="archive-app",
                         client_secret_ref="env:APP_SECRET",
                         refresh_token_ref="env:APP_REFRESH" if refresh else None,
                         scope="https://outlook.office365.com/.default")
    return TokenSource(client, secret_key=None, clock=clock, environ=ENV)


async def test_client_credentials_token_is_fetched_once_and_cached(
        endpoint: TokenEndpoint) -> None:
    clock = Clock()
    async with source(endpoint, clock) as tokens:
        first = await tokens.token()
        for _ in range(5):
            assert await tokens.token() == first
    assert endpoint.is_valid(first)
    [form] = endpoint.requests
    assert form == {"grant_type": "client_credentials", "client_id": "archive-app",
                    "client_secret": SECRET,
                    "scope": "https://outlook.office365.com/.default"}


async def test_token_is_refreshed_ahead_of_expiry_not_after(endpoint: TokenEndpoint) -> None:
    clock = Clock()
    async with source(endpoint, clock) as tokens:
        first = await tokens.token()
        left = tokens.seconds_left()
        assert left == 3600
        clock.now += 3600 - 301  # still well inside the lifetime: cached
        assert await tokens.token() == first
        clock.now += 2  # within 5 minutes of expiry: a new one, before the old expires
        second = await tokens.token()
    assert second != first and endpoint.is_valid(second)
    assert len(endpoint.requests) == 2


async def test_refresh_token_grant_follows_a_rotated_refresh_token(
        endpoint: TokenEndpoint) -> None:
    endpoint.rotate = True
    clock = Clock()
    async with source(endpoint, clock, refresh=True) as tokens:
        await tokens.token()
        clock.now += 3600
        await tokens.token()  # must present the rotated refresh token, not the old one
        clock.now += 3600
        await tokens.token()
    assert [r["grant_type"] for r in endpoint.requests] == ["refresh_token"] * 3
    assert endpoint.requests[0]["refresh_token"] == REFRESH
    assert endpoint.requests[1]["refresh_token"] != REFRESH


async def test_a_refused_token_is_a_clear_error_and_is_not_asked_again_within_backoff(
        endpoint: TokenEndpoint, caplog: pytest.LogCaptureFixture) -> None:
    caplog.set_level(logging.DEBUG)
    endpoint.refuse = "invalid_grant"
    clock = Clock()
    async with source(endpoint, clock, refresh=True) as tokens:
        with pytest.raises(OAuthRefused) as refused:
            await tokens.token()
        for _ in range(20):  # a sync loop, "sync now" requests, restarts of the runner ...
            clock.now += 2
            with pytest.raises(OAuthRefused):
                await tokens.token()
        assert len(endpoint.requests) == 1
        clock.now += REFUSED_FLOOR_S
        with pytest.raises(OAuthRefused):
            await tokens.token()
        assert len(endpoint.requests) == 2
        # The wait grows: right after the second refusal nothing is asked.
        clock.now += REFUSED_FLOOR_S + 1
        with pytest.raises(OAuthRefused):
            await tokens.token()
        assert len(endpoint.requests) == 2
    message = str(refused.value)
    assert message.startswith("sign-in refused by the provider") and "invalid_grant" in message
    logged = "\n".join(r.getMessage() for r in caplog.records)
    for secret in (SECRET, REFRESH):
        assert secret not in message and secret not in logged


async def test_an_outage_honours_retry_after_and_keeps_a_still_valid_token(
        endpoint: TokenEndpoint) -> None:
    clock = Clock()
    async with source(endpoint, clock) as tokens:
        first = await tokens.token()
        endpoint.fail_status, endpoint.retry_after = 503, 120
        clock.now += 3600 - 200  # refresh due; the endpoint is down
        assert await tokens.token() == first  # still valid for 200 s: keep using it
        assert len(endpoint.requests) == 2
        clock.now += 100
        assert await tokens.token() == first  # Retry-After 120 s: not asked again yet
        assert len(endpoint.requests) == 2
        clock.now += 150  # expired, and the endpoint still down
        with pytest.raises(OAuthUnavailable, match="HTTP 503"):
            await tokens.token()
        assert len(endpoint.requests) == 3
        endpoint.fail_status = None
        clock.now += 60  # the second failure said Retry-After 120 s too
        with pytest.raises(OAuthUnavailable):
            await tokens.token()
        assert len(endpoint.requests) == 3
        clock.now += 61
        assert endpoint.is_valid(await tokens.token())


async def test_an_unreachable_endpoint_is_unavailable(endpoint: TokenEndpoint) -> None:
    with trio.socket.socket() as probe:  # a port nothing listens on
        await probe.bind(("127.0.0.1", 0))
        port = probe.getsockname()[1]
    client = OAuthClient(token_url=f"http://127.0.0.1:{port}/token", client_id="a",
                         client_secret_ref="env:APP_SECRET")
    async with TokenSource(client, secret_key=None, environ=ENV) as tokens:
        with pytest.raises(OAuthUnavailable, match="ConnectError"):
            await tokens.token()


@pytest.mark.parametrize("refresh", [False, True])
async def test_a_provider_that_echoes_the_request_puts_no_secret_in_the_error(
        endpoint: TokenEndpoint, refresh: bool) -> None:
    """The provider's error text is logged and stored as the mailbox's
    last_error: what it echoes of the client secret or the refresh token
    is left out (found by a security audit)."""
    endpoint.refuse, endpoint.echo_form = "invalid_client", True
    async with source(endpoint, Clock(), refresh=refresh) as tokens:
        with pytest.raises(OAuthRefused) as refused:
            await tokens.token()
    text = str(refused.value)
    assert "invalid request client_id=" in text and "client_secret=***" in text, text
    assert SECRET not in text and REFRESH not in text
    assert ("refresh_token=***" in text) is refresh


async def test_an_answer_that_cannot_be_decoded_is_an_outage(endpoint: TokenEndpoint) -> None:
    """A 200 whose body is not the gzip its Content-Encoding names raised
    httpx.DecodingError out of the token source, and the service exited
    70 at every start (a retry-loop audit): it is the provider's fault."""
    endpoint.garbled_encoding = True
    clock = Clock()
    async with source(endpoint, clock) as tokens:
        with pytest.raises(OAuthUnavailable, match=r"cannot be read \(DecodingError\)"):
            await tokens.token()
        endpoint.garbled_encoding = False
        clock.now += 61  # past the retry floor
        assert endpoint.is_valid(await tokens.token())


async def test_concurrent_callers_share_one_request(endpoint: TokenEndpoint) -> None:
    clock = Clock()
    got: list[str] = []
    async with source(endpoint, clock) as tokens:
        async def one() -> None:
            got.append(await tokens.token())

        async with trio.open_nursery() as nursery:
            for _ in range(10):
                nursery.start_soon(one)
    assert len(set(got)) == 1 and len(endpoint.requests) == 1


def scripted(status: int, body: object, clock: Clock) -> TokenSource:
    def answer(request: httpx.Request) -> httpx.Response:
        return httpx.Response(status, json=body)

    client = OAuthClient(token_url="https://login.example.org/token", client_id="a",
                         client_secret_ref="env:APP_SECRET")
    return TokenSource(client, secret_key=None, clock=clock, environ=ENV,
                       transport=httpx.MockTransport(answer))


@pytest.mark.parametrize("body", [
    {"token_type": "Bearer", "expires_in": 3600},                      # no token
    {"access_token": "", "token_type": "Bearer"},                     # empty
    {"access_token": "abc def\r\nA1 LOGOUT", "token_type": "Bearer"},  # would inject
    {"access_token": 12345, "token_type": "Bearer"},                  # not a string
    {"access_token": "abc", "token_type": "mac"},                     # not a bearer token
    ["access_token", "abc"],                                          # not an object
])
async def test_a_200_without_a_usable_token_is_an_error_not_a_token(body: object) -> None:
    async with scripted(200, body, Clock()) as tokens:
        with pytest.raises(OAuthUnavailable):
            await tokens.token()


@pytest.mark.parametrize(("expires_in", "lifetime"), [
    (0, MIN_LIFETIME_S), (-5, MIN_LIFETIME_S), (10**12, 86_400.0), ("abc", 300.0),
    (None, 300.0), ("900", 900.0), (True, 300.0),
])
async def test_expires_in_is_clamped(expires_in: object, lifetime: float) -> None:
    clock = Clock()
    body = {"access_token": "tok.en-1", "token_type": "Bearer", "expires_in": expires_in}
    async with scripted(200, body, clock) as tokens:
        assert await tokens.token() == "tok.en-1"
        assert tokens.seconds_left() == lifetime


@pytest.mark.parametrize(("status", "error"), [
    (400, OAuthRefused), (401, OAuthRefused), (429, OAuthUnavailable),
    (500, OAuthUnavailable), (302, OAuthUnavailable),
])
async def test_error_statuses_are_sorted(status: int, error: type[Exception]) -> None:
    async with scripted(status, {"error": "invalid_client"}, Clock()) as tokens:
        with pytest.raises(error):
            await tokens.token()


@pytest.mark.parametrize("url", ["http://login.example.org/token", "ftp://127.0.0.1/x",
                                 "not a url", "https:///token"])
def test_token_url_must_be_https_except_on_loopback(url: str) -> None:
    with pytest.raises(ConfigurationError, match="token URL"):
        OAuthClient(token_url=url, client_id="a", client_secret_ref="env:X")


def test_loopback_http_and_https_token_urls_are_accepted() -> None:
    for url in ("http://127.0.0.1:8080/t", "http://[::1]/t", "http://localhost/t",
                "https://login.microsoftonline.com/tid/oauth2/v2.0/token"):
        OAuthClient(token_url=url, client_id="a", client_secret_ref="env:X")


def test_a_client_needs_a_secret_or_a_refresh_token() -> None:
    with pytest.raises(ConfigurationError, match="client secret"):
        OAuthClient(token_url="https://x.example/t", client_id="a")


# -- certificate credentials (RFC 7523 client assertion, as Entra ID uses) ----

def certificate_pem(common_name: str = "archive-app") -> tuple[str, str]:
    """(key + certificate PEM, certificate PEM) of a fresh self-signed RSA key."""
    from cryptography import x509
    from cryptography.hazmat.primitives import hashes, serialization
    from cryptography.hazmat.primitives.asymmetric import rsa
    from cryptography.x509.oid import NameOID

    key = rsa.generate_private_key(public_exponent=65537, key_size=2048)
    name = x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, common_name)])
    now = datetime.now(UTC)
    cert = (x509.CertificateBuilder().subject_name(name).issuer_name(name)
            .public_key(key.public_key()).serial_number(x509.random_serial_number())
            .not_valid_before(now - timedelta(days=1)).not_valid_after(now + timedelta(days=30))
            .sign(key, hashes.SHA256()))
    cert_pem = cert.public_bytes(serialization.Encoding.PEM).decode()
    key_pem = key.private_bytes(serialization.Encoding.PEM, serialization.PrivateFormat.PKCS8,
                                serialization.NoEncryption()).decode()
    return key_pem + cert_pem, cert_pem


def certificate_source(endpoint: TokenEndpoint, pem: str) -> TokenSource:
    client = OAuthClient(token_url=endpoint.url, client_id="archive-app",
                         client_certificate_ref="env:APP_CERT",
                         scope="https://outlook.office365.com/.default")
    return TokenSource(client, secret_key=None, clock=Clock(),
                       environ={**ENV, "APP_CERT": pem})


async def test_a_certificate_proves_the_client_instead_of_a_secret(
        endpoint: TokenEndpoint) -> None:
    both, cert = certificate_pem()
    endpoint.client_certificate = cert
    async with certificate_source(endpoint, both) as tokens:
        assert endpoint.is_valid(await tokens.token())
    [form] = endpoint.requests
    assert "client_secret" not in form
    assert form["client_assertion_type"] == CLIENT_ASSERTION_TYPE
    head, body, _ = form["client_assertion"].split(".")
    header = json.loads(base64.urlsafe_b64decode(head + "=" * (-len(head) % 4)))
    claims = json.loads(base64.urlsafe_b64decode(body + "=" * (-len(body) % 4)))
    assert header["alg"] == "RS256" and header["x5t"] and header["x5t#S256"]
    assert (claims["aud"], claims["iss"], claims["sub"]) == (endpoint.url, "archive-app",
                                                             "archive-app")
    assert claims["exp"] - claims["nbf"] == 300 and claims["jti"]


async def test_a_certificate_the_provider_does_not_know_is_refused(
        endpoint: TokenEndpoint) -> None:
    endpoint.client_certificate = certificate_pem()[1]
    other, _ = certificate_pem()  # another key
    async with certificate_source(endpoint, other) as tokens:
        with pytest.raises(OAuthRefused, match="invalid_client"):
            await tokens.token()


async def test_a_certificate_without_an_rsa_key_is_a_configuration_error(
        endpoint: TokenEndpoint) -> None:
    async with certificate_source(endpoint, "-----BEGIN NONSENSE-----") as tokens:
        with pytest.raises(ConfigurationError, match="PEM"):
            await tokens.token()
    assert endpoint.requests == []


def test_a_client_has_a_secret_or_a_certificate_not_both() -> None:
    with pytest.raises(ConfigurationError, match="not both"):
        OAuthClient(token_url="https://x.example/t", client_id="a", client_secret_ref="env:S",
                    client_certificate_ref="env:C")


async def test_a_token_the_imap_server_refuses_is_replaced_once_then_backed_off(
        endpoint: TokenEndpoint) -> None:
    clock = Clock()
    async with source(endpoint, clock, refresh=True) as tokens:
        first = await tokens.token()
        tokens.reject(first, "XOAUTH2 sign-in refused: status 401")
        second = await tokens.token()  # a stale token: a new one at once
        assert second != first and len(endpoint.requests) == 2
        tokens.reject(second, "XOAUTH2 sign-in refused: status 401")
        for _ in range(20):  # the provider means it: no new token within the backoff
            clock.now += 2
            with pytest.raises(OAuthRefused) as refused:
                await tokens.token()
        assert len(endpoint.requests) == 2
        message = str(refused.value)
        assert message.startswith("sign-in refused by the provider: the IMAP server refused "
                                  "2 access token(s) in a row (XOAUTH2 sign-in refused")
        assert first not in message and second not in message
        clock.now += REFUSED_FLOOR_S
        third = await tokens.token()
        assert len(endpoint.requests) == 3
        tokens.accepted()  # a sign-in worked: the next refusal is a stale token again
        tokens.reject(third, "refused")
        await tokens.token()
        assert len(endpoint.requests) == 4
        # Rejecting a token that is no longer cached leaves the cache alone.
        current = await tokens.token()
        tokens.accepted()
        tokens.reject("some-older-token", "refused")
        assert await tokens.token() == current


async def test_one_stale_token_refused_by_many_sign_ins_counts_once(
        endpoint: TokenEndpoint) -> None:
    """A source shared by an account's folders (importer/signin.py
    TokenSources): when the provider revokes the cached token, each folder's
    sign-in with it is refused. Each refusal counted, so the second folder's
    made it "2 tokens refused in a row" and the whole account waited the
    refusal backoff (60 s doubling to 300 s) without ever trying a new token
    (a review audit)."""
    clock = Clock()
    async with source(endpoint, clock, refresh=True) as tokens:
        stale = await tokens.token()
        for _ in range(5):  # five folders, the same stale token
            tokens.reject(stale, "XOAUTH2 sign-in refused: status 401")
        fresh = await tokens.token()
        assert fresh != stale and len(endpoint.requests) == 2
        tokens.reject(fresh, "refused")  # a new token refused too: the provider means it
        with pytest.raises(OAuthRefused, match="refused 2 access token"):
            await tokens.token()
