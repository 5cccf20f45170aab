"""The sweeper's pacing: its prune against a queue that keeps finding more to
prune (trio's autojump clock: no real waiting, and no database: the queue is
a stand-in that only counts prune statements and takes a fixed time for each,
so the pacing, not Postgres, is what is measured), and its sweeps under a
flood of pokes and behind a stale lease it cannot take."""

from __future__ import annotations

import itertools
from datetime import UTC, datetime, timedelta
from typing import cast

import trio
import trio.testing

from nexarch_events.queue.jobs import Queue, Reclaimed
from nexarch_events.queue.sweeper import MIN_PRUNE_PAUSE, MIN_SWEEP_GAP, Sweeper
from nexarch_events.queue.worker import WakeUps
from nexarch_events.settings import QueueSettings

SETTINGS = QueueSettings(retain_succeeded=600.0, retain_failed=600.0, drain_interval=3600.0,
                         stale_after=3600.0)


class Backlog:
    """A queue with an endless prune backlog, each statement taking
    ``statement_time`` seconds; nothing else to do."""

    def __init__(self, statement_time: float) -> None:
        self.settings = SETTINGS
        self.statement_time = statement_time
        self.statements: list[float] = []

    async def prune(self, limit: int = 500) -> int:
        self.statements.append(trio.current_time())
        await trio.sleep(self.statement_time)
        return limit

    async def reclaim_stale_jobs(self) -> list[Reclaimed]:
        return []

    async def ready_count(self, limit: int) -> int:
        return 0

    async def schedule(self) -> tuple[datetime | None, datetime | None, datetime]:
        return None, None, datetime.now(UTC)


async def prune_for(backlog: Backlog, seconds: float) -> Sweeper:
    sweeper = Sweeper(cast(Queue, backlog), WakeUps(1), SETTINGS)
    with trio.move_on_after(seconds):
        await sweeper.run()
    return sweeper


async def test_a_backlog_is_pruned_pass_after_pass(autojump_clock: trio.abc.Clock) -> None:
    # One pass (20 statements of 1 ms) takes 20 ms, then the sweeper pauses
    # MIN_PRUNE_PAUSE: about 333 passes in 10 s. With a pause of a second it
    # made 10, capping the prune at 10,000 rows/s, below what the queue
    # finishes (the soak bench's table grew without bound); pausing as long
    # as each pass took still fell behind once the table was large.
    backlog = Backlog(statement_time=0.001)
    sweeper = await prune_for(backlog, 10.0)
    passes = len(backlog.statements) / 20
    assert 300 <= passes <= 10 / (0.02 + MIN_PRUNE_PAUSE) + 1, passes
    # Every statement counted (the last may have been cut by the deadline).
    assert sweeper.pruned // 500 in (len(backlog.statements), len(backlog.statements) - 1)


async def test_a_backlog_that_costs_nothing_still_has_a_floor_on_the_pause(
        autojump_clock: trio.abc.Clock) -> None:
    backlog = Backlog(statement_time=0.0)
    await prune_for(backlog, 1.0)
    passes = len(backlog.statements) / 20
    assert 1 / MIN_PRUNE_PAUSE * 0.9 <= passes <= 1 / MIN_PRUNE_PAUSE + 1, passes
    starts = backlog.statements[::20]
    assert min(b - a for a, b in itertools.pairwise(starts)) >= MIN_PRUNE_PAUSE - 1e-9


class Quiet(Backlog):
    """Nothing to prune; counts sweeps (reclaim calls). ``stale_for``: the
    oldest heartbeat is that many seconds past stale_after, and its lease
    cannot be taken (another transaction holds the row)."""

    def __init__(self, stale_for: float | None = None) -> None:
        super().__init__(statement_time=0.0)
        self.sweeps: list[float] = []
        self.stale_for = stale_for

    async def prune(self, limit: int = 500) -> int:
        return 0

    async def reclaim_stale_jobs(self) -> list[Reclaimed]:
        self.sweeps.append(trio.current_time())
        return []

    async def schedule(self) -> tuple[datetime | None, datetime | None, datetime]:
        now = datetime.now(UTC)
        if self.stale_for is None:
            return None, None, now
        return None, now - timedelta(seconds=SETTINGS.stale_after + self.stale_for), now


async def test_a_flood_of_pokes_sweeps_at_most_once_per_floor(
        autojump_clock: trio.abc.Clock) -> None:
    """Any notification with a due time pokes the sweeper: a flood made 987
    sweeps in 10 s, three statements each (a retry-loop audit)."""
    queue = Quiet()
    sweeper = Sweeper(cast(Queue, queue), WakeUps(1), SETTINGS)
    async with trio.open_nursery() as nursery:
        nursery.start_soon(sweeper.run)
        end = trio.current_time() + 2.0
        while trio.current_time() < end:
            sweeper.poke()
            await trio.sleep(0.001)
        nursery.cancel_scope.cancel()
    assert len(queue.sweeps) <= 2.0 / MIN_SWEEP_GAP + 1, len(queue.sweeps)
    assert min(b - a for a, b in itertools.pairwise(queue.sweeps)) >= MIN_SWEEP_GAP - 1e-9
    # A poke is never lost: the last one is swept, at the floor.
    assert queue.sweeps[-1] >= end - MIN_SWEEP_GAP - 0.01


async def test_a_stale_lease_it_cannot_take_is_looked_at_less_and_less(
        autojump_clock: trio.abc.Clock) -> None:
    """A stale lease whose row another transaction holds (SKIP LOCKED passes
    it over) was looked at every 50 ms for as long as that lasted: 189
    sweeps in 10 s (a retry-loop audit). The wait doubles up to
    stale_after."""
    settings = QueueSettings(retain_succeeded=600.0, retain_failed=600.0,
                             drain_interval=3600.0, stale_after=2.0,
                             heartbeat_interval=0.5)
    queue = Quiet(stale_for=1.0)
    queue.settings = settings
    sweeper = Sweeper(cast(Queue, queue), WakeUps(1), settings)
    with trio.move_on_after(10.0):
        await sweeper.run()
    # 0.05, 0.1, ... doubling to 2 s: a handful, then one per stale_after.
    assert len(queue.sweeps) <= 12, len(queue.sweeps)
