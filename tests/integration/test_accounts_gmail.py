"""A Gmail-like account end to end, on the scripted IMAP server (Dovecot
has no ``\\All`` folder): OAuth2 sign-in with a refresh token from the local
token endpoint (``AUTHENTICATE`` with the token the endpoint issued, valid
tokens only), discovery through ``LIST`` with SPECIAL-USE flags, only
``[Gmail]/All Mail`` archived by default (labels are folders over the same
messages), folder names decoded, and a token the IMAP server refuses: the
mailbox shows it, and neither the token endpoint nor the IMAP server is
asked in a loop."""

from __future__ import annotations

from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from dataclasses import dataclass

import pytest
import trio

from nexarch_events.aio import Database
from nexarch_events.errors import ImapAuthError
from nexarch_events.importer.accounts import (
    AccountConfig,
    AccountRegistry,
    Discovery,
    discover,
    folder_mailbox_name,
)
from nexarch_events.importer.folders import Folder
from nexarch_events.importer.mailboxes import MailboxRegistry
from nexarch_events.importer.oauth import OAuthClient
from nexarch_events.importer.scheduler import ImportScheduler
from nexarch_events.importer.signin import SignIn
from nexarch_events.importer.state import StateStore
from nexarch_events.importer.sync import run_sync
from nexarch_events.queue.notify import IMPORT_REQUESTS_CHANNEL, Listener
from nexarch_events.settings import ImportSettings, QueueSettings
from nexarch_events.testing import record_imports
from nexarch_events.testing.imap_server import ListedFolder, ScriptedImapServer
from nexarch_events.testing.oauth_server import TokenEndpoint

USER = "alice@gmail.example"
CLIENT_SECRET = "gmail-test-client-secret"
REFRESH_TOKEN = "1//gmail-test-refresh-token"
ALL_MAIL = "[Gmail]/All Mail"
#: Gmail's layout: labels (one non-ASCII, sent as modified UTF-7) and the
#: system folders under [Gmail], which cannot be opened itself.
FOLDERS = [
    ListedFolder("INBOX", ("\\HasNoChildren",)),
    ListedFolder("Projekte/&ANw-bersicht", ("\\HasNoChildren",)),
    ListedFolder("[Gmail]", ("\\HasChildren", "\\Noselect")),
    ListedFolder(ALL_MAIL, ("\\All", "\\HasNoChildren")),
    ListedFolder("[Gmail]/Drafts", ("\\Drafts", "\\HasNoChildren")),
    ListedFolder("[Gmail]/Sent Mail", ("\\HasNoChildren", "\\Sent")),
    ListedFolder("[Gmail]/Spam", ("\\HasNoChildren", "\\Junk")),
    ListedFolder("[Gmail]/Trash", ("\\HasNoChildren", "\\Trash")),
]


def mail(n: int) -> bytes:
    return (f"From: s{n}@example.org\r\nTo: {USER}\r\nSubject: gmail {n}\r\n"
            f"Message-ID: <gmail-{n}@example.org>\r\n\r\nBody {n}.\r\n").encode()


@dataclass
class Gmail:
    endpoint: TokenEndpoint
    imap: ScriptedImapServer

    def account(self, **rules: object) -> AccountConfig:
        client = OAuthClient(token_url=self.endpoint.url, client_id="archive-app",
                             client_secret_ref="env:NEXARCH_TEST_GMAIL_SECRET",
                             refresh_token_ref="env:NEXARCH_TEST_GMAIL_REFRESH")
        return AccountConfig(tenant_slug="acme", name="alice", host="127.0.0.1",
                             port=self.imap.port, tls_mode="plain", username=USER,
                             password_ref=None, oauth=client,
                             **rules)  # type: ignore[arg-type]


@pytest.fixture
async def gmail(monkeypatch: pytest.MonkeyPatch) -> AsyncIterator[Gmail]:
    monkeypatch.setenv("NEXARCH_TEST_GMAIL_SECRET", CLIENT_SECRET)
    monkeypatch.setenv("NEXARCH_TEST_GMAIL_REFRESH", REFRESH_TOKEN)
    endpoint = TokenEndpoint(client_id="archive-app", client_secret=CLIENT_SECRET,
                             refresh_tokens={REFRESH_TOKEN})
    imap = ScriptedImapServer(user=USER, password="no-password-sign-in", mailbox=ALL_MAIL,
                              folders=FOLDERS, token_valid=endpoint.is_valid)
    for n in range(3):
        imap.add_message(mail(n))
    async with trio.open_nursery() as nursery:
        await nursery.start(endpoint.serve)
        await nursery.start(imap.serve)
        yield Gmail(endpoint, imap)
        nursery.cancel_scope.cancel()


