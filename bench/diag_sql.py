#!/usr/bin/env python
"""Diagnostic: the SQL alone, ours against the raw floor's, from plain asyncio
+ asyncpg on one connection (no trio, no pool, no worker process).

    .venv/bin/python bench/diag_sql.py [--dsn URL] [--single 1000] [--drain 20000]

single: per job, enqueue one, then time the claim and the ack/done (the table
        holds only that one ready job, as in the wake workload)
drain:  enqueue --drain jobs in one statement, then claim+ack 100 at a time
        until empty; ours twice: with the statistics a fresh table has (none)
        and after ANALYZE (the claim's plan differs: see the report)
Each part runs in a fresh database, dropped afterwards.
"""

from __future__ import annotations

import argparse
import asyncio
import math
import os
import secrets
import sys
import time
from pathlib import Path

import asyncpg

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO))

from bench.queue_bench import (  # noqa: E402
    DEFAULT_DSN,
    RAW_CLAIM_1,
    RAW_CLAIM_N,
    RAW_DONE_1,
    RAW_DONE_N,
    RAW_ENQUEUE,
    RAW_ENQUEUE_BULK,
    RAW_SCHEMA,
    db_url,
)


def pct(values: list[float], q: float) -> float:
    ordered = sorted(values)
    return ordered[max(1, math.ceil(q * len(ordered))) - 1]


def ours_sql() -> dict[str, str]:
    from nexarch_events.db import sqlfiles

    return sqlfiles.queries("queue.sql")


async def fresh(admin: asyncpg.Connection, dsn: str, system: str) -> tuple[str, str]:
    name = f"nxbench_sql_{secrets.token_hex(3)}"
    await admin.execute(f'CREATE DATABASE "{name}"')
    url = db_url(dsn, name)
    conn = await asyncpg.connect(url)
    try:
        if system == "floor":
            await conn.execute(RAW_SCHEMA)
        else:
            from nexarch_events.db import sqlfiles

            for _, _, sql in sqlfiles.migrations():
                await conn.execute(sql)
    finally:
        await conn.close()
    return name, url


async def single(url: str, system: str, n: int) -> dict[str, list[float]]:
    q = ours_sql()
    conn = await asyncpg.connect(url)
    out: dict[str, list[float]] = {"enqueue": [], "claim": [], "ack": []}
    for i in range(n + 50):
        t0 = time.perf_counter()
        if system == "floor":
            await conn.fetchrow(RAW_ENQUEUE)
            t1 = time.perf_counter()
            rows = await conn.fetch(RAW_CLAIM_1)
            t2 = time.perf_counter()
            await conn.execute(RAW_DONE_1, rows[0]["id"])
        else:
            await conn.fetchrow(q["enqueue"], ["index"], ["bench"], [f"m-{i}"], ["{}"], [5],
                                [0.0])
            t1 = time.perf_counter()
            rows = await conn.fetch(q["claim"], 100, "w")
            t2 = time.perf_counter()
            await conn.fetch(q["ack"], [r["id"] for r in rows], [r["lease"] for r in rows],
                             [None], [False], 10.0, 10)
        t3 = time.perf_counter()
        assert len(rows) == 1
        if i >= 50:
            out["enqueue"].append((t1 - t0) * 1000)
            out["claim"].append((t2 - t1) * 1000)
            out["ack"].append((t3 - t2) * 1000)
    await conn.close()
    return out


async def drain(url: str, system: str, n: int, analyze: bool) -> tuple[float, list[float],
                                                                       list[float]]:
    q = ours_sql()
    conn = await asyncpg.connect(url)
    if system == "floor":
        await conn.fetchrow(RAW_ENQUEUE_BULK, n)
    else:
        await conn.execute(
            "INSERT INTO mail_index_jobs (job_type, tenant_slug, message_id) "
            "SELECT 'index', 'bench', 'm-' || g FROM generate_series(1, $1) g", n)
    if analyze:
        await conn.execute("ANALYZE")
    claims, acks = [], []
    t_start = time.perf_counter()
    while True:
        t0 = time.perf_counter()
        if system == "floor":
            rows = await conn.fetch(RAW_CLAIM_N, 100)
        else:
            rows = await conn.fetch(q["claim"], 100, "w")
        t1 = time.perf_counter()
        if not rows:
            break
        if system == "floor":
            await conn.execute(RAW_DONE_N, [r["id"] for r in rows])
        else:
            await conn.fetch(q["ack"], [r["id"] for r in rows], [r["lease"] for r in rows],
                             [None] * len(rows), [False] * len(rows), 10.0, 10)
        t2 = time.perf_counter()
        claims.append((t1 - t0) * 1000)
        acks.append((t2 - t1) * 1000)
    total = time.perf_counter() - t_start
    await conn.close()
    return n / total, claims, acks


async def main() -> None:
    p = argparse.ArgumentParser()
    p.add_argument("--dsn", default=os.environ.get("NEXARCH_BENCH_DATABASE_URL", DEFAULT_DSN))
    p.add_argument("--single", type=int, default=1000)
    p.add_argument("--drain", type=int, default=20000)
    a = p.parse_args()
    admin = await asyncpg.connect(a.dsn)
    names: list[str] = []
    try:
        print(f"single job at a time, {a.single} jobs (ms: p50 / p99)")
        for system in ("floor", "ours"):
            name, url = await fresh(admin, a.dsn, system)
            names.append(name)
            res = await single(url, system, a.single)
            print(f"  {system:5s} " + "   ".join(
                f"{k} {pct(v, .5):.3f} / {pct(v, .99):.3f}" for k, v in res.items()))
        print(f"drain {a.drain} jobs, 100 per claim, one connection (ms per statement: p50)")
        for system, analyze in (("floor", False), ("ours", False), ("ours", True)):
            name, url = await fresh(admin, a.dsn, system)
            names.append(name)
            jps, claims, acks = await drain(url, system, a.drain, analyze)
            label = f"{system} ({'ANALYZE first' if analyze else 'no statistics'})"
            print(f"  {label:26s} {jps:8,.0f} jobs/s   claim p50 {pct(claims, .5):6.2f}"
                  f"  first 3 claims {[round(c, 1) for c in claims[:3]]}"
                  f"   ack/done p50 {pct(acks, .5):6.2f}")
    finally:
        for name in names:
            await admin.execute(f'DROP DATABASE IF EXISTS "{name}" WITH (FORCE)')
        await admin.close()


if __name__ == "__main__":
    asyncio.run(main())
