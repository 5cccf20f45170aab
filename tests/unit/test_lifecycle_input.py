"""What the lifecycle commands and settings accept, checked without a
database: ids, holds, retention days and their configuration."""

from __future__ import annotations

from pathlib import Path

import pytest

from nexarch_events.cli.app import build_parser, check_arguments
from nexarch_events.config import load_settings
from nexarch_events.errors import ConfigurationError, InvalidJobError
from nexarch_events.index.base import InvalidQuery
from nexarch_events.lifecycle.audit import validate_actor
from nexarch_events.lifecycle.erasure import HeldByLegalHold, validate_ids
from nexarch_events.lifecycle.holds import HoldScope, validate_hold
from nexarch_events.lifecycle.retention import date_header, validate_days
from nexarch_events.settings import RetentionSettings, Settings


def test_archive_ids_are_deduplicated_sorted_and_bounded() -> None:
    assert validate_ids(["3", 1, 3]) == [1, 3]
    for bad in ([], ["x"], [0], [2**63], [True], [1.5], ["١"]):
        with pytest.raises(InvalidJobError):
            validate_ids(bad)


@pytest.mark.parametrize(("scope", "mailbox", "query", "reason", "message"), [
    ("folder", None, None, "r", "scope must be"),
    ("tenant", "INBOX", None, "r", "takes no mailbox"),
    ("tenant", None, None, " ", "needs a reason"),
    ("mailbox", None, None, "r", "needs the mailbox"),
    ("query", None, None, "r", "needs the query"),
    ("mailbox", "INBOX", "x", "r", "takes no query"),
])
def test_a_bad_hold_is_refused_naming_the_problem(scope: str, mailbox: str | None,
                                                   query: str | None, reason: str,
                                                   message: str) -> None:
    with pytest.raises(InvalidJobError, match=message):
        validate_hold(scope, mailbox, query, reason, "acme")


def test_a_query_hold_needs_something_to_search_for() -> None:
    assert validate_hold("query", None, "merger -draft", "r", "acme") is HoldScope.QUERY
    for query in ("", "!!!", "-only"):
        with pytest.raises(InvalidQuery):
            validate_hold("query", None, query, "r", "acme")


def test_actor_and_days() -> None:
    assert validate_actor("alice") == "alice"
    for bad in ("", " ", "x" * 201, "a\nb"):
        with pytest.raises(InvalidJobError):
            validate_actor(bad)
    assert validate_days(30) == 30
    for days in (0, -1, 36501, True, "30"):
        with pytest.raises(InvalidJobError):
            validate_days(days)


def test_the_held_error_names_every_hold_and_id() -> None:
    error = HeldByLegalHold("acme", {7: {2}, 3: {1, 2}}, {1: "legal hold #1 on x",
                                                          2: "legal hold #2 on y"})
    assert error.held == {3: (1, 2), 7: (2,)} and error.hold_ids == (1, 2)
    assert "message(s) 3 7" in str(error) and "legal hold #1 on x; legal hold #2 on y" \
        in str(error)


def test_retention_days_from_the_environment_and_the_file(tmp_path: Path) -> None:
    settings = Settings.from_env({"NEXARCH_RETENTION_DAYS": "acme=365, beta=30",
                                  "NEXARCH_RETENTION_INTERVAL": "3600"})
    assert settings.retention.days == (("acme", 365), ("beta", 30))
    assert settings.retention.interval == 3600
    config = tmp_path / "nexarch.toml"
    config.write_text("[retention]\nbatch_size = 50\n[retention.days]\nacme = 90\n")
    loaded = load_settings(str(config), environ={})
    assert loaded.retention == RetentionSettings(batch_size=50, days=(("acme", 90),))
    for raw in ("acme", "acme=0", "Bad_Slug=3", "acme=1,acme=2", "acme=x"):
        with pytest.raises(ConfigurationError):
            Settings.from_env({"NEXARCH_RETENTION_DAYS": raw})
    config.write_text("[retention]\ndays = 30\n")
    with pytest.raises(ConfigurationError, match=r"retention\.days must be a table"):
        load_settings(str(config), environ={})


def test_the_date_header_for_retention() -> None:
    from datetime import UTC, datetime

    now = datetime(2025, 1, 1, tzinfo=UTC)
    head = b"Subject: x\r\nDate: Sat, 01 Jun 2024 12:00:00 +0200\r\n\r\nbody"
    assert date_header(head, now) == datetime(2024, 6, 1, 10, 0, tzinfo=UTC)
    assert date_header(b"Subject: x\r\n\r\nbody", now) is None
    assert date_header(b"Date: not a date\r\n\r\n", now) is None


@pytest.mark.parametrize("argv", [
    ["erase", "--tenant", "acme"],
    ["erase", "--tenant", "acme", "1", "--all", "--yes-erase-tenant", "acme"],
    ["erase", "--tenant", "acme", "--all", "--yes-erase-tenant", "other"],
    ["erase", "--tenant", "acme", "1", "--yes-erase-tenant", "acme"],
    ["erase", "--tenant", "acme", "1", "--wait", "0"],
    ["erase", "--tenant", "acme", "--all", "--yes-erase-tenant", "acme",
     "--unregister-mailboxes"],
    ["retention", "set", "--tenant", "acme", "--days", "0"],
])
def test_bad_erase_and_retention_arguments(argv: list[str]) -> None:
    args = build_parser().parse_args(argv)
    with pytest.raises(ConfigurationError):
        check_arguments(args)


def test_good_erase_arguments_pass_the_check() -> None:
    for argv in (["erase", "--tenant", "acme", "1", "2", "--wait", "10"],
                 ["erase", "--tenant", "acme", "--query", "invoice", "--dry-run"],
                 ["erase", "--tenant", "acme", "--all", "--yes-erase-tenant", "acme"]):
        check_arguments(build_parser().parse_args(argv))
