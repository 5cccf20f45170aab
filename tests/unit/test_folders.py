"""Account folders: LIST replies read as servers send them, names decoded
from modified UTF-7, and the rules that pick what is archived."""

from __future__ import annotations

import pytest
from hypothesis import given
from hypothesis import strategies as st

from nexarch_events.errors import ImapProtocolError
from nexarch_events.importer.folders import (
    Folder,
    FolderRules,
    decode_mailbox_name,
    parse_list,
    select_folders,
)
from nexarch_events.importer.protocol import mailbox_argument


@pytest.mark.parametrize(("wire", "name"), [
    ("INBOX", "INBOX"), ("Entw&APw-rfe", "Entwürfe"), ("&ZeVnLIqe-", "日本語"),
    ("Tom &- Jerry", "Tom & Jerry"), ("&AMQ-rger/&APY-l", "Ärger/öl"),
    ("~peter/mail/&U,BTFw-/&ZeVnLIqe-", "~peter/mail/台北/日本語"),  # RFC 3501's example
])
def test_modified_utf7_names_are_decoded(wire: str, name: str) -> None:
    assert decode_mailbox_name(wire) == name


@pytest.mark.parametrize("wire", ["&Jjo", "&Jjo!-", "Grüße", "&AGE-&", "a\x00b"])
def test_malformed_names_are_errors_not_guesses(wire: str) -> None:
    with pytest.raises(ImapProtocolError):
        decode_mailbox_name(wire)


@given(st.text(alphabet=st.characters(blacklist_categories=("Cs", "Cc")), min_size=1))
def test_decoding_inverts_the_encoder(name: str) -> None:
    wire = mailbox_argument(name)[1:-1].replace('\\"', '"').replace("\\\\", "\\")
    assert decode_mailbox_name(wire) == name


GMAIL = [
    b'LIST (\\HasNoChildren) "/" "INBOX"',
    b'LIST (\\HasChildren \\Noselect) "/" "[Gmail]"',
    b'LIST (\\All \\HasNoChildren) "/" "[Gmail]/All Mail"',
    b'LIST (\\Drafts \\HasNoChildren) "/" "[Gmail]/Drafts"',
    b'LIST (\\HasNoChildren \\Sent) "/" "[Gmail]/Sent Mail"',
    b'LIST (\\HasNoChildren \\Junk) "/" "[Gmail]/Spam"',
    b'LIST (\\HasNoChildren \\Trash) "/" "[Gmail]/Trash"',
    b'LIST (\\HasNoChildren) "/" "Receipts"',
]


def test_gmail_archives_all_mail_only() -> None:
    folders = parse_list(GMAIL)
    assert [f.name for f in folders][:3] == ["INBOX", "[Gmail]", "[Gmail]/All Mail"]
    assert [f.name for f in select_folders(folders)] == ["[Gmail]/All Mail"]
    every_label = select_folders(folders, FolderRules(all_mail_only=False))
    assert [f.name for f in every_label] == ["INBOX", "[Gmail]/All Mail", "[Gmail]/Sent Mail",
                                            "Receipts"]


def test_names_as_atoms_literals_and_with_extended_data() -> None:
    parts: list[bytes | bytearray] = [
        b"LIST (\\Noinferiors) NIL INBOX",
        b'LIST () "." {13}', bytearray(b'INBOX.a "b" \\'), b"",
        b'LIST (\\Subscribed) "/" "Entw&APw-rfe" ("CHILDINFO" ("SUBSCRIBED"))',
        b"3 EXISTS",
        b'LIST (\\hasnochildren \\SENT) "\\\\" "Sent"',
    ]
    folders = parse_list(parts)
    assert folders == [
        Folder("INBOX", "INBOX", None, frozenset({"\\Noinferiors"})),
        Folder('INBOX.a "b" \\', 'INBOX.a "b" \\', ".", frozenset()),
        Folder("Entw&APw-rfe", "Entwürfe", "/", frozenset({"\\Subscribed"})),
        Folder("Sent", "Sent", "\\", frozenset({"\\HasNoChildren", "\\Sent"})),
    ]


