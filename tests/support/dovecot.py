"""A real Dovecot IMAP server for integration tests, started per test (or per
module) on free loopback ports, with a throwaway maildir and static passwords.

Why a real server: an IMAP importer lives on the details a fake gets wrong
(UIDVALIDITY changes, APPENDUID, \\Seen never being set by FETCH BODY.PEEK,
STARTTLS, implicit TLS, connection limits, a server that dies mid-session).

Everything lives under one ``tempfile.mkdtemp(prefix="nexarch-dovecot-")``
folder, not under pytest's tmp_path: as root, every pytest run resets
/tmp/pytest-of-root to mode 0700, which would lock the unprivileged Dovecot
processes (login, auth, mail) out of their files. Layout::

    <root>/dovecot.conf     our own config: nothing from /etc/dovecot is read
    <root>/dovecot.log      Dovecot's log (``log_path``), tail in start errors
    <root>/stderr.log       the master's stdout/stderr (config errors land here)
    <root>/users            passwd-file: user:{PLAIN}password:uid:gid::home
    <root>/tls/             throwaway CA and the server certificate (openssl CLI)
    <root>/run/             base_dir (sockets, master.pid)
    <root>/state/           state_dir
    <root>/mail/<user>/     home of each user, maildir in Maildir/ (LAYOUT=fs)

Mail is never accessed as root (Dovecot refuses uid 0 for mail): as root,
every user's mail belongs to ``nobody``; as an ordinary user, to that user
(then Dovecot runs wholly unprivileged, without chroots).

The helper is synchronous (subprocess plus the stdlib imaplib): trio tests
call it from sync fixtures, or through ``trio.to_thread.run_sync``.
"""

from __future__ import annotations

import atexit
import base64
import contextlib
import grp
import imaplib
import os
import pwd
import re
import shutil
import signal
import socket
import ssl
import subprocess
import tempfile
import threading
import time
from collections.abc import Iterable, Iterator, Sequence
from datetime import datetime
from pathlib import Path
from typing import Any

from tests.support import apt
from tests.support.apt import which as _which

HOST = "127.0.0.1"
DEFAULT_USERS: dict[str, str] = {"alice": "alice-secret-1", "bob": "bob-secret-2"}
START_TIMEOUT = 20.0
STOP_TIMEOUT = 10.0
IMAP_TIMEOUT = 60.0
# MULTIAPPEND batches: small enough to keep one command's memory modest,
# large enough that 20,000 messages need only a few dozen round trips.
APPEND_BATCH_MESSAGES = 1000
APPEND_BATCH_BYTES = 8 * 1024 * 1024

_INSTALL_HINT = (
    "Dovecot is needed for the IMAP tests: apt-get install dovecot-imapd (as root), "
    "or put the dovecot binary on PATH"
)


# ---------------------------------------------------------------- binaries


def ensure_dovecot() -> str:
    """The path of the dovecot binary, installing dovecot-imapd with apt-get
    when it is missing and we are root on a Debian-like system
    (tests/support/apt.py: serialised against other installs).

    Raises RuntimeError (saying what to install) when it cannot be had.
    """
    return apt.ensure("dovecot", "dovecot-imapd", _INSTALL_HINT)


def _doveadm(dovecot: str) -> str:
    """doveadm, from PATH or next to the dovecot binary's usual places."""
    found = _which("doveadm")
    if found:
        return found
    for candidate in (Path(dovecot).parent / "doveadm", Path("/usr/bin/doveadm")):
        if candidate.is_file() and os.access(candidate, os.X_OK):
            return str(candidate)
    raise RuntimeError("doveadm is needed (it ships with dovecot-core) and was not found")


def _openssl() -> str:
    found = _which("openssl")
    if not found:
        raise RuntimeError("openssl (the command line tool) is needed to make the throwaway "
                           "TLS certificates of the Dovecot test server: apt-get install openssl")
    return found


# ------------------------------------------------------------ small helpers


def _free_port() -> int:
    """A port the kernel just handed out on the loopback. Someone else may
    take it before Dovecot binds it; start() retries with new ports then."""
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
        sock.bind((HOST, 0))
        port: int = sock.getsockname()[1]
        return port


def _size(path: Path) -> int:
    try:
        return path.stat().st_size
    except OSError:
        return 0


def _tail(path: Path, start: int = 0, lines: int = 40) -> str:
    """The last lines of a log, from byte ``start`` on."""
    try:
        with path.open("rb") as file:
            file.seek(start)
            text = file.read().decode(errors="replace")
    except OSError:
        return ""
    return "\n".join(text.splitlines()[-lines:])


