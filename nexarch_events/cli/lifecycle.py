"""Lifecycle commands: erase, hold add|list|remove, retention show|set,
audit list. The actor written to the audit log is the OS user running the
command."""

from __future__ import annotations

import argparse
import getpass
import json
import math
import os
import sys
from dataclasses import asdict
from typing import Any

import trio

from ..errors import ConfigurationError
from ..settings import Settings
from .common import (
    EXIT_FAILED,
    EXIT_OK,
    Subparsers,
    command_name,
    jsonable,
    row_id,
    with_index,
)


def actor() -> str:
    """Who runs this command, for the audit log."""
    try:
        name = getpass.getuser()
    except (OSError, KeyError):  # no login name and no passwd entry (a bare container)
        return f"uid:{os.getuid()}"
    return name or f"uid:{os.getuid()}"


def _ids(args: argparse.Namespace) -> list[int]:
    from ..lifecycle.erasure import validate_ids

    return validate_ids(args.ids)


def check_erase(args: argparse.Namespace) -> None:
    chosen = [name for name, given in (("ARCHIVE_ID", bool(args.ids)),
                                       ("--query", args.query is not None),
                                       ("--all", args.all)) if given]
    if len(chosen) != 1:
        raise ConfigurationError("erase: give exactly one of ARCHIVE_ID..., --query or --all"
                                 + (f" (got {', '.join(chosen)})" if chosen else ""))
    if args.ids:
        _ids(args)
    if args.query is not None:
        from ..index.base import InvalidQuery
        from ..lifecycle.matching import check_query

        try:
            check_query(args.tenant, args.query)
        except InvalidQuery as exc:
            raise ConfigurationError(f"erase --query: {exc}") from None
    if args.dry_run and args.query is None:
        raise ConfigurationError("erase: --dry-run lists what --query finds; with ids or "
                                 "--all there is nothing to find")
    if args.all:
        if args.yes_erase_tenant != args.tenant:
            raise ConfigurationError(
                f"erase --all erases every message, the index and the import registrations "
                f"of tenant {args.tenant!r}: confirm with --yes-erase-tenant {args.tenant}")
        if args.unregister_mailboxes:
            raise ConfigurationError("erase --all unregisters every mailbox of the tenant "
                                     "anyway: drop --unregister-mailboxes")
    elif args.yes_erase_tenant is not None:
        raise ConfigurationError("erase: --yes-erase-tenant confirms --all only")
    if args.wait is not None and not (math.isfinite(args.wait) and args.wait > 0):
        raise ConfigurationError("erase --wait takes seconds > 0")


def cmd_erase(args: argparse.Namespace, settings: Settings, url: str) -> int:
    from ..lifecycle.erasure import Eraser

    who = actor()

    async def go(db: Any, backend: Any) -> Any:
        eraser = Eraser(db, backend)
        if args.all:
            result = await eraser.erase_tenant(args.tenant, actor=who)
            jobs = result.delete_jobs
            out: dict[str, Any] = {"tenant": args.tenant, "erased": result.erased,
                                   "unregistered_mailboxes": list(result.unregistered),
                                   "still_running": list(result.still_running),
                                   "delete_jobs": len(jobs), "audit_id": result.audit_id}
        elif args.query is not None:
            found, erased = await eraser.erase_query(
                args.tenant, args.query, actor=who, dry_run=args.dry_run,
                unregister_mailboxes=args.unregister_mailboxes)
            if erased is None:
                return {"tenant": args.tenant, "dry_run": args.dry_run, "found": found,
                        "erased": []}, None
            jobs = erased.delete_jobs
            out = _result(erased)
        else:
            erased = await eraser.erase(args.tenant, _ids(args), actor=who,
                                        unregister_mailboxes=args.unregister_mailboxes)
            jobs = erased.delete_jobs
            out = _result(erased)
        statuses = None
        if args.wait is not None and jobs:
            with trio.move_on_after(args.wait):
                statuses = await eraser.wait_finished(jobs)
            if statuses is None:
                statuses = await eraser.queue_statuses(jobs)
        return out, statuses

    out, statuses = with_index(url, settings, go)
    code = EXIT_OK
    if statuses is not None:
        counts: dict[str, int] = {}
        for status in statuses.values():
            counts[status.value] = counts.get(status.value, 0) + 1
        out["delete_job_statuses"] = counts
        if set(counts) - {"succeeded"}:
            code = EXIT_FAILED
    if args.json:
        print(json.dumps(jsonable(out), indent=2))
        return code
    if out.get("dry_run"):
        found = out["found"]
        print(f"{len(found)} message(s) of tenant {args.tenant} match (dry run, nothing "
              f"erased)" + (":" if found else ""))
        for archive_id in found:
            print(archive_id)
        return code
    if args.all:
        print(f"tenant {args.tenant}: {out['erased']} message(s) erased, "
              f"{len(out['unregistered_mailboxes'])} mailbox(es) unregistered, index dropped, "
              f"{out['delete_jobs']} delete job(s) (audit #{out['audit_id']})")
        if out["still_running"]:
            print(f"import runs of {', '.join(out['still_running'])} were still running: mail "
                  "they archive now survives; run the same erase again", file=sys.stderr)
            code = EXIT_FAILED
    elif "erased" in out and not out.get("audit_id") and not out["erased"]:
        print(f"nothing matches in tenant {args.tenant}: nothing erased")
    else:
        print(f"tenant {args.tenant}: {len(out['erased'])} message(s) erased"
              + (f", {len(out['already_erased'])} erased before" if out["already_erased"]
                 else "")
              + (f", mailbox(es) unregistered: {', '.join(out['unregistered_mailboxes'])}"
                 if out["unregistered_mailboxes"] else "")
              + f" (audit #{out['audit_id']})")
    if statuses is not None:
        print("delete jobs: " + ", ".join(f"{n} {s}" for s, n in
                                           sorted(out["delete_job_statuses"].items())))
        if code != EXIT_OK:
            print("the index may still hold erased mail until every delete job has "
                  "succeeded: `status JOB_ID` for each, `stats` for the queue", file=sys.stderr)
    elif out.get("erased"):
        print("the index forgets them when the workers have run the delete jobs "
              "(--wait SECONDS waits for that)", file=sys.stderr)
    return code


