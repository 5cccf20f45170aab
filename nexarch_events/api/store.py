"""What the API reads about archived messages beyond the index: where hits
were seen, and the archive side of an event stream's replay. (Queue reads
are ``Queue`` methods; these are archive reads, kept here until the archive
module grows them.)"""

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
