"""docs/events.md documents every channel and event the SQL emits."""

from __future__ import annotations

import re
from pathlib import Path

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
