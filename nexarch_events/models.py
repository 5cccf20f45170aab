"""Frozen value types of the queue, and validation of what producers send."""

from __future__ import annotations

import functools
import json
import math
import re
import uuid
from collections.abc import Mapping
from dataclasses import dataclass, field
from datetime import datetime
from enum import StrEnum
from typing import NewType, TypeAlias

from .errors import InvalidJobError

JobId = NewType("JobId", int)
LeaseToken = NewType("LeaseToken", uuid.UUID)
JSONValue: TypeAlias = (
    "bool | int | float | str | list[JSONValue] | dict[str, JSONValue] | None"
)
JSONObject: TypeAlias = dict[str, JSONValue]

#: Largest payload, as serialized JSON bytes. The same bound is a CHECK
#: constraint in sql/migrations, so plain-SQL producers are held to it too.
MAX_PAYLOAD_BYTES = 1024 * 1024
#: RFC 5322's line limit: no real Message-ID header is longer.
MAX_MESSAGE_ID_LENGTH = 998
DEFAULT_MAX_ATTEMPTS = 5

_TENANT_SLUG = re.compile(r"[a-z0-9](?:[a-z0-9-]{0,61}[a-z0-9])?")


class JobType(StrEnum):
    INDEX = "index"
    DELETE = "delete"


class JobStatus(StrEnum):
    PENDING = "pending"
    PROCESSING = "processing"
    SUCCEEDED = "succeeded"
    FAILED = "failed"


def validate_tenant_slug(value: object) -> str:
    """Return ``value`` if it is a valid tenant slug, else raise InvalidJobError.

    Slugs are DNS labels: 1-63 characters of ``a-z``, ``0-9`` and inner ``-``.
    Anything built from a slug (a Manticore table name) relies on this.
    """
    if not isinstance(value, str):
        raise InvalidJobError(f"tenant slug must be a string, got {type(value).__name__}")
    if not value:
        raise InvalidJobError("tenant slug is empty")
    if len(value) > 63:
        raise InvalidJobError(f"tenant slug is {len(value)} characters long; the limit is 63")
    if not _TENANT_SLUG.fullmatch(value):
        raise InvalidJobError(
            f"tenant slug {value[:63]!r} is invalid: use a-z, 0-9 and inner '-' only")
    return value


def validate_message_id(value: object) -> str:
    if not isinstance(value, str):
        raise InvalidJobError(f"message id must be a string, got {type(value).__name__}")
    if not value:
        raise InvalidJobError("message id is empty")
    if len(value) > MAX_MESSAGE_ID_LENGTH:
        raise InvalidJobError(
            f"message id is {len(value)} characters long; the limit is {MAX_MESSAGE_ID_LENGTH}")
    if "\x00" in value:
        raise InvalidJobError("message id contains a NUL character")
    return value


def encode_payload(payload: object) -> str:
    """Serialize a job payload, rejecting what jsonb or the size bound would refuse."""
    if not isinstance(payload, Mapping):
        raise InvalidJobError(
            f"payload must be a JSON object (a mapping), got {type(payload).__name__}")
    try:
        # allow_nan=False: NaN/Infinity are not JSON and jsonb rejects them.
        # Default separators (", ", ": ") and raw UTF-8 are how jsonb prints a
        # value, so the size measured here is the size the table's CHECK
        # measures (octet_length(payload::text)).
        text = json.dumps(payload, ensure_ascii=False, allow_nan=False)
    except (TypeError, ValueError) as exc:
        raise InvalidJobError(f"payload is not serializable as JSON: {exc}") from exc
    if _contains_nul(payload):
        raise InvalidJobError("payload contains a NUL character (U+0000), which jsonb cannot store")
    try:
        size = len(text.encode("utf-8"))
    except UnicodeEncodeError as exc:
        raise InvalidJobError(f"payload is not valid Unicode: {exc.reason}") from exc
    if size > MAX_PAYLOAD_BYTES:
        raise InvalidJobError(
            f"payload is {size} bytes as JSON; the limit is {MAX_PAYLOAD_BYTES}")
    return text


@functools.cache
def _controls(keep: str) -> re.Pattern[str]:
    kept = "".join(f"\\x{ord(c):02x}" for c in keep)
    return re.compile(f"(?![{kept}])[\x00-\x1f\x7f-\x9f\ud800-\udfff]" if keep
                      else "[\x00-\x1f\x7f-\x9f\ud800-\udfff]")


def escape_controls(text: str, *, keep: str = "") -> str:
    """``text`` with every control character (C0, DEL and C1) but those in
    ``keep``, and every lone surrogate, written as an escape (``\\x0a``,
    ``\\udcff``): the one rule for text from outside that is stored,
    logged or shown (a bare LF would start a forged log line; a lone
    surrogate cannot be encoded at all)."""
    return _controls(keep).sub(_escape, text)


