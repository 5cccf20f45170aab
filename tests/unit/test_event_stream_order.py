"""The order in which an event stream releases the live events it held
during a listener reconnect (nexarch_events/api/events.py)."""

from __future__ import annotations

import json

from nexarch_events.api.events import _in_id_order
from nexarch_events.queue.notify import JOB_EVENTS_CHANNEL, MAIL_IMPORTED_CHANNEL, Notification


def note(channel: str, **data: object) -> tuple[str, Notification]:
    return channel, Notification(channel, json.dumps(data), 0.0)


def test_held_events_are_released_in_id_order_per_channel() -> None:
    held = [
        note(MAIL_IMPORTED_CHANNEL, event="imported", archive_id=9, duplicate=False),
        note(JOB_EVENTS_CHANNEL, event="succeeded", ids=[40, 41]),
        note(MAIL_IMPORTED_CHANNEL, event="failed", uid=3),
        note(MAIL_IMPORTED_CHANNEL, event="imported", archive_id=7, duplicate=False),
        note(JOB_EVENTS_CHANNEL, event="failed", ids=[12]),
        note(MAIL_IMPORTED_CHANNEL, event="imported", archive_id=2, duplicate=True),
    ]
    ordered = [json.loads(n.payload) for _, n in _in_id_order(held)]
    assert [(d["event"], d.get("archive_id"), d.get("ids")) for d in ordered] == [
        ("imported", 7, None),
        ("failed", None, [12]),
        # Events without an id of their own keep their places.
        ("failed", None, None),
        ("imported", 9, None),
        ("succeeded", None, [40, 41]),
        ("imported", 2, None),
    ]
