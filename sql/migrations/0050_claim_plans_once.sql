-- The claim planned its statements again on every call in some sessions
-- (issue 11, the trickle regime). plpgsql caches each statement's plan, but
-- a statement with parameters gets five custom plans first and then keeps
-- a generic one only if its estimated cost is no worse than the custom
-- plans'. For the claim's UPDATE by id (migration 0045) the outcome
-- depended on the table's statistics at the time: in a database filled by
-- earlier runs, every claim planned the UPDATE afresh, 0.2 ms of server
-- CPU per claim (single jobs, p50 per claim: 0.567 and 0.632 ms, against
-- 0.371 and 0.374 ms with generic plans in the same session); on fresh
-- databases it usually kept the generic plan. Luck, not settings, decided.
--
-- The planner has had one plan shape left since migration 0007 (index
-- scans and nested loops; no sequential or bitmap scan, sort, hash or
-- merge join, materialization), so a generic plan is that same shape, and
-- planning it once per session is all the claim needs.
-- tests/integration/test_explain.py checks the plans the claim caches.
ALTER FUNCTION mail_index_jobs_claim(integer, text)
    SET plan_cache_mode = force_generic_plan;
