"""Archive and search commands: archive, search, reindex, verify-index."""

from __future__ import annotations

import argparse
import html
import json
import shutil
import sys
import textwrap
from dataclasses import asdict
from pathlib import Path
from typing import Any

from ..errors import ConfigurationError, InvalidJobError
from ..models import escape_controls
from ..settings import Settings
from .common import (
    EXIT_FAILED,
    EXIT_OK,
    Subparsers,
    command_name,
    jsonable,
    parse_date,
    progress_bar,
    with_index,
)


def check_archive(args: argparse.Namespace) -> None:
    """Every file before any is archived: one bad file among several
    stopped the command part-way, without its name, after reading a
    140 MB file whole to refuse it (an operator audit)."""
    from ..mail.archive import MAX_MESSAGE_BYTES

    for name in args.files:
        path = Path(name)
        if not path.is_file():
            raise ConfigurationError(f"archive: {name} is not a file")
        size = path.stat().st_size
        if size == 0:
            raise ConfigurationError(f"archive: {name} is empty (0 bytes); nothing archived")
        if size > MAX_MESSAGE_BYTES:
            raise ConfigurationError(f"archive: {name} is {size} bytes; the archive's limit is "
                                     f"{MAX_MESSAGE_BYTES}; nothing archived")


def cmd_archive(args: argparse.Namespace, settings: Settings, url: str) -> int:
    """Archives and enqueues; the index is the workers' job (a running
    ``run`` or ``worker``), so archiving never waits for the index and one
    code path indexes everything."""
    from ..mail.archive import Archive

    files = [Path(f) for f in args.files]
    queued = 0

    async def go(db: Any, backend: Any) -> None:
        nonlocal queued
        archive = Archive(db)
        for path in files:
            try:
                stored = await archive.store(args.tenant, path.read_bytes())
            except InvalidJobError as exc:  # a message the archive refuses: say which
                raise InvalidJobError(f"archive: {path}: {exc}") from None
            state = "archived" if stored.created else "already archived"
            queued += stored.job_id is not None
            print(f"{path}\t{state}\tarchive_id={stored.archive_id}"
                  + (f"\tindex_job={stored.job_id}" if stored.job_id else ""))

    with_index(url, settings, go)
    if queued:
        print(f"{queued} message(s) queued for indexing: searchable once `{command_name()} run` "
              f"or `{command_name()} worker` is running (it may be already)", file=sys.stderr)
    return EXIT_OK


def search_query(args: argparse.Namespace) -> Any:
    """The SearchQuery of ``search``'s arguments; ConfigurationError if bad."""
    from ..index.base import InvalidQuery, SearchQuery

    try:
        return SearchQuery(args.tenant, args.query, sender=args.sender,
                           date_from=parse_date(args.since, "--since"),
                           date_to=parse_date(args.until, "--until"),
                           received_from=parse_date(args.received_since, "--received-since"),
                           received_to=parse_date(args.received_until, "--received-until"),
                           sort=args.sort,
                           mailbox=args.mailbox, limit=args.limit, offset=args.offset)
    except InvalidQuery as exc:
        raise ConfigurationError(f"search: {exc}") from exc


def cmd_search(args: argparse.Namespace, settings: Settings, url: str) -> int:
    query = search_query(args)

    async def go(db: Any, backend: Any) -> Any:
        return await backend.search(query)

    result = with_index(url, settings, go)
    if args.json:
        print(json.dumps({"total": result.total, "exact_total": result.exact_total,
                          "ignored": list(result.ignored),
                          "hits": [jsonable(asdict(h)) for h in result.hits]}, indent=2))
        return EXIT_OK
    width = max(40, min(shutil.get_terminal_size().columns, 120))
    print("\n".join(format_hits(result, args.offset, width)))
    return EXIT_OK


def for_terminal(text: str) -> str:
    """Mail text for a terminal: raw newlines and tabs would break the
    block, and control characters are the terminal's commands (a subject
    that set the window title and cleared the screen: a search audit), so
    whitespace runs become one space and every other control character
    an escape (``\x1b``)."""
    return escape_controls(" ".join(text.split()))


def format_hits(result: Any, offset: int, width: int) -> list[str]:
    """A search result for a terminal ``width`` columns wide: one block per
    hit, one field per line, long text wrapped at spaces and never cut (an
    address stays whole); newlines inside a field become spaces."""
    shown = f"{offset + 1}-{offset + len(result.hits)}" if result.hits else "none"
    total = f"{result.total:,}" if result.exact_total else f"{result.total:,}+"
    lines = [f"{total} match(es), showing {shown}"]
    if result.ignored:
        lines.append("ignored (nothing searchable in them): "
                     + " ".join(repr(term) for term in result.ignored))
    indent = " " * 6

    def wrap(label: str, text: str) -> list[str]:
        flat = for_terminal(text)
        return textwrap.wrap(flat, width, initial_indent=indent + f"{label:<8}",
                             subsequent_indent=indent + " " * 8, break_long_words=False,
                             break_on_hyphens=False) or [indent + label]

    for number, hit in enumerate(result.hits, start=offset + 1):
        when = hit.sent_at.strftime("%Y-%m-%d %H:%M") if hit.sent_at else "(no date)"
        lines.append("")
        subject = for_terminal(hit.subject or "(no subject)")
        lines.extend(textwrap.wrap(subject, width, initial_indent=f"{number:>4}. ",
                                   subsequent_indent=indent, break_long_words=False))
        lines.extend(wrap("from", hit.sender))
        if hit.received_at is not None:
            when += f" (received {hit.received_at.strftime('%Y-%m-%d %H:%M')})"
        lines.append(f"{indent}{'date':<8}{when}   archive id {hit.archive_id}")
        snippet = hit.snippet.replace("<mark>", "[").replace("</mark>", "]")
        lines.extend(wrap("text", html.unescape(snippet)))
    return lines


