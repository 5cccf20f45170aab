"""Process metrics in the Prometheus text format (``GET /metrics``).

In-process counters and a histogram are updated where things happen (the
workers, the import scheduler); queue depth and import lag are read from the
tables at scrape time by the caller (the API's ``/metrics`` route), so every
process reports the same truth for them. This module reads no table itself:
the queue and the importer depend on it, so it must not depend on them.
Only standard-library code: the exposition format is a few lines of text.
"""

from __future__ import annotations

import bisect
import time
from collections import Counter
from collections.abc import Callable, Iterable, Sequence

from .aio import Row
from .models import AckResult, ClaimedJob, QueueStats

#: Seconds from enqueue to claim (first attempts only): the wake latency.
WAKE_BUCKETS = (0.001, 0.002, 0.005, 0.01, 0.02, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0)


class Histogram:
    def __init__(self, buckets: Sequence[float]) -> None:
        self.buckets = tuple(sorted(buckets))
        self.counts = [0] * (len(self.buckets) + 1)
        self.total = 0.0
        self.samples: list[float] = []

    def observe(self, value: float) -> None:
        self.counts[bisect.bisect_left(self.buckets, value)] += 1
        self.total += value
        # A bounded window for percentiles (GET /queue).
        self.samples.append(value)
        if len(self.samples) > 10_000:
            del self.samples[:5_000]

    @property
    def count(self) -> int:
        return sum(self.counts)

    def percentile(self, q: float) -> float | None:
        if not self.samples:
            return None
        ordered = sorted(self.samples)
        return ordered[min(len(ordered) - 1, int(q * len(ordered)))]

    def render(self, name: str, help_text: str) -> list[str]:
        lines = [f"# HELP {name} {help_text}", f"# TYPE {name} histogram"]
        running = 0
        for bound, n in zip(self.buckets, self.counts, strict=False):
            running += n
            lines.append(f'{name}_bucket{{le="{bound:g}"}} {running}')
        lines.append(f'{name}_bucket{{le="+Inf"}} {self.count}')
        lines.append(f"{name}_sum {self.total:.6f}")
        lines.append(f"{name}_count {self.count}")
        return lines


def _label(value: str) -> str:
    return value.replace("\\", "\\\\").replace('"', '\\"').replace("\n", "\\n")


class Metrics:
    """One per process; shared by the workers, the importer and the API."""

    def __init__(self) -> None:
        self.started = time.time()
        self.wake_latency = Histogram(WAKE_BUCKETS)
        self.job_outcomes: Counter[str] = Counter()
        self.import_runs: Counter[tuple[str, str, str]] = Counter()
        self.imported_messages: Counter[tuple[str, str]] = Counter()
        #: Reads the LISTEN connection's reconnect count (set by the service).
        self.listener_reconnects: Callable[[], int] = lambda: 0

    def observe_claims(self, jobs: Iterable[ClaimedJob]) -> None:
        now = time.time()
        for job in jobs:
            if job.attempts <= 1:
                self.wake_latency.observe(max(0.0, now - job.enqueued_at.timestamp()))

    def count_ack(self, result: AckResult) -> None:
        for status in result.statuses.values():
            self.job_outcomes[status.value if status.value in ("succeeded", "failed")
                              else "retried"] += 1
        self.job_outcomes["refused"] += len(result.refused)

    def count_import_run(self, tenant: str, mailbox: str, *, ok: bool, imported: int) -> None:
        self.import_runs[(tenant, mailbox, "ok" if ok else "error")] += 1
        self.imported_messages[(tenant, mailbox)] += imported

    def render(self, stats: QueueStats, lag_rows: Sequence[Row]) -> str:
        """The exposition text: these counters plus the scrape-time ``stats``
        and ``lag_rows`` (the ``lag`` query of importer.sql)."""
        lines: list[str] = []
        lines += ["# HELP nexarch_queue_jobs Jobs in the queue by status.",
                  "# TYPE nexarch_queue_jobs gauge"]
        lines += [f'nexarch_queue_jobs{{status="{s.value}"}} {n}' for s, n in stats.counts.items()]
        lines += ["# HELP nexarch_queue_oldest_ready_seconds Age of the oldest ready job.",
                  "# TYPE nexarch_queue_oldest_ready_seconds gauge",
                  f"nexarch_queue_oldest_ready_seconds {stats.oldest_ready_age_s or 0:.3f}"]
        lines += ["# HELP nexarch_jobs_total Jobs finished by this process, by outcome.",
                  "# TYPE nexarch_jobs_total counter"]
        for outcome in ("succeeded", "failed", "retried", "refused"):
            lines.append(f'nexarch_jobs_total{{outcome="{outcome}"}} '
                         f"{self.job_outcomes[outcome]}")
        lines += self.wake_latency.render(
            "nexarch_wake_latency_seconds",
            "Enqueue to claim of first attempts, as seen by this process's workers.")
        lines += ["# HELP nexarch_listener_reconnects_total LISTEN connection reconnects.",
                  "# TYPE nexarch_listener_reconnects_total counter",
                  f"nexarch_listener_reconnects_total {self.listener_reconnects()}"]
        lines += ["# HELP nexarch_import_pending_messages UIDs the server had announced "
                  "(UIDNEXT) above the mailbox's watermark at its last run.",
                  "# TYPE nexarch_import_pending_messages gauge"]
        lag = ["# HELP nexarch_import_lag_seconds Seconds since the mailbox's last "
               "successful sync.", "# TYPE nexarch_import_lag_seconds gauge"]
        for r in lag_rows:
            labels = f'tenant="{_label(r["tenant_slug"])}",mailbox="{_label(r["mailbox_name"])}"'
            pending = max(0, (r["server_uidnext"] or 1) - 1 - r["last_synced_uid"])
            lines.append(f"nexarch_import_pending_messages{{{labels}}} {pending}")
            if r["since_success"] is not None:
                lag.append(f"nexarch_import_lag_seconds{{{labels}}} {r['since_success']:.3f}")
        lines += lag
        lines += ["# HELP nexarch_import_runs_total Sync runs by this process.",
                  "# TYPE nexarch_import_runs_total counter"]
        for (tenant, mailbox, outcome), n in sorted(self.import_runs.items()):
            lines.append(f'nexarch_import_runs_total{{tenant="{_label(tenant)}",'
                         f'mailbox="{_label(mailbox)}",outcome="{outcome}"}} {n}')
        return "\n".join(lines) + "\n"
