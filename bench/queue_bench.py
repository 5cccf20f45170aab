#!/usr/bin/env python
"""Queue benchmark: nexarch-events ("ours") against raw asyncpg floors measured
in the same run, on the same Postgres server. Usage: bench/README.md.

    .venv/bin/python bench/queue_bench.py [--quick] [--only wake,drain] [--dsn URL]

Workloads (all handlers are no-ops):

  notify   floor: NOTIFY from one raw asyncpg connection to a LISTENing other
  select1  floor: raw asyncpg ``SELECT 1``; ours: the same through the
           package's trio-asyncio ``Database`` (informational: the hop cost)
  wake     one producer process commits one job every 20 ms; latency from the
           producer's commit returning to the handler starting, in
           floor: a raw asyncio single-row SKIP LOCKED claim loop woken by
                  LISTEN, ours: one ``nexarch-events worker`` process, and
           stack: the floor's loop, statement for statement, on trio and
                  ``nexarch_events.aio`` (the fixed stack's own price)
  drain    20,000 jobs committed in one transaction, then drained, jobs/s:
           floor: raw claim loop with 1 and 100 rows per claim, and ours:
           several processes x workers x batch-size configurations
  mixed    a producer commits 10,000 jobs one per transaction as fast as it
           can while the workers consume: jobs/s and commit -> handler-start
           latency (floor: raw 100-row claim loop; ours: worker process)

Every workload runs in a fresh database that is dropped afterwards. Every
process the script starts is stopped (SIGTERM, then SIGKILL) even on error,
and gets SIGTERM from the kernel if the script itself dies.

The script also runs its own helper processes: ``queue_bench.py _role NAME``.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import ctypes
import datetime as dt
import json
import math
import os
import secrets
import shutil
import signal
import sys
import tempfile
import time
from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any
from urllib.parse import urlsplit, urlunsplit

import asyncpg

REPO = Path(__file__).resolve().parent.parent
if str(REPO) not in sys.path:  # run as a script: make ``bench`` importable
    sys.path.insert(0, str(REPO))
PY = sys.executable
DEFAULT_DSN = "postgresql://postgres@127.0.0.1:5432/postgres"
RAW_CHANNEL = "bench_raw_jobs"

# --------------------------------------------------------------------------
# The raw floor: a minimal SKIP LOCKED queue, pure asyncio + asyncpg.

RAW_SCHEMA = """
CREATE TABLE bench_raw_jobs (
    id         bigint GENERATED ALWAYS AS IDENTITY PRIMARY KEY,
    status     text        NOT NULL DEFAULT 'pending',
    payload    jsonb       NOT NULL DEFAULT '{}'::jsonb,
    created_at timestamptz NOT NULL DEFAULT now(),
    done_at    timestamptz
);
CREATE INDEX bench_raw_jobs_pending ON bench_raw_jobs (id) WHERE status = 'pending';
"""
# One statement, one transaction: the row and its wake-up commit together.
RAW_ENQUEUE = f"""
WITH ins AS (INSERT INTO bench_raw_jobs (payload) VALUES ('{{}}') RETURNING id)
SELECT id, pg_notify('{RAW_CHANNEL}', '') FROM ins
"""
RAW_ENQUEUE_BULK = f"""
WITH ins AS (INSERT INTO bench_raw_jobs (payload)
             SELECT '{{}}' FROM generate_series(1, $1) RETURNING id)
SELECT min(id) AS first_id, max(id) AS last_id, pg_notify('{RAW_CHANNEL}', count(*)::text)
  FROM ins
"""
RAW_CLAIM_1 = """
UPDATE bench_raw_jobs SET status = 'processing'
 WHERE id = (SELECT id FROM bench_raw_jobs WHERE status = 'pending'
              ORDER BY id LIMIT 1 FOR UPDATE SKIP LOCKED)
RETURNING id, payload::text
"""
RAW_CLAIM_N = """
UPDATE bench_raw_jobs SET status = 'processing'
 WHERE id = ANY(ARRAY(SELECT id FROM bench_raw_jobs WHERE status = 'pending'
                       ORDER BY id LIMIT $1 FOR UPDATE SKIP LOCKED))
RETURNING id, payload::text
"""
RAW_DONE_1 = "UPDATE bench_raw_jobs SET status = 'done', done_at = now() WHERE id = $1"
RAW_DONE_N = ("UPDATE bench_raw_jobs SET status = 'done', done_at = now() "
              "WHERE id = ANY($1::bigint[])")


def ours_enqueue_sql() -> str:
    """The package's own enqueue statement (what Queue.enqueue_many runs)."""
    from nexarch_events.db import sqlfiles

    return sqlfiles.queries("queue.sql")["enqueue"]


# --------------------------------------------------------------------------
# Small helpers.

def pct(values: Sequence[float], q: float) -> float:
    """Nearest-rank percentile (q in 0..1); nan for no values."""
    if not values:
        return math.nan
    ordered = sorted(values)
    rank = max(1, math.ceil(q * len(ordered)))
    return ordered[rank - 1]


def latency_summary(values_ms: Sequence[float]) -> dict[str, float]:
    return {"n": len(values_ms), "p50_ms": pct(values_ms, 0.50), "p95_ms": pct(values_ms, 0.95),
            "p99_ms": pct(values_ms, 0.99), "max_ms": max(values_ms, default=math.nan),
            "mean_ms": sum(values_ms) / len(values_ms) if values_ms else math.nan}


def db_url(dsn: str, database: str) -> str:
    parts = urlsplit(dsn)
    return urlunsplit(parts._replace(path="/" + database))


def with_app_name(url: str, name: str) -> str:
    """The URL with application_name set (asyncpg passes it to the server),
    so that the CPU accounting can tell the benchmark's own sessions apart."""
    parts = urlsplit(url)
    query = "&".join(q for q in parts.query.split("&")
                     if q and not q.startswith("application_name="))
    return urlunsplit(parts._replace(query=f"{query}&application_name={name}".lstrip("&")))


#: Sessions of these application names are the benchmark's, not the consumer's.
OWN_APPS = ("nxbench-orchestrator", "nxbench-producer")


def log(msg: str) -> None:
    print(f"[{time.strftime('%H:%M:%S')}] {msg}", file=sys.stderr, flush=True)


def _die_with_parent() -> None:
    """preexec_fn: the kernel sends SIGTERM to this child if the bench dies."""
    with contextlib.suppress(Exception):
        libc = ctypes.CDLL("libc.so.6", use_errno=True)
        libc.prctl(1, signal.SIGTERM)  # PR_SET_PDEATHSIG


class BenchError(RuntimeError):
    pass


# --------------------------------------------------------------------------
# Helper processes ("roles").

