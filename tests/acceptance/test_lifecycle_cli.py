"""The lifecycle commands as an operator runs them (the CLI in a
subprocess, real Postgres): erase, hold, audit, and that a tenant named on
the command line never reaches another tenant's mail."""

from __future__ import annotations

import getpass
import json
import os
import subprocess
import sys
from pathlib import Path

from nexarch_events.aio import Database
from nexarch_events.aio import run as aio_run


def cli(url: str, *args: str) -> subprocess.CompletedProcess[str]:
    environ = {k: v for k, v in os.environ.items() if not k.startswith("NEXARCH_")}
    environ["NEXARCH_DATABASE_URL"] = url
    return subprocess.run([sys.executable, "-m", "nexarch_events", *args], env=environ,
                          capture_output=True, text=True, timeout=120, check=False)


def archived(url: str, tenant: str) -> list[int]:
    async def go() -> list[int]:
        async with Database.open(url, max_size=1) as db:
            rows = await db.fetch("SELECT id FROM mail_archive WHERE tenant_slug = $1 "
                                  "ORDER BY id", tenant)
            return [r["id"] for r in rows]

    return aio_run(go)


def store(url: str, tmp_path: Path, tenant: str, n: int) -> int:
    path = tmp_path / f"{tenant}-{n}.eml"
    path.write_bytes(f"Subject: note {n}\r\nFrom: a@example.org\r\n\r\nbody {n}\r\n".encode())
    done = cli(url, "archive", "--tenant", tenant, str(path))
    assert done.returncode == 0, done.stderr
    return int(done.stdout.split("archive_id=")[1].split()[0])


def test_erase_hold_and_audit_from_the_command_line(database_url: str, tmp_path: Path) -> None:
    a1, a2 = store(database_url, tmp_path, "acme", 1), store(database_url, tmp_path, "acme", 2)
    b1 = store(database_url, tmp_path, "beta", 1)

    # Another tenant's id is not found, and nothing is erased.
    done = cli(database_url, "erase", "--tenant", "beta", str(a1))
    assert done.returncode == 1 and "no archived message" in done.stderr
    assert archived(database_url, "acme") == [a1, a2]

    held = cli(database_url, "hold", "add", "--tenant", "acme", "--whole-tenant",
               "--reason", "case 9", "--json")
    assert held.returncode == 0, held.stderr
    hold_id = json.loads(held.stdout)["id"]
    refused = cli(database_url, "erase", "--tenant", "acme", str(a1))
    assert refused.returncode == 1 and f"legal hold #{hold_id}" in refused.stderr
    assert archived(database_url, "acme") == [a1, a2]
    # Tenant beta cannot see or remove acme's hold.
    assert json.loads(cli(database_url, "hold", "list", "--tenant", "beta", "--json").stdout) == []
    other = cli(database_url, "hold", "remove", str(hold_id), "--tenant", "beta")
    assert other.returncode == 1
    assert cli(database_url, "hold", "remove", str(hold_id), "--tenant", "acme").returncode == 0

    erased = cli(database_url, "erase", "--tenant", "acme", str(a1), "--json")
    assert erased.returncode == 0, erased.stderr
    assert json.loads(erased.stdout)["erased"] == [a1]
    assert archived(database_url, "acme") == [a2]

    # --all needs the tenant repeated.
    for confirm in ([], ["--yes-erase-tenant", "beta"]):
        done = cli(database_url, "erase", "--tenant", "acme", "--all", *confirm)
        assert done.returncode == 2 and "--yes-erase-tenant acme" in done.stderr
    assert archived(database_url, "acme") == [a2]
    done = cli(database_url, "erase", "--tenant", "acme", "--all", "--yes-erase-tenant", "acme")
    assert done.returncode == 0, done.stderr
    assert archived(database_url, "acme") == []
    assert archived(database_url, "beta") == [b1]

    log = json.loads(cli(database_url, "audit", "list", "--tenant", "acme", "--json").stdout)
    assert [e["action"] for e in log] == ["erase_tenant", "erase", "hold_remove", "hold_add"]
    assert {e["actor"] for e in log} == {getpass.getuser()}
    assert json.loads(cli(database_url, "audit", "list", "--tenant", "beta",
                          "--json").stdout) == []


