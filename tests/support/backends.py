"""Index backends for tests, by name: 'postgres' on the test database,
'manticore' on a real server (MANTICORE_URL) or on the in-process stand-in."""

from __future__ import annotations

import os
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager

from nexarch_events.aio import Database
from nexarch_events.index.base import IndexBackend
from nexarch_events.index.postgres import PostgresIndex


@asynccontextmanager
async def open_backend(name: str, db: Database) -> AsyncIterator[IndexBackend]:
    if name == "postgres":
        yield PostgresIndex(db)
        return
    if name == "manticore":
        from nexarch_events.index.manticore import ManticoreBackend
        from tests.support.manticore_standin import open_manticore_standin

        url = os.environ.get("MANTICORE_URL")
        if url:
            # A real server: a table prefix of this test's own keeps runs apart.
            backend = ManticoreBackend(url, table_prefix=f"t{os.getpid()}_{id(db) % 10**6}_")
            try:
                yield backend
            finally:
                await backend.aclose()
            return
        async with open_manticore_standin() as standin:
            backend = ManticoreBackend(standin.url)
            try:
                yield backend
            finally:
                await backend.aclose()
        return
    raise ValueError(f"unknown backend {name!r}")
