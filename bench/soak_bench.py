#!/usr/bin/env python
"""Soak benchmark: many jobs through the queue with short retention, to show
that the job table stops growing and claims do not slow down.

    .venv/bin/python bench/soak_bench.py --embedded --jobs 1000000 --retain 180

A fresh database (dropped afterwards unless --keep-db); one real
``nexarch-events worker`` process with no-op handlers and
``NEXARCH_QUEUE_RETAIN_SUCCEEDED/FAILED=--retain``; a producer here that keeps
about ``--backlog`` jobs ready (so the workers never wait for work) by
enqueuing ``--chunk`` jobs per statement with the package's own enqueue SQL.
Every ``--window`` finished jobs it prints one line: the window's throughput
(finished jobs/s, i.e. claim throughput: the workers are never idle), the
rows in the table, heap and index sizes, dead tuples, and the fewest open jobs
the producer saw in the window (``min_open``: near 0 would mean the workers
waited for work). At the end: the throughput of the last ``--window`` jobs
against the first ``--window`` jobs' (target >= 0.90), and the table size
over the second half of the run against the first half's peak. Results go to
bench/results/soak-<UTC time>.jsonl as well. Sizes can level off only once
jobs are pruned, after ``--retain`` seconds: the run must be several times
longer than the retention (about a minute per million jobs here since the
change below, so ``--retain 180`` prunes nothing in a 1,000,000-job run).

What the benchmark itself asks the database while it measures (issue 11: it
used to measure itself): nothing that scans the job table.

- Progress: the producer counts what it enqueued, and finished jobs are
  counted from the queue's own outcome notifications (``nexarch_job_events``,
  ``succeeded``/``failed`` with the job ids, sent by the ack in the
  transaction that finishes the jobs; docs/events.md) on one LISTEN
  connection; open jobs = enqueued - finished. This replaced a poll of
  ``count(*) ... WHERE status IN ('pending', 'processing')``, run up to 20
  times a second: a parallel sequential scan of the whole table (37-58 ms at
  ~320k rows on the 2-core bench machine), which took CPU from the workers
  and grew with the table, i.e. with the very thing under test. A window ends
  at the notification that reached its boundary (the ack's commit plus the
  delivery), not at the poll's next 50 ms tick.
- Sizes, once per window: ``rows~`` is jobs enqueued minus the highest
  pruned id (``mail_index_jobs_pruned``, one row; the prune goes oldest
  first, so this is the rows in the table up to the few jobs below that id
  that finished a moment later and are not pruned yet); heap and index sizes
  are file sizes; ``dead`` is ``n_dead_tup`` from ``pg_stat_user_tables``
  (cumulative statistics: they may lag several seconds); ``vac`` and
  ``autovac`` are the table's ``vacuum_count`` (the service's own vacuums,
  queue/vacuum.py) and ``autovacuum_count`` so far. This replaced a
  ``count(*)`` of the whole table per window.
- The tail: ``--jobs`` are measured, and ``--backlog`` more are enqueued
  behind them and drain untimed, so the producer keeps the backlog full, and
  competes for the CPU, up to the last measured job as in the first window
  (before, the last ~20,000 jobs ran with the producer idle).
- Checks, after the timed part and the drain (they cost nothing that is
  measured): one exact ``count(*)`` of the open jobs (must be 0, and every
  enqueued job must have been announced, else the run fails) and one of all
  rows (printed next to ``rows~``). If no job finishes for ``--stall``
  seconds during the run, one exact count of the open jobs tells a stalled
  worker from a lost notification (the run fails on the latter).
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
from typing import Any
from urllib.parse import urlsplit, urlunsplit

import asyncpg

REPO = Path(__file__).resolve().parent.parent
DEFAULT_DSN = "postgresql://postgres@127.0.0.1:5432/postgres"

# Per window: file sizes, a one-row table and the statistics, no table scan.
# $1: jobs enqueued so far (the producer's own count).
SIZES = """
SELECT $1::bigint - (SELECT max_id FROM mail_index_jobs_pruned) AS rows,
       pg_relation_size('mail_index_jobs') AS heap,
       pg_indexes_size('mail_index_jobs') AS indexes,
       pg_total_relation_size('mail_index_jobs') AS total,
       s.n_dead_tup AS dead, s.vacuum_count AS vacuums, s.autovacuum_count AS autovacuums
  FROM pg_stat_user_tables s
 WHERE s.relid = 'mail_index_jobs'::regclass
