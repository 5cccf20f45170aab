"""Whole accounts against a real Dovecot: folders discovered with LIST (a
non-ASCII one included), trash, junk and drafts skipped, each folder synced
as a mailbox of its own with mail in two folders archived once, new,
renamed and deleted folders between discoveries, the operator's patterns,
and a new folder picked up by the running service's discovery and scheduler.
Each test has a Dovecot of its own: a discovery lists every folder of the
user, so folders other tests leave behind would change what it finds."""

from __future__ import annotations

from collections.abc import Iterator

import pytest
import trio

from nexarch_events.aio import Database
from nexarch_events.errors import ImapAuthError
from nexarch_events.importer.accounts import (
    AccountConfig,
    AccountDiscovery,
    AccountRegistry,
    discover,
    folder_mailbox_name,
)
from nexarch_events.importer.mailboxes import MailboxConfig, MailboxRegistry
from nexarch_events.importer.scheduler import ImportScheduler
from nexarch_events.importer.signin import SignIn
from nexarch_events.importer.sync import run_sync
from nexarch_events.queue.notify import IMPORT_REQUESTS_CHANNEL, Listener
from nexarch_events.settings import ImportSettings, QueueSettings
from nexarch_events.testing import record_imports
from tests.support.dovecot import Dovecot, _mailbox_arg

PASSWORD = "carol-secret-3"
PASSWORD_ENV = "NEXARCH_TEST_CAROL_PASSWORD"
FOLDERS = ["Sent", "Trash", "Junk", "Drafts", "Projekte/Übersicht", "Archiv 2024"]


def mail(n: int) -> bytes:
    return (f"From: s{n}@example.org\r\nTo: carol@example.org\r\nSubject: account {n}\r\n"
            f"Message-ID: <account-{n}@example.org>\r\n\r\nBody {n}.\r\n").encode()


@pytest.fixture
def carol(monkeypatch: pytest.MonkeyPatch) -> Iterator[Dovecot]:
    monkeypatch.setenv(PASSWORD_ENV, PASSWORD)
    server = Dovecot(users={"carol": PASSWORD})
    server.start()
    try:
        for folder in FOLDERS:
            server.create_mailbox("carol", folder)
        server.append("carol", "INBOX", mail(1))
        server.append("carol", "Archiv 2024", mail(1))  # the same message, filed twice
        server.append("carol", "Projekte/Übersicht", mail(2))
        server.append("carol", "Sent", mail(3))
        server.append("carol", "Trash", mail(4))
        yield server
    finally:
        server.stop()


def account(dovecot: Dovecot, **rules: object) -> AccountConfig:
    return AccountConfig(tenant_slug="acme", name="carol", host=dovecot.host,
                         port=dovecot.port, tls_mode="starttls", ca_file=dovecot.ca_file,
                         username="carol", password_ref=f"env:{PASSWORD_ENV}",
                         **rules)  # type: ignore[arg-type]


async def discovered(db: Database, config: AccountConfig):  # type: ignore[no-untyped-def]
    registry = AccountRegistry(db)
    stored = await registry.get(config.tenant_slug, config.name)
    sign_in = SignIn(stored.mailbox("INBOX"), secret_key=None)
    try:
        return await discover(db, stored, sign_in, imap_timeout=30)
    finally:
        await sign_in.aclose()


async def sync_all(db: Database) -> dict[str, int]:
    imported = {}
    for config, _ in await MailboxRegistry(db).scheduled():
        report = await run_sync(db, config, PASSWORD, imap_timeout=30)
        imported[config.folder] = report.imported  # duplicates included
    return imported


async def count(db: Database, sql: str) -> int:
    value: int = await db.fetchval(sql)
    return value


async def test_every_folder_but_trash_junk_and_drafts_is_archived_once(
        db: Database, carol: Dovecot) -> None:
    config = account(carol)
    await AccountRegistry(db).add(config)
    found = await discovered(db, config)
    expected = {"INBOX", "Sent", "Projekte/Übersicht", "Archiv 2024"}
    assert set(found.archived) == set(found.created) == expected
    assert {"Trash", "Junk", "Drafts"} <= set(found.listed)
    assert found.gone == () and found.conflicts == ()

    boxes = {config.folder: config.name for config, _ in await MailboxRegistry(db).scheduled()}
    assert boxes == {folder: folder_mailbox_name("carol", folder) for folder in expected}
    assert boxes["Sent"] == "carol/Sent"
    # The decoded name is what is stored and shown; the mailbox name is safe.
    assert boxes["Projekte/Übersicht"].startswith("carol/Projekte/-bersicht-")

    imported = await sync_all(db)
    assert imported == {"INBOX": 1, "Sent": 1, "Projekte/Übersicht": 1, "Archiv 2024": 1}
    # Four folder copies of three messages; the one in two folders once.
    assert await count(db, "SELECT count(*) FROM mail_archive") == 3
    assert await count(db, "SELECT count(*) FROM mail_archive_locations") == 4
    [listed] = await AccountRegistry(db).list("acme")
    assert (listed["folders"], listed["folders_gone"]) == (4, 0)
    assert not [k for k in listed if k.endswith("_ref")]


