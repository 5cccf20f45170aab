"""``mailbox``: register IMAP mailboxes and manage their import."""

from __future__ import annotations

import argparse
import json
import os
import sys
from typing import TYPE_CHECKING, Any

from ..errors import ConfigurationError, NexarchError
from ..settings import Settings
from .common import EXIT_OK, Subparsers, bounded_int, jsonable, registry_call

if TYPE_CHECKING:  # imported where used: the CLI starts without the importer
    from ..importer.oauth import OAuthClient


def _secret_ref(option: str, env: str | None, file: str | None, stdin: bool | None,
                settings: Settings, *, required: bool) -> str | None:
    """A reference for the secret given by ``--<option>-env|-file|-stdin``
    (at most one; exactly one if ``required``; ``stdin`` None: the option has
    no stdin form). Stdin secrets are sealed."""
    from ..importer import secrets

    given = [x for x in (env, file, stdin) if x]
    if len(given) > 1 or (required and not given):
        forms = [f"--{option}-env NAME", f"--{option}-file PATH"]
        if stdin is not None:
            forms.append(f"--{option}-stdin")
        raise ConfigurationError(f"give {'exactly' if required else 'at most'} one of "
                                 + ", ".join(forms))
    if env:
        return secrets.reference_env(env)
    if file:
        return secrets.reference_file(os.path.abspath(file))
    if stdin:
        return secrets.seal(sys.stdin.readline().rstrip("\r\n"), settings.secret_key)
    return None


def sign_in_from_args(args: argparse.Namespace, settings: Settings, command: str
                      ) -> tuple[str | None, OAuthClient | None]:
    """``(password reference, OAuth client)`` from the options that
    ``add_sign_in_arguments`` defines; exactly one of them is set."""
    from ..importer.oauth import OAuthClient

    oauth_given = [name for name in ("oauth_token_url", "oauth_client_id", "oauth_secret_env",
                                     "oauth_secret_file", "oauth_secret_stdin",
                                     "oauth_refresh_token_env", "oauth_refresh_token_file",
                                     "oauth_refresh_token_stdin", "oauth_scope",
                                     "oauth_certificate_env", "oauth_certificate_file")
                   if getattr(args, name)]
    if args.auth == "password":
        if oauth_given:
            raise ConfigurationError(f"{command}: --{oauth_given[0].replace('_', '-')} "
                                     "needs --auth oauth2")
        return _secret_ref("password", args.password_env, args.password_file,
                           args.password_stdin, settings, required=True), None
    if args.password_env or args.password_file or args.password_stdin:
        raise ConfigurationError(f"{command}: --auth oauth2 signs in with a token, "
                                 "not a password; leave out --password-*")
    if not args.oauth_token_url or not args.oauth_client_id:
        raise ConfigurationError(f"{command}: --auth oauth2 needs --oauth-token-url "
                                 "and --oauth-client-id")
    # Stdin: the client secret's line first, then the refresh token's.
    return None, OAuthClient(
        token_url=args.oauth_token_url, client_id=args.oauth_client_id,
        client_secret_ref=_secret_ref("oauth-secret", args.oauth_secret_env,
                                      args.oauth_secret_file, args.oauth_secret_stdin,
                                      settings, required=False),
        refresh_token_ref=_secret_ref("oauth-refresh-token", args.oauth_refresh_token_env,
                                      args.oauth_refresh_token_file,
                                      args.oauth_refresh_token_stdin, settings,
                                      required=False),
        client_certificate_ref=_secret_ref("oauth-certificate", args.oauth_certificate_env,
                                           args.oauth_certificate_file, None, settings,
                                           required=False),
        scope=args.oauth_scope)


