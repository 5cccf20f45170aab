-- Acknowledgement as a function, so that a worker can acknowledge a batch
-- and claim the next in one round trip (mail_index_jobs_ack_and_claim): on
-- this kind of machine a round trip through the trio/asyncio bridge costs
-- more CPU than the statement itself. The ack runs first, so the claim sees
-- its effects (a job blocked behind one just finished becomes claimable).
--
-- The ack: one statement for a whole batch, successes and failures alike.
-- ack_errors NULL = success. A row whose lease no longer matches (taken over
-- after a stale heartbeat) is not touched and not returned: the caller counts
-- it as a refused ack. The two notify CTEs are plain SELECTs, which Postgres
-- evaluates only when referenced, hence the (always true) conditions.
CREATE FUNCTION mail_index_jobs_ack(ack_ids bigint[], ack_leases uuid[], ack_errors text[],
                                    ack_permanent boolean[], backoff_base float8,
                                    backoff_cap integer)
RETURNS TABLE (id bigint, status text)
LANGUAGE plpgsql
AS $fn$
#variable_conflict use_column
BEGIN
    RETURN QUERY
    WITH acks AS (
        SELECT a.id, a.lease, a.error, a.permanent
          FROM unnest(ack_ids, ack_leases, ack_errors, ack_permanent)
               AS a(id, lease, error, permanent)
    ),
    done AS (
        UPDATE mail_index_jobs j
           SET status = CASE
                            WHEN a.error IS NULL THEN 'succeeded'
                            WHEN a.permanent OR j.attempts >= j.max_attempts THEN 'failed'
                            ELSE 'pending'
                        END,
               -- Seed backoff: min(attempts, cap) x base.
               available_at = CASE
                                  WHEN a.error IS NOT NULL AND NOT a.permanent
                                       AND j.attempts < j.max_attempts
                                  THEN now() + LEAST(j.attempts, backoff_cap) * backoff_base
                                           * interval '1 second'
                                  ELSE j.available_at
                              END,
               last_error = COALESCE(a.error, j.last_error),
               finished_at = CASE
                                 WHEN a.error IS NULL OR a.permanent
                                      OR j.attempts >= j.max_attempts
                                 THEN now()
                             END,
               lease = NULL, locked_at = NULL, locked_by = NULL, heartbeat_at = NULL,
               updated_at = now()
          FROM acks a
         WHERE j.id = a.id
           AND j.lease = a.lease
     RETURNING j.id, j.tenant_slug, j.status, j.available_at
    ),
    finished AS (
        -- One notification per (outcome, tenant) and at most 200 ids, which keeps
        -- every payload far below Postgres' 8000-byte limit.
        SELECT pg_notify('nexarch_job_events', json_build_object(
                   'v', 1, 'event', g.status, 'tenant', g.tenant_slug, 'ids', g.ids)::text)
          FROM (SELECT d.status, d.tenant_slug, array_agg(d.id ORDER BY d.id) AS ids
                  FROM (SELECT id, status, tenant_slug,
                               (row_number() OVER (PARTITION BY status, tenant_slug ORDER BY id) - 1) / 200
                                   AS chunk
                          FROM done
                         WHERE status IN ('succeeded', 'failed')) d
                 GROUP BY d.status, d.tenant_slug, d.chunk) g
    ),
    retries AS (
        -- Every process's sweeper learns when the earliest retry falls due.
        SELECT pg_notify('nexarch_index_jobs', json_build_object(
                   'v', 1, 'event', 'retry_scheduled', 'ready', 0,
                   'next_due', extract(epoch FROM min(available_at)))::text)
          FROM done
         WHERE status = 'pending'
        HAVING count(*) > 0
    )
    -- The two notify CTEs are plain SELECTs: Postgres evaluates them only when
    -- referenced, hence the (always true) conditions.
    SELECT d.id, d.status
      FROM done d
     WHERE (SELECT count(*) FROM finished) >= 0
       AND (SELECT count(*) FROM retries) >= 0;
END;
$fn$;

CREATE FUNCTION mail_index_jobs_ack_and_claim(ack_ids bigint[], ack_leases uuid[],
                                              ack_errors text[], ack_permanent boolean[],
                                              backoff_base float8, backoff_cap integer,
                                              batch integer, worker text)
RETURNS TABLE (acked boolean, id bigint, status text, job_type text, tenant_slug text,
               message_id text, payload text, attempts integer, max_attempts integer,
               lease uuid, created_at timestamptz)
LANGUAGE plpgsql
AS $fn$
BEGIN
    RETURN QUERY
    SELECT true, a.id, a.status, NULL::text, NULL::text, NULL::text, NULL::text,
           NULL::integer, NULL::integer, NULL::uuid, NULL::timestamptz
      FROM mail_index_jobs_ack(ack_ids, ack_leases, ack_errors, ack_permanent,
                               backoff_base, backoff_cap) AS a;
    RETURN QUERY
    SELECT false, c.id, 'processing'::text, c.job_type, c.tenant_slug, c.message_id,
           c.payload, c.attempts, c.max_attempts, c.lease, c.created_at
      FROM mail_index_jobs_claim(batch, worker) AS c;
END;
$fn$;
