"""The test suite's installer (tests/support/apt.py) waits out someone
else's dpkg lock instead of failing the test that needed the package: with a
real subprocess standing in for apt-get, failing twice the way apt-get does
when the lock is held, then succeeding."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

from tests.support import apt


def fake_apt(tmp_path: Path, failures: int, message: str) -> list[str]:
    counter = tmp_path / "calls"
    script = tmp_path / "apt-get"
    script.write_text(
        "#!/bin/sh\n"
        f"echo x >> {counter}\n"
        f"if [ $(wc -l < {counter}) -le {failures} ]; then\n"
        f"  echo '{message}' >&2; exit 100\n"
        "fi\n"
        "exit 0\n")
    script.chmod(0o755)
    return [str(script)]


def calls(tmp_path: Path) -> int:
    return len((tmp_path / "calls").read_text().splitlines())


def test_a_held_lock_is_waited_for(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(apt.time, "sleep", lambda s: None)
    held = ("E: Could not get lock /var/lib/dpkg/lock-frontend. It is held by process 4242 "
            "(apt-get)")
    apt._run_waiting_for_locks(fake_apt(tmp_path, 2, held), dict(os.environ), "hint")
    assert calls(tmp_path) == 3


def test_any_other_failure_fails_at_once_naming_the_command(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(apt.time, "sleep", lambda s: None)
    command = fake_apt(tmp_path, 5, "E: Unable to locate package dovecot-imapd")
    with pytest.raises(RuntimeError, match=r"hint; .*apt-get` failed \(exit 100\)"
                                           r"[\s\S]*Unable to locate package"):
        apt._run_waiting_for_locks(command, dict(os.environ), "hint")
    assert calls(tmp_path) == 1


def test_a_lock_held_past_the_wait_fails(tmp_path: Path,
                                        monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(apt.time, "sleep", lambda s: None)
    monkeypatch.setattr(apt, "LOCK_WAIT", 0.0)
    command = fake_apt(tmp_path, 5, "E: Could not get lock /var/lib/apt/lists/lock")
    with pytest.raises(RuntimeError, match="Could not get lock"):
        apt._run_waiting_for_locks(command, dict(os.environ), "hint")
    assert calls(tmp_path) == 1
