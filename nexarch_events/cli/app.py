"""``nexarch-events``: argv and environment -> settings -> run.

Exit codes: 0 success; 1 an operation failed (e.g. job not found);
2 bad usage or configuration; 3 the database is unreachable;
70 internal error (a bug: the traceback is logged; please report it);
130 interrupted before a clean shutdown could start.
"""

from __future__ import annotations

import argparse
import json
import logging
import os
import re
import signal
import sys
from collections.abc import Sequence
from typing import Any

from ..errors import (
    ConfigurationError,
    DatabaseError,
    DatabaseRejected,
    DatabaseTransient,
    DatabaseUnavailable,
    InvalidJobError,
    JobNotFound,
    MigrationError,
    NexarchError,
)
from ..models import escape_controls
from ..settings import LOG_LEVELS, Settings
from . import account, lifecycle, mail, mailbox, queue, service
from .common import (
    EXIT_BUG,
    EXIT_FAILED,
    EXIT_INTERRUPTED,
    EXIT_OK,
    EXIT_UNAVAILABLE,
    EXIT_USAGE,
    database_url,
    log,
)

__all__ = ["EXIT_BUG", "EXIT_FAILED", "EXIT_INTERRUPTED", "EXIT_OK", "EXIT_UNAVAILABLE",
           "EXIT_USAGE", "build_parser", "main"]


class JsonFormatter(logging.Formatter):
    """One JSON object per line (NEXARCH_LOG_FORMAT=json)."""

    def format(self, record: logging.LogRecord) -> str:
        entry = {"ts": self.formatTime(record, "%Y-%m-%dT%H:%M:%S"), "level": record.levelname,
                 "logger": record.name, "msg": record.getMessage()}
        if record.exc_info:
            entry["exc"] = self.formatException(record.exc_info)
        return json.dumps(entry, ensure_ascii=False)


class KvFormatter(logging.Formatter):
    """``key=value`` lines (the default). The message is one line whatever
    it quotes: a server's or a client's text with a CR or LF in it would
    otherwise start a line of its own that reads like a record (a forged
    one). Control characters are written as escapes; a traceback, appended
    after the message, keeps its lines."""

    def __init__(self) -> None:
        super().__init__("%(asctime)s level=%(levelname)s logger=%(name)s %(message)s")

    def formatMessage(self, record: logging.LogRecord) -> str:
        return escape_controls(super().formatMessage(record), keep="\t")


def configure_logging(level: str, fmt: str = "kv") -> None:
    """Structured lines on stderr: key=value (default) or JSON. Records held
    by hold_logging are written now, those below ``level`` dropped."""
    root = logging.getLogger()
    held = [r for h in root.handlers if isinstance(h, _Held) for r in h.records]
    handler = logging.StreamHandler(sys.stderr)
    handler.setFormatter(JsonFormatter() if fmt == "json" else KvFormatter())
    root.handlers[:] = [handler]
    root.setLevel(getattr(logging, level.upper()))
    for record in held:
        if record.levelno >= root.level:
            handler.handle(record)


class _Held(logging.Handler):
    def __init__(self) -> None:
        super().__init__()
        self.records: list[logging.LogRecord] = []

    def emit(self, record: logging.LogRecord) -> None:
        self.records.append(record)


def hold_logging() -> None:
    """Keep what is logged while the settings that say the level and the
    format (the file's log_level and log_format) are still being read."""
    root = logging.getLogger()
    root.handlers[:] = [_Held()]
    root.setLevel(logging.DEBUG)


def _settings(args: argparse.Namespace) -> Settings:
    from ..config import load_settings

    settings = load_settings(args.config)
    overrides: dict[str, Any] = {}
    for name in ("workers", "batch_size"):
        value = getattr(args, name, None)
        if value is not None:
            overrides[name] = value
    if overrides:
        settings = settings.with_queue(**overrides)
    return settings


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="nexarch-events",
        description="Mail archive indexing queue on Postgres LISTEN/NOTIFY. The database is "
                    "NEXARCH_DATABASE_URL, or an embedded Postgres in NEXARCH_DATA_DIR "
                    "(default .nexarch) when unset.")
    parser.add_argument("--log-level", type=str.lower, choices=LOG_LEVELS,
                        help="overrides NEXARCH_LOG_LEVEL and the file's log_level "
                             "(default info)")
    parser.add_argument("--config", metavar="FILE",
                        help="TOML configuration (default: $NEXARCH_CONFIG); NEXARCH_* "
                             "variables override it")
    sub = parser.add_subparsers(dest="command", required=True)

    for group in (service, queue, mail, lifecycle, mailbox, account):
        group.register(sub)
    return parser


