"""What the API reads about archived messages beyond the index: where hits
were seen, the archive side of an event stream's replay, and the highest
ids drawn (a stream's check of its cursor, which covers both sequences in
one round trip). (Queue reads are ``Queue`` methods; these are archive
reads, kept here until the archive module grows them.)"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from datetime import datetime

from ..aio import Executor
from ..db import sqlfiles
from ..models import validate_tenant_slug

_SQL = sqlfiles.queries("importer.sql")


@dataclass(frozen=True, slots=True)
class ArchivedMessage:
    """An archived message as an event stream replays it."""

    archive_id: int
    tenant_slug: str
    archived_at: datetime
    #: The first place it was seen; all None if it was stored without one.
    mailbox: str | None
    uidvalidity: int | None
    uid: int | None
    #: The folder of that mailbox (decoded); None if it is not registered.
    folder: str | None = None


@dataclass(frozen=True, slots=True)
class AllocatedIds:
    """The highest ids the database has drawn (0: none yet)."""

    archive_id: int
    job_id: int


async def mailboxes_of(db: Executor, tenant_slug: str,
                       archive_ids: Sequence[int]) -> dict[int, list[str]]:
    """The mailboxes each message of this tenant was seen in (ids of other
    tenants come back empty)."""
    validate_tenant_slug(tenant_slug)
    if not archive_ids:
        return {}
    rows = await db.fetch(_SQL["archive_mailboxes"], tenant_slug, [int(i) for i in archive_ids])
    return {row["archive_id"]: list(row["mailboxes"]) for row in rows}


async def archived_after(db: Executor, archive_id: int, *, tenant_slug: str | None,
                         limit: int) -> list[ArchivedMessage]:
    """Archived messages (of one tenant, or all) with a higher id, ascending."""
    rows = await db.fetch(_SQL["archived_after"], tenant_slug, int(archive_id), limit)
    return [ArchivedMessage(r["archive_id"], r["tenant_slug"], r["archived_at"], r["mailbox"],
                            r["uidvalidity"], r["uid"], r["folder"]) for r in rows]


async def newest_archive_id(db: Executor, *, tenant_slug: str | None) -> int:
    """The highest archive id (of one tenant, or all); 0 if there is none."""
    return int(await db.fetchval(_SQL["archive_max_id"], tenant_slug))


async def allocated_ids(db: Executor) -> AllocatedIds:
    """The highest archive and job ids drawn so far, of all tenants (an id
    above them was never this database's; importer.sql, "allocated_ids")."""
    row = await db.fetchrow(_SQL["allocated_ids"])
    assert row is not None  # one row, always
    return AllocatedIds(int(row["archive_id"]), int(row["job_id"]))
