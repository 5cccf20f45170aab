"""Where the wake-up time goes inside one worker process (diagnosis).

``--handlers bench.wake_trace:TRACED`` runs the no-op TIMED handler of
bench.handlers and, on import, wraps (in this process only; nothing in the
package is changed) the steps of the wake path to record ``time.time()``:

  pg.notification   asyncpg parsed the NotificationResponse (asyncio side)
  deliver           Listener._deliver ran (asyncpg's call_soon'd callback)
  wake              WakeUps.wake (the listener's delivery turned it into a wake-up)
  woken             WakeUps.wait returned in the worker task
  claim.start       Queue.claim called (trio side)
  pool.acquire.*    asyncpg Pool._acquire (asyncio side)
  conn.fetch.*      asyncpg Connection.fetch: the query's round trip
  pool.release.*    asyncpg pool connection release (runs the reset query)
  pool.fetch.*      asyncpg Pool.fetch as a whole (asyncio side)
  claim.end         Queue.claim returned (trio side)
  handler           the handler started

The events stay in memory and are written at exit to
``$NEXARCH_BENCH_TRACE_LOG/trace-<pid>.jsonl``. ``queue_bench.py --trace``
uses this module for ours' wake run and prints ``breakdown(...)``.
"""

from __future__ import annotations

import atexit
import json
import os
import time
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

from bench.handlers import timed

_events: list[tuple[str, float, Any]] = []
_ev = _events.append
_now = time.time


def _dump() -> None:
    folder = os.environ.get("NEXARCH_BENCH_TRACE_LOG")
    if not folder:
        return
    with open(os.path.join(folder, f"trace-{os.getpid()}.jsonl"), "w", encoding="utf-8") as out:
        for name, t, info in _events:
            out.write(json.dumps([name, t, info]) + "\n")


def _install() -> None:
    import asyncpg.connection
    import asyncpg.pool

    from nexarch_events.db import sqlfiles
    from nexarch_events.queue import jobs as queue
    from nexarch_events.queue import notify, worker

    names = {text: name for name, text in sqlfiles.queries("queue.sql").items()}

    def qname(query: str) -> str:
        return names.get(query, query[:20])

    conn_cls = asyncpg.connection.Connection
    orig_notification = conn_cls._process_notification

    def process_notification(self: Any, pid: int, channel: str, payload: str) -> None:
        _ev(("pg.notification", _now(), channel))
        orig_notification(self, pid, channel, payload)

    conn_cls._process_notification = process_notification

    orig_fetch = conn_cls.fetch

    async def conn_fetch(self: Any, query: str, *args: Any, **kw: Any) -> Any:
        name = qname(query)
        _ev(("conn.fetch.start", _now(), name))
        try:
            return await orig_fetch(self, query, *args, **kw)
        finally:
            _ev(("conn.fetch.end", _now(), name))

    conn_cls.fetch = conn_fetch

    pool_cls = asyncpg.pool.Pool
    orig_pool_fetch = pool_cls.fetch

    async def pool_fetch(self: Any, query: str, *args: Any, **kw: Any) -> Any:
        name = qname(query)
        _ev(("pool.fetch.start", _now(), name))
        try:
            return await orig_pool_fetch(self, query, *args, **kw)
        finally:
            _ev(("pool.fetch.end", _now(), name))

    pool_cls.fetch = pool_fetch

    orig_acquire = pool_cls._acquire

    async def acquire(self: Any, timeout: Any) -> Any:
        _ev(("pool.acquire.start", _now(), None))
        try:
            return await orig_acquire(self, timeout)
        finally:
            _ev(("pool.acquire.end", _now(), None))

    pool_cls._acquire = acquire

    holder_cls = asyncpg.pool.PoolConnectionHolder
    orig_release = holder_cls.release

    async def release(self: Any, timeout: Any) -> Any:
        _ev(("pool.release.start", _now(), None))
        try:
            return await orig_release(self, timeout)
        finally:
            _ev(("pool.release.end", _now(), None))

    holder_cls.release = release

    orig_deliver = notify.Listener._deliver

    def deliver(self: Any, channel: str, payload: str) -> None:
        _ev(("deliver", _now(), channel))
        orig_deliver(self, channel, payload)

    notify.Listener._deliver = deliver  # type: ignore[method-assign]

    orig_wake = worker.WakeUps.wake

    def wake(self: Any, n: int) -> int:
        woken = orig_wake(self, n)
        _ev(("wake", _now(), [n, woken]))
        return woken

    worker.WakeUps.wake = wake  # type: ignore[method-assign]

    orig_wait = worker.WakeUps.wait

    async def wait(self: Any) -> None:
        await orig_wait(self)
        _ev(("woken", _now(), None))

    worker.WakeUps.wait = wait  # type: ignore[method-assign]

    orig_claim = queue.Queue.claim

    async def claim(self: Any, limit: int, worker_id: str) -> Any:
        _ev(("claim.start", _now(), worker_id))
        jobs = await orig_claim(self, limit, worker_id)
        _ev(("claim.end", _now(), [int(j.id) for j in jobs]))
        return jobs

    queue.Queue.claim = claim  # type: ignore[method-assign]


