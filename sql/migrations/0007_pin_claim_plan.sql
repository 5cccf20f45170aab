-- Pin the claim's plan to the one shape that stays cheap at any backlog:
-- an ordered scan of mail_index_jobs_ready that stops at the limit, and for
-- each candidate one index probe of mail_index_jobs_key for an older open job.
--
-- Found by the drain benchmark (20,000 jobs, 4 workers, 500 per claim): a
-- worker session had cached a plan whose anti-join walked the table for every
-- candidate (the backend spun in texteq for minutes, 100% CPU, O(n^2)), while
-- holding row locks that blocked the other workers' acks. Which plan a session
-- caches depends on the statistics when it first plans (often none, right
-- after a bulk enqueue), so settings, not luck, decide it: with sequential
-- scans, bitmap scans, sorts, hash/merge joins and materialization off, the
-- planner has the index plan left and nothing else.
ALTER FUNCTION mail_index_jobs_claim(integer, text)
    SET enable_seqscan = off
    SET enable_bitmapscan = off
    SET enable_hashjoin = off
    SET enable_mergejoin = off
    SET enable_material = off;
