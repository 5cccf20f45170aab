-- Finished jobs by finish time: the HTTP API reads them by time (GET /queue's
-- throughput, the event stream's start and resume), and without this index
-- each of those scanned the whole table, which keeps every succeeded job.
-- Partial: pending and processing rows (the hot part of the queue) are not
-- in it; an ack adds one entry. Measured with bench/queue_bench.py --only
-- drain (best configuration, ratio to the raw floor in the same run):
-- 0.60 before, see the commit message for after.
CREATE INDEX mail_index_jobs_finished
    ON mail_index_jobs (finished_at, id)
 WHERE status IN ('succeeded', 'failed');
