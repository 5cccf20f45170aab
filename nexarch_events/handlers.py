"""Handlers that only log, and loading handlers by name.

``nexarch-events worker`` indexes archived mail by default (``indexer.py``);
``--handlers module:NAME`` runs a mapping from job type to BatchHandler of
your own instead. ``LOGGING`` logs each job and succeeds: the queue demo
uses it, and it is a template for your own.
"""

from __future__ import annotations

import importlib
import logging
from collections.abc import Mapping, Sequence

from .errors import ConfigurationError
from .models import ClaimedJob, Failure, JobId
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
    if not module_name or not attr:
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
    return handlers
