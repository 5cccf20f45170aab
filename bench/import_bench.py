"""Import benchmark: IMAP first-sync throughput, and arrival -> searchable latency.

Both run against a real Dovecot on loopback (tests/support/dovecot.py, plain
IMAP) and fresh databases on the given Postgres server (or ``--embedded``: a
durable throwaway server of our own). Nothing in the package is changed; part
2 wraps a few functions in this process only, to time the steps.

1. throughput: 10,000 realistic messages (tests/support/mailgen.py) padded or
   trimmed so that their sizes spread uniformly over 2-50 KB, all unique, are
   appended to a Dovecot folder; then ONE first sync with ``run_sync``
   (default ImportLimits; one committed transaction per message) is timed:
   messages/s and MB/s, target >= 1,000 messages/s. Then, in the same run,
   what bounds it:
     a. IMAP only: the same folder read through ``ImapSession`` (EXAMINE,
        UID SEARCH, the size probes, UID FETCH (UID RFC822.SIZE BODY.PEEK[])
        in batches of 50, parse_fetch), storing nothing;
     b. Postgres only: the same 10,000 ``StateStore.import_message`` calls
        (the bodies of a.) replayed on a fresh database over one dedicated
        connection, as the sync does; commit floors on such a connection
        (SELECT 1; a 16-byte INSERT per commit; one body per commit into a
        bytea column with pglz, lz4 and no compression, and with pglz and
        synchronous_commit off on that diagnostic connection only); what a
        new connection costs (connect, first vs. warm begin/import_message,
        close); SHOW fsync / synchronous_commit / wal_sync_method;
     c. a cProfile top 10 (self time) of a smaller sync (1,000 messages).
   CPU seconds of this process, the Postgres server and Dovecot (process
   trees, local servers only) are reported for the sync.
2. searchable: in one trio nursery, a QueueService with the Indexer's
   handlers (Postgres search backend) and an ImportScheduler (IDLE enabled)
   for one mailbox registered with MailboxRegistry.add (password
   ``env:BENCH_IMAP_PASSWORD``). Once its first sync is done and it IDLEs,
   200 messages (after 10 warm-up ones) are APPENDed one at a time (single
   APPENDs on one IMAP connection, from a thread), one every 150 ms without
   waiting for the previous one (``--closed-loop``: each only after the
   previous one was found). Each one's latency runs from just before its
   APPEND until a search for its unique token returns it (searched when its
   mail-imported notification arrives, then after every job-events
   notification, and every 5 ms). p50/p90/p99/max; targets p50 <= 150 ms,
   p99 <= 500 ms. Components: APPEND -> IDLE push (of the run that imported
   it) -> sync run start -> mail-imported notification -> job 'succeeded'
   notification -> search hit, and the steps inside the sync runs.

3. concurrency (``--only concurrency``): 1, 4, 16 and 64 mailboxes (one
   Dovecot folder each, ``--concurrency-total`` messages split evenly) synced
   at once by ``run_sync`` (one connection each), on a fresh database each,
   with and without the NOTIFYs: total msg/s and the p50/p99 time of one
   message's ``import_message`` call (its commit). "Without NOTIFY" is a
   bench-only switch: that database gets a no-op ``public.pg_notify`` and
   ``search_path = public, pg_catalog``, so the product's functions call it
   instead of the real one; nothing in the package changes. Postgres
   serialises the commits of transactions that sent a NOTIFY on one
   cluster-wide lock; the difference between the two columns is its cost.

Usage: .venv/bin/python bench/import_bench.py [--dsn URL | --embedded] [--quick]
       [--only throughput,searchable] [--count N] [--arrivals N] [--interval S]
       [--closed-loop] [--profile-count N] [--floor-count N] [--out FILE]
"""

from __future__ import annotations

import argparse
import base64
import contextlib
import cProfile
import email.message
import email.parser
import email.policy
import functools
import json
import logging
import os
import platform
import pstats
import random
import re
import shutil
import statistics
import sys
import tempfile
import time
import uuid
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

import psutil
import trio

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from nexarch_events.aio import Connection, Database, execute_sync  # noqa: E402
from nexarch_events.aio import run as aio_run  # noqa: E402
from nexarch_events.aio.imap import ImapEndpoint, ImapSession  # noqa: E402
from nexarch_events.db.migrations import migrate  # noqa: E402
from nexarch_events.errors import DatabaseError  # noqa: E402
from nexarch_events.importer import scheduler as scheduler_module  # noqa: E402
from nexarch_events.importer import sync as sync_module  # noqa: E402
from nexarch_events.importer.mailboxes import MailboxConfig, MailboxRegistry  # noqa: E402
from nexarch_events.importer.protocol import (  # noqa: E402
    mailbox_argument,
    parse_examine,
    parse_fetch,
    parse_search,
    uid_set,
)
from nexarch_events.importer.scheduler import ImportScheduler  # noqa: E402
from nexarch_events.importer.state import StateStore  # noqa: E402
from nexarch_events.importer.sync import ImportLimits, SyncReport, run_sync  # noqa: E402
from nexarch_events.index.base import SearchQuery  # noqa: E402
from nexarch_events.index.factory import open_index  # noqa: E402
from nexarch_events.mail.indexer import Indexer  # noqa: E402
from nexarch_events.queue.notify import (  # noqa: E402
    IMPORT_REQUESTS_CHANNEL,
    JOB_EVENTS_CHANNEL,
    MAIL_IMPORTED_CHANNEL,
    Notification,
)
from nexarch_events.service import QueueService  # noqa: E402
from nexarch_events.settings import Settings  # noqa: E402
from tests.support.dovecot import Dovecot, running_dovecot  # noqa: E402
from tests.support.mailgen import realistic_messages, unique_token  # noqa: E402

TENANT = "bench"
USER = "alice"
PASSWORD_ENV = "BENCH_IMAP_PASSWORD"
MIN_SIZE, MAX_SIZE = 2 * 1024, 50 * 1024
ARRIVAL_START = 1_000_000  # token numbers of part 2's messages (unique_token(n))
TARGET_RATE = 1000.0  # issue 10 (issue 4 asked for 400)
TARGET_P50_MS, TARGET_P99_MS = 150.0, 500.0
_LINE_END = re.compile(rb"\r\n|\r|\n")
_APPENDUID = re.compile(rb"\[APPENDUID \d+ (\d+)\]", re.IGNORECASE)


# ------------------------------------------------------------------ helpers


def pr(line: str = "") -> None:
    print(line, flush=True)


def pct(values: Sequence[float], q: float) -> float:
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, round(q * (len(ordered) - 1)))]


def dist(values: Sequence[float], digits: int = 1) -> dict[str, float]:
    if not values:
        return {}
    return {"n": len(values), "p50": round(pct(values, 0.5), digits),
            "p90": round(pct(values, 0.9), digits), "p99": round(pct(values, 0.99), digits),
            "max": round(max(values), digits), "mean": round(statistics.mean(values), digits)}


def with_db(dsn: str, name: str) -> str:
    from urllib.parse import urlsplit, urlunsplit

    return urlunsplit(urlsplit(dsn)._replace(path="/" + name))


SOCKET_DIRS = ("/var/run/postgresql", "/tmp")


