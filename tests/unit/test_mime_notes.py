"""mail/mime/notes.py: the notes collector and string cleaning."""

from __future__ import annotations

from nexarch_events.mail.mime.limits import MAX_NOTES
from nexarch_events.mail.mime.notes import Notes, clean, quote, without_nul


def test_notes_keep_order_and_drop_duplicates() -> None:
    notes = Notes()
    for text in ("b", "a", "b", "c\x00"):
        notes.add(text)
    assert notes.result() == ("b", "a", "c")


def test_notes_past_the_cap_are_counted() -> None:
    notes = Notes()
    for number in range(MAX_NOTES + 10):
        notes.add(f"note {number}")
    result = notes.result()
    assert len(result) == MAX_NOTES
    assert result[-2] == f"note {MAX_NOTES - 2}"
    assert result[-1] == "11 more notes omitted"


def test_clean_removes_nul_and_lone_surrogates() -> None:
    assert clean("a\x00b") == "ab"
    assert clean("x\ud800y") == "x?y"
    assert clean("Grüße") == "Grüße"
    assert without_nul("a\x00\x00b") == "ab"


def test_quote_is_short_single_line_and_clean() -> None:
    assert quote("a\r\n  b\x00") == "'a b'"
    assert quote("x" * 100, limit=5) == "'xxxxx…'"