async def traced(jobs: Sequence[Any]) -> Mapping[Any, Any]:
    _ev(("handler", _now(), [int(j.id) for j in jobs]))
    return await timed(jobs)


if os.environ.get("NEXARCH_BENCH_TRACE_LOG"):
    _install()
    atexit.register(_dump)

TRACED: Mapping[str, Any] = {"index": traced, "delete": traced}


# --------------------------------------------------------------------------
# Analysis (runs in the benchmark, not in the worker).

STEPS = [
    ("commit -> pg.notification (asyncpg parsed it)", "commit", "pg.notification"),
    ("pg.notification -> deliver (call_soon'd callback)", "pg.notification", "deliver"),
    ("= commit -> deliver", "commit", "deliver"),
    ("deliver -> wake (in the delivery)", "deliver", "wake"),
    ("wake -> woken (worker task resumes)", "wake", "woken"),
    ("woken -> claim.start", "woken", "claim.start"),
    ("= deliver -> claim.start", "deliver", "claim.start"),
    ("claim.start -> pool.fetch.start (hop in)", "claim.start", "pool.fetch.start"),
    ("pool.acquire", "pool.acquire.start", "pool.acquire.end"),
    ("acquire.end -> conn.fetch.start", "pool.acquire.end", "conn.fetch.start"),
    ("conn.fetch (the claim's round trip)", "conn.fetch.start", "conn.fetch.end"),
    ("conn.fetch.end -> release.start", "conn.fetch.end", "pool.release.start"),
    ("pool.release (reset query round trip)", "pool.release.start", "pool.release.end"),
    ("release.end -> pool.fetch.end", "pool.release.end", "pool.fetch.end"),
    ("pool.fetch.end -> claim.end (hop out)", "pool.fetch.end", "claim.end"),
    ("= claim.start -> claim.end", "claim.start", "claim.end"),
    ("claim.end -> handler", "claim.end", "handler"),
    ("TOTAL commit -> handler", "commit", "handler"),
]

_INNER = ("pool.fetch.end", "pool.release.end", "pool.release.start", "conn.fetch.end",
          "conn.fetch.start", "pool.acquire.end", "pool.acquire.start", "pool.fetch.start",
          "claim.start")
_WAKE_PATH = ("woken", "wake", "deliver", "pg.notification")


def load_events(folder: Path) -> list[tuple[str, float, Any]]:
    events: list[tuple[str, float, Any]] = []
    for path in folder.glob("trace-*.jsonl"):
        events += [tuple(json.loads(line)) for line in path.read_text().splitlines()]
    events.sort(key=lambda e: e[1])
    return events


def breakdown(runs: Sequence[tuple[Path, dict[int, float]]]
              ) -> list[tuple[str, int, float, float]]:
    """Per step: (name, n, p50 ms, p99 ms), for jobs handled alone (wake
    runs). ``runs``: (trace folder, {job id: commit time}) per run."""
    per_step: dict[str, list[float]] = {name: [] for name, _, _ in STEPS}
    for folder, commits in runs:
        _collect(load_events(folder), commits, per_step)
    out = []
    for step, _, _ in STEPS:
        values = sorted(per_step[step])
        if values:
            out.append((step, len(values), values[len(values) // 2],
                        values[max(0, -(-99 * len(values) // 100) - 1)]))
    return out


def _collect(events: list[tuple[str, float, Any]], commits: dict[int, float],
             per_step: dict[str, list[float]]) -> None:
    for idx, (name, t, info) in enumerate(events):
        if name != "handler" or len(info) != 1 or info[0] not in commits:
            continue
        job = info[0]
        commit = commits[job]
        stamps: dict[str, float] = {"commit": commit, "handler": t}
        j = idx - 1
        while j >= 0 and not (events[j][0] == "claim.end" and job in events[j][2]):
            j -= 1
        if j < 0:
            continue
        stamps["claim.end"] = events[j][1]
        k = j - 1
        claim_start = j
        while k >= 0 and events[k][1] >= commit - 0.005:
            ev_name, ev_t, ev_info = events[k]
            if ev_name in _INNER and ev_name not in stamps and not (
                    ev_name.startswith(("conn.fetch", "pool.fetch")) and ev_info != "claim"):
                stamps[ev_name] = ev_t
            if ev_name == "claim.start":
                claim_start = k
                break
            k -= 1
        for ev_name in _WAKE_PATH:
            k = claim_start - 1
            while k >= 0 and events[k][1] >= commit - 0.005:
                ev_n, ev_t, ev_info = events[k]
                if ev_n == ev_name and (ev_n not in ("deliver", "pg.notification")
                                        or ev_info in ("nexarch_index_jobs", "bench_raw_jobs")):
                    stamps[ev_name] = ev_t
                    break
                k -= 1
        for step, a, b in STEPS:
            if a in stamps and b in stamps:
                per_step[step].append((stamps[b] - stamps[a]) * 1000)