async def registered(db: Database, config: AccountConfig) -> AccountConfig:
    registry = AccountRegistry(db)
    await registry.add(config)
    return await registry.get(config.tenant_slug, config.name)


async def test_only_all_mail_is_archived_signed_in_with_a_token(
        db: Database, gmail: Gmail) -> None:
    account = await registered(db, gmail.account())
    sign_in = SignIn(account.mailbox("INBOX"), secret_key=None)
    try:
        found = await discover(db, account, sign_in, imap_timeout=30)
        [(folder, _)] = await MailboxRegistry(db).scheduled()
        async with record_imports(db.dsn) as rec:
            report = await run_sync(db, folder, sign_in, imap_timeout=30)
            await rec.wait_for_imported(tenant="acme", count=3, timeout=30)
    finally:
        await sign_in.aclose()
    assert found.archived == found.created == (ALL_MAIL,)
    assert "Projekte/Übersicht" in found.listed and "[Gmail]/Trash" in found.listed
    assert (folder.folder, folder.name) == (ALL_MAIL, folder_mailbox_name("alice", ALL_MAIL))
    assert report.imported == 3
    assert {e.folder for e in rec.select(tenant="acme")} == {ALL_MAIL}
    # Signed in twice (discovery, sync) with one token of the refresh grant;
    # only All Mail was opened; the token is never in the command log.
    assert [r["grant_type"] for r in gmail.endpoint.requests] == ["refresh_token"]
    assert gmail.imap.authentications == 2 and gmail.imap.refused_tokens == 0
    assert gmail.imap.logins == 0
    assert [c for c in gmail.imap.commands if c.startswith("EXAMINE")] == [
        f'EXAMINE "{ALL_MAIL}"']
    assert all(c.endswith("***") for c in gmail.imap.commands if c.startswith("AUTHENTICATE"))


async def test_xoauth2_where_the_server_offers_only_it(db: Database, gmail: Gmail) -> None:
    gmail.imap.oauth_mechanisms = ("XOAUTH2",)
    account = await registered(db, gmail.account())
    sign_in = SignIn(account.mailbox("INBOX"), secret_key=None)
    try:
        found = await discover(db, account, sign_in, imap_timeout=30)
    finally:
        await sign_in.aclose()
    assert found.archived == (ALL_MAIL,)
    assert [c.split()[:2] for c in gmail.imap.commands if c.startswith("AUTHENTICATE")] == [
        ["AUTHENTICATE", "XOAUTH2"]]


async def test_every_label_when_the_operator_asks(db: Database, gmail: Gmail) -> None:
    account = await registered(db, gmail.account(all_mail_only=False))
    sign_in = SignIn(account.mailbox("INBOX"), secret_key=None)
    try:
        found = await discover(db, account, sign_in, imap_timeout=30)
    finally:
        await sign_in.aclose()
    # Spam, Trash and Drafts by their special use; [Gmail] cannot be opened.
    assert set(found.archived) == {"INBOX", "Projekte/Übersicht", ALL_MAIL,
                                   "[Gmail]/Sent Mail"}


async def test_a_token_the_server_refuses_is_replaced_once(db: Database, gmail: Gmail) -> None:
    """A token revoked at the provider (the IMAP server refuses it, the cache
    still holds it): the attempt fails with the server's reason, and the
    next one signs in with a new token."""
    account = await registered(db, gmail.account())
    sign_in = SignIn(account.mailbox("INBOX"), secret_key=None)
    try:
        await discover(db, account, sign_in, imap_timeout=30)
        [(folder, _)] = await MailboxRegistry(db).scheduled()
        await run_sync(db, folder, sign_in, imap_timeout=30)
        gmail.endpoint.expire_all()
        gmail.imap.add_message(mail(9))
        with pytest.raises(ImapAuthError, match="refused"):
            await run_sync(db, folder, sign_in, imap_timeout=30)
        refused = await StateStore(db).get("acme", folder.name)
        report = await run_sync(db, folder, sign_in, imap_timeout=30)
    finally:
        await sign_in.aclose()
    assert refused.last_error is not None and "refused" in refused.last_error
    assert report.imported == 1
    assert len(gmail.endpoint.requests) == 2
    assert (await StateStore(db).get("acme", folder.name)).last_error is None


