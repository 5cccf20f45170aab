"""Fenced writes on Manticore: versions that only grow and tombstones
(index/manticore.py module doc), against the stand-in, which answers as a
real server does where it matters here: ``insert`` of an existing id is
refused with "duplicate id", a ``/bulk`` against one table is one
transaction, a delete by query removes what its filters match (mail-notes
3.2 and 6), and ALTER TABLE ADD COLUMN gives old documents the default.
"""

from __future__ import annotations

import json
import uuid
from collections.abc import AsyncIterator

import pytest

from nexarch_events.index.base import SearchQuery, WriteFence
from nexarch_events.index.manticore import ManticoreBackend
from nexarch_events.models import JobId, LeaseToken
from tests.support.manticore_standin import ManticoreStandIn, open_manticore_standin
from tests.unit.test_manticore_client import TABLE, doc, raw


@pytest.fixture
async def standin() -> AsyncIterator[ManticoreStandIn]:
    async with open_manticore_standin() as server:
        yield server


@pytest.fixture
async def backend(standin: ManticoreStandIn) -> AsyncIterator[ManticoreBackend]:
    async with ManticoreBackend(standin.url, timeout=2.0, verify=False) as client:
        yield client


def fence(job_id: int) -> WriteFence:
    return WriteFence(JobId(job_id), LeaseToken(uuid.uuid4()))


async def listed(backend: ManticoreBackend) -> set[int]:
    """What search shows: the empty query lists every document."""
    result = await backend.search(SearchQuery("acme", "", limit=100))
    return {hit.archive_id for hit in result.hits}


async def test_a_fenced_delete_leaves_a_tombstone_no_older_write_can_replace(
        standin: ManticoreStandIn, backend: ManticoreBackend) -> None:
    await backend.upsert([doc(1, subject="first"), doc(2)], [fence(5), fence(5)])
    assert await listed(backend) == {1, 2}
    assert standin.table(TABLE).docs[1]["version"] == 5

    await backend.delete("acme", [1], [fence(7)])
    stored = standin.table(TABLE).docs[1]
    assert (stored["deleted"], stored["version"], stored["subject"]) == (True, 7, "")
    assert await listed(backend) == {2}
    assert await backend.document_ids("acme") == {2}  # a tombstone is no document

    # The zombie: job 5 writes again after the delete of job 7.
    await backend.upsert([doc(1, subject="zombie")], [fence(5)])
    assert standin.table(TABLE).docs[1]["version"] == 7
    assert await listed(backend) == {2}
    assert (await backend.search(SearchQuery("acme", "zombie"))).total == 0

    # A later job (a newer version) does write over the tombstone ...
    await backend.upsert([doc(1, subject="again")], [fence(9)])
    assert await listed(backend) == {1, 2}
    # ... and the old delete, landing late, leaves it alone.
    await backend.delete("acme", [1], [fence(7)])
    assert await listed(backend) == {1, 2}
    assert standin.table(TABLE).docs[1]["subject"] == "again"


async def test_a_first_index_is_one_insert_request_and_a_reindex_replaces_older(
        standin: ManticoreStandIn, backend: ManticoreBackend) -> None:
    await backend.ensure_schema("acme")
    before = len(standin.requests_to("/bulk"))
    await backend.upsert([doc(1, subject="old"), doc(2, subject="old")], [fence(3), fence(3)])
    assert len(standin.requests_to("/bulk")) == before + 1
    inserted = standin.requests_to("/bulk")[-1].body.decode().splitlines()
    assert all("insert" in json.loads(line) for line in inserted)

    # A batch mixing an older and a newer version than stored: only the
    # newer one is written.
    await backend.upsert([doc(1, subject="newer"), doc(2, subject="older")],
                         [fence(4), fence(2)])
    docs = standin.table(TABLE).docs
    assert (docs[1]["subject"], docs[1]["version"]) == ("newer", 4)
    assert (docs[2]["subject"], docs[2]["version"]) == ("old", 3)
    # The same version again (a job and its zombie): the first one stays.
    await backend.upsert([doc(1, subject="same")], [fence(4)])
    assert standin.table(TABLE).docs[1]["subject"] == "newer"


async def test_a_fenced_delete_on_a_tenant_without_a_table_still_leaves_a_tombstone(
        standin: ManticoreStandIn, backend: ManticoreBackend) -> None:
    """The delete may run before any index write made the table: the
    zombie's write that comes later must still meet the tombstone."""
    await backend.delete("acme", [4], [fence(8)])
    await backend.upsert([doc(4)], [fence(6)])
    assert await listed(backend) == set()
    assert standin.table(TABLE).docs[4]["deleted"] is True


async def test_unfenced_writes_stay_unconditional(
        standin: ManticoreStandIn, backend: ManticoreBackend) -> None:
    await backend.upsert([doc(1, subject="a")], [fence(9)])
    await backend.upsert([doc(1, subject="b")])  # a tool writing alone
    assert standin.table(TABLE).docs[1]["subject"] == "b"
    await backend.delete("acme", [1])
    assert 1 not in standin.table(TABLE).docs


async def test_a_table_from_before_the_fence_gets_its_columns(
        standin: ManticoreStandIn, backend: ManticoreBackend) -> None:
    old_schema = ("CREATE TABLE nexarch_mail_acme (subject text, body text, sender text, "
                  "recipients text, attachment_names text, attachment_text text, "
                  "sender_address string, sender_ids multi64, mailbox_ids multi64, "
                  "sent_at bigint, dated bool, size_bytes bigint)")
    response = await raw(standin, "/sql?mode=raw", old_schema, "text/plain")
    assert response.status_code == 200
    response = await raw(standin, "/replace", json.dumps(
        {"table": TABLE, "id": 3, "doc": {"subject": "kept from before", "dated": True}}))
    assert response.status_code == 200

    # Search works at once (it adds the columns when the server names them
    # unknown), and the old document reads as version 0, not deleted.
    assert await listed(backend) == {3}
    assert set(standin.table(TABLE).columns) >= {"version", "deleted"}
    assert standin.table(TABLE).docs[3]["version"] == 0
    await backend.ensure_schema("acme")  # no SchemaMismatch
    await backend.upsert([doc(3, subject="rewritten")], [fence(1)])
    assert standin.table(TABLE).docs[3]["subject"] == "rewritten"
