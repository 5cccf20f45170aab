"""docs/events.md documents every channel and event the SQL emits."""

from __future__ import annotations

import re
from pathlib import Path

import pytest

from nexarch_events.queue import notify

ROOT = Path(__file__).resolve().parents[2]


def emitted() -> set[tuple[str, str]]:
    found = set()
    for path in (ROOT / "sql").rglob("*.sql"):
        text = path.read_text()
        for match in re.finditer(r"pg_notify\('([a-z_]+)'.*?'event', ([^,]+),", text, re.S):
            channel, event = match.group(1), match.group(2).strip()
            found.add((channel, event.strip("'") if event.startswith("'") else "*"))
    return found


def test_every_emitted_event_is_documented() -> None:
    doc = (ROOT / "docs" / "events.md").read_text()
    events = emitted()
    assert {c for c, _ in events} == {notify.INDEX_JOBS_CHANNEL, notify.JOB_EVENTS_CHANNEL,
                                      notify.MAIL_IMPORTED_CHANNEL,
                                      notify.IMPORT_REQUESTS_CHANNEL}
    for channel, event in events:
        assert f"`{channel}`" in doc
        if event != "*":  # job events take their name from the status column
            assert f"`{event}`" in doc, event
    for status_event in ("succeeded", "failed"):
        assert f"`{status_event}`" in doc
    # mail_import_message names its event after the import mode.
    for import_event in ("imported", "recovered", "unstable"):
        assert f"`{import_event}`" in doc


def test_the_recorder_starts_a_mailbox_over_after_its_resync() -> None:
    """A UIDVALIDITY that comes back after another one (a mailbox restored
    from a backup) is imported again from UID 1 after a resync: the
    recorder's order check failed on the documented behaviour."""
    import json

    from nexarch_events.queue.notify import MAIL_IMPORTED_CHANNEL, Notification
    from nexarch_events.testing.recorder import ImportEvent, ImportRecorder

    def event(kind: str, uidvalidity: int, uid: int | None = None,
              mailbox: str = "inbox") -> ImportEvent:
        payload = {"v": 1, "event": kind, "tenant": "acme", "mailbox": mailbox,
                   "uidvalidity": uidvalidity, "uid": uid, "archive_id": uid,
                   "duplicate": True}
        return ImportEvent.parse(Notification(MAIL_IMPORTED_CHANNEL, json.dumps(payload), 0.0))

    recorder = ImportRecorder()
    for e in [event("imported", 7, 1), event("imported", 7, 2), event("resync", 8),
              event("imported", 8, 1), event("imported", 7, 5, mailbox="other"),
              event("resync", 7), event("imported", 7, 1), event("imported", 7, 2)]:
        recorder._record(e)
    recorder.assert_in_uid_order()
    recorder._record(event("imported", 7, 2))  # a repeat without a resync
    with pytest.raises(AssertionError, match="UID 2 arrived after UID 2"):
        recorder.assert_in_uid_order()
    recorder._record(event("imported", 7, 4, mailbox="other"))  # other mailbox: no resync
    recorder.events.pop(-2)
    with pytest.raises(AssertionError, match="UID 4 arrived after UID 5"):
        recorder.assert_in_uid_order()
