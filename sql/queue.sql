-- Named queries of the index job queue. Loaded once by nexarch_events.sqlfiles;
-- each block starts with "-- name: <name>". Notification channels and payloads
-- are the public event contract: docs/events.md.

-- name: enqueue
-- One INSERT statement for any number of jobs: the statement trigger sends
-- one notification for the whole batch. ORDER BY ord makes identity values
-- follow input order, so the caller can map ids back by sorting.
INSERT INTO mail_index_jobs
       (job_type, tenant_slug, message_id, payload, max_attempts, available_at)
SELECT t.job_type, t.tenant_slug, t.message_id, t.payload::jsonb, t.max_attempts,
       now() + t.delay_s * interval '1 second'
  FROM unnest($1::text[], $2::text[], $3::text[], $4::text[], $5::int[], $6::float8[])
       WITH ORDINALITY AS t(job_type, tenant_slug, message_id, payload, max_attempts, delay_s, ord)
 ORDER BY t.ord
RETURNING id;

-- name: enqueue_one
-- The same INSERT for one job, the producer's common case (issue 11: a job
-- per archived message): plain values instead of six one-element arrays
-- unnested, numbered and sorted. Same columns, defaults, trigger (checks and
-- notification) and result.
INSERT INTO mail_index_jobs
       (job_type, tenant_slug, message_id, payload, max_attempts, available_at)
VALUES ($1::text, $2::text, $3::text, $4::text::jsonb, $5::int,
        now() + $6::float8 * interval '1 second')
RETURNING id;

-- name: claim
-- $1 limit, $2 worker id. Claims up to $1 ready jobs in one statement; the
-- statement and the reasons for each clause are in migrations 0004 to 0046;
-- it holds the worker's lock until it commits (0049: a hand-back waits for it).
SELECT id, job_type, tenant_slug, message_id, payload, attempts, max_attempts, lease, created_at
  FROM mail_index_jobs_claim_fenced($1::int, $2::text);

-- name: ack
-- One statement acknowledges a whole batch, successes and failures alike
-- (migration 0006 has the statement and the reasons for each clause).
-- $1 ids, $2 leases, $3 errors (NULL = success), $4 permanent flags,
-- $5 backoff base seconds, $6 backoff cap (attempts).
SELECT id, status
  FROM mail_index_jobs_ack($1::bigint[], $2::uuid[], $3::text[], $4::bool[], $5::float8,
                           $6::int);

-- name: ack_and_claim
-- The ack above, then a claim of up to $7 jobs for worker $8, in one round
-- trip. Rows with acked = true are ack results, the others claimed jobs.
SELECT acked, id, status, job_type, tenant_slug, message_id, payload, attempts,
       max_attempts, lease, created_at
  FROM mail_index_jobs_ack_and_claim_fenced($1::bigint[], $2::uuid[], $3::text[], $4::bool[],
                                            $5::float8, $6::int, $7::int, $8::text);

-- name: heartbeat
-- $1 ids, $2 leases. Returns the ids whose lease is still held. Rows are
-- locked in id order first, as the fenced index writes lock them
-- (search.sql upsert/delete): a heartbeat and a write of the same process
-- wait for each other, never deadlock.
WITH held AS (
    SELECT j.id
      FROM mail_index_jobs j, unnest($1::bigint[], $2::uuid[]) AS a(id, lease)
     WHERE j.id = a.id
       AND j.lease = a.lease
     ORDER BY j.id
       FOR NO KEY UPDATE OF j
)
UPDATE mail_index_jobs j
   SET heartbeat_at = now()
  FROM held h
 WHERE j.id = h.id
RETURNING j.id;

