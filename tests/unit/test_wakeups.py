"""Targeted wake-ups (trio's autojump clock: no real waiting)."""

from __future__ import annotations

import trio
import trio.testing

from nexarch_events.queue.worker import WakeUps


async def idle_workers(wakeups: WakeUps, n: int, nursery: trio.Nursery,
                       woken: list[int]) -> None:
    async def worker(i: int) -> None:
        await wakeups.wait()
        woken.append(i)

    for i in range(n):
        nursery.start_soon(worker, i)
    await trio.testing.wait_all_tasks_blocked()
    assert wakeups.idle == n


async def test_one_job_wakes_one_idle_worker(autojump_clock: trio.abc.Clock) -> None:
    wakeups = WakeUps(workers=4)
    woken: list[int] = []
    async with trio.open_nursery() as nursery:
        await idle_workers(wakeups, 4, nursery, woken)
        assert wakeups.wake(1) == 1
        await trio.testing.wait_all_tasks_blocked()
        assert len(woken) == 1 and wakeups.idle == 3
        assert wakeups.wake(2) == 2
        await trio.testing.wait_all_tasks_blocked()
        assert len(woken) == 3 and wakeups.idle == 1
        nursery.cancel_scope.cancel()


async def test_wake_without_idle_workers_leaves_a_credit(autojump_clock: trio.abc.Clock) -> None:
    # A worker whose claim ran while the job was being committed must not
    # sleep through that job's notification.
    wakeups = WakeUps(workers=2)
    assert wakeups.wake(1) == 0
    with trio.fail_after(1):
        await wakeups.wait()  # returns at once: the credit
    with trio.move_on_after(10) as scope:
        await wakeups.wait()  # no credit left: blocks
    assert scope.cancelled_caught


async def test_credits_are_capped_at_the_worker_count(autojump_clock: trio.abc.Clock) -> None:
    wakeups = WakeUps(workers=2)
    wakeups.wake(1000)
    for _ in range(2):
        with trio.fail_after(1):
            await wakeups.wait()
    with trio.move_on_after(10) as scope:
        await wakeups.wait()
    assert scope.cancelled_caught


async def test_close_releases_everyone_for_good(autojump_clock: trio.abc.Clock) -> None:
    wakeups = WakeUps(workers=3)
    woken: list[int] = []
    async with trio.open_nursery() as nursery:
        await idle_workers(wakeups, 3, nursery, woken)
        wakeups.close()
    assert sorted(woken) == [0, 1, 2]
    with trio.fail_after(1):
        await wakeups.wait()


async def test_a_cancelled_waiter_is_not_woken_later(autojump_clock: trio.abc.Clock) -> None:
    wakeups = WakeUps(workers=2)
    with trio.move_on_after(1):
        await wakeups.wait()
    assert wakeups.idle == 0
    assert wakeups.wake(1) == 0  # nobody idle: it becomes a credit instead


async def test_the_worker_that_went_idle_last_is_woken_first(
        autojump_clock: trio.abc.Clock) -> None:
    # A trickle of single jobs keeps going to the same (warm) worker.
    wakeups = WakeUps(workers=3)
    woken: list[int] = []

    async def worker(i: int) -> None:
        while True:
            await wakeups.wait()
            woken.append(i)

    async with trio.open_nursery() as nursery:
        for i in range(3):  # idle in the order 0, 1, 2
            nursery.start_soon(worker, i)
            await trio.testing.wait_all_tasks_blocked()
        for _ in range(3):
            assert wakeups.wake(1) == 1
            await trio.testing.wait_all_tasks_blocked()
        assert woken == [2, 2, 2]
        assert wakeups.wake(3) == 3
        await trio.testing.wait_all_tasks_blocked()
        assert sorted(woken[3:]) == [0, 1, 2]
        nursery.cancel_scope.cancel()
