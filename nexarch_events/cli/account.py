"""``account``: register whole IMAP accounts; their folders are discovered
and archived each as a mailbox (``account discover`` runs one discovery now;
``run`` discovers every ``NEXARCH_IMPORT_DISCOVERY_INTERVAL`` seconds)."""

from __future__ import annotations

import argparse
import json
from datetime import UTC, datetime
from typing import Any

from ..aio import Database
from ..aio import run as aio_run
from ..db.migrations import ensure_current
from ..settings import Settings
from .common import EXIT_OK, Subparsers, jsonable
from .mailbox import add_sign_in_arguments, sign_in_from_args


def _accounts_call(url: str, settings: Settings, fn: Any) -> Any:
    from ..importer.accounts import AccountRegistry

    async def go() -> Any:
        async with Database.open(url, max_size=2, **settings.pool_options()) as db:
            await ensure_current(db)
            return await fn(db, AccountRegistry(db))

    return aio_run(go)


def cmd_account_add(args: argparse.Namespace, settings: Settings, url: str) -> int:
    from ..importer.accounts import AccountConfig

    ref, oauth = sign_in_from_args(args, settings, "account add")
    account = AccountConfig(
        tenant_slug=args.tenant, name=args.name, host=args.host,
        port=args.port or (993 if args.tls == "implicit" else 143), tls_mode=args.tls,
        username=args.user, password_ref=ref, oauth=oauth, ca_file=args.ca_file,
        use_idle=not args.no_idle, interval_seconds=args.interval,
        exclude_patterns=None if args.exclude is None else tuple(args.exclude),
        include_patterns=tuple(args.include or ()), all_mail_only=not args.every_folder)
    account_id = _accounts_call(url, settings, lambda db, r: r.add(account))
    print(f"registered account {args.tenant}/{args.name} id={account_id}: its folders are "
          "discovered by `run` (or now: nexarch-events account discover "
          f"{args.tenant} {args.name})")
    return EXIT_OK


def cmd_account_discover(args: argparse.Namespace, settings: Settings, url: str) -> int:
    from ..importer.accounts import discover
    from ..importer.refresh_tokens import refresh_store
    from ..importer.signin import SignIn

    async def go(db: Any, registry: Any) -> Any:
        account = await registry.get(args.tenant, args.name)
        sign_in = SignIn(account.mailbox("INBOX"), secret_key=settings.secret_key,
                         refresh_store=refresh_store(db, settings.secret_key))
        try:
            return await discover(db, account, sign_in,
                                  imap_timeout=settings.importer.imap_timeout)
        finally:
            await sign_in.aclose()

    found = _accounts_call(url, settings, go)
    print(json.dumps({"account": f"{args.tenant}/{args.name}", "listed": found.listed,
                      "archived": found.archived, "new": found.created, "gone": found.gone,
                      "name_taken_by_a_registered_mailbox": found.conflicts},
                     ensure_ascii=False, indent=2))
    return EXIT_OK


def cmd_account_list(args: argparse.Namespace, settings: Settings, url: str) -> int:
    rows = _accounts_call(url, settings, lambda db, r: r.overview(args.tenant))
    if args.json:
        print(json.dumps([jsonable(r) for r in rows], indent=2, ensure_ascii=False))
        return EXIT_OK
    print(f"{'TENANT/NAME':<32} {'SERVER':<28} {'FOLDERS':>7} {'GONE':>5}  STATE")
    for r in rows:
        state = ("error: " + r["last_discovery_error"][:60] if r["last_discovery_error"]
                 else "not discovered yet" if r["last_discovery_at"] is None else "ok")
        print(f"{r['tenant_slug'] + '/' + r['name']:<32} "
              f"{r['host'] + ':' + str(r['port']):<28} {r['folders']:>7} "
              f"{r['folders_gone']:>5}  {state}")
        for f in r["folder_mailboxes"]:
            print("  " + _folder_line(f))
    return EXIT_OK


def _folder_line(f: dict[str, Any]) -> str:
    """One folder under its account: decoded name, state, imported / on the
    server at the last run, UIDs pending, time since the last success."""
    on_server = "-" if f["server_exists"] is None else str(f["server_exists"])
    uidnext, synced = f["server_uidnext"], f["last_synced_uid"]
    pending = "-" if uidnext is None or synced is None else str(max(0, uidnext - 1 - synced))
    success = f["last_success_at"]
    since = "never" if success is None else \
        f"{(datetime.now(UTC) - success).total_seconds():.0f} s ago"
    detail = f["last_error"] or f["warning"] or f["idle_status"] or ""
    if f["failures"]:
        detail = f"{f['failures']} message(s) failing; {detail}".rstrip("; ")
    text = (f"{f['folder'][:40]:<40} {f['state']:<15} {f['imported_total'] or 0:>6} / "
            f"{on_server:<6} pending {pending:<6} {since:<12}")
    return f"{text} {detail[:80]}".rstrip()


def cmd_account_remove(args: argparse.Namespace, settings: Settings, url: str) -> int:
    _accounts_call(url, settings, lambda db, r: r.remove(args.tenant, args.name))
    print(f"removed account {args.tenant}/{args.name} and its folders' mailboxes "
          "(archived mail stays)")
    return EXIT_OK


def register(sub: Subparsers) -> None:
    account = sub.add_parser("account", help="register whole IMAP accounts (every folder)")
    asub = account.add_subparsers(dest="account_command", required=True)
    add = asub.add_parser("add", help="register an account; its folders are discovered")
    add.add_argument("tenant")
    add.add_argument("name", help="your name for it, unique per tenant (e.g. alice)")
    add_sign_in_arguments(add)
    add.add_argument("--exclude", action="append", metavar="PATTERN",
                     help="skip folders matching this shell pattern (repeatable; replaces "
                          "the defaults: Trash, Junk, Spam, Drafts and their usual names)")
    add.add_argument("--include", action="append", metavar="PATTERN",
                     help="archive folders matching this pattern even if excluded")
    add.add_argument("--every-folder", action="store_true",
                     help="Gmail: archive every label, not only All Mail")
    add.set_defaults(fn=cmd_account_add)
    discover = asub.add_parser("discover", help="list the account's folders now and "
                                                "register the ones to archive")
    discover.add_argument("tenant")
    discover.add_argument("name")
    discover.set_defaults(fn=cmd_account_discover)
    lst = asub.add_parser("list", help="registered accounts with their folders' state")
    lst.add_argument("--tenant")
    lst.add_argument("--json", action="store_true")
    lst.set_defaults(fn=cmd_account_list)
    remove = asub.add_parser("remove", help="unregister an account and its folders' mailboxes")
    remove.add_argument("tenant")
    remove.add_argument("name")
    remove.set_defaults(fn=cmd_account_remove)