async def test_new_renamed_and_deleted_folders(db: Database, carol: Dovecot) -> None:
    config = account(carol)
    await AccountRegistry(db).add(config)
    await discovered(db, config)
    await sync_all(db)
    archived = await count(db, "SELECT count(*) FROM mail_archive")

    carol.create_mailbox("carol", "Neu")
    carol.append("carol", "Neu", mail(5))
    with carol.session("carol") as imap:
        assert imap.rename(_mailbox_arg("Archiv 2024"), _mailbox_arg("Archiv alt"))[0] == "OK"
    carol.delete_mailbox("carol", "Sent")

    found = await discovered(db, config)
    assert set(found.created) == {"Neu", "Archiv alt"}
    assert set(found.gone) == {"Archiv 2024", "Sent"}
    scheduled = {c.folder for c, _ in await MailboxRegistry(db).scheduled()}
    assert scheduled == {"INBOX", "Projekte/Übersicht", "Neu", "Archiv alt"}

    imported = await sync_all(db)
    assert imported["Archiv alt"] == 1 and imported["Neu"] == 1
    # The renamed folder's message was archived already: only "Neu" is new.
    assert await count(db, "SELECT count(*) FROM mail_archive") == archived + 1
    [listed] = await AccountRegistry(db).list("acme")
    assert (listed["folders"], listed["folders_gone"]) == (4, 2)

    # A folder that comes back is synced again, from its kept state.
    carol.create_mailbox("carol", "Sent")
    found = await discovered(db, config)
    assert "Sent" in found.archived and found.created == ()


async def test_exclusions_and_inclusions_are_the_operators(db: Database,
                                                           carol: Dovecot) -> None:
    config = account(carol, exclude_patterns=("Archiv*",), include_patterns=("Trash",))
    await AccountRegistry(db).add(config)
    found = await discovered(db, config)
    # The operator's exclusions replace the defaults: Junk and Drafts are in.
    assert set(found.archived) == {"INBOX", "Sent", "Trash", "Junk", "Drafts",
                                   "Projekte/Übersicht"}


async def test_a_registered_mailbox_of_the_same_name_is_not_taken_over(
        db: Database, carol: Dovecot) -> None:
    own = MailboxConfig(tenant_slug="acme", name="carol/Sent", host="imap.example.org",
                        port=993, tls_mode="implicit", username="someone",
                        password_ref="env:ELSEWHERE", folder="Outbox")
    await MailboxRegistry(db).add(own)
    config = account(carol)
    await AccountRegistry(db).add(config)
    found = await discovered(db, config)
    assert found.conflicts == ("Sent",) and "Sent" not in found.archived
    assert await MailboxRegistry(db).get("acme", "carol/Sent") == MailboxConfig(
        **{**{f: getattr(own, f) for f in own.__dataclass_fields__},
           "id": (await MailboxRegistry(db).get("acme", "carol/Sent")).id})


async def test_a_failed_discovery_is_on_the_account(db: Database, carol: Dovecot,
                                                    monkeypatch: pytest.MonkeyPatch) -> None:
    config = account(carol)
    await AccountRegistry(db).add(config)
    monkeypatch.setenv(PASSWORD_ENV, "wrong")
    with pytest.raises(ImapAuthError):
        await discovered(db, config)
    [listed] = await AccountRegistry(db).list("acme")
    assert "refused" in listed["last_discovery_error"] and "wrong" not in listed[
        "last_discovery_error"]
    assert await MailboxRegistry(db).scheduled() == []


async def test_the_service_picks_up_a_new_folder(db: Database, carol: Dovecot) -> None:
    await AccountRegistry(db).add(account(carol))
    listener = Listener(db.dsn, QueueSettings(listener_ping_interval=0.5,
                                              listener_ping_timeout=0.5),
                        channels=(IMPORT_REQUESTS_CHANNEL,))
    settings = ImportSettings(imap_timeout=30, reload_interval=60, discovery_interval=0.5)
    sched = ImportScheduler(db, settings, listener=listener)
    async with record_imports(db.dsn) as rec, trio.open_nursery() as nursery:
        await nursery.start(listener.run)
        await nursery.start(sched.run)
        await nursery.start(AccountDiscovery(db, settings).run)
        await rec.wait_for_imported(tenant="acme", count=4, timeout=60)
        carol.create_mailbox("carol", "Later")
        carol.append("carol", "Later", mail(6))
        # Found by the next discovery; its "sync now" makes the scheduler
        # start it at once (its reload interval is a minute).
        await rec.wait_for_imported(tenant="acme", mailbox=folder_mailbox_name("carol", "Later"),
                                    count=1, timeout=30)
        nursery.cancel_scope.cancel()


