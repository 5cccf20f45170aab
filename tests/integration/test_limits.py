"""The README's limits on jobs hold for plain-SQL producers too: this test
reads the limits from the README and tries each boundary with a plain
INSERT, one step inside (accepted) and one step outside (refused)."""

from __future__ import annotations

import json
import re
from pathlib import Path

import pytest

from nexarch_events.aio import Database
from nexarch_events.errors import DatabaseRejected

README = Path(__file__).resolve().parents[2] / "README.md"
INSERT = ("INSERT INTO mail_index_jobs (job_type, tenant_slug, message_id, payload, max_attempts)"
          " VALUES ('index', $1, $2, $3::jsonb, $4)")


def limits() -> dict[str, tuple[int, int]]:
    text = " ".join(README.read_text(encoding="utf-8").split())
    section = text[text.index("Limits on jobs"):]
    section = section[:section.index("##")]
    found = {
        "tenant": re.search(r"tenant slug (\d+)–(\d+) characters", section),
        "message_id": re.search(r"message id (\d+)–(\d+) characters", section),
        "payload_mib": re.search(r"payload a JSON object of at most (\d+) MiB", section),
        "max_attempts": re.search(r"max attempts (\d+)–(\d+)", section),
    }
    missing = [k for k, m in found.items() if m is None]
    assert not missing, f"the README no longer states these limits: {missing}"
    out = {}
    for key, match in found.items():
        assert match is not None
        numbers = [int(g) for g in match.groups()]
        out[key] = (numbers[0], numbers[-1]) if len(numbers) == 2 else (0, numbers[0])
    assert "no NUL" in section and "no leading/trailing `-`" in section
    return out


def payload_of_size(size: int) -> str:
    """A JSON object that jsonb prints in exactly ``size`` bytes."""
    padding = size - len('{"p": ""}')
    return json.dumps({"p": "x" * padding})


async def insert(db: Database, tenant: str = "acme", message_id: str = "m",
                 payload: str = "{}", max_attempts: int = 5) -> None:
    await db.execute(INSERT, tenant, message_id, payload, max_attempts)


async def refused(db: Database, **values: object) -> None:
    with pytest.raises(DatabaseRejected):
        await insert(db, **values)  # type: ignore[arg-type]


async def test_every_limit_the_readme_documents_is_enforced_by_the_database(
        db: Database) -> None:
    lim = limits()
    low, high = lim["tenant"]
    await insert(db, tenant="a" * low)
    await insert(db, tenant="a" * high)
    await refused(db, tenant="a" * (low - 1))
    await refused(db, tenant="a" * (high + 1))
    await refused(db, tenant="-acme")
    await refused(db, tenant="acme-")
    await refused(db, tenant="Acme")

    low, high = lim["message_id"]
    await insert(db, message_id="m" * low)
    await insert(db, message_id="m" * high)
    await refused(db, message_id="m" * (low - 1))
    await refused(db, message_id="m" * (high + 1))
    await refused(db, message_id="a\x00b")

    size = lim["payload_mib"][1] * 1024 * 1024
    assert await db.fetchval("SELECT octet_length($1::jsonb::text)", payload_of_size(size)) \
        == size
    await insert(db, payload=payload_of_size(size))
    await refused(db, payload=payload_of_size(size + 1))
    await refused(db, payload="[]")
    await refused(db, payload='{"p": "a\\u0000b"}')

    low, high = lim["max_attempts"]
    await insert(db, max_attempts=low)
    await insert(db, max_attempts=high)
    await refused(db, max_attempts=low - 1)
    await refused(db, max_attempts=high + 1)
