"""Parsing IMAP replies without trusting them (nexarch_events/importer/protocol.py)."""

from __future__ import annotations

import pytest
from hypothesis import given
from hypothesis import strategies as st

from nexarch_events.errors import ImapProtocolError
from nexarch_events.importer.protocol import (
    mailbox_argument,
    parse_examine,
    parse_fetch,
    parse_search,
    uid_set,
)


def test_examine_reads_uidvalidity_uidnext_exists() -> None:
    status = parse_examine([b"FLAGS (\\Seen)", b"OK [UIDVALIDITY 1700000000] UIDs valid",
                            b"12 EXISTS", b"OK [UIDNEXT 13] Predicted next UID"])
    assert (status.uidvalidity, status.uidnext, status.exists) == (1700000000, 13, 12)


@pytest.mark.parametrize("line", [b"OK [UIDVALIDITY 0] bad", b"OK [UIDVALIDITY 4294967296] x"])
def test_examine_refuses_uidvalidity_outside_rfc_range(line: bytes) -> None:
    status = parse_examine([line, b"3 EXISTS"])
    assert status.uidvalidity is None and status.uidvalidity_raw is not None


def test_examine_without_uidvalidity() -> None:
    status = parse_examine([b"3 EXISTS"])
    assert status.uidvalidity is None and status.uidvalidity_raw is None


def test_search_with_and_without_keyword() -> None:
    assert list(parse_search([b"1 5 743024218"])) == [1, 5, 743024218]
    assert list(parse_search([b"SEARCH 4000000000"])) == [4000000000]
    assert list(parse_search([b""])) == []


def test_search_rejects_garbage() -> None:
    with pytest.raises(ImapProtocolError, match="not a UID"):
        parse_search([b"1 2 x3"])


def test_fetch_with_literal_body_and_uid_after_it() -> None:
    body = b"Subject: hi\r\n\r\n) ( BODY[] {99}\r\n"
    items = parse_fetch([b"1 FETCH (RFC822.SIZE 33 BODY[] {33}", bytearray(body),
                         b" UID 7)", b"2 FETCH (UID 9 RFC822.SIZE 5 BODY[] NIL)"])
    assert [(i.seq, i.uid, i.size, i.body) for i in items] == [
        (1, 7, 33, body), (2, 9, 5, None)]


def test_fetch_empty_quoted_body_and_missing_literal() -> None:
    assert parse_fetch([b'3 FETCH (UID 4 BODY[] "")'])[0].body == b""
    with pytest.raises(ImapProtocolError, match="never came"):
        parse_fetch([b"1 FETCH (UID 1 BODY[] {10}"])


def test_fetch_with_a_body_too_large_to_hold() -> None:
    """The framing skipped the literal (aio.imap.DiscardedLiteral): the item
    has no body and says so; one that the server lied about (RFC822.SIZE
    10) is no different."""
    from nexarch_events.aio.imap import DiscardedLiteral
    from nexarch_events.importer.sync import _problem

    items = parse_fetch([b"1 FETCH (UID 7 RFC822.SIZE 10 BODY[] {999999}",
                         DiscardedLiteral(999_999, 1000), b")",
                         b"2 FETCH (UID 8 RFC822.SIZE 3 BODY[] {3}", bytearray(b"abc"), b")"])
    too_large, fine = items
    assert (too_large.uid, too_large.body, fine.body, fine.discarded) == (7, None, b"abc", None)
    assert too_large.discarded is not None and too_large.discarded.size == 999_999
    assert _problem(too_large) == ("message is 999999 bytes; the archive's limit is 1000 "
                                   "(read and discarded, RFC822.SIZE 10)")
    assert _problem(fine) is None


def test_fetch_ignores_other_untagged_data() -> None:
    items = parse_fetch([b"4 EXPUNGE", b"1 FETCH (UID 2 RFC822.SIZE 10)"])
    assert [(i.uid, i.size, i.body) for i in items] == [(2, 10, None)]


