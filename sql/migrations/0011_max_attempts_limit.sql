-- The README promises that the database holds every producer, plain SQL
-- included, to max_attempts 1-1000 (the Python API's bound, models.NewJob);
-- migration 0001 checked only >= 1. An integer range is cheap enough to stay
-- a CHECK, re-checked on every update (the costly checks are triggers, 0005).
ALTER TABLE mail_index_jobs
    DROP CONSTRAINT mail_index_jobs_attempts,
    ADD CONSTRAINT mail_index_jobs_attempts
        CHECK (attempts >= 0 AND max_attempts BETWEEN 1 AND 1000);
