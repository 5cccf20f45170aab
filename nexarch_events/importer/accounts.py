"""Whole accounts: registered once, their folders found with ``LIST`` and
archived each as a mailbox of its own.

A discovery signs in to the account, lists its folders, applies the
account's rules (``folders.select_folders``: Gmail's All Mail alone, no
trash, junk or drafts, the operator's patterns) and records the outcome in
one statement: a mailbox row per folder (created, or refreshed from the
account's settings) and the folders that are gone marked as such. From then
on the scheduler syncs each folder like any registered mailbox, with its own
UIDVALIDITY and UID state. A renamed folder is a new folder: its messages
are archived once all the same (by content hash), with new locations; the
old name is marked gone and no longer synced, its state kept.

A folder's mailbox is named ``<account>/<folder>`` where the folder's name
fits a mailbox name, else ``<account>/<folder, other characters as ->-<8 hex
of its hash>``; its decoded folder name is in the ``folder`` column, which
the CLI and the API show.

``AccountDiscovery`` runs discoveries in the service: every account once at
start and every ``import.discovery_interval`` seconds after, each account
waiting at least its backoff after a failure; new folders are announced with
a "sync now", so the scheduler picks them up at once. An account's "Sync
now" (``AccountRegistry.request_sync``) also asks for a discovery of it
(``discovery_requested`` on the import-requests channel): answered at once,
but not within an account's backoff, and no sooner than ``REQUEST_MIN_GAP``
after its last discovery (requests meanwhile are answered by that one), so
clicks never become a storm of sign-ins.
"""

from __future__ import annotations

import builtins
import hashlib
import logging
import re
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field, replace
from typing import Any

import trio

from ..aio import Database, Executor, Row
from ..db import sqlfiles
from ..errors import ConfigurationError, DatabaseError, ImapError, InvalidJobError, JobNotFound
from ..models import validate_tenant_slug
from ..queue.notify import IMPORT_REQUESTS_CHANNEL, Listener, Notification, Subscription
from ..settings import ImportSettings
from .folders import DEFAULT_EXCLUDED_PATTERNS, Folder, FolderRules, parse_list, select_folders
from .mailboxes import MailboxConfig, MailboxRegistry, oauth_client_of
from .oauth import OAuthClient
from .signin import SignIn, TokenSources
from .state import DEFAULT_INTERVAL_SECONDS, StateStore, validate_interval

log = logging.getLogger(__name__)
_SQL = sqlfiles.queries("importer.sql")
_ACCOUNT_NAME = re.compile(r"[A-Za-z0-9][A-Za-z0-9._@+-]{0,63}")
_NOT_IN_NAME = re.compile(r"[^A-Za-z0-9._@+/-]+")
MAX_MAILBOX_NAME = 200
#: After a failed discovery, wait this long before the next (doubling).
BACKOFF_FLOOR_S, BACKOFF_CAP_S = 30.0, 3600.0
#: A requested discovery of an account runs no sooner than this after its last.
REQUEST_MIN_GAP = 5.0
#: Discoveries at once in a process (each signs in and lists the folders).
DISCOVERY_CONCURRENCY = 4
#: An account's shortest interval: each of its folders signs in once per interval.
MIN_ACCOUNT_INTERVAL_SECONDS = 10


