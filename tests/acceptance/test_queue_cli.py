"""``enqueue`` takes payloads above the 128 KiB a single argument may carry:
from a file (``--payload-file``) and from stdin (``--payload -``)."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

from nexarch_events.aio import Database
from nexarch_events.aio import run as aio_run


def enqueue(url: str, *args: str, stdin: str | None = None) -> subprocess.CompletedProcess[str]:
    environ = {k: v for k, v in os.environ.items() if not k.startswith("NEXARCH_")}
    environ["NEXARCH_DATABASE_URL"] = url
    return subprocess.run([sys.executable, "-m", "nexarch_events", "enqueue", "index",
                           "--tenant", "acme", "--message-id", "big", *args],
                          env=environ, input=stdin, capture_output=True, text=True,
                          timeout=120, check=False)


def payload_size(url: str, job_id: int) -> int:
    async def go() -> int:
        async with Database.open(url, max_size=1) as db:
            return int(await db.fetchval(
                "SELECT octet_length(payload::text) FROM mail_index_jobs WHERE id = $1", job_id))

    return aio_run(go)


def test_a_payload_of_900_kib_from_a_file_and_from_stdin(database_url: str,
                                                         tmp_path: Path) -> None:
    text = json.dumps({"body": "x" * 900 * 1024})
    path = tmp_path / "payload.json"
    path.write_text(text, encoding="utf-8")

    from_file = enqueue(database_url, "--payload-file", str(path))
    assert from_file.returncode == 0, from_file.stderr
    from_stdin = enqueue(database_url, "--payload", "-", stdin=text)
    assert from_stdin.returncode == 0, from_stdin.stderr
    for result in (from_file, from_stdin):
        assert payload_size(database_url, int(result.stdout)) == len(text)

    # Bad input still exits 2 (usage), whichever way it came.
    assert enqueue(database_url, "--payload", "-", stdin="{oops").returncode == 2
    assert enqueue(database_url, "--payload-file", str(tmp_path / "missing")).returncode == 2
    assert enqueue(database_url, "--payload-file", str(path), "--payload", "{}").returncode == 2


def test_prune_deletes_finished_jobs_past_their_retention(database_url: str) -> None:
    async def setup() -> None:
        async with Database.open(database_url, max_size=1) as db:
            await db.execute(
                "INSERT INTO mail_index_jobs (job_type, tenant_slug, message_id, status, "
                "attempts, finished_at) SELECT 'index', 'acme', 'm' || n, 'succeeded', 1, "
                "now() - n * interval '1 hour' FROM generate_series(1, 30) AS n")

    aio_run(setup)
    environ = {k: v for k, v in os.environ.items() if not k.startswith("NEXARCH_")}
    environ["NEXARCH_DATABASE_URL"] = database_url
    result = subprocess.run(
        [sys.executable, "-m", "nexarch_events", "prune", "--succeeded-older-than", "37800",
         "--batch", "7"], env=environ, capture_output=True, text=True, timeout=120, check=False)
    assert result.returncode == 0, result.stderr
    # Finished 11 to 30 hours ago: 20 rows, in batches of 7.
    assert json.loads(result.stdout)["deleted"] == 20
