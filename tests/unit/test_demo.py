"""The demo's bookkeeping (arrived -> imported -> searchable), its status-page
line, and the sample mail it delivers. The demo end to end, as users run it,
is in tests/acceptance/test_demo.py."""

from __future__ import annotations

import email
import email.policy
import importlib.machinery
import json
import re
import sys
import types
from datetime import UTC, datetime

import pytest

from nexarch_events.demo import Tracker, run_demo, status_page_url
from nexarch_events.errors import ConfigurationError
from nexarch_events.mail import mime
from nexarch_events.queue.notify import (
    JOB_EVENTS_CHANNEL,
    MAIL_IMPORTED_CHANNEL,
    RESYNC,
    Notification,
)
from nexarch_events.settings import ApiSettings, Settings
from nexarch_events.testing.samples import sample_mail, sample_mails

SENT = datetime(2026, 3, 2, 9, 30, tzinfo=UTC)


def imported(uid: int, archive_id: int, *, tenant: str = "demo", mailbox: str = "sample",
             uidvalidity: int = 77, event: str = "imported") -> Notification:
    payload = {"v": 1, "event": event, "tenant": tenant, "mailbox": mailbox,
               "uidvalidity": uidvalidity, "uid": uid, "archive_id": archive_id,
               "duplicate": False}
    return Notification(MAIL_IMPORTED_CHANNEL, json.dumps(payload), 0.0)


def test_an_import_announcement_makes_a_message_worth_searching() -> None:
    tracker = Tracker(uidvalidity=77)
    first = tracker.arrived(1, sample_mail(sent_at=SENT), at=100.0)
    second = tracker.arrived(2, sample_mail(sent_at=SENT), at=100.5)
    assert tracker.to_search(now=100.6) == []
    # Other tenants, other mailboxes, an earlier UIDVALIDITY: not ours.
    for foreign in (imported(1, 10, tenant="acme"), imported(1, 10, mailbox="inbox"),
                    imported(1, 10, uidvalidity=76), imported(1, 10, event="failed")):
        tracker.note(foreign)
    assert first.archive_id is None
    tracker.note(imported(1, 10))
    assert first.archive_id == 10
    assert tracker.to_search(now=100.6) == [first]
    # Without an announcement (missed while the listener reconnected), a
    # message is searched for anyway once it has waited a second.
    assert tracker.to_search(now=101.6) == [first, second]
    assert tracker.counts() == (2, 1, 0)


async def test_every_notification_of_the_tenant_wakes_the_searcher() -> None:
    tracker = Tracker(uidvalidity=77)
    woken = tracker.changed
    tracker.note(Notification(JOB_EVENTS_CHANNEL, json.dumps(
        {"v": 1, "event": "succeeded", "tenant": "acme", "ids": [1]}), 0.0))
    assert not woken.is_set()
    tracker.note(Notification(JOB_EVENTS_CHANNEL, json.dumps(
        {"v": 1, "event": "succeeded", "tenant": "demo", "ids": [1]}), 0.0))
    assert woken.is_set()
    woken = tracker.changed
    tracker.note(RESYNC)
    assert woken.is_set()


def test_latency_runs_from_arrival_to_the_first_search_that_found_it() -> None:
    tracker = Tracker()
    before = tracker.arrived(1, sample_mail(sent_at=SENT), at=50.0, measured=False)
    a = tracker.arrived(2, sample_mail(sent_at=SENT), at=100.0)
    b = tracker.arrived(3, sample_mail(sent_at=SENT), at=100.5)
    tracker.found(b, at=100.520, archive_id=31)
    tracker.found(a, at=100.540, archive_id=30)
    tracker.found(a, at=100.900, archive_id=30)  # a later search changes nothing
    tracker.found(before, at=100.0, archive_id=29)
    # In the order they became searchable; the initial messages are not measured.
    assert [round(ms, 3) for ms in tracker.latencies_ms()] == [20.0, 540.0]
    assert (a.archive_id, b.archive_id) == (30, 31)
    assert tracker.pending() == [] and tracker.counts() == (2, 2, 2)
    assert tracker.counts(measured_only=False) == (3, 3, 3)


def test_status_page_line_only_where_an_api_serves_it(monkeypatch: pytest.MonkeyPatch) -> None:
    assert status_page_url(Settings(), api_module="nexarch_events._no_such_api") is None
    fake = types.ModuleType("fake_nexarch_api")
    fake.__spec__ = importlib.machinery.ModuleSpec("fake_nexarch_api", None)
    monkeypatch.setitem(sys.modules, "fake_nexarch_api", fake)
    assert status_page_url(Settings(), api_module="fake_nexarch_api") is None  # no serve_api
    fake.serve_api = object()  # type: ignore[attr-defined]
    assert status_page_url(Settings(), api_module="fake_nexarch_api") == \
        "http://127.0.0.1:8080/"
    for host, shown in (("0.0.0.0", "127.0.0.1"), ("::1", "[::1]"), ("10.1.2.3", "10.1.2.3")):
        settings = Settings(api=ApiSettings(host=host, port=9000))
        assert status_page_url(settings, api_module="fake_nexarch_api") == \
            f"http://{shown}:9000/"
    disabled = Settings(api=ApiSettings(enabled=False))
    assert status_page_url(disabled, api_module="fake_nexarch_api") is None


@pytest.mark.parametrize(("duration", "rate"), [(0, 2), (-1, 2), (float("nan"), 2), (5, 0),
                                                (5, 5000)])
def test_bad_duration_or_rate_is_a_usage_error(duration: float, rate: float) -> None:
    with pytest.raises(ConfigurationError):
        run_demo("postgresql://unused/unused", Settings(), duration=duration, rate=rate)


def test_sample_mail_is_valid_parseable_and_findable_by_its_token() -> None:
    mails = sample_mails(120, seed=7, sent_at=SENT)
    assert len({m.token for m in mails}) == 120
    assert {m.language for m in mails} == {"en", "de"}
    assert {m.kind for m in mails} == {"plain", "alternative", "attachment"}
    for mail in mails:
        # 7-bit, CRLF, lines within RFC 5322's limit.
        assert mail.raw.isascii() and b"\n" not in mail.raw.replace(b"\r\n", b"")
        assert max(len(line) for line in mail.raw.split(b"\r\n")) <= 998
        headers = email.message_from_bytes(mail.raw, policy=email.policy.default)
        assert headers["Date"].datetime == SENT
        assert headers["Message-ID"] == f"<{mail.token}@{headers['From'].addresses[0].domain}>"
        assert str(headers["Subject"]) == mail.subject
        document = mime.to_index_document(mime.parse_message(mail.raw), archive_id=1,
                                          tenant_slug="demo")
        assert mail.token in re.findall(r"\w+", document.body)
        assert mail.topic in re.findall(r"\w+", document.body)
        # No other message holds its token.
        assert sum(mail.token.encode() in other.raw for other in mails) == 1


def test_sample_mail_is_reproducible_for_a_seed() -> None:
    assert [m.raw for m in sample_mails(5, seed="x", sent_at=SENT)] == \
        [m.raw for m in sample_mails(5, seed="x", sent_at=SENT)]
    assert sample_mails(1, seed=1, sent_at=SENT)[0].raw != \
        sample_mails(1, seed=2, sent_at=SENT)[0].raw