def over_socket(url: str) -> str | None:
    """``url`` over the same server's Unix socket, when ``url`` is TCP to
    this host and the socket exists; else None."""
    from urllib.parse import urlsplit, urlunsplit

    parts = urlsplit(url)
    if parts.hostname not in ("127.0.0.1", "localhost", "::1") or parts.query:
        return None
    port = parts.port or 5432
    for folder in SOCKET_DIRS:
        if Path(folder, f".s.PGSQL.{port}").exists():
            user = f"{parts.username}@" if parts.username else ""
            return urlunsplit(parts._replace(netloc=user, query=f"host={folder}&port={port}"))
    return None


class CpuMeter:
    """CPU seconds of a process tree: every live process's own time plus what
    its reaped children used (children_user/system), so processes that end
    between two readings (a sync's Postgres backend, Dovecot's imap process)
    are still counted, and nothing twice."""

    def __init__(self, root_pid: int | None) -> None:
        self.root: psutil.Process | None = None
        if root_pid is not None:
            with contextlib.suppress(psutil.Error):
                self.root = psutil.Process(root_pid)

    def read(self) -> float | None:
        if self.root is None:
            return None
        total = 0.0
        procs: list[psutil.Process] = []
        for _ in range(20):  # a process may end while the tree is walked
            try:
                procs = [self.root, *self.root.children(recursive=True)]
                break
            except psutil.NoSuchProcess:
                continue
            except psutil.Error:
                return None
        else:
            return None
        for proc in procs:
            with contextlib.suppress(psutil.Error):
                t = proc.cpu_times()
                total += t.user + t.system + t.children_user + t.children_system
        return total


def own_cpu() -> float:
    t = psutil.Process().cpu_times()
    return t.user + t.system


async def postmaster_pid(url: str) -> int | None:
    """The local Postgres server's main pid (None if the server is not on this host)."""
    conn = await Connection.open(url)
    try:
        backend = await conn.fetchval("SELECT pg_backend_pid()")
        proc = psutil.Process(backend)  # while the backend still runs
        parent = proc.parent()
        if "postgres" in proc.name() and parent is not None:
            return parent.pid
    except psutil.Error:
        pass
    finally:
        await conn.aclose()
    return None


# ------------------------------------------------------------------- corpus

_VOCAB = ("Rechnung Angebot Termin Lieferung Projekt Unterlagen Bestellung Zahlung Vertrag "
          "Besprechung invoice meeting delivery project customer contract schedule report "
          "budget review update payment order offer Woche Monat heute morgen bitte danke "
          "please thanks tomorrow today next week the and for with von und der die das").split()


def crlf(raw: bytes) -> bytes:
    """As IMAP carries it (Dovecot stores and returns CRLF)."""
    return _LINE_END.sub(b"\r\n", raw)


@functools.cache
def _line_pool() -> tuple[bytes, ...]:
    """4,096 ASCII word lines (CRLF, <= 74 bytes each) to pad with."""
    rng = random.Random("import-bench:lines")
    pool = []
    for _ in range(4096):
        words: list[str] = []
        want = rng.randint(40, 72)
        while sum(len(w) + 1 for w in words) < want:
            words.append(rng.choice(_VOCAB))
        pool.append(" ".join(words)[:72].rstrip().encode() + b"\r\n")
    return tuple(pool)


