-- An event stream that resumes after job J replays what finished after J
-- did, by J's finish time as the table holds it now (queue.sql,
-- "finished_after"). Two ways that silently skipped events (found by an
-- audit, tests/integration/test_event_stream_cursor.py):
--
-- * J was re-queued since (POST /jobs/{id}/retry, `requeue`) and finished
--   again later, or is pending: its finish time moved, so what finished
--   between its first finish and now was skipped. A re-queue now stamps
--   requeued_at; a stream that resumes after a job re-queued since it was
--   announced cannot know where it stood and says "resync" instead.
-- * A job that finished after J was pruned while J was kept (failed jobs
--   are kept longer than succeeded ones): only "J itself pruned" was
--   checked. The greatest (finished_at, id) ever pruned is kept beside the
--   highest id; past J's, the stream says "resync".
--
-- Both are nullable or defaulted columns: no table rewrite.
ALTER TABLE mail_index_jobs ADD COLUMN requeued_at timestamptz;
ALTER TABLE mail_index_jobs_pruned
    ADD COLUMN max_finished_at timestamptz,
    ADD COLUMN max_finished_id bigint NOT NULL DEFAULT 0;
