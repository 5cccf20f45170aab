"""``nexarch-events search`` output for a terminal: a block per hit, text
wrapped at spaces, nothing cut, no raw newline breaking the layout."""

from __future__ import annotations

from datetime import UTC, datetime

from nexarch_events.cli.mail import format_hits
from nexarch_events.index.base import SearchHit, SearchResult

SENDER = "Dr. Maximiliane Oberhuber-Schwarzenegger <maximiliane.oberhuber@example-logistics.de>"


def test_hits_wrap_at_spaces_and_keep_addresses_whole() -> None:
    hit = SearchHit(4711, 1.0, "Angebot\nfür die Lieferung im März", SENDER,
                    datetime(2025, 3, 4, 10, 30, tzinfo=UTC),
                    "first line\nsecond <mark>line</mark>\r\n\tthird &amp; last " * 4)
    lines = format_hits(SearchResult(12, (hit,)), 0, 60)
    assert lines[0] == "12 match(es), showing 1-1"
    assert all("\n" not in line and "\r" not in line and "\t" not in line for line in lines)
    for line in lines:
        # Longer only where one word is longer than the line.
        assert len(line) <= 60 or " " not in line.strip().split(" ", 1)[-1], line
    text = "\n".join(lines)
    assert "maximiliane.oberhuber@example-logistics.de>" in text  # never cut mid-domain
    assert "Angebot für die Lieferung im März" in " ".join(lines)
    assert "2025-03-04 10:30" in text and "4711" in text
    assert "second [line] third & last" in " ".join(x.strip() for x in lines)


def test_no_hits() -> None:
    assert format_hits(SearchResult(0, ()), 0, 80) == ["0 match(es), showing none"]


def test_a_capped_total_and_ignored_terms_are_shown() -> None:
    lines = format_hits(SearchResult(1000, (), ignored=("²", "_"), exact_total=False), 0, 80)
    assert lines[0] == "1,000+ match(es), showing none"
    assert lines[1] == "ignored (nothing searchable in them): '²' '_'"


def test_control_characters_from_mail_never_reach_the_terminal() -> None:
    """A subject, sender or body with terminal commands (set the window
    title, clear the screen, CSI as the C1 byte) was printed raw (a search
    audit); each control character is shown as an escape."""
    hit = SearchHit(7, 1.0, "\x1b]0;owned-title\x07 Rechnung", "Evil \x1b[2J<e@x.test>",
                    datetime(2025, 3, 4, 10, 30, tzinfo=UTC), "zap \x9b31m <mark>fish</mark>")
    text = "\n".join(format_hits(SearchResult(1, (hit,)), 0, 80))
    assert not any(ch in text for ch in "\x1b\x07\x9b")
    assert "\\x1b]0;owned-title\\x07 Rechnung" in text
    assert "Evil \\x1b[2J<e@x.test>" in text and "zap \\x9b31m [fish]" in text
