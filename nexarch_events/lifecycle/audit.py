"""The audit log: who erased, held or retained what, and when.

One row per erasure, retention pass, hold change and retention setting
(``mail_audit_log``, migration 0021). Never message content: archive ids
(at most ``MAX_AUDIT_IDS``; ``mail_erasures`` keeps every erased id with
the row's id), the operator's query, counts. The actor is the OS user for
the CLI and the token's name for the API.
"""

from __future__ import annotations

import json
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from datetime import datetime
from enum import StrEnum
from typing import cast

from ..aio import Executor
from ..db import sqlfiles
from ..errors import InvalidJobError
from ..models import JSONObject, JSONValue, validate_tenant_slug

_SQL = sqlfiles.queries("lifecycle.sql")

#: Ids listed in one audit row; the rest are in mail_erasures.
MAX_AUDIT_IDS = 1000
MAX_ACTOR = 200
MAX_LIST = 1000


class AuditAction(StrEnum):
    ERASE = "erase"
    ERASE_QUERY = "erase_query"
    ERASE_TENANT = "erase_tenant"
    RETENTION_PASS = "retention_pass"
    HOLD_ADD = "hold_add"
    HOLD_REMOVE = "hold_remove"
    RETENTION_SET = "retention_set"


@dataclass(frozen=True, slots=True)
class AuditEntry:
    id: int
    at: datetime
    actor: str
    action: AuditAction
    tenant_slug: str
    target: JSONObject
    count: int


def validate_actor(actor: object) -> str:
    """An actor name: 1-200 printable characters."""
    if not isinstance(actor, str) or not actor.strip():
        raise InvalidJobError("the audit actor (who is acting) must be a non-empty name")
    if len(actor) > MAX_ACTOR or not actor.isprintable():
        raise InvalidJobError(f"the audit actor must be at most {MAX_ACTOR} printable "
                              "characters")
    return actor


def id_list(ids: Sequence[int]) -> list[JSONValue]:
    """Ids for an audit row's target: the first MAX_AUDIT_IDS, ascending."""
    return [int(i) for i in sorted(ids)[:MAX_AUDIT_IDS]]


async def record(db: Executor, *, actor: str, action: AuditAction, tenant_slug: str,
                 target: Mapping[str, JSONValue], count: int) -> int:
    """Write one audit row (in the caller's transaction when ``db`` is a
    connection inside one); returns its id."""
    validate_actor(actor)
    validate_tenant_slug(tenant_slug)
    row = await db.fetchrow(_SQL["audit_insert"], actor, action.value, tenant_slug,
                            json.dumps(dict(target)), int(count))
    assert row is not None
    return int(row["id"])


async def entries(db: Executor, *, tenant_slug: str | None, limit: int = 100,
                  before: int | None = None, action: AuditAction | None = None
                  ) -> list[AuditEntry]:
    """Audit rows, newest first: of one tenant, or every tenant's (None)."""
    if tenant_slug is not None:
        validate_tenant_slug(tenant_slug)
    if not 1 <= limit <= MAX_LIST:
        raise InvalidJobError(f"limit must be 1..{MAX_LIST}, got {limit}")
    rows = await db.fetch(_SQL["audit_list"], tenant_slug, before, limit,
                          None if action is None else action.value)
    return [AuditEntry(id=r["id"], at=r["at"], actor=r["actor"],
                       action=AuditAction(r["action"]), tenant_slug=r["tenant_slug"],
                       target=cast(JSONObject, json.loads(r["target"])), count=r["count"])
            for r in rows]
