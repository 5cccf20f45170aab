"""mail/mime/headers.py: header sections, field text, RFC 2047 encoded
words, RFC 2231 parameters, Subject, Message-ID, a part's Content-* fields."""

from __future__ import annotations

import pytest

from nexarch_events.mail.mime.headers import (
    PART_FIELDS,
    TOP_FIELDS,
    content_params,
    decode_words,
    header_text,
    message_id,
    part_header,
    read_headers,
    split_params,
    subject,
)
from nexarch_events.mail.mime.limits import MAX_HEADER_CHARS
from nexarch_events.mail.mime.notes import Notes

# --------------------------------------------------------------------------
# Header sections


def test_read_headers_finds_wanted_fields_unfolded_and_the_body() -> None:
    raw = (b"Subject: one\r\n two\r\nX-Other: skipped\r\nsubject: second\r\n"
           b"\r\nbody\r\n")
    fields, body, has_fields, too_many, truncated = read_headers(raw, 0, len(raw), TOP_FIELDS)
    assert fields == {b"subject": [b" one two", b" second"]}
    assert raw[body:] == b"body\r\n"
    assert (has_fields, too_many, truncated) == (True, False, [])


def test_read_headers_only_reads_the_fields_asked_for() -> None:
    raw = b"Subject: s\nContent-Type: text/plain\n\nx"
    fields, *_ = read_headers(raw, 0, len(raw), PART_FIELDS)
    assert list(fields) == [b"content-type"]


def test_read_headers_skips_an_mbox_separator_line() -> None:
    raw = b"From anna@example.org Tue Jun 13 10:00:00 2023\nSubject: s\n\nbody"
    fields, body, has_fields, *_ = read_headers(raw, 0, len(raw), TOP_FIELDS)
    assert (fields, has_fields) == ({b"subject": [b" s"]}, True)
    assert raw[body:] == b"body"


def test_a_line_that_is_no_field_starts_the_body() -> None:
    raw = b"Subject: s\nthis is text\nSubject: not a header\n"
    fields, body, *_ = read_headers(raw, 0, len(raw), TOP_FIELDS)
    assert fields == {b"subject": [b" s"]}
    assert raw[body:] == b"this is text\nSubject: not a header\n"


def test_no_header_section_at_all() -> None:
    raw = b"just text\n"
    fields, body, has_fields, *_ = read_headers(raw, 0, len(raw), TOP_FIELDS)
    assert (fields, body, has_fields) == ({}, 0, False)


def test_blank_first_line_means_an_empty_header_section() -> None:
    raw = b"\r\nbody"
    fields, body, has_fields, *_ = read_headers(raw, 0, len(raw), TOP_FIELDS)
    assert (fields, raw[body:], has_fields) == ({}, b"body", False)


def test_read_headers_caps_a_long_value_and_names_it() -> None:
    raw = b"Subject: " + b"x" * (MAX_HEADER_CHARS + 10) + b"\n\nbody"
    fields, _body, _has, _many, truncated = read_headers(raw, 0, len(raw), TOP_FIELDS)
    assert len(fields[b"subject"][0]) == MAX_HEADER_CHARS
    assert truncated == [b"subject"]


def test_read_headers_works_on_a_region_of_the_buffer() -> None:
    raw = b"ignored\n--b\nContent-Type: text/html\n\n<p>x</p>\n--b--\n"
    start = raw.index(b"Content")
    end = raw.index(b"\n--b--")
    fields, body, *_ = read_headers(raw, start, end, PART_FIELDS)
    assert fields == {b"content-type": [b" text/html"]}
    assert raw[body:end] == b"<p>x</p>"


# --------------------------------------------------------------------------
# Field text


def test_header_text_utf8_then_windows_1252_with_a_note() -> None:
    notes = Notes()
    assert header_text("Grüße".encode(), "Subject", notes) == "Grüße"
    assert notes.result() == ()
    assert header_text("Grüße €".encode("cp1252"), "Subject", notes) == "Grüße €"
    assert notes.result() == (
        "header Subject has 8-bit bytes that are not UTF-8; decoded as windows-1252",)


def test_header_text_removes_nul_with_a_note() -> None:
    notes = Notes()
    assert header_text(b"a\x00b", "Subject", notes) == "ab"
    assert notes.result() == ("removed NUL characters from header Subject",)


# --------------------------------------------------------------------------
# RFC 2047 encoded words


@pytest.mark.parametrize(("value", "expected"), [
    ("plain text", "plain text"),
    ("=?utf-8?q?Gr=C3=BC=C3=9Fe?=", "Grüße"),
    ("=?UTF-8?B?R3LDvMOfZQ==?=", "Grüße"),
    ("=?iso-8859-1?q?caf=E9_au_lait?=", "café au lait"),
    # Whitespace between adjacent encoded words is dropped ...
    ("=?utf-8?q?a?= =?utf-8?q?b?=", "ab"),
    # ... but not between a word and plain text.
    ("=?utf-8?q?a?= b", "a b"),
    # A multi-byte character split across two words of one charset.
    ("=?utf-8?b?w6Q=?= =?utf-8?b?w7Y=?=", "äö"),
    ("=?utf-8?q?=C3?= =?utf-8?q?=A4?=", "ä"),
    # RFC 2231 language suffix on the charset.
    ("=?utf-8*de?q?Stra=C3=9Fe?=", "Straße"),
])
def test_decode_words(value: str, expected: str) -> None:
    notes = Notes()
    assert decode_words(value, "header Subject", notes) == expected
    assert notes.result() == ()


