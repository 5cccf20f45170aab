"""pytest fixtures for projects that embed nexarch-events (loaded through
the ``pytest11`` entry point). Async fixtures: run the tests with pytest-trio.

- ``nexarch_loop``: the asyncio loop nexarch-events needs under trio.
- ``nexarch_database_url``: override it; the default reads
  ``NEXARCH_DATABASE_URL`` and fails the test with a clear message without it.
- ``nexarch_import_recorder``: an ImportRecorder listening for the test.
"""

from __future__ import annotations

import os
from collections.abc import AsyncIterator

import pytest

from ..aio import open_loop
from .recorder import ImportRecorder, record_imports


@pytest.fixture
async def nexarch_loop() -> AsyncIterator[None]:
    async with open_loop():
        yield


@pytest.fixture
def nexarch_database_url() -> str:
    url = os.environ.get("NEXARCH_DATABASE_URL")
    if not url:
        pytest.fail("nexarch_import_recorder needs a database: set NEXARCH_DATABASE_URL or "
                    "override the nexarch_database_url fixture")
    return url


@pytest.fixture
async def nexarch_import_recorder(nexarch_loop: None,
                                  nexarch_database_url: str) -> AsyncIterator[ImportRecorder]:
    async with record_imports(nexarch_database_url) as recorder:
        yield recorder
