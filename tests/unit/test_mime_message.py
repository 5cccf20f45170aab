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