@dataclass(frozen=True, slots=True)
class AccountConfig:
    tenant_slug: str
    name: str
    host: str
    port: int
    tls_mode: str
    username: str
    password_ref: str | None
    oauth: OAuthClient | None = None
    ca_file: str | None = None
    use_idle: bool = True
    interval_seconds: int = DEFAULT_INTERVAL_SECONDS
    #: None: the default exclusions.
    exclude_patterns: tuple[str, ...] | None = None
    include_patterns: tuple[str, ...] = ()
    all_mail_only: bool = True
    enabled: bool = True
    id: int | None = None

    def __post_init__(self) -> None:
        validate_tenant_slug(self.tenant_slug)
        if not _ACCOUNT_NAME.fullmatch(self.name):
            raise InvalidJobError(f"account name {self.name[:80]!r}: 1-64 of A-Z a-z 0-9 . _ "
                                  "@ + -, starting with a letter or digit")
        # The database's bound (mail_import_accounts_interval): it was met
        # only there, as a raw CheckViolationError (an accounts audit).
        validate_interval(self.interval_seconds, minimum=MIN_ACCOUNT_INTERVAL_SECONDS)
        # The connection settings are checked the way a mailbox's are.
        self.mailbox("INBOX")

    @property
    def rules(self) -> FolderRules:
        excluded = (DEFAULT_EXCLUDED_PATTERNS if self.exclude_patterns is None
                    else self.exclude_patterns)
        return FolderRules(excluded_patterns=excluded, include_patterns=self.include_patterns,
                           all_mail_only=self.all_mail_only)

    def mailbox(self, folder: str) -> MailboxConfig:
        """The mailbox a folder of this account is archived as."""
        return MailboxConfig(tenant_slug=self.tenant_slug, name=folder_mailbox_name(
            self.name, folder), host=self.host, port=self.port, tls_mode=self.tls_mode,
            username=self.username, password_ref=self.password_ref, folder=folder,
            ca_file=self.ca_file, use_idle=self.use_idle, oauth=self.oauth)

    @classmethod
    def from_row(cls, row: Row) -> AccountConfig:
        oauth = oauth_client_of(row)
        exclude = row["exclude_patterns"]
        return cls(tenant_slug=row["tenant_slug"], name=row["name"], host=row["host"],
                   port=row["port"], tls_mode=row["tls_mode"], username=row["username"],
                   password_ref=row["password_ref"], oauth=oauth, ca_file=row["ca_file"],
                   use_idle=row["use_idle"], interval_seconds=row["interval_seconds"],
                   exclude_patterns=None if exclude is None else tuple(exclude),
                   include_patterns=tuple(row["include_patterns"]),
                   all_mail_only=row["all_mail_only"], enabled=row["enabled"], id=row["id"])


def folder_mailbox_name(account: str, folder: str) -> str:
    """``<account>/<folder>``, or with the folder's other characters as ``-``
    and 8 hex digits of its hash where the name would otherwise be lossy or
    too long (two folders never share a mailbox name)."""
    plain = f"{account}/{folder}"
    if not _NOT_IN_NAME.search(folder) and len(plain) <= MAX_MAILBOX_NAME \
            and not folder.startswith(("-", ".")):
        return plain
    digest = hashlib.sha256(folder.encode("utf-8")).hexdigest()[:8]
    slug = _NOT_IN_NAME.sub("-", folder).strip("-") or "folder"
    room = MAX_MAILBOX_NAME - len(account) - len(digest) - 2
    return f"{account}/{slug[:room].rstrip('-')}-{digest}"


@dataclass(frozen=True, slots=True)
class Discovery:
    """One discovery's outcome."""

    account: str
    #: Folder names the account has (decoded), and which of them are archived.
    listed: tuple[str, ...]
    archived: tuple[str, ...]
    created: tuple[str, ...] = ()
    gone: tuple[str, ...] = ()
    #: Folders whose mailbox name a hand-registered mailbox already has.
    conflicts: tuple[str, ...] = field(default_factory=tuple)
    #: Listed folders left out because their names cannot be read (why).
    unreadable: tuple[str, ...] = ()


#: What ``folder_state`` calls a folder, worst first.
FOLDER_STATES = ("gone", "error", "warning", "paused", "not synced yet", "ok")


def folder_state(row: Mapping[str, Any]) -> str:
    """One word for a folder's mailbox row (``MailboxRegistry.list``): gone
    (the last discovery did not find it: not synced), error (the last
    attempt failed), warning (the last run warned, or messages keep
    failing, or IDLE is unavailable), paused (disabled), not synced yet, ok."""
    if row.get("folder_gone_at") is not None:
        return "gone"
    if row.get("last_error"):
        return "error"
    if row.get("warning") or row.get("failures") or row.get("idle_status"):
        return "warning"
    if not row.get("enabled", True):
        return "paused"
    if row.get("last_success_at") is None:
        return "not synced yet"
    return "ok"