def imap_utf7(name: str) -> str:
    """A mailbox name in IMAP's modified UTF-7 (RFC 3501 5.1.3), which is
    what goes on the wire for non-ASCII names (Dovecot 2.3 has no UTF8=ACCEPT)."""
    out: list[str] = []
    pending: list[str] = []

    def flush() -> None:
        if pending:
            raw = "".join(pending).encode("utf-16-be")
            out.append("&" + base64.b64encode(raw).decode("ascii").rstrip("=").replace("/", ",")
                       + "-")
            pending.clear()

    for char in name:
        if 0x20 <= ord(char) <= 0x7E:
            flush()
            out.append("&-" if char == "&" else char)
        else:
            pending.append(char)
    flush()
    return "".join(out)


def _mailbox_arg(name: str) -> str:
    """A mailbox name as an IMAP quoted string: imaplib sends arguments as
    they are, so names with spaces or quotes must be quoted here."""
    encoded = imap_utf7(name)
    return '"' + encoded.replace("\\", "\\\\").replace('"', '\\"') + '"'


def _uid_set(uids: Iterable[int]) -> str:
    """``[1, 2, 3, 7]`` as ``1:3,7``."""
    ordered = sorted(set(uids))
    parts: list[str] = []
    start = prev = ordered[0]
    for uid in ordered[1:]:
        if uid == prev + 1:
            prev = uid
            continue
        parts.append(f"{start}:{prev}" if prev != start else str(start))
        start = prev = uid
    parts.append(f"{start}:{prev}" if prev != start else str(start))
    return ",".join(parts)


def _expand_uid_set(text: str) -> list[int]:
    """``1:3,7`` as ``[1, 2, 3, 7]`` (the APPENDUID of a MULTIAPPEND)."""
    uids: list[int] = []
    for part in text.split(","):
        low, _, high = part.partition(":")
        first, last = int(low), int(high or low)
        step = 1 if last >= first else -1
        uids.extend(range(first, last + step, step))
    return uids


_APPENDUID = re.compile(rb"\[APPENDUID (\d+) ([0-9:,]+)\]", re.IGNORECASE)
_UIDVALIDITY = re.compile(rb"UIDVALIDITY (\d+)", re.IGNORECASE)
_FETCH_UID = re.compile(rb"\bUID (\d+)", re.IGNORECASE)
_FETCH_FLAGS = re.compile(rb"\bFLAGS \(([^)]*)\)", re.IGNORECASE)
# IMAP wants CRLF line ends; bare LF or CR become CRLF on the way out.
_LINE_END = re.compile(rb"\r\n|\r|\n")


def _check(result: tuple[str, Sequence[Any]], what: str) -> list[Any]:
    """The data of an imaplib command that must succeed (imaplib returns NO
    as a value: raise it, with the server's text)."""
    typ, data = result
    if typ != "OK":
        detail = b" ".join(d for d in data if isinstance(d, bytes)).decode(errors="replace")
        raise RuntimeError(f"IMAP {what} failed: {typ} {detail}")
    return list(data)


# --------------------------------------------------------------- the server

# Instances still running, stopped at interpreter exit so a test run that
# ends without its fixtures' teardown (Ctrl-C mid-test) leaves no daemons.
_RUNNING: set[Dovecot] = set()
_RUNNING_LOCK = threading.Lock()


def _stop_all_at_exit() -> None:
    with _RUNNING_LOCK:
        servers = list(_RUNNING)
    for server in servers:
        with contextlib.suppress(Exception):
            server.stop()


atexit.register(_stop_all_at_exit)


