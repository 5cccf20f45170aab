"""mail/mime/dates.py: the Date header (``header_date``)."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta

import pytest

from nexarch_events.mail.mime.dates import header_date
from nexarch_events.mail.mime.notes import Notes

NOW = datetime(2025, 6, 1, 12, 0, tzinfo=UTC)


def date_of(value: str, now: datetime = NOW) -> tuple[datetime | None, tuple[str, ...]]:
    notes = Notes()
    return header_date({b"date": [value.encode()]}, now, notes), notes.result()


@pytest.mark.parametrize(("value", "expected"), [
    # The fast path (the usual RFC 5322 form) ...
    (" Sun, 1 Jun 2025 11:59:59 +0000", datetime(2025, 6, 1, 11, 59, 59, tzinfo=UTC)),
    (" 1 Jun 2025 13:00 +0100 (CET)", datetime(2025, 6, 1, 12, 0, tzinfo=UTC)),
    (" 31 May 2025 23:30:00 -0130", datetime(2025, 6, 1, 1, 0, tzinfo=UTC)),
    # ... and the stdlib's lenient parser for the rest ...
    (" Sun, 01 Jun 2025 11:00:00 EST", datetime(2025, 6, 1, 16, 0, tzinfo=UTC)),
    (" 1 Jun 25 11:00 GMT", datetime(2025, 6, 1, 11, 0, tzinfo=UTC)),
    # ... and ISO 8601, naive meaning UTC.
    (" 2025-05-31T10:00:00-02:00", datetime(2025, 5, 31, 12, 0, tzinfo=UTC)),
    (" 2025-05-31", datetime(2025, 5, 31, tzinfo=UTC)),
])
def test_parsed_as_utc(value: str, expected: datetime) -> None:
    date, notes = date_of(value)
    assert date == expected
    assert date is not None and date.tzinfo == UTC
    assert notes == ()


def test_up_to_one_day_ahead_of_now_is_kept() -> None:
    assert date_of(" 2 Jun 2025 12:00:00 +0000") == (NOW + timedelta(days=1), ())


def test_more_than_a_day_ahead_is_clamped_relative_to_now() -> None:
    later = NOW + timedelta(days=365)
    date, notes = date_of(" 2 Jun 2025 12:00:01 +0000", now=later)
    assert (date, notes) == (datetime(2025, 6, 2, 12, 0, 1, tzinfo=UTC), ())
    date, notes = date_of(" 2 Jun 2025 12:00:01 +0000")
    assert date == NOW + timedelta(days=1)
    assert notes == ("Date '2 Jun 2025 12:00:01 +0000' clamped to "
                     "2025-06-02T12:00:00+00:00 (now + 1 day)",)


@pytest.mark.parametrize("value", [
    "Sun, 1 Jun 2025 25:00:00 +0000",    # hour out of range
    "Sun, 32 Jun 2025 10:00:00 +0000",   # day out of range
    "Sun, 1 Jun 2025 10:00:00 +9999",    # offset beyond 99 hours
    "last Tuesday",
])
def test_unparseable_is_none_with_a_note(value: str) -> None:
    assert date_of(" " + value) == (None, (f"Date '{value}' could not be parsed",))


def test_absent_or_blank_is_none_without_a_note() -> None:
    notes = Notes()
    assert header_date({}, NOW, notes) is None
    assert header_date({b"date": [b" \t "]}, NOW, notes) is None
    assert notes.result() == ()


def test_only_the_first_date_field_counts() -> None:
    notes = Notes()
    fields = {b"date": [b" 1 Jun 2025 10:00 +0000", b" 1 Jan 2020 10:00 +0000"]}
    assert header_date(fields, NOW, notes) == datetime(2025, 6, 1, 10, 0, tzinfo=UTC)


@pytest.mark.parametrize(("value", "year"), [
    (" 01 Jan 65 00:00:00 +0000", 1965), (" Fri, 01 Jan 60 10:00 GMT", 1960),
    (" Mon, 01 Jan 68 10:00 GMT", 1968), (" Wed, 01 Jan 69 10:00 GMT", 1969),
    (" 1 Jan 98 10:00 GMT", 1998), (" 1 Jan 49 10:00 GMT", 2049),
    (" 1 Jan 00 10:00 GMT", 2000), (" 1 Jan 101 10:00 GMT", 2001),
])
def test_two_and_three_digit_years_follow_rfc_5322(value: str, year: int) -> None:
    # A "now" late enough that none of them is clamped.
    date, _ = date_of(value, now=datetime(2050, 1, 1, tzinfo=UTC))
    assert date is not None and date.year == year