class AccountRegistry:
    def __init__(self, db: Executor) -> None:
        self.db = db

    async def add(self, account: AccountConfig) -> int:
        o = account.oauth
        try:
            row = await self.db.fetchrow(
                _SQL["account_add"], account.tenant_slug, account.name, account.host,
                account.port, account.tls_mode, account.ca_file, account.username,
                "password" if o is None else "oauth2", account.password_ref,
                o and o.token_url, o and o.client_id, o and o.client_secret_ref,
                o and o.refresh_token_ref, o and o.scope, account.use_idle,
                account.interval_seconds,
                None if account.exclude_patterns is None else list(account.exclude_patterns),
                list(account.include_patterns), account.all_mail_only,
                o and o.client_certificate_ref)
        except DatabaseError as exc:
            if exc.constraint == "mail_import_accounts_name_per_tenant":
                raise ConfigurationError(f"tenant {account.tenant_slug!r} already has an "
                                         f"account named {account.name!r}") from None
            raise
        assert row is not None
        account_id: int = row["id"]
        return account_id

    async def get(self, tenant_slug: str, name: str) -> AccountConfig:
        validate_tenant_slug(tenant_slug)
        row = await self.db.fetchrow(_SQL["account_get"], tenant_slug, name)
        if row is None:
            raise JobNotFound(f"no account {name!r} in tenant {tenant_slug!r}")
        return AccountConfig.from_row(row)

    async def list(self, tenant_slug: str | None = None) -> list[dict[str, Any]]:
        """Accounts with their folder counts; secret references left out."""
        if tenant_slug is not None:
            validate_tenant_slug(tenant_slug)
        rows = await self.db.fetch(_SQL["account_list"], tenant_slug)
        return [{k: v for k, v in dict(r).items() if not k.endswith("_ref")} for r in rows]

    async def get_by_id(self, account_id: int, *,
                        tenant_slug: str | None = None) -> AccountConfig:
        """An account by id, within ``tenant_slug`` (None: any tenant). Raises
        JobNotFound if there is none (or it belongs to another tenant)."""
        if tenant_slug is not None:
            validate_tenant_slug(tenant_slug)
        row = await self.db.fetchrow(_SQL["account_get_by_id"], int(account_id), tenant_slug)
        if row is None:
            scope = "" if tenant_slug is None else f" in tenant {tenant_slug!r}"
            raise JobNotFound(f"no account with id {account_id}{scope}")
        return AccountConfig.from_row(row)

    async def overview(self, tenant_slug: str | None = None
                       ) -> builtins.list[dict[str, Any]]:
        """Accounts (of one tenant, or all) as ``list`` gives them (``folders``
        and ``folders_gone`` are counts), each with ``folder_mailboxes``: its
        folders' mailboxes as ``MailboxRegistry.list`` gives
        them (sync state included, secret references left out), each with
        its ``state`` (``folder_state``). Two reads, no transaction: a folder
        discovered in between is shown at the next call."""
        accounts = await self.list(tenant_slug)
        folders: dict[int, builtins.list[dict[str, Any]]] = {a["id"]: [] for a in accounts}
        for row in await MailboxRegistry(self.db).list(tenant_slug):
            if row.get("account_id") in folders:
                folders[row["account_id"]].append({**row, "state": folder_state(row)})
        return [{**a, "folder_mailboxes": folders[a["id"]]} for a in accounts]

    async def request_sync(self, account_id: int, *,
                           tenant_slug: str | None = None
                           ) -> tuple[str, str, builtins.list[str]]:
        """"Sync now" for every folder the account archives (see
        ``account_request_sync`` in importer.sql). Returns the account's
        tenant, name and the folders' mailbox names. Raises JobNotFound if
        there is no such account (in that tenant)."""
        if tenant_slug is not None:
            validate_tenant_slug(tenant_slug)
        row = await self.db.fetchrow(_SQL["account_request_sync"], int(account_id), tenant_slug)
        if row is None:
            scope = "" if tenant_slug is None else f" in tenant {tenant_slug!r}"
            raise JobNotFound(f"no account with id {account_id}{scope}")
        return row["tenant_slug"], row["name"], list(row["mailboxes"])

    async def enabled(self) -> Sequence[AccountConfig]:
        return [AccountConfig.from_row(r) for r in await self.db.fetch(_SQL["account_list"], None)
                if r["enabled"]]

    async def remove(self, tenant_slug: str, name: str) -> None:
        """The account and its folders' mailboxes and state (archived mail stays)."""
        validate_tenant_slug(tenant_slug)
        if await self.db.fetchrow(_SQL["account_remove"], tenant_slug, name) is None:
            raise JobNotFound(f"no account {name!r} in tenant {tenant_slug!r}")

    async def record_folders(self, account: AccountConfig, listed: Sequence[Folder]
                             ) -> Discovery:
        """Store what a discovery found (see the module docstring)."""
        assert account.id is not None
        chosen = select_folders(listed, account.rules)
        names = [folder_mailbox_name(account.name, f.name) for f in chosen]
        rows = await self.db.fetch(_SQL["account_folders"], account.id,
                                   [f.name for f in chosen], names,
                                   [f.wire_name for f in chosen])
        found = {r["name"] for r in rows if not r["gone"]}
        return Discovery(
            account=account.name, listed=tuple(f.name for f in listed),
            archived=tuple(f.name for f in chosen if folder_mailbox_name(
                account.name, f.name) in found),
            created=tuple(r["folder"] for r in rows if r["created"]),
            gone=tuple(r["folder"] for r in rows if r["gone"]),
            conflicts=tuple(f.name for f, n in zip(chosen, names, strict=True)
                            if n not in found))

    async def record_failure(self, account: AccountConfig, error: str) -> None:
        assert account.id is not None
        await self.db.execute(_SQL["account_discovery_failed"], account.id, error[:2000])


