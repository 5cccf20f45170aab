"""Postgres full-text search: the embedded default (same database, nothing
else to run).

Language: a list of text-search configurations, default ``german`` and
``english``. Each document's vector holds its words stemmed by each, and a
query matches if it matches under one of them, so "Rechnung" finds
"Rechnungen" (German) and "run" finds "running" (English) in the same index,
without guessing each message's language. Weights: subject (A) > sender and
recipients (B) > body (C) > attachments (D).

Postgres' limits (a tsvector must stay under 1 MB; positions stop at 16,383)
are kept by indexing at most ``max_field_chars`` of the body and of the
attachment text; longer text stays searchable on its first part.
"""

from __future__ import annotations

import json
import re
from collections.abc import Sequence

from ..aio import Database
from ..db import sqlfiles
from ..errors import DatabaseError, DatabaseUnavailable
from ..models import validate_tenant_slug
from .base import (
    CONTINUOUS_RUN,
    IndexDocument,
    IndexRejected,
    IndexUnavailable,
    ParsedQuery,
    QueryTerm,
    SearchHit,
    SearchQuery,
    SearchResult,
    parse_query,
    render_snippet,
)

_SQL = sqlfiles.queries("search.sql")
_CONFIG_NAME = re.compile(r"[a-z_][a-z0-9_]{0,62}")

DEFAULT_CONFIGS = ("german", "english")
#: Characters of body / attachment text that go into the vector (see module doc).
DEFAULT_MAX_FIELD_CHARS = 200_000


def split_continuous(text: str) -> str:
    """Runs of Chinese, Japanese, Korean and Thai as overlapping bigrams plus
    the run's last character ("会议室" -> " 会议 议室 室 "): Postgres' parser
    takes a whole run for one word, so without this a two-character word
    inside a sentence is never found. Every character starts a token, so a
    one-character query finds it as a prefix (``tsquery_text``)."""
    if CONTINUOUS_RUN.search(text) is None:
        return text
    return CONTINUOUS_RUN.sub(_bigrams, text)


def _bigrams(match: re.Match[str]) -> str:
    run = match.group()
    grams = [run[i:i + 2] for i in range(len(run) - 1)] + [run[-1]]
    return " " + " ".join(grams) + " "


def _operands(term: QueryTerm) -> list[str]:
    out: list[str] = []
    for word in term.words:
        if CONTINUOUS_RUN.fullmatch(word) is None:
            out.append(f"'{word}'")
        elif len(word) == 1:
            out.append(f"'{word}':*")  # the first character of a bigram, or the last alone
        else:
            out.extend(f"'{word[i:i + 2]}'" for i in range(len(word) - 1))
    return out


def tsquery_text(parsed: ParsedQuery) -> str:
    """The parsed search language as to_tsquery text (see the migration's
    ``nexarch_mail_tsquery``). Words hold only letters, marks and digits
    (``base.is_word_char``), so quoting them needs no escapes; a term of
    several words is a phrase (``<->``), as are the bigrams of a CJK word."""
    parts: list[str] = []
    for group in parsed.groups:
        rendered: list[str] = []
        for term in group:
            phrase = " <-> ".join(_operands(term))
            rendered.append(f"!({phrase})" if term.negated else f"({phrase})")
        parts.append(rendered[0] if len(rendered) == 1 else "(" + " | ".join(rendered) + ")")
    return " & ".join(parts)


def _vector_text(stored: str) -> str | None:
    """What the vector is built from, or None when that is the stored text."""
    split = split_continuous(stored)
    return None if split is stored else split