def check_arguments(args: argparse.Namespace) -> None:
    """What can be checked without a database, checked before one is
    reached or an embedded server started: a bad tenant slug (any command's
    ``--tenant``), then the command's own ``check`` (set with set_defaults)."""
    from ..models import validate_tenant_slug

    for name, value in vars(args).items():
        for text in value if isinstance(value, list) else [value]:
            if isinstance(text, str) and _UNDECODABLE.search(text):
                # Python keeps bytes that are not UTF-8 as lone surrogates,
                # which the database refuses deep inside a command (exit 1,
                # a driver's message naming "$4"; an operator audit).
                raise ConfigurationError(f"{_option(name)}: not valid UTF-8 ({text!r})")
    tenant = getattr(args, "tenant", None)
    if isinstance(tenant, str):
        validate_tenant_slug(tenant)
    check = getattr(args, "check", None)
    if check is not None:
        check(args)


_UNDECODABLE = re.compile("[\udc80-\udcff]")


def _option(dest: str) -> str:
    """An argparse destination as the user typed it (a guess for positionals)."""
    return dest.upper() if dest in {"ids", "files", "query", "id", "job_id", "name"} \
        else "--" + dest.replace("_", "-")


def leaf_errors(exc: BaseException) -> list[BaseException]:
    """The exceptions inside (nested) exception groups: trio wraps whatever
    crosses a nursery, and the CLI reports the errors themselves."""
    if isinstance(exc, BaseExceptionGroup):
        return [leaf for inner in exc.exceptions for leaf in leaf_errors(inner)]
    return [exc]


def exit_code(exc: BaseException) -> tuple[int, str] | None:
    """(exit code, message) for an error the CLI reports; None for a bug."""
    if isinstance(exc, (ConfigurationError, InvalidJobError)):
        return EXIT_USAGE, str(exc)
    if isinstance(exc, DatabaseUnavailable):
        return EXIT_UNAVAILABLE, f"database unreachable: {exc}"
    if isinstance(exc, DatabaseError) and not isinstance(exc, (DatabaseTransient,
                                                               DatabaseRejected)):
        # SQL of ours that Postgres cannot run (see aio/pg.py SQLSTATE_KINDS).
        return None
    if isinstance(exc, (JobNotFound, MigrationError, NexarchError)):
        return EXIT_FAILED, str(exc)
    if isinstance(exc, KeyboardInterrupt):
        return EXIT_INTERRUPTED, "interrupted"
    return None


def _terminate_as_interrupt(signum: int, frame: object) -> None:
    """SIGTERM outside the service's own handling (any command, and `run`
    before it is up): the path Ctrl-C takes, so that what the command holds
    is given back (jobs released, an embedded Postgres stopped) and it exits
    130. The default ended the process at once, exit 143, with 400 jobs of
    a `reindex` left 'processing' and an embedded server running (an
    operator audit). Raised as SIGINT, so that trio (inside trio.run)
    delivers it where it is safe."""
    signal.raise_signal(signal.SIGINT)


def main(argv: Sequence[str] | None = None) -> int:
    default_term = signal.getsignal(signal.SIGTERM) is signal.SIG_DFL
    ignored_int = signal.getsignal(signal.SIGINT) is signal.SIG_IGN
    if default_term:
        signal.signal(signal.SIGTERM, _terminate_as_interrupt)
        if ignored_int:
            # Inherited as ignored (a background job of a shell script,
            # `nexarch-events run & wait`): SIGTERM, raised as SIGINT, was
            # dropped, and trio does not deliver a SIGINT it finds ignored
            # (a shutdown audit). The running service answers SIGINT anyway.
            signal.signal(signal.SIGINT, signal.default_int_handler)
    try:
        return _main(argv)
    finally:
        if default_term:
            signal.signal(signal.SIGTERM, signal.SIG_DFL)
            if ignored_int:
                signal.signal(signal.SIGINT, signal.SIG_IGN)


def _main(argv: Sequence[str] | None) -> int:
    parser = build_parser()
    args = parser.parse_args(argv)
    hold_logging()
    try:
        try:
            settings = _settings(args)
        except BaseException:
            configure_logging(args.log_level or "info")
            raise
        configure_logging(args.log_level or settings.log_level, settings.log_format)
        check_arguments(args)
        if not getattr(args, "needs_database", True):
            code0: int = args.fn(args, settings, "")
            return code0
        with database_url(settings) as url:
            code: int = args.fn(args, settings, url)
            return code
    except BaseException as exc:
        leaves = leaf_errors(exc)
        if leaves and all(isinstance(leaf, BrokenPipeError) for leaf in leaves):
            # The reader went away (`... | head -1`): no bug, and nothing to
            # say. stdout is pointed at /dev/null so that the interpreter's
            # last flush does not complain either.
            os.dup2(os.open(os.devnull, os.O_WRONLY), sys.stdout.fileno())
            return EXIT_FAILED
        reported = [exit_code(leaf) for leaf in leaves]
        if not leaves or any(r is None for r in reported):
            if isinstance(exc, (SystemExit, KeyboardInterrupt)):
                raise
            log.critical("internal error, stopping (this is a bug; please report it "
                         "with this traceback)", exc_info=exc)
            return EXIT_BUG
        worst = max(r for r in reported if r is not None)
        for _, message in {r for r in reported if r is not None}:
            print(f"nexarch-events: {message}", file=sys.stderr)
        return worst[0]
