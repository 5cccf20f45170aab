"""The trio/asyncio boundary: the only package that imports asyncio,
trio_asyncio, asyncpg or aioimaplib. Everything it exports is trio-flavored."""

from .pg import (
    Connection,
    Database,
    Executor,
    ListenConnection,
    Row,
    execute_sync,
    open_loop,
    run,
)

__all__ = ["Connection", "Database", "Executor", "ListenConnection", "Row", "execute_sync",
           "open_loop", "run"]
