-- A job that met an outage (queue.sql, postpone) had its attempt refunded
-- every time, without bound, and always waited the first backoff: a job
-- whose own work looks like an outage (a document that crashes the server
-- session or the search server behind a proxy) ran every 10 s for ever and
-- never ended failed (a review audit). The refunds are counted here: the
-- wait doubles with them, and past a budget (queue/jobs.py,
-- OUTAGE_RETRIES) the attempt is charged as any failure's.
ALTER TABLE mail_index_jobs
    ADD COLUMN outage_retries integer NOT NULL DEFAULT 0,
    ADD CONSTRAINT mail_index_jobs_outage_retries CHECK (outage_retries >= 0);
