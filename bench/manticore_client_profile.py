#!/usr/bin/env python
"""Where a worker's time goes when it indexes into Manticore (issue 12: the
Manticore indexing target is >= 3,000 docs/s with 2 worker processes, and
Manticore itself was far from its limit, so the bound is on our side).

    .venv/bin/python bench/manticore_client_profile.py [--dsn URL] [--count 2000]

No Manticore runs here, so the server is taken out of the measurement: the
backend's HTTP transport answers every /bulk at once with Manticore's
success body (httpx.MockTransport, in this process). What is left is
exactly the worker's own work per batch, on real Postgres: loading the
archived bytes, MIME parsing, building the documents, JSON encoding, the
httpx request. Printed: client CPU per document (so the bound this puts on
N processes), and a cProfile of the same run grouped by stage.

Messages: tests/support/mailgen.py realistic_messages (2-50 KB, some with
attachments), archived into a fresh database first (not timed).
"""

from __future__ import annotations

import argparse
import cProfile
import json
import os
import pstats
import secrets
import sys
import time
import uuid
from collections import defaultdict
from datetime import UTC, datetime
from pathlib import Path

import httpx

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from nexarch_events.aio import Database, execute_sync  # noqa: E402
from nexarch_events.aio import run as aio_run  # noqa: E402
from nexarch_events.db.migrations import migrate  # noqa: E402
from nexarch_events.index.manticore import ManticoreBackend  # noqa: E402
from nexarch_events.mail import indexer as indexer_module  # noqa: E402
from nexarch_events.mail.archive import Archive  # noqa: E402
from nexarch_events.mail.indexer import Indexer  # noqa: E402
from nexarch_events.models import ClaimedJob, JobId, JobType, LeaseToken  # noqa: E402
from tests.support.mailgen import realistic_messages  # noqa: E402

TENANT = "bench"
BATCH = 100
#: Which stage a profiled function's time belongs to (first match of its file).
STAGES = (
    ("mime parsing", ("nexarch_events/mail/mime", "/email/", "html/", "quopri", "base64",
                      "codecs", "encodings/")),
    ("JSON + request building", ("nexarch_events/index", "json/")),
    ("httpx", ("httpx", "httpcore", "anyio", "h11")),
    ("archive load (asyncpg, lz4)",
     ("asyncpg", "nexarch_events/mail/archive", "nexarch_events/aio")),
    ("trio / trio-asyncio", ("trio",)),
)


def bulk_ok(request: httpx.Request) -> httpx.Response:
    """Manticore's /bulk success body (mail-notes 6): one aggregated item."""
    lines = request.content.count(b"\n")
    return httpx.Response(200, json={
        "items": [{"bulk": {"table": f"nexarch_mail_{TENANT}", "_id": 1, "created": lines,
                            "deleted": 0, "updated": 0, "result": "created", "status": 201}}],
        "current_line": lines + 1, "skipped_lines": 0, "errors": False, "error": ""})


def stage_of(filename: str) -> str:
    for stage, needles in STAGES:
        if any(needle in filename for needle in needles):
            return stage
    return "other"


async def main(args: argparse.Namespace, url: str) -> None:
    async with Database.open(url, max_size=2) as db:
        await migrate(db)
        archive = Archive(db)
        ids = []
        for raw in realistic_messages(args.count, seed=7):
            ids.append((await archive.store(TENANT, raw)).archive_id)
        backend = ManticoreBackend("http://manticore.invalid:9308", timeout=30.0,
                                   transport=httpx.MockTransport(bulk_ok))
        async with backend:
            indexer = Indexer(db, backend)
            indexer._schemas.add(TENANT)  # no schema requests: /bulk only
            now = datetime.now(UTC)
            jobs = [ClaimedJob(JobId(n + 1), JobType.INDEX, TENANT, str(archive_id), {}, 1, 5,
                               LeaseToken(uuid.uuid4()), now)
                    for n, archive_id in enumerate(ids)]
            batches = [jobs[i:i + BATCH] for i in range(0, len(jobs), BATCH)]
            await indexer.index_batch(batches[0])  # warm-up
            cpu0, wall0 = time.process_time(), time.perf_counter()
            for batch in batches:
                failures = await indexer.index_batch(batch)
                assert not failures, failures
            cpu, wall = time.process_time() - cpu0, time.perf_counter() - wall0
            # Parse on this thread in the profiled pass (the indexer hands big
            # batches to a worker thread, which cProfile does not see).
            inline, indexer_module.INLINE_PARSE_BYTES = indexer_module.INLINE_PARSE_BYTES, 2**62
            profile = cProfile.Profile()
            profile.enable()
            for batch in batches:
                await indexer.index_batch(batch)
            profile.disable()
            indexer_module.INLINE_PARSE_BYTES = inline
    per_doc = 1000 * cpu / len(jobs)
    print(f"{len(jobs)} documents in batches of {BATCH}, Manticore answered in-process:")
    print(f"  client CPU {per_doc:.3f} ms/doc ({len(jobs) / wall:.0f} docs/s wall in one "
          f"process); the bound this alone puts on 2 processes on 2 cores: "
          f"{2000 / per_doc:.0f} docs/s (target 3,000, before Manticore's own CPU)")
    stats = pstats.Stats(profile)
    by_stage: dict[str, float] = defaultdict(float)
    total = 0.0
    for (filename, _, _), (_, _, tottime, _, _) in stats.stats.items():  # type: ignore[attr-defined]
        by_stage[stage_of(filename)] += tottime
        total += tottime
    print("  self time by stage (cProfile, second pass):")
    for stage, seconds in sorted(by_stage.items(), key=lambda item: -item[1]):
        print(f"    {stage:<30} {100 * seconds / total:5.1f} %")
    if args.top:
        stats.sort_stats("tottime").print_stats(args.top)
    print(json.dumps({"docs": len(jobs), "client_ms_per_doc": round(per_doc, 3),
                      "stages": {k: round(v / total, 3) for k, v in by_stage.items()}}))


def cli() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--dsn", default=os.environ.get(
        "NEXARCH_BENCH_DATABASE_URL", "postgresql://postgres@127.0.0.1:5432/postgres"))
    parser.add_argument("--count", type=int, default=2000)
    parser.add_argument("--top", type=int, default=0, help="also print the top N functions")
    args = parser.parse_args()
    name = f"nexarch_mprof_{secrets.token_hex(4)}"
    base = args.dsn.rsplit("/", 1)[0]
    execute_sync(args.dsn, [f"CREATE DATABASE {name}"])
    try:
        aio_run(main, args, f"{base}/{name}")
    finally:
        execute_sync(args.dsn, [f"DROP DATABASE IF EXISTS {name} WITH (FORCE)"])


if __name__ == "__main__":
    cli()
