"""``nexarch-events``: argv and environment -> settings -> run.

Exit codes: 0 success; 1 an operation failed (e.g. job not found);
2 bad usage or configuration; 3 the database is unreachable;
70 internal error (a bug: the traceback is logged; please report it);
130 interrupted before a clean shutdown could start.
"""

from __future__ import annotations

import argparse
import html
import json
import logging
import os
import sys
import time
from collections.abc import Callable, Iterator, Sequence
from contextlib import contextmanager
from dataclasses import asdict
from pathlib import Path
from typing import Any

from .aio import Database
from .aio import run as aio_run
from .errors import (
    ConfigurationError,
    DatabaseUnavailable,
    InvalidJobError,
    JobNotFound,
    MigrationError,
    NexarchError,
)
from .settings import Settings

EXIT_OK, EXIT_FAILED, EXIT_USAGE, EXIT_UNAVAILABLE, EXIT_INTERRUPTED = 0, 1, 2, 3, 130
#: An exception nobody expected: a bug. The traceback is logged.
EXIT_BUG = 70

log = logging.getLogger("nexarch_events")


class JsonFormatter(logging.Formatter):
    """One JSON object per line (NEXARCH_LOG_FORMAT=json)."""

    def format(self, record: logging.LogRecord) -> str:
        entry = {"ts": self.formatTime(record, "%Y-%m-%dT%H:%M:%S"), "level": record.levelname,
                 "logger": record.name, "msg": record.getMessage()}
        if record.exc_info:
            entry["exc"] = self.formatException(record.exc_info)
        return json.dumps(entry, ensure_ascii=False)


def configure_logging(level: str, fmt: str = "kv") -> None:
    """Structured lines on stderr: key=value (default) or JSON."""
    handler = logging.StreamHandler(sys.stderr)
    handler.setFormatter(JsonFormatter() if fmt == "json" else logging.Formatter(
        "%(asctime)s level=%(levelname)s logger=%(name)s %(message)s"))
    root = logging.getLogger()
    root.handlers[:] = [handler]
    root.setLevel(getattr(logging, level.upper(), logging.INFO))


@contextmanager
def database_url(settings: Settings) -> Iterator[str]:
    """The configured URL, or the embedded server in ``data_dir`` (started
    if it is not running, and stopped again afterwards if we started it)."""
    if settings.database_url:
        yield settings.database_url
        return
    from .embedded import EmbeddedPostgres

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


def _settings(args: argparse.Namespace) -> Settings:
    from .config import load_settings

    settings = load_settings(args.config)
    overrides: dict[str, Any] = {}
    for name in ("workers", "batch_size"):
        value = getattr(args, name, None)
        if value is not None:
            overrides[name] = value
    if overrides:
        settings = settings.with_queue(**overrides)
    return settings


def cmd_migrate(args: argparse.Namespace, settings: Settings, url: str) -> int:
    from .migrations import migrate

    async def go() -> list[int]:
        async with Database.open(url, max_size=1) as db:
            return await migrate(db)

    applied = aio_run(go)
    print(f"applied migrations: {applied}" if applied else "schema is up to date")
    return EXIT_OK


def cmd_worker(args: argparse.Namespace, settings: Settings, url: str) -> int:
    from .service import serve

    importer = args.command == "run"
    if args.handlers:
        from .handlers import load_handlers

        handlers = load_handlers(args.handlers)
        aio_run(lambda: serve(settings, handlers, dsn=url, name=args.name, importer=importer))
        return EXIT_OK

    async def run_indexer() -> None:
        # The default: keep the configured search index in step with the archive.
        from .index.factory import open_index
        from .indexer import Indexer

        async with Database.open(url, max_size=2) as db, open_index(settings, db) as backend:
            # `run` serves the HTTP API too (it searches through this backend).
            await serve(settings, Indexer(db, backend).handlers(), dsn=url, name=args.name,
                        importer=importer, backend=backend if importer else None)

    aio_run(run_indexer)
    return EXIT_OK


def _with_index(url: str, settings: Settings, fn: Callable[[Any, Any], Any]) -> Any:
    """Run ``fn(db, backend)`` with a pool and the configured index backend."""
    from .index.factory import open_index

    async def go() -> Any:
        async with Database.open(url, max_size=4) as db, open_index(settings, db) as backend:
            return await fn(db, backend)

    return aio_run(go)


