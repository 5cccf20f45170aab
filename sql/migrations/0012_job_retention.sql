-- Retention: finished jobs older than queue.retain_succeeded /
-- queue.retain_failed are deleted in small batches (the sweeper, or
-- `nexarch-events prune`; the statement is "prune" in sql/queue.sql).
--
-- The highest job id ever pruned, so that an event stream resuming after a
-- job that is gone can tell "pruned" from "never finished" and say so
-- instead of silently skipping (api/events.py). One row.
CREATE TABLE mail_index_jobs_pruned (
    one     boolean PRIMARY KEY DEFAULT true CHECK (one),
    max_id  bigint  NOT NULL DEFAULT 0
);
INSERT INTO mail_index_jobs_pruned DEFAULT VALUES;
