"""OAuth2 sign-in against a real IMAP server: Dovecot's oauth2 passdb checks
each token by RFC 7662 introspection against the local token endpoint
(nexarch_events.testing.oauth_server), so the token the importer got from
the endpoint is the one the server accepts or refuses."""

from __future__ import annotations

from collections.abc import AsyncIterator

import pytest
import trio

from nexarch_events.aio.imap import ImapEndpoint, ImapSession
from nexarch_events.errors import ImapAuthError
from nexarch_events.importer.oauth import OAuthClient, TokenSource
from nexarch_events.importer.sasl import OAUTHBEARER, XOAUTH2, OAuthLogin
from nexarch_events.testing.oauth_server import TokenEndpoint
from tests.support.dovecot import Dovecot

SECRET = "dovecot-test-client-secret"


@pytest.fixture
async def endpoint() -> AsyncIterator[TokenEndpoint]:
    server = TokenEndpoint(client_id="archive-app", client_secret=SECRET, subject="alice")
    async with trio.open_nursery() as nursery:
        await nursery.start(server.serve)
        yield server
        nursery.cancel_scope.cancel()


@pytest.fixture
async def oauth_dovecot(endpoint: TokenEndpoint) -> AsyncIterator[Dovecot]:
    server = Dovecot(oauth2_introspection_url=endpoint.introspection_url)
    # Dovecot asks the endpoint (served by this trio loop) while it starts
    # and signs in, so its blocking calls run in a thread.
    await trio.to_thread.run_sync(server.start)
    try:
        yield server
    finally:
        await trio.to_thread.run_sync(server.stop)


def imap(dovecot: Dovecot) -> ImapEndpoint:
    return ImapEndpoint(host=dovecot.host, port=dovecot.port, tls="starttls",
                        ca_file=dovecot.ca_file, timeout=30.0)


async def token_for(endpoint: TokenEndpoint) -> str:
    client = OAuthClient(token_url=endpoint.url, client_id="archive-app",
                         client_secret_ref="env:SECRET")
    async with TokenSource(client, secret_key=None, environ={"SECRET": SECRET}) as tokens:
        return await tokens.token()


class OnlyXoauth2(OAuthLogin):
    """As if the server offered XOAUTH2 alone (Dovecot offers both)."""

    def credential(self, capabilities: frozenset[str], host: str, port: int
                   ) -> tuple[str, str, str]:
        return super().credential(capabilities - {"AUTH=OAUTHBEARER"}, host, port)


class Recorded:
    """Records the mechanism each sign-in used."""

    def __init__(self, inner: OAuthLogin) -> None:
        self.inner, self.username, self.used = inner, inner.username, list[str]()

    def credential(self, capabilities: frozenset[str], host: str, port: int
                   ) -> tuple[str, str, str]:
        chosen = self.inner.credential(capabilities, host, port)
        self.used.append(chosen[0])
        return chosen

    def describe_failure(self, challenge: str) -> str:
        return self.inner.describe_failure(challenge)


@pytest.mark.parametrize(("login_type", "mechanism"),
                         [(OAuthLogin, OAUTHBEARER), (OnlyXoauth2, XOAUTH2)])
async def test_a_token_from_the_endpoint_signs_in(
        aio_loop: None, endpoint: TokenEndpoint, oauth_dovecot: Dovecot,
        login_type: type[OAuthLogin], mechanism: str) -> None:
    token = await token_for(endpoint)
    login = Recorded(login_type("alice", token))
    session = await ImapSession.open_sasl(imap(oauth_dovecot), login)
    try:
        await session.examine('"INBOX"')
    finally:
        await session.aclose()
    assert login.used == [mechanism]
    assert endpoint.introspections >= 1


@pytest.mark.parametrize("login_type", [OAuthLogin, OnlyXoauth2])
async def test_a_revoked_token_is_refused_at_once_with_the_reason(
        aio_loop: None, endpoint: TokenEndpoint, oauth_dovecot: Dovecot,
        login_type: type[OAuthLogin]) -> None:
    token = await token_for(endpoint)
    endpoint.expire_all()
    # Unanswered, the server's error challenge would hold the command until
    # the 30 s timeout and end as "unavailable"; answered, it is a refusal.
    with pytest.raises(ImapAuthError, match="refused") as refused:
        await ImapSession.open_sasl(imap(oauth_dovecot), login_type("alice", token))
    assert token not in str(refused.value)
    assert (XOAUTH2 in str(refused.value)) == (login_type is OnlyXoauth2)


async def test_no_oauth_mechanism_offered_is_a_clear_error(
        aio_loop: None, endpoint: TokenEndpoint, dovecot: Dovecot) -> None:
    token = await token_for(endpoint)
    with pytest.raises(ImapAuthError, match="no OAuth2 sign-in"):
        await ImapSession.open_sasl(imap(dovecot), OAuthLogin("alice", token))
