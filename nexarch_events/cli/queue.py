"""Queue commands: enqueue, status, stats, requeue."""

from __future__ import annotations

import argparse
import json
import sys
from dataclasses import asdict
from typing import Any

from ..errors import ConfigurationError, InvalidJobError, JobNotFound
from ..settings import Settings
from .common import EXIT_OK, Subparsers, bounded_int, jsonable, queue_call, row_id


def read_payload(args: argparse.Namespace) -> str:
    """The payload's JSON text: ``--payload TEXT``, ``--payload -`` (stdin) or
    ``--payload-file PATH``. Linux limits one argument to 128 KiB; a file or
    stdin carries up to the job limit (1 MiB)."""
    if args.payload_file is not None:
        if args.payload is not None:
            raise ConfigurationError("enqueue: give --payload or --payload-file, not both")
        try:
            with open(args.payload_file, encoding="utf-8") as handle:
                return handle.read()
        except (OSError, UnicodeDecodeError) as exc:
            raise ConfigurationError(f"--payload-file {args.payload_file!r} cannot be read: "
                                     f"{exc}") from None
    if args.payload == "-":
        return sys.stdin.read()
    return "{}" if args.payload is None else str(args.payload)


def check_enqueue(args: argparse.Namespace) -> None:
    if args.job_type == "delete" and (args.payload is not None or args.payload_file):
        raise ConfigurationError("enqueue delete takes no payload (--payload, --payload-file): "
                                 "a delete job names the archived message, nothing more")


def cmd_enqueue(args: argparse.Namespace, settings: Settings, url: str) -> int:
    text = read_payload(args)
    try:
        payload = json.loads(text)
    except ValueError as exc:
        raise InvalidJobError(f"the payload is not valid JSON: {exc}") from exc

    async def go(queue: Any) -> int:
        if args.job_type == "index":
            return int(await queue.enqueue_index(args.tenant, args.message_id, payload))
        return int(await queue.enqueue_delete(args.tenant, args.message_id))

    print(queue_call(url, settings, go))
    return EXIT_OK


def cmd_status(args: argparse.Namespace, settings: Settings, url: str) -> int:
    async def go(queue: Any) -> Any:
        return await queue.status(args.job_id, tenant_slug=args.tenant)

    job = queue_call(url, settings, go)
    print(json.dumps(jsonable(asdict(job)), indent=2))
    return EXIT_OK


def cmd_stats(args: argparse.Namespace, settings: Settings, url: str) -> int:
    async def go(queue: Any) -> Any:
        return await queue.stats()

    stats = queue_call(url, settings, go)
    print(json.dumps({"counts": {str(k): v for k, v in stats.counts.items()},
                      "oldest_ready_age_s": stats.oldest_ready_age_s}, indent=2))
    return EXIT_OK


def cmd_requeue(args: argparse.Namespace, settings: Settings, url: str) -> int:
    if args.job_id is None and not args.all and args.tenant is None and args.job_type is None:
        raise ConfigurationError("requeue: give a job id, or --tenant/--job-type, or --all")

    async def go(queue: Any) -> Any:
        return await queue.requeue_failed(job_id=args.job_id, tenant_slug=args.tenant,
                                          job_type=args.job_type)

    result = queue_call(url, settings, go)
    print(json.dumps({"requeued": list(result.requeued),
                      "superseded": list(result.superseded)}))
    if args.job_id is not None and not result.requeued and not result.superseded:
        raise JobNotFound(f"no failed job with id {args.job_id}")
    return EXIT_OK


def cmd_prune(args: argparse.Namespace, settings: Settings, url: str) -> int:
    changes = {name: value for name, value in (("retain_succeeded", args.succeeded_older_than),
                                               ("retain_failed", args.failed_older_than))
               if value is not None}
    if changes:
        settings = settings.with_queue(**changes)

    async def go(queue: Any) -> int:
        total = 0
        while True:  # short statements, one batch each: claims never wait
            deleted = int(await queue.prune(args.batch))
            total += deleted
            if deleted < args.batch:
                return total

    deleted = queue_call(url, settings, go)
    print(json.dumps({"deleted": deleted, "retain_succeeded": settings.queue.retain_succeeded,
                      "retain_failed": settings.queue.retain_failed}))
    return EXIT_OK


def register(sub: Subparsers) -> None:
    enqueue = sub.add_parser("enqueue", help="enqueue one job; prints its id")
    enqueue.add_argument("job_type", choices=["index", "delete"])
    enqueue.add_argument("--tenant", required=True)
    enqueue.add_argument("--message-id", required=True)
    enqueue.add_argument("--payload", help="JSON object (index jobs); - reads it from stdin")
    enqueue.add_argument("--payload-file", metavar="PATH",
                         help="read the JSON payload from a file (above 128 KiB, the limit "
                              "of one command-line argument)")
    enqueue.set_defaults(fn=cmd_enqueue, check=check_enqueue)

    status = sub.add_parser("status", help="a job's status as JSON")
    status.add_argument("job_id", type=row_id("a job id"))
    status.add_argument("--tenant", help="only find the job within this tenant")
    status.set_defaults(fn=cmd_status)

    sub.add_parser("stats", help="counts per status, oldest ready age").set_defaults(fn=cmd_stats)

    requeue = sub.add_parser("requeue", help="re-queue failed jobs")
    requeue.add_argument("job_id", type=row_id("a job id"), nargs="?")
    requeue.add_argument("--tenant")
    requeue.add_argument("--job-type", choices=["index", "delete"])
    requeue.add_argument("--all", action="store_true", help="every failed job")
    requeue.set_defaults(fn=cmd_requeue)

    prune = sub.add_parser("prune", help="delete finished jobs past their retention "
                                         "(what the sweeper does, now)")
    prune.add_argument("--succeeded-older-than", type=float, metavar="SECONDS",
                       help="instead of queue.retain_succeeded (0: keep)")
    prune.add_argument("--failed-older-than", type=float, metavar="SECONDS",
                       help="instead of queue.retain_failed (0: keep)")
    prune.add_argument("--batch", type=bounded_int(1, 100_000), default=1000,
                       help="rows per statement (1-100000)")
    prune.set_defaults(fn=cmd_prune)
