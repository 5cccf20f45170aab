-- Guarantee 12 (a review): while an isolated job runs, its process was to
-- claim nothing else (0045), but two worker tasks of one process claiming
-- at once could break it. Task A takes the isolated job; task B skips that
-- locked row, and when A has committed before B's re-check ("is an
-- isolated job ready?"), B finds none ready and takes normal jobs on the
-- normal path, which never looked again whether its process runs one (38
-- of 2000 trials). If the isolated job was the poison, its death counted
-- the others too: nobody was charged, and all were isolated.
--
-- Now both paths meet on the per-process lock (class 1312902725) before
-- their last statement: the isolated path takes it exclusively (as
-- before), the normal path shared, and the normal path's last statement,
-- with its new snapshot, claims nothing while an isolated job of its
-- process runs (a probe of the nearly empty partial index
-- mail_index_jobs_isolated_running). Whichever commits first is seen by
-- the other: an isolated claim waits for the normal ones in flight and
-- then sees their jobs running; a normal claim waits for an isolated one
-- and then sees it. Normal claims share the lock, so they never wait for
-- each other.

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
    isolating boolean := false;
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
            -- One isolated claim at a time per process, and none beside a
            -- normal claim of the process in flight; then (a new
            -- snapshot) nothing of this process may be running.
            isolating := true;
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
    IF NOT isolating THEN
        PERFORM pg_advisory_xact_lock_shared(1312902725, hashtext(process));
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
       -- Nothing beside an isolated job of this process (see above).
       AND NOT EXISTS (
             SELECT 1
               FROM mail_index_jobs p
              WHERE p.status = 'processing'
                AND p.isolate
                AND regexp_replace(p.locked_by, '/[^/]*$', '') = process)
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
