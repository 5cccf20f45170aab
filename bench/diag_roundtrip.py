#!/usr/bin/env python
"""Diagnostic: what one ``SELECT 1`` costs on each layer the package uses.

    .venv/bin/python bench/diag_roundtrip.py [--dsn URL] [--count 3000]

Prints p50/p99 (ms) of ``SELECT 1`` through, in this order:
  asyncio      raw asyncpg Connection.fetchval
  asyncio      asyncpg Pool.fetchval (acquire + query + release; release
               runs the pool's reset query: a second round trip)
  asyncio      asyncpg Pool.fetchval with reset=<no-op> (no reset query)
  trio-asyncio aio_as_trio(Connection.fetchval)
  trio-asyncio aio_as_trio(Pool.fetchval)
  trio-asyncio nexarch_events.aio.Database.fetchval (what the queue uses)
The two asyncio loops run in separate processes; the sections alternate
``--rounds`` times so that machine noise hits all of them alike.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import math
import os
import subprocess
import sys
import time
from collections.abc import Awaitable, Callable
from typing import Any

import asyncpg

DEFAULT_DSN = os.environ.get("NEXARCH_BENCH_DATABASE_URL",
                             "postgresql://postgres@127.0.0.1:5432/postgres")


def pct(values: list[float], q: float) -> float:
    ordered = sorted(values)
    return ordered[max(1, math.ceil(q * len(ordered))) - 1]


async def _noop_reset(_conn: Any) -> None:
    return None


async def _time(fn: Callable[[], Awaitable[Any]], count: int) -> list[float]:
    for _ in range(200):
        await fn()
    out = []
    cpu0 = time.process_time()
    for _ in range(count):
        t0 = time.perf_counter()
        await fn()
        out.append((time.perf_counter() - t0) * 1000)
    # Last element: this process's CPU ms per call (kept apart by the caller).
    out.append((time.process_time() - cpu0) * 1000 / count)
    return out


def side_asyncio(dsn: str, count: int) -> dict[str, list[float]]:
    async def main() -> dict[str, list[float]]:
        conn = await asyncpg.connect(dsn)
        pool = await asyncpg.create_pool(dsn, min_size=1, max_size=1)
        pool_nr = await asyncpg.create_pool(dsn, min_size=1, max_size=1, reset=_noop_reset)
        res = {
            "asyncio Connection.fetchval": await _time(lambda: conn.fetchval("SELECT 1"), count),
            "asyncio Pool.fetchval": await _time(lambda: pool.fetchval("SELECT 1"), count),
            "asyncio Pool.fetchval, reset=no-op": await _time(
                lambda: pool_nr.fetchval("SELECT 1"), count),
        }
        await conn.close()
        await pool.close()
        await pool_nr.close()
        return res
    return asyncio.run(main())


def side_trio(dsn: str, count: int) -> dict[str, list[float]]:
    import trio_asyncio

    from nexarch_events.aio import Database, run

    async def main() -> dict[str, list[float]]:
        conn = await trio_asyncio.aio_as_trio(asyncpg.connect)(dsn)
        pool = await trio_asyncio.aio_as_trio(asyncpg.create_pool)(dsn, min_size=1, max_size=1)
        res = {
            "trio-asyncio aio_as_trio(Connection.fetchval)": await _time(
                lambda: trio_asyncio.aio_as_trio(conn.fetchval)("SELECT 1"), count),
            "trio-asyncio aio_as_trio(Pool.fetchval)": await _time(
                lambda: trio_asyncio.aio_as_trio(pool.fetchval)("SELECT 1"), count),
        }
        async with Database.open(dsn, max_size=1) as db:
            res["trio-asyncio Database.fetchval (package)"] = await _time(
                lambda: db.fetchval("SELECT 1"), count)
        await trio_asyncio.aio_as_trio(conn.close)()
        await trio_asyncio.aio_as_trio(pool.close)()
        return res
    return run(main)


def main() -> int:
    p = argparse.ArgumentParser()
    p.add_argument("--dsn", default=DEFAULT_DSN)
    p.add_argument("--count", type=int, default=3000)
    p.add_argument("--rounds", type=int, default=2)
    p.add_argument("--side", choices=["asyncio", "trio"])
    a = p.parse_args()
    if a.side:
        fn = side_asyncio if a.side == "asyncio" else side_trio
        print(json.dumps(fn(a.dsn, a.count)))
        return 0
    pooled: dict[str, list[float]] = {}
    cpu: dict[str, list[float]] = {}
    for _ in range(a.rounds):
        for side in ("asyncio", "trio"):
            out = subprocess.run([sys.executable, __file__, "--side", side, "--dsn", a.dsn,
                                  "--count", str(a.count)], check=True, capture_output=True,
                                 text=True).stdout
            for k, v in json.loads(out).items():
                pooled.setdefault(k, []).extend(v[:-1])
                cpu.setdefault(k, []).append(v[-1])
    print(f"{'SELECT 1 through':48s} {'n':>6s} {'p50 ms':>8s} {'p99 ms':>8s} "
          f"{'client CPU ms/call':>19s}")
    for k, v in pooled.items():
        print(f"{k:48s} {len(v):6d} {pct(v, 0.5):8.3f} {pct(v, 0.99):8.3f} "
              f"{sum(cpu[k]) / len(cpu[k]):19.3f}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