def test_bad_lifecycle_arguments_are_usage_errors(database_url: str) -> None:
    for args in (["erase", "--tenant", "acme"],
                 ["erase", "--tenant", "acme", "1", "--query", "x"],
                 ["erase", "--tenant", "acme", "0"],
                 ["erase", "--tenant", "acme", "--query", "!!"],
                 ["erase", "--tenant", "acme", "1", "--dry-run"],
                 ["erase", "--tenant", "Bad_Slug", "1"],
                 ["hold", "add", "--tenant", "acme", "--query", "", "--reason", "r"],
                 ["hold", "add", "--tenant", "acme", "--whole-tenant", "--reason", " "],
                 ["audit", "list", "--limit", "0"],
                 ["audit", "list", "--action", "drop"]):
        done = cli(database_url, *args)
        assert done.returncode == 2, (args, done.stdout, done.stderr)


def test_retention_from_the_command_line(database_url: str, tmp_path: Path) -> None:
    path = tmp_path / "old.eml"
    path.write_bytes(b"Subject: old\r\nDate: Mon, 01 Jan 2001 00:00:00 +0000\r\n\r\nold\r\n")
    assert cli(database_url, "archive", "--tenant", "acme", str(path)).returncode == 0
    keep = store(database_url, tmp_path, "beta", 1)
    assert cli(database_url, "retention", "set", "--tenant", "acme", "--days", "30"
               ).returncode == 0
    shown = json.loads(cli(database_url, "retention", "show", "--json").stdout)
    assert [(p["tenant_slug"], p["days"], p["source"]) for p in shown] == [
        ("acme", 30, "database")]
    done = cli(database_url, "retention", "run")
    assert done.returncode == 0, done.stderr
    assert "acme: 1 message(s) erased" in done.stdout
    assert archived(database_url, "acme") == []
    assert archived(database_url, "beta") == [keep]
    log = json.loads(cli(database_url, "audit", "list", "--tenant", "acme", "--json").stdout)
    assert [(e["action"], e["count"]) for e in log] == [("retention_pass", 1),
                                                        ("retention_set", 0)]
    assert cli(database_url, "retention", "set", "--tenant", "acme", "--clear").returncode == 0
    assert json.loads(cli(database_url, "retention", "show", "--json").stdout) == []


def test_verify_index_names_erased_mail_the_index_still_has(database_url: str,
                                                             tmp_path: Path) -> None:
    a1, a2 = store(database_url, tmp_path, "acme", 1), store(database_url, tmp_path, "acme", 2)
    assert cli(database_url, "reindex", "--tenant", "acme").returncode == 0
    # Erased, and no worker has run its delete job yet.
    assert cli(database_url, "erase", "--tenant", "acme", str(a1)).returncode == 0
    report = cli(database_url, "verify-index", "--tenant", "acme")
    assert report.returncode == 1
    assert "1 archived, 2 indexed, 0 missing, 1 extra (1 of them erased)" in report.stdout
    assert f"erased but still indexed: {a1}" in report.stdout
    repaired = cli(database_url, "verify-index", "--tenant", "acme", "--repair")
    # The erasure's own delete job is still queued: repair does not queue
    # a second one.
    assert repaired.returncode == 0
    assert "repair: 0 job(s) queued for the workers, 1 already queued" in repaired.stdout
    # reindex runs workers of its own: the queued deletes run with it.
    assert cli(database_url, "reindex", "--tenant", "acme").returncode == 0
    final = cli(database_url, "verify-index", "--tenant", "acme")
    assert final.returncode == 0, final.stdout
    assert archived(database_url, "acme") == [a2]


def test_a_mailbox_hold_on_a_name_nothing_has_says_so(database_url: str) -> None:
    """`hold add --mailbox Legl` (a typo) recorded a hold that protected
    nothing, without a word (an operator audit). It is kept (a hold may
    come before the mail), and the command says so."""
    added = cli(database_url, "mailbox", "add", "acme", "Legal", "--host", "imap.example.org",
                "--user", "u", "--password-env", "PW")
    assert added.returncode == 0, added.stderr
    known = cli(database_url, "hold", "add", "--tenant", "acme", "--mailbox", "Legal",
                "--reason", "case 7")
    assert known.returncode == 0 and "note:" not in known.stderr
    typo = cli(database_url, "hold", "add", "--tenant", "acme", "--mailbox", "Legl",
               "--reason", "case 7")
    assert typo.returncode == 0, typo.stderr
    assert "no archived mail in mailbox 'Legl' and no mailbox of that name" in typo.stderr
    assert "on mailbox 'Legl'" in cli(database_url, "hold", "list", "--tenant", "acme").stdout
