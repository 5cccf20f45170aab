"""--handlers package.module:NAME (handlers.py load_handlers): a spec that
cannot work is a usage error naming what is wrong, at start. A relative
module name and a mapping whose keys are no job types ended the worker
with exit 70 (an operator audit)."""

from __future__ import annotations

import pytest

from nexarch_events.errors import ConfigurationError
from nexarch_events.handlers import LOGGING, load_handlers

NOT_JOB_TYPES = {"reindex": LOGGING["index"]}
NOT_CALLABLE = {"index": "log_jobs"}


@pytest.mark.parametrize(("spec", "message"), [
    ("../../etc:passwd", "expected 'package.module:NAME'"),
    ("os:", "expected 'package.module:NAME'"),
    ("no_such_module_xyz:H", "cannot import"),
    ("json:loads", "must be a mapping"),
    (f"{__name__}:NOT_JOB_TYPES", "no job type: 'reindex'"),
    (f"{__name__}:NOT_CALLABLE", "must be a handler"),
])
def test_a_spec_that_cannot_work_is_refused_naming_why(spec: str, message: str) -> None:
    with pytest.raises(ConfigurationError, match=message.replace("(", r"\(")):
        load_handlers(spec)


def test_a_good_spec_loads() -> None:
    assert load_handlers("nexarch_events.handlers:LOGGING") is LOGGING
