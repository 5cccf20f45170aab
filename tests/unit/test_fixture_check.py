"""tests/support/fixture_check.py: a test that names an async fixture in
``usefixtures`` is refused at collection, in a real pytest run."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]

TESTS = '''
import pytest
ran = []

@pytest.fixture
async def set_up_rows():
    ran.append("rows")
    yield

@pytest.mark.usefixtures("set_up_rows")
async def test_named_in_a_mark():
    assert ran == ["rows"], "set_up_rows never ran"

async def test_taken_as_an_argument(set_up_rows):
    assert "rows" in ran
'''


def run_pytest(folder: Path, *, check: bool) -> subprocess.CompletedProcess[str]:
    (folder / "pytest.ini").write_text("[pytest]\ntrio_mode = true\n")
    (folder / "test_sample.py").write_text(TESTS)
    (folder / "conftest.py").write_text(
        "from tests.support.fixture_check import pytest_collection_modifyitems  # noqa\n"
        if check else "")
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    return subprocess.run([sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider",
                           "-p", "no:nexarch_events", str(folder)], cwd=folder, env=env,
                          capture_output=True, text=True, timeout=120, check=False)


@pytest.mark.parametrize("check", [False, True])
def test_an_async_fixture_in_usefixtures_is_refused(tmp_path: Path, check: bool) -> None:
    result = run_pytest(tmp_path, check=check)
    output = result.stdout + result.stderr
    if not check:
        # What the check is for: the mark is accepted and the fixture never runs.
        assert result.returncode == pytest.ExitCode.TESTS_FAILED, output
        assert "set_up_rows never ran" in output
    else:
        assert result.returncode == pytest.ExitCode.USAGE_ERROR, output
        assert "set_up_rows in test_sample.py::test_named_in_a_mark" in output
        assert "test_taken_as_an_argument" not in output.split("usefixtures")[-1]
