"""Worker processes (``python -m nexarch_events worker``) for crash tests,
and small polling helpers over the job table.

Every process names its connections ``nexarch-events/<role>/<its name>``
(listener, pool, worker), so a test can see them in ``pg_stat_activity``
(``wait_listening``).
Its stdout/stderr go to a log file, printed when the test ends (pytest shows
it for failing tests only); tests never assert on it.
"""

from __future__ import annotations

import inspect
import os
import signal
import subprocess
import sys
from collections.abc import Awaitable, Callable, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from types import TracebackType
from typing import TypeVar
from urllib.parse import parse_qsl, urlencode, urlsplit, urlunsplit

import trio

from nexarch_events.aio import Database, Row
from nexarch_events.errors import DatabaseUnavailable

from .handlers import EFFECTS_ENV

T = TypeVar("T")

REPO_ROOT = Path(__file__).resolve().parents[2]
HANDLERS_SPEC = "tests.support.handlers:HANDLERS"


def with_application_name(url: str, name: str) -> str:
    parts = urlsplit(url)
    query = [(k, v) for k, v in parse_qsl(parts.query) if k != "application_name"]
    query.append(("application_name", name))
    return urlunsplit(parts._replace(query=urlencode(query)))


@dataclass(eq=False)
class WorkerProcess:
    name: str
    process: trio.Process
    log_path: Path
    started_at: float

    @property
    def pid(self) -> int:
        return self.process.pid

    @property
    def returncode(self) -> int | None:
        return self.process.returncode

    def kill(self) -> None:
        self.process.kill()

    def terminate(self) -> None:
        self.process.send_signal(signal.SIGTERM)

    async def wait(self) -> int:
        return await self.process.wait()

    def log_tail(self, chars: int = 6000) -> str:
        try:
            return self.log_path.read_text(errors="replace")[-chars:]
        except OSError:
            return ""


@dataclass(eq=False)
class WorkerProcesses:
    """Starts worker processes against one database; kills leftovers on exit."""

    database_url: str
    effects_path: Path
    log_dir: Path
    #: NEXARCH_QUEUE_* settings for every process, e.g. {"stale_after": 2.0}
    queue_settings: Mapping[str, float | int] = field(default_factory=dict)
    started: list[WorkerProcess] = field(default_factory=list)
    #: further NEXARCH_* variables, e.g. NEXARCH_LISTEN_DATABASE_URL
    extra_env: Mapping[str, str] = field(default_factory=dict)

    def env(self, name: str, queue_settings: Mapping[str, float | int]) -> dict[str, str]:
        env = {k: v for k, v in os.environ.items() if not k.startswith("NEXARCH_")}
        env["NEXARCH_DATABASE_URL"] = with_application_name(self.database_url, name)
        env[EFFECTS_ENV] = str(self.effects_path)
        env["PYTHONPATH"] = os.pathsep.join(
            [str(REPO_ROOT), *filter(None, [os.environ.get("PYTHONPATH")])])
        env["PYTHONUNBUFFERED"] = "1"
        env.update(self.extra_env)
        for key, value in {**self.queue_settings, **queue_settings}.items():
            env[f"NEXARCH_QUEUE_{key.upper()}"] = str(value)
        return env

    async def start(self, name: str, *, workers: int | None = None,
                    batch_size: int | None = None, handlers: str = HANDLERS_SPEC,
                    **queue_settings: float | int) -> WorkerProcess:
        """Start ``nexarch-events worker --name <name>``. Returns at once (the
        process still has to import, migrate and connect: see wait_listening)."""
        argv = [sys.executable, "-m", "nexarch_events", "--log-level", "info", "worker",
                "--handlers", handlers, "--name", name]
        if workers is not None:
            argv += ["--workers", str(workers)]
        if batch_size is not None:
            argv += ["--batch-size", str(batch_size)]
        log_path = self.log_dir / f"worker-{name}.log"
        with open(log_path, "ab") as log:  # noqa: ASYNC230 - a local file, opened once
            process = await trio.lowlevel.open_process(
                argv, env=self.env(name, queue_settings), cwd=str(REPO_ROOT),
                stdin=subprocess.DEVNULL,
                stdout=log, stderr=log)
        worker = WorkerProcess(name, process, log_path, trio.current_time())
        self.started.append(worker)
        return worker

    async def aclose(self) -> None:
        with trio.CancelScope(shield=True):
            for worker in self.started:
                if worker.returncode is None:
                    worker.kill()
            for worker in self.started:
                with trio.move_on_after(10):
                    await worker.wait()
        for worker in self.started:
            print(f"----- worker {worker.name} (pid {worker.pid}, exit {worker.returncode}) -----")
            print(worker.log_tail())

    async def __aenter__(self) -> WorkerProcesses:
        return self

    async def __aexit__(self, exc_type: type[BaseException] | None,
                        exc: BaseException | None, tb: TracebackType | None) -> None:
        await self.aclose()


