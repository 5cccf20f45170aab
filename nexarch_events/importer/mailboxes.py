"""Registered mailboxes: where the importer fetches mail from, and for which
tenant. Registered with ``nexarch-events mailbox add`` (or this API). A
mailbox signs in with a password or with an OAuth2 client (``oauth``); the
password and the OAuth secrets are only ever references or sealed values
(see ``secrets``)."""

from __future__ import annotations

import re
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

from ..aio import Executor, Row
from ..aio.imap import TLS_MODES, ImapEndpoint
from ..db import sqlfiles
from ..errors import ConfigurationError, DatabaseError, InvalidJobError, JobNotFound
from ..models import validate_tenant_slug
from .oauth import OAuthClient
from .state import (
    DEFAULT_INTERVAL_SECONDS,
    validate_interval,
    validate_mailbox_name,
)

_SQL = sqlfiles.queries("importer.sql")
_HOST = re.compile(r"[A-Za-z0-9.:-]{1,253}")


@dataclass(frozen=True, slots=True)
class MailboxConfig:
    tenant_slug: str
    name: str
    host: str
    port: int
    tls_mode: str
    username: str
    #: The password reference; None when the mailbox signs in with ``oauth``.
    password_ref: str | None
    folder: str = "INBOX"
    ca_file: str | None = None
    use_idle: bool = True
    enabled: bool = True
    id: int | None = None
    oauth: OAuthClient | None = None
    #: The folder's name as the server listed it (an account's folders),
    #: which EXAMINE is given; None: ``folder`` encoded (modified UTF-7).
    folder_wire: str | None = None

    def __post_init__(self) -> None:
        validate_tenant_slug(self.tenant_slug)
        validate_mailbox_name(self.name)
        if not _HOST.fullmatch(self.host):
            raise InvalidJobError(f"host {self.host[:80]!r} is not a host name or address")
        if isinstance(self.port, bool) or not isinstance(self.port, int) \
                or not 1 <= self.port <= 65535:
            raise InvalidJobError(f"port must be 1..65535, got {self.port!r}")
        if self.tls_mode not in TLS_MODES:
            raise InvalidJobError(f"tls mode must be one of {', '.join(TLS_MODES)}, "
                                  f"got {self.tls_mode!r}")
        if not self.username or len(self.username) > 320:
            raise InvalidJobError("user name must be 1..320 characters")
        if not self.folder or len(self.folder) > 1000:
            raise InvalidJobError("folder must be 1..1000 characters")
        if (self.password_ref is None) == (self.oauth is None):
            raise ConfigurationError("a mailbox signs in with a password or with OAuth2, "
                                     "exactly one of them")

    @property
    def auth_method(self) -> str:
        return "password" if self.oauth is None else "oauth2"

    @classmethod
    def from_row(cls, row: Row) -> MailboxConfig:
        oauth = oauth_client_of(row)
        return cls(tenant_slug=row["tenant_slug"], name=row["name"], host=row["host"],
                   port=row["port"], tls_mode=row["tls_mode"], username=row["username"],
                   password_ref=row["password_ref"], folder=row["folder"],
                   ca_file=row["ca_file"], use_idle=row["use_idle"], enabled=row["enabled"],
                   id=row["id"], oauth=oauth, folder_wire=row["folder_wire"])

    def endpoint(self, *, timeout: float) -> ImapEndpoint:
        return ImapEndpoint(self.host, self.port, self.tls_mode, self.ca_file, timeout)

    def describe(self) -> str:
        """For logs and errors: everything but the secret references."""
        return (f"{self.tenant_slug}/{self.name} ({self.username}@{self.host}:{self.port} "
                f"{self.tls_mode}, folder {self.folder!r}, {self.auth_method})")


def oauth_client_of(row: Row) -> OAuthClient | None:
    """The OAuth2 client a mailbox or account row signs in with (None: it
    signs in with a password). Both tables have the same columns for it."""
    if row["auth_method"] != "oauth2":
        return None
    return OAuthClient(token_url=row["oauth_token_url"], client_id=row["oauth_client_id"],
                       client_secret_ref=row["oauth_secret_ref"],
                       refresh_token_ref=row["oauth_refresh_ref"], scope=row["oauth_scope"],
                       client_certificate_ref=row["oauth_certificate_ref"])


