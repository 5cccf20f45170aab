"""One log line per outage, and the backoff that goes with it.

A worker that cannot reach Postgres retries every few seconds; logging every
attempt would bury the one line an operator needs. ``Outage`` logs the first
failure of a run at WARNING (with its SQLSTATE), later ones of the same run
at DEBUG, and the first success afterwards at INFO with how long it lasted.
"""

from __future__ import annotations

import logging
import time

from ..errors import DatabaseError


class Outage:
    """A run of transient failures of one task (a worker, the sweeper, ...).

    Not shared between tasks: each keeps its own delay and its own line.
    """

    def __init__(self, what: str, logger: logging.Logger, *, first_delay: float = 0.05,
                 max_delay: float = 5.0, kind: str = "database error") -> None:
        self.what = what
        self.kind = kind
        self.log = logger
        self.first_delay = first_delay
        self.max_delay = max_delay
        self._delay = first_delay
        self._since: float | None = None
        self._failures = 0

    @property
    def ongoing(self) -> bool:
        return self._since is not None

    def failed(self, exc: BaseException) -> float:
        """Record a failure; returns how long to wait before the next try
        (doubling from ``first_delay`` up to ``max_delay``)."""
        delay = self._delay
        self._delay = min(self._delay * 2, self.max_delay)
        self._failures += 1
        sqlstate = exc.sqlstate if isinstance(exc, DatabaseError) else None
        if self._since is None:
            self._since = time.monotonic()
            self.log.warning("%s: %s, backing off and retrying "
                             "(logged once until it recovers) sqlstate=%s error=%s",
                             self.what, self.kind, sqlstate or "-", exc)
        else:
            self.log.debug("%s: still failing, retry in %.2fs sqlstate=%s error=%s",
                           self.what, delay, sqlstate or "-", exc)
        return delay

    def ok(self) -> None:
        """Record a success: ends the outage (logged) and resets the backoff."""
        self._delay = self.first_delay
        if self._since is not None:
            self.log.info("%s: recovered after %.1fs and %d failed attempt(s)", self.what,
                          time.monotonic() - self._since, self._failures)
            self._since = None
            self._failures = 0


class RateLimited:
    """Log lines of one kind, at most ``burst`` per ``period`` seconds. Lines
    over the limit are counted, not logged; the next line that passes says
    how many were left out. For per-job lines (retries, failures) that a
    broken index or a bad import could otherwise turn into a flood."""

    def __init__(self, logger: logging.Logger, level: int, *, burst: int = 20,
                 period: float = 10.0) -> None:
        self.log = logger
        self.level = level
        self.burst = burst
        self.period = period
        self._window_start = -period
        self._in_window = 0
        #: lines left out since the last one logged
        self.suppressed = 0

    def __call__(self, message: str, *args: object, extra: dict[str, object] | None = None,
                 now: float | None = None) -> bool:
        """Log the line unless over the limit; True if it was logged."""
        now = time.monotonic() if now is None else now
        if now - self._window_start >= self.period:
            self._window_start = now
            self._in_window = 0
        if self._in_window >= self.burst:
            self.suppressed += 1
            return False
        self._in_window += 1
        if self.suppressed:
            message += " (%d similar line(s) left out before this one)"
            args = (*args, self.suppressed)
            self.suppressed = 0
        self.log.log(self.level, message, *args, extra=extra)
        return True
