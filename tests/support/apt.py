"""The system binaries the tests need (dovecot, pgbouncer), installed with
apt-get when missing and we are root on a Debian-like machine.

Installing is serialised, because the dpkg lock is machine-wide and others
want it too: two test runs at once on one machine (the suite under CPU
pressure is run that way), or the machine's own provisioning installing
packages while the first test starts. Seen here: a second run's apt-get
failed on the lock the first run's install held, and its first Dovecot test
errored. So

- our own processes take an exclusive ``flock`` on one file first and look
  for the binary again once they hold it (the other run may have installed
  it meanwhile);
- apt-get itself waits for a lock held by anyone else
  (``DPkg::Lock::Timeout``), and a run that still fails on a lock is retried
  until ``LOCK_WAIT`` has passed.

A policy-rc.d that answers 101 ("action forbidden") keeps the package's
postinst from starting the system-wide service (the usual container trick);
one that is already there is left as it is.
"""

from __future__ import annotations

import fcntl
import os
import shutil
import subprocess
import time
from pathlib import Path

SBIN = ("/usr/sbin", "/usr/local/sbin", "/sbin")
LOCK_FILE = Path("/tmp/nexarch-tests-apt.lock")
#: How long an install waits for someone else's dpkg or apt lists lock (s).
LOCK_WAIT = 600.0
_LOCK_WORDS = ("could not get lock", "unable to lock", "is another process using it")


def which(name: str) -> str | None:
    """``shutil.which`` that also looks in the sbin folders, which a non-login
    or unprivileged PATH often lacks (dovecot and pgbouncer live in /usr/sbin)."""
    path = os.environ.get("PATH", os.defpath)
    extra = [d for d in SBIN if d not in path.split(os.pathsep)]
    return shutil.which(name, path=os.pathsep.join([path, *extra]))


def ensure(binary: str, package: str, hint: str) -> str:
    """The path of ``binary``, installing ``package`` when it is missing.

    Raises RuntimeError starting with ``hint`` (which says what to install)
    when it cannot be had.
    """
    found = which(binary)
    if found:
        return found
    if os.geteuid() != 0 or not which("apt-get"):
        raise RuntimeError(f"{hint}; it is not installed and cannot be installed here "
                           "(not root, or no apt-get)")
    with LOCK_FILE.open("a") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        try:
            found = which(binary)
            if not found:
                _install(package, hint)
                found = which(binary)
        finally:
            fcntl.flock(lock, fcntl.LOCK_UN)
    if not found:
        raise RuntimeError(f"{hint}; apt-get installed {package} but no {binary} binary "
                           "is on PATH or in /usr/sbin")
    return found


def _install(package: str, hint: str) -> None:
    env = {**os.environ, "DEBIAN_FRONTEND": "noninteractive"}
    wait = ["-o", f"DPkg::Lock::Timeout={int(LOCK_WAIT)}"]
    policy = Path("/usr/sbin/policy-rc.d")
    wrote_policy = not policy.exists()
    if wrote_policy:
        policy.write_text("#!/bin/sh\n# written by tests/support/apt.py\nexit 101\n")
        policy.chmod(0o755)
    try:
        for command in (["apt-get", *wait, "update", "-q"],
                        ["apt-get", *wait, "install", "-y", "-q", "--no-install-recommends",
                         package]):
            _run_waiting_for_locks(command, env, hint)
    finally:
        if wrote_policy:
            policy.unlink(missing_ok=True)


def _run_waiting_for_locks(command: list[str], env: dict[str, str], hint: str) -> None:
    deadline = time.monotonic() + LOCK_WAIT
    while True:
        done = subprocess.run(command, env=env, capture_output=True, text=True, check=False)
        if done.returncode == 0:
            return
        output = done.stdout + done.stderr
        if any(w in output.lower() for w in _LOCK_WORDS) and time.monotonic() < deadline:
            time.sleep(2.0)
            continue
        tail = "\n".join(output.splitlines()[-20:])
        raise RuntimeError(f"{hint}; `{' '.join(command)}` failed "
                           f"(exit {done.returncode}):\n{tail}")
