"""The embedded Postgres on a fresh clone: the CLI asks ``is_running()``
before anything has started a server, from a virtualenv that may sit under
a private folder (a home directory, a temporary clone). As root the server
runs as an unprivileged user, who must be able to reach the binaries before
the first command, not only after ``start()``. The binaries are copied under
a new private (0700) folder to reproduce the fresh clone."""

from __future__ import annotations

import shutil
import tempfile
from collections.abc import Iterator
from pathlib import Path

import pytest

from nexarch_events.db import embedded


@pytest.fixture
def private_install(monkeypatch: pytest.MonkeyPatch) -> Iterator[Path]:
    private = Path(tempfile.mkdtemp(prefix="nexarch-fresh-clone-"))  # mode 0700
    try:
        pginstall = embedded._bin_dir().parent
        copy = private / "venv" / "pginstall"
        shutil.copytree(pginstall, copy, symlinks=True)
        private.chmod(0o700)
        monkeypatch.setattr(embedded, "_bin_dir", lambda: copy / "bin")
        yield private
    finally:
        shutil.rmtree(private, ignore_errors=True)


def test_is_running_works_before_anything_started_a_server(private_install: Path) -> None:
    server = embedded.EmbeddedPostgres(private_install / "data" / "postgres")
    # Before the fix, as root: PermissionError running pg_ctl (exit 70 of
    # the README's main command on a fresh clone).
    assert server.is_running() is False
    # A second command works the same (access is prepared once).
    assert server.is_running() is False
