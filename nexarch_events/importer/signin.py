"""How a mailbox's IMAP sessions sign in: with its password (``LOGIN``) or
with an OAuth2 access token (``AUTHENTICATE OAUTHBEARER``/``XOAUTH2``).

One ``SignIn`` per mailbox runner, kept across its sessions, so an OAuth2
token is fetched once and reused until it is due for refresh (see
``oauth.TokenSource``, which also keeps a refused or failing token endpoint
from being asked again before its backoff). A session signed in with a token
should end before the token does: ``session_deadline`` says when, and the
scheduler ends an IDLE connection then and signs in anew, instead of waiting
for the server to drop it.

A token the IMAP server refuses (revoked or expired at the provider while
cached here) is dropped, so the next attempt signs in with a new one; a
second refusal in a row makes the token source wait its refusal backoff
(``TokenSource.reject``): the mailbox state says "sign-in refused by the
provider", and neither the endpoint nor the IMAP server is asked in a loop.

Secrets are resolved when a session is opened, not before: a password
variable set after the service started is picked up by the next attempt,
and a missing one is that attempt's error (recorded on the mailbox state).
"""

from __future__ import annotations

from collections.abc import Mapping

from ..aio import Executor
from ..aio.imap import ImapEndpoint, ImapSession
from ..errors import ImapAuthError, OAuthRefused
from . import secrets
from .mailboxes import MailboxConfig
from .oauth import OAuthClient, RefreshTokenStore, TokenSource
from .refresh_tokens import refresh_store
from .sasl import OAuthLogin

#: A session signed in with a token ends when the token is due for refresh,
#: but never sooner than this after it began: a token that is short-lived,
#: or whose refresh keeps failing, must not turn reconnects into a loop.
MIN_SESSION_S = 60.0


class TokenSources:
    """A process's OAuth2 token sources, one per (client, user name), shared
    by an account's discovery and the runners of all its folders. Each had
    a source of its own, all starting from the registered refresh token: a
    provider that rotates refresh tokens on use took the first refresh's new
    one for the only valid one, and every other sign-in of the account was
    refused (an accounts audit); and an account of n folders asked the
    token endpoint n + 1 times per token lifetime. A source is closed when
    its last user releases it; a refresh token its provider rotated to
    outlives it in ``refresh_store`` (Postgres, sealed, given a database and
    the operator's key; else this process's memory)."""

    def __init__(self, *, secret_key: str | None, db: Executor | None = None,
                 environ: Mapping[str, str] | None = None) -> None:
        self._secret_key = secret_key
        self._environ = environ
        self._sources: dict[tuple[OAuthClient, str], tuple[TokenSource, int]] = {}
        self.refresh_store: RefreshTokenStore = refresh_store(db, secret_key)

    def acquire(self, client: OAuthClient, username: str) -> TokenSource:
        source, users = self._sources.get((client, username), (None, 0))
        if source is None:
            source = TokenSource(client, secret_key=self._secret_key, environ=self._environ,
                                 refresh_store=self.refresh_store)
        self._sources[(client, username)] = (source, users + 1)
        return source

    async def release(self, source: TokenSource) -> None:
        for key, (held, users) in list(self._sources.items()):
            if held is source:
                if users > 1:
                    self._sources[key] = (held, users - 1)
                else:
                    del self._sources[key]
                    await held.aclose()
                return

    def __len__(self) -> int:
        return len(self._sources)


class SignIn:
    """Opens signed-in sessions for one mailbox. Owns its token source's
    HTTP client until ``aclose`` (or holds a shared one until then)."""

    def __init__(self, config: MailboxConfig, *, secret_key: str | None,
                 environ: Mapping[str, str] | None = None, password: str | None = None,
                 tokens: TokenSource | None = None,
                 shared: TokenSources | None = None,
                 refresh_store: RefreshTokenStore | None = None) -> None:
        """``password``: sign in with it, whatever the registration says
        (embedding code and tests that hold the password themselves).
        ``tokens``: the token source to use (default: ``shared``'s for
        ``config.oauth`` and the user, else one of its own, which keeps a
        rotated refresh token in ``refresh_store``)."""
        self.config = config
        self._secret_key = secret_key
        self._environ = environ
        self._password = password
        self._shared: TokenSources | None = None
        self._closed = False
        if tokens is None and config.oauth is not None and password is None:
            if shared is not None:
                tokens = shared.acquire(config.oauth, config.username)
                self._shared = shared
            else:
                tokens = TokenSource(config.oauth, secret_key=secret_key, environ=environ,
                                     refresh_store=refresh_store)
        self._tokens = tokens

    async def open(self, endpoint: ImapEndpoint) -> ImapSession:
        """A new signed-in session (the caller owns it). Blocks on the token
        endpoint (at most one request, bounded by its timeout) and on the
        IMAP server. Raises ConfigurationError (a secret cannot be read),
        OAuthRefused/OAuthUnavailable, or the ImapSession errors."""
        if self._tokens is None:
            password = self._password
            if password is None:
                assert self.config.password_ref is not None
                password = secrets.resolve(self.config.password_ref, key=self._secret_key,
                                           environ=self._environ)
            return await ImapSession.open(endpoint, self.config.username, password)
        token = await self._tokens.token()
        try:
            session = await ImapSession.open_sasl(endpoint,
                                                  OAuthLogin(self.config.username, token))
        except OAuthRefused:
            raise
        except ImapAuthError as exc:
            # The next attempt signs in with a new token (or, after refusals
            # in a row, waits the token source's backoff).
            self._tokens.reject(token, str(exc))
            raise
        self._tokens.accepted()
        return session

    def session_deadline(self) -> float | None:
        """Seconds from now until a session just opened with the current
        token should end and sign in anew: when the token is due for refresh
        (ahead of its expiry), at least ``MIN_SESSION_S``. None: sessions
        signed in with a password never need to."""
        if self._tokens is None:
            return None
        due = self._tokens.seconds_until_refresh()
        return max(MIN_SESSION_S, due if due is not None else 0.0)

    async def aclose(self) -> None:
        tokens = self._tokens
        if tokens is None or self._closed:
            return
        self._closed = True
        if self._shared is not None:
            await self._shared.release(tokens)
        else:
            await tokens.aclose()

