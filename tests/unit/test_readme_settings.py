"""Every setting the program accepts is documented in the README's table of
variables, and the table names no setting that does not exist."""

from __future__ import annotations

import re
from pathlib import Path

from nexarch_events.settings import Settings

README = Path(__file__).resolve().parents[2] / "README.md"


def documented_variables(text: str) -> set[str]:
    """The names in the first column of the variable table. An abbreviation
    ``…_TAIL`` after a full name replaces as many trailing parts of it:
    ``NEXARCH_QUEUE_BACKOFF_BASE``, ``…_BACKOFF_CAP`` names
    ``NEXARCH_QUEUE_BACKOFF_CAP``."""
    names: set[str] = set()
    for line in text.splitlines():
        if not line.startswith("| `NEXARCH_"):
            continue
        first = line.split("|")[1]
        full: list[str] = []
        for token in re.findall(r"`([^`]+)`", first):
            if token.startswith("NEXARCH_"):
                full = token.split("_")
                names.add(token)
            elif token.startswith("…_") and full:
                tail = token[2:].split("_")
                names.add("_".join(full[:-len(tail)] + tail))
    return names


def test_the_readme_documents_every_setting_and_no_other() -> None:
    documented = documented_variables(README.read_text("utf-8"))
    known = set(Settings.known_env_keys())
    assert sorted(known - documented) == [], "accepted but not in README.md's table"
    assert sorted(documented - known) == [], "in README.md's table but not accepted"


def test_abbreviations_expand() -> None:
    table = ("| `NEXARCH_QUEUE_BACKOFF_BASE`, `…_BACKOFF_CAP` | 10 | x |\n"
             "| `NEXARCH_QUEUE_LISTENER_PING_INTERVAL`, `…_TIMEOUT` | 5 | x |\n")
    assert documented_variables(table) == {
        "NEXARCH_QUEUE_BACKOFF_BASE", "NEXARCH_QUEUE_BACKOFF_CAP",
        "NEXARCH_QUEUE_LISTENER_PING_INTERVAL", "NEXARCH_QUEUE_LISTENER_PING_TIMEOUT"}
