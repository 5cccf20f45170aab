"""OAuth2 sign-in against a real IMAP server: Dovecot's oauth2 passdb checks
each token by RFC 7662 introspection against the local token endpoint
(nexarch_events.testing.oauth_server), so the token the importer got from
the endpoint is the one the server accepts or refuses."""

from __future__ import annotations

from collections.abc import AsyncIterator

import pytest
import trio

from nexarch_events.aio import Database
from nexarch_events.aio.imap import ImapEndpoint, ImapSession
from nexarch_events.errors import DatabaseError, ImapAuthError, OAuthRefused
from nexarch_events.importer import oauth, secrets, signin
from nexarch_events.importer.mailboxes import MailboxConfig, MailboxRegistry
from nexarch_events.importer.oauth import OAuthClient, TokenSource
from nexarch_events.importer.sasl import OAUTHBEARER, XOAUTH2, OAuthLogin
from nexarch_events.importer.scheduler import ImportScheduler
from nexarch_events.importer.signin import SignIn
from nexarch_events.importer.state import StateStore
from nexarch_events.importer.sync import run_sync
from nexarch_events.queue.notify import IMPORT_REQUESTS_CHANNEL, Listener
from nexarch_events.settings import ImportSettings, QueueSettings
from nexarch_events.testing import record_imports
from nexarch_events.testing.oauth_server import TokenEndpoint
from tests.support.dovecot import Dovecot
from tests.support.oauth import CLIENT_SECRET, token_endpoint
from tests.support.oauth import oauth_dovecot as running_oauth_dovecot

SECRET = CLIENT_SECRET
SECRET_ENV = "NEXARCH_TEST_OAUTH_CLIENT_SECRET"


def sample(n: int) -> bytes:
    return (f"From: sender{n}@example.org\r\nTo: alice@example.org\r\n"
            f"Subject: oauth sample {n}\r\nMessage-ID: <oauth-{n}@example.org>\r\n\r\n"
            f"Body of sample {n}.\r\n").encode()


@pytest.fixture
async def endpoint() -> AsyncIterator[TokenEndpoint]:
    async with token_endpoint() as server:
        yield server


@pytest.fixture
async def oauth_dovecot(endpoint: TokenEndpoint) -> AsyncIterator[Dovecot]:
    async with running_oauth_dovecot(endpoint) as server:
        yield server


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


# -- registered OAuth2 mailboxes: the registry, a sync, the scheduler --------

SEALED_REFRESH = "refresh-token-never-in-clear"


def oauth_config(dovecot: Dovecot, endpoint: TokenEndpoint, folder: str, *,
                 name: str = "alice-oauth", refresh_ref: str | None = None) -> MailboxConfig:
    client = OAuthClient(token_url=endpoint.url, client_id="archive-app",
                         client_secret_ref=f"env:{SECRET_ENV}", refresh_token_ref=refresh_ref,
                         scope="https://outlook.office365.com/.default")
    return MailboxConfig(tenant_slug="acme", name=name, host=dovecot.host, port=dovecot.port,
                         tls_mode="starttls", ca_file=dovecot.ca_file, username="alice",
                         password_ref=None, folder=folder, oauth=client)


