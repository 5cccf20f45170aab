-- The claim as a function, for one reason: the planner setting below must
-- apply to this statement and nothing else. Without fresh statistics (a new
-- table, a sudden backlog) the planner reads every ready job, probes each for
-- an older job of its message, and sorts them all - for a LIMIT of 100 (100 ms
-- at 20,000 ready jobs, growing with the backlog). With sorting off, the only
-- plan left is the ordered scan of mail_index_jobs_ready, which stops at the
-- limit. plpgsql keeps the plan per session. It is also a stable entry point
-- for workers written in other languages:
--   SELECT * FROM mail_index_jobs_claim(100, 'my-worker');
CREATE FUNCTION mail_index_jobs_claim(batch integer, worker text)
RETURNS TABLE (id bigint, job_type text, tenant_slug text, message_id text, payload text,
               attempts integer, max_attempts integer, lease uuid, created_at timestamptz)
LANGUAGE plpgsql
SET enable_sort = off
AS $fn$
#variable_conflict use_column
BEGIN
    RETURN QUERY
    WITH candidates AS (
        SELECT j.id
          FROM mail_index_jobs j
         WHERE j.status = 'pending'
           AND j.available_at <= now()
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
