"""A whole account as an operator registers it: ``account add``, ``account
discover``, ``account list``, ``mailbox sync-now`` of a discovered folder and
``account remove``, in subprocesses against a Dovecot of its own."""

from __future__ import annotations

import json
from collections.abc import Iterator

import pytest

from tests.acceptance.test_cli import cli
from tests.support.dovecot import Dovecot

PASSWORD = "dave-secret-4"


@pytest.fixture
def dave() -> Iterator[Dovecot]:
    server = Dovecot(users={"dave": PASSWORD})
    server.start()
    try:
        for folder in ("Sent", "Trash", "Kunden/Müller"):
            server.create_mailbox("dave", folder)
        server.append("dave", "Kunden/Müller",
                      b"From: m@example.org\r\nSubject: Angebot\r\n\r\nHallo.\r\n")
        yield server
    finally:
        server.stop()


def test_account_lifecycle(database_url: str, dave: Dovecot) -> None:
    env = {"DAVE_PASSWORD": PASSWORD}
    added = cli("account", "add", "acme", "dave", "--host", dave.host, "--port", str(dave.port),
                "--tls", "starttls", "--ca-file", dave.ca_file, "--user", "dave",
                "--password-env", "DAVE_PASSWORD", url=database_url, env=env)
    assert added.returncode == 0, added.stderr
    again = cli("account", "add", "acme", "dave", "--host", "h", "--user", "u",
                "--password-env", "X", url=database_url)
    assert again.returncode == 2 and "already has an account named 'dave'" in again.stderr
    # The database's bound, said as the CLI says every bound (exit 1 and a
    # raw CheckViolationError before).
    fast = cli("account", "add", "acme", "fast", "--host", "h", "--user", "u",
               "--password-env", "X", "--interval", "5", url=database_url)
    assert fast.returncode == 2 and "interval must be 10..604800 seconds" in fast.stderr, \
        fast.stderr

    found = cli("account", "discover", "acme", "dave", url=database_url, env=env)
    assert found.returncode == 0, found.stderr
    report = json.loads(found.stdout)
    assert sorted(report["archived"]) == ["INBOX", "Kunden/Müller", "Sent"]
    assert "Trash" in report["listed"] and report["gone"] == []

    mailboxes = json.loads(cli("mailbox", "list", "--json", url=database_url).stdout)
    [kunden] = [m for m in mailboxes if m["folder"] == "Kunden/Müller"]
    synced = cli("mailbox", "sync-now", "acme", kunden["name"], url=database_url, env=env)
    assert synced.returncode == 0, synced.stderr
    assert json.loads(synced.stdout)["imported"] == 1

    [account] = json.loads(cli("account", "list", "--json", url=database_url).stdout)
    assert (account["name"], account["folders"], account["last_discovery_error"]) == (
        "dave", 3, None)
    assert "password_ref" not in account
    assert [(f["folder"], f["state"], f["imported_total"]) for f in account[
        "folder_mailboxes"]] == [("INBOX", "not synced yet", 0),
                                 ("Kunden/Müller", "ok", 1), ("Sent", "not synced yet", 0)]
    assert not [k for f in account["folder_mailboxes"] for k in f if k.endswith("_ref")]
    text = cli("account", "list", url=database_url).stdout
    assert "dave" in text
    # Every folder under its account, decoded, with its state and counts.
    [line] = [ln for ln in text.splitlines() if "Kunden/Müller" in ln]
    assert line.split()[1:5] == ["ok", "1", "/", "1"]

    failed = cli("account", "discover", "acme", "dave", url=database_url)  # no password
    assert failed.returncode == 2 and "DAVE_PASSWORD is not set" in failed.stderr

    assert cli("account", "remove", "acme", "dave", url=database_url).returncode == 0
    assert json.loads(cli("mailbox", "list", "--json", url=database_url).stdout) == []
    assert cli("account", "remove", "acme", "dave", url=database_url).returncode == 1
