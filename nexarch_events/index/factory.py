"""The configured index backend."""

from __future__ import annotations

from collections.abc import AsyncIterator
from contextlib import asynccontextmanager

from ..aio import Database
from ..db import sqlfiles
from ..errors import ConfigurationError
from ..settings import Settings
from .base import IndexBackend
from .postgres import PostgresIndex

_SQL = sqlfiles.queries("search.sql")


@asynccontextmanager
async def open_index(settings: Settings, db: Database) -> AsyncIterator[IndexBackend]:
    """The backend ``settings.index_backend`` names; closed on exit."""
    backend: IndexBackend
    if settings.index_backend == "manticore":
        from .manticore import ManticoreBackend

        assert settings.manticore_url is not None  # Settings validated it
        backend = ManticoreBackend(settings.manticore_url,
                                   timeout=settings.manticore_timeout)
    else:
        await check_search_languages(db, settings.search_languages)
        backend = PostgresIndex(db, configs=settings.search_languages)
    try:
        yield backend
    finally:
        await backend.aclose()


async def check_search_languages(db: Database, languages: tuple[str, ...]) -> None:
    """Each configured language is a text-search configuration of this
    server. The settings check only the spelling: one the server lacks
    passed `config check`, then failed every search (exit 70) and every
    index job for good (an operator audit)."""
    found = {row["cfgname"] for row in await db.fetch(_SQL["text_search_configs"],
                                                      list(languages))}
    missing = [lang for lang in languages if lang not in found]
    if missing:
        raise ConfigurationError(
            f"search_languages (NEXARCH_SEARCH_LANGUAGES): this Postgres has no text-search "
            f"configuration {', '.join(repr(m) for m in missing)} (the ones it has: "
            "pg_ts_config)")