async def role_producer(args: argparse.Namespace) -> None:
    """Enqueue warmup + count jobs, one per transaction, every ``interval``
    seconds (0 = as fast as possible); record when each commit returned."""
    conn = await asyncpg.connect(args.dsn)
    sql = RAW_ENQUEUE if args.system == "floor" else ours_enqueue_sql()
    loop = asyncio.get_running_loop()
    total = args.warmup + args.count
    records: list[tuple[int, float]] = []
    next_at = loop.time()
    started = time.time()
    for n in range(total):
        if args.system == "floor":
            row = await conn.fetchrow(sql)
        else:
            row = await conn.fetchrow(sql, ["index"], ["bench"], [f"msg-{n}"], ["{}"], [5], [0.0])
        committed = time.time()
        records.append((int(row["id"]), committed))
        if args.interval > 0:
            next_at += args.interval
            delay = next_at - loop.time()
            if delay > 0:
                await asyncio.sleep(delay)
    finished = time.time()
    await conn.close()
    _write_producer(args, records, started, finished)


def role_producer_api(args: argparse.Namespace) -> None:
    """The same producer through the package's API (Queue.enqueue_index);
    for the floor's table (``--system floor``), the floor's own statement
    through the package's ``Database`` (the "stack" consumer's producer)."""
    import trio

    from nexarch_events.aio import Database, run
    from nexarch_events.queue.jobs import Queue

    records: list[tuple[int, float]] = []

    async def main() -> tuple[float, float]:
        async with Database.open(args.dsn, max_size=1) as db:
            queue = Queue(db)
            next_at = trio.current_time()
            started = time.time()
            for n in range(args.warmup + args.count):
                if args.system == "floor":
                    row = await db.fetchrow(RAW_ENQUEUE)
                    assert row is not None
                    job_id = row["id"]
                else:
                    job_id = await queue.enqueue_index("bench", f"msg-{n}", {})
                records.append((int(job_id), time.time()))
                if args.interval > 0:
                    next_at += args.interval
                    await trio.sleep_until(next_at)
            return started, time.time()

    started, finished = run(main)
    _write_producer(args, records, started, finished)


def _write_producer(args: argparse.Namespace, records: list[tuple[int, float]],
                    started: float, finished: float) -> None:
    data = {"warmup_ids": [i for i, _ in records[:args.warmup]],
            "jobs": records[args.warmup:], "started": started, "finished": finished}
    Path(args.out).write_text(json.dumps(data))


def _raw_handle(rows: Sequence[Any], started: float, out: Any) -> None:
    """The floor's handler: parse each payload (as ours does for each
    claimed job) and log the handler's start time per job."""
    for row in rows:
        json.loads(row["payload"])
    if out is not None:
        out.write("".join(f"{row['id']} {started:.6f}\n" for row in rows))
        out.flush()


def _raw_done(rows: Sequence[Any]) -> tuple[Any, ...]:
    """The floor's ack statement and its argument for ``rows``."""
    if len(rows) == 1:
        return RAW_DONE_1, rows[0]["id"]
    return RAW_DONE_N, [row["id"] for row in rows]


async def role_raw_consumer(args: argparse.Namespace) -> None:
    """The floor's worker: LISTEN on one connection; ``tasks`` claim loops, each
    on its own connection, claim up to ``batch`` rows per statement until the
    table is empty, then sleep until a notification. Handler = no-op that
    records its start time (if --log)."""
    listen = await asyncpg.connect(args.dsn)
    conns = [await asyncpg.connect(args.dsn) for _ in range(args.tasks)]
    wake = asyncio.Event()
    stop = asyncio.Event()
    loop = asyncio.get_running_loop()
    loop.add_signal_handler(signal.SIGTERM, stop.set)
    loop.add_signal_handler(signal.SIGINT, stop.set)
    trace: list[tuple[str, float, Any]] | None = [] if args.trace else None

    def wake_cb(*_: object) -> None:
        if trace is not None:
            trace.append(("deliver", time.time(), RAW_CHANNEL))
        wake.set()

    await listen.add_listener(RAW_CHANNEL, wake_cb)
    out = open(args.log, "a", encoding="ascii") if args.log else None
    claim = RAW_CLAIM_1 if args.batch == 1 else RAW_CLAIM_N

    async def work(conn: asyncpg.Connection) -> None:
        while True:
            if trace is not None:
                trace.append(("claim.start", time.time(), None))
            if args.batch == 1:
                rows = await conn.fetch(claim)
            else:
                rows = await conn.fetch(claim, args.batch)
            if trace is not None:
                trace.append(("claim.end", time.time(), [row["id"] for row in rows]))
            if not rows:
                await wake.wait()
                wake.clear()
                continue
            started = time.time()  # "handler start"
            if trace is not None:
                trace.append(("handler", started, [row["id"] for row in rows]))
            _raw_handle(rows, started, out)
            await conn.execute(*_raw_done(rows))

    tasks = [asyncio.create_task(work(c)) for c in conns]
    print("ready", flush=True)
    stopper = asyncio.create_task(stop.wait())
    done, _ = await asyncio.wait([*tasks, stopper], return_when=asyncio.FIRST_COMPLETED)
    for task in tasks:
        task.cancel()
    for task in done:
        if task is not stopper and task.exception():
            raise task.exception()  # type: ignore[misc]
    for conn in [listen, *conns]:
        conn.terminate()
    if trace is not None:
        Path(args.trace, f"trace-{os.getpid()}.jsonl").write_text(
            "".join(json.dumps(list(e)) + "\n" for e in trace))


def role_raw_consumer_trio(args: argparse.Namespace) -> None:
    """The floor's worker again, statement for statement, on the package's
    stack: trio, asyncpg through trio-asyncio, ``nexarch_events.aio``'s
    ``Connection`` and ``ListenConnection``. What it costs beyond the raw
    asyncio loop is the fixed stack's price, before any queue logic of ours
    (bench/README.md, "The stack's own price")."""
    import trio

    from nexarch_events.aio import run
    from nexarch_events.aio.pg import Connection, ListenConnection

    claim = RAW_CLAIM_1 if args.batch == 1 else RAW_CLAIM_N
    out = open(args.log, "a", encoding="ascii") if args.log else None

    async def main() -> None:
        listen = await ListenConnection.connect(args.dsn, connect_timeout=10)
        conns = [await Connection.open(args.dsn) for _ in range(args.tasks)]
        idle: list[trio.Event] = []

        def wake_cb(_channel: str, _payload: str) -> None:
            if idle:
                idle.pop().set()

        await listen.listen(RAW_CHANNEL, wake_cb)

        async def work(conn: Connection) -> None:
            while True:
                rows = await (conn.fetch(claim) if args.batch == 1
                              else conn.fetch(claim, args.batch))
                if not rows:
                    event = trio.Event()
                    idle.append(event)
                    await event.wait()
                    continue
                _raw_handle(rows, time.time(), out)  # "handler start"
                await conn.execute(*_raw_done(rows))

        async with trio.open_nursery() as nursery:
            for conn in conns:
                nursery.start_soon(work, conn)
            print("ready", flush=True)
            with trio.open_signal_receiver(signal.SIGTERM, signal.SIGINT) as signals:
                async for _ in signals:
                    break
            nursery.cancel_scope.cancel()
        for conn in conns:
            conn.abort()
        listen.abort()

    run(main)