def _result(result: Any) -> dict[str, Any]:
    return {"tenant": result.tenant_slug, "erased": list(result.erased),
            "delete_jobs": [int(j) for j in result.delete_jobs],
            "already_erased": list(result.already_erased),
            "unregistered_mailboxes": list(result.unregistered), "audit_id": result.audit_id}


# -- holds ---------------------------------------------------------------------


def check_hold_add(args: argparse.Namespace) -> None:
    from ..errors import InvalidJobError
    from ..index.base import InvalidQuery
    from ..lifecycle.holds import validate_hold

    try:
        validate_hold(_scope(args), args.mailbox, args.query, args.reason, args.tenant)
    except (InvalidJobError, InvalidQuery) as exc:
        raise ConfigurationError(f"hold add: {exc}") from None


def _scope(args: argparse.Namespace) -> str:
    if args.whole_tenant:
        return "tenant"
    return "mailbox" if args.mailbox is not None else "query"


def cmd_hold_add(args: argparse.Namespace, settings: Settings, url: str) -> int:
    from ..lifecycle.holds import Holds

    async def go(db: Any, backend: Any) -> Any:
        holds = Holds(db, backend)
        hold = await holds.add(args.tenant, _scope(args), reason=args.reason, actor=actor(),
                               mailbox=args.mailbox, query=args.query)
        known = hold.scope != "mailbox" or await holds.mailbox_known(args.tenant, args.mailbox)
        return hold, known

    hold, known = with_index(url, settings, go)
    if not known:
        # Kept: a hold may name a mailbox before its mail is archived. But
        # a typo would protect nothing, silently (an operator audit).
        print(f"{command_name()}: note: tenant {args.tenant} has no archived mail in mailbox "
              f"{args.mailbox!r} and no mailbox of that name; check the name (the hold "
              "protects mail archived there later)", file=sys.stderr)
    if args.json:
        print(json.dumps(jsonable(asdict(hold)), indent=2))
    else:
        print(f"added {hold.describe()} in tenant {hold.tenant_slug}"
              + (f": {hold.recorded} message(s) recorded" if hold.scope == "query" else ""))
    return EXIT_OK


def cmd_hold_list(args: argparse.Namespace, settings: Settings, url: str) -> int:
    from ..lifecycle.holds import Holds

    async def go(db: Any, backend: Any) -> Any:
        return await Holds(db, backend).list(args.tenant, include_removed=args.all)

    holds = with_index(url, settings, go)
    if args.json:
        print(json.dumps(jsonable([asdict(h) for h in holds]), indent=2))
        return EXIT_OK
    if not holds:
        print("no legal holds" + ("" if args.all else " active"))
    for hold in holds:
        state = "active" if hold.active else f"removed {hold.removed_at:%Y-%m-%d} by " \
                                              f"{hold.removed_by}"
        print(f"#{hold.id}\t{hold.tenant_slug}\t{hold.describe()}\tby {hold.created_by} "
              f"{hold.created_at:%Y-%m-%d %H:%M}\t{state}")
    return EXIT_OK


