"""docs/database-errors.md lists exactly the SQLSTATEs aio/pg.py sorts, each
with the kind it is sorted into."""

from __future__ import annotations

import re
from pathlib import Path

from nexarch_events.aio.pg import SQLSTATE_KINDS, error_class
from nexarch_events.errors import (
    DatabaseError,
    DatabasePrivilegeError,
    DatabaseRejected,
    DatabaseTransient,
    DatabaseUnavailable,
)

DOC = Path(__file__).resolve().parents[2] / "docs" / "database-errors.md"
KINDS = {"unavailable": DatabaseUnavailable, "transient": DatabaseTransient,
         "rejected": DatabaseRejected, "bug": DatabaseError,
         "configuration": DatabasePrivilegeError}


def documented() -> dict[str, str]:
    rows = {}
    for line in DOC.read_text(encoding="utf-8").splitlines():
        match = re.fullmatch(r"\| `([0-9A-Z]+)`(?: \(class\))? \| .* \| (\w+)(?: \(exit 2\))? \|",
                             line)
        if match:
            rows[match.group(1)] = match.group(2)
    return rows


def test_the_documented_table_is_the_code_table() -> None:
    assert {code: KINDS[kind] for code, kind in documented().items()} == dict(SQLSTATE_KINDS)


def test_the_longest_prefix_wins_and_unknown_codes_are_bugs() -> None:
    assert error_class("40P01") is DatabaseTransient
    assert error_class("40002") is DatabaseRejected
    assert error_class("57P01") is DatabaseUnavailable
    assert error_class("57014") is DatabaseTransient
    assert error_class("53300") is DatabaseUnavailable
    assert error_class("53100") is DatabaseTransient
    assert error_class("42883") is DatabaseError
    assert error_class("") is DatabaseError


def test_only_errors_that_cannot_be_the_statements_own_doing_are_outages() -> None:
    from nexarch_events.errors import DatabaseTimedOut, is_outage

    def sorted_as(state: str) -> DatabaseTransient:
        error = error_class(state)("x", sqlstate=state)
        assert isinstance(error, DatabaseTransient)
        return error

    for state in ("55P03", "40P01", "40001", "53100", "25006", "57P01", "08006"):
        assert is_outage(sorted_as(state)), state
    for state in ("57014", "54000"):  # a statement timeout; a vector over the limit
        assert not is_outage(sorted_as(state)), state
    assert is_outage(DatabaseUnavailable("connection lost"))
    assert not is_outage(DatabaseTimedOut("command timeout"))
