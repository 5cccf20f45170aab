from __future__ import annotations

import re
from pathlib import Path

import pytest

from nexarch_events.db import sqlfiles

PACKAGE = Path(__file__).resolve().parents[2] / "nexarch_events"


def test_named_blocks_are_split() -> None:
    text = "-- name: one\nSELECT 1;\n-- a comment\n-- name: two\nSELECT 2;\n"
    assert sqlfiles.parse_named_queries(text) == {
        "one": "SELECT 1;\n-- a comment", "two": "SELECT 2;"}


def test_a_name_defined_twice_is_an_error() -> None:
    with pytest.raises(ValueError, match="twice"):
        sqlfiles.parse_named_queries("-- name: a\nSELECT 1;\n-- name: a\nSELECT 2;")


def test_queue_queries_exist() -> None:
    names = set(sqlfiles.queries("queue.sql"))
    assert {"enqueue", "claim", "ack", "heartbeat", "release", "reclaim_stale", "schedule",
            "status", "requeue_failed", "stats", "ready_count"} <= names


def test_every_query_the_code_names_exists() -> None:
    """Each ``X_SQL = sqlfiles.queries("f.sql")`` and every ``X_SQL["name"]``
    a module uses: the name must be in that file (a module may load several)."""
    checked = 0
    for path in PACKAGE.rglob("*.py"):
        text = path.read_text()
        loaded = dict(re.findall(r'\b(\w*_SQL) = sqlfiles\.queries\("([a-z_]+\.sql)"\)', text))
        used = re.findall(r'\b(\w*_SQL)\["([a-z_]+)"\]', text)
        if not used:
            continue
        for variable, name in used:
            assert variable in loaded, f"{path.name} uses {variable} without loading a file"
            assert name in sqlfiles.queries(loaded[variable]), f"{path.name}: {variable}[{name!r}]"
        checked += 1
    assert checked >= 3


def test_no_sql_is_built_by_string_formatting() -> None:
    """STYLE: no SQL from f-strings or '+'. Statements live in sql/."""
    offenders = []
    for path in PACKAGE.rglob("*.py"):
        for n, line in enumerate(path.read_text().splitlines(), 1):
            if re.search(r'f["\'](SELECT|INSERT|UPDATE|DELETE|CREATE|DROP)\b', line):
                offenders.append(f"{path.name}:{n}")
    assert offenders == []


def test_migrations_are_shipped_in_order() -> None:
    found = sqlfiles.migrations()
    assert found[0][0] == 1 and found[0][1] == "mail_index_jobs"