def cmd_archive(args: argparse.Namespace, settings: Settings, url: str) -> int:
    from .archive import Archive

    files = [Path(f) for f in args.files]
    for path in files:
        if not path.is_file():
            raise ConfigurationError(f"archive: {path} is not a file")

    async def go(db: Any, backend: Any) -> None:
        archive = Archive(db)
        for path in files:
            stored = await archive.store(args.tenant, path.read_bytes())
            state = "archived" if stored.created else "already archived"
            print(f"{path}\t{state}\tarchive_id={stored.archive_id}"
                  + (f"\tindex_job={stored.job_id}" if stored.job_id else ""))

    _with_index(url, settings, go)
    return EXIT_OK


def _parse_date(value: str | None, option: str) -> Any:
    from datetime import UTC, datetime

    if value is None:
        return None
    try:
        parsed = datetime.fromisoformat(value)
    except ValueError:
        raise ConfigurationError(f"{option} {value!r} is not a date (YYYY-MM-DD[THH:MM])") from None
    return parsed if parsed.tzinfo else parsed.replace(tzinfo=UTC)


def cmd_search(args: argparse.Namespace, settings: Settings, url: str) -> int:
    from .index.base import InvalidQuery, SearchQuery

    try:
        query = SearchQuery(args.tenant, args.query, sender=args.sender,
                            date_from=_parse_date(args.since, "--since"),
                            date_to=_parse_date(args.until, "--until"),
                            mailbox=args.mailbox, limit=args.limit, offset=args.offset)
    except InvalidQuery as exc:
        raise ConfigurationError(f"search: {exc}") from exc

    async def go(db: Any, backend: Any) -> Any:
        return await backend.search(query)

    result = _with_index(url, settings, go)
    if args.json:
        print(json.dumps({"total": result.total, "hits": [_jsonable(asdict(h))
                                                          for h in result.hits]}, indent=2))
        return EXIT_OK
    shown = f"{args.offset + 1}-{args.offset + len(result.hits)}" if result.hits else "none"
    print(f"{result.total} match(es), showing {shown}")
    for hit in result.hits:
        when = hit.sent_at.strftime("%Y-%m-%d") if hit.sent_at else "----------"
        print(f"{hit.archive_id:>10}  {when}  {hit.sender[:40]:<40}  {hit.subject[:80]}")
        snippet = hit.snippet.replace("<mark>", "[").replace("</mark>", "]")
        print(f"{'':>12}{html.unescape(snippet)[:160]}")
    return EXIT_OK


def _progress_bar(label: str) -> Callable[[int, int, int], None]:
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


def cmd_reindex(args: argparse.Namespace, settings: Settings, url: str) -> int:
    from .reindex import reindex

    async def go(db: Any, backend: Any) -> Any:
        return await reindex(db, settings, backend, args.tenant,
                             progress=_progress_bar(f"reindex {args.tenant}"))

    result = _with_index(url, settings, go)
    print(f"reindexed tenant {result.tenant_slug}: {result.indexed} message(s) indexed, "
          f"{result.removed} stale document(s) removed, {result.failed} failed")
    return EXIT_OK if result.failed == 0 else EXIT_FAILED


def cmd_verify_index(args: argparse.Namespace, settings: Settings, url: str) -> int:
    from .archive import Archive
    from .reindex import verify

    async def go(db: Any, backend: Any) -> Any:
        tenants = [args.tenant] if args.tenant else await Archive(db).tenants()
        return [await verify(db, backend, tenant) for tenant in tenants]

    reports = _with_index(url, settings, go)
    consistent = True
    for report in reports:
        consistent &= report.consistent
        print(f"{report.tenant_slug}: {report.archived} archived, {report.indexed} indexed, "
              f"{len(report.missing)} missing, {len(report.extra)} extra"
              + ("" if report.consistent else "  <- run: nexarch-events reindex --tenant "
                 + report.tenant_slug))
        for label, ids in (("missing", report.missing), ("extra", report.extra)):
            if ids:
                print(f"  {label}: {' '.join(map(str, ids[:20]))}"
                      + (f" ... (+{len(ids) - 20})" if len(ids) > 20 else ""))
    return EXIT_OK if consistent else EXIT_FAILED


