"""The Dovecot test server helper (tests/support/dovecot.py) itself: the IMAP
importer's tests rely on what it promises (UIDs, UIDVALIDITY changes, TLS,
no \\Seen set behind their back, speed of bulk appends), so check it here.

Plain sync tests: the helper is synchronous and needs no trio.
"""

from __future__ import annotations

import imaplib
import socket
import ssl
import subprocess
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from tests.support import apt
from tests.support import dovecot as dovecot_module
from tests.support.dovecot import Dovecot, running_dovecot


def message(n: int, size: int = 5000) -> bytes:
    """A plain message of about ``size`` bytes whose subject names ``n``."""
    head = (f"From: Sender {n} <sender{n}@example.org>\r\n"
            f"To: alice@example.org\r\n"
            f"Subject: message {n}\r\n"
            f"Message-ID: <msg{n}@example.org>\r\n"
            f"Date: Mon, 01 Jan 2024 00:00:00 +0000\r\n\r\n")
    line = f"body of message {n} " * 4 + "\r\n"
    body = line * max(1, (size - len(head)) // len(line))
    return (head + body).encode("ascii")


@pytest.fixture(scope="module")
def server() -> Iterator[Dovecot]:
    with running_dovecot() as started:
        yield started


def test_append_gives_uids_from_one(server: Dovecot) -> None:
    server.create_mailbox("alice", "Basic")
    uids = [server.append("alice", "Basic", message(n)) for n in range(3)]
    assert uids == [1, 2, 3]
    assert server.uids("alice", "Basic") == [1, 2, 3]
    assert server.flags("alice", "Basic") == {1: frozenset(), 2: frozenset(), 3: frozenset()}
    # bob's mail is his own.
    assert server.uids("bob", "INBOX") == []


def test_recreate_gives_new_uidvalidity(server: Dovecot) -> None:
    server.create_mailbox("alice", "Recreated")
    server.append_many("alice", "Recreated", [message(n) for n in range(5)])
    before = server.uidvalidity("alice", "Recreated")
    after = server.recreate_mailbox("alice", "Recreated", [message(n) for n in range(2)])
    assert after != before
    assert server.uidvalidity("alice", "Recreated") == after
    assert server.uids("alice", "Recreated") == [1, 2]


def test_recreate_inbox_gives_new_uidvalidity(server: Dovecot) -> None:
    server.append("bob", "INBOX", message(1))
    before = server.uidvalidity("bob", "INBOX")
    after = server.recreate_mailbox("bob", "INBOX", [message(2), message(3)])
    assert after != before
    assert len(server.uids("bob", "INBOX")) == 2


def test_append_many_is_fast_and_sets_no_flags(server: Dovecot) -> None:
    raws = [message(n) for n in range(2000)]
    server.create_mailbox("alice", "Bulk")
    started = time.monotonic()
    uids = server.append_many("alice", "Bulk", raws)
    elapsed = time.monotonic() - started
    assert uids == list(range(1, 2001))
    assert server.uids("alice", "Bulk") == uids
    flags = server.flags("alice", "Bulk")
    assert len(flags) == 2000
    assert not any("\\Seen" in f for f in flags.values())
    assert elapsed < 20, f"append_many of 2,000 messages took {elapsed:.1f} s"


def test_flags_and_expunge(server: Dovecot) -> None:
    server.create_mailbox("alice", "Flags")
    uids = server.append_many("alice", "Flags", [message(n) for n in range(4)])
    server.set_flags("alice", "Flags", uids[:1], ["\\Seen"])
    server.append("alice", "Flags", message(9), flags=["\\Flagged"])
    flags = server.flags("alice", "Flags")
    assert flags[uids[0]] == {"\\Seen"}
    assert flags[5] == {"\\Flagged"}
    server.expunge("alice", "Flags", [uids[1], uids[3]])
    assert server.uids("alice", "Flags") == [1, 3, 5]


def test_awkward_mailbox_names(server: Dovecot) -> None:
    for name in ["lists.example.org", "Entwürfe & Co", 'Quote "this"', "Parent/Child"]:
        server.create_mailbox("alice", name)
        assert server.append("alice", name, message(1)) == 1
        assert server.uids("alice", name) == [1]
    server.delete_mailbox("alice", "lists.example.org")
    with server.session("alice") as imap:
        typ, data = imap.list('""', '"lists.example.org"')
    assert typ == "OK" and data == [None]


def test_implicit_tls_verifies_against_the_ca(server: Dovecot) -> None:
    context = ssl.create_default_context(cafile=server.ca_file)
    for host in (server.host, "localhost"):
        imap = imaplib.IMAP4_SSL(host, server.tls_port, ssl_context=context, timeout=10)
        try:
            assert imap.login("alice", server.users["alice"])[0] == "OK"
            assert isinstance(imap.sock, ssl.SSLSocket)
            assert imap.sock.version() in ("TLSv1.2", "TLSv1.3")
        finally:
            imap.logout()
    # The system's trust store does not know the throwaway CA.
    with pytest.raises(ssl.SSLCertVerificationError):
        imaplib.IMAP4_SSL(server.host, server.tls_port, ssl_context=ssl.create_default_context(),
                          timeout=10)


def test_starttls(server: Dovecot) -> None:
    imap = imaplib.IMAP4(server.host, server.port, timeout=10)
    try:
        assert "STARTTLS" in imap.capabilities
        assert imap.starttls(server.ssl_context())[0] == "OK"
        assert imap.login("bob", server.users["bob"])[0] == "OK"
    finally:
        imap.logout()


def test_plaintext_login_and_wrong_password(server: Dovecot) -> None:
    imap = imaplib.IMAP4(server.host, server.port, timeout=10)
    try:
        with pytest.raises(imaplib.IMAP4.error):
            imap.login("alice", "wrong")
        assert imap.login("alice", server.users["alice"])[0] == "OK"
    finally:
        imap.logout()


def test_connection_count(server: Dovecot) -> None:
    baseline = server.connection_count()
    with server.session("alice"), server.session("alice"), server.session("bob"):
        assert server.connection_count() == baseline + 3
        assert server.connection_count("bob") >= 1
    deadline = time.monotonic() + 10
    while server.connection_count() != baseline and time.monotonic() < deadline:
        time.sleep(0.05)
    assert server.connection_count() == baseline


def _refused(port: int) -> bool:
    try:
        socket.create_connection(("127.0.0.1", port), timeout=2).close()
    except ConnectionRefusedError:
        return True
    return False


def test_kill_restart_and_stop_leave_nothing_behind() -> None:
    server = Dovecot({"carol": "carol-secret-3"})
    server.start()
    try:
        assert server.append("carol", "INBOX", message(1)) == 1
        validity = server.uidvalidity("carol", "INBOX")
        pgid = server.pid
        assert pgid is not None
        held = imaplib.IMAP4(server.host, server.port, timeout=10)
        held.login("carol", "carol-secret-3")
        server.kill()
        assert not dovecot_module._group_alive(pgid)
        assert _refused(server.port) and _refused(server.tls_port)
        with pytest.raises((imaplib.IMAP4.abort, OSError)):
            held.noop()
        server.start()  # same ports, same mail
        assert server.uids("carol", "INBOX") == [1]
        assert server.uidvalidity("carol", "INBOX") == validity
        pgid = server.pid
        assert pgid is not None
        root = server.root
    finally:
        server.stop()
    assert not dovecot_module._group_alive(pgid)
    assert not Path(root).exists()
    assert _refused(server.port)


def test_ensure_dovecot_says_what_to_install(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(apt, "which", lambda name: None)
    monkeypatch.setattr("os.geteuid", lambda: 1000)
    with pytest.raises(RuntimeError, match="apt-get install dovecot-imapd"):
        dovecot_module.ensure_dovecot()


def test_idle_checks_the_mailbox_every_second_without_inotify(server: Dovecot) -> None:
    """IDLE pushes come from inotify; the mail user's inotify instances are
    shared by every Dovecot on the machine (fs.inotify.max_user_instances,
    128), and when parallel suites use them up Dovecot falls back to checking
    every mailbox_idle_check_interval. At Dovecot's default of 30 s, a new
    message reached an IDLE session after 29.7 s (measured with inotify made
    to fail), so tests/acceptance/test_run.py, which allows 30 s, failed when
    its importer was in IDLE before the message came. The fixture's config
    makes the fallback a second (0.7 s measured the same way)."""
    doveconf = dovecot_module._which("doveconf")
    assert doveconf is not None
    shown = subprocess.run([doveconf, "-c", str(server.config_path), "-h",
                            "mailbox_idle_check_interval"],
                           capture_output=True, text=True, check=True).stdout.strip()
    assert shown == "1 secs", shown
