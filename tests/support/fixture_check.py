"""A collection check: an async fixture named in ``usefixtures``.

Under pytest-trio, ``@pytest.mark.usefixtures("an_async_fixture")`` is
accepted and the fixture silently never runs (pytest-trio runs the async
fixtures a trio test asks for as arguments only). A test written that way
shows nothing about what the fixture was meant to set up (stop 25 hit it:
a filter test inserted nothing and failed for the wrong reason). The
conftest installs ``pytest_collection_modifyitems`` from here, so such a
test is a usage error that names the fixture.
"""

from __future__ import annotations

import inspect

import pytest


def async_fixtures_by_mark(item: pytest.Item) -> list[str]:
    """The async fixtures ``item`` names in a ``usefixtures`` mark."""
    info = getattr(item, "_fixtureinfo", None)
    defs = getattr(info, "name2fixturedefs", {}) if info is not None else {}
    found = []
    for mark in item.iter_markers("usefixtures"):
        for name in mark.args:
            chain = defs.get(name) or ()
            if chain and (inspect.iscoroutinefunction(chain[-1].func)
                          or inspect.isasyncgenfunction(chain[-1].func)):
                found.append(name)
    return found


def pytest_collection_modifyitems(items: list[pytest.Item]) -> None:
    wrong = [(item.nodeid, name) for item in items for name in async_fixtures_by_mark(item)]
    if wrong:
        raise pytest.UsageError(
            "async fixtures never run when named in @pytest.mark.usefixtures under "
            "pytest-trio; take them as arguments instead: "
            + ", ".join(f"{name} in {nodeid}" for nodeid, name in wrong))