def cmd_reindex(args: argparse.Namespace, settings: Settings, url: str) -> int:
    from ..reindex import reindex

    async def go(db: Any, backend: Any) -> Any:
        return await reindex(db, settings, backend, args.tenant,
                             progress=progress_bar(f"reindex {args.tenant}"))

    result = with_index(url, settings, go)
    print(f"reindexed tenant {result.tenant_slug}: {result.indexed} message(s) indexed, "
          f"{result.removed} stale document(s) removed, {result.failed} failed")
    return EXIT_OK if result.failed == 0 else EXIT_FAILED


def cmd_verify_index(args: argparse.Namespace, settings: Settings, url: str) -> int:
    from ..mail.archive import Archive
    from ..reindex import repair, verify

    async def go(db: Any, backend: Any) -> Any:
        tenants = [args.tenant] if args.tenant else sorted(
            set(await Archive(db).tenants()) | set(await _erased_tenants(db)))
        reports = [await verify(db, backend, tenant) for tenant in tenants]
        repaired = {r.tenant_slug: await repair(db, r) for r in reports
                    if args.repair and not r.consistent}
        return reports, repaired

    reports, repaired = with_index(url, settings, go)
    consistent = True
    for report in reports:
        consistent &= report.consistent
        jobs = repaired.get(report.tenant_slug)
        hint = ""
        if jobs is not None:
            already = len(report.missing) + len(report.extra) - len(jobs)
            hint = f"  <- repair: {len(jobs)} job(s) queued for the workers" + (
                f", {already} already queued" if already else "")
        elif not report.consistent:
            hint = f"  <- run: {command_name()} verify-index --repair --tenant {report.tenant_slug}"
        print(f"{report.tenant_slug}: {report.archived} archived, {report.indexed} indexed, "
              f"{len(report.missing)} missing, {len(report.extra)} extra "
              f"({len(report.erased)} of them erased)" + hint)
        for label, ids in (("missing", report.missing), ("extra", report.extra),
                           ("erased but still indexed", report.erased)):
            if ids:
                print(f"  {label}: {' '.join(map(str, ids[:20]))}"
                      + (f" ... (+{len(ids) - 20})" if len(ids) > 20 else ""))
    # --repair: the jobs are queued; a second run after the workers did
    # them reports consistent.
    return EXIT_OK if consistent or args.repair else EXIT_FAILED


async def _erased_tenants(db: Any) -> list[str]:
    """Tenants with erased mail: a tenant erased whole has no archive left,
    but its index may still hold documents."""
    from ..db import sqlfiles

    rows = await db.fetch(sqlfiles.queries("lifecycle.sql")["erased_tenants"])
    return [r["tenant_slug"] for r in rows]


def register(sub: Subparsers) -> None:
    archive = sub.add_parser("archive", help="archive .eml files for a tenant (and index them)")
    archive.add_argument("--tenant", required=True)
    archive.add_argument("files", nargs="+")
    archive.set_defaults(fn=cmd_archive, check=check_archive)

    search = sub.add_parser("search", help="search a tenant's mail")
    search.add_argument("--tenant", required=True)
    search.add_argument("query", help='words, "phrases", -exclude, OR')
    search.add_argument("--sender", help="only mail from this address")
    search.add_argument("--since", help="sent at or after (YYYY-MM-DD[THH:MM], UTC)")
    search.add_argument("--until", help="sent before")
    search.add_argument("--received-since",
                        help="received by the server at or after (IMAP INTERNALDATE)")
    search.add_argument("--received-until", help="received by the server before")
    search.add_argument("--sort", default="relevance",
                        help="relevance (best match first, the default), sent (newest sent "
                             "first) or received (newest received first)")
    search.add_argument("--mailbox", help="only mail seen in this mailbox")
    search.add_argument("--limit", type=int, default=20)
    search.add_argument("--offset", type=int, default=0)
    search.add_argument("--json", action="store_true", help="machine-readable output")
    search.set_defaults(fn=cmd_search, check=search_query)

    reindex = sub.add_parser("reindex", help="rebuild a tenant's index from the archive")
    reindex.add_argument("--tenant", required=True)
    reindex.set_defaults(fn=cmd_reindex)

    verify = sub.add_parser("verify-index",
                            help="report documents missing from or extra in the index")
    verify.add_argument("--tenant", help="one tenant (default: every tenant in the archive, "
                                         "and every tenant with erased mail)")
    verify.add_argument("--repair", action="store_true",
                        help="queue an index job per missing message and a delete job per "
                             "extra document (a running service applies them)")
    verify.set_defaults(fn=cmd_verify_index)
