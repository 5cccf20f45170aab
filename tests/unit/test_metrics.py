"""/metrics text: the metric names kept, label values escaped, the process
collector's series present, and each Metrics with its own registry."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta
from typing import Any

from prometheus_client.parser import text_string_to_metric_families

from nexarch_events.metrics import Metrics
from nexarch_events.models import AckResult, ClaimedJob, JobId, JobStatus, QueueStats


def families(text: str) -> dict[str, Any]:
    return {family.name: family for family in text_string_to_metric_families(text)}


def samples(text: str) -> dict[tuple[str, tuple[tuple[str, str], ...]], float]:
    return {(s.name, tuple(sorted(s.labels.items()))): s.value
            for family in text_string_to_metric_families(text) for s in family.samples}


STATS = QueueStats({JobStatus.PENDING: 3, JobStatus.PROCESSING: 1, JobStatus.SUCCEEDED: 7,
                    JobStatus.FAILED: 0}, 2.5)
ROW = {"tenant_slug": "acme", "mailbox_name": 'in"box\\new\nline', "server_uidnext": 11,
       "last_synced_uid": 7, "since_success": 4.25}


def test_names_types_values_and_escaping() -> None:
    metrics = Metrics()
    metrics.listener_reconnects = lambda: 2
    metrics.pruned_jobs = lambda: 1500
    metrics.vacuums = lambda: 3
    metrics.vacuum_seconds = lambda: 0.75
    metrics.count_ack(AckResult({JobId(1): JobStatus.SUCCEEDED, JobId(2): JobStatus.PENDING},
                                (JobId(3),)))
    metrics.count_import_run("acme", ROW["mailbox_name"], ok=True, imported=4)
    text = metrics.render(STATS, [ROW])  # type: ignore[list-item]
    got = samples(text)
    kinds = {name: f.type for name, f in families(text).items()}
    assert got[("nexarch_queue_jobs", (("status", "pending"),))] == 3
    assert got[("nexarch_queue_oldest_ready_seconds", ())] == 2.5
    assert got[("nexarch_jobs_total", (("outcome", "succeeded"),))] == 1
    assert got[("nexarch_jobs_total", (("outcome", "retried"),))] == 1
    assert got[("nexarch_jobs_total", (("outcome", "refused"),))] == 1
    assert got[("nexarch_jobs_total", (("outcome", "failed"),))] == 0
    assert got[("nexarch_listener_reconnects_total", ())] == 2
    assert got[("nexarch_queue_pruned_jobs_total", ())] == 1500
    assert got[("nexarch_queue_vacuums_total", ())] == 3
    assert got[("nexarch_queue_vacuum_seconds_total", ())] == 0.75
    box = (("mailbox", ROW["mailbox_name"]), ("tenant", "acme"))  # parsed back intact
    assert got[("nexarch_import_pending_messages", box)] == 3
    assert got[("nexarch_import_lag_seconds", box)] == 4.25
    assert got[("nexarch_import_runs_total", (("mailbox", ROW["mailbox_name"]),
                                              ("outcome", "ok"), ("tenant", "acme")))] == 1
    assert kinds["nexarch_jobs"] == "counter" and kinds["nexarch_queue_jobs"] == "gauge"
    assert kinds["nexarch_wake_latency_seconds"] == "histogram"
    # The process collector (Linux): CPU, memory, open fds, start time.
    for name in ("process_cpu_seconds", "process_resident_memory_bytes", "process_open_fds",
                 "process_start_time_seconds"):
        assert name in kinds, name


def test_wake_latency_histogram_and_percentiles() -> None:
    metrics = Metrics()
    now = datetime.now(UTC)
    jobs = [ClaimedJob(JobId(i), "index", "acme", f"m{i}", {}, attempts=1, max_attempts=5,
                       lease=None, enqueued_at=now - timedelta(seconds=0.003))  # type: ignore
            for i in range(4)]
    metrics.observe_claims(jobs)
    got = samples(metrics.render(STATS, []))
    assert got[("nexarch_wake_latency_seconds_count", ())] == 4
    assert got[("nexarch_wake_latency_seconds_bucket", (("le", "0.001"),))] == 0
    assert got[("nexarch_wake_latency_seconds_bucket", (("le", "+Inf"),))] == 4
    p50 = metrics.wake_latency.percentile(0.5)
    assert p50 is not None and p50 >= 0.003


def test_each_metrics_has_its_own_registry() -> None:
    one, two = Metrics(), Metrics()
    one.count_import_run("acme", "inbox", ok=False, imported=0)
    assert ("nexarch_import_runs_total", (("mailbox", "inbox"), ("outcome", "error"),
                                          ("tenant", "acme"))) in samples(one.render(STATS, []))
    assert not any(name == "nexarch_import_runs_total"
                   for name, _ in samples(two.render(STATS, [])))
