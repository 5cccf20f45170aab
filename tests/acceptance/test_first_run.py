"""A new user's first commands: mistakes in the environment or the
arguments end with exit 2 and one line saying what to change, never a
traceback, a warning from a dependency, or a server started for nothing."""

from __future__ import annotations

import os
import re
import shlex
import signal
import socket
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest
import trio

from nexarch_events.aio import Database
from tests.acceptance.test_cli import cli


def bare_env(cwd: Path) -> dict[str, str]:
    """No NEXARCH_* setting and no XDG_RUNTIME_DIR (cron, containers, sudo)."""
    env = {k: v for k, v in os.environ.items()
           if not k.startswith("NEXARCH_") and k != "XDG_RUNTIME_DIR"}
    env["NEXARCH_DATA_DIR"] = str(cwd / ".nexarch")
    return env


def run_bare(cwd: Path, *args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-m", "nexarch_events", *args], cwd=cwd,
                          env=bare_env(cwd), capture_output=True, text=True, timeout=120,
                          check=False)


@pytest.fixture
def busy_port() -> Iterator[int]:
    """A port something else listens on."""
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        sock.listen()
        yield sock.getsockname()[1]


@pytest.mark.parametrize("args", [
    ("search", "--tenant", "Bad Tenant", "invoice"),
    ("search", "--tenant", "acme", "--since", "last tuesday", "invoice"),
    ("search", "--tenant", "acme", "--received-until", "soon", "invoice"),
    ("search", "--tenant", "acme", "--sort", "oldest", "invoice"),
    ("search", "--tenant", "acme", "!! )("),
    ("archive", "--tenant", "acme", "no-such-file.eml"),
    ("reindex", "--tenant", "acme-"),
    ("status", "1", "--tenant", "ACME"),
    # Found by an operator audit (exit 70 after the erasure, exit 1 with a
    # driver's message, a payload silently dropped):
    ("erase", "--tenant", "acme", "2", "--wait", "nan"),
    ("search", "--tenant", "acme", "--sender", "a\udcffb", "x"),
    ("hold", "add", "--tenant", "acme", "--query", "x", "--reason", "r\udcff"),
    ("enqueue", "delete", "--tenant", "acme", "--message-id", "1", "--payload", "{}"),
])
def test_bad_arguments_are_refused_before_the_embedded_postgres_starts(
        tmp_path: Path, args: tuple[str, ...]) -> None:
    result = run_bare(tmp_path, *args)
    assert result.returncode == 2, result.stderr
    assert result.stderr.startswith("nexarch-events: "), result.stderr
    assert "Traceback" not in result.stderr
    assert not (tmp_path / ".nexarch").exists(), "a server was started for nothing"


@pytest.mark.parametrize("args", [
    ("status", "99999999999999999999"),
    ("requeue", "0"),
    ("hold", "remove", "-1"),
    ("audit", "list", "--before", "-1"),
    ("mailbox", "failures", "acme", "inbox", "--retry", "4294967296"),
    ("prune", "--batch", "0"),
    ("demo", "--port", "99999"),  # blamed api.port (NEXARCH_API_PORT) before
])
def test_numbers_out_of_range_are_usage_errors_that_name_the_argument(
        tmp_path: Path, args: tuple[str, ...]) -> None:
    """Before: a driver's "out of int64 range" with exit 1, the API's 400
    answered by the CLI as a silent accept, and `prune --batch 0` looping
    for ever (an operator audit)."""
    result = run_bare(tmp_path, *args)
    assert result.returncode == 2, result.stderr
    assert "error: argument" in result.stderr and "from " in result.stderr, result.stderr
    assert not (tmp_path / ".nexarch").exists(), "a server was started for nothing"


