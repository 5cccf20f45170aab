-- The ack of one job (issue 11, the trickle regime: jobs arrive one at a
-- time and every ack is an ack of one job). The batch ack of migration 0006
-- pays for a whole batch's machinery on every call: unnest, three CTEs, a
-- window function and an aggregate to group the notifications. One job
-- needs one UPDATE by primary key and at most one notification. Same
-- outcome, same columns, same notification payloads as the batch ack (a
-- test compares the two: tests/integration/test_queue.py).
ALTER FUNCTION mail_index_jobs_ack(bigint[], uuid[], text[], boolean[], float8, integer)
    RENAME TO mail_index_jobs_ack_batch;

CREATE FUNCTION mail_index_jobs_ack(ack_ids bigint[], ack_leases uuid[], ack_errors text[],
                                    ack_permanent boolean[], backoff_base float8,
                                    backoff_cap integer)
RETURNS TABLE (id bigint, status text)
LANGUAGE plpgsql
AS $fn$
#variable_conflict use_column
DECLARE
    done record;
BEGIN
    IF cardinality(ack_ids) IS DISTINCT FROM 1 THEN
        RETURN QUERY
        SELECT b.id, b.status
          FROM mail_index_jobs_ack_batch(ack_ids, ack_leases, ack_errors, ack_permanent,
                                         backoff_base, backoff_cap) AS b;
        RETURN;
    END IF;

    -- The expressions of the batch ack, for its one row.
    UPDATE mail_index_jobs j
       SET status = CASE
                        WHEN ack_errors[1] IS NULL THEN 'succeeded'
                        WHEN ack_permanent[1] OR j.attempts >= j.max_attempts THEN 'failed'
                        ELSE 'pending'
                    END,
           available_at = CASE
                              WHEN ack_errors[1] IS NOT NULL AND NOT ack_permanent[1]
                                   AND j.attempts < j.max_attempts
                              THEN now() + LEAST(j.attempts, backoff_cap) * backoff_base
                                       * interval '1 second'
                              ELSE j.available_at
                          END,
           last_error = COALESCE(ack_errors[1], j.last_error),
           finished_at = CASE
                             WHEN ack_errors[1] IS NULL OR ack_permanent[1]
                                  OR j.attempts >= j.max_attempts
                             THEN now()
                         END,
           lease = NULL, locked_at = NULL, locked_by = NULL, heartbeat_at = NULL,
           updated_at = now()
     WHERE j.id = ack_ids[1]
       AND j.lease = ack_leases[1]
    RETURNING j.id, j.tenant_slug, j.status, j.available_at INTO done;
    IF NOT FOUND THEN
        RETURN;  -- the lease was taken over: a refused ack
    END IF;

    IF done.status IN ('succeeded', 'failed') THEN
        PERFORM pg_notify('nexarch_job_events', json_build_object(
                    'v', 1, 'event', done.status, 'tenant', done.tenant_slug,
                    'ids', ARRAY[done.id])::text);
    ELSE
        PERFORM pg_notify('nexarch_index_jobs', json_build_object(
                    'v', 1, 'event', 'retry_scheduled', 'ready', 0,
                    'next_due', extract(epoch FROM done.available_at))::text);
    END IF;
    id := done.id;
    status := done.status;
    RETURN NEXT;
END;
$fn$;

-- The ack, then a claim only if some job is ready at all. In the trickle
-- regime the claim after an ack finds nothing nearly every time; one probe
-- of the ready index (partial: pending rows only, so it stays small) costs
-- less than the claim's two locking statements finding nothing. A job
-- committed after the probe notifies, as it would after an empty claim.
CREATE OR REPLACE FUNCTION mail_index_jobs_ack_and_claim(ack_ids bigint[], ack_leases uuid[],
                                                         ack_errors text[],
                                                         ack_permanent boolean[],
                                                         backoff_base float8,
                                                         backoff_cap integer,
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
    IF NOT EXISTS (SELECT 1
                     FROM mail_index_jobs j
                    WHERE j.status = 'pending'
                      AND j.available_at <= now()) THEN
        RETURN;
    END IF;
    RETURN QUERY
    SELECT false, c.id, 'processing'::text, c.job_type, c.tenant_slug, c.message_id,
           c.payload, c.attempts, c.max_attempts, c.lease, c.created_at
      FROM mail_index_jobs_claim(batch, worker) AS c;
END;
$fn$;
