-- Every job outcome notification (nexarch_job_events) names the finish it
-- announces: `finished_at`, the job row's finished_at in UTC with
-- microseconds. A job can finish more than once: a failed job retried by
-- the operator (POST /jobs/{id}/retry, `requeue`) finishes again. The
-- event stream (api/events.py) drops a live event it already sent from the
-- tables; keyed on job and outcome alone, it also dropped the second
-- "failed" of such a job. Keyed on the finish, only a
-- true repeat is dropped.
--
-- One text form for the notification and for the stream's replay, which
-- reads finished_at from the table: independent of the session's TimeZone.
CREATE FUNCTION nexarch_utc_stamp(t timestamptz) RETURNS text
LANGUAGE sql STABLE
AS $$ SELECT to_char(t AT TIME ZONE 'UTC', 'YYYY-MM-DD"T"HH24:MI:SS.US"Z"') $$;

-- The batch ack of 0006 (renamed by 0024), restated with the new field.
CREATE OR REPLACE FUNCTION mail_index_jobs_ack_batch(ack_ids bigint[], ack_leases uuid[],
                                                     ack_errors text[], ack_permanent boolean[],
                                                     backoff_base float8, backoff_cap integer)
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
                   'v', 1, 'event', g.status, 'tenant', g.tenant_slug, 'ids', g.ids,
                   'finished_at', nexarch_utc_stamp(now()))::text)
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

-- The one-job ack of 0024, restated with the new field.
CREATE OR REPLACE FUNCTION mail_index_jobs_ack(ack_ids bigint[], ack_leases uuid[], ack_errors text[],
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
                    'ids', ARRAY[done.id], 'finished_at', nexarch_utc_stamp(now()))::text);
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
