"""Process metrics for Prometheus (``GET /metrics``), kept by
``prometheus_client``.

In-process counters and a histogram are updated where things happen (the
workers, the import scheduler); queue depth and import lag are read from the
tables at scrape time by the caller (the API's ``/metrics`` route), so every
process reports the same truth for them. This module reads no table itself:
the queue and the importer depend on it, so it must not depend on them.

Each ``Metrics`` has a registry of its own (never the library's global one),
so several services or tests in one process do not collide. Everything here
is synchronous: ``render`` fills in the scrape-time values and writes the
text in one step, with no await in between, so concurrent scrapes under trio
cannot see each other's values.
"""

from __future__ import annotations

import time
from collections import Counter as Tally
from collections.abc import Callable, Iterable, Iterator, Sequence

from prometheus_client import CollectorRegistry, Counter, Histogram, ProcessCollector
from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily, Metric
from prometheus_client.exposition import generate_latest
from prometheus_client.registry import Collector

from .aio import Row
from .models import AckResult, ClaimedJob, QueueStats

#: Seconds from enqueue to claim (first attempts only): the wake latency.
WAKE_BUCKETS = (0.001, 0.002, 0.005, 0.01, 0.02, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0)
#: The text format ``render`` writes (classic names: the 0.0.4 format).
CONTENT_TYPE = "text/plain; version=0.0.4; charset=utf-8"
_OUTCOMES = ("succeeded", "failed", "retried", "refused")


class LatencyWindow:
    """The most recent samples, for percentiles (``GET /queue``); the
    histogram is for Prometheus, which cannot answer "p99 now"."""

    def __init__(self, limit: int = 10_000) -> None:
        self.limit = limit
        self.samples: list[float] = []

    def observe(self, value: float) -> None:
        self.samples.append(value)
        if len(self.samples) > self.limit:
            del self.samples[:self.limit // 2]

    def percentile(self, q: float) -> float | None:
        if not self.samples:
            return None
        ordered = sorted(self.samples)
        return ordered[min(len(ordered) - 1, int(q * len(ordered)))]


class Metrics:
    """One per process; shared by the workers, the importer and the API."""

    def __init__(self) -> None:
        self.started = time.time()
        self.registry = CollectorRegistry()
        # CPU, memory, open fds, start time (Linux; nothing elsewhere).
        ProcessCollector(registry=self.registry)
        self.wake_latency = LatencyWindow()
        self._wake = Histogram(
            "nexarch_wake_latency_seconds",
            "Enqueue to claim of first attempts, as seen by this process's workers.",
            buckets=WAKE_BUCKETS, registry=self.registry)
        self._jobs = Counter("nexarch_jobs", "Jobs finished by this process, by outcome.",
                             ["outcome"], registry=self.registry)
        for outcome in _OUTCOMES:
            self._jobs.labels(outcome)  # present from the start, at 0
        self._runs = Counter("nexarch_import_runs", "Sync runs by this process.",
                             ["tenant", "mailbox", "outcome"], registry=self.registry)
        self.imported_messages: Tally[tuple[str, str]] = Tally()
        #: Reads the LISTEN connection's reconnect count (set by the service).
        self.listener_reconnects: Callable[[], int] = lambda: 0
        #: Read the job table's upkeep by this process (set by the service):
        #: jobs pruned by the sweeper, VACUUMs run and seconds spent in them.
        self.pruned_jobs: Callable[[], int] = lambda: 0
        self.vacuums: Callable[[], int] = lambda: 0
        self.vacuum_seconds: Callable[[], float] = lambda: 0.0
        self._scrape = _Scrape(self)
        self.registry.register(self._scrape)

    def observe_claims(self, jobs: Iterable[ClaimedJob]) -> None:
        now = time.time()
        for job in jobs:
            if job.attempts <= 1:
                latency = max(0.0, now - job.enqueued_at.timestamp())
                self.wake_latency.observe(latency)
                self._wake.observe(latency)

    def count_ack(self, result: AckResult) -> None:
        for status in result.statuses.values():
            self._jobs.labels(status.value if status.value in ("succeeded", "failed")
                              else "retried").inc()
        if result.refused:
            self._jobs.labels("refused").inc(len(result.refused))

    def count_import_run(self, tenant: str, mailbox: str, *, ok: bool, imported: int) -> None:
        self._runs.labels(tenant, mailbox, "ok" if ok else "error").inc()
        self.imported_messages[(tenant, mailbox)] += imported

    def render(self, stats: QueueStats, lag_rows: Sequence[Row]) -> str:
        """The exposition text: these metrics plus the scrape-time ``stats``
        and ``lag_rows`` (the ``lag`` query of importer.sql)."""
        self._scrape.stats, self._scrape.lag_rows = stats, lag_rows
        try:
            return generate_latest(self.registry).decode("utf-8")
        finally:
            self._scrape.stats, self._scrape.lag_rows = None, ()


class _Scrape(Collector):
    """What is read at scrape time: queue depth, import lag, reconnects,
    the job table's upkeep."""

    def __init__(self, metrics: Metrics) -> None:
        self.metrics = metrics
        self.stats: QueueStats | None = None
        self.lag_rows: Sequence[Row] = ()

    def collect(self) -> Iterator[Metric]:
        if self.stats is not None:
            jobs = GaugeMetricFamily("nexarch_queue_jobs", "Jobs in the queue by status.",
                                     labels=["status"])
            for status, n in self.stats.counts.items():
                jobs.add_metric([status.value], n)
            yield jobs
            yield GaugeMetricFamily("nexarch_queue_oldest_ready_seconds",
                                    "Age of the oldest ready job.",
                                    value=self.stats.oldest_ready_age_s or 0.0)
        yield CounterMetricFamily("nexarch_listener_reconnects", "LISTEN connection reconnects.",
                                  value=self.metrics.listener_reconnects())
        yield CounterMetricFamily("nexarch_queue_pruned_jobs",
                                  "Finished jobs deleted by this process's sweeper (retention).",
                                  value=self.metrics.pruned_jobs())
        yield CounterMetricFamily("nexarch_queue_vacuums",
                                  "VACUUMs of mail_index_jobs run by this process "
                                  "(including those skipped because the table was busy).",
                                  value=self.metrics.vacuums())
        yield CounterMetricFamily("nexarch_queue_vacuum_seconds",
                                  "Seconds this process spent vacuuming mail_index_jobs.",
                                  value=self.metrics.vacuum_seconds())
        pending = GaugeMetricFamily(
            "nexarch_import_pending_messages", "UIDs the server had announced (UIDNEXT) above "
            "the mailbox's watermark at its last run.", labels=["tenant", "mailbox"])
        lag = GaugeMetricFamily("nexarch_import_lag_seconds",
                                "Seconds since the mailbox's last successful sync.",
                                labels=["tenant", "mailbox"])
        for r in self.lag_rows:
            labels = [r["tenant_slug"], r["mailbox_name"]]
            pending.add_metric(labels, max(0, (r["server_uidnext"] or 1) - 1
                                           - r["last_synced_uid"]))
            if r["since_success"] is not None:
                lag.add_metric(labels, float(r["since_success"]))
        yield pending
        yield lag
