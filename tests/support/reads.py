"""How much of a table one call read, counted by Postgres rather than timed:
index entries returned by the table's indexes, and rows read by scans of the
whole table, inside one transaction."""

from __future__ import annotations

from collections.abc import AsyncIterator
from contextlib import asynccontextmanager

from nexarch_events.aio import Connection

_ENTRIES_READ = ("SELECT (SELECT sum(pg_stat_get_xact_tuples_returned(t))"
                 "          FROM unnest($1::regclass[]) AS t)"
                 " + coalesce(sum(pg_stat_get_xact_tuples_returned(indexrelid)), 0)"
                 " FROM pg_index WHERE indrelid = ANY($1::regclass[])")


@asynccontextmanager
async def entries_read(conn: Connection, *tables: str) -> AsyncIterator[list[int]]:
    """Index entries and sequentially scanned rows of ``tables`` the block
    read, in one transaction (the counter holds what was not yet flushed to
    the statistics, which is never done inside a transaction): ``read[0]``
    once the block has ended."""
    read = [0]
    async with conn.transaction():
        before = await conn.fetchval(_ENTRIES_READ, list(tables))
        yield read
        read[0] = int(await conn.fetchval(_ENTRIES_READ, list(tables)) - before)