class Dovecot:
    """One Dovecot instance: ``start()``, use, ``stop()`` (or ``running_dovecot``).

    ``port`` offers plain IMAP with STARTTLS (plaintext LOGIN is allowed
    without TLS: it is loopback only); ``tls_port`` is implicit TLS. The
    server certificate (SAN DNS:localhost, IP:127.0.0.1) is signed by a
    throwaway CA in ``ca_file``; ``ssl_context()`` trusts it.

    The helper methods (append, uids, flags, ...) each log in on a fresh
    connection of their own, so they never disturb the sessions of the code
    under test beyond what IMAP itself tells other sessions.
    """

    host: str
    port: int
    tls_port: int
    ca_file: str
    users: dict[str, str]

    def __init__(self, users: dict[str, str] | None = None, *,
                 oauth2_introspection_url: str | None = None) -> None:
        self.users = dict(DEFAULT_USERS if users is None else users)
        #: With a URL, OAUTHBEARER and XOAUTH2 are offered too, and a token is
        #: valid when that RFC 7662 endpoint says it is active (Dovecot's
        #: oauth2 passdb; nexarch_events.testing.oauth_server answers it).
        self.oauth2_introspection_url = oauth2_introspection_url
        for user, password in self.users.items():
            _check_credentials(user, password)
        self.host = HOST
        self.port = 0
        self.tls_port = 0
        self.ca_file = ""
        self._binary = ensure_dovecot()
        self._root: Path | None = None
        self._proc: subprocess.Popen[bytes] | None = None
        self._mail_uid, self._mail_gid = _mail_owner()

    # -- paths

    @property
    def root(self) -> Path:
        """The temporary folder holding everything of this instance."""
        if self._root is None:
            raise RuntimeError("this Dovecot was never started")
        return self._root

    @property
    def log_path(self) -> Path:
        return self.root / "dovecot.log"

    @property
    def config_path(self) -> Path:
        return self.root / "dovecot.conf"

    @property
    def pid(self) -> int | None:
        """The master's pid while it runs."""
        if self._proc is None or self._proc.poll() is not None:
            return None
        return self._proc.pid

    def maildir(self, user: str) -> Path:
        """The user's maildir (INBOX's cur/new/tmp live right in it)."""
        return self.root / "mail" / user / "Maildir"

    # -- life cycle

    def start(self) -> None:
        """Start the server and return once it greets on ``port``.

        After ``kill()`` (or ``stop(remove=False)``) this starts it again on
        the same ports with the same mail, like a server that restarts.
        """
        if self.pid is not None:
            raise RuntimeError("Dovecot is already running")
        if self._proc is not None:  # died on its own: clear what is left of it
            self.kill()
        fresh = self._root is None
        if fresh:
            self._prepare()
        try:
            for attempt in range(3):
                if fresh:
                    self.port, self.tls_port = _free_port(), _free_port()
                    while self.tls_port == self.port:
                        self.tls_port = _free_port()
                self._write_config()
                try:
                    self._launch()
                    return
                except _PortTaken as taken:
                    if not fresh or attempt == 2:
                        raise RuntimeError(
                            f"Dovecot could not bind port {self.port} or {self.tls_port}:\n"
                            f"{taken}") from None
        except BaseException:
            # A first start that failed leaves nothing behind (the error holds
            # the log's tail); a restart keeps the folder: its mail matters.
            if fresh:
                self.stop()
            raise

    def stop(self, *, remove: bool = True) -> None:
        """Stop the server (SIGTERM, then SIGKILL after a grace period) and,
        unless ``remove=False``, delete its folder with all mail. Idempotent."""
        if self._proc is not None:
            proc, self._proc = self._proc, None
            if proc.poll() is None:
                proc.terminate()
                try:
                    proc.wait(STOP_TIMEOUT)
                except subprocess.TimeoutExpired:
                    pass
            _kill_group(proc)
        with _RUNNING_LOCK:
            _RUNNING.discard(self)
        if remove and self._root is not None:
            shutil.rmtree(self._root, ignore_errors=True)
            self._root = None

    def kill(self) -> None:
        """SIGKILL the master and every process it started (one process
        group), like a crash: open connections drop at once, no goodbye.

        The folder stays, so ``start()`` brings the server back on the same
        ports with the same mail and UIDs.
        """
        if self._proc is None:
            return
        proc, self._proc = self._proc, None
        _kill_group(proc)
        with _RUNNING_LOCK:
            _RUNNING.discard(self)

    def __enter__(self) -> Dovecot:
        self.start()
        return self

    def __exit__(self, *exc_info: object) -> None:
        self.stop()

    # -- IMAP helpers

    def ssl_context(self) -> ssl.SSLContext:
        """A client context that trusts only this instance's throwaway CA."""
        return ssl.create_default_context(cafile=self.ca_file)

    @contextlib.contextmanager
    def session(self, user: str, *, tls: bool = False) -> Iterator[imaplib.IMAP4]:
        """A logged-in imaplib client (implicit TLS when ``tls``), logged out after."""
        password = self.users[user]
        imap: imaplib.IMAP4
        if tls:
            imap = imaplib.IMAP4_SSL(self.host, self.tls_port, ssl_context=self.ssl_context(),
                                     timeout=IMAP_TIMEOUT)
        else:
            imap = imaplib.IMAP4(self.host, self.port, timeout=IMAP_TIMEOUT)
        try:
            _check(imap.login(user, password), f"LOGIN {user}")
            yield imap
        finally:
            with contextlib.suppress(Exception):
                imap.logout()

    def create_mailbox(self, user: str, mailbox: str) -> None:
        """CREATE (and SUBSCRIBE) a mailbox; no error if it exists already."""
        with self.session(user) as imap:
            typ, data = imap.create(_mailbox_arg(mailbox))
            if typ != "OK" and not any(
                    isinstance(d, bytes) and b"ALREADYEXISTS" in d.upper() for d in data):
                _check((typ, data), f"CREATE {mailbox!r}")
            imap.subscribe(_mailbox_arg(mailbox))

    def delete_mailbox(self, user: str, mailbox: str) -> None:
        """DELETE a mailbox with its mail; no error if it does not exist.
        (Sessions that have it selected get ``NO`` on their next commands.)"""
        with self.session(user) as imap:
            imap.unsubscribe(_mailbox_arg(mailbox))
            typ, data = imap.delete(_mailbox_arg(mailbox))
            if typ != "OK" and not any(
                    isinstance(d, bytes) and b"NONEXISTENT" in d.upper() for d in data):
                _check((typ, data), f"DELETE {mailbox!r}")

    def append(self, user: str, mailbox: str, raw: bytes, *, flags: Iterable[str] = (),
               internaldate: datetime | None = None) -> int:
        """APPEND one message (no flags unless given) and return its UID,
        from the APPENDUID response code (UIDPLUS)."""
        flag_list = list(flags)
        flag_text = "(" + " ".join(flag_list) + ")" if flag_list else None
        date_text = imaplib.Time2Internaldate(internaldate) if internaldate else None
        with self.session(user) as imap:
            data = _check(imap.append(_mailbox_arg(mailbox), flag_text, date_text, raw),
                          f"APPEND to {mailbox!r}")
            found = _APPENDUID.search(b" ".join(d for d in data if isinstance(d, bytes)))
            if found is None:
                raise RuntimeError(f"APPEND to {mailbox!r} gave no APPENDUID: {data!r}")
            return int(found.group(2))

    def append_many(self, user: str, mailbox: str, raws: Iterable[bytes]) -> list[int]:
        """APPEND many messages fast and return their UIDs, in order.

        One connection, MULTIAPPEND (RFC 3502) with non-synchronizing
        literals (LITERAL+), in batches: a batch is one command, one round
        trip, and one APPENDUID with the UID range of the whole batch.
        20,000 messages of 5 KB take a few seconds.
        """
        uids: list[int] = []
        with self.session(user) as imap:
            # imaplib keeps the pre-login capabilities; MULTIAPPEND comes after.
            data = _check(imap.capability(), "CAPABILITY")
            caps = {c.upper() for d in data if isinstance(d, bytes) for c in d.decode().split()}
            if not {"MULTIAPPEND", "LITERAL+", "UIDPLUS"} <= caps:
                raise RuntimeError(f"Dovecot lacks MULTIAPPEND/LITERAL+/UIDPLUS: {caps}")
            batch: list[bytes] = []
            size = 0
            for raw in raws:
                batch.append(raw)
                size += len(raw)
                if len(batch) >= APPEND_BATCH_MESSAGES or size >= APPEND_BATCH_BYTES:
                    uids.extend(_multiappend(imap, mailbox, batch))
                    batch, size = [], 0
            if batch:
                uids.extend(_multiappend(imap, mailbox, batch))
        return uids

    def recreate_mailbox(self, user: str, mailbox: str, raws: Iterable[bytes] = ()) -> int:
        """Replace a mailbox by a new one (new UIDVALIDITY, UIDs from 1)
        holding ``raws``, and return the new UIDVALIDITY.

        Other mailboxes: DELETE then CREATE. INBOX cannot be deleted, so its
        messages are expunged and ``doveadm mailbox update --uid-validity``
        gives it a new UIDVALIDITY (its UIDs then go on from the old next
        UID rather than restarting at 1: RFC 3501 allows both). Sessions that
        have INBOX selected get ``* BYE`` (Dovecot: "IMAP session state is
        inconsistent, please relogin").
        """
        old = self.uidvalidity(user, mailbox) if self._exists(user, mailbox) else None
        if mailbox.upper() == "INBOX":
            self.expunge(user, mailbox, self.uids(user, mailbox))
            new_value = max((old or 0) + 1, int(time.time()))
            self._doveadm("mailbox", "update", "-u", user, "--uid-validity", str(new_value),
                          "INBOX")
        else:
            self.delete_mailbox(user, mailbox)
            self.create_mailbox(user, mailbox)
        self.append_many(user, mailbox, raws)
        new = self.uidvalidity(user, mailbox)
        if new == old:
            raise AssertionError(f"UIDVALIDITY of {mailbox!r} did not change: {new}")
        return new

    def uidvalidity(self, user: str, mailbox: str) -> int:
        with self.session(user) as imap:
            data = _check(imap.status(_mailbox_arg(mailbox), "(UIDVALIDITY)"),
                          f"STATUS {mailbox!r}")
            found = _UIDVALIDITY.search(b" ".join(d for d in data if isinstance(d, bytes)))
            if found is None:
                raise RuntimeError(f"STATUS {mailbox!r} gave no UIDVALIDITY: {data!r}")
            return int(found.group(1))

    def uids(self, user: str, mailbox: str) -> list[int]:
        """The UIDs in the mailbox, ascending (read-only: EXAMINE)."""
        with self.session(user) as imap:
            _check(imap.select(_mailbox_arg(mailbox), readonly=True), f"EXAMINE {mailbox!r}")
            data = _check(imap.uid("SEARCH", "ALL"), "UID SEARCH")
            return sorted(int(u) for d in data if isinstance(d, bytes) for u in d.split())

    def flags(self, user: str, mailbox: str) -> dict[int, frozenset[str]]:
        """UID -> stored flags (read-only: EXAMINE, so looking changes
        nothing; the per-session \\Recent is left out)."""
        result: dict[int, frozenset[str]] = {}
        with self.session(user) as imap:
            _check(imap.select(_mailbox_arg(mailbox), readonly=True), f"EXAMINE {mailbox!r}")
            data = _check(imap.uid("FETCH", "1:*", "(UID FLAGS)"), "UID FETCH FLAGS")
            for item in data:
                line = item[0] if isinstance(item, tuple) else item
                if not isinstance(line, bytes):
                    continue
                uid, found = _FETCH_UID.search(line), _FETCH_FLAGS.search(line)
                if uid is None or found is None:
                    continue
                names = found.group(1).decode().split()
                result[int(uid.group(1))] = frozenset(n for n in names if n != "\\Recent")
        return result

    def set_flags(self, user: str, mailbox: str, uids: Iterable[int], flags: Iterable[str],
                  *, add: bool = True) -> None:
        """Add (or with ``add=False`` remove) flags, as another client would."""
        wanted = list(uids)
        if not wanted:
            return
        with self.session(user) as imap:
            _check(imap.select(_mailbox_arg(mailbox)), f"SELECT {mailbox!r}")
            _check(imap.uid("STORE", _uid_set(wanted), "+FLAGS.SILENT" if add else
                            "-FLAGS.SILENT", "(" + " ".join(flags) + ")"), "UID STORE")

    def expunge(self, user: str, mailbox: str, uids: Iterable[int]) -> None:
        """Expunge exactly these UIDs (UID EXPUNGE: other \\Deleted mail stays)."""
        wanted = list(uids)
        if not wanted:
            return
        with self.session(user) as imap:
            _check(imap.select(_mailbox_arg(mailbox)), f"SELECT {mailbox!r}")
            uid_set = _uid_set(wanted)
            _check(imap.uid("STORE", uid_set, "+FLAGS.SILENT", "(\\Deleted)"), "UID STORE")
            _check(imap.uid("EXPUNGE", uid_set), "UID EXPUNGE")

    def set_password(self, user: str, password: str) -> None:
        """Add a user or change a password; Dovecot re-reads the passwd-file
        when it changes (no auth cache is configured), so it applies to the
        next login."""
        _check_credentials(user, password)
        self.users[user] = password
        self._write_users()

    def connection_count(self, user: str | None = None) -> int:
        """Logged-in IMAP sessions (of ``user``, or of all), from ``doveadm who``.

        Dovecot's anvil counts a session from its login to the exit of its
        imap process, a little after the client hangs up: poll, don't expect
        the count to fall at the instant a client closes its socket.
        Connections not logged in yet are not counted.
        """
        out = self._doveadm("who", "-1")  # one line per session, under a header
        count = 0
        for line in out.splitlines():
            fields = line.split()
            if not fields or fields[0] == "username":
                continue
            if user is None or fields[0] == user:
                count += 1
        return count

    # -- internals

    def _exists(self, user: str, mailbox: str) -> bool:
        with self.session(user) as imap:
            typ, data = imap.list('""', _mailbox_arg(mailbox))
            return typ == "OK" and any(isinstance(d, bytes) for d in data)

    def _doveadm(self, *args: str) -> str:
        command = [_doveadm(self._binary), "-c", str(self.config_path), *args]
        done = subprocess.run(command, capture_output=True, text=True, check=False, timeout=60)
        if done.returncode != 0:
            raise RuntimeError(f"`{' '.join(command)}` failed (exit {done.returncode}): "
                               f"{done.stdout}{done.stderr}")
        return done.stdout

    def _prepare(self) -> None:
        """The folder, certificates, users and homes (not the config: its
        ports are chosen per start attempt)."""
        root = Path(tempfile.mkdtemp(prefix="nexarch-dovecot-"))
        self._root = root
        try:
            # Traversable (not listable) by the unprivileged Dovecot users.
            root.chmod(0o711)
            # base_dir must be world-readable (login processes find their
            # sockets there); Dovecot would chmod it and warn otherwise.
            (root / "run").mkdir(mode=0o755)
            (root / "state").mkdir(mode=0o711)
            (root / "mail").mkdir(mode=0o711)
            self.ca_file = _make_certificates(root / "tls")
            self._write_users()
        except BaseException:
            shutil.rmtree(root, ignore_errors=True)
            self._root = None
            raise

    def _write_users(self) -> None:
        """The passwd-file (auth reads it as the unprivileged dovecot user:
        mode 0644), and a home per user owned by the mail uid."""
        lines = []
        for user, password in self.users.items():
            home = self.root / "mail" / user
            if not home.exists():
                home.mkdir(mode=0o700)
                if os.geteuid() == 0:
                    os.chown(home, self._mail_uid, self._mail_gid)
            lines.append(f"{user}:{{PLAIN}}{password}:{self._mail_uid}:{self._mail_gid}"
                         f"::{home}::\n")
        path = self.root / "users"
        staged = path.with_suffix(".new")
        staged.write_text("".join(lines))
        staged.chmod(0o644)
        staged.replace(path)  # atomic: auth never reads half a file

    def _write_config(self) -> None:
        root = self.root
        unprivileged = ""
        if os.geteuid() != 0:
            # Unprivileged: every Dovecot process runs as us, without chroots.
            me = pwd.getpwuid(os.geteuid()).pw_name
            group = grp.getgrgid(os.getegid()).gr_name
            unprivileged = (f"default_internal_user = {me}\n"
                            f"default_internal_group = {group}\n"
                            f"default_login_user = {me}\n")
        dh = Path("/usr/share/dovecot/dh.pem")
        # Only non-ECDHE ciphers need DH parameters; our key is EC, so they
        # are optional, but without them Dovecot warns on every handshake.
        ssl_dh = f"ssl_dh = <{dh}\n" if dh.is_file() else ""
        no_chroot = "  chroot =\n" if unprivileged else ""
        oauth_mechanisms = oauth_passdb = ""
        if self.oauth2_introspection_url:
            oauth_mechanisms = " xoauth2 oauthbearer"
            (root / "oauth2.conf.ext").write_text(
                "introspection_mode = post\n"
                f"introspection_url = {self.oauth2_introspection_url}\n"
                "force_introspection = yes\n"
                "username_attribute = username\n"
                "active_attribute = active\n"
                "active_value = true\n")
            oauth_passdb = ("\npassdb {\n  driver = oauth2\n  mechanisms = xoauth2 oauthbearer\n"
                            f"  args = {root}/oauth2.conf.ext\n}}")
        self.config_path.write_text(f"""\
# Written by tests/support/dovecot.py: a throwaway instance for tests.
# Nothing from /etc/dovecot is included.
protocols = imap
listen = {HOST}
base_dir = {root}/run
state_dir = {root}/state
instance_name = {root.name}
log_path = {root}/dovecot.log
auth_verbose = yes
# Tests of wrong passwords stay quick: no 2 s delay before a failure reply
# (about 0.5 s remain), and no auth penalty (see service anvil below).
auth_failure_delay = 0 secs
verbose_proctitle = yes
shutdown_clients = yes
{unprivileged}
# Mail is never accessed as root; this is the uid of every user's mail.
first_valid_uid = {self._mail_uid}

ssl = yes
ssl_cert = <{root}/tls/server.crt
ssl_key = <{root}/tls/server.key
{ssl_dh}
# Loopback only: tests log in in plaintext too (STARTTLS is offered).
disable_plaintext_auth = no
auth_mechanisms = plain login{oauth_mechanisms}
passdb {{
  driver = passwd-file
  args = scheme=PLAIN username_format=%u {root}/users
  mechanisms = plain login
}}{oauth_passdb}
userdb {{
  driver = passwd-file
  args = username_format=%u {root}/users
}}

# LAYOUT=fs with "/" as separator: folder names may hold dots
# ("lists.example.org"), as real archives' folders do.
mail_location = maildir:~/Maildir:LAYOUT=fs
namespace inbox {{
  inbox = yes
  separator = /
}}
# Test data: no fsync (a killed Dovecot loses nothing the kernel has).
mail_fsync = never
# IDLE hears of new mail through inotify; when the mail user's inotify
# instances run out (fs.inotify.max_user_instances, 128, shared by every
# Dovecot of that user on the machine: parallel suites), Dovecot warns
# "Inotify instance limit ... exceeded, disabling" and checks only every
# mailbox_idle_check_interval, 30 s by default: tests that wait for an IDLE
# push then time out. Check every second instead.
mailbox_idle_check_interval = 1 secs

# Room for tests that open many connections (service_count = 1 logins).
default_process_limit = 500
default_client_limit = 2000
protocol imap {{
  mail_max_userip_connections = 200
}}
# Without this socket anvil keeps no auth penalties: otherwise, after a failed
# login, the next logins from 127.0.0.1 would wait 2, 4, 8, up to 15 s.
service anvil {{
{no_chroot}  unix_listener anvil-auth-penalty {{
    mode = 0
  }}
}}
service imap-login {{
{no_chroot}  inet_listener imap {{
    address = {HOST}
    port = {self.port}
  }}
  inet_listener imaps {{
    address = {HOST}
    port = {self.tls_port}
    ssl = yes
  }}
}}
""")

    def _launch(self) -> None:
        """Run ``dovecot -F`` (foreground: the master is our child, so we
        know when it dies) in a process group of its own, which every
        Dovecot process inherits, so stop/kill reach them all."""
        stderr_path = self.root / "stderr.log"
        # Only what this launch logs tells why it failed (not earlier attempts).
        offsets = (_size(self.log_path), _size(stderr_path))
        with stderr_path.open("ab") as out:
            proc = subprocess.Popen(
                [self._binary, "-F", "-c", str(self.config_path)],
                stdin=subprocess.DEVNULL, stdout=out, stderr=subprocess.STDOUT,
                start_new_session=True)
        self._proc = proc
        with _RUNNING_LOCK:
            _RUNNING.add(self)
        deadline = time.monotonic() + START_TIMEOUT
        while True:
            if proc.poll() is not None:
                self._proc = None
                with _RUNNING_LOCK:
                    _RUNNING.discard(self)
                _kill_group(proc)
                logs = self._logs(*offsets)
                if "Address already in use" in logs:
                    raise _PortTaken(logs)
                raise RuntimeError(f"Dovecot exited with code {proc.returncode} while "
                                   f"starting:\n{logs}")
            if _greets(self.host, self.port):
                return
            if time.monotonic() > deadline:
                self.kill()
                raise RuntimeError(f"Dovecot did not greet on {self.host}:{self.port} within "
                                   f"{START_TIMEOUT:.0f} s:\n{self._logs(*offsets)}")
            time.sleep(0.05)

    def _logs(self, log_from: int = 0, stderr_from: int = 0) -> str:
        stderr_path = self.root / "stderr.log"
        parts = [f"--- {self.log_path} (tail) ---", _tail(self.log_path, log_from),
                 f"--- {stderr_path} (tail) ---", _tail(stderr_path, stderr_from)]
        return "\n".join(parts)

    def __repr__(self) -> str:
        state = "running" if self.pid else "stopped"
        return f"<Dovecot {state} imap={self.host}:{self.port} imaps={self.tls_port}>"


