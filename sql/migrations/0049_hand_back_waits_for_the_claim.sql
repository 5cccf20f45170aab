-- A worker that lost a claim's answer (its command timeout) hands back what
-- the claim took (release_unknown). The claim may still be running on the
-- server then: waiting for a lock, or for a synchronous standby. The hand-back
-- ran at once, found none of the worker's jobs in its snapshot, and the claim
-- committed after it: its jobs stayed 'processing', held by nobody, until
-- the sweeper charged them as suspects (a review; reproduced with a table
-- lock held across the claim).
--
-- Now every claim of a worker task holds that task's lock (class 1312902726,
-- hashtext of the worker id, which is unique per start) shared from its
-- first statement to its commit, and the hand-back takes it exclusively
-- before it looks: it waits for a claim still in flight, then sees what it
-- committed. A task claims one batch at a time, so claims never wait here
-- for each other; a hand-back waits only for its own task's claims.
--
-- The hand-back no longer leaves out jobs claimed more than stale_after ago:
-- that was for a dead process of the same name, and a name is unique per
-- start now (WorkerPool.instance). With the default timeouts (a command
-- timeout of 60 s, stale_after 30 s) it left out every job it was meant for.

CREATE FUNCTION mail_index_jobs_claim_fenced(batch integer, worker text)
RETURNS TABLE (id bigint, job_type text, tenant_slug text, message_id text, payload text,
               attempts integer, max_attempts integer, lease uuid, created_at timestamptz)
LANGUAGE plpgsql
AS $fn$
BEGIN
    PERFORM pg_advisory_xact_lock_shared(1312902726, hashtext(worker));
    RETURN QUERY SELECT * FROM mail_index_jobs_claim(batch, worker);
END;
$fn$;

CREATE FUNCTION mail_index_jobs_ack_and_claim_fenced(ack_ids bigint[], ack_leases uuid[],
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
    PERFORM pg_advisory_xact_lock_shared(1312902726, hashtext(worker));
    RETURN QUERY SELECT * FROM mail_index_jobs_ack_and_claim(
        ack_ids, ack_leases, ack_errors, ack_permanent, backoff_base, backoff_cap,
        batch, worker);
END;
$fn$;

-- Jobs worker_id holds that it does not know it holds (none of known), handed
-- back as a shutdown hands them back: attempt refunded. Each statement of a
-- plpgsql function takes a new snapshot, so the UPDATE sees what a claim
-- committed while the lock was awaited.
CREATE FUNCTION mail_index_jobs_release_unknown(worker_id text, known bigint[])
RETURNS SETOF bigint
LANGUAGE plpgsql
AS $fn$
BEGIN
    PERFORM pg_advisory_xact_lock(1312902726, hashtext(worker_id));
    RETURN QUERY
    WITH released AS (
        UPDATE mail_index_jobs j
           SET status = 'pending',
               attempts = GREATEST(j.attempts - 1, 0),
               available_at = now(),
               lease = NULL, locked_at = NULL, locked_by = NULL, heartbeat_at = NULL,
               updated_at = now()
         WHERE j.status = 'processing'
           AND j.locked_by = worker_id
           AND NOT (j.id = ANY (known))
     RETURNING j.id
    ),
    wake AS (
        SELECT pg_notify('nexarch_index_jobs', json_build_object(
                   'v', 1, 'event', 'released', 'ready', count(*),
                   'first_id', min(r.id), 'last_id', max(r.id), 'next_due', NULL)::text)
          FROM released r
        HAVING count(*) > 0
    )
    SELECT r.id FROM released r WHERE (SELECT count(*) FROM wake) >= 0;
END;
$fn$;