async def discover(db: Database, account: AccountConfig, sign_in: SignIn, *,
                   imap_timeout: float = 30.0) -> Discovery:
    """Sign in, list the folders, record them; newly archived folders get a
    "sync now". Blocks on the IMAP server and Postgres. Raises ImapError,
    ConfigurationError or DatabaseError (recorded on the account too)."""
    registry = AccountRegistry(db)
    try:
        session = await sign_in.open(account.mailbox("INBOX").endpoint(timeout=imap_timeout))
        unreadable: list[str] = []
        try:
            listed = parse_list(await session.list_folders(), unreadable=unreadable)
        finally:
            await session.aclose()
        found = await registry.record_folders(account, listed)
        for why in unreadable:
            log.warning("importer: account %s/%s: folder left out: %s", account.tenant_slug,
                        account.name, why)
        found = replace(found, unreadable=tuple(unreadable))
    except (ImapError, ConfigurationError, DatabaseError) as exc:
        with trio.move_on_after(5, shield=True):
            try:
                await registry.record_failure(account, str(exc))
            except DatabaseError:
                pass
        raise
    states = StateStore(db)
    for folder in found.created:
        await states.request_sync(account.tenant_slug,
                                  folder_mailbox_name(account.name, folder))
    log.info("importer: account %s/%s: %d folder(s), %d archived, %d new, %d gone",
             account.tenant_slug, account.name, len(found.listed), len(found.archived),
             len(found.created), len(found.gone))
    return found


