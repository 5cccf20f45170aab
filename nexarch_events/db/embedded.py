"""An embedded Postgres server in a local data folder.

Used when no database URL is configured, and by the tests as a throwaway
server. The server binaries come from the ``pgserver`` package, so nothing
needs installing beyond this package. Postgres refuses to run as root; as
root the server runs as a dedicated system user (``pgserver``, created on
first use, as the pgserver package itself does).

Blocking: every method here blocks (subprocesses); call them before trio
starts, or through ``trio.to_thread.run_sync``.
"""

from __future__ import annotations

import os
import pwd
import shutil
import socket
import stat
import subprocess
import warnings
from pathlib import Path

from ..errors import ConfigurationError

_SYSTEM_USER = "pgserver"


def _bin_dir() -> Path:
    try:
        with warnings.catch_warnings():
            # Importing pgserver asks platformdirs for a runtime folder it
            # never uses here; without XDG_RUNTIME_DIR (cron, containers,
            # ssh without a session) that warned on every command.
            warnings.filterwarnings("ignore", message="XDG_RUNTIME_DIR is not set")
            from pgserver._commands import POSTGRES_BIN_PATH
    except ImportError:  # pragma: no cover - pgserver is a dependency
        pass
    else:
        if (Path(POSTGRES_BIN_PATH) / "postgres").exists():
            return Path(POSTGRES_BIN_PATH)
    pg_ctl = shutil.which("pg_ctl")
    if pg_ctl:
        return Path(pg_ctl).parent
    raise ConfigurationError(
        "no Postgres server binaries found: install the 'pgserver' package "
        "(pip install pgserver) or set NEXARCH_DATABASE_URL")


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        port: int = sock.getsockname()[1]
        return port


def _system_user() -> pwd.struct_passwd:
    """The unprivileged user a root process runs the server as (Postgres
    refuses to run as root), created the first time it is needed."""
    try:
        return pwd.getpwnam(_SYSTEM_USER)
    except KeyError:
        subprocess.run(["useradd", "--system", "--no-create-home", "-s", "/usr/sbin/nologin",
                        _SYSTEM_USER], check=True, capture_output=True)
        return pwd.getpwnam(_SYSTEM_USER)


def _traversable(path: Path) -> None:
    """Every folder above ``path`` may be traversed by other users."""
    for parent in path.parents:
        parent.chmod(parent.stat().st_mode | stat.S_IXOTH | stat.S_IXGRP)


class EmbeddedPostgres:
    """One Postgres cluster in ``data_dir``, listening on 127.0.0.1 only."""

    def __init__(self, data_dir: str | os.PathLike[str], *, port: int | None = None,
                 durable: bool = True) -> None:
        self.data_dir = Path(data_dir).resolve()
        self.port = port or free_port()
        #: False for throwaway test servers: no fsync (much faster, and a
        #: crash may lose data, which a throwaway server does not mind).
        self.durable = durable
        self.bin_dir = _bin_dir()
        self._user = _SYSTEM_USER if os.geteuid() == 0 else None
        self._binaries_ready = False

    def url(self, database: str = "postgres") -> str:
        return f"postgresql://postgres@127.0.0.1:{self.port}/{database}"

    def _run(self, *args: str, check: bool = True) -> subprocess.CompletedProcess[str]:
        kwargs: dict[str, object] = {}
        if self._user is not None:
            # Any command may come first (``is_running`` before ``start`` on a
            # fresh clone), so the server user and its access to the binaries
            # are made ready before the first one, not only by ``start``.
            entry = self._binaries_for_server_user()
            kwargs = {"user": entry.pw_uid, "group": entry.pw_gid, "extra_groups": []}
        return subprocess.run(  # type: ignore[call-overload, no-any-return]
            [str(self.bin_dir / args[0]), *args[1:]], check=check, capture_output=True,
            text=True, cwd="/", **kwargs)

    def _binaries_for_server_user(self) -> pwd.struct_passwd:
        """As root: the server user exists and can traverse to the binaries
        and run them (a virtualenv under a private folder is not reachable
        for it as installed). Done once per instance."""
        entry = _system_user()
        if not self._binaries_ready:
            _traversable(self.bin_dir)
            for root, dirs, files in os.walk(self.bin_dir.parent):
                for name in dirs + files:
                    p = Path(root) / name
                    if not p.is_symlink():
                        p.chmod(p.stat().st_mode | stat.S_IROTH | stat.S_IXOTH
                                if os.access(p, os.X_OK) else p.stat().st_mode | stat.S_IROTH)
            self._binaries_ready = True
        return entry

    def _prepare_as_root(self) -> None:
        entry = self._binaries_for_server_user()
        # The server user must traverse to its data folder and own it.
        _traversable(self.data_dir)
        os.chown(self.data_dir, entry.pw_uid, entry.pw_gid)

    def start(self) -> None:
        """Create the cluster if needed, then start it and wait until it accepts."""
        self.data_dir.mkdir(parents=True, exist_ok=True)
        if self._user is not None:
            self._prepare_as_root()
        if not (self.data_dir / "PG_VERSION").exists():
            self._run("initdb", "--auth=trust", "--encoding=UTF8", "--locale=C.UTF-8",
                      "-U", "postgres", "-D", str(self.data_dir))
        options = [f"-p {self.port}", "-c listen_addresses=127.0.0.1",
                   "-c unix_socket_directories=''", "-c max_connections=200"]
        if not self.durable:
            options += ["-c fsync=off", "-c synchronous_commit=off", "-c full_page_writes=off"]
        result = self._run("pg_ctl", "start", "-w", "-t", "60", "-D", str(self.data_dir),
                           "-l", str(self.data_dir / "server.log"), "-o", " ".join(options),
                           check=False)
        if result.returncode != 0:
            log_tail = ""
            log_file = self.data_dir / "server.log"
            if log_file.exists():
                log_tail = log_file.read_text(errors="replace")[-2000:]
            raise RuntimeError(f"embedded Postgres did not start: {result.stderr}\n{log_tail}")

    def stop(self, mode: str = "fast") -> None:
        self._run("pg_ctl", "stop", "-w", "-t", "60", "-m", mode, "-D", str(self.data_dir),
                  check=False)

    def restart(self) -> None:
        self.stop()
        self.start()

    def is_running(self) -> bool:
        return self._run("pg_ctl", "status", "-D", str(self.data_dir), check=False).returncode == 0

    def __enter__(self) -> EmbeddedPostgres:
        self.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self.stop()
