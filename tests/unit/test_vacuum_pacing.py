"""The vacuum task's pacing (trio's autojump clock: no real waiting, and no
database: the table is a stand-in whose dead row count grows at a set rate
and whose VACUUM takes a set time, so what is measured is when the task
vacuums, not what Postgres does; tests/integration/test_vacuum.py has the
real server)."""

from __future__ import annotations

import itertools
from typing import cast

import pytest
import trio
import trio.testing

from nexarch_events.errors import DatabaseUnavailable
from nexarch_events.queue.jobs import Queue
from nexarch_events.queue.vacuum import (
    CHECK_INTERVAL,
    DUTY,
    MIN_PAUSE,
    OpenConnection,
    TableVacuum,
)
from nexarch_events.settings import QueueSettings

THRESHOLD = 50_000


class Table:
    """Dead rows grow by ``rate`` a second; a vacuum takes ``vacuum_time``
    and removes all but ``held`` (what an open transaction still sees)."""

    def __init__(self, *, rate: float, vacuum_time: float, held: int = 0,
                 failures: int = 0) -> None:
        self.settings = QueueSettings(vacuum_dead_rows=THRESHOLD)
        self.rate = rate
        self.vacuum_time = vacuum_time
        self.held = held
        self.failures = failures
        self.cleaned_at = 0.0
        self.starts: list[float] = []
        self.connections_open = 0

    async def vacuum_allowed(self) -> bool:
        return True

    async def dead_rows(self) -> int:
        if self.failures:
            self.failures -= 1
            raise DatabaseUnavailable("cannot reach Postgres: ConnectionResetError")
        return self.held + int(self.rate * (trio.current_time() - self.cleaned_at))

    async def vacuum(self, conn: object) -> None:
        assert conn is self
        self.starts.append(trio.current_time())
        await trio.sleep(self.vacuum_time)
        self.cleaned_at = trio.current_time()

    async def open(self) -> Table:
        self.connections_open += 1
        return self

    async def aclose(self) -> None:
        self.connections_open -= 1


async def vacuum_for(table: Table, seconds: float) -> TableVacuum:
    vacuum = TableVacuum(cast(Queue, table), cast(OpenConnection, table.open), table.settings)
    with trio.move_on_after(seconds):
        await vacuum.run()
    return vacuum


def gaps(starts: list[float]) -> list[float]:
    return [b - a for a, b in itertools.pairwise(starts)]


async def test_a_fast_queue_is_vacuumed_every_few_seconds_never_back_to_back(
        autojump_clock: trio.abc.Clock) -> None:
    # 45,000 dead versions a second (a busy queue), a 0.2 s vacuum: due at
    # every look, so the floor decides: one vacuum per MIN_PAUSE + its time.
    table = Table(rate=45_000, vacuum_time=0.2)
    vacuum = await vacuum_for(table, 120)
    assert vacuum.vacuums == len(table.starts)
    assert min(gaps(table.starts)) >= MIN_PAUSE + 0.2 - 1e-9
    assert len(table.starts) >= 120 / (MIN_PAUSE + CHECK_INTERVAL + 0.2)
    assert table.connections_open == 0, "each vacuum's connection is closed"
    assert vacuum.seconds == pytest.approx(0.2 * vacuum.vacuums)


async def test_a_slow_vacuum_waits_duty_times_as_long_before_the_next(
        autojump_clock: trio.abc.Clock) -> None:
    table = Table(rate=45_000, vacuum_time=20.0)
    await vacuum_for(table, 600)
    assert min(gaps(table.starts)) >= 20.0 + DUTY * 20.0 - 1e-9
    assert len(table.starts) >= 600 / (20.0 + DUTY * 20.0 + CHECK_INTERVAL) - 1


async def test_rows_a_vacuum_cannot_remove_do_not_call_for_another(
        autojump_clock: trio.abc.Clock) -> None:
    # A long transaction keeps a million dead versions alive: one vacuum
    # learns that, and the next waits for THRESHOLD new ones (none come).
    table = Table(rate=0, vacuum_time=1.0, held=1_000_000)
    vacuum = await vacuum_for(table, 600)
    assert len(table.starts) == 1
    assert vacuum.left_behind == 1_000_000


async def test_a_quiet_queue_is_not_vacuumed(autojump_clock: trio.abc.Clock) -> None:
    table = Table(rate=THRESHOLD / 3600, vacuum_time=1.0)  # one threshold an hour
    await vacuum_for(table, 3000)
    assert table.starts == []


async def test_database_errors_back_off_and_the_task_goes_on(
        autojump_clock: trio.abc.Clock, caplog: pytest.LogCaptureFixture) -> None:
    table = Table(rate=45_000, vacuum_time=0.2, failures=5)
    vacuum = await vacuum_for(table, 60)
    assert table.failures == 0
    assert vacuum.vacuums >= 5
    warnings = [r for r in caplog.records if r.levelname == "WARNING"]
    assert len(warnings) == 1, "one line per outage"


async def test_zero_leaves_the_table_to_autovacuum(autojump_clock: trio.abc.Clock) -> None:
    table = Table(rate=45_000, vacuum_time=0.2)
    table.settings = QueueSettings(vacuum_dead_rows=0)
    with trio.fail_after(1):
        vacuum = await vacuum_for(table, 60)
    assert table.starts == [] and vacuum.vacuums == 0
