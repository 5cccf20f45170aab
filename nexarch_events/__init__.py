"""nexarch-events: mail archive ingestion and indexing on Postgres LISTEN/NOTIFY.

The public names. Everything runs under trio; ``nexarch_events.aio.run`` is
``trio.run`` with the asyncio loop asyncpg needs (see ``aio/``).
"""

from .aio import Database, open_loop, run
from .db.migrations import migrate
from .errors import (
    ConfigurationError,
    DatabaseError,
    DatabaseUnavailable,
    InvalidJobError,
    JobFailed,
    JobNotFound,
    MigrationError,
    NexarchError,
    NoJobAvailable,
)
from .index.base import (
    IndexBackend,
    IndexDocument,
    IndexRejected,
    IndexUnavailable,
    InvalidQuery,
    SearchHit,
    SearchQuery,
    SearchResult,
)
from .mail.archive import Archive, Archived, Location
from .mail.indexer import Indexer
from .models import (
    AckResult,
    ClaimedJob,
    Failure,
    Job,
    JobId,
    JobStatus,
    JobType,
    NewJob,
    QueueStats,
    RequeueResult,
)
from .queue.jobs import Queue
from .queue.notify import INDEX_JOBS_CHANNEL, JOB_EVENTS_CHANNEL, RESYNC, Listener, Notification
from .queue.worker import BatchHandler, WorkerPool, per_job
from .service import QueueService, serve
from .settings import QueueSettings, Settings

__all__ = [
    "INDEX_JOBS_CHANNEL", "JOB_EVENTS_CHANNEL", "RESYNC", "AckResult", "Archive", "Archived",
    "BatchHandler", "ClaimedJob", "ConfigurationError", "Database", "DatabaseError",
    "DatabaseUnavailable", "Failure", "IndexBackend", "IndexDocument", "IndexRejected",
    "IndexUnavailable", "Indexer", "InvalidJobError", "InvalidQuery", "Job", "JobFailed",
    "JobId", "JobNotFound", "JobStatus", "JobType", "Listener", "Location", "MigrationError",
    "NewJob", "NexarchError", "NoJobAvailable", "Notification", "Queue", "QueueService",
    "QueueSettings", "QueueStats", "RequeueResult", "SearchHit", "SearchQuery",
    "SearchResult", "Settings", "WorkerPool", "migrate", "open_loop", "per_job", "run",
    "serve",
]