-- name: release
-- Shutdown: hand unfinished jobs back, refunding the attempt the claim took,
-- and wake the workers of every process.
WITH released AS (
    UPDATE mail_index_jobs j
       SET status = 'pending',
           attempts = GREATEST(j.attempts - 1, 0),
           available_at = now(),
           lease = NULL, locked_at = NULL, locked_by = NULL, heartbeat_at = NULL,
           updated_at = now()
      FROM unnest($1::bigint[], $2::uuid[]) AS a(id, lease)
     WHERE j.id = a.id
       AND j.lease = a.lease
 RETURNING j.id
),
wake AS (
    SELECT pg_notify('nexarch_index_jobs', json_build_object(
               'v', 1, 'event', 'released', 'ready', count(*),
               'first_id', min(id), 'last_id', max(id), 'next_due', NULL)::text)
      FROM released
    HAVING count(*) > 0
)
SELECT r.id FROM released r WHERE (SELECT count(*) FROM wake) >= 0;

-- name: release_unknown
-- Jobs worker $1 holds that it does not know it holds: claimed by a claim or
-- an ack whose answer never came back (a command timeout after the commit),
-- none of $2 (the jobs it knows). Handed back as a shutdown hands them back
-- (attempt refunded); without this they waited out stale_after and were
-- charged as suspects (a queue audit). The function first waits for a claim
-- of the worker still running on the server (migration 0049).
SELECT id FROM mail_index_jobs_release_unknown($1::text, $2::bigint[]) AS r(id);