class _PortTaken(Exception):
    """Dovecot lost the race for a port picked by _free_port."""


def _check_credentials(user: str, password: str) -> None:
    """The passwd-file is ``:``-separated, one user per line."""
    for value, what in ((user, "user name"), (password, "password")):
        if not value or any(c in value for c in ":\r\n\0"):
            raise ValueError(f"{what} {value!r} is empty or holds ':' or a line break")
    if not re.fullmatch(r"[A-Za-z0-9._@+-]+", user):
        raise ValueError(f"user name {user!r}: use letters, digits and ._@+- only")


def _mail_owner() -> tuple[int, int]:
    """The uid/gid mail is stored under: ``nobody`` as root (Dovecot
    refuses to access mail as root), else ourselves."""
    if os.geteuid() != 0:
        return os.geteuid(), os.getegid()
    try:
        entry = pwd.getpwnam("nobody")
    except KeyError:
        return 65534, 65534
    return entry.pw_uid, entry.pw_gid


def _make_certificates(folder: Path) -> str:
    """A throwaway CA and a server certificate it signed (EC P-256, so
    instant), made with the openssl CLI; returns the CA's PEM path.

    The extensions satisfy strict verification (Python 3.13's default
    VERIFY_X509_STRICT): a critical CA basicConstraints, key usages, and
    subject/authority key identifiers.
    """
    openssl = _openssl()
    folder.mkdir(mode=0o700)
    (folder / "server.ext").write_text(
        "basicConstraints = critical, CA:FALSE\n"
        "keyUsage = critical, digitalSignature, keyEncipherment\n"
        "extendedKeyUsage = serverAuth\n"
        "subjectAltName = DNS:localhost, IP:127.0.0.1\n"
        "subjectKeyIdentifier = hash\n"
        "authorityKeyIdentifier = keyid, issuer\n")
    curve = ["-newkey", "ec", "-pkeyopt", "ec_paramgen_curve:prime256v1", "-nodes"]
    commands = [
        [openssl, "req", "-x509", *curve, "-keyout", "ca.key", "-out", "ca.crt",
         "-days", "30", "-subj", "/CN=nexarch-events test CA",
         "-addext", "basicConstraints = critical, CA:TRUE",
         "-addext", "keyUsage = critical, keyCertSign, cRLSign",
         "-addext", "subjectKeyIdentifier = hash"],
        [openssl, "req", "-new", *curve, "-keyout", "server.key", "-out", "server.csr",
         "-subj", "/CN=localhost"],
        [openssl, "x509", "-req", "-in", "server.csr", "-CA", "ca.crt", "-CAkey", "ca.key",
         "-set_serial", str(int.from_bytes(os.urandom(8), "big")), "-days", "30",
         "-extfile", "server.ext", "-out", "server.crt"],
    ]
    for command in commands:
        done = subprocess.run(command, cwd=folder, capture_output=True, text=True, check=False)
        if done.returncode != 0:
            raise RuntimeError(f"openssl failed making the test certificates "
                               f"(`{' '.join(command)}`):\n{done.stdout}{done.stderr}")
    # The CA file is for clients (maybe another user's tests): world-readable.
    (folder / "ca.crt").chmod(0o644)
    folder.chmod(0o711)
    return str(folder / "ca.crt")


