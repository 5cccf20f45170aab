"""A local OAuth2 token endpoint and a Dovecot that checks tokens against it
(RFC 7662 introspection), for the OAuth2 sign-in tests."""

from __future__ import annotations

from collections.abc import AsyncIterator
from contextlib import asynccontextmanager

import trio

from nexarch_events.testing.oauth_server import TokenEndpoint
from tests.support.dovecot import Dovecot

CLIENT_ID = "archive-app"
CLIENT_SECRET = "dovecot-test-client-secret"


@asynccontextmanager
async def token_endpoint(*, refresh_tokens: set[str] | None = None
                         ) -> AsyncIterator[TokenEndpoint]:
    """Serves until the block ends; tokens belong to Dovecot's user alice."""
    server = TokenEndpoint(client_id=CLIENT_ID, client_secret=CLIENT_SECRET,
                           refresh_tokens=refresh_tokens or set(), subject="alice")
    async with trio.open_nursery() as nursery:
        await nursery.start(server.serve)
        yield server
        nursery.cancel_scope.cancel()


@asynccontextmanager
async def oauth_dovecot(endpoint: TokenEndpoint) -> AsyncIterator[Dovecot]:
    server = Dovecot(oauth2_introspection_url=endpoint.introspection_url)
    # Dovecot asks the endpoint (served by this trio loop) while it starts
    # and signs in, so its blocking calls run in a thread.
    await trio.to_thread.run_sync(server.start)
    try:
        yield server
    finally:
        await trio.to_thread.run_sync(server.stop)
