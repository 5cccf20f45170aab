"""Growth benchmark: work per item that must not grow with the archive.

Each operation below runs on a tenant of N messages and on one of 4N, on one
fresh database; per item, it is measured by the index entries Postgres read
(pg_stat_user_indexes, this bench's connection alone; the verdict: it does
not depend on the machine's speed) and by time. The figure at 4N is divided
by the one at N. Linear work gives a ratio near 1; work that reads the
mailbox or the tenant per item (a plan that scans a key range instead of
looking one message up) gives a ratio near 4.

- first sync:   N ``StateStore.import_message`` calls (mode new, one
                transaction each, as a sync makes them) into INBOX;
- resync:       the same messages again under a new UIDVALIDITY (a full
                resync: each is already archived, the location is new);
- second folder: the same messages into "all-mail" (Gmail's "All Mail",
                or a copy in a second folder);
- ids pages:    the tenant's archive ids in pages of 1,000 (``ids_page``,
                what a reindex or a tenant erasure walks);
- retention scan: the windows of retention's "undated" and "expired" passes
                over the tenant (nothing is erased).

A tenant of 50 messages archived before the others is there too; its ids
pages and retention scan run after each large tenant's ("small tenant", per
item of its 50), so a plan that walks every tenant's rows for its page shows.

Messages are small (about 300 bytes): the bench measures lookups, not
compression or WAL. Keep N at 1,000 or more: with a few hundred rows the
planner rightly reads whole small tables, and the ratios then say little
(N = 300 showed the small tenant at 3.1 entries per message, against 6.1 at
every larger N).

Usage: .venv/bin/python bench/growth_bench.py [--dsn URL] [--count N] [--out FILE]
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import sys
import time
import uuid
from collections.abc import Awaitable, Callable
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from nexarch_events.aio import Connection, Database, execute_sync  # noqa: E402
from nexarch_events.aio import run as aio_run  # noqa: E402
from nexarch_events.db import sqlfiles  # noqa: E402
from nexarch_events.db.migrations import migrate  # noqa: E402
from nexarch_events.importer.state import StateStore  # noqa: E402

#: Ratio of time per item (4N / N) above which the work is called growing.
LINEAR_LIMIT = 1.5
FUTURE = datetime(2100, 1, 1, tzinfo=UTC)
#: Messages of the small tenant, archived before the others.
SMALL = 50


def message(tenant: str, n: int) -> bytes:
    return (f"From: a{n}@example.org\r\nSubject: growth {n}\r\n"
            f"Message-ID: <{tenant}-{n}@example.org>\r\n"
            f"Date: Mon, 01 Jan 2024 10:00:00 +0000\r\n\r\nbody {n}\r\n").encode()


async def entries_read(conn: Connection) -> int:
    """Index entries this database's indexes returned so far, with this
    connection's own counts flushed first (they are flushed when it goes
    idle, at once when asked)."""
    await conn.execute("SELECT pg_stat_force_next_flush()")
    return int(await conn.fetchval("SELECT sum(idx_tup_read) FROM pg_stat_user_indexes"))


async def timed(conn: Connection, label: str, count: int,
                step: Callable[[], Awaitable[None]]) -> dict[str, float]:
    before = await entries_read(conn)
    t = time.perf_counter()
    await step()
    per_item_us = (time.perf_counter() - t) / count * 1e6
    per_item_entries = (await entries_read(conn) - before) / count
    print(f"    {label:<16} {count:>7,} items  {per_item_us:9.1f} us/item  "
          f"{per_item_entries:8.2f} index entries/item", flush=True)
    return {"us": round(per_item_us, 2), "entries": round(per_item_entries, 3)}


async def import_messages(store: StateStore, tenant: str, mailbox: str, uidvalidity: int,
                          count: int) -> None:
    """Messages 1..count as UIDs 1..count, one import_message each (mode new,
    one transaction each, as a sync makes them)."""
    await store.get_or_create(tenant, mailbox)
    await store.begin(tenant, mailbox, uidvalidity, None, count)
    for uid in range(1, count + 1):
        await store.import_message(tenant, mailbox, uidvalidity, uid, "new",
                                   message(tenant, uid))


async def measure(url: str, tenant: str, count: int,
                  small: str) -> dict[str, dict[str, float]]:
    archive_sql = sqlfiles.queries("archive.sql")
    lifecycle_sql = sqlfiles.queries("lifecycle.sql")
    conn = await Connection.open(url)
    try:
        store = StateStore(conn)

        def imports(mailbox: str, uidvalidity: int) -> Callable[[], Awaitable[None]]:
            async def run() -> None:
                await import_messages(store, tenant, mailbox, uidvalidity, count)
            return run

        def pages(query: str, window: int,
                  args: Callable[[int], tuple[object, ...]]) -> Callable[[], Awaitable[None]]:
            async def run() -> None:
                after = 0
                while True:
                    rows = await conn.fetch(query, *args(after))
                    if len(rows) < window:
                        return
                    after = rows[-1]["id"]
            return run

        def retention(who: str) -> Callable[[], Awaitable[None]]:
            async def run() -> None:
                await pages(lifecycle_sql["undated"], 500, lambda after: (who, after, 500))()
                await pages(lifecycle_sql["expired"], 1000,
                            lambda after: (who, FUTURE, after, 1000))()
            return run

        async def small_pages() -> None:
            await pages(archive_sql["ids_page"], 1000, lambda after: (small, after, 1000))()
            await retention(small)()

        result = {
            "first sync": await timed(conn, "first sync", count, imports("INBOX", 1)),
            "resync": await timed(conn, "resync", count, imports("INBOX", 2)),
            "second folder": await timed(conn, "second folder", count, imports("all-mail", 1)),
        }
        await conn.execute("ANALYZE")
        result["ids pages"] = await timed(conn, "ids pages", count,
                                          pages(archive_sql["ids_page"], 1000,
                                                lambda after: (tenant, after, 1000)))
        result["retention scan"] = await timed(conn, "retention scan", count,
                                               retention(tenant))
        # The same statements for the small tenant, now that they have run
        # often enough for a prepared statement to keep one generic plan.
        result["small tenant"] = await timed(conn, "small tenant", SMALL, small_pages)
        return result
    finally:
        await conn.aclose()


async def run(url: str, count: int) -> dict[str, Any]:
    async with Database.open(url, max_size=1) as db:
        await migrate(db)
    small = f"small{uuid.uuid4().hex[:6]}"
    conn = await Connection.open(url)
    try:
        await import_messages(StateStore(conn), small, "INBOX", 1, SMALL)
    finally:
        await conn.aclose()
    sizes: dict[int, dict[str, dict[str, float]]] = {}
    for n in (count, 4 * count):
        print(f"  tenant of {n:,} messages:", flush=True)
        sizes[n] = await measure(url, f"t{n}", n, small)
    return {"counts": [count, 4 * count], "us_per_item": {str(k): v for k, v in sizes.items()}}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--dsn", default=os.environ.get(
        "NEXARCH_BENCH_DATABASE_URL", "postgresql://postgres@127.0.0.1:5432/postgres"))
    parser.add_argument("--count", type=int, default=2500, help="N (the larger tenant is 4N)")
    parser.add_argument("--out", default=str(ROOT / "bench" / "results" / time.strftime(
        "growth-%Y%m%dT%H%M%SZ.json", time.gmtime())))
    args = parser.parse_args()
    from urllib.parse import urlsplit, urlunsplit

    name = f"nexarch_bench_{uuid.uuid4().hex[:8]}"
    execute_sync(args.dsn, [f'CREATE DATABASE "{name}"'])
    try:
        url = urlunsplit(urlsplit(args.dsn)._replace(path="/" + name))
        print(f"growth benchmark  N = {args.count:,}  python {platform.python_version()}",
              flush=True)
        result = aio_run(run, url, args.count)
    finally:
        execute_sync(args.dsn, [f'DROP DATABASE IF EXISTS "{name}" WITH (FORCE)'])
    small, large = result["counts"]
    per = result["us_per_item"]
    print(f"\nper item, {large:,} / {small:,} messages: index entries read (the verdict; "
          f"linear: <= {LINEAR_LIMIT}) and time")
    ratios = {}
    for op in per[str(small)]:
        a, b = per[str(small)][op], per[str(large)][op]
        ratios[op] = {key: round(b[key] / a[key], 2) if a[key] else None
                      for key in ("entries", "us")}
        entries = ratios[op]["entries"]
        verdict = "linear" if entries is not None and entries <= LINEAR_LIMIT else "GROWS"
        print(f"  {op:<16} entries {entries!s:>6}  time {ratios[op]['us']!s:>6}  {verdict}")
    result["ratios"] = ratios
    Path(args.out).parent.mkdir(parents=True, exist_ok=True)
    with open(args.out, "w") as out:
        json.dump(result, out, indent=1)
    print(f"results: {args.out}")


if __name__ == "__main__":
    main()