def _queue_call(url: str, settings: Settings, fn: Callable[[Any], Any]) -> Any:
    from .queue import Queue

    async def go() -> Any:
        async with Database.open(url, max_size=1) as db:
            return await fn(Queue(db, settings.queue))

    return aio_run(go)


def cmd_enqueue(args: argparse.Namespace, settings: Settings, url: str) -> int:
    try:
        payload = json.loads(args.payload)
    except ValueError as exc:
        raise InvalidJobError(f"--payload is not valid JSON: {exc}") from exc

    async def go(queue: Any) -> int:
        if args.job_type == "index":
            return int(await queue.enqueue_index(args.tenant, args.message_id, payload))
        return int(await queue.enqueue_delete(args.tenant, args.message_id))

    print(_queue_call(url, settings, go))
    return EXIT_OK


def _jsonable(value: Any) -> Any:
    return json.loads(json.dumps(value, default=str))


def cmd_status(args: argparse.Namespace, settings: Settings, url: str) -> int:
    async def go(queue: Any) -> Any:
        return await queue.status(args.job_id, tenant_slug=args.tenant)

    job = _queue_call(url, settings, go)
    print(json.dumps(_jsonable(asdict(job)), indent=2))
    return EXIT_OK


def cmd_stats(args: argparse.Namespace, settings: Settings, url: str) -> int:
    async def go(queue: Any) -> Any:
        return await queue.stats()

    stats = _queue_call(url, settings, go)
    print(json.dumps({"counts": {str(k): v for k, v in stats.counts.items()},
                      "oldest_ready_age_s": stats.oldest_ready_age_s}, indent=2))
    return EXIT_OK


def cmd_requeue(args: argparse.Namespace, settings: Settings, url: str) -> int:
    if args.job_id is None and not args.all and args.tenant is None and args.job_type is None:
        raise ConfigurationError("requeue: give a job id, or --tenant/--job-type, or --all")

    async def go(queue: Any) -> Any:
        return await queue.requeue_failed(job_id=args.job_id, tenant_slug=args.tenant,
                                          job_type=args.job_type)

    result = _queue_call(url, settings, go)
    print(json.dumps({"requeued": list(result.requeued),
                      "superseded": list(result.superseded)}))
    if args.job_id is not None and not result.requeued and not result.superseded:
        raise JobNotFound(f"no failed job with id {args.job_id}")
    return EXIT_OK


def _registry_call(url: str, fn: Callable[[Any], Any]) -> Any:
    from .importer.mailboxes import MailboxRegistry

    async def go() -> Any:
        async with Database.open(url, max_size=1) as db:
            return await fn(MailboxRegistry(db))

    return aio_run(go)


def cmd_mailbox_add(args: argparse.Namespace, settings: Settings, url: str) -> int:
    from .importer import secrets
    from .importer.mailboxes import MailboxConfig

    given = [x for x in (args.password_env, args.password_file, args.password_stdin) if x]
    if len(given) != 1:
        raise ConfigurationError("mailbox add: give exactly one of --password-env NAME, "
                                 "--password-file PATH or --password-stdin")
    if args.password_env:
        ref = secrets.reference_env(args.password_env)
    elif args.password_file:
        ref = secrets.reference_file(os.path.abspath(args.password_file))
    else:
        ref = secrets.seal(sys.stdin.readline().rstrip("\r\n"), settings.secret_key)
    port = args.port or (993 if args.tls == "implicit" else 143)
    config = MailboxConfig(tenant_slug=args.tenant, name=args.name, host=args.host, port=port,
                           tls_mode=args.tls, username=args.user, password_ref=ref,
                           folder=args.folder, ca_file=args.ca_file,
                           use_idle=not args.no_idle)
    mailbox_id = _registry_call(url, lambda r: r.add(config, interval_seconds=args.interval))
    print(f"registered mailbox {args.tenant}/{args.name} id={mailbox_id}")
    return EXIT_OK