class AccountDiscovery:
    """Discovers every enabled account's folders, at start and every
    ``settings.discovery_interval`` seconds, and an account at once when its
    "Sync now" asks (with ``listener``), until cancelled."""

    def __init__(self, db: Database, settings: ImportSettings, *,
                 secret_key: str | None = None, listener: Listener | None = None,
                 request_min_gap: float = REQUEST_MIN_GAP,
                 token_sources: TokenSources | None = None) -> None:
        """``token_sources``: OAuth2 token sources shared with the folders'
        runners (ImportScheduler); the service passes one to both."""
        self.db = db
        self.token_sources = token_sources if token_sources is not None \
            else TokenSources(secret_key=secret_key, db=db)
        self.settings = settings
        self.secret_key = secret_key
        self.listener = listener
        self.request_min_gap = request_min_gap
        self._sign_ins: dict[tuple[str, str], tuple[AccountConfig, SignIn]] = {}
        self._retry_at: dict[tuple[str, str], tuple[float, float]] = {}
        self._last_at: dict[tuple[str, str], float] = {}
        #: Accounts with a requested discovery not yet run.
        self._pending: set[tuple[str, str]] = set()
        #: Discoveries tried (a test counts them).
        self.attempts = 0
        #: One discovery of an account at a time (a request never overlaps
        #: the round's), and at most DISCOVERY_CONCURRENCY of all accounts:
        #: one lock for all made every account wait for each one before
        #: it, a server that never answers for imap_timeout (an accounts
        #: audit: a tenant's first discovery 61 s late behind two hung
        #: accounts of another).
        self._locks: dict[tuple[str, str], trio.Lock] = {}
        self._slots = trio.CapacityLimiter(DISCOVERY_CONCURRENCY)

    async def run(self, *, task_status: trio.TaskStatus[None] = trio.TASK_STATUS_IGNORED
                  ) -> None:
        sub: Subscription | None = None
        if self.listener is not None:
            sub = self.listener.subscribe(IMPORT_REQUESTS_CHANNEL)
        try:
            async with trio.open_nursery() as nursery:
                if sub is not None:
                    nursery.start_soon(self._requests, sub)
                task_status.started()
                while True:
                    await self.round()
                    await trio.sleep(self.settings.discovery_interval)
        finally:
            if sub is not None and self.listener is not None:
                self.listener.unsubscribe(sub)
            with trio.move_on_after(5, shield=True):
                for _, sign_in in self._sign_ins.values():
                    await sign_in.aclose()

    async def round(self) -> None:
        """One discovery of every enabled account not in its backoff."""
        try:
            accounts = await AccountRegistry(self.db).enabled()
        except DatabaseError as exc:
            log.warning("importer: cannot read accounts: %s", exc)
            return
        async with trio.open_nursery() as nursery:
            for account in accounts:
                nursery.start_soon(self._discover, account)

    async def _requests(self, sub: Subscription) -> None:
        """Answer ``discovery_requested`` (an account's "Sync now"): at once,
        or ``request_min_gap`` after the account's last discovery if that is
        later; requests while one is pending are answered by it. A missed
        request (RESYNC) waits for the next round."""
        async with trio.open_nursery() as nursery:
            async for item in sub:
                if not isinstance(item, Notification):
                    continue
                payload = item.json()
                if payload.get("event") != "discovery_requested":
                    continue
                tenant, name = payload.get("tenant"), payload.get("account")
                if not isinstance(tenant, str) or not isinstance(name, str) \
                        or (tenant, name) in self._pending:
                    continue
                self._pending.add((tenant, name))
                nursery.start_soon(self._requested, tenant, name)

    async def _requested(self, tenant: str, name: str) -> None:
        try:
            last = self._last_at.get((tenant, name))
            if last is not None:
                await trio.sleep_until(last + self.request_min_gap)
            try:
                account = await AccountRegistry(self.db).get(tenant, name)
            except (JobNotFound, InvalidJobError):
                return  # removed meanwhile, or not a valid name
            except DatabaseError as exc:
                log.warning("importer: cannot read account %s/%s: %s", tenant, name, exc)
                return
            if account.enabled:
                await self._discover(account)
        finally:
            self._pending.discard((tenant, name))

    async def _discover(self, account: AccountConfig) -> None:
        """Discover one account unless it waits its backoff; a failure is
        logged, recorded on the account, and starts or doubles the backoff."""
        key = (account.tenant_slug, account.name)
        lock = self._locks.setdefault(key, trio.Lock())
        async with lock, self._slots:
            retry_at, wait = self._retry_at.get(key, (0.0, 0.0))
            if trio.current_time() < retry_at:
                return
            self._last_at[key] = trio.current_time()
            self.attempts += 1
            try:
                await discover(self.db, account, await self._sign_in(account),
                               imap_timeout=self.settings.imap_timeout)
            except (ImapError, ConfigurationError, DatabaseError) as exc:
                wait = min(BACKOFF_CAP_S, max(BACKOFF_FLOOR_S, wait * 2))
                self._retry_at[key] = (trio.current_time() + wait, wait)
                log.warning("importer: account %s/%s: discovery failed: %s; retry in %.0f s",
                            account.tenant_slug, account.name, exc, wait)
            else:
                self._retry_at.pop(key, None)

    async def _sign_in(self, account: AccountConfig) -> SignIn:
        """The account's sign-in, kept across rounds (its token cached),
        replaced when the account's settings changed."""
        key = (account.tenant_slug, account.name)
        kept = self._sign_ins.get(key)
        if kept is not None and kept[0] == account:
            return kept[1]
        if kept is not None:
            await kept[1].aclose()
        sign_in = SignIn(account.mailbox("INBOX"), secret_key=self.secret_key,
                         shared=self.token_sources)
        self._sign_ins[key] = (account, sign_in)
        return sign_in
