"""The trio/asyncio boundary survives asyncio's orphaned errors."""

from __future__ import annotations

import trio

from nexarch_events.aio import open_loop


async def test_an_orphaned_asyncio_error_does_not_end_the_program() -> None:
    # What asyncpg leaves behind when a connection dies during the TLS
    # negotiation of an abandoned connect: a future whose exception nobody
    # retrieves. trio-asyncio's default handler re-raised it into its
    # nursery and ended the whole worker process.
    async with open_loop() as loop:
        loop.call_exception_handler({
            "message": "Future exception was never retrieved",
            "exception": ConnectionError("unexpected connection_lost() call"),
        })
        await trio.sleep(0.1)  # the loop runs its callbacks; nothing raises
        survived = True
    assert survived
