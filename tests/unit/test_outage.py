"""Outage logs once per outage; RateLimited keeps per-job lines bounded."""

from __future__ import annotations

import logging

import pytest

from nexarch_events.errors import DatabaseTransient
from nexarch_events.queue.outage import Outage, RateLimited

log = logging.getLogger("test.outage")


def test_an_outage_is_logged_once_at_warning_and_its_end_at_info(
        caplog: pytest.LogCaptureFixture) -> None:
    caplog.set_level("DEBUG", logger="test.outage")
    outage = Outage("worker w", log, first_delay=0.1, max_delay=0.3)
    delays = [outage.failed(DatabaseTransient("x", sqlstate="57014")) for _ in range(4)]
    assert delays == [0.1, 0.2, 0.3, 0.3]
    outage.ok()
    outage.ok()
    assert [r.levelname for r in caplog.records] == ["WARNING", "DEBUG", "DEBUG", "DEBUG", "INFO"]
    assert outage.failed(DatabaseTransient("y")) == 0.1  # a new outage starts over


def test_rate_limited_lines_are_counted_and_reported(caplog: pytest.LogCaptureFixture) -> None:
    caplog.set_level("INFO", logger="test.outage")
    limited = RateLimited(log, logging.INFO, burst=3, period=10.0)
    logged = [limited("line %d", n, now=100.0 + n * 0.1) for n in range(10)]
    assert logged == [True] * 3 + [False] * 7
    assert limited.suppressed == 7
    assert limited("later", now=111.0)
    assert len(caplog.records) == 4
    assert caplog.records[-1].args == (7,)
    assert limited.suppressed == 0