async def test_tokens_the_server_keeps_refusing_are_the_state_with_backoff_no_storm(
        db: Database, gmail: Gmail) -> None:
    """Every token refused by the IMAP server (e.g. the app may not read this
    mailbox): the folder's state says so, and with the scheduler retrying
    every 0.2 s the endpoint is asked twice and the server signed in to
    twice in all (a second refusal in a row waits the token source's
    refusal backoff, a minute), not once per retry."""
    account = await registered(db, gmail.account())
    await AccountRegistry(db).record_folders(
        account, [Folder(ALL_MAIL, ALL_MAIL, "/", frozenset({"\\All"}))])
    gmail.imap.token_valid = lambda token: False
    listener = Listener(db.dsn, QueueSettings(listener_ping_interval=0.5,
                                              listener_ping_timeout=0.5),
                        channels=(IMPORT_REQUESTS_CHANNEL,))
    sched = ImportScheduler(db, ImportSettings(imap_timeout=30, reload_interval=60,
                                               backoff_max=0.2), listener=listener)
    store = StateStore(db)
    name = folder_mailbox_name("alice", ALL_MAIL)
    async with trio.open_nursery() as nursery:
        await nursery.start(listener.run)
        await nursery.start(sched.run)
        with trio.fail_after(30):
            while "sign-in refused by the provider" not in (
                    (await store.get_or_create("acme", name)).last_error or ""):
                await trio.sleep(0.05)
        await trio.sleep(3)  # about 15 more attempts of the runner
        nursery.cancel_scope.cancel()
    state = await store.get("acme", name)
    assert state.last_error is not None
    assert state.last_error.startswith("sign-in refused by the provider: the IMAP server "
                                       "refused 2 access token(s) in a row")
    assert len(gmail.endpoint.requests) == 2
    assert gmail.imap.authentications == gmail.imap.refused_tokens == 2
    for secret in (CLIENT_SECRET, REFRESH_TOKEN):
        assert secret not in state.last_error


@asynccontextmanager
async def discovered(db: Database, monkeypatch: pytest.MonkeyPatch,
                     imap: ScriptedImapServer) -> AsyncIterator[Discovery]:
    """One discovery of a password account on ``imap``, served for the block."""
    monkeypatch.setenv("FOLDER_TEST_PW", "secret")
    async with trio.open_nursery() as nursery:
        await nursery.start(imap.serve)
        registry = AccountRegistry(db)
        await registry.add(AccountConfig(tenant_slug="acme", name="alice", host="127.0.0.1",
                                         port=imap.port, tls_mode="plain", username="user",
                                         password_ref="env:FOLDER_TEST_PW"))
        account = await registry.get("acme", "alice")
        yield await discover(db, account, SignIn(account.mailbox("INBOX"), secret_key=None),
                             imap_timeout=5)
        nursery.cancel_scope.cancel()


async def discover_listing(db: Database, monkeypatch: pytest.MonkeyPatch,
                           names: list[str]) -> Discovery:
    """One discovery of a password account whose server lists ``names``."""
    imap = ScriptedImapServer([], folders=[ListedFolder(name) for name in names])
    async with discovered(db, monkeypatch, imap) as found:
        return found


async def test_a_folder_name_that_cannot_be_read_costs_only_that_folder(
        db: Database, monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
        ) -> None:
    """A raw "&" (a client that did not write "&-", listed as is by some
    servers) made the whole LIST unreadable: discovery failed and none of
    the account's folders was registered (found by the importer audit)."""
    found = await discover_listing(db, monkeypatch, ["INBOX", "Projects", "Tom & Jerry"])
    assert set(found.listed) == {"INBOX", "Projects"}
    assert len(found.unreadable) == 1 and "Tom & Jerry" in found.unreadable[0]
    assert any("Tom & Jerry" in r.getMessage() for r in caplog.records)
    assert len(await db.fetch("SELECT name FROM mail_import_mailboxes")) == 2


@pytest.mark.parametrize(("extra", "why"), [
    (["Projects"], "listed twice"),                  # the same line twice
    (["&AFA-rojects"], "listed twice"),              # another spelling of it
    (["/".join(["L" * 250] * 5)], "the limit is 1000"),  # Dovecot creates it
    (["M\u00fcll\x00er"], "control character"),      # raw UTF-8, with a NUL
    ([""], "empty name"),
])
async def test_a_listed_name_that_cannot_be_archived_costs_only_that_folder(
        db: Database, monkeypatch: pytest.MonkeyPatch, extra: list[str], why: str) -> None:
    """Each of these made the one statement that records a discovery fail
    (a CHECK, "ON CONFLICT cannot affect a row twice"): none of the
    account's folders was registered, and new ones never were again (found
    by the accounts audit)."""
    found = await discover_listing(db, monkeypatch, ["INBOX", "Projects", *extra])
    assert found.listed == ("INBOX", "Projects")
    assert len(found.unreadable) == 1 and why in found.unreadable[0], found.unreadable
    assert sorted(r["folder"] for r in await db.fetch(
        "SELECT folder FROM mail_import_mailboxes")) == ["INBOX", "Projects"]


