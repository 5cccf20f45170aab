"""`nexarch-events run` as an operator runs it: one process, configured by a
TOML file, against the test Postgres and the real Dovecot; mail appended to
Dovecot becomes searchable through the HTTP API; SIGTERM exits 0."""

from __future__ import annotations

import hashlib
import os
import re
import signal
import subprocess
import sys
from pathlib import Path

import httpx
import trio

from nexarch_events.aio import Database
from tests.acceptance.test_importer_cli import register
from tests.support.dovecot import Dovecot
from tests.support.mailgen import unique_token

ACME_TOKEN = "acme-token-" + "x" * 24
OTHER_TOKEN = "other-token-" + "y" * 24
ADMIN_TOKEN = "admin-token-" + "z" * 24


def write_config(path: Path) -> Path:
    path.write_text(f'''
log_format = "json"
[api]
port = 0
[queue]
workers = 2
[[api.tokens]]
name = "acme"
tenant = "acme"
token_sha256 = "{hashlib.sha256(ACME_TOKEN.encode()).hexdigest()}"
[[api.tokens]]
name = "other"
tenant = "other"
token = "{OTHER_TOKEN}"
[[api.tokens]]
name = "ops"
token = "{ADMIN_TOKEN}"
''')
    return path


def message(token: str) -> bytes:
    return (f"From: Carol <carol@example.org>\r\nTo: alice@example.org\r\n"
            f"Subject: Quarterly report {token}\r\nMessage-ID: <{token}@example.org>\r\n"
            f"Date: Mon, 30 Nov 2026 10:00:00 +0000\r\n\r\n"
            f"The numbers are in: {token}.\r\n").encode()


async def test_run_imports_indexes_serves_search_and_stops_cleanly(
        db: Database, dovecot: Dovecot, imap_folder: str, tmp_path: Path) -> None:
    assert register(db.dsn, dovecot, imap_folder, "inbox", "--interval", "3600").returncode == 0
    config = write_config(tmp_path / "nexarch.toml")
    environ = {k: v for k, v in os.environ.items() if not k.startswith("NEXARCH_")}
    environ.update(NEXARCH_DATABASE_URL=db.dsn, NEXARCH_CONFIG=str(config),
                   ALICE_PASSWORD=dovecot.users["alice"])
    log = bytearray()
    with trio.fail_after(120):
        proc = await trio.lowlevel.open_process(
            [sys.executable, "-m", "nexarch_events", "run"], env=environ,
            stdout=subprocess.DEVNULL, stderr=subprocess.PIPE)
        assert proc.stderr is not None
        try:
            # The bound port is in the structured log ("api listening on ...").
            port = None
            while port is None:
                chunk = await proc.stderr.receive_some()
                assert chunk, log.decode()
                log += chunk
                found = re.search(rb"api listening on http://127\.0\.0\.1:(\d+)", log)
                port = int(found[1]) if found else None
            base = f"http://127.0.0.1:{port}"
            acme = {"Authorization": f"Bearer {ACME_TOKEN}"}
            other = {"Authorization": f"Bearer {OTHER_TOKEN}"}
            token = unique_token(1)
            await trio.to_thread.run_sync(dovecot.append, "alice", imap_folder, message(token))
            async with httpx.AsyncClient(base_url=base, timeout=10) as client:
                assert (await client.get("/healthz")).status_code == 200
                started = trio.current_time()
                while True:
                    found_ = await client.get("/search", params={"q": token}, headers=acme)
                    assert found_.status_code == 200, found_.text
                    if found_.json()["total"] == 1:
                        break
                    assert trio.current_time() - started < 30, found_.json()
                    await trio.sleep(0.05)
                hit = found_.json()["hits"][0]
                assert token in hit["subject"]
                # Another tenant's token sees nothing of it; no token, no data.
                theirs = await client.get("/search", params={"q": token}, headers=other)
                assert theirs.status_code == 200 and theirs.json()["total"] == 0
                assert (await client.get("/search", params={"q": token})).status_code == 401
                mailboxes = (await client.get("/mailboxes", headers=acme)).json()["mailboxes"]
                assert [m["name"] for m in mailboxes] == ["inbox"]
                assert mailboxes[0]["last_synced_uid"] >= 1
                theirs_mb = (await client.get("/mailboxes", headers=other)).json()
                assert theirs_mb["mailboxes"] == []
                # The job table's upkeep is wired to this process's /metrics.
                scrape = await client.get(
                    "/metrics", headers={"Authorization": f"Bearer {ADMIN_TOKEN}"})
                assert scrape.status_code == 200
                for counter in ("nexarch_queue_pruned_jobs_total",
                                "nexarch_queue_vacuums_total",
                                "nexarch_queue_vacuum_seconds_total"):
                    assert f"\n{counter} " in scrape.text, counter
            proc.send_signal(signal.SIGTERM)
            while chunk := await proc.stderr.receive_some():
                log += chunk
            assert await proc.wait() == 0, log.decode()[-3000:]
        finally:
            if proc.returncode is None:
                proc.kill()
                await proc.wait()
    assert await db.fetchval(
        "SELECT count(*) FROM mail_index_jobs WHERE status = 'processing'") == 0
    # JSON log lines (log_format = "json" in the file), no secret in them.
    text = log.decode()
    assert '"level": "INFO"' in text
    for secret in (ACME_TOKEN, OTHER_TOKEN, ADMIN_TOKEN, dovecot.users["alice"]):
        assert secret not in text