def add_sign_in_arguments(parser: argparse.ArgumentParser) -> None:
    """Where to connect and how to sign in (``mailbox add``, ``account add``)."""
    parser.add_argument("--host", required=True)
    parser.add_argument("--port", type=int, help="default 993 (implicit TLS) or 143")
    parser.add_argument("--tls", choices=["implicit", "starttls", "plain"], default="implicit",
                        help="certificates are verified; plain only on a trusted network")
    parser.add_argument("--ca-file", help="PEM file of the CA to trust instead of the system's")
    parser.add_argument("--user", required=True)
    parser.add_argument("--password-env", metavar="NAME",
                        help="read the password from this variable of the service's "
                             "environment")
    parser.add_argument("--password-file", metavar="PATH",
                        help="read the password from this file")
    parser.add_argument("--password-stdin", action="store_true",
                        help="read it from stdin and store it sealed (needs "
                             "NEXARCH_SECRET_KEY_FILE)")
    parser.add_argument("--auth", choices=["password", "oauth2"], default="password",
                        help="sign in with a password (default) or an OAuth2 token "
                             "(Microsoft 365, Gmail; see the README)")
    parser.add_argument("--oauth-token-url", metavar="URL",
                        help="the provider's token endpoint (https)")
    parser.add_argument("--oauth-client-id", metavar="ID")
    parser.add_argument("--oauth-scope", metavar="SCOPES", help="space-separated scopes")
    for option, what in (("oauth-secret", "the OAuth client secret"),
                         ("oauth-refresh-token", "the OAuth refresh token")):
        parser.add_argument(f"--{option}-env", metavar="NAME",
                            help=f"read {what} from this variable of the service's "
                                 "environment")
        parser.add_argument(f"--{option}-file", metavar="PATH",
                            help=f"read {what} from this file")
        parser.add_argument(f"--{option}-stdin", action="store_true",
                            help=f"read {what} from stdin and store it sealed")
    parser.add_argument("--oauth-certificate-env", metavar="NAME",
                        help="instead of a client secret: a PEM with the client's RSA key "
                             "and certificate, from this variable")
    parser.add_argument("--oauth-certificate-file", metavar="PATH",
                        help="instead of a client secret: that PEM, from this file")
    parser.add_argument("--interval", type=int, default=300, help="seconds between syncs")
    parser.add_argument("--no-idle", action="store_true", help="never hold an IDLE connection")


def cmd_mailbox_add(args: argparse.Namespace, settings: Settings, url: str) -> int:
    from ..importer.mailboxes import MailboxConfig

    ref, oauth = sign_in_from_args(args, settings, "mailbox add")
    port = args.port or (993 if args.tls == "implicit" else 143)
    config = MailboxConfig(tenant_slug=args.tenant, name=args.name, host=args.host, port=port,
                           tls_mode=args.tls, username=args.user, password_ref=ref,
                           folder=args.folder, ca_file=args.ca_file,
                           use_idle=not args.no_idle, oauth=oauth)
    mailbox_id = registry_call(url, settings,
                               lambda r: r.add(config, interval_seconds=args.interval))
    print(f"registered mailbox {args.tenant}/{args.name} id={mailbox_id} "
          f"(sign-in: {config.auth_method})")
    return EXIT_OK


def cmd_mailbox_list(args: argparse.Namespace, settings: Settings, url: str) -> int:
    rows = registry_call(url, settings, lambda r: r.list(args.tenant))
    if args.json:
        print(json.dumps([jsonable(row) for row in rows], indent=2))
        return EXIT_OK
    print(f"{'TENANT/NAME':<32} {'SERVER':<28} {'UIDVAL':>10} {'LAST UID':>9} "
          f"{'EVERY':>6} {'IMPORTED':>8}  STATE")
    for row in rows:
        state = _state_text(row)
        print(f"{row['tenant_slug'] + '/' + row['name']:<32} "
              f"{row['host'] + ':' + str(row['port']):<28} {row['last_uidvalidity'] or 0:>10} "
              f"{row['last_synced_uid'] or 0:>9} {row['interval_seconds'] or 0:>5}s "
              f"{row['imported_total'] or 0:>8}  {state}")
    return EXIT_OK


