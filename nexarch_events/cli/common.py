"""What the command modules share: exit codes, running a coroutine
against the database, and small formatting helpers."""

from __future__ import annotations

import argparse
import contextlib
import json
import logging
import shlex
import shutil
import sys
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any, TypeAlias

from ..aio import Database
from ..aio import run as aio_run
from ..db.migrations import ensure_current
from ..errors import ConfigurationError
from ..settings import Settings

EXIT_OK, EXIT_FAILED, EXIT_USAGE, EXIT_UNAVAILABLE, EXIT_INTERRUPTED = 0, 1, 2, 3, 130
#: An exception nobody expected: a bug. The traceback is logged.
EXIT_BUG = 70

#: What ``add_subparsers`` returns; every command module's ``register`` takes it.
Subparsers: TypeAlias = "argparse._SubParsersAction[argparse.ArgumentParser]"

log = logging.getLogger("nexarch_events")


@contextmanager
def database_url(settings: Settings) -> Iterator[str]:
    """The configured URL, or the embedded server in ``data_dir`` (started
    if it is not running, and stopped again afterwards if we started it)."""
    if settings.database_url:
        yield settings.database_url
        return
    from ..db.embedded import EmbeddedPostgres

    data = Path(settings.data_dir) / "postgres"
    port_file = Path(settings.data_dir) / "postgres.port"
    port = int(port_file.read_text()) if port_file.exists() else None
    server = EmbeddedPostgres(data, port=port)
    started_here = not server.is_running()
    if started_here:
        log.info("starting embedded Postgres data_dir=%s port=%d", data, server.port)
        try:
            server.start()
        except BaseException:
            # E.g. Ctrl-C mid-start: do not leave a server behind.
            server.stop("immediate")
            raise
        port_file.write_text(str(server.port))
    try:
        yield server.url()
    finally:
        if started_here:
            server.stop()


def command_name() -> str:
    """How to run this CLI again, as the user ran it: ``nexarch-events`` when
    that is on PATH, else the path they typed (``.venv/bin/nexarch-events``
    after the README's install), or ``python -m nexarch_events``."""
    argv0 = sys.argv[0] if sys.argv and sys.argv[0] else ""
    name = Path(argv0).name
    if name == "nexarch-events":
        on_path = shutil.which("nexarch-events")
        if on_path and Path(on_path).resolve() == Path(argv0).resolve():
            return "nexarch-events"
        return shlex.quote(argv0)
    python = Path(sys.executable)
    with contextlib.suppress(ValueError):
        python = python.relative_to(Path.cwd())  # .venv/bin/python reads better
    return f"{shlex.quote(str(python))} -m nexarch_events"


def with_index(url: str, settings: Settings, fn: Callable[[Any, Any], Any]) -> Any:
    """Run ``fn(db, backend)`` with a pool and the configured index backend."""
    from ..index.factory import open_index

    async def go() -> Any:
        async with Database.open(url, max_size=4, **settings.pool_options()) as db:
            await ensure_current(db)
            async with open_index(settings, db) as backend:
                return await fn(db, backend)

    return aio_run(go)


def queue_call(url: str, settings: Settings, fn: Callable[[Any], Any]) -> Any:
    from ..queue.jobs import Queue

    async def go() -> Any:
        async with Database.open(url, max_size=1, **settings.pool_options()) as db:
            await ensure_current(db)
            return await fn(Queue(db, settings.queue))

    return aio_run(go)


def registry_call(url: str, settings: Settings, fn: Callable[[Any], Any], *,
                  connections: int = 1) -> Any:
    from ..importer.mailboxes import MailboxRegistry

    async def go() -> Any:
        async with Database.open(url, max_size=connections, **settings.pool_options()) as db:
            await ensure_current(db)
            return await fn(MailboxRegistry(db))

    return aio_run(go)


def bounded_int(low: int, high: int, what: str = "a whole number") -> Callable[[str], int]:
    """An argparse type: ``what`` from ``low`` to ``high``; anything else is
    a usage error naming the argument (exit 2), never a database's "out of
    int64 range" later (an operator audit)."""
    def parse(text: str) -> int:
        try:
            value = int(text) if text.strip().lstrip("+-").isdigit() else None
        except ValueError:
            value = None
        if value is None or not low <= value <= high:
            raise argparse.ArgumentTypeError(f"{what} from {low} to {high}, got {text[:40]!r}")
        return value
    parse.__name__ = what  # argparse names the type in some messages
    return parse


def row_id(what: str) -> Callable[[str], int]:
    """An id of a database row (a bigint): 1 to 2^63-1."""
    return bounded_int(1, 2**63 - 1, what)


def jsonable(value: Any) -> Any:
    return json.loads(json.dumps(value, default=str))


def parse_date(value: str | None, option: str) -> Any:
    from datetime import UTC, datetime

    if value is None:
        return None
    try:
        parsed = datetime.fromisoformat(value)
    except ValueError:
        raise ConfigurationError(f"{option} {value!r} is not a date (YYYY-MM-DD[THH:MM])") from None
    return parsed if parsed.tzinfo else parsed.replace(tzinfo=UTC)


def progress_bar(label: str) -> Callable[[int, int, int], None]:
    last = [0.0]

    def show(done: int, failed: int, total: int) -> None:
        now = time.monotonic()
        if done < total and now - last[0] < 0.1:
            return
        last[0] = now
        width = 30
        filled = width * done // max(total, 1)
        bar = "#" * filled + "." * (width - filled)
        tail = f" ({failed} failed)" if failed else ""
        print(f"\r{label} [{bar}] {done}/{total}{tail}", end="" if done < total else "\n",
              file=sys.stderr, flush=True)

    return show