def cmd_mailbox_list(args: argparse.Namespace, settings: Settings, url: str) -> int:
    rows = _registry_call(url, lambda r: r.list(args.tenant))
    if args.json:
        print(json.dumps([_jsonable(row) for row in rows], indent=2))
        return EXIT_OK
    print(f"{'TENANT/NAME':<32} {'SERVER':<28} {'UIDVAL':>10} {'LAST UID':>9} "
          f"{'EVERY':>6} {'IMPORTED':>8}  STATE")
    for row in rows:
        state = "error: " + row["last_error"][:60] if row["last_error"] else (
            "warning: " + row["warning"][:60] if row["warning"] else "ok")
        print(f"{row['tenant_slug'] + '/' + row['name']:<32} "
              f"{row['host'] + ':' + str(row['port']):<28} {row['last_uidvalidity'] or 0:>10} "
              f"{row['last_synced_uid'] or 0:>9} {row['interval_seconds'] or 0:>5}s "
              f"{row['imported_total'] or 0:>8}  {state}")
    return EXIT_OK


def cmd_mailbox_set_interval(args: argparse.Namespace, settings: Settings, url: str) -> int:
    from .importer.state import StateStore

    async def go(registry: Any) -> None:
        await registry.get(args.tenant, args.name)
        await StateStore(registry.db).set_interval(args.tenant, args.name, args.seconds)

    _registry_call(url, go)
    print(f"{args.tenant}/{args.name}: sync every {args.seconds} s")
    return EXIT_OK


def cmd_mailbox_sync_now(args: argparse.Namespace, settings: Settings, url: str) -> int:
    from .importer import secrets
    from .importer.state import StateStore
    from .importer.sync import run_sync

    if args.request:
        async def request(registry: Any) -> None:
            await StateStore(registry.db).request_sync(args.tenant, args.name)

        _registry_call(url, request)
        print(f"{args.tenant}/{args.name}: sync requested from running importers")
        return EXIT_OK

    async def go(registry: Any) -> Any:
        from .migrations import migrate

        await migrate(registry.db)
        config = await registry.get(args.tenant, args.name)
        password = secrets.resolve(config.password_ref, key=settings.secret_key)
        return await run_sync(url, config, password, imap_timeout=settings.importer.imap_timeout,
                              lock_wait=settings.importer.lock_wait)

    report = _registry_call(url, go)
    print(json.dumps({"mailbox": f"{args.tenant}/{args.name}", "mode": report.mode,
                      "uidvalidity": report.uidvalidity, "imported": report.imported,
                      "duplicates": report.duplicates, "recovered": report.recovered,
                      "failed": report.failed, "last_synced_uid": report.last_synced_uid,
                      "warning": report.warning}))
    return EXIT_OK


def cmd_mailbox_enable(args: argparse.Namespace, settings: Settings, url: str) -> int:
    enabled = args.mailbox_command == "enable"
    _registry_call(url, lambda r: r.set_enabled(args.tenant, args.name, enabled))
    print(f"{args.tenant}/{args.name}: import {'enabled' if enabled else 'paused'} "
          "(running services pick this up within NEXARCH_IMPORT_RELOAD_INTERVAL)")
    return EXIT_OK


def cmd_mailbox_failures(args: argparse.Namespace, settings: Settings, url: str) -> int:
    from .importer.state import StateStore

    async def go(registry: Any) -> Any:
        await registry.get(args.tenant, args.name)
        return await StateStore(registry.db).failures(args.tenant, args.name)

    rows = [dict(r) for r in _registry_call(url, go)]
    if args.json:
        print(json.dumps(_jsonable(rows), indent=2))
        return EXIT_OK
    print(f"{len(rows)} message(s) the server did not hand over (retried by every run, "
          "up to 10 attempts)")
    for r in rows:
        print(f"  UIDVALIDITY {r['uidvalidity']} UID {r['uid']}: {r['attempts']} attempt(s), "
              f"last {r['last_failed_at']:%Y-%m-%d %H:%M}: {r['last_error']}")
    return EXIT_OK


def cmd_mailbox_remove(args: argparse.Namespace, settings: Settings, url: str) -> int:
    _registry_call(url, lambda r: r.remove(args.tenant, args.name))
    print(f"removed mailbox {args.tenant}/{args.name} (archived mail stays)")
    return EXIT_OK


