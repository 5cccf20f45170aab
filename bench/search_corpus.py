"""The corpus and query mix of bench/index_bench.py's search workload.

Generated mail (tests/support/mailgen.py), parsed by the real MIME parser,
as IndexDocuments of one tenant; dates spread over ten years. The query mix
is drawn from the corpus: rare words (one message's own token), common
words, two words, a phrase, and a common word with a one-year date filter.
"""

from __future__ import annotations

import random
import sys
from collections.abc import Iterator
from dataclasses import replace
from datetime import UTC, datetime, timedelta
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from nexarch_events.index.base import IndexDocument, SearchQuery  # noqa: E402
from nexarch_events.mail.mime import parse_message, to_index_document  # noqa: E402
from tests.support.mailgen import realistic_messages, unique_token  # noqa: E402

TENANT = "bench"
START = datetime(2015, 1, 1, tzinfo=UTC)
SPAN_DAYS = 3650


def documents(count: int, *, seed: int = 7) -> Iterator[IndexDocument]:
    """``count`` documents, ids 1..count; document i holds unique_token(i-1)."""
    rng = random.Random(seed)
    for n, raw in enumerate(realistic_messages(count, seed=seed)):
        parsed = parse_message(raw)
        doc = to_index_document(parsed, archive_id=n + 1, tenant_slug=TENANT,
                                mailboxes=("INBOX",), size_bytes=len(raw))
        sent = START + timedelta(seconds=rng.randrange(SPAN_DAYS * 86_400))
        yield replace(doc, sent_at=sent)


COMMON = ("invoice", "Rechnung", "meeting", "Vertrag", "delivery", "Kunden", "payment",
          "Termin")
PAIRS = ("invoice contract", "Rechnung Zahlung", "meeting tomorrow", "Angebot Kunde",
         "delivery shipped", "Projekt Unterlagen")
PHRASES = ('"best regards"', '"viele grüße"', '"the invoice"', '"die Rechnung"')


def query_mix(distinct: int, count: int, *, seed: int = 3) -> list[tuple[str, SearchQuery]]:
    """``count`` (kind, query) pairs, kinds in equal shares."""
    rng = random.Random(seed)
    out: list[tuple[str, SearchQuery]] = []
    for i in range(count):
        kind = ("rare", "common", "two-word", "phrase", "date-filter")[i % 5]
        if kind == "rare":
            text = unique_token(rng.randrange(distinct))
            out.append((kind, SearchQuery(TENANT, text)))
        elif kind == "common":
            out.append((kind, SearchQuery(TENANT, rng.choice(COMMON))))
        elif kind == "two-word":
            out.append((kind, SearchQuery(TENANT, rng.choice(PAIRS))))
        elif kind == "phrase":
            out.append((kind, SearchQuery(TENANT, rng.choice(PHRASES))))
        else:
            year = START.year + rng.randrange(10)
            out.append((kind, SearchQuery(TENANT, rng.choice(COMMON),
                                          date_from=datetime(year, 1, 1, tzinfo=UTC),
                                          date_to=datetime(year + 1, 1, 1, tzinfo=UTC))))
    return out