def cmd_hold_remove(args: argparse.Namespace, settings: Settings, url: str) -> int:
    from ..lifecycle.holds import Holds

    async def go(db: Any, backend: Any) -> Any:
        return await Holds(db, backend).remove(args.id, actor=actor(), tenant_slug=args.tenant)

    hold = with_index(url, settings, go)
    print(f"removed {hold.describe()} of tenant {hold.tenant_slug}")
    return EXIT_OK


# -- audit -----------------------------------------------------------------------


def check_audit(args: argparse.Namespace) -> None:
    from ..lifecycle.audit import MAX_LIST, AuditAction

    if not 1 <= args.limit <= MAX_LIST:
        raise ConfigurationError(f"audit list: --limit must be 1..{MAX_LIST}")
    if args.action is not None and args.action not in {a.value for a in AuditAction}:
        raise ConfigurationError(f"audit list: --action must be one of "
                                 f"{', '.join(a.value for a in AuditAction)}")


def cmd_audit_list(args: argparse.Namespace, settings: Settings, url: str) -> int:
    from ..lifecycle import audit

    async def go(db: Any, backend: Any) -> Any:
        return await audit.entries(db, tenant_slug=args.tenant, limit=args.limit,
                                   before=args.before,
                                   action=None if args.action is None
                                   else audit.AuditAction(args.action))

    entries = with_index(url, settings, go)
    if args.json:
        print(json.dumps(jsonable([asdict(e) for e in entries]), indent=2))
        return EXIT_OK
    if not entries:
        print("no audit entries")
    for e in entries:
        print(f"#{e.id}\t{e.at:%Y-%m-%d %H:%M:%S}\t{e.tenant_slug}\t{e.actor}\t"
              f"{e.action.value}\t{e.count}\t{json.dumps(e.target, ensure_ascii=False)[:200]}")
    return EXIT_OK


# -- retention ---------------------------------------------------------------------


def check_retention_set(args: argparse.Namespace) -> None:
    from ..errors import InvalidJobError
    from ..lifecycle.retention import validate_days

    if args.days is not None:
        try:
            validate_days(args.days)
        except InvalidJobError as exc:
            raise ConfigurationError(f"retention set: {exc}") from None


def cmd_retention_show(args: argparse.Namespace, settings: Settings, url: str) -> int:
    from ..lifecycle.retention import policies

    async def go(db: Any, backend: Any) -> Any:
        return await policies(db, settings.retention)

    found = [p for p in with_index(url, settings, go)
             if args.tenant is None or p.tenant_slug == args.tenant]
    if args.json:
        print(json.dumps(jsonable([asdict(p) for p in found]), indent=2))
        return EXIT_OK
    if not found:
        print("no retention: mail is kept for ever"
              + (f" in tenant {args.tenant}" if args.tenant else ""))
    for p in found:
        origin = f"set by {p.set_by} {p.set_at:%Y-%m-%d}" if p.source == "database" \
            else "from the configuration"
        print(f"{p.tenant_slug}\t{p.days} days\t{origin}")
    print(f"a pass runs every {settings.retention.interval:g} s in `run`", file=sys.stderr)
    return EXIT_OK


def cmd_retention_set(args: argparse.Namespace, settings: Settings, url: str) -> int:
    from ..lifecycle.retention import set_policy

    async def go(db: Any, backend: Any) -> Any:
        await set_policy(db, args.tenant, args.days, actor=actor())

    with_index(url, settings, go)
    if args.days is None:
        configured = dict(settings.retention.days).get(args.tenant)
        print(f"{args.tenant}: retention set here cleared; "
              + (f"the configuration's {configured} days apply" if configured
                 else "mail is kept for ever"))
    else:
        print(f"{args.tenant}: mail is kept {args.days} days after it was received")
    return EXIT_OK


def cmd_retention_run(args: argparse.Namespace, settings: Settings, url: str) -> int:
    from datetime import UTC, datetime

    from ..lifecycle.retention import Retention

    async def go(db: Any, backend: Any) -> Any:
        return await Retention(db, backend, settings.retention, actor=actor()).run_pass(
            datetime.now(UTC))

    results = with_index(url, settings, go)
    if results is None:
        print("a retention pass is running in another process; nothing done", file=sys.stderr)
        return EXIT_FAILED
    for r in results:
        print(f"{r.tenant_slug}: {len(r.erased)} message(s) erased (received before "
              f"{r.cutoff:%Y-%m-%d %H:%M}), {len(r.skipped_held)} held (audit #{r.audit_id})"
              + (f"; stopped: {r.error}" if r.error else ""))
    if not results:
        print("no tenant has a retention policy")
    return EXIT_FAILED if any(r.error for r in results) else EXIT_OK