"""
# Exact, but a sequential scan of the whole table: after the timed part only,
# or when no job finished for --stall seconds.
OPEN_JOBS = "SELECT count(*) FROM mail_index_jobs WHERE status IN ('pending', 'processing')"
ALL_ROWS = "SELECT count(*) FROM mail_index_jobs"
OUTCOMES = "nexarch_job_events"


def db_url(dsn: str, database: str) -> str:
    return urlunsplit(urlsplit(dsn)._replace(path="/" + database))


def mb(n: int) -> str:
    return f"{n / 1048576:.1f}"


class Finished:
    """Counts finished jobs from the ack's outcome notifications (one per
    acknowledged batch, with the job ids), and keeps (time, finished so far)
    per notification for the window and target figures."""

    def __init__(self) -> None:
        self.succeeded = 0
        self.failed = 0
        self.trace: list[tuple[float, int]] = []
        self.changed = asyncio.Event()

    @property
    def done(self) -> int:
        return self.succeeded + self.failed

    def __call__(self, _conn: object, _pid: int, _channel: str, payload: object) -> None:
        now = time.monotonic()
        event = json.loads(str(payload))
        if event.get("event") == "succeeded":
            self.succeeded += len(event["ids"])
        elif event.get("event") == "failed":
            self.failed += len(event["ids"])
        else:
            return
        self.trace.append((now, self.done))
        self.changed.set()


def first_last(trace: list[tuple[float, int]], started: float, total: int,
               size: int) -> tuple[float, int, float, int]:
    """Throughput of the first ``size`` finished jobs (from the start to the
    notification that reached ``size``) and of the last ``size`` of the
    measured ``total`` (from the last notification at least ``size`` jobs
    before the one that reached ``total``), with the number of jobs each
    covers (a notification carries a whole batch, so a little over ``size``)."""
    t1, d1 = next((t, d) for t, d in trace if d >= size)
    t_end, d_end = next((t, d) for t, d in trace if d >= total)
    t0, d0 = started, 0
    for t, d in trace:
        if d > d_end - size:
            break
        t0, d0 = t, d
    return d1 / (t1 - started), d1, (d_end - d0) / (t_end - t0), d_end - d0


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
    listener = await asyncpg.connect(url)
    lost: list[str] = []
    listener.add_termination_listener(lambda _c: lost.append("the LISTEN connection closed"))
    finished = Finished()
    await listener.add_listener(OUTCOMES, finished)
    out_path = REPO / "bench" / "results" / \
        f"soak-{dt.datetime.now(dt.UTC).strftime('%Y%m%dT%H%M%SZ')}.jsonl"
    out_path.parent.mkdir(parents=True, exist_ok=True)
    windows: list[dict[str, Any]] = []
    try:
        # Ready once its LISTEN connection is up: the first window measures work,
        # not the worker's start-up.
        while not await conn.fetchval("SELECT count(*) FROM pg_stat_activity WHERE "
                                      "application_name LIKE 'nexarch-events/listener/%' "
                                      "AND datname = current_database()"):
            if worker.poll() is not None:
                raise RuntimeError(f"the worker exited with {worker.returncode}; see {args.log}")
            await asyncio.sleep(0.1)
        # --jobs are measured; --backlog more are enqueued behind them so that the
        # producer keeps the backlog full, and competes for the CPU, up to the last
        # measured job, as it does in the first window. They drain untimed.
        to_enqueue = args.jobs + args.backlog
        enqueued = statements = size_reads = 0
        started = time.monotonic()
        window_t, window_done, seen = started, 0, 0
        last_progress, last_done = started, 0
        # The fewest open jobs the producer saw in a window, counted once the
        # backlog was first filled: near 0 would mean the workers waited for work.
        filled, min_open = False, None
        print(f"soak: {args.jobs} jobs (+{args.backlog} untimed), retention {args.retain:g} s, "
              f"{args.workers} workers x batch {args.batch}, backlog ~{args.backlog}, "
              f"window {args.window}, server autovacuum={autovacuum}"
              f"{' (embedded server)' if args.embedded else ''}")
        print(f"{'finished':>10} {'t_s':>7} {'jobs/s':>8} {'rows~':>8} {'heap_MB':>8} "
              f"{'index_MB':>8} {'total_MB':>8} {'dead':>8} {'min_open':>8} {'vac':>5} "
              f"{'autovac':>7}")
        while True:
            if worker.poll() is not None:
                raise RuntimeError(f"the worker exited with {worker.returncode}; see {args.log}")
            if lost:
                raise RuntimeError(lost[0] + "; finished jobs can no longer be counted")
            # A window ends at the notification that reached its boundary (or the
            # last measured job); the sizes are read when this loop gets there, a
            # moment later.
            while seen < len(finished.trace) and window_done < args.jobs:
                t, done_at = finished.trace[seen]
                seen += 1
                if done_at < window_done + args.window and done_at < args.jobs:
                    continue
                row = await conn.fetchrow(SIZES, enqueued)
                size_reads += 1
                rate = (done_at - window_done) / (t - window_t)
                window = {"finished": done_at, "t_s": t - started, "jobs_per_s": rate,
                          "rows": row["rows"], "heap": row["heap"], "indexes": row["indexes"],
                          "total": row["total"], "dead": row["dead"] or 0,
                          "min_open": min_open, "vacuums": row["vacuums"] or 0,
                          "autovacuums": row["autovacuums"] or 0}
                windows.append(window)
                print(f"{done_at:>10} {window['t_s']:>7.0f} {rate:>8.0f} {row['rows']:>8} "
                      f"{mb(row['heap']):>8} {mb(row['indexes']):>8} {mb(row['total']):>8} "
                      f"{window['dead']:>8} {'-' if min_open is None else min_open:>8} "
                      f"{window['vacuums']:>5} {window['autovacuums']:>7}", flush=True)
                window_t, window_done, min_open = t, done_at, None
            done = finished.done
            if done >= to_enqueue:
                break
            filled = filled or enqueued - done >= args.backlog
            if filled and done < args.jobs:
                min_open = enqueued - done if min_open is None else min(min_open,
                                                                         enqueued - done)
            if enqueued < to_enqueue and enqueued - done < args.backlog:
                n = min(args.chunk, to_enqueue - enqueued)
                base = enqueued
                await conn.execute(
                    enqueue_sql, ["index"] * n, ["soak"] * n,
                    [f"m{base + i}" for i in range(n)], ["{}"] * n, [5] * n, [0.0] * n)
                enqueued += n
                statements += 1
                continue
            # No await between the check above and clear(): a notification
            # cannot slip in between.
            finished.changed.clear()
            try:
                await asyncio.wait_for(finished.changed.wait(), 1.0)
            except TimeoutError:
                pass
            now = time.monotonic()
            if finished.done != last_done:
                last_progress, last_done = now, finished.done
            elif now - last_progress > args.stall:
                # Nothing finished for a while: a stalled worker, or lost
                # notifications? One exact count tells.
                open_exact = int(await conn.fetchval(OPEN_JOBS))
                if open_exact < enqueued - finished.done:
                    raise RuntimeError(
                        f"{enqueued - open_exact} jobs finished but only {finished.done} "
                        f"were announced: notifications lost")
                print(f"  (no job finished for {now - last_progress:.0f} s; "
                      f"{open_exact} open, as counted)", flush=True)
                last_progress = now
        elapsed = windows[-1]["t_s"]
        # Checks, after the timed part and the untimed drain: exact counts.
        open_exact = int(await conn.fetchval(OPEN_JOBS))
        rows_exact = int(await conn.fetchval(ALL_ROWS))
        rows_marker = (await conn.fetchrow(SIZES, enqueued))["rows"]
        if open_exact or finished.done != enqueued:
            raise RuntimeError(f"after the run: {open_exact} jobs open by count(*), "
                               f"{finished.done} of {enqueued} announced as finished")
        size = min(args.window, args.jobs)
        first_rate, first_n, last_rate, last_n = first_last(
            finished.trace, started, args.jobs, size)
        ratio = last_rate / first_rate
        half = len(windows) // 2
        peak_first = max(w["total"] for w in windows[:max(half, 1)])
        peak_second = max(w["total"] for w in windows[half:])
        summary = {"jobs": args.jobs, "untimed": enqueued - args.jobs, "retain_s": args.retain,
                   "seconds": elapsed, "failed": finished.failed,
                   "first_jobs": first_n, "first_jobs_per_s": first_rate,
                   "last_jobs": last_n, "last_jobs_per_s": last_rate,
                   "throughput_last_over_first": ratio,
                   "table_total_peak_first_half_mb": peak_first / 1048576,
                   "table_total_peak_second_half_mb": peak_second / 1048576,
                   "rows_exact_at_end": rows_exact, "rows_marker_at_end": rows_marker,
                   "bench_statements": {"enqueue": statements, "sizes": size_reads,
                                        "table_scans_while_timing": 0}}
        verdict = "PASS" if ratio >= 0.90 else "MISS"
        print(f"throughput last {last_n} jobs {last_rate:.0f}/s, first {first_n} jobs "
              f"{first_rate:.0f}/s: {ratio:.2f} (target >= 0.90: {verdict}); "
              f"table+indexes peak: first half {mb(peak_first)} MB, "
              f"second half {mb(peak_second)} MB; {elapsed:.0f} s")
        print(f"after the drain: 0 open jobs by count(*); rows: count(*) {rows_exact}, "
              f"rows~ {rows_marker}; failed jobs: {finished.failed}; the bench ran "
              f"{statements} enqueue statements and {size_reads} size reads, no table scan "
              f"while timing")
        with open(out_path, "a", encoding="utf-8") as out:
            for window in windows:
                out.write(json.dumps({"kind": "window", **window}) + "\n")
            out.write(json.dumps({"kind": "summary", **summary}) + "\n")
        print(f"results: {out_path}")
        return 0
    finally:
        await listener.close()
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
    parser.add_argument("--stall", type=float, default=60.0,
                        help="seconds without a finished job before one exact count of the "
                             "open jobs checks that no notification was lost")
    parser.add_argument("--log", default="/tmp/nexarch-soak-worker.log")
    parser.add_argument("--keep-db", action="store_true")
    parser.add_argument("--embedded", action="store_true",
                        help="run against a throwaway embedded Postgres (autovacuum on, "
                             "fsync off) instead of --dsn")
    args = parser.parse_args()
    return run_embedded(args) if args.embedded else asyncio.run(soak(args))


if __name__ == "__main__":
    sys.exit(main())
