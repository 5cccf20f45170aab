"""The claim must stay an ordered index scan that stops at its limit, with a
long finished history and with a fresh backlog the planner has no statistics
for. The statement checked is the one deployed in the database: the body of
mail_index_jobs_claim(), run under the function's own settings, and the plan
checked is the one it runs: the generic plan, planned once and cached
(migration 0050), with the function's variables as parameters."""

from __future__ import annotations

import json
import re

from nexarch_events.aio import Database


def plan_nodes(plan: dict[str, object]) -> list[dict[str, object]]:
    nodes = [plan]
    for child in plan.get("Plans", []):  # type: ignore[union-attr]
        nodes.extend(plan_nodes(child))  # type: ignore[arg-type]
    return nodes


async def explain_cached(db: Database, query: str, types: str,
                         args: str) -> list[dict[str, object]]:
    """The plan ``query`` runs with in mail_index_jobs_claim(): prepared
    (parameters ``types``), then executed with ``args`` under the function's
    settings, which make the cached plan the generic one."""
    config = await db.fetchval(
        "SELECT proconfig FROM pg_proc WHERE proname = 'mail_index_jobs_claim'")
    assert "plan_cache_mode=force_generic_plan" in (config or []), config
    async with db.acquire() as conn, conn.transaction():
        for setting in config:
            name, value = setting.split("=", 1)
            await conn.execute(f"SET LOCAL {name} = {value}")
        await conn.execute(f"PREPARE claim_probe ({types}) AS {query}")
        try:
            raw = await conn.fetchval(
                f"EXPLAIN (ANALYZE, FORMAT JSON) EXECUTE claim_probe ({args})")
            generic = await conn.fetchval(
                "SELECT generic_plans FROM pg_prepared_statements WHERE name = 'claim_probe'")
        finally:
            await conn.execute("DEALLOCATE claim_probe")
    assert generic == 1, generic
    return plan_nodes(json.loads(raw)[0]["Plan"])


def as_parameters(query: str) -> str:
    """The claim's variables as parameters $1 batch, $2 process, $3 worker,
    $4 picked, as plpgsql passes them to a statement's plan."""
    query = re.sub(r"\bbatch\b", "$1", query)
    query = re.sub(r"= process\b", "= $2", query)
    query = re.sub(r"\bworker\b", "$3", query)
    return query.replace("ANY (picked)", "ANY ($4)")


CLAIM_TYPES = "integer, text, text, bigint[]"


async def claim_body(db: Database) -> str:
    body = await db.fetchval(
        "SELECT prosrc FROM pg_proc WHERE proname = 'mail_index_jobs_claim'")
    assert body is not None
    return str(body)


async def explain_claim(db: Database, limit: int, *, step: int = -1) -> list[dict[str, object]]:
    """The plan of one candidate pick of the claim (migration 0045: the
    rows are picked, their keys locked, then claimed by id): the last (the
    batch) unless ``step`` says otherwise (0: the pick of an isolated job)."""
    pick = "SELECT array_agg(c.id) INTO picked"
    body = await claim_body(db)
    query = "SELECT array_agg(c.id)" + body.split(pick)[1:][step].split(";")[0]
    return await explain_cached(db, as_parameters(query), CLAIM_TYPES,
                                f"{limit}, 'explain', 'explain/1', NULL")


def check_plan(nodes: list[dict[str, object]], limit: int) -> None:
    types = [n["Node Type"] for n in nodes]
    index_scans = {n.get("Index Name") for n in nodes if "Index Name" in n}
    assert "Seq Scan" not in types, types
    assert "Sort" not in types, types
    assert "Bitmap Heap Scan" not in types, types
    assert {"mail_index_jobs_ready", "mail_index_jobs_key"} <= index_scans, index_scans
    ready_scan = next(n for n in nodes if n.get("Index Name") == "mail_index_jobs_ready")
    # It read about as many ready rows as it claimed, not the backlog.
    assert int(ready_scan["Actual Rows"]) <= 2 * limit  # type: ignore[call-overload]
    picked = [n for n in nodes if n["Node Type"] == "LockRows"]
    assert picked and picked[0]["Actual Rows"] == limit


