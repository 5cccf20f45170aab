"""The command line, run as users run it: a subprocess per command."""

from __future__ import annotations

import json
import os
import re
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from tests.conftest import server_dir


def cli(*args: str, url: str | None, timeout: float = 120,
        env: dict[str, str] | None = None) -> subprocess.CompletedProcess[str]:
    environ = {k: v for k, v in os.environ.items() if not k.startswith("NEXARCH_")}
    if url is not None:
        environ["NEXARCH_DATABASE_URL"] = url
    environ.update(env or {})
    return subprocess.run([sys.executable, "-m", "nexarch_events", *args], env=environ,
                          capture_output=True, text=True, timeout=timeout, check=False)


def test_enqueue_status_stats_requeue(database_url: str) -> None:
    result = cli("enqueue", "index", "--tenant", "acme", "--message-id", "<a@b>",
                 "--payload", '{"archive_id": 1}', url=database_url)
    assert result.returncode == 0, result.stderr
    job_id = int(result.stdout)

    status = cli("status", str(job_id), url=database_url)
    assert status.returncode == 0, status.stderr
    job = json.loads(status.stdout)
    assert (job["id"], job["status"], job["tenant_slug"]) == (job_id, "pending", "acme")

    assert cli("status", str(job_id), "--tenant", "other", url=database_url).returncode == 1

    stats = json.loads(cli("stats", url=database_url).stdout)
    assert stats["counts"] == {"pending": 1, "processing": 0, "succeeded": 0, "failed": 0}

    requeue = cli("requeue", str(job_id), url=database_url)
    assert requeue.returncode == 1 and "no failed job" in requeue.stderr


@pytest.mark.parametrize(("args", "code"), [
    (("enqueue", "index", "--tenant", "Bad Slug", "--message-id", "m"), 2),
    (("enqueue", "index", "--tenant", "acme", "--message-id", "m", "--payload", "[1]"), 2),
    (("enqueue", "index", "--tenant", "acme", "--message-id", "m", "--payload", "{oops"), 2),
    (("status", "999999"), 1),
    (("requeue",), 2),
])
def test_errors_exit_with_documented_codes(database_url: str, args: tuple[str, ...],
                                           code: int) -> None:
    result = cli(*args, url=database_url)
    assert result.returncode == code, (result.stdout, result.stderr)
    assert result.stderr.startswith("nexarch-events: ")
    assert "Traceback" not in result.stderr


def test_unreachable_database_exits_3() -> None:
    result = cli("stats", url="postgresql://postgres@127.0.0.1:1/none")
    assert result.returncode == 3, result.stderr
    assert "database unreachable" in result.stderr


def test_bad_setting_exits_2_and_names_the_key(database_url: str) -> None:
    result = cli("stats", url=database_url, env={"NEXARCH_QUEUE_WORKERS": "many"})
    assert result.returncode == 2
    assert "NEXARCH_QUEUE_WORKERS" in result.stderr


def test_migrate_is_idempotent(empty_database_url: str) -> None:
    from nexarch_events.db import sqlfiles

    versions = [v for v, _, _ in sqlfiles.migrations()]
    first = cli("migrate", url=empty_database_url)
    assert first.returncode == 0 and f"applied migrations: {versions}" in first.stdout
    second = cli("migrate", url=empty_database_url)
    assert second.returncode == 0 and "up to date" in second.stdout


@pytest.mark.slow
def test_demo_on_the_embedded_postgres(tmp_path: Path) -> None:
    """The README's first command, minus the install: no database URL, so the
    CLI starts (and afterwards stops) an embedded Postgres in the data dir."""
    data = server_dir()
    try:
        result = cli("demo", "--duration", "3", "--rate", "5", url=None,
                     env={"NEXARCH_DATA_DIR": str(data)}, timeout=180)
        assert result.returncode == 0, result.stdout + result.stderr
        # Everything it delivered was found (tests/acceptance/test_demo.py has the details).
        assert re.search(r"^  messages +(\d+) arrived, \1 imported, \1 searchable ",
                         result.stdout, re.MULTILINE), result.stdout
        # The embedded server was stopped again: nothing listens on its port.
        port = int((data / "postgres.port").read_text())
        probe = cli("stats", url=f"postgresql://postgres@127.0.0.1:{port}/postgres")
        assert probe.returncode == 3
    finally:
        shutil.rmtree(data, ignore_errors=True)
