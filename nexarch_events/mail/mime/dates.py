"""The Date header: parsed into an aware UTC datetime, clamped into
[1900-01-01, now + 1 day]. All of the date logic is ``header_date``."""

from __future__ import annotations

import calendar
import re
from datetime import UTC, datetime, timedelta
from email.utils import parsedate_tz

from .headers import Fields, first_field
from .notes import Notes, quote

__all__ = ["header_date"]

_EPOCH = datetime(1970, 1, 1, tzinfo=UTC)
#: Dates before this are clamped to it (with a note); later ones are kept:
#: mail from before 1970 is real (scanned letters, migrated archives).
_EARLIEST = datetime(1900, 1, 1, tzinfo=UTC)
_DATE = re.compile(
    r"(?:[A-Za-z]{3}, ?)?(\d{1,2}) ([A-Za-z]{3}) (\d{4}) (\d{1,2}):(\d\d)(?::(\d\d))? "
    r"([+-])(\d\d)(\d\d)(?: \([^()]*\))?", re.ASCII)
#: An obsolete two- or three-digit year after day and month (RFC 5322
#: 4.3): 00-49 are 2000-2049, 50-99 and three digits add 1900. The stdlib
#: splits at 69, so "1 Jan 65" became 2065 (clamped to tomorrow), and such
#: mail waited a whole retention period longer (found by an audit).
_SHORT_YEAR = re.compile(r"(\d{1,2}\s+[A-Za-z]{3}\s+)(\d{2,3})(?=\s)", re.ASCII)
_MONTHS = {name: number for number, name in enumerate(
    ("jan", "feb", "mar", "apr", "may", "jun", "jul", "aug", "sep", "oct", "nov", "dec"), 1)}


def _full_year(m: re.Match[str]) -> str:
    year = int(m.group(2))
    return m.group(1) + str(year + (2000 if len(m.group(2)) == 2 and year < 50 else 1900))


def header_date(fields: Fields, now: datetime, notes: Notes) -> datetime | None:
    """The Date field as aware UTC, clamped into [1900-01-01, ``now`` + 1
    day] (``now`` aware UTC), a note for each clamp; None if absent or
    unparseable (with a note)."""
    value = first_field(fields, b"date", "Date", notes)
    if value is None:
        return None
    value = " ".join(value.split())
    if not value:
        return None
    low = int((_EARLIEST - _EPOCH).total_seconds())
    high = int(now.timestamp()) + 86_400
    parts: tuple[int, int, int, int, int, int, int, int, int, int | None] | None
    m = _DATE.fullmatch(value)
    month_number = _MONTHS.get(m.group(2).lower()) if m is not None else None
    if m is not None and month_number is not None:
        # The usual form, without the stdlib's slower parser.
        day, _month, year, hour, minute, second, sign, zh, zm = m.groups()
        offset = (int(zh) * 3600 + int(zm) * 60) * (-1 if sign == "-" else 1)
        parts = (int(year), month_number, int(day), int(hour), int(minute),
                 int(second or 0), 0, 1, -1, offset)
    else:
        try:
            parts = parsedate_tz(_SHORT_YEAR.sub(_full_year, value, count=1))
        except Exception:  # the stdlib date parser has raised on odd input before
            parts = None
    seconds: int | None = None
    if parts is not None:
        year, month, day, hour, minute, second = parts[:6]
        if (1 <= month <= 12 and 1 <= day <= 31 and 0 <= hour <= 24 and 0 <= minute <= 59
                and 0 <= second <= 60 and abs(parts[9] or 0) <= 99 * 3600):
            if year < _EARLIEST.year:
                seconds = low - 1
            elif year > 9999:
                seconds = high + 1
            else:
                seconds = calendar.timegm(
                    (year, month, day, hour, minute, second, 0, 0, 0)) - (parts[9] or 0)
    else:
        try:
            iso: datetime | None = datetime.fromisoformat(value)
        except ValueError:
            iso = None
        if iso is not None:
            if iso.tzinfo is None:
                iso = iso.replace(tzinfo=UTC)
            seconds = int((iso - _EPOCH).total_seconds())
    if seconds is None:
        notes.add(f"Date {quote(value)} could not be parsed")
        return None
    if seconds < low:
        notes.add(f"Date {quote(value)} clamped to {_EARLIEST.date().isoformat()}")
        return _EARLIEST
    if seconds > high:
        clamped = _EPOCH + timedelta(seconds=high)
        notes.add(f"Date {quote(value)} clamped to {clamped.isoformat()} (now + 1 day)")
        return clamped
    return _EPOCH + timedelta(seconds=seconds)