def _greets(host: str, port: int) -> bool:
    """Whether the port accepts and the login process greets with ``* OK``."""
    try:
        with socket.create_connection((host, port), timeout=2) as sock:
            sock.settimeout(2)
            return sock.recv(256).startswith(b"* OK")
    except OSError:
        return False


def _group_alive(pgid: int) -> bool:
    """Whether a live (non-zombie) process is left in the group. Orphaned
    Dovecot children may linger as zombies where pid 1 reaps nothing; those
    hold no ports and run nothing, so they do not count. (Linux only:
    elsewhere this cannot tell and says no.)"""
    if not os.path.isdir("/proc"):
        return False
    for entry in os.scandir("/proc"):
        if not entry.name.isdigit():
            continue
        try:
            stat = Path(entry.path, "stat").read_text()
        except OSError:
            continue
        # pid (comm) state ppid pgrp ...; comm may hold spaces and parens.
        fields = stat[stat.rfind(")") + 2:].split()
        if len(fields) >= 3 and int(fields[2]) == pgid and fields[0] not in ("Z", "X"):
            return True
    return False


def _kill_group(proc: subprocess.Popen[bytes]) -> None:
    """SIGKILL the master's process group, reap the master, and wait (a
    bounded while) until no process of the group runs any more."""
    with contextlib.suppress(ProcessLookupError, PermissionError):
        os.killpg(proc.pid, signal.SIGKILL)
    with contextlib.suppress(subprocess.TimeoutExpired):
        proc.wait(STOP_TIMEOUT)
    deadline = time.monotonic() + STOP_TIMEOUT
    while _group_alive(proc.pid) and time.monotonic() < deadline:
        time.sleep(0.02)