async def test_events_name_the_decoded_folder(db: Database, carol: Dovecot) -> None:
    """Every mail-imported notification carries the folder's decoded name
    (Dovecot sends "Projekte/&ANw-bersicht"), the new-message events and a
    resync's alike; a mailbox registered by hand names its folder too."""
    config = account(carol)
    await AccountRegistry(db).add(config)
    await discovered(db, config)
    umlaut = folder_mailbox_name("carol", "Projekte/Übersicht")
    async with record_imports(db.dsn) as rec:
        await sync_all(db)
        await rec.wait_for_imported(tenant="acme", count=4, timeout=30)
        # A folder deleted and made again has a new UIDVALIDITY: a resync.
        carol.delete_mailbox("carol", "Projekte/Übersicht")
        carol.create_mailbox("carol", "Projekte/Übersicht")
        carol.append("carol", "Projekte/Übersicht", mail(7))
        await sync_all(db)
        await rec.wait_for_imported(tenant="acme", mailbox=umlaut, count=2, timeout=30)
    imported = {(e.mailbox, e.folder) for e in rec.select(tenant="acme")}
    assert imported == {(folder_mailbox_name("carol", f), f)
                        for f in ("INBOX", "Sent", "Projekte/Übersicht", "Archiv 2024")}
    [resync] = rec.select(event="resync", mailbox=umlaut)
    assert resync.folder == "Projekte/Übersicht"
    assert resync.payload["folder"] == "Projekte/Übersicht"


async def test_an_accounts_sync_now_finds_a_new_folder_at_once(db: Database,
                                                              carol: Dovecot) -> None:
    """With discoveries an hour apart, the account's "Sync now" lists its
    folders at once: a folder made since is found and synced; a burst of
    clicks is one discovery."""
    registry = AccountRegistry(db)
    await registry.add(account(carol))
    listener = Listener(db.dsn, QueueSettings(listener_ping_interval=0.5,
                                              listener_ping_timeout=0.5),
                        channels=(IMPORT_REQUESTS_CHANNEL,))
    settings = ImportSettings(imap_timeout=30, reload_interval=60, discovery_interval=3600)
    sched = ImportScheduler(db, settings, listener=listener)
    discovery = AccountDiscovery(db, settings, listener=listener)
    later = folder_mailbox_name("carol", "Später")
    async with record_imports(db.dsn) as rec, trio.open_nursery() as nursery:
        await nursery.start(listener.run)
        await nursery.start(sched.run)
        await nursery.start(discovery.run)
        await rec.wait_for_imported(tenant="acme", count=4, timeout=60)
        before = await discovered_at(db)
        carol.create_mailbox("carol", "Später")
        carol.append("carol", "Später", mail(8))
        stored = await registry.get("acme", "carol")
        assert stored.id is not None
        for _ in range(5):  # clicked five times
            await registry.request_sync(stored.id, tenant_slug="acme")
        await rec.wait_for_imported(tenant="acme", mailbox=later, count=1, timeout=30)
        nursery.cancel_scope.cancel()
    [event] = rec.select(tenant="acme", mailbox=later)
    assert event.folder == "Später"
    assert await discovered_at(db) > before
    # The discovery at start, and one for the five clicks.
    assert discovery.attempts == 2


async def discovered_at(db: Database):  # type: ignore[no-untyped-def]
    return await db.fetchval("SELECT last_discovery_at FROM mail_import_accounts")


async def test_a_folder_whose_name_holds_an_asterisk_and_a_space_is_archived(
        db: Database, carol: Dovecot) -> None:
    """LIST sends such a name as ``"* Wichtig"``; aioimaplib's framing
    removed every "* " from an untagged line, so the folder was listed as
    "Wichtig" (which does not exist) and its mail was never archived."""
    for folder, n in (("* Wichtig", 5), ("Kunden * 2024", 6)):
        carol.create_mailbox("carol", folder)
        carol.append("carol", folder, mail(n))
    config = account(carol)
    await AccountRegistry(db).add(config)
    found = await discovered(db, config)
    assert {"* Wichtig", "Kunden * 2024"} <= set(found.archived)
    assert not {"Wichtig", "Kunden 2024"} & set(found.listed)
    imported = await sync_all(db)
    assert imported["* Wichtig"] == imported["Kunden * 2024"] == 1
    assert await count(db, "SELECT count(*) FROM mail_archive "
                           "WHERE position('account 5' IN convert_from(raw, 'UTF8')) > 0") == 1
