"""The index job queue: jobs and their SQL (``jobs``), the LISTEN
connection fanned out to trio channels (``notify``), the workers
(``worker``) and the sweeper (``sweeper``)."""

from .jobs import Queue
from .notify import (
    IMPORT_REQUESTS_CHANNEL,
    INDEX_JOBS_CHANNEL,
    JOB_EVENTS_CHANNEL,
    MAIL_IMPORTED_CHANNEL,
    RESYNC,
    Listener,
    Notification,
)
from .worker import BatchHandler, WorkerPool, per_job

__all__ = ["IMPORT_REQUESTS_CHANNEL", "INDEX_JOBS_CHANNEL", "JOB_EVENTS_CHANNEL",
           "MAIL_IMPORTED_CHANNEL", "RESYNC", "BatchHandler", "Listener", "Notification",
           "Queue", "WorkerPool", "per_job"]
