"""The sweeper's prune pacing against a queue that keeps finding more to
prune (trio's autojump clock: no real waiting, and no database: the queue is
a stand-in that only counts prune statements and takes a fixed time for each,
so the pacing, not Postgres, is what is measured)."""

from __future__ import annotations

import itertools
from datetime import UTC, datetime
from typing import cast

import trio
import trio.testing

from nexarch_events.queue.jobs import Queue, Reclaimed
from nexarch_events.queue.sweeper import MIN_PRUNE_PAUSE, Sweeper
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
