-- Relevance pages are cut from one order (migration 0044): the first
-- p_rank_limit matches in storage order, best first, then the rest in
-- storage order. That order is the bitmap heap scan's, block by block,
-- but only when one process runs it: on a table large enough for a
-- parallel plan, Gather returns the workers' rows in whatever order they
-- come, so the same page asked for twice could list other messages, and a
-- client paging through saw some twice and missed others (a review; on a
-- scratch database with parallel plans cheap, 5 different contents in 8
-- calls of one page). The search runs in one process now; the date sorts
-- order explicitly and lose nothing worth a parallel plan on the machines
-- this runs on (measured: the same time per call on 2 cores).
ALTER FUNCTION nexarch_mail_search(regconfig[], text, text, text, timestamptz, timestamptz,
                                   text, int, int, int, int, timestamptz, timestamptz, text)
    SET max_parallel_workers_per_gather = 0;