def _state_text(row: Any) -> str:
    """One line: the worst of error / warning / ok, then what else an
    operator must know (failing messages, IDLE given up)."""
    if not row["enabled"]:
        state = "paused"
    elif row["last_error"]:
        state = f"error: {row['last_error'][:60]}"
    elif row["warning"]:
        state = f"warning: {row['warning'][:60]}"
    elif row["last_success_at"] is None:
        # Messages imported by a first sync that was cut short (a restart,
        # a failure) are there: "not synced yet" read as "nothing yet".
        uid = row["last_synced_uid"] or 0
        state = f"first sync not finished (imported up to UID {uid})" if uid \
            else "not synced yet"
    else:
        state = "ok"
    if row["failures"]:
        state += f"; {row['failures']} message(s) failing (mailbox failures)"
    if row["idle_status"]:
        state += f"; {row['idle_status'][:80]}"
    return state


def cmd_mailbox_set_interval(args: argparse.Namespace, settings: Settings, url: str) -> int:
    from ..importer.state import StateStore

    async def go(registry: Any) -> None:
        await registry.get(args.tenant, args.name)
        await StateStore(registry.db).set_interval(args.tenant, args.name, args.seconds)

    registry_call(url, settings, go)
    print(f"{args.tenant}/{args.name}: sync every {args.seconds} s")
    return EXIT_OK


def cmd_mailbox_sync_now(args: argparse.Namespace, settings: Settings, url: str) -> int:
    from ..importer.state import StateStore
    from ..importer.sync import run_sync

    if args.request:
        async def request(registry: Any) -> None:
            if not (await registry.get(args.tenant, args.name)).enabled:
                raise NexarchError(
                    f"{args.tenant}/{args.name} is paused, and no importer runs it: "
                    f"`mailbox enable {args.tenant} {args.name}` first")
            await StateStore(registry.db).request_sync(args.tenant, args.name)

        registry_call(url, settings, request)
        print(f"{args.tenant}/{args.name}: sync requested from running importers")
        return EXIT_OK

    async def go(registry: Any) -> Any:
        from ..importer.refresh_tokens import refresh_store
        from ..importer.signin import SignIn

        config = await registry.get(args.tenant, args.name)
        sign_in = SignIn(config, secret_key=settings.secret_key,
                         refresh_store=refresh_store(registry.db, settings.secret_key))
        try:
            # The pool, not the URL: its session() is direct behind a pooler.
            return await run_sync(registry.db, config, sign_in,
                                  imap_timeout=settings.importer.imap_timeout,
                                  lock_wait=settings.importer.lock_wait)
        finally:
            await sign_in.aclose()

    # Two connections: the run's, and a spare for new messages in flight.
    report = registry_call(url, settings, go, connections=2)
    print(json.dumps({"mailbox": f"{args.tenant}/{args.name}", "mode": report.mode,
                      "uidvalidity": report.uidvalidity, "imported": report.imported,
                      "duplicates": report.duplicates, "recovered": report.recovered,
                      "failed": report.failed, "last_synced_uid": report.last_synced_uid,
                      "throttled": report.throttled, "passes": report.passes,
                      "warning": report.warning}))
    return EXIT_OK


def cmd_mailbox_enable(args: argparse.Namespace, settings: Settings, url: str) -> int:
    enabled = args.mailbox_command == "enable"
    registry_call(url, settings, lambda r: r.set_enabled(args.tenant, args.name, enabled))
    print(f"{args.tenant}/{args.name}: import {'enabled' if enabled else 'paused'} "
          "(running services pick this up within NEXARCH_IMPORT_RELOAD_INTERVAL)")
    return EXIT_OK


