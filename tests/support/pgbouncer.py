"""A throwaway PgBouncer in transaction mode in front of the test Postgres.

``running_pgbouncer(url)`` starts Debian's ``pgbouncer`` on a free loopback
port, forwarding every database to the server ``url`` names as its user, and
stops it afterwards. When the binary is missing and we are root on a
Debian-like system, it is installed with apt-get first (as the Dovecot
fixture does); otherwise the fixture fails saying what to install.
"""

from __future__ import annotations

import os
import pwd
import shutil
import socket
import subprocess
import tempfile
import time
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from urllib.parse import unquote, urlsplit, urlunsplit

from tests.support import apt

_HINT = "PgBouncer is needed for the pooler tests: apt-get install pgbouncer (as root)"


def ensure_pgbouncer() -> str:
    """The pgbouncer binary, installed with apt-get when missing (root only;
    tests/support/apt.py). The package's own service is not started."""
    return apt.ensure("pgbouncer", "pgbouncer", _HINT)


@dataclass(frozen=True)
class PgBouncer:
    port: int
    log_path: Path

    def url(self, direct_url: str) -> str:
        """``direct_url`` with its host and port replaced by the pooler's."""
        parts = urlsplit(direct_url)
        userinfo = parts.netloc.rpartition("@")[0]
        netloc = f"127.0.0.1:{self.port}"
        return urlunsplit(parts._replace(netloc=f"{userinfo}@{netloc}" if userinfo else netloc))


def _free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        port: int = sock.getsockname()[1]
        return port


@contextmanager
def running_pgbouncer(upstream_url: str) -> Iterator[PgBouncer]:
    """PgBouncer (pool_mode=transaction) in front of the server of
    ``upstream_url``, for the block."""
    binary = ensure_pgbouncer()
    upstream = urlsplit(upstream_url)
    target = (f"host={upstream.hostname or '127.0.0.1'} port={upstream.port or 5432} "
              f"user={unquote(upstream.username or 'postgres')}")
    if upstream.password:
        target += f" password={unquote(upstream.password)}"
    folder = Path(tempfile.mkdtemp(prefix="nexarch-pgbouncer-"))
    folder.chmod(0o755)
    log_path = folder / "pgbouncer.log"
    # PgBouncer refuses to run as root: then it runs as nobody.
    run_as = ["-u", "nobody"] if os.geteuid() == 0 else []
    process: subprocess.Popen[bytes] | None = None
    try:
        for _attempt in range(5):
            port = _free_port()
            config = folder / "pgbouncer.ini"
            config.write_text(
                "[databases]\n"
                f"* = {target}\n\n"
                "[pgbouncer]\n"
                "listen_addr = 127.0.0.1\n"
                f"listen_port = {port}\n"
                "unix_socket_dir =\n"
                # Who may connect is the loopback; the server decides the rest.
                "auth_type = any\n"
                "pool_mode = transaction\n"
                "max_client_conn = 200\n"
                "default_pool_size = 20\n"
                f"logfile = {log_path}\n"
                f"pidfile = {folder / 'pgbouncer.pid'}\n")
            if run_as:
                nobody = pwd.getpwnam("nobody")
                for path in (folder, config):
                    os.chown(path, nobody.pw_uid, nobody.pw_gid)
            process = subprocess.Popen([binary, *run_as, str(config)],
                                       stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
            deadline = time.monotonic() + 10
            while time.monotonic() < deadline and process.poll() is None:
                try:
                    socket.create_connection(("127.0.0.1", port), timeout=0.5).close()
                    break
                except OSError:
                    time.sleep(0.05)
            if process.poll() is None:
                break
            process = None  # the port was taken meanwhile: another one
        if process is None:
            log = log_path.read_text(errors="replace")[-2000:] if log_path.exists() else ""
            raise RuntimeError(f"pgbouncer did not start:\n{log}")
        yield PgBouncer(port, log_path)
    finally:
        if process is not None:
            process.terminate()
            try:
                process.wait(10)
            except subprocess.TimeoutExpired:
                process.kill()
                process.wait()
        shutil.rmtree(folder, ignore_errors=True)
