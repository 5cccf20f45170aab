"""mail/mime/parts.py: boundaries, multipart regions, and the walk of the
MIME tree (nesting cap, missing boundaries, attached messages, budgets)."""

from __future__ import annotations

import pytest

from nexarch_events.mail.mime.headers import TOP_FIELDS, read_headers
from nexarch_events.mail.mime.limits import MAX_DEPTH
from nexarch_events.mail.mime.notes import Notes
from nexarch_events.mail.mime.parts import (
    Contents,
    find_delimiter,
    multipart_regions,
    walk,
)


def walk_message(raw: bytes, max_chars: int = 1_000_000) -> tuple[Contents, tuple[str, ...]]:
    notes = Notes()
    fields, body_start, *_ = read_headers(raw, 0, len(raw), TOP_FIELDS)
    return walk(raw, body_start, fields, max_chars, notes), notes.result()


def multipart(boundary: bytes, *parts: bytes, ctype: bytes = b"multipart/mixed",
              close: bool = True) -> bytes:
    body = b"".join(b"--" + boundary + b"\r\n" + p + b"\r\n" for p in parts)
    if close:
        body += b"--" + boundary + b"--\r\n"
    return (b"Content-Type: " + ctype + b'; boundary="' + boundary + b'"\r\n\r\n' + body)


# --------------------------------------------------------------------------
# Boundaries


def test_find_delimiter_at_the_start_and_after_a_line_break() -> None:
    buf = b"--b\r\nx\r\n--b  \r\ny\r\n--b--\r\n"
    assert find_delimiter(buf, b"--b", 0, 0, len(buf)) == (0, 5, False)
    assert find_delimiter(buf, b"--b", 5, 0, len(buf)) == (8, 15, False)
    assert find_delimiter(buf, b"--b", 15, 0, len(buf)) == (18, 25, True)
    assert find_delimiter(buf, b"--b", 25, 0, len(buf)) is None


def test_a_line_that_only_starts_like_the_boundary_is_none() -> None:
    buf = b"x\n--bc\n--b text\n--b\n"
    assert find_delimiter(buf, b"--b", 0, 0, len(buf)) == (16, 20, False)


def test_many_near_miss_lines_are_skipped() -> None:
    buf = b"x" + b"\n--ab" * 1000 + b"\n--a--"
    assert find_delimiter(buf, b"--a", 0, 0, len(buf)) == (len(buf) - 5, len(buf), True)


def test_find_delimiter_stays_inside_its_region() -> None:
    buf = b"--b\nx\n--b--\n"
    assert find_delimiter(buf, b"--b", 4, 4, 8) is None


def regions_of(buf: bytes, room: int = 100) -> tuple[list[bytes], bool]:
    """The parts of a multipart body with boundary "b", and whether it is unclosed."""
    first = find_delimiter(buf, b"--b", 0, 0, len(buf))
    assert first is not None
    regions, unclosed = multipart_regions(buf, b"--b", first, 0, len(buf), room)
    return [buf[s:e] for s, e in regions], unclosed


def test_regions_exclude_the_line_break_before_each_boundary() -> None:
    assert regions_of(b"--b\r\none\r\n--b\ntwo\n\n--b--\r\nepilogue") == (
        [b"one", b"two\n"], False)


def test_regions_without_a_closing_boundary_run_to_the_end() -> None:
    assert regions_of(b"--b\none\n--b\ntwo") == ([b"one", b"two"], True)


def test_regions_stop_one_past_the_room_left() -> None:
    buf = b"".join(b"--b\n%d\n" % i for i in range(10)) + b"--b--\n"
    assert regions_of(buf, room=3) == ([b"0", b"1", b"2", b"3"], False)


# --------------------------------------------------------------------------
# The walk


def test_alternative_plain_wins_and_attachments_are_named() -> None:
    raw = multipart(
        b"outer",
        multipart(b"inner", b"Content-Type: text/plain\r\n\r\nplain body",
                  b"Content-Type: text/html\r\n\r\n<p>html body</p>",
                  ctype=b"multipart/alternative"),
        b"Content-Type: application/pdf; name=report.pdf\r\n"
        b"Content-Transfer-Encoding: base64\r\n\r\nJVBERi0=",
        b'Content-Type: text/csv\r\nContent-Disposition: attachment; filename="a.csv"\r\n'
        b"\r\nx,y")
    contents, notes = walk_message(raw)
    assert contents == Contents(body="plain body", attachment_names=("report.pdf", "a.csv"),
                                attachment_text="x,y")
    assert notes == ()