async def test_an_account_whose_provider_rotates_refresh_tokens_imports_every_folder(
        db: Database, monkeypatch: pytest.MonkeyPatch) -> None:
    """The discovery and each folder's runner had a token source of their
    own, each starting from the registered refresh token; a provider that
    rotates it on use (the old one stops working) accepted only the first
    refresh, and every folder's sign-in was refused (an accounts audit: 0
    of 3 messages). Wired as the service wires them, they share one."""
    from nexarch_events.importer.accounts import AccountDiscovery
    from nexarch_events.importer.signin import TokenSources

    monkeypatch.setenv("NEXARCH_TEST_GMAIL_SECRET", CLIENT_SECRET)
    monkeypatch.setenv("NEXARCH_TEST_GMAIL_REFRESH", REFRESH_TOKEN)
    endpoint = TokenEndpoint(client_id="archive-app", client_secret=CLIENT_SECRET,
                             refresh_tokens={REFRESH_TOKEN}, rotate=True)
    imap = ScriptedImapServer(user=USER, password="no-password-sign-in", mailbox="INBOX",
                              folders=[ListedFolder("INBOX"), ListedFolder("Archive")],
                              token_valid=endpoint.is_valid)
    for n in range(3):
        imap.add_message(mail(n))
    settings = ImportSettings(imap_timeout=10, reload_interval=0.5, discovery_interval=600)
    tokens = TokenSources(secret_key=None)
    async with trio.open_nursery() as nursery:
        await nursery.start(endpoint.serve)
        await nursery.start(imap.serve)
        await registered(db, Gmail(endpoint, imap).account(use_idle=False,
                                                           all_mail_only=False))
        await nursery.start(AccountDiscovery(db, settings, token_sources=tokens).run)
        await nursery.start(ImportScheduler(db, settings, token_sources=tokens).run)
        with trio.fail_after(20):
            while await db.fetchval("SELECT count(*) FROM mail_archive") < 3:
                await trio.sleep(0.1)
        assert len(endpoint.requests) == 1  # one token for the account's three sign-ins
        nursery.cancel_scope.cancel()
    assert len(tokens) == 0  # released by the last of its users


@pytest.mark.parametrize("wire", ["&AGE-bc", "Kunden/M\u00fcller"])
async def test_a_folder_is_opened_by_the_name_the_server_listed(
        db: Database, monkeypatch: pytest.MonkeyPatch, wire: str) -> None:
    """EXAMINE was given the decoded name encoded again: a folder listed in
    another form (a non-canonical modified UTF-7, a raw UTF-8 name some
    servers send unasked) answered NONEXISTENT and its mail was never
    imported (an accounts audit)."""
    imap = ScriptedImapServer(mailbox=wire, folders=[ListedFolder(wire)])
    imap.add_message(mail(1))
    async with discovered(db, monkeypatch, imap):
        [(config, _)] = await MailboxRegistry(db).scheduled()
        report = await run_sync(db, config, "secret", imap_timeout=5)
    assert report.imported == 1
    assert any(c == f'EXAMINE "{wire}"' for c in imap.commands), imap.commands


async def test_accounts_that_never_answer_do_not_hold_up_the_others(
        db: Database, monkeypatch: pytest.MonkeyPatch) -> None:
    """One lock for all discoveries: each account waited for every one
    before it, a server that accepts and never greets for imap_timeout (an
    accounts audit: another tenant's first discovery 61 s late)."""
    from functools import partial

    from nexarch_events.importer.accounts import AccountDiscovery

    async def silent(stream: trio.SocketStream) -> None:
        await trio.sleep_forever()

    monkeypatch.setenv("FOLDER_TEST_PW", "secret")
    imap = ScriptedImapServer([], folders=[ListedFolder("INBOX")])
    registry = AccountRegistry(db)
    async with trio.open_nursery() as nursery:
        await nursery.start(imap.serve)
        [hung] = await nursery.start(partial(trio.serve_tcp, silent, 0, host="127.0.0.1"))
        hung_port = hung.socket.getsockname()[1]
        for tenant, name, port in (("aaa", "hung1", hung_port), ("aaa", "hung2", hung_port),
                                   ("beta", "bob", imap.port)):
            await registry.add(AccountConfig(tenant_slug=tenant, name=name, host="127.0.0.1",
                                             port=port, tls_mode="plain", username="user",
                                             password_ref="env:FOLDER_TEST_PW"))
        discovery = AccountDiscovery(db, ImportSettings(imap_timeout=6))
        nursery.start_soon(discovery.round)
        started = trio.current_time()
        with trio.fail_after(20):
            while not await db.fetchval("SELECT count(*) FROM mail_import_mailboxes "
                                        "WHERE tenant_slug = 'beta'"):
                await trio.sleep(0.05)
        took = trio.current_time() - started
        nursery.cancel_scope.cancel()
    assert took < 5, f"beta's discovery waited {took:.1f} s for the hung accounts (12 s before)"
