"""Handlers that only log, and loading handlers by name.

``nexarch-events worker`` indexes archived mail by default (``indexer.py``);
``--handlers module:NAME`` runs a mapping from job type to BatchHandler of
your own instead. ``LOGGING`` logs each job and succeeds: the queue demo
uses it, and it is a template for your own.
"""

from __future__ import annotations

import importlib
import logging
import re
from collections.abc import Mapping, Sequence

from .errors import ConfigurationError
from .models import ClaimedJob, Failure, JobId, JobType
from .queue.worker import BatchHandler

log = logging.getLogger(__name__)


async def log_jobs(jobs: Sequence[ClaimedJob]) -> Mapping[JobId, Failure]:
    for job in jobs:
        log.debug("handled job id=%d type=%s tenant=%s message_id=%s attempt=%d",
                  job.id, job.job_type, job.tenant_slug, job.message_id, job.attempts)
    return {}


LOGGING: Mapping[str, BatchHandler] = {"index": log_jobs, "delete": log_jobs}


def load_handlers(spec: str) -> Mapping[str, BatchHandler]:
    """``package.module:NAME`` -> that module's mapping of job type to handler."""
    module_name, _, attr = spec.partition(":")
    # Checked here, not where the workers first use them: a relative module
    # name or a key that is no job type ended the worker with exit 70 (an
    # operator audit).
    if not _DOTTED.fullmatch(module_name) or not attr.isidentifier():
        raise ConfigurationError(f"--handlers {spec!r}: expected 'package.module:NAME'")
    try:
        module = importlib.import_module(module_name)
    except ImportError as exc:
        raise ConfigurationError(
            f"--handlers {spec!r}: cannot import {module_name}: {exc}") from exc
    handlers = getattr(module, attr, None)
    if not isinstance(handlers, Mapping):
        raise ConfigurationError(
            f"--handlers {spec!r}: {attr} must be a mapping of job type to handler")
    types = {t.value for t in JobType}
    wrong = [k for k in handlers if k not in types]
    if wrong:
        raise ConfigurationError(f"--handlers {spec!r}: {attr} has keys that are no job type: "
                                 f"{', '.join(repr(k) for k in wrong[:5])} (job types: "
                                 f"{', '.join(sorted(types))})")
    if not all(callable(h) for h in handlers.values()):
        raise ConfigurationError(f"--handlers {spec!r}: every value of {attr} must be a "
                                 "handler (an async function of a batch of jobs)")
    return handlers


_DOTTED = re.compile(r"[A-Za-z_][A-Za-z0-9_]*(?:\.[A-Za-z_][A-Za-z0-9_]*)*")