def role_ours_bulk(args: argparse.Namespace) -> None:
    """Enqueue ``count`` jobs with Queue.enqueue_many in chunks, all in one
    transaction, so that the workers see them all at once; print the time
    the commit returned."""
    from nexarch_events.aio import Database, run
    from nexarch_events.models import JobType, NewJob
    from nexarch_events.queue.jobs import Queue

    async def main() -> dict[str, Any]:
        async with Database.open(args.dsn, max_size=1) as db, db.acquire() as conn:
            ids: list[int] = []
            jobs = [NewJob(JobType.INDEX, "bench", f"bulk-{n}", {}) for n in range(args.count)]
            async with conn.transaction():
                queue = Queue(conn)  # type: ignore[arg-type]  # one transaction
                for start in range(0, len(jobs), args.chunk):
                    ids += await queue.enqueue_many(jobs[start:start + args.chunk])
            committed = time.time()
        return {"committed_at": committed, "first_id": min(ids), "last_id": max(ids)}

    print(json.dumps(run(main)), flush=True)


def role_select1(args: argparse.Namespace) -> None:
    """``SELECT 1`` round trips: raw asyncpg (floor) or the package's Database (ours)."""
    samples: list[float] = []
    if args.system == "floor":
        async def raw() -> None:
            conn = await asyncpg.connect(args.dsn)
            for n in range(args.warmup + args.count):
                t0 = time.perf_counter()
                await conn.fetchval("SELECT 1")
                if n >= args.warmup:
                    samples.append((time.perf_counter() - t0) * 1000)
            await conn.close()
        asyncio.run(raw())
    else:
        from nexarch_events.aio import Database, run

        async def ours() -> None:
            async with Database.open(args.dsn, max_size=1) as db:
                for n in range(args.warmup + args.count):
                    t0 = time.perf_counter()
                    await db.fetchval("SELECT 1")
                    if n >= args.warmup:
                        samples.append((time.perf_counter() - t0) * 1000)
        run(ours)
    print(json.dumps(samples), flush=True)


def run_role(argv: list[str]) -> None:
    parser = argparse.ArgumentParser(prog="queue_bench.py _role")
    parser.add_argument("role", choices=["producer", "raw-consumer", "ours-bulk", "select1"])
    parser.add_argument("--dsn", required=True)
    parser.add_argument("--system", choices=["ours", "floor"], default="ours")
    parser.add_argument("--mode", choices=["sql", "api"], default="sql")
    parser.add_argument("--count", type=int, default=0)
    parser.add_argument("--warmup", type=int, default=0)
    parser.add_argument("--interval", type=float, default=0.0)
    parser.add_argument("--out")
    parser.add_argument("--batch", type=int, default=1)
    parser.add_argument("--tasks", type=int, default=1)
    parser.add_argument("--chunk", type=int, default=1000)
    parser.add_argument("--log")
    parser.add_argument("--trace")
    parser.add_argument("--stack", choices=["asyncio", "trio"], default="asyncio")
    args = parser.parse_args(argv)
    if args.role == "producer":
        if args.mode == "api":
            role_producer_api(args)
        else:
            asyncio.run(role_producer(args))
    elif args.role == "raw-consumer" and args.stack == "trio":
        role_raw_consumer_trio(args)
    elif args.role == "raw-consumer":
        asyncio.run(role_raw_consumer(args))
    elif args.role == "ours-bulk":
        role_ours_bulk(args)
    else:
        role_select1(args)


# --------------------------------------------------------------------------
# The orchestrator.

@dataclass
class Result:
    workload: str
    system: str  # "ours" or "floor"
    config: str
    metrics: dict[str, Any]
    targets: list[dict[str, Any]] = field(default_factory=list)
    extra: dict[str, Any] = field(default_factory=dict)


@dataclass
class Config:
    processes: int
    workers: int
    batch: int

    @classmethod
    def parse(cls, text: str) -> Config:
        p, w, b = (int(x) for x in text.lower().split("x"))
        return cls(p, w, b)

    def __str__(self) -> str:
        return f"{self.processes}x{self.workers}x{self.batch}"


