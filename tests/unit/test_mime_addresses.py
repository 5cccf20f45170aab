"""mail/mime/addresses.py: From/To/Cc, the fast path for the common forms
and the tokenising path for the rest."""

from __future__ import annotations

import pytest

from nexarch_events.mail.mime.addresses import (
    Address,
    addresses,
    parse_address,
    simple_addresses,
    split_address_list,
)
from nexarch_events.mail.mime.limits import MAX_NAME_CHARS
from nexarch_events.mail.mime.notes import Notes


@pytest.mark.parametrize(("value", "expected"), [
    ("a@example.org", [("", "a@example.org")]),
    ("Anna  Muster <a@example.org>", [("Anna Muster", "a@example.org")]),
    ('"Muster, Anna" <a@example.org>, b@example.org',
     [("Muster, Anna", "a@example.org"), ("", "b@example.org")]),
    ('"say \\"hi\\"" <q@example.org>', [('say "hi"', "q@example.org")]),
    (" , a@example.org, ,", [("", "a@example.org")]),
    ("", []),
])
def test_simple_addresses_reads_the_common_forms(value: str,
                                                 expected: list[tuple[str, str]]) -> None:
    assert simple_addresses(value) == expected


@pytest.mark.parametrize("value", [
    "carl@example.org (Carl)",        # a comment
    "team: a@example.org;",           # group syntax
    "Broken <a@example.org",          # unterminated angle
    "Just A Name",                    # no address
])
def test_simple_addresses_declines_everything_else(value: str) -> None:
    assert simple_addresses(value) is None


def test_split_address_list_ignores_commas_inside_quotes_comments_and_angles() -> None:
    # (Tokens keep their spaces; whitespace-only ones are dropped.)
    value = '"Last, First" <a@x>, (a, comment) b@x, <c,d@x>,,'
    assert split_address_list(value) == [
        ['"Last, First"', "<a@x>"], ["(a, comment)", " b@x"], ["<c,d@x>"]]


def test_split_address_list_tolerates_unterminated_tokens() -> None:
    assert split_address_list('"open, quote <a@x>') == [['"open, quote <a@x>']]
    assert split_address_list("(open comment, a@x") == [["(open comment, a@x"]]


@pytest.mark.parametrize(("tokens", "expected"), [
    (["carl@example.org", "(Carl Example)"], Address("Carl Example", "carl@example.org")),
    (["(Carl)", "<c@example.org>"], Address("Carl", "c@example.org")),
    (['"Anna"', "<a@example.org>", "(ignored)"], Address("Anna", "a@example.org")),
    (["team: a@example.org"], Address("", "a@example.org")),
    (["<@route.example,@b.example:user@example.org>"], Address("", "user@example.org")),
    (["< spaced @ example.org >"], Address("", "spaced@example.org")),
    (["Only A Name"], Address("Only A Name", "")),
    (["=?utf-8?q?J=C3=BCrgen?=", "<j@example.de>"], Address("Jürgen", "j@example.de")),
    (["undisclosed-recipients:;"], None),
])
def test_parse_address(tokens: list[str], expected: Address | None) -> None:
    assert parse_address(tokens, "To", Notes()) == expected


def test_addresses_combines_repeated_fields_in_order() -> None:
    fields = {b"to": [b" a@example.org, (x) b@example.org", b" C <c@example.org>"]}
    assert addresses(fields, b"to", Notes()) == (
        Address("", "a@example.org"), Address("x", "b@example.org"),
        Address("C", "c@example.org"))
    assert addresses(fields, b"cc", Notes()) == ()


def test_addresses_decodes_encoded_names_on_the_fast_path() -> None:
    fields = {b"from": [b" =?utf-8?q?M=C3=BCller=2C_J=C3=BCrgen?= <j@example.de>"]}
    assert addresses(fields, b"from", Notes()) == (Address("Müller, Jürgen", "j@example.de"),)


def test_addresses_cap_names_and_addresses() -> None:
    long_name = "n" * (MAX_NAME_CHARS + 5)
    long_local = "l" * (MAX_NAME_CHARS + 5)
    fields = {b"to": [f" {long_name} <{long_local}@example.org>".encode()]}
    (address,) = addresses(fields, b"to", Notes())
    assert address == Address("n" * MAX_NAME_CHARS, "l" * MAX_NAME_CHARS)


def test_addresses_8bit_header_gets_a_note_with_the_field_name() -> None:
    notes = Notes()
    fields = {b"cc": ["Jürgen <j@example.de>".encode("latin-1")]}
    assert addresses(fields, b"cc", notes) == (Address("Jürgen", "j@example.de"),)
    assert notes.result() == (
        "header Cc has 8-bit bytes that are not UTF-8; decoded as windows-1252",)


@pytest.mark.parametrize(("address", "display"), [
    (Address("Anna", "a@example.org"), "Anna <a@example.org>"),
    (Address("", "a@example.org"), "a@example.org"),
    (Address("Anna", ""), "Anna"),
])
def test_display(address: Address, display: str) -> None:
    assert address.display() == display


@pytest.mark.parametrize("value", [" " * 16_000 + "y", "x" + "\t" * 16_000 + "y",
                                   " " * 16_000 + "<a@b" + " " * 16_000])
def test_blanks_that_match_nothing_cost_linear_time(value: str) -> None:
    """A lazy display name between two runs of optional blanks tried every
    way to share out a run of blanks that matched nothing: cubic (4,000
    spaces in a From field: 35 s, the GIL held; a fuzzing audit). Sized so
    that the old pattern runs past the test timeout: it fails by hanging,
    never by a measured time."""
    assert simple_addresses(value) is None
    assert isinstance(addresses({b"from": [value.encode()]}, b"from", Notes()), tuple)
