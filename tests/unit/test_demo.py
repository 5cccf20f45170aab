"""The demo's latency bookkeeping, in both orders of arrival."""

from __future__ import annotations

import json

import trio

from nexarch_events.demo import _Producer
from nexarch_events.notify import Notification
from nexarch_events.settings import Settings


class _FakeDb:
    dsn = "postgresql://unused/unused"


def succeeded(job_id: int, at: float) -> Notification:
    payload = json.dumps({"v": 1, "event": "succeeded", "tenant": "demo", "ids": [job_id]})
    return Notification("nexarch_job_events", payload, at)


async def test_an_outcome_that_arrives_before_its_enqueue_returned_is_counted() -> None:
    producer = _Producer(_FakeDb(), Settings(), jobs=2, rate=10)  # type: ignore[arg-type]
    async with trio.open_nursery() as nursery:
        nursery.start_soon(producer.consume)
        # Job 7: the usual order, enqueue recorded first.
        producer.enqueued(7, start=100.0)
        producer.events._push(succeeded(7, at=100.004))
        # Job 8: a fast worker; its outcome arrives before the enqueue returns.
        producer.events._push(succeeded(8, at=100.010))
        await trio.testing.wait_all_tasks_blocked()
        producer.enqueued(8, start=100.008)
        with trio.fail_after(1):
            await producer.done.wait()
        nursery.cancel_scope.cancel()
    assert [round(ms, 3) for ms in producer.latencies_ms] == [4.0, 2.0]
