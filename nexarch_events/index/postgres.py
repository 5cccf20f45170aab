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
    IndexDocument,
    IndexRejected,
    IndexUnavailable,
    SearchHit,
    SearchQuery,
    SearchResult,
    render_snippet,
)

_SQL = sqlfiles.queries("search.sql")
_CONFIG_NAME = re.compile(r"[a-z_][a-z0-9_]{0,62}")

DEFAULT_CONFIGS = ("german", "english")
#: Characters of body / attachment text that go into the vector (see module doc).
DEFAULT_MAX_FIELD_CHARS = 200_000


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
        try:
            await self.db.execute(
                _SQL["upsert"], self.configs,
                [d.tenant_slug for d in docs], [d.archive_id for d in docs],
                [d.subject[:10_000] for d in docs], [d.sender[:10_000] for d in docs],
                [json.dumps(list(d.sender_addresses)) for d in docs],
                [d.recipients[:50_000] for d in docs], [d.body[:cap] for d in docs],
                [" ".join(d.attachment_names)[:10_000] for d in docs],
                [d.attachment_text[:cap] for d in docs], [d.sent_at for d in docs],
                [json.dumps(list(d.mailboxes)) for d in docs],
                [d.size_bytes for d in docs])
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
        text = query.text.strip()
        sender = query.sender.strip().lower() if query.sender else None
        args = (self.configs, query.tenant_slug, text, sender, query.date_from, query.date_to,
                query.mailbox)
        try:
            rows = await self.db.fetch(_SQL["search"], *args, query.limit, query.offset)
            if rows:
                total = int(rows[0]["total"])
            else:
                total = int(await self.db.fetchval(_SQL["count"], *args))
        except DatabaseUnavailable as exc:
            raise IndexUnavailable(f"postgres index: {exc}") from exc
        hits = tuple(
            SearchHit(archive_id=r["archive_id"], score=float(r["score"]), subject=r["subject"],
                      sender=r["sender"], sent_at=r["sent_at"],
                      snippet=render_snippet(r["snippet"] or ""))
            for r in rows)
        return SearchResult(total=total, hits=hits)

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
