-- Guarantee 3 said "one at a time", but the claim refused a job only while
-- an OLDER job of its (tenant, message) was open. An id is drawn at INSERT
-- and seen at COMMIT: a job enqueued in a transaction that commits after a
-- later-id job of the same key was already running was claimed beside it,
-- and the two ran at once, their outcomes announced newest first (a race
-- audit, with a plain-SQL producer). Now any running job of the key blocks
-- the claim too. Such a late job runs after the running one: "enqueue
-- order" is the order in which the jobs became visible (docs/events.md).
-- The extra probe uses the same index (mail_index_jobs_key) as before.
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
                   FROM mail_index_jobs other
                  WHERE other.tenant_slug = j.tenant_slug
                    AND other.message_id = j.message_id
                    AND other.id <> j.id
                    AND (other.status = 'processing'
                         OR (other.status = 'pending' AND other.id < j.id)))
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
           -- (tenant, message) may run, and none while another of the key runs.
           -- A job waiting for its retry still blocks the jobs behind it, so a
           -- later delete cannot be overtaken by an earlier index that is
           -- retried afterwards.
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
