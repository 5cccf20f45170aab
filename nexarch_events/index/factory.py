"""The configured index backend."""

from __future__ import annotations

from collections.abc import AsyncIterator
from contextlib import asynccontextmanager

from ..aio import Database
from ..settings import Settings
from .base import IndexBackend
from .postgres import PostgresIndex


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
        backend = PostgresIndex(db, configs=settings.search_languages)
    try:
        yield backend
    finally:
        await backend.aclose()
