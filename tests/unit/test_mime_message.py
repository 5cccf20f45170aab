"""mail/mime/message.py: the index's view of a parsed message."""

from __future__ import annotations

import unicodedata

from nexarch_events.index.base import HIGHLIGHT_END, HIGHLIGHT_START
from nexarch_events.mail.mime.message import parse_message, to_index_document


def test_index_text_is_composed_and_has_no_highlight_markers() -> None:
    nfd = unicodedata.normalize("NFD", "Grüße")
    raw = (f"From: Jörg <j@example.org>\r\nSubject: {nfd}\r\n"
           "Content-Type: text/plain; charset=utf-8\r\n\r\n"
           f"{nfd} {HIGHLIGHT_START}x{HIGHLIGHT_END}\r\n").encode()
    doc = to_index_document(parse_message(raw), archive_id=1, tenant_slug="acme")
    assert doc.subject == "Grüße" and doc.body.startswith("Grüße ")
    assert HIGHLIGHT_START not in doc.body and HIGHLIGHT_END not in doc.body
    assert doc.body.count("\ufffd") == 2
    assert unicodedata.is_normalized("NFC", doc.sender)


def test_a_long_run_of_combining_marks_is_made_stream_safe() -> None:
    """CPython sorts a run of combining marks by insertion when it composes:
    quadratic, and the GIL is held throughout (a fuzzing audit: 200 KB of
    windows-1258 marks took 38 s). After 30 marks in a row, U+034F goes in
    (UAX #15's Stream-Safe Text Format), so each sort is of 30 at most.
    Sized so that the old code runs past the test timeout: it fails by
    hanging, never by a measured time."""
    marks = "\u0301\u0323" * 200_000  # classes 230 and 220: every pair out of order
    raw = ("From: a@example.org\r\nSubject: s\r\nContent-Type: text/plain; charset=utf-8"
           f"\r\n\r\nx{marks}\r\n").encode()
    doc = to_index_document(parse_message(raw, max_text_chars=1_000_000), archive_id=1,
                            tenant_slug="acme")
    assert unicodedata.is_normalized("NFC", doc.body)
    run = doc.body.split("x", 1)[1].split("\u034f")
    assert max(len(part) for part in run) <= 30
    # Ordinary text is untouched by it.
    nfd = unicodedata.normalize("NFD", "Ễ Ậ Grüße")
    plain = parse_message(f"Subject: {nfd}\r\n\r\nb".encode())
    assert to_index_document(plain, archive_id=1, tenant_slug="acme").subject == "Ễ Ậ Grüße"


def test_composing_never_makes_a_field_longer() -> None:
    """One character can compose to three (U+FB2C); the parse's caps on
    each field were exceeded after it (a fuzzing audit)."""
    raw = ("Subject: " + "\ufb2c" * 300 + "\r\nContent-Type: text/plain; charset=utf-8\r\n\r\n"
           + "\ufb2c" * 1000 + "\r\n").encode()
    parsed = parse_message(raw, max_text_chars=1000)
    doc = to_index_document(parsed, archive_id=1, tenant_slug="acme")
    assert len(doc.body) <= len(parsed.body) and len(doc.subject) <= len(parsed.subject)


def test_sender_addresses_are_nfc_like_the_sender_filter() -> None:
    """A From address written decomposed (u + U+0308, RFC 6532 UTF-8
    headers) was stored as written, and the sender filter, given the
    address composed, did not match it."""
    from nexarch_events.index.base import SearchQuery

    decomposed = unicodedata.normalize("NFD", "Müller@Example.org")
    assert decomposed != unicodedata.normalize("NFC", decomposed)
    raw = f"From: <{decomposed}>\r\nSubject: x\r\n\r\nbody\r\n".encode()
    document = to_index_document(parse_message(raw), archive_id=7, tenant_slug="acme")
    assert document.sender_addresses == ("müller@example.org",)
    assert SearchQuery("acme", "", sender=decomposed).sender == "Müller@Example.org"