def register(sub: Subparsers) -> None:
    erase = sub.add_parser(
        "erase", help="erase messages from the archive and the index (audited)",
        description="Erase archived mail of one tenant: by archive id, by search query, or "
                    "all of it. Held mail (legal hold) is refused. The index forgets the "
                    "mail when the workers have run the delete jobs.")
    erase.add_argument("--tenant", required=True)
    erase.add_argument("ids", nargs="*", metavar="ARCHIVE_ID")
    erase.add_argument("--query", help='what a search for this finds (words, "phrases", '
                                       "-exclude, OR)")
    erase.add_argument("--dry-run", action="store_true",
                       help="with --query: list what would be erased, erase nothing")
    erase.add_argument("--all", action="store_true",
                       help="the whole tenant: import registrations, archive, index")
    erase.add_argument("--yes-erase-tenant", metavar="TENANT",
                       help="confirms --all: repeat the tenant")
    erase.add_argument("--unregister-mailboxes", action="store_true",
                       help="also unregister the mailboxes the erased mail was seen in, so "
                            "that it is not imported again")
    erase.add_argument("--wait", type=float, metavar="SECONDS",
                       help="wait up to SECONDS for the delete jobs (exit 1 if they have not "
                            "all succeeded by then)")
    erase.add_argument("--json", action="store_true")
    erase.set_defaults(fn=cmd_erase, check=check_erase)

    hold = sub.add_parser("hold", help="legal holds: mail that must not be erased")
    hsub = hold.add_subparsers(dest="hold_command", required=True)
    add = hsub.add_parser("add", help="hold a tenant, a mailbox or what a query finds")
    add.add_argument("--tenant", required=True)
    what = add.add_mutually_exclusive_group(required=True)
    what.add_argument("--whole-tenant", action="store_true", help="every message of the tenant")
    what.add_argument("--mailbox", help="every message seen in this mailbox")
    what.add_argument("--query", help="every message this search finds, now and at erasure")
    add.add_argument("--reason", required=True, help="the case or request it is for")
    add.add_argument("--json", action="store_true")
    add.set_defaults(fn=cmd_hold_add, check=check_hold_add)
    lst = hsub.add_parser("list", help="legal holds (active ones unless --all)")
    lst.add_argument("--tenant")
    lst.add_argument("--all", action="store_true", help="removed holds too")
    lst.add_argument("--json", action="store_true")
    lst.set_defaults(fn=cmd_hold_list)
    remove = hsub.add_parser("remove", help="remove a legal hold (audited)")
    remove.add_argument("id", type=row_id("a hold id"))
    remove.add_argument("--tenant", help="only if the hold is of this tenant")
    remove.set_defaults(fn=cmd_hold_remove)

    retention = sub.add_parser("retention", help="how long each tenant's mail is kept")
    rsub = retention.add_subparsers(dest="retention_command", required=True)
    show = rsub.add_parser("show", help="each tenant's retention and where it is set")
    show.add_argument("--tenant")
    show.add_argument("--json", action="store_true")
    show.set_defaults(fn=cmd_retention_show)
    rset = rsub.add_parser("set", help="keep a tenant's mail N days (audited)")
    rset.add_argument("--tenant", required=True)
    days = rset.add_mutually_exclusive_group(required=True)
    days.add_argument("--days", type=int, help="days after the mail was received")
    days.add_argument("--clear", action="store_true",
                      help="back to the configuration's days (or none)")
    rset.set_defaults(fn=cmd_retention_set, check=check_retention_set)
    rrun = rsub.add_parser("run", help="run a retention pass now (as `run` does daily)")
    rrun.set_defaults(fn=cmd_retention_run)

    audit = sub.add_parser("audit", help="the audit log of erasures, holds and retention")
    asub = audit.add_subparsers(dest="audit_command", required=True)
    alist = asub.add_parser("list", help="audit entries, newest first")
    alist.add_argument("--tenant")
    alist.add_argument("--limit", type=int, default=50)
    alist.add_argument("--before", type=row_id("an audit entry id"), metavar="ID",
                       help="entries older than this one")
    alist.add_argument("--action")
    alist.add_argument("--json", action="store_true")
    alist.set_defaults(fn=cmd_audit_list, check=check_audit)
