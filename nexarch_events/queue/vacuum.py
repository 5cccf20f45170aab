"""Vacuum of the job table when dead row versions pile up.

Every job leaves three dead row versions behind (the claim's, the ack's and
the prune's), and until a vacuum removes them every claim walks past their
entries in the ready path: a claim of 100 among 20,000 ready jobs took
6.4-9.4 ms after a million jobs and 1.9-2.2 ms after a VACUUM (bench/README.md,
issue 11). Autovacuum comes by at most once per ``autovacuum_naptime`` (a
minute by default), while a busy queue leaves some 45,000 dead versions a
second; and some servers run with autovacuum off.

So each process runs this task: every ``CHECK_INTERVAL`` it reads the dead
count from the statistics (one row), and once ``queue.vacuum_dead_rows`` more
have piled up than the last vacuum left behind (what an open transaction
still needs, it cannot remove; counting those again would vacuum in a loop
for nothing) it runs ``VACUUM (SKIP_LOCKED) mail_index_jobs``:

- on a connection of its own, opened for the vacuum and closed after it: a
  vacuum takes seconds on a large table, longer than a pooled connection's
  command timeout allows, and would hold a connection the workers need;
  its ``statement_timeout`` is switched off (a role's or database's, sized
  for one-row statements, would cancel every vacuum of a large table, each
  retried and cancelled again), ``VACUUM_TIMEOUT`` bounds it instead; being
  a session setting, this needs a session of its own, so the service opens
  it on the direct URL when the work goes through a transaction pooler;
- ``SKIP_LOCKED``: while autovacuum or another process vacuums the table,
  Postgres skips it (with a warning, not an error) instead of queueing;
- paced: the next vacuum comes no sooner than ``MIN_PAUSE`` and no sooner
  than ``DUTY`` times as long as the last one took, so vacuuming takes at
  most half of one connection's time however large the table grows (with 3,
  a quarter, a 3 s vacuum left 9 s for 600,000 dead versions to pile up in
  the soak bench, and its throughput dipped);
- autovacuum, when it comes by first, holds the table and this task skips:
  migration 0025 takes the cost delay off autovacuum for this table, so its
  pass is as short as ours (a throttled pass over a busy queue table lasted
  long enough to show as dips in the soak bench);
- a role that may not vacuum the table (Postgres would only warn and skip):
  checked once, logged once at WARNING, and the task ends, leaving the table
  to autovacuum;
- database errors back off and retry (``Outage``); a vacuum that runs past
  ``VACUUM_TIMEOUT`` is cancelled by its connection's timeout, logged, and
  retried after the backoff.
"""

from __future__ import annotations

import logging
from collections.abc import Awaitable, Callable

import trio

from ..aio import Connection
from ..errors import DatabaseTransient
from ..settings import QueueSettings
from .jobs import Queue
from .outage import Outage

log = logging.getLogger(__name__)

#: Seconds between two looks at the dead count.
CHECK_INTERVAL = 2.0
#: Least seconds from the end of one vacuum to the start of the next.
MIN_PAUSE = 2.0
#: The pause after a vacuum is at least DUTY times as long as it took.
DUTY = 1.0
#: Longest a vacuum may run before its connection cancels it (seconds).
VACUUM_TIMEOUT = 3600.0

OpenConnection = Callable[[], Awaitable[Connection]]


class TableVacuum:
    """The vacuum task of one process (``run``); ``open_connection`` opens
    the connection each VACUUM runs on."""

    def __init__(self, queue: Queue, open_connection: OpenConnection,
                 settings: QueueSettings | None = None) -> None:
        self.queue = queue
        self._open = open_connection
        self.settings = settings or queue.settings
        #: Vacuums run (including those Postgres skipped for a lock).
        self.vacuums = 0
        #: Seconds spent in them.
        self.seconds = 0.0
        #: Dead versions the last vacuum left behind (the baseline).
        self.left_behind = 0

    async def run(self, *, task_status: trio.TaskStatus[None] = trio.TASK_STATUS_IGNORED) -> None:
        task_status.started()
        threshold = self.settings.vacuum_dead_rows
        if threshold == 0:
            return
        outage = Outage("vacuum", log, max_delay=60.0)
        allowed: bool | None = None
        while True:
            try:
                if allowed is None:
                    allowed = await self.queue.vacuum_allowed()
                    if not allowed:
                        log.warning("this role may not vacuum mail_index_jobs (only its owner, "
                                    "the database's owner, a superuser or, from Postgres 17, a "
                                    "holder of MAINTAIN on it may): dead row versions "
                                    "are left to autovacuum; set queue.vacuum_dead_rows = 0 to "
                                    "silence this")
                        return
                pause = CHECK_INTERVAL
                if await self.queue.dead_rows() >= self.left_behind + threshold:
                    took = await self.vacuum_once()
                    pause = max(MIN_PAUSE, DUTY * took)
            except DatabaseTransient as exc:
                await trio.sleep(outage.failed(exc))
                continue
            outage.ok()
            await trio.sleep(pause)

    async def vacuum_once(self) -> float:
        """Vacuum the table on a fresh connection; returns the seconds it took."""
        started = trio.current_time()
        conn = await self._open()
        try:
            await self.queue.vacuum(conn)
        finally:
            await conn.aclose()
        took = trio.current_time() - started
        self.vacuums += 1
        self.seconds += took
        self.left_behind = await self.queue.dead_rows()
        log.debug("vacuumed mail_index_jobs in %.2fs, %d dead row version(s) left", took,
                  self.left_behind)
        return took