class Bench:
    def __init__(self, args: argparse.Namespace) -> None:
        self.args = args
        self.dsn: str = args.dsn
        self.run_id = secrets.token_hex(3)
        self.tmp = Path(tempfile.mkdtemp(prefix=f"nxbench-{self.run_id}-"))
        self.procs: list[asyncio.subprocess.Process] = []
        self.databases: list[str] = []
        self.results: list[Result] = []
        self.admin: asyncpg.Connection | None = None
        self.spies: list[asyncio.subprocess.Process] = []
        self._db_seq = 0

    # -- databases -----------------------------------------------------------

    async def new_database(self, label: str, *, system: str) -> str:
        assert self.admin is not None
        self._db_seq += 1
        name = f"nxbench_{self.run_id}_{self._db_seq}_{label}"
        await self.admin.execute(f'CREATE DATABASE "{name}"')
        self.databases.append(name)
        url = db_url(self.dsn, name)
        if system == "floor":
            conn = await asyncpg.connect(url)
            try:
                await conn.execute(RAW_SCHEMA)
            finally:
                await conn.close()
        else:
            await self.run_checked([PY, "-m", "nexarch_events", "--log-level", "warning",
                                    "migrate"], env={"NEXARCH_DATABASE_URL": url}, timeout=60)
        return url

    async def drop_databases(self) -> None:
        if self.args.keep_db or self.admin is None:
            return
        for name in self.databases:
            try:
                await self.admin.execute(f'DROP DATABASE IF EXISTS "{name}" WITH (FORCE)')
            except Exception as exc:  # keep dropping the others
                log(f"could not drop database {name}: {exc}")
        self.databases.clear()

    # -- processes -------------------------------------------------------------

    def _env(self, extra: dict[str, str] | None = None) -> dict[str, str]:
        env = dict(os.environ)
        env["PYTHONPATH"] = os.pathsep.join(
            [str(REPO), *([env["PYTHONPATH"]] if env.get("PYTHONPATH") else [])])
        env.update(extra or {})
        return env

    async def spawn(self, argv: list[str], *, env: dict[str, str] | None = None,
                    stdout: Any = asyncio.subprocess.DEVNULL,
                    name: str = "proc") -> asyncio.subprocess.Process:
        stderr_path = self.tmp / f"{name}-{len(self.procs)}.stderr"
        with open(stderr_path, "wb") as stderr:
            proc = await asyncio.create_subprocess_exec(
                *argv, cwd=str(REPO), env=self._env(env), stdout=stdout, stderr=stderr,
                stdin=asyncio.subprocess.DEVNULL, preexec_fn=_die_with_parent)
        proc.stderr_path = stderr_path  # type: ignore[attr-defined]
        self.procs.append(proc)
        return proc

    def stderr_tail(self, proc: asyncio.subprocess.Process, lines: int = 15) -> str:
        path: Path = proc.stderr_path  # type: ignore[attr-defined]
        try:
            return "\n".join(path.read_text(errors="replace").splitlines()[-lines:])
        except OSError:
            return ""

    async def stop(self, proc: asyncio.subprocess.Process, grace: float = 15.0) -> None:
        if proc.returncode is None:
            with contextlib.suppress(ProcessLookupError):
                proc.send_signal(signal.SIGTERM)
            try:
                await asyncio.wait_for(proc.wait(), grace)
            except TimeoutError:
                log(f"process {proc.pid} ignored SIGTERM for {grace}s: killing it")
                with contextlib.suppress(ProcessLookupError):
                    proc.kill()
                await proc.wait()
        if proc in self.procs:
            self.procs.remove(proc)

    async def stop_consumers(self, procs: list[asyncio.subprocess.Process]) -> None:
        """Stop worker/consumer processes, then let their py-spy recorders
        (which end by themselves when their target exits) write their files."""
        for proc in procs:
            await self.stop(proc)
        for spy in self.spies:
            try:
                await asyncio.wait_for(spy.wait(), 20)
            except TimeoutError:
                spy.send_signal(signal.SIGINT)
            await self.stop(spy)
        self.spies.clear()

    async def attach_spy(self, proc: asyncio.subprocess.Process, label: str) -> None:
        if not self.args.py_spy:
            return
        folder = Path(self.args.py_spy)
        folder.mkdir(parents=True, exist_ok=True)
        path = folder / f"{self.run_id}-{self._db_seq:02d}-{label}-{proc.pid}.txt"
        spy = await self.spawn([str(Path(PY).with_name("py-spy")), "record", "--pid",
                                str(proc.pid), "--format", "raw", "--rate",
                                str(self.args.py_spy_rate), "--nonblocking", "-o", str(path)],
                               name="py-spy")
        self.spies.append(spy)

    async def cpu_snapshot(self, url: str, procs: list[asyncio.subprocess.Process]
                           ) -> dict[str, dict[int, float]]:
        """CPU seconds so far of the consumer processes and of their server
        sessions (every session of the database but the benchmark's own)."""
        try:
            import psutil
        except ImportError:
            return {}

        def cpu(pid: int) -> float | None:
            try:
                t = psutil.Process(pid).cpu_times()
                return t.user + t.system
            except (psutil.Error, OSError):
                return None

        async with _connect(url) as conn:
            rows = await conn.fetch(
                "SELECT pid FROM pg_stat_activity WHERE datname = current_database() "
                "AND coalesce(application_name, '') <> ALL($1::text[])", list(OWN_APPS))
        snap: dict[str, dict[int, float]] = {"client": {}, "backend": {}}
        for kind, pids in (("client", [p.pid for p in procs]),
                           ("backend", [r["pid"] for r in rows])):
            for pid in pids:
                value = cpu(pid)
                if value is not None:
                    snap[kind][pid] = value
        return snap

    async def stop_all(self) -> None:
        for proc in list(self.procs):
            await self.stop(proc)

    async def run_checked(self, argv: list[str], *, env: dict[str, str] | None = None,
                          timeout: float) -> str:
        proc = await self.spawn(argv, env=env, stdout=asyncio.subprocess.PIPE, name="helper")
        try:
            out, _ = await asyncio.wait_for(proc.communicate(), timeout)
        except TimeoutError:
            raise BenchError(f"{' '.join(argv[:6])}... timed out after {timeout}s") from None
        finally:
            await self.stop(proc)
        if proc.returncode != 0:
            raise BenchError(f"{' '.join(argv[:6])}... exited {proc.returncode}:\n"
                             f"{self.stderr_tail(proc)}")
        return out.decode()

    def role_argv(self, role: str, *args: object) -> list[str]:
        return [PY, str(Path(__file__).resolve()), "_role", role, *map(str, args)]

    async def start_raw_consumer(self, url: str, *, batch: int, tasks: int = 1,
                                 log_path: Path | None = None,
                                 trace_dir: Path | None = None,
                                 stack: str = "asyncio") -> asyncio.subprocess.Process:
        argv = self.role_argv("raw-consumer", "--dsn", url, "--batch", batch, "--tasks", tasks,
                              "--stack", stack)
        if log_path is not None:
            argv += ["--log", str(log_path)]
        if trace_dir is not None:
            argv += ["--trace", str(trace_dir)]
        proc = await self.spawn(argv, stdout=asyncio.subprocess.PIPE, name="raw-consumer")
        assert proc.stdout is not None
        try:
            line = await asyncio.wait_for(proc.stdout.readline(), 30)
        except TimeoutError:
            line = b""
        if line.strip() != b"ready":
            raise BenchError(f"raw consumer did not start:\n{self.stderr_tail(proc)}")
        await self.attach_spy(proc, "raw-consumer")
        return proc

    async def start_workers(self, url: str, config: Config, handlers: str,
                            log_dir: Path | None = None,
                            trace_dir: Path | None = None) -> list[asyncio.subprocess.Process]:
        env = {"NEXARCH_DATABASE_URL": url}
        if log_dir is not None:
            env["NEXARCH_BENCH_HANDLER_LOG"] = str(log_dir)
        if trace_dir is not None:
            env["NEXARCH_BENCH_TRACE_LOG"] = str(trace_dir)
        env.update(self.args.worker_env)
        procs = []
        for index in range(config.processes):
            argv = [PY, "-m", "nexarch_events", "--log-level", "warning", "worker",
                    "--handlers", handlers, "--workers", str(config.workers),
                    "--batch-size", str(config.batch), "--name", f"bench-{index}"]
            procs.append(await self.spawn(argv, env=env, name=f"worker{index}"))
        # Ready = every process has its LISTEN connection up (the listener
        # starts the workers right after it), then one job end to end.
        database = urlsplit(url).path.lstrip("/")
        deadline = time.monotonic() + 60
        async with _connect(url) as conn:
            while True:
                for proc in procs:
                    if proc.returncode is not None:
                        raise BenchError(f"worker exited {proc.returncode} at start:\n"
                                         f"{self.stderr_tail(proc)}")
                listening = await conn.fetchval(
                    "SELECT count(*) FROM pg_stat_activity WHERE datname = $1 "
                    "AND query LIKE 'LISTEN %'", database)
                if listening >= config.processes:
                    break
                if time.monotonic() > deadline:
                    raise BenchError("worker processes not listening after 60 s")
                await asyncio.sleep(0.05)
            for n in range(config.processes):
                row = await conn.fetchrow(ours_enqueue_sql(), ["index"], ["bench"],
                                          [f"warmup-{n}"], ["{}"], [5], [0.0])
                await self.wait_finished(conn, "ours", timeout=30, first_id=int(row["id"]))
        await asyncio.sleep(0.3)
        for proc in procs:
            await self.attach_spy(proc, f"worker-{config}")
        return procs

    async def wait_finished(self, conn: asyncpg.Connection, system: str, *, timeout: float,
                            first_id: int = 0) -> None:
        """Poll every 50 ms until no job with id >= first_id is open."""
        if system == "ours":
            q_pending = ("SELECT count(*) FROM mail_index_jobs "
                         "WHERE status = 'pending' AND id >= $1")
            q_open = ("SELECT count(*) FROM mail_index_jobs "
                      "WHERE status IN ('pending', 'processing') AND id >= $1")
        else:
            q_pending = "SELECT count(*) FROM bench_raw_jobs WHERE status = 'pending' AND id >= $1"
            q_open = "SELECT count(*) FROM bench_raw_jobs WHERE status <> 'done' AND id >= $1"
        deadline = time.monotonic() + timeout
        for query in (q_pending, q_open):
            while await conn.fetchval(query, first_id):
                if time.monotonic() > deadline:
                    raise BenchError(f"{system}: jobs still open after {timeout} s")
                for proc in self.procs:
                    if proc.returncode not in (None, 0):
                        raise BenchError(f"a process exited {proc.returncode}:\n"
                                         f"{self.stderr_tail(proc)}")
                await asyncio.sleep(0.05)

    async def finished_times(self, url: str, system: str, ids: Iterable[int]) -> dict[int, float]:
        """Per job: when its ack statement started (finished_at/done_at = now())."""
        if system == "ours":
            query = ("SELECT id, extract(epoch FROM finished_at)::float8 AS t FROM mail_index_jobs "
                     "WHERE id = ANY($1::bigint[]) AND status = 'succeeded'")
        else:
            query = ("SELECT id, extract(epoch FROM done_at)::float8 AS t FROM bench_raw_jobs "
                     "WHERE id = ANY($1::bigint[]) AND status = 'done'")
        async with _connect(url) as conn:
            return {r["id"]: r["t"] for r in await conn.fetch(query, list(ids))}

    # -- workloads -----------------------------------------------------------

    async def w_notify(self) -> None:
        n = self.args.notify_count
        url = await self.new_database("notify", system="floor")
        async with _connect(url) as sender, _connect(url) as listener:
            loop = asyncio.get_running_loop()
            fut: asyncio.Future[float] = loop.create_future()

            def got(*_: object) -> None:
                if not fut.done():
                    fut.set_result(time.perf_counter())

            await listener.add_listener("bench_ping", got)
            samples = []
            for i in range(200 + n):
                fut = loop.create_future()
                t0 = time.perf_counter()
                await sender.execute("NOTIFY bench_ping, 'x'")
                t1 = await asyncio.wait_for(fut, 5)
                if i >= 200:
                    samples.append((t1 - t0) * 1000)
        self.add(Result("notify_rtt", "floor", "2 raw asyncpg conns, 1 process",
                        latency_summary(samples)))

    async def w_select1(self) -> None:
        url = await self.new_database("select1", system="floor")
        n = self.args.notify_count
        for system, label in (("floor", "raw asyncpg"),
                              ("ours", "Database.fetchval (trio-asyncio)")):
            if system not in self.args.systems:
                continue
            out = await self.run_checked(
                self.role_argv("select1", "--dsn", url, "--system", system, "--count", n,
                               "--warmup", 200), timeout=120)
            self.add(Result("select1", system, label, latency_summary(json.loads(out))))

    async def w_wake(self) -> None:
        a = self.args
        floor_ms: list[float] = []
        ours_ms: list[float] = []
        stack_ms: list[float] = []
        floor_extra: dict[str, Any] = {}
        ours_extra: dict[str, Any] = {}
        stack_extra: dict[str, Any] = {}
        for rnd in range(a.rounds):
            if "floor" in a.systems:
                log(f"wake round {rnd + 1}/{a.rounds}: floor (raw single-row claim loop)")
                floor_ms += await self._wake_one("floor", floor_extra)
            if "stack" in a.systems:
                log(f"wake round {rnd + 1}/{a.rounds}: stack (the same loop on trio-asyncio)")
                stack_ms += await self._wake_one("stack", stack_extra)
            if "ours" in a.systems:
                log(f"wake round {rnd + 1}/{a.rounds}: ours (1 worker process, "
                    f"{a.wake_config}, producer {a.producer})")
                ours_ms += await self._wake_one("ours", ours_extra)
        floor = Result("wake_latency", "floor", "raw 1-row SKIP LOCKED claim loop, LISTEN",
                       latency_summary(floor_ms), extra=floor_extra)
        ours = Result("wake_latency", "ours", f"1 process {a.wake_config}, producer={a.producer}",
                      latency_summary(ours_ms), extra=ours_extra)
        for result in (floor, ours):
            runs = result.extra.pop("_trace_runs", None)
            if runs:
                from bench.wake_trace import breakdown

                result.extra["trace"] = [
                    {"step": step, "n": n, "p50_ms": p50, "p99_ms": p99}
                    for step, n, p50, p99 in breakdown(runs)]
        if floor_ms:
            self.add(floor)
        if stack_ms:
            self.add(Result("wake_latency", "stack",
                            "the floor's loop on trio + trio-asyncio (nexarch_events.aio)",
                            latency_summary(stack_ms), extra=stack_extra))
        if ours_ms:
            self.add(ours)
        if not (floor_ms and ours_ms):
            return
        ours.targets += [
            _ratio_target("wake p50 <= 1.3 x floor", ours.metrics["p50_ms"],
                          floor.metrics["p50_ms"], 1.3, "le"),
            _ratio_target("wake p99 <= 1.5 x floor", ours.metrics["p99_ms"],
                          floor.metrics["p99_ms"], 1.5, "le"),
        ]

    async def _wake_one(self, system: str, extra: dict[str, Any]) -> list[float]:
        a = self.args
        # "stack": the floor's schema, producer and loop, on trio-asyncio.
        schema = "floor" if system == "stack" else system
        url = await self.new_database(f"wake_{system}", system=schema)
        log_dir = self.tmp / f"wake-{system}-{self._db_seq}"
        log_dir.mkdir()
        trace_dir = None
        if a.trace:
            trace_dir = self.tmp / f"trace-{system}-{self._db_seq}"
            trace_dir.mkdir()
        if schema == "floor":
            procs = [await self.start_raw_consumer(
                url, batch=1, log_path=log_dir / "raw.log",
                trace_dir=trace_dir if system == "floor" else None,
                stack="trio" if system == "stack" else "asyncio")]
        else:
            handlers = "bench.wake_trace:TRACED" if a.trace else "bench.handlers:TIMED"
            procs = await self.start_workers(url, Config.parse(a.wake_config), handlers,
                                             log_dir, trace_dir)
        try:
            out = self.tmp / f"producer-wake-{system}-{self._db_seq}.json"
            cpu0 = await self.cpu_snapshot(url, procs)
            producer = await self.spawn(
                self.role_argv("producer", "--dsn", with_app_name(url, "nxbench-producer"),
                               "--system", schema,
                               "--mode", "sql" if system == "floor" else a.producer,
                               "--count", a.wake_count, "--warmup", a.warmup,
                               "--interval", a.interval, "--out", out),
                name="producer")
            timeout = (a.wake_count + a.warmup) * a.interval * 3 + 60
            await self._wait_proc(producer, timeout, "producer")
            data = json.loads(out.read_text())
            async with _connect(url) as conn:
                await self.wait_finished(conn, schema, timeout=30)
            cpu1 = await self.cpu_snapshot(url, procs)
        finally:
            await self.stop_consumers(procs)
        _add_cpu(extra, cpu0, cpu1, len(data["jobs"]))
        starts = _read_handler_logs(log_dir)
        lat, missing = _join(data["jobs"], starts)
        if trace_dir is not None:
            extra.setdefault("_trace_runs", []).append(
                (trace_dir, {int(i): t for i, t in data["jobs"]}))
        extra["missing"] = extra.get("missing", 0) + missing
        extra["jobs"] = extra.get("jobs", 0) + len(data["jobs"])
        return lat

    async def _wait_proc(self, proc: asyncio.subprocess.Process, timeout: float,
                         what: str) -> None:
        try:
            await asyncio.wait_for(proc.wait(), timeout)
        except TimeoutError:
            raise BenchError(f"{what} did not finish within {timeout:.0f} s") from None
        finally:
            await self.stop(proc)
        if proc.returncode != 0:
            raise BenchError(f"{what} exited {proc.returncode}:\n{self.stderr_tail(proc)}")

    async def w_drain(self) -> None:
        a = self.args
        n = a.drain_count
        floors: dict[int, list[Result]] = {}

        async def floor(batch: int, when: str) -> None:
            log(f"drain: floor, raw claim loop {batch} row(s) per claim, {n} jobs ({when})")
            extra: dict[str, Any] = {}
            jps = await self._drain_floor(batch, n, extra)
            result = Result("drain", "floor", f"raw claim loop, {batch} row(s)/claim, {when}",
                            {"n": n, "jobs_per_s": jps}, extra=extra)
            floors.setdefault(batch, []).append(result)
            self.add(result)

        # The 100-row floor (the target's reference) runs before and after
        # ours, and the better of the two counts: noise cannot flatter ours.
        for batch in (1, 100) if "floor" in a.systems else ():
            await floor(batch, "before")
        ours: list[Result] = []
        for text in a.drain_configs if "ours" in a.systems else ():
            config = Config.parse(text)
            log(f"drain: ours {config} (processes x workers x batch size), {n} jobs")
            extra = {}
            jps = await self._drain_ours(config, n, extra)
            result = Result("drain", "ours", str(config), {"n": n, "jobs_per_s": jps},
                            extra=extra)
            ours.append(result)
            self.add(result)
        if "floor" in a.systems and ours:
            await floor(100, "after")
        if not ours:
            return
        one_task = [r for r in ours if r.config.startswith("1x1x")]
        best = max(ours, key=lambda r: r.metrics["jobs_per_s"])
        summary = Result("drain", "ours", f"best={best.config}", dict(best.metrics),
                         extra={"one_task": {r.config: r.metrics["jobs_per_s"] for r in one_task}})
        self.add(summary)
        if 100 not in floors:
            return
        floor100 = max(r.metrics["jobs_per_s"] for r in floors[100])
        summary.targets.append(_ratio_target("drain best >= 0.5 x raw 100-row floor",
                                             best.metrics["jobs_per_s"], floor100, 0.5, "ge"))

    async def _drain_floor(self, batch: int, n: int, extra: dict[str, Any]) -> float:
        url = await self.new_database(f"drain_floor{batch}", system="floor")
        consumer = await self.start_raw_consumer(url, batch=batch)
        try:
            async with _connect(url) as conn:
                # Warm-up: one row end to end.
                row = await conn.fetchrow(RAW_ENQUEUE)
                await self.wait_finished(conn, "floor", timeout=30, first_id=int(row["id"]))
                await asyncio.sleep(0.3)
                cpu0 = await self.cpu_snapshot(url, [consumer])
                row = await conn.fetchrow(RAW_ENQUEUE_BULK, n)
                t0 = time.time()
                first, last = int(row["first_id"]), int(row["last_id"])
                await self.wait_finished(conn, "floor", timeout=max(120, n / 100), first_id=first)
                t1 = await conn.fetchval(
                    "SELECT extract(epoch FROM max(done_at))::float8 FROM bench_raw_jobs "
                    "WHERE id BETWEEN $1 AND $2", first, last)
            cpu1 = await self.cpu_snapshot(url, [consumer])
        finally:
            await self.stop_consumers([consumer])
        _add_cpu(extra, cpu0, cpu1, n)
        return n / (t1 - t0)

    async def _drain_ours(self, config: Config, n: int, extra: dict[str, Any]) -> float:
        url = await self.new_database(f"drain_{config}", system="ours")
        procs = await self.start_workers(url, config, "bench.handlers:NOOP")
        try:
            cpu0 = await self.cpu_snapshot(url, procs)
            out = await self.run_checked(
                self.role_argv("ours-bulk", "--dsn", with_app_name(url, "nxbench-producer"),
                               "--count", n, "--chunk", 1000),
                timeout=120)
            bulk = json.loads(out.strip().splitlines()[-1])
            t0, first, last = bulk["committed_at"], bulk["first_id"], bulk["last_id"]
            async with _connect(url) as conn:
                await self.wait_finished(conn, "ours", timeout=max(120, n / 100), first_id=first)
                t1 = await conn.fetchval(
                    "SELECT extract(epoch FROM max(finished_at))::float8 FROM mail_index_jobs "
                    "WHERE id BETWEEN $1 AND $2", first, last)
                done = await conn.fetchval(
                    "SELECT count(*) FROM mail_index_jobs WHERE id BETWEEN $1 AND $2 "
                    "AND status = 'succeeded'", first, last)
            if done != n:
                raise BenchError(f"drain {config}: {done} of {n} jobs succeeded")
            cpu1 = await self.cpu_snapshot(url, procs)
        finally:
            await self.stop_consumers(procs)
        _add_cpu(extra, cpu0, cpu1, n)
        return n / (t1 - t0)

    async def w_mixed(self) -> None:
        a = self.args
        if "floor" in a.systems:
            log(f"mixed: floor (raw claim loop, 100 rows/claim), {a.mixed_count} jobs")
            self.add(await self._mixed_one("floor", None))
        if "stack" in a.systems:
            log(f"mixed: stack (the floor's loop on trio-asyncio), {a.mixed_count} jobs, "
                f"producer {a.producer}")
            self.add(await self._mixed_one("stack", None))
        for text in a.mixed_configs if "ours" in a.systems else ():
            config = Config.parse(text)
            log(f"mixed: ours {config}, {a.mixed_count} jobs, producer {a.producer}")
            ours = await self._mixed_one("ours", config)
            ours.targets.append(_abs_target("mixed p99 <= 5 ms", ours.metrics["p99_ms"], 5.0))
            self.add(ours)

    async def _mixed_one(self, system: str, config: Config | None) -> Result:
        a = self.args
        schema = "floor" if system == "stack" else system
        url = await self.new_database(f"mixed_{system}", system=schema)
        log_dir = self.tmp / f"mixed-{system}-{self._db_seq}"
        log_dir.mkdir()
        if schema == "floor":
            procs = [await self.start_raw_consumer(
                url, batch=100, log_path=log_dir / "raw.log",
                stack="trio" if system == "stack" else "asyncio")]
        else:
            assert config is not None
            procs = await self.start_workers(url, config, "bench.handlers:TIMED", log_dir)
        try:
            out = self.tmp / f"producer-mixed-{system}-{self._db_seq}.json"
            cpu0 = await self.cpu_snapshot(url, procs)
            producer = await self.spawn(
                self.role_argv("producer", "--dsn", with_app_name(url, "nxbench-producer"),
                               "--system", schema,
                               "--mode", "sql" if system == "floor" else a.producer,
                               "--count", a.mixed_count, "--warmup", 0, "--interval", 0,
                               "--out", out),
                name="producer")
            await self._wait_proc(producer, 300, "producer")
            data = json.loads(out.read_text())
            async with _connect(url) as conn:
                await self.wait_finished(conn, schema, timeout=120)
            cpu1 = await self.cpu_snapshot(url, procs)
        finally:
            await self.stop_consumers(procs)
        jobs = data["jobs"]
        extra: dict[str, Any] = {}
        _add_cpu(extra, cpu0, cpu1, len(jobs))
        lat, missing = _join(jobs, _read_handler_logs(log_dir))
        acked = await self.finished_times(url, schema, [i for i, _ in jobs])
        ack_lat = [(acked[i] - t) * 1000 for i, t in jobs if i in acked]
        first_commit = min(t for _, t in jobs)
        last_ack = max(acked.values())
        metrics = latency_summary(lat)
        metrics["jobs_per_s"] = len(jobs) / (last_ack - first_commit)
        metrics["producer_jobs_per_s"] = len(jobs) / (data["finished"] - data["started"])
        ack = latency_summary(ack_lat)
        metrics["ack_p50_ms"], metrics["ack_p99_ms"] = ack["p50_ms"], ack["p99_ms"]
        label = {"floor": "raw claim loop, 100 rows/claim",
                 "stack": f"the floor's loop on trio-asyncio, producer={a.producer}"}.get(
                     system, f"{config}, producer={a.producer}")
        extra["missing"] = missing
        return Result("mixed", system, label, metrics, extra=extra)

    # -- output ------------------------------------------------------------------

    def add(self, result: Result) -> None:
        self.results.append(result)
        log(f"  {result.workload} {result.system} {result.config}: " + _fmt_metrics(result.metrics))

    def write_jsonl(self, path: Path, meta: dict[str, Any]) -> None:
        path.parent.mkdir(parents=True, exist_ok=True)
        with open(path, "a", encoding="utf-8") as out:
            for r in self.results:
                obj = {"workload": r.workload, "system": r.system, "config": r.config,
                       **{k: _clean(v) for k, v in r.metrics.items()}}
                if r.targets:
                    obj["targets"] = [{k: _clean(v) for k, v in t.items()} for t in r.targets]
                if r.extra:
                    obj["extra"] = r.extra
                obj.update(run=self.run_id, **meta)
                out.write(json.dumps(obj) + "\n")

    def print_table(self, meta: dict[str, Any]) -> None:
        cols = ["workload", "system", "config", "n", "p50_ms", "p95_ms", "p99_ms", "max_ms",
                "jobs_per_s"]
        rows = []
        for r in self.results:
            row = [r.workload, r.system, r.config, str(r.metrics.get("n", ""))]
            for key in cols[4:]:
                v = r.metrics.get(key)
                if v is None:
                    row.append("")
                else:
                    row.append(f"{v:,.0f}" if key == "jobs_per_s" else f"{v:.3f}")
            rows.append(row)
        widths = [max(len(c), *(len(row[i]) for row in rows)) for i, c in enumerate(cols)]
        print()
        print(f"nexarch-events queue benchmark  run={self.run_id}  {meta['started']}  "
              f"cpus={meta['cpus']}  {meta['server']}")
        line = "  ".join(c.ljust(w) if i < 3 else c.rjust(w) for i, (c, w) in
                         enumerate(zip(cols, widths, strict=True)))
        print(line)
        print("-" * len(line))
        for row in rows:
            print("  ".join(v.ljust(w) if i < 3 else v.rjust(w) for i, (v, w) in
                            enumerate(zip(row, widths, strict=True))))
        extras = [r for r in self.results if r.workload == "mixed"]
        if extras:
            print()
            for r in extras:
                m = r.metrics
                print(f"mixed {r.system:5s} {r.config}: producer {m['producer_jobs_per_s']:,.0f} "
                      f"jobs/s; commit->ack-start p50 {m['ack_p50_ms']:.3f} ms, "
                      f"p99 {m['ack_p99_ms']:.3f} ms")
        cpu_rows = [r for r in self.results if "cpu" in r.extra]
        if cpu_rows:
            print()
            print("consumer-side CPU per job (worker/consumer processes | their server sessions)")
            for r in cpu_rows:
                c = r.extra["cpu"]
                print(f"  {r.workload:12s} {r.system:5s} {r.config:42s} "
                      f"{c['client_ms_per_job']:7.3f} ms | {c['backend_ms_per_job']:7.3f} ms")
        for r in self.results:
            if "trace" in r.extra:
                print()
                print(f"wake path, {r.system} ({r.config}): step  n  p50 ms  p99 ms")
                for row in r.extra["trace"]:
                    print(f"  {row['step']:50s} {row['n']:5d} {row['p50_ms']:8.3f} "
                          f"{row['p99_ms']:8.3f}")
        targets = [t for r in self.results for t in r.targets]
        if targets:
            print()
            print("targets (ratios to the floor measured in this run)")
            for t in targets:
                print(f"  {'PASS' if t['pass'] else 'MISS'}  {t['name']:<40s} {t['detail']}")
        print()