-- name: postpone
-- Jobs that met an outage (models.Failure.outage: the index or the database
-- out of reach or busy, not the job's fault): pending again, with the
-- error, and the attempt the claim took refunded, so that an outage longer
-- than the retries does not fail a job for good. The wait doubles with each
-- refund (base, 2x, 4x, ... up to 32x backoff base); a job refunded $5
-- times already is not postponed (not returned): the caller charges it as
-- any failure (migration 0039). Every process's sweeper learns when the
-- first falls due, as after an ack.
-- $1 ids, $2 leases, $3 errors, $4 backoff base seconds, $5 refund budget.
WITH postponed AS (
    UPDATE mail_index_jobs j
       SET status = 'pending',
           attempts = GREATEST(j.attempts - 1, 0),
           outage_retries = j.outage_retries + 1,
           available_at = now() + make_interval(
               secs => power(2, LEAST(j.outage_retries, 5)) * $4::float8),
           last_error = a.error,
           lease = NULL, locked_at = NULL, locked_by = NULL, heartbeat_at = NULL,
           updated_at = now()
      FROM unnest($1::bigint[], $2::uuid[], $3::text[]) AS a(id, lease, error)
     WHERE j.id = a.id
       AND j.lease = a.lease
       AND j.outage_retries < $5::int
 RETURNING j.id, j.available_at
),
wake AS (
    SELECT pg_notify('nexarch_index_jobs', json_build_object(
               'v', 1, 'event', 'retry_scheduled', 'ready', 0,
               'next_due', extract(epoch FROM min(available_at)))::text)
      FROM postponed
    HAVING count(*) > 0
)
SELECT p.id FROM postponed p WHERE (SELECT count(*) FROM wake) >= 0;

-- name: reclaim_stale
-- $1 stale-after seconds. A lease whose heartbeat is older than that belongs
-- to a dead worker (a live one heartbeats several times per period).
-- Guarantee 12: a job that ran alone in its process (no other job of the
-- process's worker tasks, "<process>/<n>", was running) is the suspect: its
-- attempt counts, so a message that kills its worker every time ends
-- 'failed' after max_attempts instead of looping forever. The jobs of a
-- process that ran more are not charged (any one of them may have been the
-- culprit, or none: the process may have died of something else); they are
-- marked isolate and run alone in their process from now on (migrations
-- 0010, 0045). "Alone" was once per claim: the other tasks' jobs, dying
-- with the poison, were charged (a queue audit).
--
-- A process is judged once, when all of its jobs are stale: the count is of
-- every job it holds. Its jobs go stale at different moments (one claimed
-- after its last heartbeat later), and a count of the stale ones judged
-- each of two in turn "alone" and charged both (a review); a count of the
-- rows this statement locked split a batch between two sweepers at once.
-- A process's name is unique per start (WorkerPool.instance), so a restart
-- under the same name is another process. One exception: a job stale for
-- twice $1 beside fresh ones of its process (one the process does not know
-- it holds: a claim's or an ack's answer was lost, and handing it back
-- failed too) is taken back without waiting for them, not charged and not
-- isolated (its process lives on). Held alone by a live, idle process, such
-- a job is judged like any other.
WITH stale AS (
    SELECT j.id, j.locked_by
      FROM mail_index_jobs j
     WHERE j.status = 'processing'
       AND j.heartbeat_at < now() - $1::float8 * interval '1 second'
       AND (j.heartbeat_at < now() - 2 * $1::float8 * interval '1 second'
            OR NOT EXISTS (
                 SELECT 1
                   FROM mail_index_jobs live
                  WHERE live.status = 'processing'
                    AND live.heartbeat_at >= now() - $1::float8 * interval '1 second'
                    AND regexp_replace(live.locked_by, '/[^/]*$', '')
                        = regexp_replace(j.locked_by, '/[^/]*$', '')))
       FOR UPDATE SKIP LOCKED
),
claims AS (
    SELECT s.id, p.batch, p.fresh
      FROM stale s,
           LATERAL (SELECT count(*) AS batch,
                           count(*) FILTER (
                               WHERE o.heartbeat_at >= now() - $1::float8 * interval '1 second')
                               AS fresh
                      FROM mail_index_jobs o
                     WHERE o.status = 'processing'
                       AND regexp_replace(o.locked_by, '/[^/]*$', '')
                           = regexp_replace(s.locked_by, '/[^/]*$', '')) p
),
moved AS (
    UPDATE mail_index_jobs j
       SET status = CASE WHEN c.batch = 1 AND j.attempts >= j.max_attempts
                         THEN 'failed' ELSE 'pending' END,
           finished_at = CASE WHEN c.batch = 1 AND j.attempts >= j.max_attempts THEN now() END,
           attempts = CASE WHEN c.batch = 1 THEN j.attempts ELSE GREATEST(j.attempts - 1, 0) END,
           -- A job taken back from a live process (fresh) did not kill it:
           -- no suspect, so it runs as it would have (isolated, every other
           -- claim anywhere would wait for it).
           isolate = CASE WHEN c.fresh > 0 THEN j.isolate ELSE true END,
           last_error = CASE
               WHEN c.fresh > 0 THEN format(
                   'taken back from worker %s, which held it unconfirmed (no heartbeat for '
                   '%s s while its process renewed others: a claim whose answer was lost, or '
                   'an outcome it gave up recording); attempt not counted',
                   j.locked_by, 2 * $1::float8)
               WHEN c.batch = 1 THEN format(
                   'suspected of killing its worker: worker %s died (no heartbeat for %s s) '
                   'while running this job alone (attempt %s of %s)',
                   j.locked_by, $1::float8, j.attempts, j.max_attempts)
               ELSE format(
                   'worker %s died (no heartbeat for %s s) while its process ran %s jobs; '
                   'attempt not counted: the job runs alone next to find the culprit',
                   j.locked_by, $1::float8, c.batch)
           END,
           available_at = now(),
           lease = NULL, locked_at = NULL, locked_by = NULL, heartbeat_at = NULL,
           updated_at = now()
      FROM claims c
     WHERE j.id = c.id
 RETURNING j.id, j.status, j.tenant_slug, c.batch = 1 AS alone
),
wake AS (
    SELECT pg_notify('nexarch_index_jobs', json_build_object(
               'v', 1, 'event', 'reclaimed', 'ready', count(*),
               'first_id', min(id), 'last_id', max(id), 'next_due', NULL)::text)
      FROM moved
     WHERE status = 'pending'
    HAVING count(*) > 0
),
finished AS (
    SELECT pg_notify('nexarch_job_events', json_build_object(
               'v', 1, 'event', 'failed', 'tenant', g.tenant_slug, 'ids', g.ids,
               'finished_at', nexarch_utc_stamp(now()))::text)
      FROM (SELECT tenant_slug, array_agg(id ORDER BY id) AS ids
              FROM (SELECT id, tenant_slug,
                           (row_number() OVER (PARTITION BY tenant_slug ORDER BY id) - 1) / 200 AS chunk
                      FROM moved
                     WHERE status = 'failed') f
             GROUP BY tenant_slug, chunk) g
)
SELECT m.id, m.status, m.alone
  FROM moved m
 WHERE (SELECT count(*) FROM wake) >= 0
   AND (SELECT count(*) FROM finished) >= 0;

-- name: schedule
-- What the sweeper sleeps until: the earliest future retry and the oldest
-- heartbeat. Both are index range scans that stop at the first row.
SELECT (SELECT min(available_at) FROM mail_index_jobs
         WHERE status = 'pending' AND available_at > now()) AS next_due,
       (SELECT min(heartbeat_at) FROM mail_index_jobs
         WHERE status = 'processing') AS oldest_heartbeat,
       now() AS db_now;

-- name: status
-- $1 id, $2 tenant or NULL (NULL = operator scope, any tenant).
SELECT id, job_type, tenant_slug, message_id, status, attempts, max_attempts,
       available_at, locked_by, last_error, created_at, updated_at, finished_at
  FROM mail_index_jobs
 WHERE id = $1
   AND ($2::text IS NULL OR tenant_slug = $2);

-- name: requeue_failed
-- $1 id or NULL, $2 tenant or NULL, $3 job type or NULL.
-- A failed job that a newer job of the same (tenant, message) has already
-- overtaken stays failed: running it now would undo the newer job's effect
-- (an index re-run after a later delete). Those come back as 'superseded'.
WITH target AS (
    SELECT j.id,
           EXISTS (SELECT 1 FROM mail_index_jobs newer
                    WHERE newer.tenant_slug = j.tenant_slug
                      AND newer.message_id = j.message_id
                      AND newer.id > j.id) AS superseded
      FROM mail_index_jobs j
     WHERE j.status = 'failed'
       AND ($1::bigint IS NULL OR j.id = $1)
       AND ($2::text IS NULL OR j.tenant_slug = $2)
       AND ($3::text IS NULL OR j.job_type = $3)
       FOR UPDATE SKIP LOCKED
),
moved AS (
    UPDATE mail_index_jobs j
       SET status = 'pending', attempts = 0, available_at = now(),
           finished_at = NULL, updated_at = now(), requeued_at = now()
      FROM target t
     WHERE j.id = t.id
       AND NOT t.superseded
 RETURNING j.id
),
wake AS (
    SELECT pg_notify('nexarch_index_jobs', json_build_object(
               'v', 1, 'event', 'requeued', 'ready', count(*),
               'first_id', min(id), 'last_id', max(id), 'next_due', NULL)::text)
      FROM moved
    HAVING count(*) > 0
)
SELECT t.id, NOT t.superseded AS requeued
  FROM target t
 WHERE (SELECT count(*) FROM wake) >= 0
   AND (SELECT count(*) FROM moved) >= 0
 ORDER BY t.id;

-- name: stats
-- Counts per status and the age of the oldest ready job. The counts scan
-- the table; this is an operator query, not a hot path.
SELECT (SELECT coalesce(json_object_agg(status, n), '{}'::json)::text
          FROM (SELECT status, count(*) AS n FROM mail_index_jobs GROUP BY status) s) AS counts,
       (SELECT extract(epoch FROM now() - min(available_at))
          FROM mail_index_jobs
         WHERE status = 'pending' AND available_at <= now()) AS oldest_ready_age_s;

-- name: ready_count
-- How many jobs are ready now, counted up to $1 (enough to know how many
-- idle workers to wake).
SELECT count(*) AS n
  FROM (SELECT 1 FROM mail_index_jobs
         WHERE status = 'pending' AND available_at <= now()
         LIMIT $1::int) ready;

-- name: statuses
-- Status of many jobs at once. $1 ids.
SELECT id, status FROM mail_index_jobs WHERE id = ANY($1::bigint[]);

-- name: open_keys
-- Of the keys $2 of tenant $1, those whose newest unfinished job is of type
-- $3: work already queued (verify-index --repair does not queue it again).
-- One probe of mail_index_jobs_key per key, newest first.
SELECT k.message_id
  FROM unnest($2::text[]) AS k(message_id)
 WHERE (SELECT j.job_type FROM mail_index_jobs j
         WHERE j.tenant_slug = $1 AND j.message_id = k.message_id
           AND j.status IN ('pending', 'processing')
         ORDER BY j.id DESC LIMIT 1) = $3;

-- name: stats_tenant
-- The "stats" query for tenant $1 alone: the HTTP API's GET /queue for one
-- tenant, which never counts another tenant's jobs. Its own statement, with
-- no "or all tenants" branch: one statement for both settled, after a few
-- calls for all tenants, on a generic plan that scanned the whole job table
-- for a small tenant's counts (tests/integration/test_finished_reads.py).
-- Here both counts read the tenant's range of mail_index_jobs_key.
SELECT (SELECT coalesce(json_object_agg(status, n), '{}'::json)::text
          FROM (SELECT status, count(*) AS n
                  FROM mail_index_jobs
                 WHERE tenant_slug = $1::text
                 GROUP BY status) s) AS counts,
       (SELECT extract(epoch FROM now() - min(available_at))
          FROM mail_index_jobs
         WHERE status = 'pending' AND available_at <= now()
           AND tenant_slug = $1::text) AS oldest_ready_age_s;

-- name: succeeded_within
-- Throughput: jobs of tenant $1 (NULL: all) that succeeded in the last $2
-- seconds: a range of mail_index_jobs_finished (filtered by tenant), an
-- operator query, polled every few seconds at most.
SELECT count(*) AS n
  FROM mail_index_jobs
 WHERE status = 'succeeded'
   AND finished_at > now() - $2::float8 * interval '1 second'
   AND ($1::text IS NULL OR tenant_slug = $1::text);

-- name: last_finished
-- The job that finished last (by finish time, then id) in tenant $1 (NULL:
-- all), or NULL: where an event stream that starts now stands. Bounded for
-- an idle tenant (migration 0030).
SELECT mail_index_jobs_last_finished($1::text) AS id;

-- name: finished_after
-- Finished jobs of tenant $1 (NULL: all) that finished after job $2 did,
-- in finish order, at most $3: the replay of an event stream that resumes
-- after job $2. The cursor is the finish time, not the id: a retried job
-- finishes long after higher ids did, and must not be skipped. See
-- migration 0035 for what it reads (never another tenant's history).
SELECT id, tenant_slug, status, job_type, message_id, finished_at
  FROM mail_index_jobs_finished_after($1::text, $2::bigint, $3::int);

-- name: prune
-- Retention: delete up to $3 finished jobs, succeeded ones finished more than
-- $1 seconds ago and failed ones more than $2 (NULL: keep forever). Oldest
-- first, by the finished index. Never in anyone's way: claims and acks touch
-- pending and processing rows only, and SKIP LOCKED passes over a finished
-- row someone holds (a requeue). A job stays while an older failed job of
-- the same message is kept: requeueing that one must still see this newer
-- job, or it would undo it (an index re-run after a later delete).
WITH doomed AS (
    SELECT j.id
      FROM mail_index_jobs j
     WHERE j.status IN ('succeeded', 'failed')
       AND j.finished_at < now() - LEAST($1::float8, $2::float8) * interval '1 second'
       AND j.finished_at < now() - CASE WHEN j.status = 'succeeded' THEN $1::float8
                                        ELSE $2::float8 END * interval '1 second'
       AND NOT EXISTS (
             SELECT 1
               FROM mail_index_jobs older
              WHERE older.tenant_slug = j.tenant_slug
                AND older.message_id = j.message_id
                AND older.id < j.id
                AND older.status = 'failed')
     ORDER BY j.finished_at, j.id
     LIMIT $3::int
       FOR UPDATE SKIP LOCKED
),
gone AS (
    DELETE FROM mail_index_jobs j
     USING doomed d
     WHERE j.id = d.id
 RETURNING j.id, j.finished_at
),
-- Data-modifying CTEs run whether or not they are referenced.
mark AS (
    UPDATE mail_index_jobs_pruned p
       SET max_id = GREATEST(p.max_id, (SELECT max(id) FROM gone)),
           (max_finished_at, max_finished_id) = (
               SELECT g.finished_at, g.id FROM (
                   (SELECT p.max_finished_at AS finished_at, p.max_finished_id AS id
                     WHERE p.max_finished_at IS NOT NULL)
                   UNION ALL
                   (SELECT finished_at, id FROM gone)) g
                ORDER BY g.finished_at DESC, g.id DESC
                LIMIT 1)
     WHERE EXISTS (SELECT 1 FROM gone)
)
SELECT count(*) AS n FROM gone;

-- name: dead_rows
-- Dead row versions of the job table by the cumulative statistics (they may
-- lag a second or so; VACUUM resets them at once): the vacuum task
-- (queue/vacuum.py) decides by this.
SELECT coalesce((SELECT n_dead_tup FROM pg_stat_user_tables
                  WHERE relid = 'mail_index_jobs'::regclass), 0) AS n;

-- name: vacuum_allowed
-- May this role VACUUM the job table? Postgres lets the table's owner, the
-- database's owner and superusers (pg_has_role is true for them), and from
-- 17 on also whoever holds MAINTAIN on it (granted, or through pg_maintain;
-- the privilege name is an error before 17, hence the CASE), and only warns,
-- without an error, when anyone else tries.
SELECT pg_has_role(c.relowner, 'USAGE') OR pg_has_role(d.datdba, 'USAGE')
       OR CASE WHEN current_setting('server_version_num')::int >= 170000
               THEN has_table_privilege(c.oid, 'MAINTAIN') ELSE false END AS allowed
  FROM pg_class c, pg_database d
 WHERE c.oid = 'mail_index_jobs'::regclass AND d.datname = current_database();

-- name: vacuum_session
-- Before the VACUUM, on its session connection: a statement_timeout an
-- operator set for the role or the database (sized for the service's
-- one-row statements) would cancel every vacuum of a large table, each
-- retried after a backoff and cancelled again. The vacuum is bounded by its
-- connection's command timeout instead (queue/vacuum.py, VACUUM_TIMEOUT).
-- Session-level, so never on a transaction-pooled connection, where it
-- would stay on the server connection for the pooler's other clients.
SET statement_timeout = 0;

-- name: vacuum
-- Outside any transaction, on a connection of its own. SKIP_LOCKED: if
-- autovacuum or another process vacuums the table right now, skip it
-- instead of queueing behind them.
VACUUM (SKIP_LOCKED) mail_index_jobs;

-- name: cursor_lost
-- Why an event stream cannot replay after job $1, or NULL if it can:
-- 'pruned': the job is gone and an id at least that high was pruned (ids
-- that never finished were never pruned); 'requeued': it was re-queued
-- after it finished, so where it finished then is not known any more;
-- 'later_pruned': a job that finished after it was pruned (migration 0033),
-- or, for job 0, any job at all was.
-- $2 the stream's tenant (NULL: all): another tenant's job is answered as
-- an unknown id, never as what became of it (found by a security audit:
-- a tenant could learn whether another's job was re-queued).
SELECT CASE
         WHEN j.id IS NULL THEN
           CASE WHEN $1::bigint > 0 AND $1::bigint <= p.max_id THEN 'pruned'
                -- A stream opened before its tenant had a finished job
                -- resumes "after job 0": had anything been pruned since, its
                -- replay skipped it without a word (a docs audit). Pruning
                -- is not kept per tenant or time: any prune at all says so,
                -- which may ask a new tenant to reload once too often.
                WHEN $1::bigint = 0 AND p.max_finished_at IS NOT NULL THEN 'later_pruned'
           END
         WHEN j.requeued_at IS NOT NULL THEN 'requeued'
         WHEN j.finished_at IS NOT NULL AND p.max_finished_at IS NOT NULL
              AND (p.max_finished_at, p.max_finished_id) > (j.finished_at, j.id)
           THEN 'later_pruned'
       END AS lost
  FROM mail_index_jobs_pruned p
  LEFT JOIN mail_index_jobs j ON j.id = $1::bigint
                              AND ($2::text IS NULL OR j.tenant_slug = $2::text);

-- name: ping
-- Readiness probe of the HTTP API (GET /readyz): one round trip.
SELECT 1 AS ok;