class PostgresIndex:
    name = "postgres"

    def __init__(self, db: Database, *, configs: Sequence[str] = DEFAULT_CONFIGS,
                 max_field_chars: int = DEFAULT_MAX_FIELD_CHARS) -> None:
        if not configs:
            raise ValueError("at least one text-search configuration is needed")
        for config in configs:
            if not _CONFIG_NAME.fullmatch(config):
                raise ValueError(f"text-search configuration name {config!r} is invalid")
        self.db = db
        self.configs = list(configs)
        self.max_field_chars = max_field_chars

    async def ensure_schema(self, tenant_slug: str) -> None:
        # One shared table, created by the migrations; tenants are rows.
        validate_tenant_slug(tenant_slug)

    async def upsert(self, documents: Sequence[IndexDocument]) -> None:
        if not documents:
            return
        cap = self.max_field_chars
        docs = list(documents)
        configs = ",".join(self.configs)
        subjects = [d.subject[:10_000] for d in docs]
        senders = [d.sender[:10_000] for d in docs]
        recipients = [d.recipients[:50_000] for d in docs]
        names = [" ".join(d.attachment_names)[:10_000] for d in docs]
        try:
            await self.db.execute(
                _SQL["upsert"],
                [d.tenant_slug for d in docs], [d.archive_id for d in docs],
                subjects, senders,
                [json.dumps(list(d.sender_addresses)) for d in docs],
                recipients, [d.body[:cap] for d in docs], names,
                [d.attachment_text[:cap] for d in docs], [d.sent_at for d in docs],
                [json.dumps(list(d.mailboxes)) for d in docs],
                [d.size_bytes for d in docs],
                [configs for _ in docs],
                [_vector_text(s) for s in subjects],
                [_vector_text(f"{s} {r}") for s, r in zip(senders, recipients, strict=True)],
                [_vector_text(d.body[:cap]) for d in docs],
                [_vector_text(f"{n} {d.attachment_text[:cap]}")
                 for n, d in zip(names, docs, strict=True)])
        except DatabaseUnavailable as exc:
            raise IndexUnavailable(f"postgres index: {exc}") from exc
        except DatabaseError as exc:
            # 54000: a vector over Postgres' limit; 22xxx: data the text type refuses.
            raise IndexRejected(f"postgres index refused the batch: {exc}") from exc

    async def delete(self, tenant_slug: str, archive_ids: Sequence[int]) -> None:
        validate_tenant_slug(tenant_slug)
        try:
            await self.db.execute(_SQL["delete"], tenant_slug, [int(i) for i in archive_ids])
        except DatabaseUnavailable as exc:
            raise IndexUnavailable(f"postgres index: {exc}") from exc

    async def search(self, query: SearchQuery) -> SearchResult:
        parsed = parse_query(query.text)
        text = tsquery_text(parsed)
        if query.text.strip() and not text:
            # SearchQuery refuses such a query; never widen it to "everything".
            return SearchResult(total=0, ignored=parsed.ignored)
        sender = query.sender.strip().lower() if query.sender else None
        try:
            # One statement: total and page from one snapshot (see search.sql).
            rows = await self.db.fetch(_SQL["search"], self.configs, query.tenant_slug, text,
                                       sender, query.date_from, query.date_to, query.mailbox,
                                       query.limit, query.offset)
        except DatabaseUnavailable as exc:
            raise IndexUnavailable(f"postgres index: {exc}") from exc
        hits = tuple(
            SearchHit(archive_id=r["archive_id"], score=float(r["score"]), subject=r["subject"],
                      sender=r["sender"], sent_at=r["sent_at"],
                      snippet=render_snippet(r["snippet"] or ""))
            for r in rows if r["archive_id"] is not None)
        return SearchResult(total=int(rows[0]["total"]) if rows else 0, hits=hits,
                            ignored=parsed.ignored)

    async def document_ids(self, tenant_slug: str) -> set[int]:
        validate_tenant_slug(tenant_slug)
        out: set[int] = set()
        after = 0
        while True:
            rows = await self.db.fetch(_SQL["ids_page"], tenant_slug, after, 10_000)
            out.update(r["archive_id"] for r in rows)
            if len(rows) < 10_000:
                return out
            after = rows[-1]["archive_id"]

    async def aclose(self) -> None:
        """The pool belongs to the caller."""