def _fmt_metrics(m: dict[str, Any]) -> str:
    keys = ["p50_ms", "p95_ms", "p99_ms", "max_ms", "jobs_per_s"]
    return "  ".join(f"{k}={m[k]:.3f}" if k != "jobs_per_s" else f"{k}={m[k]:,.0f}"
                     for k in keys if k in m)


def _ratio_target(name: str, ours: float, floor: float, limit: float, op: str) -> dict[str, Any]:
    ratio = ours / floor if floor else math.nan
    ok = ratio <= limit if op == "le" else ratio >= limit
    return {"name": name, "ours": ours, "floor": floor, "ratio": ratio, "limit": limit,
            "op": op, "pass": bool(ok),
            "detail": f"ours {ours:,.3f} / floor {floor:,.3f} = {ratio:.2f} "
                      f"({'<=' if op == 'le' else '>='} {limit})"}


def _abs_target(name: str, value: float, limit: float) -> dict[str, Any]:
    return {"name": name, "value": value, "limit": limit, "op": "le", "pass": value <= limit,
            "detail": f"{value:.3f} ms (<= {limit} ms)"}


def _add_cpu(extra: dict[str, Any], before: dict[str, dict[int, float]],
             after: dict[str, dict[int, float]], jobs: int) -> None:
    """Accumulate the consumer side's CPU seconds (processes and sessions
    alive at both snapshots) into extra["cpu"]."""
    if not before or not after:
        return
    cpu = extra.setdefault("cpu", {"client_s": 0.0, "backend_s": 0.0, "jobs": 0})
    for kind in ("client", "backend"):
        cpu[f"{kind}_s"] += sum(after[kind][pid] - t for pid, t in before[kind].items()
                                if pid in after[kind])
    cpu["jobs"] += jobs
    cpu["client_ms_per_job"] = 1000 * cpu["client_s"] / cpu["jobs"]
    cpu["backend_ms_per_job"] = 1000 * cpu["backend_s"] / cpu["jobs"]