def test_lines_without_the_list_keyword_as_the_boundary_hands_them_over() -> None:
    parts: list[bytes | bytearray] = [b'(\\HasNoChildren) "/" Sent',
                                      b'(\\Noselect \\HasChildren) "/" Projekte',
                                      b'(\\HasNoChildren) "/" Projekte/&ANw-bersicht']
    assert [(f.name, f.wire_name) for f in parse_list(parts)] == [
        ("Sent", "Sent"), ("Projekte", "Projekte"),
        ("Projekte/Übersicht", "Projekte/&ANw-bersicht")]


def test_a_literal_that_never_came_is_an_error() -> None:
    with pytest.raises(ImapProtocolError):
        parse_list([b'LIST () "/" {5}'])


def folder(name: str, *flags: str, delimiter: str = "/") -> Folder:
    return Folder(name, name, delimiter, frozenset(flags))


def test_without_special_use_the_usual_names_are_excluded() -> None:
    dovecot = [folder("INBOX", delimiter="."), folder("INBOX.Trash", delimiter="."),
               folder("INBOX.Junk", delimiter="."), folder("INBOX.Projects", delimiter="."),
               folder("INBOX.Trash.Old", delimiter="."), folder("Entwürfe", delimiter="."),
               folder("Spamfilter-Reports", delimiter=".")]
    assert [f.name for f in select_folders(dovecot)] == [
        "INBOX", "INBOX.Projects", "Spamfilter-Reports"]


def test_special_use_exclusions_and_include_patterns() -> None:
    folders = [folder("INBOX"), folder("Deleted", "\\Trash"), folder("Archive", "\\Archive"),
               folder("Legal"), folder("Legal/Trash"), folder("Shared", "\\Noselect")]
    rules = FolderRules(excluded_patterns=("Legal*",), include_patterns=("Legal", "Shared"))
    assert [f.name for f in select_folders(folders, rules)] == ["INBOX", "Archive", "Legal"]
    keep_trash = FolderRules(excluded_uses=frozenset())
    assert "Deleted" in [f.name for f in select_folders(folders, keep_trash)]


def test_folder_state_names_the_worst_first() -> None:
    from datetime import UTC, datetime

    from nexarch_events.importer.accounts import folder_state

    now = datetime.now(UTC)
    ok = {"enabled": True, "last_success_at": now, "folder_gone_at": None,
          "last_error": None, "warning": None, "failures": 0, "idle_status": None}
    assert folder_state(ok) == "ok"
    assert folder_state({**ok, "last_success_at": None}) == "not synced yet"
    assert folder_state({**ok, "enabled": False}) == "paused"
    assert folder_state({**ok, "idle_status": "idle unavailable: x"}) == "warning"
    assert folder_state({**ok, "failures": 2}) == "warning"
    assert folder_state({**ok, "warning": "w", "last_error": "e"}) == "error"
    assert folder_state({**ok, "last_error": "e", "folder_gone_at": now}) == "gone"


def test_a_name_too_large_to_hold_is_an_error() -> None:
    from nexarch_events.aio.imap import DiscardedLiteral

    parts = [b'LIST () "/" {200000000}', DiscardedLiteral(200_000_000, 1000), b""]
    with pytest.raises(ImapProtocolError, match="names a folder with 200000000 bytes"):
        parse_list(parts)


def test_a_name_that_is_not_modified_utf7_is_left_out_when_asked() -> None:
    parts = [b'LIST () "/" INBOX', b'LIST () "/" "Tom & Jerry"', b'LIST () "/" Projects']
    unreadable: list[str] = []
    assert [f.name for f in parse_list(parts, unreadable=unreadable)] == ["INBOX", "Projects"]
    assert len(unreadable) == 1 and "shift never ends" in unreadable[0]
    with pytest.raises(ImapProtocolError, match="Tom & Jerry"):
        parse_list(parts)