@pytest.fixture
def secret_env(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv(SECRET_ENV, SECRET)


async def test_the_registry_keeps_an_oauth_client_and_lists_no_secret(
        db: Database, endpoint: TokenEndpoint, dovecot: Dovecot) -> None:
    key = secrets.new_key()
    sealed = secrets.seal(SEALED_REFRESH, key)
    config = oauth_config(dovecot, endpoint, "INBOX", refresh_ref=sealed)
    registry = MailboxRegistry(db)
    await registry.add(config)
    assert await registry.get("acme", "alice-oauth") == config.__class__(
        **{f: getattr(config, f) for f in config.__dataclass_fields__ if f != "id"},
        id=(await registry.get("acme", "alice-oauth")).id)
    [listed] = await registry.list("acme")
    assert listed["auth_method"] == "oauth2"
    assert not [k for k in listed if k.endswith("_ref")]
    raw = await db.fetchval("SELECT oauth_refresh_ref FROM mail_import_mailboxes")
    assert raw == sealed and SEALED_REFRESH not in raw


@pytest.mark.parametrize(("columns", "constraint"), [
    # a password and an OAuth client at once
    ("'oauth2', 'env:PW', 'https://t.example/token', 'app', 'env:S', NULL",
     "mail_import_mailboxes_credentials"),
    # an OAuth client with neither a secret nor a refresh token
    ("'oauth2', NULL, 'https://t.example/token', 'app', NULL, NULL",
     "mail_import_mailboxes_credentials"),
    # a password mailbox with OAuth leftovers
    ("'password', 'env:PW', 'https://t.example/token', NULL, NULL, NULL",
     "mail_import_mailboxes_credentials"),
    # a secret itself instead of a reference to it
    ("'oauth2', NULL, 'https://t.example/token', 'app', 'hunter2', NULL",
     "mail_import_mailboxes_oauth_secret_ref"),
    ("'oauth2', NULL, 'https://t.example/token', 'app', NULL, '1//0refresh-token'",
     "mail_import_mailboxes_oauth_refresh_ref"),
])
async def test_the_database_holds_every_mailbox_to_one_sign_in(
        db: Database, columns: str, constraint: str) -> None:
    with pytest.raises(DatabaseError) as refused:
        await db.execute(
            "INSERT INTO mail_import_mailboxes (tenant_slug, name, host, port, tls_mode, "
            "username, auth_method, password_ref, oauth_token_url, oauth_client_id, "
            "oauth_secret_ref, oauth_refresh_ref) VALUES ('acme', 'm', 'imap.example.org', "
            f"993, 'implicit', 'alice', {columns})")
    assert refused.value.constraint == constraint


async def test_an_oauth_mailbox_is_synced_with_one_token(
        db: Database, endpoint: TokenEndpoint, oauth_dovecot: Dovecot,
        secret_env: None) -> None:
    oauth_dovecot.create_mailbox("alice", "Archive")
    for n in range(3):
        oauth_dovecot.append("alice", "Archive", sample(n))
    config = oauth_config(oauth_dovecot, endpoint, "Archive")
    await MailboxRegistry(db).add(config)
    sign_in = SignIn(await MailboxRegistry(db).get("acme", "alice-oauth"), secret_key=None)
    try:
        first = await run_sync(db, config, sign_in, imap_timeout=30)
        for n in range(3, 5):
            oauth_dovecot.append("alice", "Archive", sample(n))
        second = await run_sync(db, config, sign_in, imap_timeout=30)
    finally:
        await sign_in.aclose()
    assert (first.imported, second.imported) == (3, 2)
    assert len(endpoint.requests) == 1  # the second session reused the token
    assert endpoint.introspections >= 2


async def test_a_refused_token_is_the_mailbox_state_and_is_not_asked_again_at_once(
        db: Database, endpoint: TokenEndpoint, oauth_dovecot: Dovecot,
        secret_env: None) -> None:
    endpoint.refuse = "invalid_client"
    config = oauth_config(oauth_dovecot, endpoint, "INBOX")
    await MailboxRegistry(db).add(config)
    sign_in = SignIn(config, secret_key=None)
    try:
        for _ in range(3):  # e.g. three "sync now" requests in a row
            with pytest.raises(OAuthRefused):
                await run_sync(db, config, sign_in, imap_timeout=30)
    finally:
        await sign_in.aclose()
    assert len(endpoint.requests) == 1
    state = await StateStore(db).get("acme", "alice-oauth")
    assert state.last_error is not None
    assert state.last_error.startswith("sign-in refused by the provider")
    assert SECRET not in state.last_error


async def test_an_idle_connection_signs_in_anew_before_its_token_is_due(
        db: Database, endpoint: TokenEndpoint, oauth_dovecot: Dovecot, secret_env: None,
        monkeypatch: pytest.MonkeyPatch) -> None:
    # Seconds instead of an hour: tokens live 3 s and are due after 2.4 s;
    # the floor on a session's length comes down with them.
    monkeypatch.setattr(oauth, "MIN_LIFETIME_S", 1.0)
    monkeypatch.setattr(signin, "MIN_SESSION_S", 1.0)
    endpoint.lifetime = 3
    oauth_dovecot.create_mailbox("alice", "Live")
    await MailboxRegistry(db).add(oauth_config(oauth_dovecot, endpoint, "Live"),
                                  interval_seconds=3600)
    listener = Listener(db.dsn, QueueSettings(listener_ping_interval=0.5,
                                              listener_ping_timeout=0.5),
                        channels=(IMPORT_REQUESTS_CHANNEL,))
    sched = ImportScheduler(db, ImportSettings(imap_timeout=30, reload_interval=60),
                            listener=listener)
    async with record_imports(db.dsn) as rec, trio.open_nursery() as nursery:
        await nursery.start(listener.run)
        await nursery.start(sched.run)
        with trio.fail_after(60):
            while len(endpoint.requests) < 4:  # three re-sign-ins on schedule
                await trio.sleep(0.1)
        with trio.fail_after(30):  # it holds IDLE between its re-sign-ins
            while sched.idle_mailboxes() != [("acme", "alice-oauth")]:
                await trio.sleep(0.02)
        oauth_dovecot.append("alice", "Live", sample(99))
        await rec.wait_for_imported(tenant="acme", mailbox="alice-oauth", count=1,
                                    timeout=30)
        nursery.cancel_scope.cancel()
    state = await StateStore(db).get("acme", "alice-oauth")
    assert state.last_error is None  # never dropped by the server, never refused
    # Each new session used the token fetched for it, and nothing else.
    assert all(r["grant_type"] == "client_credentials" for r in endpoint.requests)


async def test_a_refused_token_on_the_idle_path_is_the_state_and_no_storm(
        db: Database, endpoint: TokenEndpoint, oauth_dovecot: Dovecot,
        secret_env: None) -> None:
    endpoint.refuse = "invalid_grant"
    await MailboxRegistry(db).add(oauth_config(oauth_dovecot, endpoint, "INBOX"),
                                  interval_seconds=3600)
    listener = Listener(db.dsn, QueueSettings(listener_ping_interval=0.5,
                                              listener_ping_timeout=0.5),
                        channels=(IMPORT_REQUESTS_CHANNEL,))
    # The runner retries after 0.2 s at most: only the token source's own
    # backoff (60 s after a refusal) stands between it and the provider.
    sched = ImportScheduler(db, ImportSettings(imap_timeout=30, reload_interval=60,
                                               backoff_max=0.2), listener=listener)
    store = StateStore(db)
    async with trio.open_nursery() as nursery:
        await nursery.start(listener.run)
        await nursery.start(sched.run)
        with trio.fail_after(30):
            while (await store.get_or_create("acme", "alice-oauth")).last_error is None:
                await trio.sleep(0.05)
        await trio.sleep(3)  # about 15 more attempts of the runner
        nursery.cancel_scope.cancel()
    state = await store.get("acme", "alice-oauth")
    assert state.last_error is not None
    assert state.last_error.startswith("sign-in refused by the provider")
    assert len(endpoint.requests) == 1


async def test_a_certificate_client_is_kept_and_the_database_refuses_two_credentials(
        db: Database, endpoint: TokenEndpoint, dovecot: Dovecot) -> None:
    client = OAuthClient(token_url=endpoint.url, client_id="archive-app",
                         client_certificate_ref="file:/run/secrets/archive-app.pem",
                         scope="https://outlook.office365.com/.default")
    config = MailboxConfig(tenant_slug="acme", name="cert", host=dovecot.host,
                           port=dovecot.port, tls_mode="starttls", username="alice",
                           password_ref=None, oauth=client)
    await MailboxRegistry(db).add(config)
    assert (await MailboxRegistry(db).get("acme", "cert")).oauth == client
    with pytest.raises(DatabaseError) as refused:
        await db.execute("UPDATE mail_import_mailboxes SET oauth_secret_ref = 'env:S' "
                         "WHERE name = 'cert'")
    assert refused.value.constraint == "mail_import_mailboxes_credentials"


async def imported_count(db: Database) -> int:
    count: int = await db.fetchval("SELECT count(*) FROM mail_archive")
    return count


async def test_a_rotated_refresh_token_outlives_a_restart_of_the_importer(
        db: Database, endpoint: TokenEndpoint, oauth_dovecot: Dovecot,
        secret_env: None, monkeypatch: pytest.MonkeyPatch) -> None:
    """A provider that issues a new refresh token with every refresh and
    revokes the one presented (RFC 6749 section 6; Microsoft's registered
    token expires 90 days after it was issued): the rotated token lived only
    in the token source, so after a restart the registered one was presented
    again and refused, and no folder of the account was imported any more.
    It is kept in Postgres now, sealed with the operator's key."""
    registered = "registered-refresh-token"
    monkeypatch.setenv("NEXARCH_TEST_OAUTH_REFRESH", registered)
    endpoint.refresh_tokens.add(registered)
    endpoint.rotate = True
    key = secrets.new_key()
    oauth_dovecot.create_mailbox("alice", "Rotated")
    oauth_dovecot.append("alice", "Rotated", sample(1))
    await MailboxRegistry(db).add(
        oauth_config(oauth_dovecot, endpoint, "Rotated",
                     refresh_ref="env:NEXARCH_TEST_OAUTH_REFRESH"),
        interval_seconds=3600)
    settings = ImportSettings(imap_timeout=30, reload_interval=60)
    for started, expected in ((1, 1), (2, 2)):  # the importer, then the importer restarted
        if started == 2:
            oauth_dovecot.append("alice", "Rotated", sample(2))
        async with trio.open_nursery() as nursery:
            await nursery.start(ImportScheduler(db, settings, secret_key=key).run)
            with trio.fail_after(30):
                while await imported_count(db) < expected:
                    await trio.sleep(0.05)
            nursery.cancel_scope.cancel()
    presented = [r["refresh_token"] for r in endpoint.requests]
    assert presented[0] == registered and registered not in presented[1:], presented
    [newest] = endpoint.refresh_tokens
    sealed = await db.fetchval("SELECT token_sealed FROM mail_import_oauth_refresh")
    assert sealed.startswith(secrets.SEALED_PREFIX) and newest not in sealed
    assert secrets.resolve(sealed, key=key) == newest
    state = await StateStore(db).get("acme", "alice-oauth")
    assert state.last_error is None


async def test_a_refresh_token_registered_anew_starts_over(
        db: Database, endpoint: TokenEndpoint, secret_env: None,
        monkeypatch: pytest.MonkeyPatch) -> None:
    """The newest token of a chain is kept under the registered one: a user
    who consented again (a new registered token) is not signed in with the
    old chain's token, which the provider may have revoked with the consent."""
    from nexarch_events.importer.refresh_tokens import StoredRefreshTokens

    key = secrets.new_key()
    store = StoredRefreshTokens(db, key)
    endpoint.rotate = True
    endpoint.refresh_tokens.update({"first-consent", "second-consent"})
    client = OAuthClient(token_url=endpoint.url, client_id="archive-app",
                         client_secret_ref=f"env:{SECRET_ENV}",
                         refresh_token_ref="env:NEXARCH_TEST_OAUTH_REFRESH")

    async def refresh_with(registered: str) -> str:
        monkeypatch.setenv("NEXARCH_TEST_OAUTH_REFRESH", registered)
        async with TokenSource(client, secret_key=key, refresh_store=store) as source:
            await source.token()
        return endpoint.requests[-1]["refresh_token"]

    assert await refresh_with("first-consent") == "first-consent"
    rotated_once = await refresh_with("first-consent")
    assert rotated_once != "first-consent"  # the newest of the chain, from the store
    assert await refresh_with("second-consent") == "second-consent"
    assert await db.fetchval("SELECT count(*) FROM mail_import_oauth_refresh") == 2
    # Sealed with another key: the registered one, and a warning, not a crash.
    other = StoredRefreshTokens(db, secrets.new_key())
    monkeypatch.setenv("NEXARCH_TEST_OAUTH_REFRESH", "second-consent")
    assert await other.load(oauth.refresh_chain(client, "second-consent")) is None


async def test_without_the_key_a_rotated_token_is_kept_in_memory_with_a_warning(
        db: Database, endpoint: TokenEndpoint, secret_env: None,
        monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture) -> None:
    """No key to seal with: never in the database in clear text; the
    process's token sources share it (an account's runners release their
    source between runs), and the operator is told what a restart means."""
    monkeypatch.setenv("NEXARCH_TEST_OAUTH_REFRESH", "registered-Tk7")
    endpoint.rotate = True
    endpoint.refresh_tokens.add("registered-Tk7")
    client = OAuthClient(token_url=endpoint.url, client_id="archive-app",
                         client_secret_ref=f"env:{SECRET_ENV}",
                         refresh_token_ref="env:NEXARCH_TEST_OAUTH_REFRESH")
    sources = signin.TokenSources(secret_key=None, db=db)
    for _ in range(3):
        source = sources.acquire(client, "alice")
        await source.token()
        await sources.release(source)
    presented = [r["refresh_token"] for r in endpoint.requests]
    assert presented[0] == "registered-Tk7" and len(set(presented)) == 3, presented
    assert await db.fetchval("SELECT count(*) FROM mail_import_oauth_refresh") == 0
    warned = [r for r in caplog.records if "NEXARCH_SECRET_KEY_FILE" in r.getMessage()]
    assert len(warned) == 1 and not any(
        t in r.getMessage() for r in caplog.records for t in presented)


async def test_a_source_presents_the_chain_s_newest_token_after_another_rotated_it(
        db: Database, endpoint: TokenEndpoint, secret_env: None,
        monkeypatch: pytest.MonkeyPatch) -> None:
    """The service's source rotated R0 -> R1; a second source of the chain
    (`mailbox sync-now`, `account discover`) rotated R1 -> R2 through the
    store; the service's source presented its own R1 again, refused for
    good (a review). It reads the store first."""
    from nexarch_events.importer.refresh_tokens import StoredRefreshTokens

    key = secrets.new_key()
    store = StoredRefreshTokens(db, key)
    monkeypatch.setenv("NEXARCH_TEST_OAUTH_REFRESH", "r0-registered")
    endpoint.rotate = True
    endpoint.refresh_tokens.add("r0-registered")
    client = OAuthClient(token_url=endpoint.url, client_id="archive-app",
                         client_secret_ref=f"env:{SECRET_ENV}",
                         refresh_token_ref="env:NEXARCH_TEST_OAUTH_REFRESH")
    now = [1000.0]
    async with TokenSource(client, secret_key=key, refresh_store=store,
                           clock=lambda: now[0]) as service:
        await service.token()
        async with TokenSource(client, secret_key=key, refresh_store=store) as cli:
            await cli.token()
        now[0] += 3600  # the service's token is due
        await service.token()
    presented = [r["refresh_token"] for r in endpoint.requests]
    assert len(presented) == 3 and len(set(presented)) == 3, presented