def _clean(v: Any) -> Any:
    return None if isinstance(v, float) and math.isnan(v) else v


def _read_handler_logs(folder: Path) -> dict[int, float]:
    starts: dict[int, float] = {}
    for path in folder.glob("*.log"):
        for line in path.read_text().splitlines():
            job_id, t = line.split()
            # A job handled twice (retry) keeps its first start.
            starts.setdefault(int(job_id), float(t))
    return starts


def _join(jobs: list[list[float]], starts: dict[int, float]) -> tuple[list[float], int]:
    lat = [(starts[int(i)] - t) * 1000 for i, t in jobs if int(i) in starts]
    return lat, len(jobs) - len(lat)


@contextlib.asynccontextmanager
async def _connect(url: str) -> Any:
    conn = await asyncpg.connect(with_app_name(url, "nxbench-orchestrator"))
    try:
        yield conn
    finally:
        await conn.close()


WORKLOADS = ["notify", "select1", "wake", "drain", "mixed"]


async def amain(args: argparse.Namespace) -> int:
    bench = Bench(args)
    started = dt.datetime.now(dt.UTC)
    try:
        bench.admin = await asyncpg.connect(args.dsn)
        server = await bench.admin.fetchval("SHOW server_version")
        meta = {"started": started.isoformat(timespec="seconds"), "cpus": os.cpu_count(),
                "server": f"PostgreSQL {server}", "quick": args.quick,
                "python": sys.version.split()[0]}
        for name in args.only:
            try:
                await asyncio.wait_for(getattr(bench, f"w_{name}")(), args.workload_timeout)
            finally:
                await bench.stop_all()
                await bench.drop_databases()
    except (TimeoutError, BenchError) as exc:
        log(f"benchmark failed: {type(exc).__name__}: {exc}")
        meta = locals().get("meta") or {"started": started.isoformat(), "cpus": os.cpu_count(),
                                        "server": "?"}
        if bench.results:
            bench.print_table(meta)
        return 1
    finally:
        await bench.stop_all()
        await bench.drop_databases()
        if bench.admin is not None:
            await bench.admin.close()
        if not args.keep_tmp:
            shutil.rmtree(bench.tmp, ignore_errors=True)
        else:
            log(f"kept {bench.tmp}")
    out = Path(args.out) if args.out else \
        REPO / "bench" / "results" / f"{started.strftime('%Y%m%dT%H%M%SZ')}.jsonl"
    bench.write_jsonl(out, meta)
    bench.print_table(meta)
    print(f"results: {out}")
    return 0