def test_html_only_is_reduced_to_text() -> None:
    raw = b"Content-Type: text/html; charset=utf-8\r\n\r\n<p>Gr\xc3\xbc\xc3\x9fe</p><p>x</p>"
    assert walk_message(raw)[0].body == "Grüße\nx"


def nested(levels: int) -> bytes:
    """A text part inside ``levels`` multiparts."""
    inner = b"Content-Type: text/plain\r\n\r\ndeep text"
    for depth in range(levels):
        inner = multipart(b"b%d" % depth, inner)
    return inner


def test_nesting_deeper_than_the_cap_is_skipped_with_one_note() -> None:
    contents, notes = walk_message(nested(MAX_DEPTH + 5))
    assert contents.body == ""
    assert notes == (f"MIME structure nested deeper than {MAX_DEPTH} levels; "
                     f"the inner parts were skipped",)


def test_nesting_up_to_the_cap_is_read() -> None:
    assert walk_message(nested(MAX_DEPTH)) == (Contents("deep text", (), ""), ())


@pytest.mark.parametrize(("raw", "body", "note"), [
    (b"Content-Type: multipart/mixed\r\n\r\n--guess\r\n\r\none\r\n--guess\r\n\r\ntwo\r\n"
     b"--guess--\r\n", "one\ntwo",
     "multipart/mixed without boundary in the message; used 'guess' found in the body"),
    (b'Content-Type: multipart/mixed; boundary="declared"\r\n\r\n--actual\r\n\r\none\r\n'
     b"--actual--\r\n", "one",
     "boundary 'declared' of the message never occurs; used 'actual' found in the body"),
])
def test_missing_or_wrong_boundary_is_guessed_from_the_body(raw: bytes, body: str,
                                                            note: str) -> None:
    contents, notes = walk_message(raw)
    assert contents.body == body
    assert notes == (note,)


def test_multipart_without_any_boundary_line_is_read_as_plain_text() -> None:
    raw = b"Content-Type: multipart/mixed\r\n\r\nno parts here\r\n"
    contents, notes = walk_message(raw)
    assert contents.body == "no parts here\r\n"
    assert notes == ("multipart/mixed without boundary in the message; read as plain text",)


def test_unclosed_multipart_is_read_to_the_end_with_a_note() -> None:
    raw = multipart(b"b", b"\r\none", b"\r\ntwo", close=False)
    contents, notes = walk_message(raw)
    assert contents.body == "one\ntwo\r\n"
    assert notes == ("multipart/mixed in the message has no closing boundary; "
                     "read to the end",)


def test_attached_message_gives_attachment_text_with_its_headers() -> None:
    attached = (b"Subject: =?utf-8?q?Re:_Gr=C3=BC=C3=9Fe?=\r\nFrom: Anna <a@example.org>\r\n"
                b"To: not-read@example.org\r\n\r\nattached body")
    raw = multipart(b"b", b"\r\nmain body",
                    b"Content-Type: message/rfc822; name=fwd.eml\r\n\r\n" + attached)
    contents, notes = walk_message(raw)
    assert contents == Contents(
        body="main body", attachment_names=("fwd.eml",),
        attachment_text="Subject: Re: Grüße\nFrom: Anna <a@example.org>\nattached body")
    assert notes == ()


def test_base64_attached_message_is_decoded_first() -> None:
    raw = multipart(b"b", b"\r\nmain",
                    b"Content-Type: message/rfc822\r\nContent-Transfer-Encoding: base64\r\n\r\n"
                    b"U3ViamVjdDogaW5uZXINCg0KaW5uZXIgYm9keQ==")
    assert walk_message(raw)[0].attachment_text == "Subject: inner\ninner body"


def test_digest_parts_default_to_attached_messages() -> None:
    raw = multipart(b"d", b"\r\nSubject: one\r\n\r\nfirst", ctype=b"multipart/digest")
    assert walk_message(raw)[0].attachment_text == "Subject: one\nfirst"


def test_body_budget_is_shared_across_parts_and_noted_once() -> None:
    raw = multipart(b"b", b"\r\n" + b"a" * 6, b"\r\n" + b"b" * 6, b"\r\n" + b"c" * 6)
    contents, notes = walk_message(raw, max_chars=10)
    assert contents.body == "aaaaaa\nbbb"
    assert notes == ("body truncated to 10 characters (part 2 is 6 bytes)",)


def test_binary_parts_are_never_decoded() -> None:
    raw = multipart(b"b", b"Content-Type: image/png\r\nContent-Transfer-Encoding: base64\r\n"
                          b"\r\n!!! not base64 !!!")
    assert walk_message(raw) == (Contents("", (), ""), ())