def test_archive_checks_every_file_before_it_archives_any(
        database_url: str, tmp_path: Path) -> None:
    """Two good files, an empty one, a good one: the first two were
    archived, then "message is empty (0 bytes)" without the file's name,
    and the last was skipped (an operator audit)."""
    good = []
    for n in range(3):
        path = tmp_path / f"m{n}.eml"
        path.write_bytes(f"From: a@example.org\r\nSubject: m{n}\r\n\r\nbody {n}\r\n".encode())
        good.append(str(path))
    empty = tmp_path / "empty.eml"
    empty.write_bytes(b"")
    result = cli("archive", "--tenant", "acme", good[0], good[1], str(empty), good[2],
                 url=database_url)
    assert result.returncode == 2, result.stderr
    assert str(empty) in result.stderr and "nothing archived" in result.stderr
    # Nothing was stored part-way: the good ones are new now.
    again = cli("archive", "--tenant", "acme", *good, url=database_url)
    assert again.returncode == 0, again.stderr
    assert [line.split("\t")[1] for line in again.stdout.splitlines()] == ["archived"] * 3


def test_the_embedded_server_binaries_load_without_a_runtime_dir_warning(
        tmp_path: Path) -> None:
    # -W error: the warning, were it emitted, would fail the import.
    result = subprocess.run(
        [sys.executable, "-W", "error", "-c",
         "from nexarch_events.db.embedded import _bin_dir; print(_bin_dir())"],
        env=bare_env(tmp_path), capture_output=True, text=True, timeout=60, check=False)
    assert result.returncode == 0, result.stderr
    assert "XDG_RUNTIME_DIR" not in result.stderr


def test_a_malformed_database_url_exits_2_without_its_password(tmp_path: Path) -> None:
    result = cli("stats", url="postgresql://u:pw-s3cret@host:notaport/x")
    assert result.returncode == 2, result.stderr
    assert "NEXARCH_DATABASE_URL" in result.stderr and "port" in result.stderr
    assert "Traceback" not in result.stderr and "pw-s3cret" not in result.stderr


def test_run_on_a_busy_port_exits_2_with_one_line(database_url: str, busy_port: int) -> None:
    result = cli("--log-level", "warning", "run", url=database_url,
                 env={"NEXARCH_API_PORT": str(busy_port)}, timeout=120)
    assert result.returncode == 2, result.stderr
    assert "Traceback" not in result.stderr
    [line] = [x for x in result.stderr.splitlines() if x.startswith("nexarch-events: ")]
    assert f"127.0.0.1:{busy_port}" in line and "NEXARCH_API_PORT" in line


def test_the_demo_takes_a_free_port_and_its_closing_hint_works(
        database_url: str, busy_port: int) -> None:
    result = cli("demo", "--duration", "2", "--rate", "4", url=database_url,
                 env={"NEXARCH_API_PORT": str(busy_port)}, timeout=180)
    assert result.returncode == 0, result.stdout + result.stderr
    assert f"port {busy_port} on 127.0.0.1 is taken" in result.stderr
    [page] = re.findall(r"http://127\.0\.0\.1:(\d+)/", result.stdout)
    assert int(page) not in (0, busy_port)
    # The hint names a command that works as printed (here: python -m).
    hint = re.search(r"the mail stays archived: (.+)$", result.stdout, re.MULTILINE)
    assert hint is not None, result.stdout
    command = shlex.split(hint[1])
    assert "search" in command
    env = {k: v for k, v in os.environ.items() if not k.startswith("NEXARCH_")}
    found = subprocess.run(command, env={**env, "NEXARCH_DATABASE_URL": database_url},
                           capture_output=True, text=True, timeout=120, check=False)
    assert found.returncode == 0, found.stderr
    assert not found.stdout.startswith("0 match"), found.stdout


def test_demo_port_option(database_url: str) -> None:
    from nexarch_events.cli.app import build_parser

    assert build_parser().parse_args(["demo", "--port", "0"]).port == 0
    assert build_parser().parse_args(["demo"]).port is None


@pytest.mark.parametrize("first", [
    ("mailbox", "add", "acme", "alice-inbox", "--host", "imap.example.org", "--user", "alice",
     "--password-env", "ALICE_PASSWORD", "--interval", "300"),
    ("stats",),
    ("hold", "list"),
    ("account", "list"),
])
def test_the_first_command_on_a_new_database_migrates_it(
        empty_database_url: str, first: tuple[str, ...]) -> None:
    """README's "Importing mail" starts with `mailbox add`, then `run`: on a
    database never migrated, it (and every command but run, worker and
    migrate) ended with a missing table, reported as a bug, exit 70 (an
    operator audit)."""
    result = cli(*first, url=empty_database_url, env={"ALICE_PASSWORD": "x"})
    assert result.returncode == 0, result.stderr[-2000:]
    again = cli("stats", url=empty_database_url)
    assert again.returncode == 0, again.stderr[-2000:]


