-- Guarantee 3 ("one at a time, in enqueue order") still had a window
-- (a queue audit: with 2 processes x 4 workers, 11 of 300 messages had
-- their index and delete jobs running at once). Two claims in flight decide
-- from their own snapshots: claim A takes delete J2 while the index J1 of
-- the same message (a lower id, committed after A's snapshot) is invisible
-- to it; claim B, whose snapshot came after J1's commit but before A's,
-- sees J1 as the oldest open job of its key and J2 still pending, and takes
-- J1. Both commit: two jobs of one key running.
--
-- Now a claim first picks its candidates as before, then takes a
-- transaction-level advisory lock on each candidate's key (try: a key
-- another claim holds is skipped, as SKIP LOCKED skips rows), and only then,
-- in a second statement with a new snapshot, re-checks each candidate and
-- claims it. A claim that held one of these keys has committed before the
-- lock could be had, so the second statement sees what it claimed. The
-- locks (class 1312902724, beside the importer's 1312902721..3) end with
-- the claim's transaction.
--
-- Guarantee 12 with more than one worker task per process (the default is
-- 4): a job a dead worker held runs alone, but "alone" was per task, so
-- the other tasks of the process ran their own isolated jobs beside it, the
-- poison killed them all, and the innocent ones were charged as suspects
-- until they failed (a queue audit: 3 of 19 innocent jobs failed). Now:
-- * an isolated job is claimed only by a process with nothing running
--   (its worker tasks are the worker ids "<process>/<n>"), one claim at a
--   time per process (a transaction-level advisory lock, class 1312902725,
--   taken only on this path);
-- * while an isolated job is ready to run, no process claims other jobs:
--   busy processes finish what they hold, and the isolated jobs then run
--   one at a time per process; and while one runs, its process claims
--   nothing else (a partial index of running isolated jobs, nearly always
--   empty, makes that test one probe);
-- * the sweeper charges a job only if it was the only job running in its
--   process (queue.sql, reclaim_stale).
CREATE INDEX mail_index_jobs_isolated_running ON mail_index_jobs (id)
    WHERE status = 'processing' AND isolate;

CREATE OR REPLACE FUNCTION mail_index_jobs_claim(batch integer, worker text)
RETURNS TABLE (id bigint, job_type text, tenant_slug text, message_id text, payload text,
               attempts integer, max_attempts integer, lease uuid, created_at timestamptz)
LANGUAGE plpgsql
SET enable_sort = off
SET enable_seqscan = off
SET enable_bitmapscan = off
SET enable_hashjoin = off
SET enable_mergejoin = off
SET enable_material = off
AS $fn$
#variable_conflict use_column
DECLARE
    picked bigint[];
    process text := regexp_replace(worker, '/[^/]*$', '');
    running_alone boolean;
    isolated_ready boolean;
BEGIN
    -- One statement for the common case (no isolated job anywhere): does
    -- this process run an isolated job (then it runs alone), and is one
    -- ready (then nothing else starts until the isolated ones have run)?
    SELECT EXISTS (SELECT 1
                     FROM mail_index_jobs p
                    WHERE p.status = 'processing'
                      AND p.isolate
                      AND regexp_replace(p.locked_by, '/[^/]*$', '') = process),
           EXISTS (SELECT 1
                     FROM mail_index_jobs j
                    WHERE j.status = 'pending'
                      AND j.isolate
                      AND j.available_at <= now())
      INTO running_alone, isolated_ready;
    IF running_alone THEN
        RETURN;
    END IF;
    IF isolated_ready THEN
        -- A job a dead worker held runs alone (migration 0010): picked here,
        -- claimed below only if this process runs nothing else.
        SELECT array_agg(c.id) INTO picked
          FROM (SELECT j.id, j.tenant_slug, j.message_id
                  FROM mail_index_jobs j
                 WHERE j.status = 'pending'
                   AND j.isolate
                   AND j.available_at <= now()
                   AND NOT EXISTS (
                         SELECT 1
                           FROM mail_index_jobs other
                          WHERE other.tenant_slug = j.tenant_slug
                            AND other.message_id = j.message_id
                            AND other.id <> j.id
                            AND (other.status = 'processing'
                                 OR (other.status = 'pending' AND other.id < j.id)))
                 ORDER BY j.available_at, j.id
                 LIMIT 1
                   FOR UPDATE SKIP LOCKED) c
         WHERE pg_try_advisory_xact_lock(1312902724,
                                         hashtext(c.tenant_slug || '/' || c.message_id));
        IF picked IS NOT NULL THEN
            -- One isolated claim at a time per process; then (a new
            -- snapshot) nothing of this process may be running.
            PERFORM pg_advisory_xact_lock(1312902725, hashtext(process));
            IF EXISTS (SELECT 1
                         FROM mail_index_jobs p
                        WHERE p.status = 'processing'
                          AND regexp_replace(p.locked_by, '/[^/]*$', '') = process) THEN
                RETURN;
            END IF;
        ELSIF EXISTS (SELECT 1
                        FROM mail_index_jobs j
                       WHERE j.status = 'pending'
                         AND j.isolate
                         AND j.available_at <= now()
                         AND NOT EXISTS (
                               SELECT 1
                                 FROM mail_index_jobs other
                                WHERE other.tenant_slug = j.tenant_slug
                                  AND other.message_id = j.message_id
                                  AND other.id <> j.id
                                  AND (other.status = 'processing'
                                       OR (other.status = 'pending'
                                           AND other.id < j.id)))) THEN
            -- An isolated job can run (held by another claim, or this
            -- process is busy): nothing else starts meanwhile. (One that
            -- waits for an older job of its key does not hold others up.)
            RETURN;
        END IF;
    END IF;
    IF picked IS NULL THEN
        SELECT array_agg(c.id) INTO picked
          FROM (SELECT j.id, j.tenant_slug, j.message_id
                  FROM mail_index_jobs j
                 WHERE j.status = 'pending'
                   AND j.available_at <= now()
                   AND NOT j.isolate
                   -- Guarantee 3 (per-key enqueue order): only the oldest open
                   -- job of a (tenant, message) may run, and none while another
                   -- of the key runs. A job waiting for its retry still blocks
                   -- the jobs behind it.
                   AND NOT EXISTS (
                         SELECT 1
                           FROM mail_index_jobs other
                          WHERE other.tenant_slug = j.tenant_slug
                            AND other.message_id = j.message_id
                            AND other.id <> j.id
                            AND (other.status = 'processing'
                                 OR (other.status = 'pending' AND other.id < j.id)))
                 ORDER BY j.available_at, j.id
                 LIMIT batch
                   -- Guarantee 2: concurrent claimers skip rows another claim holds.
                   FOR UPDATE SKIP LOCKED) c
         WHERE pg_try_advisory_xact_lock(1312902724,
                                         hashtext(c.tenant_slug || '/' || c.message_id));
    END IF;
    IF picked IS NULL THEN
        RETURN;
    END IF;

    -- A new snapshot: the same test again, now that no other claim holds
    -- these keys. The rows are ours, still pending (locked above; no test
    -- of the status here, or the planner reads the whole backlog through
    -- the ready index instead of these rows by their ids).
    RETURN QUERY
    UPDATE mail_index_jobs j
       SET status = 'processing',
           attempts = j.attempts + 1,
           locked_at = now(),
           locked_by = worker,
           heartbeat_at = now(),
           lease = gen_random_uuid(),
           updated_at = now()
     WHERE j.id = ANY (picked)
       AND NOT EXISTS (
             SELECT 1
               FROM mail_index_jobs other
              WHERE other.tenant_slug = j.tenant_slug
                AND other.message_id = j.message_id
                AND other.id <> j.id
                AND (other.status = 'processing'
                     OR (other.status = 'pending' AND other.id < j.id)))
    RETURNING j.id, j.job_type, j.tenant_slug, j.message_id, j.payload::text AS payload,
              j.attempts, j.max_attempts, j.lease, j.created_at;
END;
$fn$;
