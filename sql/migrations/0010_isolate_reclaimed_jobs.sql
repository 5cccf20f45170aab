-- Poison jobs fail alone (guarantee 12). When a worker dies holding a batch,
-- nobody knows which of its jobs killed it. The sweeper refunds the attempt
-- of every job of a batch larger than one and marks them `isolate`; an
-- isolated job is only ever claimed alone, so the next death pins the job
-- that caused it, and only that job is charged an attempt (see
-- reclaim_stale in sql/queue.sql). Jobs claimed together share locked_by and
-- locked_at (the claim statement's now()), which is how the sweeper tells
-- a batch from a job that ran alone.

ALTER TABLE mail_index_jobs ADD COLUMN isolate boolean NOT NULL DEFAULT false;

-- Isolated jobs ready to run: normally empty, so the claim's probe for one
-- is a lookup in an empty index.
CREATE INDEX mail_index_jobs_isolated
    ON mail_index_jobs (available_at, id)
 WHERE status = 'pending' AND isolate;

-- The claim of migration 0004 with the planner settings of 0007 (CREATE OR
-- REPLACE replaces those too, so they are repeated here), now in two steps:
-- an isolated job first, alone; otherwise a batch of jobs that are not.
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
BEGIN
    RETURN QUERY
    WITH candidates AS (
        SELECT j.id
          FROM mail_index_jobs j
         WHERE j.status = 'pending'
           AND j.isolate
           AND j.available_at <= now()
           AND NOT EXISTS (
                 SELECT 1
                   FROM mail_index_jobs older
                  WHERE older.tenant_slug = j.tenant_slug
                    AND older.message_id = j.message_id
                    AND older.id < j.id
                    AND older.status IN ('pending', 'processing'))
         ORDER BY j.available_at, j.id
         LIMIT 1
           FOR UPDATE SKIP LOCKED
    )
    UPDATE mail_index_jobs j
       SET status = 'processing',
           attempts = j.attempts + 1,
           locked_at = now(),
           locked_by = worker,
           heartbeat_at = now(),
           lease = gen_random_uuid(),
           updated_at = now()
      FROM candidates c
     WHERE j.id = c.id
    RETURNING j.id, j.job_type, j.tenant_slug, j.message_id, j.payload::text AS payload,
              j.attempts, j.max_attempts, j.lease, j.created_at;
    IF FOUND THEN
        RETURN;
    END IF;

    RETURN QUERY
    WITH candidates AS (
        SELECT j.id
          FROM mail_index_jobs j
         WHERE j.status = 'pending'
           AND j.available_at <= now()
           AND NOT j.isolate
           -- Guarantee 3 (per-key enqueue order): only the oldest open job of a
           -- (tenant, message) may run. A job waiting for its retry still blocks
           -- the jobs behind it, so a later delete cannot be overtaken by an
           -- earlier index that is retried afterwards.
           AND NOT EXISTS (
                 SELECT 1
                   FROM mail_index_jobs older
                  WHERE older.tenant_slug = j.tenant_slug
                    AND older.message_id = j.message_id
                    AND older.id < j.id
                    AND older.status IN ('pending', 'processing'))
         ORDER BY j.available_at, j.id
         LIMIT batch
           -- Guarantee 2: concurrent claimers skip rows another claim holds.
           FOR UPDATE SKIP LOCKED
    )
    UPDATE mail_index_jobs j
       SET status = 'processing',
           attempts = j.attempts + 1,
           locked_at = now(),
           locked_by = worker,
           heartbeat_at = now(),
           lease = gen_random_uuid(),
           updated_at = now()
      FROM candidates c
     WHERE j.id = c.id
    RETURNING j.id, j.job_type, j.tenant_slug, j.message_id, j.payload::text AS payload,
              j.attempts, j.max_attempts, j.lease, j.created_at;
END;
$fn$;
