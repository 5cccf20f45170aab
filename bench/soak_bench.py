#!/usr/bin/env python
"""Soak benchmark: many jobs through the queue with short retention, to show
that the job table stops growing and claims do not slow down.

    .venv/bin/python bench/soak_bench.py --jobs 1000000 --retain 180

A fresh database (dropped afterwards unless --keep-db); one real
``nexarch-events worker`` process with no-op handlers and
``NEXARCH_QUEUE_RETAIN_SUCCEEDED/FAILED=--retain``; a producer here that keeps
about ``--backlog`` jobs ready (so the workers never wait for work) by
enqueuing ``--chunk`` jobs per statement with the package's own enqueue SQL.
Every ``--window`` finished jobs it prints one line: the window's throughput
(finished jobs/s, i.e. claim throughput: the workers are never idle), the
rows in the table, heap and index sizes, dead tuples. At the end: the last
window's throughput against the first one's (target >= 0.90), and the table
size over the second half of the run against the first half's peak.
Results go to bench/results/soak-<UTC time>.jsonl as well.
"""

from __future__ import annotations

import argparse
import asyncio
import datetime as dt
import json
import os
import secrets
import signal
import subprocess
import sys
import time
from pathlib import Path
from urllib.parse import urlsplit, urlunsplit

import asyncpg

REPO = Path(__file__).resolve().parent.parent
DEFAULT_DSN = "postgresql://postgres@127.0.0.1:5432/postgres"

SIZES = """
SELECT (SELECT count(*) FROM mail_index_jobs) AS rows,
       pg_relation_size('mail_index_jobs') AS heap,
       pg_indexes_size('mail_index_jobs') AS indexes,
       pg_total_relation_size('mail_index_jobs') AS total,
       (SELECT n_dead_tup FROM pg_stat_user_tables WHERE relname = 'mail_index_jobs') AS dead
"""
OPEN_JOBS = "SELECT count(*) FROM mail_index_jobs WHERE status IN ('pending', 'processing')"


def db_url(dsn: str, database: str) -> str:
    return urlunsplit(urlsplit(dsn)._replace(path="/" + database))


def mb(n: int) -> str:
    return f"{n / 1048576:.1f}"


