"""The trio/asyncio boundary lives in nexarch_events/aio/ and nowhere else."""

from __future__ import annotations

import ast
from pathlib import Path

PACKAGE = Path(__file__).resolve().parents[2] / "nexarch_events"
BANNED = {"asyncio", "asyncpg", "aioimaplib", "trio_asyncio"}


def imported_modules(path: Path) -> set[str]:
    names: set[str] = set()
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.Import):
            names |= {alias.name.split(".")[0] for alias in node.names}
        elif isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
            names.add(node.module.split(".")[0])
    return names


def test_only_aio_imports_asyncio_libraries() -> None:
    offenders = {}
    for path in PACKAGE.rglob("*.py"):
        if "aio" in path.relative_to(PACKAGE).parts[:1]:
            continue
        bad = imported_modules(path) & BANNED
        if bad:
            offenders[str(path.relative_to(PACKAGE))] = sorted(bad)
    assert offenders == {}


def test_the_boundary_does_import_them() -> None:
    # Guards the test above against checking the wrong folder.
    assert {"asyncpg", "trio_asyncio"} <= imported_modules(PACKAGE / "aio" / "pg.py")
