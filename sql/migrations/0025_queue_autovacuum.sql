-- Autovacuum of the job table at full speed. The service vacuums the table
-- itself (queue/vacuum.py) with VACUUM (SKIP_LOCKED), which skips the table
-- while autovacuum holds it; autovacuum's default cost delay (2 ms per 200
-- pages' worth of work) stretches its pass over a busy queue table to
-- minutes, all the while claims wade through dead row versions. The table
-- is small and hot, so its pass is short and better done at once.
ALTER TABLE mail_index_jobs SET (autovacuum_vacuum_cost_delay = 0);