# -- polling -------------------------------------------------------------------


async def retrying(db: Database, fn: Callable[[Database], Awaitable[T]]) -> T:
    """``fn(db)``, retried while Postgres is unreachable (a restart)."""
    while True:
        try:
            return await fn(db)
        except DatabaseUnavailable:
            await trio.sleep(0.1)


async def wait_until(predicate: Callable[[], bool | Awaitable[bool]], *,
                     interval: float = 0.05) -> None:
    """Poll ``predicate`` (sync or async) until it holds. Bound it with
    ``trio.fail_after``."""
    while True:
        result = predicate()
        if inspect.isawaitable(result):
            result = await result
        if result:
            return
        await trio.sleep(interval)


async def wait_listening(db: Database, *workers: WorkerProcess) -> None:
    """Block until each worker process has its LISTEN connection up (its
    service is running). Raises if one of them exited meanwhile."""
    # Each process names its connections nexarch-events/<role>/<name>.
    names = [f"nexarch-events/listener/{w.name}" for w in workers]

    async def ready() -> bool:
        check_alive(*workers)
        # The listener's last statement is a LISTEN, or later its ping.
        rows = await db.fetch(
            """SELECT DISTINCT application_name FROM pg_stat_activity
                WHERE datname = current_database() AND application_name = ANY($1::text[])
                  AND (query LIKE 'LISTEN %' OR query = 'SELECT 1')""", names)
        return len(rows) == len(names)

    await wait_until(ready, interval=0.1)


async def job_rows(db: Database, ids: Sequence[int] | None = None) -> dict[int, Row]:
    if ids is None:
        rows = await db.fetch("SELECT * FROM mail_index_jobs ORDER BY id")
    else:
        rows = await db.fetch("SELECT * FROM mail_index_jobs WHERE id = ANY($1::bigint[])"
                              " ORDER BY id", list(ids))
    return {row["id"]: row for row in rows}


async def status_counts(db: Database, ids: Sequence[int] | None = None) -> dict[str, int]:
    rows = await db.fetch(
        """SELECT status, count(*) AS n FROM mail_index_jobs
            WHERE $1::bigint[] IS NULL OR id = ANY($1::bigint[]) GROUP BY status""",
        None if ids is None else list(ids))
    return {row["status"]: row["n"] for row in rows}


def check_alive(*workers: WorkerProcess) -> None:
    """Raise (with its log) if one of the worker processes has exited."""
    for worker in workers:
        if worker.returncode is not None:
            raise AssertionError(f"worker {worker.name} (pid {worker.pid}) exited with "
                                 f"{worker.returncode}:\n{worker.log_tail()}")


async def wait_statuses(db: Database, ids: Sequence[int], status: str = "succeeded", *,
                        alive: Sequence[WorkerProcess] = (), interval: float = 0.05) -> None:
    """Block until every job in ``ids`` has ``status``; raise at once if a
    worker process in ``alive`` exits meanwhile."""
    want = len(set(ids))

    async def done() -> bool:
        check_alive(*alive)
        counts = await status_counts(db, ids)
        return counts.get(status, 0) == want

    await wait_until(done, interval=interval)
