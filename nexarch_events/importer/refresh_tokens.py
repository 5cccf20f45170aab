"""Where a rotated OAuth2 refresh token is kept (``oauth.RefreshTokenStore``).

A provider may issue a new refresh token with every refresh and revoke the
one presented (RFC 6749 section 6); Microsoft issues a new one each time and
lets the registered one expire 90 days after it was issued, however often
it was used. Kept only by the token source that received it, the newest
token was lost when the source was released (an account's runners between
runs) and at every restart: the registered one was presented again, and
once the provider had revoked it or let it expire, every folder of the
account was refused until an operator registered a new one.

- ``StoredRefreshTokens``: in Postgres (``mail_import_oauth_refresh``),
  sealed with the operator's key (NEXARCH_SECRET_KEY_FILE), never in clear
  text; shared by every process and kept across restarts.
- ``RememberedRefreshTokens``: without the key, in this process only (a
  warning says so once per chain: after a restart the registered token is
  presented again).

Neither raises for a failure of its own: a token that cannot be read is
replaced by the registered one, one that cannot be kept stays with its
source, and both say so at WARNING (without the token).
"""

from __future__ import annotations

import logging

import trio

from ..aio import Executor
from ..db import sqlfiles
from ..errors import ConfigurationError, DatabaseError
from . import secrets

log = logging.getLogger(__name__)

_SQL = sqlfiles.queries("importer.sql")


class StoredRefreshTokens:
    """The newest refresh token of each chain, sealed, in Postgres."""

    def __init__(self, db: Executor, secret_key: str) -> None:
        self.db = db
        self._key = secret_key

    async def load(self, chain: bytes) -> str | None:
        try:
            sealed = await self.db.fetchval(_SQL["oauth_refresh_load"], chain)
        except (DatabaseError, trio.TooSlowError) as exc:
            log.warning("the newest OAuth refresh token cannot be read (%s); the registered "
                        "one is presented", exc)
            return None
        if sealed is None:
            return None
        try:
            return secrets.resolve(sealed, key=self._key)
        except ConfigurationError:
            log.warning("the newest OAuth refresh token was sealed with another key than "
                        "NEXARCH_SECRET_KEY_FILE's; the registered one is presented")
            return None

    async def save(self, chain: bytes, token: str) -> bool:
        try:
            await self.db.execute(_SQL["oauth_refresh_save"], chain,
                                  secrets.seal(token, self._key))
        except (DatabaseError, trio.TooSlowError) as exc:
            log.warning("the OAuth refresh token the provider rotated to cannot be stored "
                        "(%s): this process presents it, but after a restart the one "
                        "stored before is presented, which the provider may refuse", exc)
            return False
        return True


class RememberedRefreshTokens:
    """The newest refresh token of each chain, in this process only."""

    def __init__(self) -> None:
        self._tokens: dict[bytes, str] = {}

    async def load(self, chain: bytes) -> str | None:
        return self._tokens.get(chain)

    async def save(self, chain: bytes, token: str) -> bool:
        if chain not in self._tokens:
            log.warning("the OAuth provider rotated a refresh token; without "
                        "NEXARCH_SECRET_KEY_FILE it is kept in this process only: after a "
                        "restart the registered one is presented again, which the provider "
                        "refuses once it has revoked it or it has expired")
        self._tokens[chain] = token
        return True


def refresh_store(db: Executor | None,
                  secret_key: str | None) -> StoredRefreshTokens | RememberedRefreshTokens:
    """The store a process's token sources share: Postgres when there is a
    database and a key to seal with, else this process's memory."""
    if db is not None and secret_key:
        return StoredRefreshTokens(db, secret_key)
    return RememberedRefreshTokens()