def storable_text(text: str, limit: int) -> str:
    """Text from outside (a server's answer, a handler's error) for a text
    column read by people: Postgres refuses a NUL in text, a control
    character garbles a terminal, and a lone surrogate (JSON may carry
    ``"\\udcff"``) cannot be encoded at all, which failed the whole ack and
    the worker with it (a retry-loop audit). Each is written as an escape
    (``\\x00``, ``\\udcff``); past ``limit`` characters the rest is cut, and
    the cut says how much."""
    text = escape_controls(text, keep="\t\n")
    if len(text) <= limit:
        return text
    return text[:limit] + f"... [{len(text) - limit} characters cut]"


def _escape(match: re.Match[str]) -> str:
    code = ord(match.group())
    return f"\\u{code:04x}" if code > 0xFF else f"\\x{code:02x}"


def _contains_nul(value: object) -> bool:
    stack = [value]
    while stack:
        item = stack.pop()
        if isinstance(item, str):
            if "\x00" in item:
                return True
        elif isinstance(item, Mapping):
            stack.extend(item.keys())
            stack.extend(item.values())
        elif isinstance(item, (list, tuple)):
            stack.extend(item)
    return False


@dataclass(frozen=True, slots=True)
class NewJob:
    """A job to enqueue. Validated on construction: a bad job raises here,
    before any statement is sent."""

    job_type: JobType
    tenant_slug: str
    message_id: str
    payload: Mapping[str, JSONValue] = field(default_factory=dict)
    max_attempts: int = DEFAULT_MAX_ATTEMPTS
    delay_s: float = 0.0
    payload_json: str = field(init=False, repr=False, compare=False)

    def __post_init__(self) -> None:
        try:
            job_type = JobType(self.job_type)
        except ValueError:
            raise InvalidJobError(
                f"unknown job type {self.job_type!r}; expected one of "
                f"{', '.join(t.value for t in JobType)}") from None
        object.__setattr__(self, "job_type", job_type)
        validate_tenant_slug(self.tenant_slug)
        validate_message_id(self.message_id)
        if isinstance(self.max_attempts, bool) or not isinstance(self.max_attempts, int) \
                or not 1 <= self.max_attempts <= 1000:
            raise InvalidJobError(
                f"max_attempts must be an integer from 1 to 1000, got {self.max_attempts!r}")
        if not isinstance(self.delay_s, (int, float)) or not math.isfinite(self.delay_s) \
                or self.delay_s < 0:
            raise InvalidJobError(
                f"delay must be a finite number of seconds >= 0, got {self.delay_s!r}")
        object.__setattr__(self, "payload_json", encode_payload(self.payload))


@dataclass(frozen=True, slots=True)
class ClaimedJob:
    """A job this worker holds. ``lease`` must accompany every ack."""

    id: JobId
    job_type: JobType
    tenant_slug: str
    message_id: str
    payload: JSONObject
    attempts: int
    max_attempts: int
    lease: LeaseToken
    enqueued_at: datetime


@dataclass(frozen=True, slots=True)
class Job:
    """A job's row as an operator sees it (status lookup)."""

    id: JobId
    job_type: JobType
    tenant_slug: str
    message_id: str
    status: JobStatus
    attempts: int
    max_attempts: int
    available_at: datetime
    locked_by: str | None
    last_error: str | None
    created_at: datetime
    updated_at: datetime
    finished_at: datetime | None


@dataclass(frozen=True, slots=True)
class Failure:
    """Why one job of a batch failed. ``permanent`` skips the retries.

    ``outage``: not the job's fault, something it needs is out of reach or
    busy (the index or the database down, a lock timeout). The job is
    retried after the usual backoff, but the attempt is refunded: an outage
    longer than the retries (five in about 100 s by default) failed every
    job that met it for good, and their mail never became searchable (a
    crash audit). Only for errors that cannot be the job's own doing."""

    error: str
    permanent: bool = False
    outage: bool = False


@dataclass(frozen=True, slots=True)
class AckResult:
    """What an acknowledgement did. ``refused`` are jobs whose lease had been
    taken over (zombie acks): their outcome was not recorded."""

    statuses: Mapping[JobId, JobStatus]
    refused: tuple[JobId, ...]


@dataclass(frozen=True, slots=True)
class RequeueResult:
    requeued: tuple[JobId, ...]
    #: failed jobs left alone because a newer job of their message exists.
    superseded: tuple[JobId, ...]


@dataclass(frozen=True, slots=True)
class QueueStats:
    counts: Mapping[JobStatus, int]
    oldest_ready_age_s: float | None
