"""``nexarch-events demo``: a worker process plus a producer in this process.

The producer enqueues index jobs at a steady rate and listens on the
job-events channel; each "succeeded" notification is matched to its job, so
the demo shows enqueue-committed -> acknowledged latency as it goes. This is
the queue on its own; the full service (IMAP import, search) replaces it in
later issues.
"""

from __future__ import annotations

import os
import sys
import time

import trio

from .aio import Database
from .aio import run as aio_run
from .migrations import migrate
from .notify import JOB_EVENTS_CHANNEL, Listener, Notification, Subscription
from .queue import Queue
from .settings import Settings


def percentile(values: list[float], q: float) -> float:
    if not values:
        return float("nan")
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, int(q * len(ordered)))]


def succeeded_ids(event: object) -> list[int]:
    """Job ids of a job-events "succeeded" notification, else []."""
    if not isinstance(event, Notification):
        return []
    data = event.json()
    ids = data.get("ids")
    if data.get("event") != "succeeded" or not isinstance(ids, list):
        return []
    return [i for i in ids if isinstance(i, int)]


class _Producer:
    def __init__(self, db: Database, settings: Settings, jobs: int, rate: float) -> None:
        self.queue = Queue(db, settings.queue)
        self.listener = Listener(db.dsn, settings.queue, channels=(JOB_EVENTS_CHANNEL,))
        self.events: Subscription = self.listener.subscribe(JOB_EVENTS_CHANNEL)
        self.jobs, self.rate = jobs, rate
        self.enqueued_at: dict[int, float] = {}
        #: outcomes that arrived before their enqueue call returned (a fast
        #: worker finishes a job before the producer's coroutine resumes)
        self.early: dict[int, float] = {}
        self.latencies_ms: list[float] = []
        self.warm_id = -1
        self.warmed_up = trio.Event()
        self.done = trio.Event()

    async def consume(self) -> None:
        async for event in self.events:
            ids = succeeded_ids(event)
            if self.warm_id in ids:
                self.warmed_up.set()
            for job_id in ids:
                start = self.enqueued_at.pop(job_id, None)
                if start is None:
                    if isinstance(event, Notification):
                        self.early[job_id] = event.received_at
                elif isinstance(event, Notification):
                    self._record(event.received_at - start)

    def enqueued(self, job_id: int, start: float) -> None:
        """The producer's side: ``job_id`` was enqueued at ``start``."""
        if job_id in self.early:
            self._record(self.early.pop(job_id) - start)
        else:
            self.enqueued_at[job_id] = start

    def _record(self, seconds: float) -> None:
        self.latencies_ms.append(seconds * 1000)
        if len(self.latencies_ms) >= self.jobs:
            self.done.set()

    async def report(self) -> None:
        window = max(int(self.rate), 1)
        while not self.done.is_set():
            with trio.move_on_after(1.0):
                await self.done.wait()
            recent = self.latencies_ms[-window:]
            print(f"handled {len(self.latencies_ms):5d}/{self.jobs} jobs   "
                  f"enqueue->done latency p50 {percentile(recent, 0.5):6.2f} ms  "
                  f"p99 {percentile(recent, 0.99):6.2f} ms", flush=True)

    async def run(self) -> None:
        async with trio.open_nursery() as nursery:
            await nursery.start(self.listener.run)
            nursery.start_soon(self.consume)
            # Wait until the worker process really consumes before timing.
            self.warm_id = int(await self.queue.enqueue_index("demo", "warm-up", {}))
            with trio.fail_after(60):
                await self.warmed_up.wait()
            nursery.start_soon(self.report)
            next_at = trio.current_time()
            for n in range(self.jobs):
                # Timed from just before the enqueue: its commit may be
                # followed by the job's outcome before this coroutine resumes.
                start = time.time()
                job_id = int(await self.queue.enqueue_index(
                    "demo", f"demo-message-{n}", {"subject": f"demo mail {n}"}))
                self.enqueued(job_id, start)
                next_at += 1.0 / self.rate
                await trio.sleep_until(next_at)
            with trio.move_on_after(30):
                await self.done.wait()
            nursery.cancel_scope.cancel()


def run_demo(url: str, settings: Settings, *, jobs: int, rate: float) -> int:
    """Blocks until ``jobs`` jobs were handled (or 30 s after the last one)."""

    async def main() -> int:
        async with Database.open(url, max_size=2) as db:
            await migrate(db)
            worker = await trio.lowlevel.open_process(
                [sys.executable, "-m", "nexarch_events", "--log-level", "warning", "worker",
                 "--handlers", "nexarch_events.handlers:LOGGING"],
                env=dict(os.environ, NEXARCH_DATABASE_URL=url))
            print(f"worker process started (pid {worker.pid}); database {url}", flush=True)
            producer = _Producer(db, settings, jobs, rate)
            try:
                await producer.run()
            finally:
                # SIGTERM is the worker's graceful stop; bounded, then killed.
                worker.terminate()
                with trio.move_on_after(30, shield=True) as scope:
                    await worker.wait()
                if scope.cancelled_caught:
                    worker.kill()
            stats = await producer.queue.stats()
        lat = producer.latencies_ms
        print(f"worker stopped (exit code {worker.returncode})")
        print(f"done: {len(lat)}/{jobs} jobs handled; enqueue->done latency "
              f"p50 {percentile(lat, 0.5):.2f} ms, p99 {percentile(lat, 0.99):.2f} ms, "
              f"max {max(lat, default=0):.2f} ms")
        print("queue: " + ", ".join(f"{k}={v}" for k, v in stats.counts.items()))
        return 0 if len(lat) >= jobs and worker.returncode == 0 else 1

    return aio_run(main)