def cmd_config_check(args: argparse.Namespace, settings: Settings, url: str) -> int:
    from .config import effective

    print(json.dumps(effective(settings), indent=2, ensure_ascii=False))
    return EXIT_OK


def cmd_mailbox_new_key(args: argparse.Namespace, settings: Settings, url: str) -> int:
    from .importer import secrets

    print(secrets.new_key())
    return EXIT_OK


def cmd_demo(args: argparse.Namespace, settings: Settings, url: str) -> int:
    from .demo import run_demo

    if not args.verbose:
        # The demo's own lines tell the story; the service's info lines
        # (stderr) would bury them. Warnings still show.
        logging.getLogger("nexarch_events").setLevel(
            max(logging.WARNING, logging.getLogger().getEffectiveLevel()))
    return run_demo(url, settings, duration=args.duration, rate=args.rate)


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="nexarch-events",
        description="Mail archive indexing queue on Postgres LISTEN/NOTIFY. The database is "
                    "NEXARCH_DATABASE_URL, or an embedded Postgres in NEXARCH_DATA_DIR "
                    "(default .nexarch) when unset.")
    parser.add_argument("--log-level", default=os.environ.get("NEXARCH_LOG_LEVEL", "info"))
    parser.add_argument("--config", metavar="FILE",
                        help="TOML configuration (default: $NEXARCH_CONFIG); NEXARCH_* "
                             "variables override it")
    sub = parser.add_subparsers(dest="command", required=True)

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

    mailbox = sub.add_parser("mailbox", help="register and manage IMAP mailboxes")
    msub = mailbox.add_subparsers(dest="mailbox_command", required=True)
    add = msub.add_parser("add", help="register a mailbox to import")
    add.add_argument("tenant")
    add.add_argument("name", help="your name for it, unique per tenant (e.g. alice-inbox)")
    add.add_argument("--host", required=True)
    add.add_argument("--port", type=int, help="default 993 (implicit TLS) or 143")
    add.add_argument("--tls", choices=["implicit", "starttls", "plain"], default="implicit",
                     help="certificates are verified; plain only on a trusted network")
    add.add_argument("--ca-file", help="PEM file of the CA to trust instead of the system's")
    add.add_argument("--user", required=True)
    add.add_argument("--password-env", metavar="NAME",
                     help="read the password from this variable of the service's environment")
    add.add_argument("--password-file", metavar="PATH", help="read the password from this file")
    add.add_argument("--password-stdin", action="store_true",
                     help="read it from stdin and store it sealed (needs "
                          "NEXARCH_SECRET_KEY_FILE)")
    add.add_argument("--folder", default="INBOX", help="IMAP folder (default INBOX)")
    add.add_argument("--interval", type=int, default=300, help="seconds between syncs")
    add.add_argument("--no-idle", action="store_true", help="never hold an IDLE connection")
    add.set_defaults(fn=cmd_mailbox_add)
    lst = msub.add_parser("list", help="registered mailboxes with their sync state")
    lst.add_argument("--tenant")
    lst.add_argument("--json", action="store_true")
    lst.set_defaults(fn=cmd_mailbox_list)
    interval = msub.add_parser("set-interval", help="change how often a mailbox is synced")
    interval.add_argument("tenant")
    interval.add_argument("name")
    interval.add_argument("seconds", type=int)
    interval.set_defaults(fn=cmd_mailbox_set_interval)
    now = msub.add_parser("sync-now", help="sync a mailbox now, in this process")
    now.add_argument("tenant")
    now.add_argument("name")
    now.add_argument("--request", action="store_true",
                     help="only ask the running service to sync it now")
    now.set_defaults(fn=cmd_mailbox_sync_now)
    for verb, text in (("enable", "resume importing a paused mailbox"),
                       ("disable", "pause importing a mailbox (its state is kept)")):
        toggle = msub.add_parser(verb, help=text)
        toggle.add_argument("tenant")
        toggle.add_argument("name")
        toggle.set_defaults(fn=cmd_mailbox_enable)
    failures = msub.add_parser("failures", help="messages the server did not hand over")
    failures.add_argument("tenant")
    failures.add_argument("name")
    failures.add_argument("--json", action="store_true")
    failures.set_defaults(fn=cmd_mailbox_failures)
    remove = msub.add_parser("remove", help="unregister a mailbox (archived mail stays)")
    remove.add_argument("tenant")
    remove.add_argument("name")
    remove.set_defaults(fn=cmd_mailbox_remove)
    msub.add_parser("new-key", help="print a new key for NEXARCH_SECRET_KEY_FILE").set_defaults(
        fn=cmd_mailbox_new_key, needs_database=False)

    enqueue = sub.add_parser("enqueue", help="enqueue one job; prints its id")
    enqueue.add_argument("job_type", choices=["index", "delete"])
    enqueue.add_argument("--tenant", required=True)
    enqueue.add_argument("--message-id", required=True)
    enqueue.add_argument("--payload", default="{}", help="JSON object (index jobs)")
    enqueue.set_defaults(fn=cmd_enqueue)

    status = sub.add_parser("status", help="a job's status as JSON")
    status.add_argument("job_id", type=int)
    status.add_argument("--tenant", help="only find the job within this tenant")
    status.set_defaults(fn=cmd_status)

    sub.add_parser("stats", help="counts per status, oldest ready age").set_defaults(fn=cmd_stats)

    requeue = sub.add_parser("requeue", help="re-queue failed jobs")
    requeue.add_argument("job_id", type=int, nargs="?")
    requeue.add_argument("--tenant")
    requeue.add_argument("--job-type", choices=["index", "delete"])
    requeue.add_argument("--all", action="store_true", help="every failed job")
    requeue.set_defaults(fn=cmd_requeue)

    archive = sub.add_parser("archive", help="archive .eml files for a tenant (and index them)")
    archive.add_argument("--tenant", required=True)
    archive.add_argument("files", nargs="+")
    archive.set_defaults(fn=cmd_archive)

    search = sub.add_parser("search", help="search a tenant's mail")
    search.add_argument("--tenant", required=True)
    search.add_argument("query", help='words, "phrases", -exclude, OR')
    search.add_argument("--sender", help="only mail from this address")
    search.add_argument("--since", help="sent at or after (YYYY-MM-DD[THH:MM], UTC)")
    search.add_argument("--until", help="sent before")
    search.add_argument("--mailbox", help="only mail seen in this mailbox")
    search.add_argument("--limit", type=int, default=20)
    search.add_argument("--offset", type=int, default=0)
    search.add_argument("--json", action="store_true", help="machine-readable output")
    search.set_defaults(fn=cmd_search)

    reindex = sub.add_parser("reindex", help="rebuild a tenant's index from the archive")
    reindex.add_argument("--tenant", required=True)
    reindex.set_defaults(fn=cmd_reindex)

    verify = sub.add_parser("verify-index",
                            help="report documents missing from or extra in the index")
    verify.add_argument("--tenant", help="one tenant (default: every tenant in the archive)")
    verify.set_defaults(fn=cmd_verify_index)

    demo = sub.add_parser(
        "demo", help="the whole service on a sample IMAP mailbox served in this process; "
                     "shows each new message's arrival -> searchable latency")
    demo.add_argument("--duration", type=float, default=30.0,
                      help="seconds of new mail (default 30); Ctrl-C ends it earlier")
    demo.add_argument("--rate", type=float, default=2.0,
                      help="new messages per second (default 2)")
    demo.add_argument("--verbose", action="store_true",
                      help="also show the service's info log lines (stderr)")
    demo.set_defaults(fn=cmd_demo, workers=None, batch_size=None)
    return parser


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
    if isinstance(exc, (JobNotFound, MigrationError, NexarchError)):
        return EXIT_FAILED, str(exc)
    if isinstance(exc, KeyboardInterrupt):
        return EXIT_INTERRUPTED, "interrupted"
    return None


def main(argv: Sequence[str] | None = None) -> int:
    parser = build_parser()
    args = parser.parse_args(argv)
    configure_logging(args.log_level)
    try:
        settings = _settings(args)
        configure_logging(args.log_level, settings.log_format)
        if not getattr(args, "needs_database", True):
            code0: int = args.fn(args, settings, "")
            return code0
        with database_url(settings) as url:
            code: int = args.fn(args, settings, url)
            return code
    except BaseException as exc:
        leaves = leaf_errors(exc)
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
