"""Hints name the CLI as the user can run it again."""

from __future__ import annotations

import sys
from pathlib import Path

import pytest

from nexarch_events.cli.common import command_name


def test_the_readme_install_path_is_named_as_typed(tmp_path: Path,
                                                   monkeypatch: pytest.MonkeyPatch) -> None:
    script = tmp_path / ".venv" / "bin" / "nexarch-events"
    script.parent.mkdir(parents=True)
    script.write_text("#!/bin/sh\n")
    script.chmod(0o755)
    monkeypatch.chdir(tmp_path)
    monkeypatch.setattr(sys, "argv", [".venv/bin/nexarch-events", "demo"])
    monkeypatch.setenv("PATH", "/usr/bin:/bin")  # the venv is not activated
    assert command_name() == ".venv/bin/nexarch-events"
    monkeypatch.setenv("PATH", f"{script.parent}:/usr/bin:/bin")  # it is
    assert command_name() == "nexarch-events"


def test_python_dash_m(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(sys, "argv", ["/x/nexarch_events/__main__.py", "demo"])
    assert command_name().endswith(" -m nexarch_events")