async def soak(args: argparse.Namespace) -> int:
    sys.path.insert(0, str(REPO))
    from nexarch_events.db import sqlfiles

    enqueue_sql = sqlfiles.queries("queue.sql")["enqueue"]
    name = f"nexarch_soak_{secrets.token_hex(4)}"
    admin = await asyncpg.connect(args.dsn)
    autovacuum = await admin.fetchval("SHOW autovacuum")
    await admin.execute(f'CREATE DATABASE "{name}"')
    url = db_url(args.dsn, name)
    env = {k: v for k, v in os.environ.items() if not k.startswith("NEXARCH_")}
    env.update({"NEXARCH_DATABASE_URL": url, "PYTHONPATH": str(REPO),
                "NEXARCH_QUEUE_RETAIN_SUCCEEDED": str(args.retain),
                "NEXARCH_QUEUE_RETAIN_FAILED": str(args.retain)})
    subprocess.run([sys.executable, "-m", "nexarch_events", "migrate"], env=env, check=True,  # noqa: ASYNC221 - set-up, nothing else runs yet
                   capture_output=True)
    log = open(Path(args.log), "w", encoding="utf-8")
    worker = subprocess.Popen(  # noqa: ASYNC220 - returns at once
        [sys.executable, "-m", "nexarch_events", "--log-level", "warning", "worker",
         "--handlers", "bench.handlers:NOOP", "--workers", str(args.workers),
         "--batch-size", str(args.batch)], env=env, cwd=REPO, stdout=log, stderr=log)
    conn = await asyncpg.connect(url)
    out_path = REPO / "bench" / "results" / \
        f"soak-{dt.datetime.now(dt.UTC).strftime('%Y%m%dT%H%M%SZ')}.jsonl"
    out_path.parent.mkdir(parents=True, exist_ok=True)
    windows: list[dict[str, float]] = []
    try:
        # Ready once its LISTEN connection is up: the first window measures work,
        # not the worker's start-up.
        while not await conn.fetchval("SELECT count(*) FROM pg_stat_activity WHERE "
                                      "application_name LIKE 'nexarch-events/listener/%' "
                                      "AND datname = current_database()"):
            if worker.poll() is not None:
                raise RuntimeError(f"the worker exited with {worker.returncode}; see {args.log}")
            await asyncio.sleep(0.1)
        enqueued = 0
        started = time.monotonic()
        window_start, window_done = started, 0
        print(f"soak: {args.jobs} jobs, retention {args.retain:g} s, {args.workers} workers x "
              f"batch {args.batch}, backlog ~{args.backlog}, window {args.window}, "
              f"server autovacuum={autovacuum}{' (embedded server)' if args.embedded else ''}")
        print(f"{'finished':>10} {'t_s':>7} {'jobs/s':>8} {'rows':>8} {'heap_MB':>8} "
              f"{'index_MB':>8} {'total_MB':>8} {'dead':>8}")
        while True:
            if worker.poll() is not None:
                raise RuntimeError(f"the worker exited with {worker.returncode}; see {args.log}")
            open_jobs = int(await conn.fetchval(OPEN_JOBS))
            done = enqueued - open_jobs
            while done - window_done >= args.window or (enqueued == args.jobs and open_jobs == 0
                                                         and done > window_done):
                now = time.monotonic()
                row = await conn.fetchrow(SIZES)
                finished = min(done, window_done + args.window)
                rate = (done - window_done) / (now - window_start)
                window = {"finished": finished, "t_s": now - started, "jobs_per_s": rate,
                          "rows": row["rows"], "heap": row["heap"], "indexes": row["indexes"],
                          "total": row["total"], "dead": row["dead"] or 0}
                windows.append(window)
                print(f"{finished:>10} {window['t_s']:>7.0f} {rate:>8.0f} {row['rows']:>8} "
                      f"{mb(row['heap']):>8} {mb(row['indexes']):>8} {mb(row['total']):>8} "
                      f"{window['dead']:>8}", flush=True)
                window_start, window_done = now, done
            if enqueued == args.jobs and open_jobs == 0:
                break
            if enqueued < args.jobs and open_jobs < args.backlog:
                n = min(args.chunk, args.jobs - enqueued)
                base = enqueued
                await conn.execute(
                    enqueue_sql, ["index"] * n, ["soak"] * n,
                    [f"m{base + i}" for i in range(n)], ["{}"] * n, [5] * n, [0.0] * n)
                enqueued += n
            else:
                await asyncio.sleep(0.05)
        last = windows[-1]
        # The last window may be a remainder; compare full windows only.
        full = [w for w in windows if w["finished"] % args.window == 0] or windows
        ratio = full[-1]["jobs_per_s"] / full[0]["jobs_per_s"]
        half = len(windows) // 2
        peak_first = max(w["total"] for w in windows[:max(half, 1)])
        peak_second = max(w["total"] for w in windows[half:])
        summary = {"jobs": args.jobs, "retain_s": args.retain, "seconds": last["t_s"],
                   "throughput_last_over_first": ratio,
                   "table_total_peak_first_half_mb": peak_first / 1048576,
                   "table_total_peak_second_half_mb": peak_second / 1048576}
        print(f"throughput last/first full window: {ratio:.2f} (target >= 0.90); "
              f"table+indexes peak: first half {mb(peak_first)} MB, "
              f"second half {mb(peak_second)} MB; {last['t_s']:.0f} s")
        with open(out_path, "a", encoding="utf-8") as out:
            for window in windows:
                out.write(json.dumps({"kind": "window", **window}) + "\n")
            out.write(json.dumps({"kind": "summary", **summary}) + "\n")
        print(f"results: {out_path}")
        return 0
    finally:
        await conn.close()
        worker.send_signal(signal.SIGTERM)
        try:
            worker.wait(30)
        except subprocess.TimeoutExpired:
            worker.kill()
            worker.wait()
        log.close()
        if not args.keep_db:
            await admin.execute(f'DROP DATABASE IF EXISTS "{name}" WITH (FORCE)')
        await admin.close()


def run_embedded(args: argparse.Namespace) -> int:
    """The whole run against a throwaway embedded Postgres with its default
    settings (autovacuum on), for servers whose autovacuum is off."""
    import shutil
    import tempfile

    sys.path.insert(0, str(REPO))
    from nexarch_events.db.embedded import EmbeddedPostgres

    folder = Path(tempfile.mkdtemp(prefix="nexarch-soak-pg-"))
    folder.chmod(0o711)
    server = EmbeddedPostgres(folder / "data", durable=False)
    server.start()
    try:
        args.dsn = server.url()
        return asyncio.run(soak(args))
    finally:
        server.stop("immediate")
        shutil.rmtree(folder, ignore_errors=True)


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--dsn", default=os.environ.get("NEXARCH_BENCH_DATABASE_URL",
                                                        DEFAULT_DSN))
    parser.add_argument("--jobs", type=int, default=1_000_000)
    parser.add_argument("--window", type=int, default=100_000,
                        help="finished jobs per line (and per throughput sample)")
    parser.add_argument("--retain", type=float, default=180.0,
                        help="seconds finished jobs are kept (both statuses)")
    parser.add_argument("--workers", type=int, default=4)
    parser.add_argument("--batch", type=int, default=100)
    parser.add_argument("--backlog", type=int, default=20_000)
    parser.add_argument("--chunk", type=int, default=1_000)
    parser.add_argument("--log", default="/tmp/nexarch-soak-worker.log")
    parser.add_argument("--keep-db", action="store_true")
    parser.add_argument("--embedded", action="store_true",
                        help="run against a throwaway embedded Postgres (autovacuum on, "
                             "fsync off) instead of --dsn")
    args = parser.parse_args()
    return run_embedded(args) if args.embedded else asyncio.run(soak(args))


if __name__ == "__main__":
    sys.exit(main())
