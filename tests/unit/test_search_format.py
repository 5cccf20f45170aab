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
