"""The sweeper: reclaims stale leases, wakes workers exactly when the next
retry falls due, and drains on a slow safety-net interval.

It sleeps until the earliest of: the next retry's ``available_at``, the
moment the oldest heartbeat would go stale, and the next safety-net drain.
A notification carrying ``next_due`` (a retry was scheduled anywhere) or a
RESYNC pokes it to re-read that schedule. Times come from the database clock
(``now()`` in the same query), so clock skew between hosts does not matter.
"""

from __future__ import annotations

import logging
import math

import trio

from ..errors import DatabaseTransient
from ..models import JobStatus
from ..settings import QueueSettings
from .jobs import Queue
from .outage import Outage
from .worker import WakeUps

log = logging.getLogger(__name__)

#: The least pause between two prune passes while a backlog is due, so a
#: sweeper that keeps finding more never spins (seconds).
MIN_PRUNE_PAUSE = 0.01
#: Sweeps start at least this far apart, whatever pokes the sweeper: a
#: flood of notifications with a due time (any sender may NOTIFY the
#: channel) made 987 sweeps in 10 s (a retry-loop audit). Retries fall due
#: this much late at most.
MIN_SWEEP_GAP = 0.1


class Sweeper:
    def __init__(self, queue: Queue, wakeups: WakeUps, settings: QueueSettings | None = None,
                 *, workers: int | None = None) -> None:
        self.queue = queue
        self.wakeups = wakeups
        self.settings = settings or queue.settings
        self._workers = workers or self.settings.workers
        self._poked = trio.Event()
        #: The wait past an expired heartbeat whose lease the last sweep
        #: could not take (doubling while that lasts; see _sweep_once).
        self._stuck = 0.0
        #: sweeps completed
        self.sweeps = 0
        self.reclaimed = 0
        self.due_wakeups = 0
        self.pruned = 0

    def poke(self) -> None:
        """Re-read the schedule now (a retry was scheduled, or we reconnected)."""
        self._poked.set()

    async def run(self, *, task_status: trio.TaskStatus[None] = trio.TASK_STATUS_IGNORED) -> None:
        s = self.settings
        next_drain = trio.current_time() + s.drain_interval
        next_prune = trio.current_time()
        outage = Outage("sweeper", log, max_delay=s.reconnect_max)
        task_status.started()
        last_sweep = wake_at = -math.inf
        while True:
            now = trio.current_time()
            try:
                if (self._poked.is_set() or now >= wake_at) \
                        and now >= last_sweep + MIN_SWEEP_GAP:
                    self._poked = trio.Event()
                    last_sweep = now
                    wake_at = await self._sweep_once()
                if trio.current_time() >= next_prune:
                    more = await self.prune_some()
                    # A backlog is pruned pass after pass, with only a short
                    # pause between them: any slower pace caps the prune
                    # below what a fast queue finishes, and the table grows
                    # without bound. Each statement is a short transaction
                    # of its own, so claims interleave; once the backlog is
                    # gone the sweeper waits prune_interval again.
                    pause = MIN_PRUNE_PAUSE if more else s.prune_interval
                    next_prune = trio.current_time() + pause
            except DatabaseTransient as exc:
                wake_at = -math.inf  # sweep again once it answers
                await trio.sleep(outage.failed(exc))
                continue
            outage.ok()
            now = trio.current_time()
            if now >= next_drain:
                self.wakeups.wake_all()
                next_drain = now + s.drain_interval
            floor = last_sweep + MIN_SWEEP_GAP
            sweep_at = floor if self._poked.is_set() else max(wake_at, floor)
            with trio.move_on_at(min(sweep_at, next_drain, next_prune)):
                if self._poked.is_set():
                    await trio.sleep_forever()  # poked within the floor: until it
                else:
                    await self._poked.wait()

    async def prune_some(self, *, batch: int = 500, batches: int = 20) -> bool:
        """Delete finished jobs past their retention, ``batch`` rows per
        statement (each its own short transaction, so nothing waits on a long
        delete), at most ``batches`` statements; True if more are due."""
        for _ in range(batches):
            deleted = await self.queue.prune(batch)
            self.pruned += deleted
            if deleted < batch:
                return False
            await trio.lowlevel.checkpoint()
        return True

    async def _sweep_once(self) -> float:
        """Reclaim, wake for what is due, and return when to look again."""
        s = self.settings
        reclaimed = await self.queue.reclaim_stale_jobs()
        if reclaimed:
            self.reclaimed += len(reclaimed)
            batch = [r.id for r in reclaimed if not r.alone]
            if batch:
                log.warning("reclaimed %d job(s) from dead workers' batches (not charged; "
                            "each runs alone next to find the culprit): %s", len(batch), batch)
            for r in reclaimed:
                if r.alone:
                    log.warning("job %s was running alone when its worker died: suspected of "
                                "killing it; %s", r.id,
                                "failed" if r.status == JobStatus.FAILED else "will retry")
        ready = await self.queue.ready_count(self._workers)
        if ready:
            self.due_wakeups += 1
            self.wakeups.wake(ready)
        next_due, oldest_heartbeat, db_now = await self.queue.schedule()
        now = trio.current_time()
        # At least once per stale_after: another process may claim a job and
        # die without this one hearing of the claim (claims notify nobody),
        # so takeover after a crash stays bounded by about 2 x stale_after.
        wake_at = now + min(s.drain_interval, s.stale_after)
        if next_due is not None:
            wake_at = min(wake_at, now + max((next_due - db_now).total_seconds(), 0.0))
        if oldest_heartbeat is not None:
            stale_at = (oldest_heartbeat - db_now).total_seconds() + s.stale_after
            # Stale already, yet not reclaimed: another transaction holds the
            # row (SKIP LOCKED passed it over). Looking again every 50 ms
            # was 20 sweeps a second for as long as it held it (a retry-loop
            # audit): the wait doubles, up to stale_after, until it moves.
            self._stuck = min(s.stale_after, max(0.05, self._stuck * 2)) \
                if stale_at <= 0 and not reclaimed else 0.0
            # A little past the threshold, so the reclaim query sees it stale.
            wake_at = min(wake_at, now + max(stale_at, 0.0) + max(0.05, self._stuck))
        else:
            self._stuck = 0.0
        self.sweeps += 1
        return wake_at