class MailboxRegistry:
    def __init__(self, db: Executor) -> None:
        self.db = db

    async def add(self, config: MailboxConfig, *,
                  interval_seconds: int = DEFAULT_INTERVAL_SECONDS) -> int:
        """Register a mailbox and create its sync state. Returns its id.
        Raises ConfigurationError if the tenant already has one by that name."""
        validate_interval(interval_seconds)
        o = config.oauth
        try:
            row = await self.db.fetchrow(
                _SQL["mailbox_add"], config.tenant_slug, config.name, config.host, config.port,
                config.tls_mode, config.ca_file, config.username, config.password_ref,
                config.folder, config.use_idle, interval_seconds, config.auth_method,
                o and o.token_url, o and o.client_id, o and o.client_secret_ref,
                o and o.refresh_token_ref, o and o.scope, o and o.client_certificate_ref)
        except DatabaseError as exc:
            if exc.constraint == "mail_import_mailboxes_name_per_tenant":
                raise ConfigurationError(
                    f"tenant {config.tenant_slug!r} already has a mailbox named "
                    f"{config.name!r}; remove it first or pick another name") from None
            raise
        assert row is not None
        mailbox_id: int = row["id"]
        return mailbox_id

    async def get(self, tenant_slug: str, name: str) -> MailboxConfig:
        validate_tenant_slug(tenant_slug)
        validate_mailbox_name(name)
        row = await self.db.fetchrow(_SQL["mailbox_get"], tenant_slug, name)
        if row is None:
            raise JobNotFound(f"no mailbox {name!r} in tenant {tenant_slug!r}")
        return MailboxConfig.from_row(row)

    async def get_by_id(self, mailbox_id: int, *,
                        tenant_slug: str | None = None) -> MailboxConfig:
        """A mailbox by id, within ``tenant_slug`` (None: any tenant). Raises
        JobNotFound if there is none (or it belongs to another tenant)."""
        if tenant_slug is not None:
            validate_tenant_slug(tenant_slug)
        row = await self.db.fetchrow(_SQL["mailbox_get_by_id"], int(mailbox_id), tenant_slug)
        if row is None:
            scope = "" if tenant_slug is None else f" in tenant {tenant_slug!r}"
            raise JobNotFound(f"no mailbox with id {mailbox_id}{scope}")
        return MailboxConfig.from_row(row)

    async def list(self, tenant_slug: str | None = None) -> list[dict[str, Any]]:
        """Every registered mailbox (of one tenant, or all) with its sync
        state, as plain dicts (for the CLI and the API). Secret references
        (password, OAuth client secret, refresh token) are left out: a
        sealed value is still a secret's ciphertext."""
        if tenant_slug is not None:
            validate_tenant_slug(tenant_slug)
        rows = await self.db.fetch(_SQL["mailbox_list"], tenant_slug)
        return [{k: v for k, v in dict(row).items() if not k.endswith("_ref")} for row in rows]

    async def scheduled(self) -> Sequence[tuple[MailboxConfig, bool]]:
        """Enabled mailboxes, each with whether a "sync now" is pending. An
        account's folder that its last discovery did not find is left out."""
        rows = await self.db.fetch(_SQL["mailbox_list"], None)
        return [(MailboxConfig.from_row(r), r["sync_requested_at"] is not None)
                for r in rows if r["enabled"] and r["folder_gone_at"] is None]

    async def set_enabled(self, tenant_slug: str, name: str, enabled: bool) -> None:
        """Pause or resume a mailbox's import (its state is kept)."""
        validate_tenant_slug(tenant_slug)
        validate_mailbox_name(name)
        if await self.db.fetchrow(_SQL["mailbox_set_enabled"], tenant_slug, name,
                                  enabled) is None:
            raise JobNotFound(f"no mailbox {name!r} in tenant {tenant_slug!r}")

    async def remove(self, tenant_slug: str, name: str) -> None:
        """Unregister (state and failures too; the archived mail stays)."""
        validate_tenant_slug(tenant_slug)
        validate_mailbox_name(name)
        if await self.db.fetchrow(_SQL["mailbox_remove"], tenant_slug, name) is None:
            raise JobNotFound(f"no mailbox {name!r} in tenant {tenant_slug!r}")