def cmd_mailbox_failures(args: argparse.Namespace, settings: Settings, url: str) -> int:
    from ..importer.state import StateStore

    async def go(registry: Any) -> Any:
        await registry.get(args.tenant, args.name)
        return await StateStore(registry.db).failures(args.tenant, args.name)

    if args.retry is not None or args.clear is not None:
        return _failure_action(args, settings, url)
    rows = [dict(r) for r in registry_call(url, settings, go)]
    if args.json:
        print(json.dumps(jsonable(rows), indent=2))
        return EXIT_OK
    print(f"{len(rows)} message(s) the server did not hand over (retried by every run, "
          "up to 10 attempts; --retry UID starts over, --clear UID gives up)")
    for r in rows:
        print(f"  UIDVALIDITY {r['uidvalidity']} UID {r['uid']}: {r['attempts']} attempt(s), "
              f"last {r['last_failed_at']:%Y-%m-%d %H:%M}: {r['last_error']}")
    return EXIT_OK


def _failure_action(args: argparse.Namespace, settings: Settings, url: str) -> int:
    from ..errors import JobNotFound
    from ..importer.state import StateStore

    retry = args.retry is not None
    uid = args.retry if retry else args.clear

    async def go(registry: Any) -> bool:
        await registry.get(args.tenant, args.name)
        store = StateStore(registry.db)
        if retry:
            found = await store.retry_failure(args.tenant, args.name, uid)
            if found:  # the next run retries it; ask running services for it now
                await store.request_sync(args.tenant, args.name)
            return found
        return await store.clear_failure(args.tenant, args.name, uid)

    if not registry_call(url, settings, go):
        raise JobNotFound(f"{args.tenant}/{args.name}: no recorded failure for UID {uid}")
    if args.json:
        print(json.dumps({"tenant": args.tenant, "mailbox": args.name, "uid": uid,
                          "action": "retry" if retry else "clear"}))
    elif retry:
        print(f"{args.tenant}/{args.name}: UID {uid} will be retried (sync requested)")
    else:
        print(f"{args.tenant}/{args.name}: UID {uid} forgotten; it stays unimported")
    return EXIT_OK


def cmd_mailbox_remove(args: argparse.Namespace, settings: Settings, url: str) -> int:
    registry_call(url, settings, lambda r: r.remove(args.tenant, args.name))
    print(f"removed mailbox {args.tenant}/{args.name} (archived mail stays)")
    return EXIT_OK


def cmd_mailbox_new_key(args: argparse.Namespace, settings: Settings, url: str) -> int:
    from ..importer import secrets

    print(secrets.new_key())
    return EXIT_OK


def register(sub: Subparsers) -> None:
    mailbox = sub.add_parser("mailbox", help="register and manage IMAP mailboxes")
    msub = mailbox.add_subparsers(dest="mailbox_command", required=True)
    add = msub.add_parser("add", help="register a mailbox to import")
    add.add_argument("tenant")
    add.add_argument("name", help="your name for it, unique per tenant (e.g. alice-inbox)")
    add_sign_in_arguments(add)
    add.add_argument("--folder", default="INBOX", help="IMAP folder (default INBOX)")
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
    action = failures.add_mutually_exclusive_group()
    action.add_argument("--retry", type=bounded_int(1, 2**32 - 1, "a UID"), metavar="UID",
                        help="try this failed message again (its attempts start over)")
    action.add_argument("--clear", type=bounded_int(1, 2**32 - 1, "a UID"), metavar="UID",
                        help="forget this failed message (it stays unimported)")
    failures.set_defaults(fn=cmd_mailbox_failures)
    remove = msub.add_parser("remove", help="unregister a mailbox (archived mail stays)")
    remove.add_argument("tenant")
    remove.add_argument("name")
    remove.set_defaults(fn=cmd_mailbox_remove)
    msub.add_parser("new-key", help="print a new key for NEXARCH_SECRET_KEY_FILE").set_defaults(
        fn=cmd_mailbox_new_key, needs_database=False)
