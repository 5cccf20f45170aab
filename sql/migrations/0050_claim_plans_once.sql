-- The claim planned its statements again on every call (issue 11, the
-- trickle regime). plpgsql caches each statement's plan, but a statement
-- with parameters gets five custom plans first and then keeps a generic
-- one only if its estimated cost is no worse than the custom plans'. The
-- claim's UPDATE by id (migration 0045) never passed that test: with one
-- picked id the custom plan is costed for one row, the generic one for
-- the default share of an array, so every claim planned it afresh. That
-- was 0.2 ms of server CPU per claim, about as much as the whole claim
-- statement of the raw floor (bench/diag_sql.py, single jobs: 0.567 ms
-- before, 0.371 ms with generic plans).
--
-- The planner has had one plan shape left since migration 0007 (index
-- scans and nested loops; no sequential or bitmap scan, sort, hash or
-- merge join, materialization), so a generic plan is that same shape, and
-- planning it once per session is all the claim needs.
-- tests/integration/test_explain.py checks the plans the claim caches.
ALTER FUNCTION mail_index_jobs_claim(integer, text)
    SET plan_cache_mode = force_generic_plan;