async def test_claim_uses_the_ready_index_over_a_long_history(db: Database) -> None:
    await db.execute("""
        INSERT INTO mail_index_jobs (job_type, tenant_slug, message_id, status, attempts,
                                     finished_at)
        SELECT 'index', 'tenant-' || (n % 50), 'old-' || n, 'succeeded', 1, now()
          FROM generate_series(1, 100000) AS n""")
    await db.execute("""
        INSERT INTO mail_index_jobs (job_type, tenant_slug, message_id)
        SELECT 'index', 'tenant-' || (n % 50), 'new-' || n
          FROM generate_series(1, 1000) AS n""")
    await db.execute("ANALYZE mail_index_jobs")
    check_plan(await explain_claim(db, 100), 100)


async def test_claim_stays_cheap_on_a_backlog_without_statistics(db: Database) -> None:
    # A fresh table and a sudden bulk enqueue, before autovacuum analyzed it:
    # left alone, the planner read all 20,000 ready rows and sorted them.
    await db.execute("""
        INSERT INTO mail_index_jobs (job_type, tenant_slug, message_id)
        SELECT 'index', 'acme', 'm' || n FROM generate_series(1, 20000) AS n""")
    check_plan(await explain_claim(db, 100), 100)


async def test_the_probe_for_an_isolated_job_uses_its_own_index(db: Database) -> None:
    await db.execute("""
        INSERT INTO mail_index_jobs (job_type, tenant_slug, message_id)
        SELECT 'index', 'acme', 'm' || n FROM generate_series(1, 20000) AS n""")
    await db.execute("UPDATE mail_index_jobs SET isolate = true WHERE id % 1000 = 0")
    nodes = await explain_claim(db, 1, step=0)
    types = [n["Node Type"] for n in nodes]
    assert "Seq Scan" not in types and "Sort" not in types, types
    scan = next(n for n in nodes if n.get("Index Name") == "mail_index_jobs_isolated")
    assert int(scan["Actual Rows"]) <= 2  # type: ignore[call-overload]
    picked = [n for n in nodes if n["Node Type"] == "LockRows"]
    assert picked and picked[0]["Actual Rows"] == 1


async def test_api_reads_of_finished_jobs_use_the_finished_index(db: Database) -> None:
    """GET /queue's throughput reads finished jobs by time: an index range,
    not a scan of every job ever finished. (The event stream's start is a
    function since migration 0030; tests/integration/test_finished_reads.py
    counts what it reads.)"""
    from nexarch_events.db import sqlfiles

    await db.execute("""
        INSERT INTO mail_index_jobs (job_type, tenant_slug, message_id, status, attempts,
                                     finished_at)
        SELECT 'index', 'tenant-' || (n % 50), 'old-' || n, 'succeeded', 1,
               now() - (n || ' seconds')::interval
          FROM generate_series(1, 100000) AS n""")
    await db.execute("ANALYZE mail_index_jobs")
    queries = sqlfiles.queries("queue.sql")
    for name, args in (("succeeded_within", ("tenant-7", 60.0)),):
        raw = await db.fetchval(f"EXPLAIN (ANALYZE, FORMAT JSON) {queries[name]}", *args)
        nodes = plan_nodes(json.loads(raw)[0]["Plan"])
        types = [n["Node Type"] for n in nodes]
        assert "Seq Scan" not in types, (name, types)
        assert any(n.get("Index Name") == "mail_index_jobs_finished" for n in nodes), \
            (name, types)


async def test_the_claim_by_id_after_the_key_locks_reads_only_its_rows(db: Database) -> None:
    """Migration 0045 claims the picked rows in a second statement: by
    primary key, with the per-key test probing the key index."""
    await db.execute("""
        INSERT INTO mail_index_jobs (job_type, tenant_slug, message_id)
        SELECT 'index', 'acme', 'm' || n FROM generate_series(1, 20000) AS n""")
    query = (await claim_body(db)).split("RETURN QUERY")[1].split(";")[0]
    nodes = await explain_cached(db, as_parameters(query), CLAIM_TYPES,
                                 "100, 'explain', 'explain/1', "
                                 f"'{{{','.join(map(str, range(1, 101)))}}}'")
    types = [n["Node Type"] for n in nodes]
    assert "Seq Scan" not in types and "Bitmap Heap Scan" not in types, types
    scans = {n.get("Index Name") for n in nodes if "Index Name" in n}
    # 0046: the probe for an isolated job of the process reads the nearly
    # empty partial index.
    assert {"mail_index_jobs_pkey", "mail_index_jobs_key",
            "mail_index_jobs_isolated_running"} <= scans, scans
    assert nodes[0]["Node Type"] == "ModifyTable" and nodes[0]["Actual Rows"] == 100