@pytest.mark.parametrize("sigint_ignored", [False, True])
async def test_sigterm_before_the_service_is_up_exits_like_ctrl_c(
        db: Database, database_url: str, sigint_ignored: bool) -> None:
    """`run` waiting for another process's migration, then SIGTERM: it died
    at once with exit 143, and so did every other command (a `reindex`
    left its jobs 'processing'; an operator audit). Now SIGTERM takes
    Ctrl-C's path: what the command holds is given back, exit 130. Also
    when SIGINT was ignored from the start (a background job of a shell
    script, `nexarch-events run & wait`): SIGTERM, raised as SIGINT, was
    dropped and the service started anyway (a shutdown audit)."""
    from nexarch_events.db.migrations import _LOCK_KEY

    environ = {k: v for k, v in os.environ.items() if not k.startswith("NEXARCH_")}
    environ.update(NEXARCH_DATABASE_URL=database_url, NEXARCH_API_PORT="0")
    # An older schema, so that `run` migrates (a current one it only reads).
    await db.execute("DELETE FROM nexarch_schema_migrations WHERE version = "
                     "(SELECT max(version) FROM nexarch_schema_migrations)")
    command = [sys.executable, "-m", "nexarch_events", "run"]
    if sigint_ignored:
        command = ["bash", "-c", 'trap "" INT; exec "$@"', "bash", *command]
    async with db.acquire() as conn, conn.transaction():
        await conn.execute("SELECT pg_advisory_xact_lock($1)", _LOCK_KEY)  # a migration runs
        proc = await trio.lowlevel.open_process(
            command, env=environ, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE)
        try:
            with trio.fail_after(60):
                while not await db.fetchval(
                        "SELECT count(*) FROM pg_locks WHERE locktype = 'advisory' "
                        "AND NOT granted"):
                    await trio.sleep(0.1)  # it waits for the lock now
            proc.send_signal(signal.SIGTERM)
            with trio.fail_after(30):
                code = await proc.wait()
        finally:
            # A process that ignored SIGTERM (the fault) is not left running.
            if proc.returncode is None:
                proc.kill()
    assert code == 130, code


def test_output_into_a_closed_pipe_is_no_bug(tmp_path: Path) -> None:
    """`nexarch-events ... | head -1`: the reader goes away, the next write
    fails with EPIPE. That was reported as a bug, exit 70, with a traceback
    (an operator audit)."""
    proc = subprocess.Popen([sys.executable, "-m", "nexarch_events", "config", "check"],
                            cwd=tmp_path, env=bare_env(tmp_path), stdout=subprocess.PIPE,
                            stderr=subprocess.PIPE)
    assert proc.stdout is not None and proc.stderr is not None
    proc.stdout.close()  # before it writes anything: Python takes far longer to start
    err = proc.stderr.read().decode()
    assert proc.wait(timeout=60) == 1, err
    assert "Traceback" not in err and "internal error" not in err and "Exception" not in err


@pytest.mark.parametrize("command", [("search", "--tenant", "acme", "invoice"), ("worker",)])
def test_a_search_language_the_server_lacks_is_a_configuration_error(
        database_url: str, command: tuple[str, ...]) -> None:
    """The settings check only its spelling: `klingon` passed, then every
    search ended with exit 70 and every index job failed for good (an
    operator audit). Now the first use of the index says which one."""
    result = cli(*command, url=database_url,
                 env={"NEXARCH_SEARCH_LANGUAGES": "german,klingon"}, timeout=60)
    assert result.returncode == 2, result.stderr[-2000:]
    assert "NEXARCH_SEARCH_LANGUAGES" in result.stderr and "'klingon'" in result.stderr
