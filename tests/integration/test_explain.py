"""The claim must stay an index scan as finished history piles up."""

from __future__ import annotations

import json

from nexarch_events import sqlfiles
from nexarch_events.aio import Database


def plan_nodes(plan: dict[str, object]) -> list[dict[str, object]]:
    nodes = [plan]
    for child in plan.get("Plans", []):  # type: ignore[union-attr]
        nodes.extend(plan_nodes(child))  # type: ignore[arg-type]
    return nodes


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
    claim = sqlfiles.queries("queue.sql")["claim"]
    # EXPLAIN ANALYZE really runs the claim (this test's database is thrown away).
    raw = await db.fetchval(f"EXPLAIN (ANALYZE, FORMAT JSON) {claim}", 100, "explain")
    plan = json.loads(raw)[0]["Plan"]
    nodes = plan_nodes(plan)
    scans = {(n["Node Type"], n.get("Relation Name"), n.get("Index Name")) for n in nodes
             if "Scan" in str(n["Node Type"])}
    assert not any(t == "Seq Scan" for t, _, _ in scans), scans
    assert any(index == "mail_index_jobs_ready" for _, _, index in scans), scans
    assert any(index == "mail_index_jobs_key" for _, _, index in scans), scans
    claimed = [n for n in nodes if n["Node Type"] == "ModifyTable"]
    assert claimed and claimed[0]["Actual Rows"] == 100
    # The claim touched about as many rows as it claimed, not the history.
    ready_scan = next(n for n in nodes if n.get("Index Name") == "mail_index_jobs_ready")
    assert int(ready_scan["Actual Rows"]) <= 200  # type: ignore[call-overload]