@given(st.lists(st.integers(1, 2**32 - 1), min_size=1, max_size=60, unique=True))
def test_uid_set_round_trips(uids: list[int]) -> None:
    uids.sort()
    expanded: list[int] = []
    for part in uid_set(uids).split(","):
        lo, _, hi = part.partition(":")
        expanded.extend(range(int(lo), int(hi or lo) + 1))
    assert expanded == uids


def test_uid_set_refuses_unsorted() -> None:
    with pytest.raises(ValueError):
        uid_set([3, 2])


def test_mailbox_argument_modified_utf7() -> None:
    assert mailbox_argument("INBOX") == '"INBOX"'
    assert mailbox_argument("Entwürfe") == '"Entw&APw-rfe"'
    assert mailbox_argument("A&B") == '"A&-B"'
    assert mailbox_argument('say "hi"') == '"say \\"hi\\""'
    with pytest.raises(ImapProtocolError):
        mailbox_argument("bad\r\nname")


def test_the_framing_holds_every_message_the_archive_takes() -> None:
    from nexarch_events.aio.imap import MAX_LITERAL_BYTES
    from nexarch_events.mail.archive import MAX_MESSAGE_BYTES

    assert MAX_LITERAL_BYTES == MAX_MESSAGE_BYTES


def test_examine_takes_no_exists_above_the_uid_range() -> None:
    assert parse_examine([b"99999999999999999999 EXISTS"]).exists is None
    assert parse_examine([b"4294967295 EXISTS"]).exists == 4294967295


@pytest.mark.parametrize(("date", "stored"), [
    (b"31-Dec-9999 23:59:59 -2359", False), (b"01-Jan-0001 00:00:00 +0100", False),
    (b"31-Dec-9999 23:59:59 +0000", True), (b"01-Jan-0001 00:00:00 -0100", True)])
def test_an_internaldate_without_a_utc_time_is_none(date: bytes, stored: bool) -> None:
    item = parse_fetch([b'1 FETCH (UID 1 INTERNALDATE "' + date + b'")'])[0]
    assert (item.internaldate is not None) == stored


@pytest.mark.parametrize("after", [b"ature)", b"xyz UID 7)", b" hello world)", b""])
def test_a_reply_that_goes_on_past_its_literal_is_refused(after: bytes) -> None:
    with pytest.raises(ImapProtocolError, match="wrong length"):
        parse_fetch([b"1 FETCH (UID 1 BODY[] {5}", bytearray(b"Subje"), after])


@pytest.mark.parametrize("after", [b")", b" UID 7)", b" FLAGS (\\Seen))", b" rfc822.size 5)"])
def test_what_may_follow_a_literal(after: bytes) -> None:
    assert parse_fetch([b"1 FETCH (BODY[] {5}", bytearray(b"Subje"), after])[0].body == b"Subje"


def test_a_quoted_body_is_a_body_and_a_flag_update_is_none() -> None:
    quoted, flags, nil = parse_fetch([b'1 FETCH (UID 4 BODY[] "Subject: \\"a\\" \\\\ b")',
                                      b"2 FETCH (UID 5 FLAGS (\\Seen))",
                                      b"3 FETCH (UID 6 BODY[] NIL)"])
    assert (quoted.body, quoted.body_item) == (b'Subject: "a" \\ b', True)
    assert (flags.body, flags.body_item) == (None, False)
    assert (nil.body, nil.body_item) == (None, True)


def test_other_literals_are_followed_by_what_their_item_holds() -> None:
    # A label with non-ASCII as a literal (Gmail): only BODY[]'s length is
    # checked by what follows.
    item = parse_fetch([b"1 FETCH (UID 3 X-GM-LABELS ({4}", bytearray(b"Caf\xc3"),
                        b' "Inbox") BODY[] NIL)'])[0]
    assert (item.uid, item.body_item) == (3, True)