def parse_args(argv: list[str]) -> argparse.Namespace:
    p = argparse.ArgumentParser(
        prog="queue_bench.py", description=__doc__.split("\n\n")[0],
        formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--dsn", default=os.environ.get("NEXARCH_BENCH_DATABASE_URL", DEFAULT_DSN),
                   help="server URL whose user may CREATE DATABASE (default: "
                        "$NEXARCH_BENCH_DATABASE_URL or %(default)s)")
    p.add_argument("--quick", action="store_true", help="small counts: a smoke run")
    p.add_argument("--only", default=",".join(WORKLOADS),
                   help=f"comma-separated subset of {','.join(WORKLOADS)}")
    p.add_argument("--out", help="JSON lines file (default bench/results/<UTC time>.jsonl)")
    p.add_argument("--producer", choices=["sql", "api"], default="sql",
                   help="ours' producer: raw asyncpg running the package's enqueue statement "
                        "(sql, the default: same client stack as the floor's producer) or "
                        "Queue.enqueue_index through trio-asyncio (api)")
    p.add_argument("--rounds", type=int, default=1,
                   help="wake: alternate floor/ours this many times, pooling the samples")
    p.add_argument("--wake-count", type=int)
    p.add_argument("--interval", type=float, default=0.02, help="wake: seconds between jobs")
    p.add_argument("--warmup", type=int, default=20, help="wake: unmeasured jobs first")
    p.add_argument("--wake-config", default="1x4x100",
                   help="wake: ours' processes x workers x batch size (default: the defaults)")
    p.add_argument("--drain-count", type=int)
    p.add_argument("--drain-configs", default="1x1x100,1x4x100,1x2x500,1x4x500,2x2x500,2x4x250")
    p.add_argument("--mixed-count", type=int)
    p.add_argument("--mixed-configs", default="1x4x100")
    p.add_argument("--notify-count", type=int)
    p.add_argument("--workload-timeout", type=float, default=1800)
    p.add_argument("--worker-env", action="append", default=[], metavar="KEY=VALUE",
                   help="extra environment for ours' worker processes (repeatable)")
    p.add_argument("--systems", default="floor,ours,stack",
                   help="run only these systems' parts (diagnosis; targets need floor "
                        "and ours). stack (wake and mixed): the floor's loop on "
                        "trio-asyncio")
    p.add_argument("--trace", action="store_true",
                   help="wake: timestamp each step of the wake path in the consumer "
                        "(bench/wake_trace.py) and print where the time goes")
    p.add_argument("--py-spy", metavar="DIR",
                   help="record every worker/consumer process with py-spy (raw collapsed "
                        "stacks into DIR; needs .venv/bin/py-spy)")
    p.add_argument("--py-spy-rate", type=int, default=250)
    p.add_argument("--keep-db", action="store_true", help="do not drop the databases")
    p.add_argument("--keep-tmp", action="store_true", help="keep logs and handler files")
    args = p.parse_args(argv)
    args.only = [w.strip() for w in args.only.split(",") if w.strip()]
    unknown = set(args.only) - set(WORKLOADS)
    if unknown:
        p.error(f"--only: unknown workload(s) {', '.join(sorted(unknown))}")
    q = args.quick
    args.wake_count = args.wake_count or (100 if q else 500)
    args.drain_count = args.drain_count or (5000 if q else 20000)
    args.mixed_count = args.mixed_count or (2000 if q else 10000)
    args.notify_count = args.notify_count or (500 if q else 5000)
    if q and args.drain_configs == p.get_default("drain_configs"):
        args.drain_configs = "1x1x100,2x2x500"
    args.drain_configs = [c for c in args.drain_configs.split(",") if c]
    args.mixed_configs = [c for c in args.mixed_configs.split(",") if c]
    args.systems = [x.strip() for x in args.systems.split(",") if x.strip()]
    args.worker_env = dict(kv.split("=", 1) for kv in args.worker_env)
    return args


def main(argv: list[str] | None = None) -> int:
    argv = sys.argv[1:] if argv is None else argv
    if argv and argv[0] == "_role":
        run_role(argv[1:])
        return 0
    args = parse_args(argv)
    try:
        return asyncio.run(amain(args))
    except KeyboardInterrupt:
        return 130


if __name__ == "__main__":
    sys.exit(main())