def test_broken_base64_word_is_decoded_as_far_as_possible_with_a_note() -> None:
    notes = Notes()
    assert decode_words("=?utf-8?b?SGVs!bG8?=", "header Subject", notes) == "Hello"
    assert notes.result() == ("broken encoded-word '=?utf-8?b?SGVs!bG8?=' in header "
                              "Subject; decoded what was readable",)


def test_unknown_charset_in_a_word_falls_back_with_a_note() -> None:
    notes = Notes()
    assert decode_words("=?x-nonsense?q?caf=C3=A9?=", "header Subject", notes) == "café"
    assert notes.result() == (
        "unknown charset 'x-nonsense' in header Subject, decoded as UTF-8",)


def test_subject_is_decoded_and_whitespace_collapsed() -> None:
    notes = Notes()
    assert subject({b"subject": [b" =?utf-8?q?Hallo_Welt?=\t  again "]}, notes) == \
        "Hallo Welt again"
    assert subject({}, notes) == ""


# --------------------------------------------------------------------------
# Message-ID


@pytest.mark.parametrize(("value", "expected"), [
    (b" <abc@example.org>", "<abc@example.org>"),
    (b" (comment) <abc@example.org> trailing", "<abc@example.org>"),
    (b" no-brackets@example.org more", "no-brackets@example.org"),
    (b"   ", None),
])
def test_message_id(value: bytes, expected: str | None) -> None:
    assert message_id({b"message-id": [value]}, Notes()) == expected


def test_missing_message_id() -> None:
    assert message_id({}, Notes()) is None


# --------------------------------------------------------------------------
# Parameters (RFC 2231)


def test_split_params_keeps_semicolons_inside_quotes() -> None:
    assert split_params('Text/Plain; Name="a;b.txt"; charset=utf-8; junk') == (
        "text/plain", [("name", '"a;b.txt"'), ("charset", "utf-8")])


def test_split_params_without_a_value() -> None:
    assert split_params("; charset=utf-8") == ("", [("charset", "utf-8")])


def test_rfc2231_continuations_are_joined_in_number_order_and_decoded() -> None:
    notes = Notes()
    value = ("attachment; filename*2=\".txt\"; filename*0*=utf-8'de'Gr%C3%BC; "
             "filename*1*=%C3%9Fe")
    assert content_params(value, "part 2", notes) == ("attachment", {"filename": "Grüße.txt"})
    assert notes.result() == ()


def test_rfc2231_wins_over_the_plain_parameter() -> None:
    value = "attachment; filename=\"fallback.txt\"; filename*=iso-8859-1''caf%E9.txt"
    assert content_params(value, "part 1", Notes())[1] == {"filename": "café.txt"}


def test_rfc2231_bad_charset_falls_back_with_a_note() -> None:
    notes = Notes()
    head, params = content_params("text/plain; name*=bogus''a%C3%A4", "part 1", notes)
    assert (head, params) == ("text/plain", {"name": "aä"})
    assert notes.result() == (
        "unknown charset 'bogus' in parameter name of part 1, decoded as UTF-8",)


def test_quoted_parameter_values_lose_their_quotes_and_escapes() -> None:
    _head, params = content_params(r'text/plain; name="a \"b\".txt"; charset="utf-8',
                                   "part 1", Notes())
    assert params == {"name": 'a "b".txt', "charset": "utf-8"}


# --------------------------------------------------------------------------
# A part's Content-* fields


def test_part_header_reads_type_disposition_encoding_and_name() -> None:
    fields = {
        b"content-type": [b' Text/HTML; charset="ISO-8859-1"; name="x.htm"'],
        b"content-disposition": [b" attachment; filename==?utf-8?q?r=C3=A9sum=C3=A9?=.htm"],
        b"content-transfer-encoding": [b" Base64 "],
    }
    assert part_header(fields, "text/plain", "part 2", Notes()) == (
        "text/html", {"charset": "ISO-8859-1", "name": "x.htm"}, "attachment", "base64",
        "résumé.htm")


def test_part_header_file_name_falls_back_to_the_type_name() -> None:
    fields = {b"content-type": [b" application/pdf; name==?utf-8?q?=C3=A4?=.pdf"]}
    assert part_header(fields, "text/plain", "part 2", Notes())[4] == "ä.pdf"


def test_part_header_defaults_and_invalid_type() -> None:
    notes = Notes()
    assert part_header({}, "message/rfc822", "part 1", notes) == (
        "message/rfc822", {}, "", "", "")
    header = part_header({b"content-type": [b" nonsense"]}, "message/rfc822", "part 3", notes)
    assert header[0] == "text/plain"
    assert notes.result() == ("invalid Content-Type 'nonsense' in part 3; read as text/plain",)