def _text_lines(rng: random.Random, size: int) -> bytes:
    """Random lines of the pool adding up to at most ``size`` bytes."""
    pool = _line_pool()
    out: list[bytes] = []
    total = 0
    for line in rng.choices(pool, k=size // 40 + 1):
        if total + len(line) > size:
            break
        out.append(line)
        total += len(line)
    return b"".join(out)


def _split(raw: bytes) -> tuple[bytes, bytes, email.message.Message]:
    end = raw.find(b"\r\n\r\n")
    head, body = raw[:end + 4], raw[end + 4:]
    headers = email.parser.BytesHeaderParser(policy=email.policy.compat32).parsebytes(head)
    return head, body, headers


def _b64_size(n: int) -> int:
    """Bytes of base64.encodebytes(n bytes) with CRLF line ends."""
    chars = 4 * ((n + 2) // 3)
    return chars + 2 * ((chars + 75) // 76)


def _pad(raw: bytes, need: int, rng: random.Random) -> bytes:
    """``raw`` grown by at most ``need`` bytes of text, where the MIME
    structure allows it: a multipart's epilogue, or the single part's text
    (base64: decoded, extended, re-encoded)."""
    head, body, headers = _split(raw)
    if not body.endswith(b"\r\n"):
        body += b"\r\n"
        need -= 2
    cte = str(headers.get("Content-Transfer-Encoding", "7bit")).strip().lower()
    if headers.get_content_maintype() == "multipart" or cte != "base64":
        return head + body + _text_lines(rng, need)
    data = base64.b64decode(body)
    limit = len(body) + need
    extra = max(0, need * 3 // 4)
    while extra > 0 and _b64_size(len(data) + 2 + extra) > limit:
        extra -= 1
    added = b"\r\n" + _text_lines(rng, extra) if extra > 0 else b""
    return head + base64.encodebytes(data + added).replace(b"\n", b"\r\n")


def _trim(raw: bytes, room: int) -> bytes:
    """``raw`` cut at a line end to at most ``room`` bytes; a multipart gets
    its closing boundary back."""
    head, body, headers = _split(raw)
    close = b""
    if headers.get_content_maintype() == "multipart":
        close = b"--" + str(headers.get_boundary()).encode() + b"--\r\n"
    keep = room - len(head) - len(close)
    if keep < 0:
        raise ValueError("headers alone exceed the target size")
    cut = body.rfind(b"\r\n", 0, keep - 1)
    return head + (body[:cut + 2] if cut >= 0 else b"") + close


def sized_corpus(count: int, seed: int) -> tuple[list[bytes], dict[str, Any]]:
    """``count`` unique messages whose sizes are spread uniformly over
    2-50 KB (stratified: one target per equal-width slot, shuffled). The
    realistic messages are matched to the targets by rank (smallest message
    to smallest target), then padded or trimmed; an ``X-Bench-Seq`` header
    (unique) takes up the last few bytes, so every size is exact."""
    rng = random.Random(f"import-bench:{seed}")
    width = (MAX_SIZE - MIN_SIZE) / count
    targets = [int(MIN_SIZE + (i + rng.random()) * width) for i in range(count)]
    rng.shuffle(targets)
    base = [crlf(m) for m in realistic_messages(count, seed=seed)]
    by_target = sorted(range(count), key=targets.__getitem__)
    by_size = sorted(range(count), key=lambda i: len(base[i]))
    out: list[bytes] = [b""] * count
    padded = trimmed = 0
    for slot, source in zip(by_target, by_size, strict=True):
        target, raw = targets[slot], base[source]
        seq = b"X-Bench-Seq: %07d" % slot
        room = target - len(seq) - 2
        if len(raw) > room:
            raw = _trim(raw, room)
            trimmed += 1
        elif len(raw) < room:
            raw = _pad(raw, room - len(raw), rng)
            padded += 1
        gap = room - len(raw)
        assert 0 <= gap < 900, gap
        filler = (b" " + rng.randbytes(gap).hex().encode()[:gap - 1]) if gap else b""
        message = seq + filler + b"\r\n" + raw
        assert len(message) == target
        out[slot] = message
    sizes = [len(m) for m in out]
    assert len(set(out)) == count
    return out, {"messages": count, "bytes": sum(sizes),
                 "mean_kb": round(statistics.mean(sizes) / 1024, 1),
                 "min_kb": round(min(sizes) / 1024, 2), "max_kb": round(max(sizes) / 1024, 2),
                 "padded": padded, "trimmed": trimmed}


# ------------------------------------------------------------ part 1 parts


def config_for(dovecot: Dovecot, name: str, folder: str) -> MailboxConfig:
    return MailboxConfig(tenant_slug=TENANT, name=name, host=dovecot.host, port=dovecot.port,
                         tls_mode="plain", username=USER, password_ref=f"env:{PASSWORD_ENV}",
                         folder=folder)


async def timed_sync(url: str, config: MailboxConfig, password: str,
                     meters: dict[str, CpuMeter],
                     limits: ImportLimits | None = None) -> dict[str, Any]:
    before = {name: m.read() for name, m in meters.items()}
    client_before = own_cpu()
    start = time.perf_counter()
    report: SyncReport = await run_sync(url, config, password,
                                        limits=limits or ImportLimits())
    elapsed = time.perf_counter() - start
    client = own_cpu() - client_before
    cpu: dict[str, float | None] = {"client_s": round(client, 2)}
    for name, meter in meters.items():
        after, first = meter.read(), before[name]
        cpu[f"{name}_s"] = None if after is None or first is None else round(after - first, 2)
    async with Database.open(url, max_size=1) as db:
        row = await db.fetchrow("SELECT count(*) AS n, coalesce(sum(size_bytes), 0) AS bytes "
                                "FROM mail_archive WHERE tenant_slug = $1", TENANT)
        jobs = await db.fetchval("SELECT count(*) FROM mail_index_jobs")
    assert row is not None
    return {"seconds": round(elapsed, 3), "imported": report.imported,
            "archived": row["n"], "bytes": int(row["bytes"]), "index_jobs": jobs,
            "failed": report.failed, "warnings": report.warnings, "cpu": cpu,
            "msgs_per_s": round(row["n"] / elapsed, 1),
            "mb_per_s": round(int(row["bytes"]) / elapsed / 1e6, 2)}


async def imap_only(dovecot: Dovecot, folder: str, password: str,
                    limits: ImportLimits) -> tuple[dict[str, Any], list[tuple[int, bytes]], int]:
    """Read the folder like the sync does, storing nothing. Returns the
    timings, the (uid, body) pairs, and UIDVALIDITY."""
    endpoint = ImapEndpoint(dovecot.host, dovecot.port, "plain", None, 30.0)
    start = time.perf_counter()
    session = await ImapSession.open(endpoint, USER, password)
    bodies: list[tuple[int, bytes]] = []
    probe_s = fetch_s = parse_s = 0.0
    try:
        login_s = time.perf_counter() - start
        status = parse_examine(await session.examine(mailbox_argument(folder)))
        uids = sorted(parse_search(await session.uid_search("UID 1:*")))
        for first in range(0, len(uids), limits.probe_chunk):
            chunk = uids[first:first + limits.probe_chunk]
            t = time.perf_counter()
            parse_fetch(await session.uid_fetch(uid_set(chunk), "(UID RFC822.SIZE)"))
            probe_s += time.perf_counter() - t
        for first in range(0, len(uids), limits.batch_messages):
            batch = uids[first:first + limits.batch_messages]
            t = time.perf_counter()
            parts = await session.uid_fetch(uid_set(batch), "(UID RFC822.SIZE BODY.PEEK[])",
                                            limit=limits.fetch_timeout)
            t2 = time.perf_counter()
            items = parse_fetch(parts)
            parse_s += time.perf_counter() - t2
            fetch_s += t2 - t
            bodies.extend((i.uid, i.body) for i in items if i.uid and i.body)
    finally:
        await session.aclose()
    elapsed = time.perf_counter() - start
    assert len(bodies) == len(uids), (len(bodies), len(uids))
    assert status.uidvalidity is not None
    return ({"seconds": round(elapsed, 3), "login_s": round(login_s, 3),
             "probe_s": round(probe_s, 3), "fetch_s": round(fetch_s, 3),
             "parse_s": round(parse_s, 3), "messages": len(bodies),
             "msgs_per_s": round(len(bodies) / elapsed, 1)},
            bodies, status.uidvalidity)


async def commit_floors(url: str, bodies: list[tuple[int, bytes]], n: int) -> dict[str, Any]:
    """Round trips and single-statement commits on one dedicated connection
    (through the package's Connection, like the sync's), each statement its
    own transaction. The body INSERTs use the fetched message bodies, into a
    bytea column compressed with pglz (Postgres' default, like mail_archive.raw),
    lz4 (if the server has it) and not at all (STORAGE EXTERNAL). The last
    loop turns synchronous_commit off for this diagnostic connection only,
    to show what the WAL flush costs; the sync itself runs as configured."""
    conn = await Connection.open(url)
    try:
        settings = {name: await conn.fetchval(f"SHOW {name}") for name in (
            "fsync", "synchronous_commit", "wal_sync_method", "full_page_writes",
            "default_toast_compression", "wal_compression")}
        out: dict[str, Any] = {"settings": settings}
        tables = {"pglz": "", "external": ""}
        await conn.execute("CREATE TABLE bench_pglz (id bigserial PRIMARY KEY, "
                           "payload bytea COMPRESSION pglz NOT NULL)")
        await conn.execute("CREATE TABLE bench_external (id bigserial PRIMARY KEY, "
                           "payload bytea NOT NULL)")
        await conn.execute("ALTER TABLE bench_external ALTER COLUMN payload SET STORAGE EXTERNAL")
        try:
            await conn.execute("CREATE TABLE bench_lz4 (id bigserial PRIMARY KEY, "
                               "payload bytea COMPRESSION lz4 NOT NULL)")
            tables["lz4"] = ""
        except DatabaseError:
            pass

        async def loop(name: str, fn: Callable[[int], Any]) -> None:
            lat: list[float] = []
            start = time.perf_counter()
            for i in range(n):
                t = time.perf_counter()
                await fn(i)
                lat.append((time.perf_counter() - t) * 1000)
            out[name] = {**dist(lat, 3), "seconds": round(time.perf_counter() - start, 3)}

        await loop("select1_ms", lambda i: conn.fetchval("SELECT 1"))
        out["fresh_connection_ms"] = await fresh_connection_tax(url, bodies)
        await loop("insert_16b_commit_ms", lambda i: conn.execute(
            "INSERT INTO bench_external (payload) VALUES ($1)", b"0123456789abcdef"))
        for table in tables:
            await loop(f"insert_body_{table}_commit_ms", lambda i, table=table: conn.execute(
                f"INSERT INTO bench_{table} (payload) VALUES ($1)", bodies[i % len(bodies)][1]))
        await conn.execute("SET synchronous_commit = off")
        await loop("insert_body_pglz_no_flush_ms", lambda i: conn.execute(
            "INSERT INTO bench_pglz (payload) VALUES ($1)", bodies[i % len(bodies)][1]))
        await conn.execute("RESET synchronous_commit")
        for table in tables:
            await conn.execute(f"DROP TABLE bench_{table}")
        return out
    finally:
        await conn.aclose()


async def fresh_connection_tax(url: str, bodies: list[tuple[int, bytes]],
                               rounds: int = 20) -> dict[str, dict[str, float]]:
    """What a sync run pays for opening its own Postgres connection: a new
    backend plans (and compiles, for PL/pgSQL) every statement on its first
    use. Per round: connect, begin + import_message twice (first on the cold
    backend, then warm), close."""
    steps: dict[str, list[float]] = {}

    def note(name: str, since: float) -> float:
        now = time.perf_counter()
        steps.setdefault(name, []).append((now - since) * 1000)
        return now

    for r in range(rounds):
        t = time.perf_counter()
        conn = await Connection.open(url)
        t = note("connect", t)
        store = StateStore(conn)
        for attempt, label in enumerate(("first", "warm")):
            await store.begin(TENANT, f"cold-{r}", 7, None, None)
            t = note(f"begin {label}", t)
            body = bodies[(2 * r + attempt) % len(bodies)][1]
            await store.import_message(TENANT, f"cold-{r}", 7, attempt + 1, "new",
                                       body + b"\r\nX: cold %d\r\n" % r)
            t = note(f"import_message {label}", t)
        await conn.aclose()
        note("close", t)
    return {name: dist(values, 2) for name, values in steps.items()}


async def replay(url: str, uidvalidity: int, bodies: list[tuple[int, bytes]],
                 meter: CpuMeter) -> dict[str, Any]:
    """The sync's Postgres half alone: the same import_message calls, on one
    dedicated connection, in UID order."""
    conn = await Connection.open(url)
    try:
        store = StateStore(conn)
        await store.begin(TENANT, "replay", uidvalidity, None, len(bodies))
        lat: list[float] = []
        pg_before, client_before = meter.read(), own_cpu()
        start = time.perf_counter()
        for uid, body in bodies:
            t = time.perf_counter()
            await store.import_message(TENANT, "replay", uidvalidity, uid, "new", body)
            lat.append((time.perf_counter() - t) * 1000)
        elapsed = time.perf_counter() - start
        pg_after = meter.read()
        return {"seconds": round(elapsed, 3), "messages": len(bodies),
                "msgs_per_s": round(len(bodies) / elapsed, 1), "call_ms": dist(lat, 3),
                "client_cpu_s": round(own_cpu() - client_before, 2),
                "postgres_cpu_s": None if pg_after is None or pg_before is None
                else round(pg_after - pg_before, 2)}
    finally:
        await conn.aclose()


def _where(path: str) -> str:
    for marker in ("site-packages/", str(ROOT) + "/"):
        if marker in path:
            return path.split(marker, 1)[1]
    return Path(path).name if "/" in path else path


_BUCKETS = (("aioimaplib", "aioimaplib"), ("asyncpg", "asyncpg"),
            ("trio_asyncio", "trio_asyncio"), ("trio", "trio/"),
            ("asyncio", "asyncio/"), ("nexarch_events", "nexarch_events/"))


async def profiled_sync(url: str, config: MailboxConfig, password: str) -> dict[str, Any]:
    profile = cProfile.Profile()
    start = time.perf_counter()
    profile.enable()
    try:
        report = await run_sync(url, config, password)
    finally:
        profile.disable()
    elapsed = time.perf_counter() - start
    stats = pstats.Stats(profile)
    rows = []
    buckets: dict[str, float] = {}
    total_self = 0.0
    for (path, line, func), (_cc, ncalls, tottime, _cum, _callers) in \
            stats.stats.items():  # type: ignore[attr-defined]
        total_self += tottime
        name = f"{func} ({_where(path)}:{line})" if line else func
        rows.append((tottime, ncalls, name))
        if "epoll" in func:
            bucket = "waiting (epoll)"
        else:
            bucket = next((label for label, marker in _BUCKETS if marker in path),
                          "builtins/other")
        buckets[bucket] = buckets.get(bucket, 0.0) + tottime
    rows.sort(reverse=True)
    return {"messages": report.imported, "seconds": round(elapsed, 3),
            "msgs_per_s": round(report.imported / elapsed, 1),
            "top_self": [{"self_s": round(t, 3), "share": round(t / elapsed, 3), "calls": c,
                          "function": name} for t, c, name in rows[:10]],
            "self_by_package": {k: round(v / elapsed, 3) for k, v in
                                sorted(buckets.items(), key=lambda kv: -kv[1])}}


async def part1(urls: dict[str, str], dovecot: Dovecot, folder: str, profile_folder: str | None,
                floor_count: int, in_flight: int) -> dict[str, Any]:
    password = dovecot.users[USER]
    pg_meter = CpuMeter(await postmaster_pid(urls["sync"]))
    meters = {"postgres": pg_meter, "dovecot": CpuMeter(dovecot.pid)}
    result: dict[str, Any] = {"workload": "import_throughput"}
    print("  sync ...", flush=True)
    result["sync"] = await timed_sync(urls["sync"], config_for(dovecot, "bench", folder),
                                      password, meters, ImportLimits(in_flight=in_flight))
    result["in_flight"] = in_flight
    print(f"  sync: {result['sync']['msgs_per_s']} msg/s; one at a time ...", flush=True)
    if "sync_socket" in urls:
        result["sync_socket"] = await timed_sync(
            urls["sync_socket"], config_for(dovecot, "socket", folder), password, meters,
            ImportLimits(in_flight=in_flight))
        print(f"  over the Unix socket: {result['sync_socket']['msgs_per_s']} msg/s", flush=True)
    result["sync_one"] = await timed_sync(urls["sync_one"], config_for(dovecot, "one", folder),
                                          password, meters, ImportLimits(in_flight=1))
    print(f"  one at a time: {result['sync_one']['msgs_per_s']} msg/s; IMAP only ...",
          flush=True)
    result["imap_only"], bodies, uidvalidity = await imap_only(dovecot, folder, password,
                                                               ImportLimits())
    print("  commit floors ...", flush=True)
    result["commit"] = await commit_floors(urls["replay"], bodies, floor_count)
    print("  Postgres replay ...", flush=True)
    result["replay"] = await replay(urls["replay"], uidvalidity, bodies, pg_meter)
    del bodies
    if profile_folder is not None:
        print("  profiled sync ...", flush=True)
        result["profile"] = await profiled_sync(
            urls["profile"], config_for(dovecot, "profile", profile_folder), password)
    return result


# ------------------------------------------------------------------- part 2


class Trace:
    """time.time() of the importer's steps, recorded by wrappers installed in
    this process only (undone by ``uninstall``): the IDLE returning (the
    server pushed something), each sync run, its Postgres connection, and its
    IMAP commands and StateStore calls."""

    def __init__(self) -> None:
        self.idle_returned: list[float] = []
        self.idling = False
        #: set when an IDLE command starts
        self.idle_started = trio.Event()
        self.run_started: list[float] = []
        self.run_ended: list[float] = []
        #: (step, start, end) of everything a sync run does that is wrapped
        self.steps: list[tuple[str, float, float]] = []
        self._undo: list[Callable[[], None]] = []

    def _wrap(self, owner: Any, attr: str, name: Callable[[tuple[Any, ...]], str]) -> None:
        original = getattr(owner, attr)
        steps = self.steps

        async def wrapper(*args: Any, **kwargs: Any) -> Any:
            t = time.time()
            try:
                return await original(*args, **kwargs)
            finally:
                steps.append((name(args), t, time.time()))

        setattr(owner, attr, wrapper)
        self._undo.append(lambda: setattr(owner, attr, original))

    def install(self) -> None:
        trace = self
        original_idle = ImapSession.idle
        original_run_sync = scheduler_module.run_sync  # type: ignore[attr-defined]
        original_connection = sync_module.Connection  # type: ignore[attr-defined]

        async def idle(session: ImapSession, max_wait: float) -> list[bytes]:
            trace.idling = True
            trace.idle_started.set()
            try:
                return await original_idle(session, max_wait)
            finally:
                trace.idling = False
                trace.idle_returned.append(time.time())

        async def timed_run_sync(*args: Any, **kwargs: Any) -> SyncReport:
            trace.run_started.append(time.time())
            try:
                return await original_run_sync(*args, **kwargs)  # type: ignore[no-any-return]
            finally:
                trace.run_ended.append(time.time())

        class TimedConnection(original_connection):  # type: ignore[misc, valid-type]
            @classmethod
            async def open(cls, dsn: str, **kwargs: Any) -> Connection:
                t = time.time()
                conn: Connection = await super().open(dsn, **kwargs)
                trace.steps.append(("pg connect", t, time.time()))
                return conn

            async def aclose(self) -> None:
                t = time.time()
                await super().aclose()
                trace.steps.append(("pg close", t, time.time()))

        for attr in ("examine", "uid_search", "uid_fetch"):
            self._wrap(ImapSession, attr, lambda args, attr=attr: (
                "IMAP " + attr.upper().replace("_", " ")
                + (" bodies" if attr == "uid_fetch" and "BODY" in str(args[2]) else
                   " sizes" if attr == "uid_fetch" else "")))
        for attr in ("try_run_lock", "begin", "recorded_failures", "import_message", "finish",
                     "run_unlock"):
            self._wrap(StateStore, attr, lambda args, attr=attr: "pg " + attr)
        ImapSession.idle = idle  # type: ignore[method-assign, assignment]
        scheduler_module.run_sync = timed_run_sync  # type: ignore[attr-defined]
        sync_module.Connection = TimedConnection  # type: ignore[attr-defined]
        self._undo += [lambda: setattr(ImapSession, "idle", original_idle),
                       lambda: setattr(scheduler_module, "run_sync", original_run_sync),
                       lambda: setattr(sync_module, "Connection", original_connection)]

    def uninstall(self) -> None:
        for undo in reversed(self._undo):
            undo()
        self._undo = []

    @staticmethod
    def first_after(times: Sequence[float], t: float) -> float | None:
        return next((x for x in times if x >= t), None)


class Appender:
    """One logged-in imaplib session (tests.support.dovecot), used from worker
    threads one call at a time."""

    def __init__(self, dovecot: Dovecot, folder: str) -> None:
        self.stack = contextlib.ExitStack()
        self.imap = self.stack.enter_context(dovecot.session(USER))
        self.folder = '"' + folder + '"'

    def append(self, raw: bytes) -> tuple[int, float, float]:
        start = time.time()
        typ, data = self.imap.append(self.folder, None, None, raw)
        done = time.time()
        found = _APPENDUID.search(b" ".join(d for d in data if isinstance(d, bytes)))
        if typ != "OK" or found is None:
            raise RuntimeError(f"APPEND failed: {typ} {data!r}")
        return int(found.group(1)), start, done

    def close(self) -> None:
        self.stack.close()


async def part2(url: str, dovecot: Dovecot, folder: str, initial: int, arrivals: int,
                warmup: int, interval: float, closed_loop: bool) -> dict[str, Any]:
    os.environ[PASSWORD_ENV] = dovecot.users[USER]
    settings = Settings(database_url=url)
    assert settings.importer.idle_limit > 0  # IDLE enabled
    trace = Trace()
    imported: dict[int, tuple[float, int]] = {}  # uid -> (received_at, archive_id)
    succeeded: dict[int, float] = {}  # job id -> received_at
    changed = [trio.Event()]
    first_run = trio.Event()
    messages = [crlf(m) for m in realistic_messages(warmup + arrivals, seed=22,
                                                    start=ARRIVAL_START)]
    samples: list[dict[str, Any]] = []

    def on_run(config: MailboxConfig, report: SyncReport) -> None:
        first_run.set()

    def poke() -> None:
        changed[0].set()
        changed[0] = trio.Event()

    async def consume_imported(sub: Any) -> None:
        async for note in sub:
            if isinstance(note, Notification):
                data = note.json()
                uid, archive_id = data.get("uid"), data.get("archive_id")
                if data.get("event") == "imported" and isinstance(uid, int) \
                        and isinstance(archive_id, int):
                    imported[uid] = (note.received_at, archive_id)
                    poke()

    async def consume_jobs(sub: Any) -> None:
        async for note in sub:
            if isinstance(note, Notification):
                data = note.json()
                ids = data.get("ids")
                if data.get("event") == "succeeded" and isinstance(ids, list):
                    for job_id in ids:
                        succeeded[int(job_id)] = note.received_at  # type: ignore[arg-type]
                poke()

    async def watch(backend: Any, n: int, uid: int, t0: float, appended: float) -> None:
        """Search for message n's token once it is imported, then after every
        notification (or 5 ms) until the search returns it."""
        token = unique_token(ARRIVAL_START + n)
        searches = 0
        with trio.fail_after(60):
            while True:
                seen = changed[0]
                if uid in imported:
                    searches += 1
                    result = await backend.search(SearchQuery(TENANT, token))
                    if result.hits:
                        hit = time.time()
                        assert result.hits[0].archive_id == imported[uid][1]
                        break
                with trio.move_on_after(0.005):
                    await seen.wait()
        if n >= warmup:
            samples.append({"uid": uid, "t0": t0, "appended": appended,
                            "imported": imported[uid][0], "archive_id": imported[uid][1],
                            "hit": hit, "searches": searches})

    trace.install()
    appender = await trio.to_thread.run_sync(Appender, dovecot, folder)
    try:
        async with Database.open(url, max_size=settings.pool_size) as db, \
                open_index(settings, db) as backend:
            await MailboxRegistry(db).add(MailboxConfig(
                tenant_slug=TENANT, name="arrivals", host=dovecot.host, port=dovecot.port,
                tls_mode="plain", username=USER, password_ref=f"env:{PASSWORD_ENV}",
                folder=folder, use_idle=True))
            service = QueueService(db, settings, Indexer(db, backend).handlers(),
                                   listen_job_events=True,
                                   extra_channels=(IMPORT_REQUESTS_CHANNEL,
                                                   MAIL_IMPORTED_CHANNEL))
            imported_sub = service.listener.subscribe(MAIL_IMPORTED_CHANNEL)
            jobs_sub = service.listener.subscribe(JOB_EVENTS_CHANNEL)
            scheduler = ImportScheduler(db, settings.importer, listener=service.listener,
                                        on_run=on_run)
            async with trio.open_nursery() as nursery:
                nursery.start_soon(consume_imported, imported_sub)
                nursery.start_soon(consume_jobs, jobs_sub)
                await nursery.start(service.run)
                await nursery.start(scheduler.run)
                with trio.fail_after(120):
                    await first_run.wait()
                    trace.idle_started = trio.Event()
                    if not trace.idling:
                        await trace.idle_started.wait()
                await trio.sleep(0.3)  # the IDLE command has reached Dovecot
                pr(f"  first sync of {initial} done; scheduler IDLEs; {warmup} + {arrivals} "
                   f"APPENDs, one every {interval * 1000:.0f} ms"
                   f"{' after the previous one is searchable' if closed_loop else ''} ...")
                started = time.time()
                async with trio.open_nursery() as watchers:
                    next_at = trio.current_time()
                    for n, raw in enumerate(messages):
                        await trio.sleep_until(next_at)
                        uid, t0, appended = await trio.to_thread.run_sync(appender.append, raw)
                        if closed_loop:
                            await watch(backend, n, uid, t0, appended)
                        else:
                            watchers.start_soon(watch, backend, n, uid, t0, appended)
                        next_at = max(next_at + interval, trio.current_time())
                elapsed = time.time() - started
                job_of = {int(r["message_id"]): r["id"] for r in await db.fetch(
                    "SELECT id, message_id FROM mail_index_jobs WHERE job_type = 'index'")}
                with trio.fail_after(10):
                    while any(job_of[s["archive_id"]] not in succeeded for s in samples):
                        await changed[0].wait()
                nursery.cancel_scope.cancel()
    finally:
        trace.uninstall()
        await trio.to_thread.run_sync(appender.close)

    def last_before(times: Sequence[float], t: float) -> float | None:
        return max((x for x in times if x <= t), default=None)

    ms = 1000.0
    total: list[float] = []
    comp: dict[str, list[float]] = {k: [] for k in (
        "append_rtt", "append_to_idle_push", "push_to_run_start", "run_start_to_imported",
        "append_to_imported", "imported_to_hit", "imported_to_job_succeeded",
        "job_succeeded_to_hit", "push_to_hit")}
    runs: dict[float, int] = {}  # start of the run that imported a sample -> samples
    for s in sorted(samples, key=lambda s: s["t0"]):
        indexed = succeeded[job_of[s["archive_id"]]]
        total.append((s["hit"] - s["t0"]) * ms)
        comp["append_rtt"].append((s["appended"] - s["t0"]) * ms)
        comp["append_to_imported"].append((s["imported"] - s["t0"]) * ms)
        comp["imported_to_hit"].append((s["hit"] - s["imported"]) * ms)
        comp["imported_to_job_succeeded"].append((indexed - s["imported"]) * ms)
        # < 0 when a search found it before the ack's notification arrived:
        # the handler writes the index before the job is acknowledged.
        comp["job_succeeded_to_hit"].append((s["hit"] - indexed) * ms)
        # The run that imported it, and the IDLE push that started that run
        # (in an open loop, a run may take messages whose own push is yet to come).
        run_start = last_before(trace.run_started, s["imported"])
        pushed = last_before(trace.idle_returned, run_start) if run_start else None
        if run_start is None or pushed is None:
            continue
        runs[run_start] = runs.get(run_start, 0) + 1
        comp["append_to_idle_push"].append((pushed - s["t0"]) * ms)
        comp["push_to_run_start"].append((run_start - pushed) * ms)
        comp["run_start_to_imported"].append((s["imported"] - run_start) * ms)
        comp["push_to_hit"].append((s["hit"] - pushed) * ms)
    in_run: dict[str, list[float]] = {}
    durations: list[float] = []
    for run_start in runs:
        run_end = Trace.first_after(trace.run_ended, run_start)
        if run_end is None:
            continue
        durations.append((run_end - run_start) * ms)
        sums: dict[str, float] = {}
        for name, t1, t2 in trace.steps:
            if run_start <= t1 and t2 <= run_end:
                sums[name] = sums.get(name, 0.0) + (t2 - t1) * ms
        sums["(rest of the run)"] = (run_end - run_start) * ms - sum(sums.values())
        for name, value in sums.items():
            in_run.setdefault(name, []).append(value)
    in_run["run (total)"] = durations
    return {"workload": "arrival_to_searchable", "n": len(total), "warmup": warmup,
            "initial_messages": initial, "interval_s": interval, "closed_loop": closed_loop,
            "append_rate_per_s": round((warmup + arrivals) / elapsed, 2),
            "latency_ms": dist(total), "components_ms": {k: dist(v) for k, v in comp.items()},
            "run_steps_ms": {k: dist(v, 2) for k, v in in_run.items()},
            "sync_runs": len(trace.run_started),
            "measured_per_run": round(statistics.mean(runs.values()), 2) if runs else None,
            "searches_per_message": round(statistics.mean(s["searches"] for s in samples), 2)}


# --------------------------------------------------------------------- main


async def part3(urls: dict[tuple[int, bool], str], dovecot: Dovecot,
                folders: dict[int, list[str]], per: dict[int, int]) -> dict[str, Any]:
    """Concurrent first syncs; ``urls[(mailboxes, notify)]`` is a fresh database."""
    password = dovecot.users[USER]
    original = StateStore.import_message
    durations: list[float] = []

    async def timed(self: StateStore, *args: Any, **kwargs: Any) -> Any:
        t = time.perf_counter()
        try:
            return await original(self, *args, **kwargs)
        finally:
            durations.append(time.perf_counter() - t)

    rows = []
    StateStore.import_message = timed  # type: ignore[method-assign]
    try:
        for (n, notify), url in urls.items():
            durations.clear()
            configs = [config_for(dovecot, f"c{n}-{i}", folder)
                       for i, folder in enumerate(folders[n])]
            start = time.perf_counter()
            async with trio.open_nursery() as nursery:
                for config in configs:
                    nursery.start_soon(functools.partial(run_sync, url, config, password,
                                                         imap_timeout=120, lock_wait=120))
            elapsed = time.perf_counter() - start
            async with Database.open(url, max_size=1) as db:
                archived = int(await db.fetchval("SELECT count(*) FROM mail_archive"))
            ms = [d * 1000 for d in durations]
            rows.append({"mailboxes": n, "notify": notify, "messages": archived,
                         "expected": n * per[n], "seconds": round(elapsed, 3),
                         "msgs_per_s": round(archived / elapsed, 1),
                         "commit_ms": {"p50": round(pct(ms, 0.5), 2),
                                       "p99": round(pct(ms, 0.99), 2)}})
            pr(f"  {n:>3} mailboxes, NOTIFY {'on ' if notify else 'off'}: {archived:,} msgs "
               f"in {elapsed:.2f} s = {archived / elapsed:.1f} msg/s")
    finally:
        StateStore.import_message = original  # type: ignore[method-assign]
    return {"workload": "concurrency", "rows": rows}


def print_report(meta: dict[str, Any], results: list[dict[str, Any]]) -> None:
    pr()
    pr(f"import benchmark  run {meta['run']}  {meta['cpus']} cpus  {meta['server']}")
    for r in results:
        if r["workload"] == "concurrency":
            pr("[3] concurrent first syncs (run_sync per mailbox, one Dovecot folder each):")
            pr("    mailboxes  NOTIFY  messages  seconds    msg/s  commit p50 ms  p99 ms")
            for row in r["rows"]:
                pr(f"    {row['mailboxes']:>9}  {'on' if row['notify'] else 'off':>6}  "
                   f"{row['messages']:>8}  {row['seconds']:>7}  {row['msgs_per_s']:>7}  "
                   f"{row['commit_ms']['p50']:>13}  {row['commit_ms']['p99']:>6}")
            continue
        if r["workload"] == "import_throughput":
            c, s, i, rp, cm = r["corpus"], r["sync"], r["imap_only"], r["replay"], r["commit"]
            st = cm["settings"]
            pr(f"postgres: fsync={st['fsync']} synchronous_commit={st['synchronous_commit']} "
               f"wal_sync_method={st['wal_sync_method']} "
               f"full_page_writes={st['full_page_writes']} "
               f"default_toast_compression={st['default_toast_compression']} "
               "(mail_archive.raw: lz4, migration 0015)")
            pr(f"[1] first sync: {c['messages']:,} messages, {c['min_kb']}-{c['max_kb']} KB "
               f"uniform (mean {c['mean_kb']} KB, {c['bytes'] / 1e6:.1f} MB; {c['padded']} "
               f"padded, {c['trimmed']} trimmed; built {r['build_s']} s, MULTIAPPEND "
               f"{r['append_s']} s)")
            ok = s["msgs_per_s"] >= TARGET_RATE and s["archived"] == c["messages"]
            pr(f"    run_sync (plain IMAP, in_flight={r['in_flight']}, 1 commit/message): "
               f"{s['archived']:,} in {s['seconds']} s = {s['msgs_per_s']} msg/s, "
               f"{s['mb_per_s']} MB/s   {'PASS' if ok else 'MISS'} (>= {TARGET_RATE:.0f})")
            sock = r.get("sync_socket")
            if sock is not None:
                ok_sock = sock["msgs_per_s"] >= TARGET_RATE and sock["archived"] == c["messages"]
                pr(f"    the same over the server's Unix socket (same host, no TCP): "
                   f"{sock['archived']:,} in {sock['seconds']} s = {sock['msgs_per_s']} msg/s "
                   f"({sock['msgs_per_s'] / s['msgs_per_s']:.2f} x TCP)   "
                   f"{'PASS' if ok_sock else 'MISS'} (>= {TARGET_RATE:.0f})")
            one = r["sync_one"]
            pr(f"    the same, one message at a time (in_flight=1, as before 0026): "
               f"{one['archived']:,} in {one['seconds']} s = {one['msgs_per_s']} msg/s; "
               f"two in flight / one: {s['msgs_per_s'] / one['msgs_per_s']:.2f} x")
            cpu = s["cpu"]
            pr(f"    CPU during the sync: this process {cpu['client_s']} s, postgres "
               f"{cpu.get('postgres_s')} s, dovecot {cpu.get('dovecot_s')} s "
               f"(wall {s['seconds']} s, 2 cores)")
            wall = s["seconds"]
            rest = wall - i["seconds"] - rp["seconds"]
            pr("    what bounds it (share of the sync's wall time; the sync streams, storing "
               "each message while the next ones arrive):")
            pr(f"      a. IMAP only      {i['seconds']:7.2f} s  {i['seconds'] / wall:5.2f} x  "
               f"({i['msgs_per_s']} msg/s: body fetch {i['fetch_s']} s, parse_fetch "
               f"{i['parse_s']} s, size probes {i['probe_s']} s, login {i['login_s']} s)")
            pr(f"      b. Postgres only  {rp['seconds']:7.2f} s  {rp['seconds'] / wall:5.2f} x  "
               f"({rp['msgs_per_s']} msg/s: import_message p50 {rp['call_ms']['p50']} ms, "
               f"p99 {rp['call_ms']['p99']} ms; CPU client {rp['client_cpu_s']} s, "
               f"postgres {rp['postgres_cpu_s']} s)")
            pr(f"      remainder         {rest:7.2f} s  {rest / wall:5.2f} x  (a + b = "
               f"{(i['seconds'] + rp['seconds']) / wall:.2f} x)")
            n = s["archived"]
            sel, ins = cm["select1_ms"], cm["insert_16b_commit_ms"]
            pr(f"      commit floors (one connection, {sel['n']} statements each, p50/mean ms): "
               f"SELECT 1 {sel['p50']}/{sel['mean']}, INSERT 16 B + commit "
               f"{ins['p50']}/{ins['mean']}; INSERT one body + commit:")
            pr("        " + ", ".join(
                f"{k.removeprefix('insert_body_').removesuffix('_ms')} "
                f"{cm[k]['p50']}/{cm[k]['mean']}" for k in cm if k.startswith("insert_body_")))
            # The archive's raw column is lz4 (migration 0015): that is the floor.
            body = cm["insert_body_lz4_commit_ms"]
            pr(f"        x {n:,} messages: round trips alone {n * sel['mean'] / 1000:.2f} s "
               f"({n * sel['mean'] / 1000 / wall:.2f} x), one lz4 body per commit "
               f"{n * body['mean'] / 1000:.2f} s ({n * body['mean'] / 1000 / wall:.2f} x)")
            fresh = cm["fresh_connection_ms"]
            pr("      a new Postgres connection (what every sync run opens; p50 ms): connect "
               f"{fresh['connect']['p50']}, begin {fresh['begin first']['p50']} (warm "
               f"{fresh['begin warm']['p50']}), import_message "
               f"{fresh['import_message first']['p50']} (warm "
               f"{fresh['import_message warm']['p50']}), close {fresh['close']['p50']}")
            per = 1000 / n
            pg_s, dc_s = cpu.get("postgres_s") or 0.0, cpu.get("dovecot_s") or 0.0
            other = wall - cpu["client_s"] - pg_s - dc_s
            pr(f"      per message: wall {wall * per:.2f} ms = CPU of this process "
               f"{cpu['client_s'] * per:.2f} + postgres {pg_s * per:.2f} + dovecot "
               f"{dc_s * per:.2f} + none of them {other * per:.2f} (WAL flush waits, "
               "wake-ups)")
            if "profile" in r:
                p = r["profile"]
                pr(f"      c. cProfile of a {p['messages']:,}-message sync ({p['msgs_per_s']} "
                   f"msg/s under the profiler), self time by package: " + ", ".join(
                       f"{k} {v:.0%}" for k, v in p["self_by_package"].items()))
                for row in p["top_self"]:
                    pr(f"         {row['share']:5.1%} {row['self_s']:7.3f} s "
                       f"{row['calls']:>8} {row['function'][:90]}")
        else:
            lat, comp = r["latency_ms"], r["components_ms"]
            ok = lat["p50"] <= TARGET_P50_MS and lat["p99"] <= TARGET_P99_MS
            pace = (f"the next {r['interval_s'] * 1000:.0f} ms after the previous one was "
                    "found" if r["closed_loop"] else
                    f"one every {r['interval_s'] * 1000:.0f} ms, not waiting")
            pr(f"[2] arrival -> searchable: {r['n']} single APPENDs (after {r['warmup']} "
               f"warm-up; {pace}: {r['append_rate_per_s']}/s), IDLE, Postgres search")
            pr(f"    APPEND -> search hit, ms: p50 {lat['p50']}  p90 {lat['p90']}  p99 "
               f"{lat['p99']}  max {lat['max']}   {'PASS' if ok else 'MISS'} (p50 <= "
               f"{TARGET_P50_MS:.0f}, p99 <= {TARGET_P99_MS:.0f})")
            push = comp.get("push_to_hit")
            if push:
                pr(f"    IDLE push -> search hit (the importer + indexer alone), ms: p50 "
                   f"{push['p50']}  p90 {push['p90']}  p99 {push['p99']}  max {push['max']}")
            pr("    components (ms)                p50     p90     p99     max")
            for name, d in comp.items():
                if d:
                    pr(f"      {name:<27} {d['p50']:7.1f} {d['p90']:7.1f} {d['p99']:7.1f} "
                       f"{d['max']:7.1f}")
            steps = r["run_steps_ms"]
            if steps:
                pr("    inside a sync run (p50 ms, sums per run): " + ", ".join(
                    f"{k} {d['p50']}" for k, d in sorted(steps.items(),
                                                         key=lambda kv: -kv[1]["p50"]) if d))
            pr(f"    {r['sync_runs']} sync runs, {r['measured_per_run']} measured messages per "
               f"run; {r['searches_per_message']} searches per message. Dovecot announces "
               "changes to IDLE 500 ms after the first one it sees (NOTIFY_DELAY_MSECS, "
               "fixed in src/lib-storage/mailbox-watch.c)")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--dsn", default=os.environ.get(
        "NEXARCH_BENCH_DATABASE_URL", "postgresql://postgres@127.0.0.1:5432/postgres"))
    parser.add_argument("--embedded", action="store_true",
                        help="start a durable throwaway Postgres (pgserver) instead of --dsn")
    parser.add_argument("--quick", action="store_true",
                        help="2,000 messages, 50 arrivals, 300-message profile")
    parser.add_argument("--only", default="throughput,searchable")
    parser.add_argument("--count", type=int, default=None, help="messages of part 1")
    parser.add_argument("--in-flight", type=int, default=ImportLimits().in_flight,
                        help="ImportLimits.in_flight of part 1's timed sync")
    parser.add_argument("--no-socket", dest="socket", action="store_false",
                        help="part 1: no second sync over the server's Unix socket (run "
                             "when the server is on this host and reached by TCP)")
    parser.add_argument("--arrivals", type=int, default=None, help="measured APPENDs of part 2")
    parser.add_argument("--interval", type=float, default=0.15,
                        help="part 2: seconds from one APPEND's start to the next")
    parser.add_argument("--closed-loop", action="store_true",
                        help="part 2: APPEND the next message only once the previous one "
                             "was found (then --interval later)")
    parser.add_argument("--profile-count", type=int, default=None,
                        help="messages of the profiled sync (0: no profile)")
    parser.add_argument("--floor-count", type=int, default=1000,
                        help="statements per commit-floor loop")
    parser.add_argument("--concurrency", default="1,4,16,64",
                        help="part 3: mailbox counts to sync at once")
    parser.add_argument("--concurrency-total", type=int, default=1280,
                        help="part 3: messages per configuration, split over its mailboxes")
    parser.add_argument("--out", default=str(ROOT / "bench" / "results" / time.strftime(
        "import-%Y%m%dT%H%M%SZ.json", time.gmtime())))
    args = parser.parse_args()
    logging.basicConfig(level=logging.WARNING, format="%(levelname)s %(name)s: %(message)s")
    only = set(args.only.split(","))
    count = args.count or (2000 if args.quick else 10_000)
    arrivals = args.arrivals or (50 if args.quick else 200)
    profile_count = args.profile_count if args.profile_count is not None else (
        300 if args.quick else 1000)

    with contextlib.ExitStack() as stack:
        dsn = args.dsn
        if args.embedded:
            from nexarch_events.db.embedded import EmbeddedPostgres

            folder = tempfile.mkdtemp(prefix="nexarch-import-bench-")
            stack.callback(shutil.rmtree, folder, ignore_errors=True)
            server = stack.enter_context(EmbeddedPostgres(Path(folder) / "data", durable=True))
            dsn = server.url()
        made: list[str] = []

        def fresh_db() -> str:
            name = f"nexarch_bench_{uuid.uuid4().hex[:8]}"
            execute_sync(dsn, [f'CREATE DATABASE "{name}"'])
            made.append(name)
            url = with_db(dsn, name)

            async def go() -> None:
                async with Database.open(url, max_size=1) as db:
                    await migrate(db)

            aio_run(go)
            return url

        def drop_all() -> None:
            for name in made:
                execute_sync(dsn, [f'DROP DATABASE IF EXISTS "{name}" WITH (FORCE)'])

        stack.callback(drop_all)

        async def server_version() -> str:
            async with Database.open(dsn, max_size=1) as db:
                return str(await db.fetchval("SELECT version()")).split(" on ")[0]

        meta: dict[str, Any] = {"run": uuid.uuid4().hex[:6],
                                "started": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()),
                                "cpus": os.cpu_count(), "server": aio_run(server_version),
                                "quick": args.quick, "python": platform.python_version()}
        results: list[dict[str, Any]] = []
        corpus: list[bytes] = []
        corpus_info: dict[str, Any] = {}
        build_s = 0.0
        if "throughput" in only:
            pr(f"building {count:,} messages ...")
            t = time.perf_counter()
            corpus, corpus_info = sized_corpus(count, seed=5)
            build_s = time.perf_counter() - t
        dovecot = stack.enter_context(running_dovecot())
        pr(f"dovecot {dovecot.host}:{dovecot.port} (pid {dovecot.pid}); "
           f"postgres {dsn.rsplit('@', 1)[-1]}")
        if "throughput" in only:
            dovecot.create_mailbox(USER, "Bench")
            t = time.perf_counter()
            dovecot.append_many(USER, "Bench", corpus)
            append_s = time.perf_counter() - t
            profile_folder = None
            if profile_count:
                profile_folder = "Profile"
                dovecot.create_mailbox(USER, profile_folder)
                dovecot.append_many(USER, profile_folder, corpus[:profile_count])
            del corpus
            pr(f"appended {count:,} messages in {append_s:.1f} s; part 1 ...")
            urls = {"sync": fresh_db(), "sync_one": fresh_db(), "replay": fresh_db()}
            if args.socket and over_socket(dsn) is not None:
                urls["sync_socket"] = str(over_socket(fresh_db()))
            if profile_folder:
                urls["profile"] = fresh_db()
            result = aio_run(part1, urls, dovecot, "Bench", profile_folder, args.floor_count,
                             args.in_flight)
            result.update(corpus=corpus_info, build_s=round(build_s, 1),
                          append_s=round(append_s, 1))
            results.append(result)
        if "searchable" in only:
            initial = 20 if args.quick else 50
            dovecot.create_mailbox(USER, "Arrivals")
            dovecot.append_many(USER, "Arrivals", (crlf(m) for m in realistic_messages(
                initial, seed=21, start=ARRIVAL_START // 2)))
            pr("part 2 ...")
            results.append(aio_run(part2, fresh_db(), dovecot, "Arrivals", initial, arrivals,
                                   10, args.interval, args.closed_loop))

        if "concurrency" in only:
            counts = [int(c) for c in args.concurrency.split(",")]
            folders: dict[int, list[str]] = {}
            per: dict[int, int] = {}
            seed = 40
            t = time.perf_counter()
            for n in counts:
                per[n] = max(1, args.concurrency_total // n)
                folders[n] = [f"Conc{n}x{i}" for i in range(n)]
                for folder in folders[n]:
                    dovecot.create_mailbox(USER, folder)
                    seed += 1
                    dovecot.append_many(USER, folder, (crlf(m) for m in realistic_messages(
                        per[n], seed=seed)))
            pr(f"part 3: appended to {sum(counts)} folders in {time.perf_counter() - t:.1f} s")
            urls3: dict[tuple[int, bool], str] = {}
            for n in counts:
                for notify in (True, False):
                    url = fresh_db()
                    if not notify:
                        name = url.rsplit("/", 1)[-1].split("?")[0]
                        execute_sync(url, [
                            "CREATE FUNCTION public.pg_notify(text, text) RETURNS void "
                            "LANGUAGE plpgsql AS $$BEGIN END$$",
                            f'ALTER DATABASE "{name}" SET search_path = public, pg_catalog'])
                    urls3[(n, notify)] = url
            results.append(aio_run(part3, urls3, dovecot, folders, per))

    print_report(meta, results)
    Path(args.out).parent.mkdir(parents=True, exist_ok=True)
    with open(args.out, "w") as out:
        json.dump({**meta, "results": results}, out, indent=1)
    pr(f"results: {args.out}")


if __name__ == "__main__":
    main()
