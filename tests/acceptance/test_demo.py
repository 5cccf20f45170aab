"""``nexarch-events demo`` as users run it: the CLI in a subprocess, against
the test Postgres. Checked against its output (the demo's product) and the
rows it left: the mail it served was imported, indexed and found."""

from __future__ import annotations

import os
import re
import signal
import subprocess
import sys

import httpx
import trio

from nexarch_events.aio import Database
from nexarch_events.index.base import SearchQuery
from nexarch_events.index.postgres import PostgresIndex

DEMO = [sys.executable, "-m", "nexarch_events", "demo"]
SUMMARY = re.compile(r"^  messages +(\d+) arrived, (\d+) imported, (\d+) searchable "
                     r"\(plus (\d+) in the mailbox at start\)$", re.MULTILINE)
SEARCH = re.compile(r'^search "(\w+)" in tenant demo: (\d+) match\(es\)(?:, top \d+)?$',
                    re.MULTILINE)
LATENCY = re.compile(r"^  latency +arrival -> searchable: p50 (\d+) ms .* max (\d+) ms",
                     re.MULTILINE)


def demo_env(url: str) -> dict[str, str]:
    environ = {k: v for k, v in os.environ.items() if not k.startswith("NEXARCH_")}
    environ["NEXARCH_DATABASE_URL"] = url
    environ["NEXARCH_API_PORT"] = "0"  # any free port: tests run side by side
    return environ


async def archived_state(db: Database) -> tuple[set[int], dict[str, int], int]:
    """(archive ids of tenant demo, its index jobs by status, demo mailboxes left)."""
    ids = {r["id"] for r in await db.fetch(
        "SELECT id FROM mail_archive WHERE tenant_slug = 'demo'")}
    jobs = {r["status"]: r["n"] for r in await db.fetch(
        "SELECT status::text AS status, count(*) AS n FROM mail_index_jobs "
        "WHERE tenant_slug = 'demo' AND job_type = 'index' GROUP BY 1")}
    mailboxes = await db.fetchval(
        "SELECT count(*) FROM mail_import_mailboxes WHERE tenant_slug = 'demo'")
    return ids, jobs, mailboxes


async def test_demo_imports_indexes_and_finds_the_mail_it_serves(
        db: Database, database_url: str) -> None:
    with trio.fail_after(180):
        done = await trio.run_process([*DEMO, "--duration", "6", "--rate", "4"],
                                      env=demo_env(database_url), capture_stdout=True,
                                      capture_stderr=True, check=False)
    out, err = done.stdout.decode(), done.stderr.decode()
    assert done.returncode == 0, (out, err)
    assert "Traceback" not in err

    summary = SUMMARY.search(out)
    assert summary is not None, out
    arrived, imported, searchable, initial = map(int, summary.groups())
    assert initial == 12
    assert arrived >= 20 and arrived == imported == searchable, out
    latency = LATENCY.search(out)
    assert latency is not None and 0 < int(latency.group(1)) <= int(latency.group(2)), out
    (topic, topic_hits), (token, token_hits) = [(m[1], int(m[2])) for m in SEARCH.finditer(out)]
    assert topic_hits >= 1 and token_hits == 1, out

    ids, jobs, mailboxes = await archived_state(db)
    assert len(ids) == initial + arrived
    # Every message indexed: one succeeded job each, nothing else left.
    assert jobs == {"succeeded": initial + arrived}
    index = PostgresIndex(db)
    assert await index.document_ids("demo") == ids
    found = await index.search(SearchQuery("demo", token))
    assert found.total == 1 and found.hits[0].archive_id in ids
    assert (await index.search(SearchQuery("demo", topic))).total == topic_hits
    # Its IMAP server is gone with the demo: so is the mailbox's registration.
    assert mailboxes == 0


async def test_sigint_ends_the_demo_cleanly_with_a_summary(
        db: Database, database_url: str) -> None:
    output = bytearray()
    with trio.fail_after(120):
        process = await trio.lowlevel.open_process(
            [*DEMO, "--duration", "600", "--rate", "5"], env=demo_env(database_url),
            stdout=subprocess.PIPE, stderr=subprocess.STDOUT)
        assert process.stdout is not None
        try:
            # Interrupt once new mail is flowing (the first progress line).
            while b" s  arrived " not in output:
                chunk = await process.stdout.receive_some()
                assert chunk, output.decode()
                output += chunk
            # The status page it announces is live, and its token works.
            page = re.search(r"status page  (http://127\.0\.0\.1:\d+/)#token=(\S+)",
                             output.decode())
            assert page is not None, output.decode()
            async with httpx.AsyncClient(base_url=page[1], timeout=10) as client:
                assert (await client.get("/")).status_code == 200
                queue = await client.get("/queue",
                                         headers={"Authorization": f"Bearer {page[2]}"})
                assert queue.status_code == 200 and "counts" in queue.json()
                assert (await client.get("/queue")).status_code == 401
            process.send_signal(signal.SIGINT)
            while chunk := await process.stdout.receive_some():
                output += chunk
            code = await process.wait()
        finally:
            if process.returncode is None:
                process.kill()
    out = output.decode()
    assert code == 0, out
    assert "Traceback" not in out
    assert re.search(r"^summary: interrupted after \d+\.\d s of new mail$", out, re.MULTILINE), out
    summary = SUMMARY.search(out)
    assert summary is not None, out
    arrived, imported, searchable, initial = map(int, summary.groups())
    assert arrived >= 1 and searchable >= 1

    ids, jobs, mailboxes = await archived_state(db)
    # A message being imported at the signal may be committed or not.
    assert initial + imported <= len(ids) <= initial + arrived
    # The graceful shutdown leaves no job claimed: done, or pending for the next run.
    assert set(jobs) <= {"succeeded", "pending"} and jobs["succeeded"] >= initial + searchable
    assert mailboxes == 0