def _multiappend(imap: imaplib.IMAP4, mailbox: str, raws: list[bytes]) -> list[int]:
    """One MULTIAPPEND command with LITERAL+ literals, sent in one go and
    answered by one tagged response: imaplib cannot send several literals
    in a command, so this uses its public send()/readline() and a tag of
    its own (imaplib's tags are <prefix><number>, never ``NXMA``)."""
    tag = b"NXMA%d" % time.monotonic_ns()
    chunks = [tag, b" APPEND ", _mailbox_arg(mailbox).encode("ascii")]
    for raw in raws:
        if not raw:
            raise ValueError("IMAP cannot APPEND an empty message")
        literal = _LINE_END.sub(b"\r\n", raw)  # as imaplib's append() does
        chunks += [b" {%d+}\r\n" % len(literal), literal]
    chunks.append(b"\r\n")
    imap.send(b"".join(chunks))
    while True:
        line = imap.readline()
        if not line:
            raise RuntimeError("the server closed the connection during MULTIAPPEND")
        if line.startswith(tag + b" "):
            break
    status = line[len(tag) + 1:].split(b" ", 1)[0]
    if status.upper() != b"OK":
        raise RuntimeError(f"MULTIAPPEND to {mailbox!r} failed: {line.decode(errors='replace')}")
    found = _APPENDUID.search(line)
    if found is None:
        raise RuntimeError(f"MULTIAPPEND to {mailbox!r} gave no APPENDUID: {line!r}")
    uids = _expand_uid_set(found.group(2).decode())
    if len(uids) != len(raws):
        raise RuntimeError(f"MULTIAPPEND of {len(raws)} messages gave {len(uids)} UIDs: {line!r}")
    return uids


@contextlib.contextmanager
def running_dovecot(users: dict[str, str] | None = None) -> Iterator[Dovecot]:
    """A started Dovecot, stopped (folder and all removed) on exit."""
    server = Dovecot(users)
    try:
        server.start()
        yield server
    finally:
        server.stop()
