"""A bug stops the process with exit code 70 and its traceback logged,
instead of being swallowed or looking like a usage error."""

from __future__ import annotations

import logging
import os

import pytest

from nexarch_events.cli import app as cli
from nexarch_events.cli import service as service_commands


class Records(logging.Handler):
    def __init__(self) -> None:
        super().__init__(logging.CRITICAL)
        self.records: list[logging.LogRecord] = []

    def emit(self, record: logging.LogRecord) -> None:
        self.records.append(record)


def test_a_bug_exits_70_with_the_traceback_logged(monkeypatch: pytest.MonkeyPatch) -> None:
    def broken(*_args: object) -> int:
        raise RuntimeError("a part crashed")

    monkeypatch.setattr(service_commands, "cmd_config_check", broken)
    for key in [k for k in os.environ if k.startswith("NEXARCH_")]:
        monkeypatch.delenv(key)
    # The CLI owns the root logger's handlers; listen on its own logger.
    records = Records()
    logging.getLogger("nexarch_events").addHandler(records)
    try:
        code = cli.main(["config", "check"])
    finally:
        logging.getLogger("nexarch_events").removeHandler(records)
    assert code == cli.EXIT_BUG == 70
    [record] = records.records
    assert "bug" in record.getMessage() and record.exc_info is not None
    assert "a part crashed" in str(record.exc_info[1])


def test_errors_inside_exception_groups_keep_their_exit_codes(
        monkeypatch: pytest.MonkeyPatch) -> None:
    from nexarch_events.errors import DatabaseUnavailable

    def unreachable(*_args: object) -> int:
        raise ExceptionGroup("nursery", [DatabaseUnavailable("connection refused")])

    monkeypatch.setattr(service_commands, "cmd_config_check", unreachable)
    assert cli.main(["config", "check"]) == cli.EXIT_UNAVAILABLE
