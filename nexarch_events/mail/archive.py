"""The archive: raw messages, once per tenant and content hash, with every
place they were seen. Archiving and enqueuing the index job are one
transaction: both or neither.

The index job's queue key (``message_id``) is the archive id, so jobs for one
archived message run in enqueue order (a delete after an index wins).
"""

from __future__ import annotations

import hashlib
from collections.abc import Sequence
from dataclasses import dataclass
from datetime import datetime

from ..aio import Database
from ..db import sqlfiles
from ..errors import InvalidJobError
from ..models import JobId, validate_tenant_slug

_SQL = sqlfiles.queries("archive.sql")

#: Largest message accepted (the table's CHECK says the same).
MAX_MESSAGE_BYTES = 128 * 1024 * 1024
MAX_MAILBOX_NAME = 1000


@dataclass(frozen=True, slots=True)
class Location:
    """Where a message was seen: RFC 3501 says mailbox + UIDVALIDITY + UID name
    one immutable message forever."""

    mailbox: str
    uidvalidity: int
    uid: int

    def __post_init__(self) -> None:
        if not self.mailbox or len(self.mailbox) > MAX_MAILBOX_NAME or "\x00" in self.mailbox:
            raise InvalidJobError(f"mailbox name {self.mailbox[:60]!r} is empty, too long "
                                  f"or contains NUL")
        if not 0 <= self.uidvalidity <= 2**32 - 1:
            raise InvalidJobError(f"UIDVALIDITY {self.uidvalidity} outside 0..2^32-1")
        if not 1 <= self.uid <= 2**32 - 1:
            raise InvalidJobError(f"UID {self.uid} outside 1..2^32-1")


@dataclass(frozen=True, slots=True)
class Archived:
    archive_id: int
    #: False: these bytes were archived before (for this tenant).
    created: bool
    #: The index job enqueued with it (None when not created).
    job_id: JobId | None
    location_added: bool


@dataclass(frozen=True, slots=True)
class StoredMessage:
    archive_id: int
    tenant_slug: str
    raw: bytes
    size_bytes: int
    mailboxes: tuple[str, ...]
    #: The earliest INTERNALDATE of its locations (None: unknown).
    received_at: datetime | None = None


@dataclass(frozen=True, slots=True)
class SeenAt:
    mailbox: str
    uidvalidity: int
    uid: int
    seen_at: datetime


def content_hash(raw: bytes) -> bytes:
    return hashlib.sha256(raw).digest()


class Archive:
    def __init__(self, db: Database) -> None:
        self.db = db

    async def store(self, tenant_slug: str, raw: bytes,
                    location: Location | None = None) -> Archived:
        """Archive ``raw`` for a tenant (once), enqueue its index job if new,
        and record where it was seen. One transaction."""
        validate_tenant_slug(tenant_slug)
        if not isinstance(raw, bytes | bytearray | memoryview):
            raise InvalidJobError(f"message must be bytes, got {type(raw).__name__}")
        raw = bytes(raw)
        if not raw:
            raise InvalidJobError("message is empty (0 bytes)")
        if len(raw) > MAX_MESSAGE_BYTES:
            raise InvalidJobError(
                f"message is {len(raw)} bytes; the limit is {MAX_MESSAGE_BYTES}")
        digest = content_hash(raw)
        args = (tenant_slug, digest, len(raw), raw,
                location.mailbox if location else None,
                location.uidvalidity if location else None,
                location.uid if location else None)
        row = await self.db.fetchrow(_SQL["store"], *args)
        assert row is not None  # the function always returns its one row
        return Archived(archive_id=row["id"], created=row["created"],
                        job_id=None if row["job_id"] is None else JobId(row["job_id"]),
                        location_added=row["location_added"])

    async def load(self, keys: Sequence[tuple[str, int]]) -> dict[int, StoredMessage]:
        """Stored messages by archive id; each key is (tenant, id), so a
        request can never read another tenant's message. Missing ids are absent."""
        if not keys:
            return {}
        rows = await self.db.fetch(_SQL["load"], [t for t, _ in keys], [i for _, i in keys])
        return {row["id"]: StoredMessage(row["id"], row["tenant_slug"], bytes(row["raw"]),
                                         row["size_bytes"], tuple(row["mailboxes"]),
                                         row["received_at"])
                for row in rows}

    async def delete(self, tenant_slug: str, archive_id: int) -> JobId | None:
        """Delete a message and enqueue its removal from the index (one
        transaction). Returns the delete job's id, None if there was no such
        message in that tenant."""
        validate_tenant_slug(tenant_slug)
        row = await self.db.fetchrow(_SQL["delete"], tenant_slug, int(archive_id))
        return None if row is None else JobId(row["job_id"])

    async def locations(self, tenant_slug: str, archive_id: int) -> list[SeenAt]:
        rows = await self.db.fetch(_SQL["locations"], tenant_slug, int(archive_id))
        return [SeenAt(r["mailbox"], r["uidvalidity"], r["uid"], r["seen_at"]) for r in rows]

    async def ids(self, tenant_slug: str, *, page: int = 5000) -> list[int]:
        """Every archive id of a tenant, ascending."""
        out: list[int] = []
        after = 0
        while True:
            rows = await self.db.fetch(_SQL["ids_page"], tenant_slug, after, page)
            out.extend(r["id"] for r in rows)
            if len(rows) < page:
                return out
            after = rows[-1]["id"]

    async def tenants(self) -> list[str]:
        return [r["tenant_slug"] for r in await self.db.fetch(_SQL["tenants"])]
