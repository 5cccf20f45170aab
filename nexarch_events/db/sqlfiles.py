"""Named SQL queries, loaded once from the ``.sql`` files shipped in the package.

A file holds blocks that start with ``-- name: <name>``; the block runs to the
next such line. Comments stay in the SQL: they explain why a clause is there.
"""

from __future__ import annotations

import functools
import re
from importlib import resources
from importlib.resources.abc import Traversable

_NAME = re.compile(r"^--\s*name:\s*([a-z_][a-z0-9_]*)\s*$", re.MULTILINE)


def sql_root() -> Traversable:
    """The folder of SQL files: ``sql/`` in a checkout, ``nexarch_events/sql`` in a wheel."""
    return resources.files("nexarch_events.sql")


def parse_named_queries(text: str) -> dict[str, str]:
    queries: dict[str, str] = {}
    matches = list(_NAME.finditer(text))
    for match, following in zip(matches, [*matches[1:], None], strict=True):
        end = following.start() if following else len(text)
        name = match.group(1)
        if name in queries:
            raise ValueError(f"query {name!r} is defined twice")
        queries[name] = text[match.end():end].strip()
    return queries


@functools.cache
def queries(filename: str) -> dict[str, str]:
    """All named queries of one file, e.g. ``queries("queue.sql")["claim"]``."""
    return parse_named_queries(sql_root().joinpath(filename).read_text("utf-8"))


def migrations() -> list[tuple[int, str, str]]:
    """``(version, name, sql)`` of every migration, in version order."""
    found: list[tuple[int, str, str]] = []
    for entry in sql_root().joinpath("migrations").iterdir():
        match = re.fullmatch(r"(\d{4})_([a-z0-9_]+)\.sql", entry.name)
        if match:
            found.append((int(match.group(1)), match.group(2), entry.read_text("utf-8")))
    found.sort()
    versions = [v for v, _, _ in found]
    if len(set(versions)) != len(versions):
        raise ValueError(f"duplicate migration versions in {versions}")
    return found
