"""Commands that run the service or manage its set-up: migrate, worker, run,
config check, demo."""

from __future__ import annotations

import argparse
import json
import logging
from dataclasses import replace

from ..aio import Database
from ..aio import run as aio_run
from ..settings import Settings
from .common import EXIT_OK, Subparsers, bounded_int, command_name


def cmd_migrate(args: argparse.Namespace, settings: Settings, url: str) -> int:
    from ..db.migrations import migrate

    async def go() -> list[int]:
        async with Database.open(url, max_size=1, **settings.pool_options()) as db:
            return await migrate(db)

    applied = aio_run(go)
    print(f"applied migrations: {applied}" if applied else "schema is up to date")
    return EXIT_OK


def cmd_worker(args: argparse.Namespace, settings: Settings, url: str) -> int:
    from ..service import serve

    importer = args.command == "run"
    if args.handlers:
        from ..handlers import load_handlers

        handlers = load_handlers(args.handlers)
        aio_run(lambda: serve(settings, handlers, dsn=url, name=args.name, importer=importer))
        return EXIT_OK

    async def run_indexer() -> None:
        # The default: keep the configured search index in step with the archive.
        from ..index.factory import open_index
        from ..mail.indexer import Indexer
        from ..queue.worker import default_worker_name

        name = args.name or default_worker_name()
        async with Database.open(url, max_size=2,
                                 application_name=f"nexarch-events/indexer/{name}",
                                 **settings.pool_options()) as db, \
                open_index(settings, db) as backend:
            # `run` serves the HTTP API too (it searches through this backend).
            await serve(settings, Indexer(db, backend).handlers(), dsn=url, name=name,
                        importer=importer, backend=backend if importer else None)

    aio_run(run_indexer)
    return EXIT_OK


def cmd_config_check(args: argparse.Namespace, settings: Settings, url: str) -> int:
    from ..config import effective

    print(json.dumps(effective(settings), indent=2, ensure_ascii=False))
    return EXIT_OK


def cmd_demo(args: argparse.Namespace, settings: Settings, url: str) -> int:
    from ..demo import run_demo

    api = settings.api
    if args.port is not None:
        settings = replace(settings, api=replace(api, port=args.port))
    if not args.verbose:
        # The demo's own lines tell the story; the service's info lines
        # (stderr) would bury them. Warnings still show.
        logging.getLogger("nexarch_events").setLevel(
            max(logging.WARNING, logging.getLogger().getEffectiveLevel()))
    # A demo should just run: when another program (or another demo) has the
    # configured port at the moment the status page binds, it takes any free
    # one and says so; the status page line shows which.
    return run_demo(url, settings, duration=args.duration, rate=args.rate,
                    command=command_name(), any_port_if_taken=args.port is None)


def register(sub: Subparsers) -> None:
    sub.add_parser("migrate", help="apply pending schema migrations").set_defaults(fn=cmd_migrate)

    config = sub.add_parser("config", help="configuration tools")
    csub = config.add_subparsers(dest="config_command", required=True)
    csub.add_parser("check", help="validate and print the effective configuration "
                                  "(secrets masked)").set_defaults(fn=cmd_config_check,
                                                                   needs_database=False)

    worker = sub.add_parser("worker", help="run the workers, listener and sweeper until SIGTERM")
    worker.add_argument("--handlers",
                        help="module:NAME of a mapping job type -> batch handler "
                             "(default: index the archive into the configured backend)")
    worker.add_argument("--workers", type=int, help="worker tasks (NEXARCH_QUEUE_WORKERS)")
    worker.add_argument("--batch-size", type=int, help="jobs per claim (NEXARCH_QUEUE_BATCH_SIZE)")
    worker.add_argument("--name", help="worker name recorded in locked_by (default host:pid)")
    worker.set_defaults(fn=cmd_worker)

    run = sub.add_parser("run", help="the whole service: workers, listener, sweeper and the "
                                     "IMAP importer, until SIGTERM")
    run.add_argument("--handlers", help=argparse.SUPPRESS)
    run.add_argument("--workers", type=int, help="worker tasks (NEXARCH_QUEUE_WORKERS)")
    run.add_argument("--batch-size", type=int, help="jobs per claim (NEXARCH_QUEUE_BATCH_SIZE)")
    run.add_argument("--name", help="worker name recorded in locked_by (default host:pid)")
    run.set_defaults(fn=cmd_worker)

    demo = sub.add_parser(
        "demo", help="the whole service on a sample IMAP mailbox served in this process; "
                     "shows each new message's arrival -> searchable latency")
    demo.add_argument("--duration", type=float, default=30.0,
                      help="seconds of new mail (default 30); Ctrl-C ends it earlier")
    demo.add_argument("--rate", type=float, default=2.0,
                      help="new messages per second (default 2)")
    demo.add_argument("--port", type=bounded_int(0, 65535, "a TCP port (0: any free one)"),
                      metavar="PORT",
                      help="the status page's port (default: NEXARCH_API_PORT, 8080, or any "
                           "free port when that is taken; 0: any free port)")
    demo.add_argument("--verbose", action="store_true",
                      help="also show the service's info log lines (stderr)")
    demo.set_defaults(fn=cmd_demo, workers=None, batch_size=None)
