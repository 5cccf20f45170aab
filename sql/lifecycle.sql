-- Named queries of the archive lifecycle (nexarch_events/lifecycle/):
-- erasure, legal holds, the audit log, retention. Tables: migrations 0021
-- and 0022.

-- name: tenant_lock_shared
-- Erasures of a tenant share this lock; adding a hold takes it exclusively
-- (hold_lock). So a hold either commits before an erasure's check (which
-- then sees it) or waits until the erasure has committed: no message is
-- erased under a hold that was added while the erasure ran.
SELECT pg_advisory_xact_lock_shared(1312902722, hashtext($1::text));

-- name: hold_lock
SELECT pg_advisory_xact_lock(1312902722, hashtext($1::text));

-- name: audit_insert
-- $1 actor, $2 action, $3 tenant, $4 target (JSON text), $5 count.
INSERT INTO mail_audit_log (actor, action, tenant_slug, target, count)
VALUES ($1, $2, $3, $4::jsonb, $5::int)
RETURNING id, at;

-- name: audit_list
-- Newest first. $1 tenant or NULL (every tenant), $2 before this id (NULL:
-- from the newest), $3 limit, $4 action or NULL.
SELECT id, at, actor, action, tenant_slug, target::text AS target, count
  FROM mail_audit_log
 WHERE ($1::text IS NULL OR tenant_slug = $1::text)
   AND ($2::bigint IS NULL OR id < $2::bigint)
   AND ($4::text IS NULL OR action = $4::text)
 ORDER BY id DESC
 LIMIT $3::int;

-- name: hold_add
INSERT INTO mail_legal_holds (tenant_slug, scope, mailbox, query, reason, created_by)
VALUES ($1, $2, $3, $4, $5, $6)
RETURNING id, tenant_slug, scope, mailbox, query, reason, created_by, created_at,
          removed_by, removed_at;

-- name: hold_items_add
-- What a query hold found when it was added and is still archived (an
-- erasure may have committed between the search and the hold's lock: that
-- mail is gone, and must not be reported as kept). $1 hold, $2 tenant,
-- $3 ids. Returns the ids recorded.
INSERT INTO mail_legal_hold_items (hold_id, tenant_slug, archive_id)
SELECT $1::bigint, $2::text, a.id
  FROM mail_archive a
 WHERE a.tenant_slug = $2::text AND a.id = ANY($3::bigint[])
ON CONFLICT DO NOTHING
RETURNING archive_id;

-- name: hold_mailbox_known
-- Whether tenant $1 has archived mail in mailbox $2, or a mailbox of that
-- name registered: a hold on a name that is neither is likely misspelt.
SELECT EXISTS (SELECT 1 FROM mail_archive_locations
                WHERE tenant_slug = $1 AND mailbox = $2)
    OR EXISTS (SELECT 1 FROM mail_import_mailboxes
                WHERE tenant_slug = $1 AND name = $2) AS known;

-- name: hold_list
-- $1 tenant or NULL (every tenant), $2 include removed holds. The items a
-- query hold recorded are counted for the listed holds at once, each read
-- once: a count per hold, planned once for every hold, scanned every hold's
-- items for each (tests/integration/test_location_lookups.py).
WITH listed AS MATERIALIZED (
    SELECT h.id, h.tenant_slug, h.scope, h.mailbox, h.query, h.reason, h.created_by,
           h.created_at, h.removed_by, h.removed_at
      FROM mail_legal_holds h
     WHERE ($1::text IS NULL OR h.tenant_slug = $1::text)
       AND ($2::bool OR h.removed_at IS NULL)
)
SELECT l.id, l.tenant_slug, l.scope, l.mailbox, l.query, l.reason, l.created_by,
       l.created_at, l.removed_by, l.removed_at, coalesce(c.n, 0) AS recorded
  FROM listed l
  LEFT JOIN (SELECT i.hold_id, count(*) AS n
               FROM mail_legal_hold_items i
              WHERE i.hold_id IN (SELECT q.id FROM listed q WHERE q.scope = 'query')
              GROUP BY i.hold_id) c ON c.hold_id = l.id
 ORDER BY l.id;

-- name: hold_remove
-- $1 id, $2 tenant or NULL (admin: any tenant), $3 who. No row: no such
-- active hold (in that tenant).
UPDATE mail_legal_holds
   SET removed_at = now(), removed_by = $3
 WHERE id = $1::bigint
   AND ($2::text IS NULL OR tenant_slug = $2::text)
   AND removed_at IS NULL
RETURNING id, tenant_slug, scope, mailbox, query, reason, created_by, created_at,
          removed_by, removed_at;

-- name: query_holds
-- The active query holds of tenant $1 (evaluated through the index).
SELECT id, query FROM mail_legal_holds
 WHERE tenant_slug = $1 AND scope = 'query' AND removed_at IS NULL
 ORDER BY id;

-- name: not_indexed
-- Of the archive ids $2 of tenant $1, those whose newest index job is still
-- to run (pending, processing): the index may not have them yet, so a
-- query hold cannot tell whether it finds them. Not a failed job: that
-- mail never will be indexed (bad input, guarantee 9), and keeping it for
-- ever would refuse its erasure for ever; a query hold does not see it, as
-- it never did. One probe of mail_index_jobs_key per id. An id without any
-- job (pruned after it succeeded) counts as indexed.
SELECT k.id AS archive_id
  FROM unnest($2::bigint[]) AS k(id)
 WHERE (SELECT j.status FROM mail_index_jobs j
         WHERE j.tenant_slug = $1 AND j.message_id = k.id::text AND j.job_type = 'index'
         ORDER BY j.id DESC LIMIT 1) IN ('pending', 'processing');

-- name: held
-- Which of the messages $2 of tenant $1 an active hold covers, by the
-- database alone: tenant holds, mailbox holds (a location in that mailbox),
-- and what a query hold recorded when it was added. One row per (message,
-- hold). A message's locations are read through their archive_id index and
-- only then matched to the held mailbox: with the mailbox in the same WHERE
-- the planner read the tenant's every location per batch, or the held
-- mailbox's per message. A query hold's item is one key lookup: as a plain
-- EXISTS it became a hash of every item the tenant's query holds recorded,
-- per batch (12,510 read for a batch of 100; the CTE keeps it a lookup).
-- tests/integration/test_location_lookups.py counts both.
SELECT k.id AS archive_id, h.id AS hold_id
  FROM unnest($2::bigint[]) AS k(id)
  JOIN mail_legal_holds h ON h.tenant_slug = $1 AND h.removed_at IS NULL
 WHERE h.scope = 'tenant'
    OR (h.scope = 'mailbox' AND EXISTS (
            WITH located AS MATERIALIZED (
                SELECT l.tenant_slug, l.mailbox FROM mail_archive_locations l
                 WHERE l.archive_id = k.id)
            SELECT 1 FROM located
             WHERE located.tenant_slug = $1 AND located.mailbox = h.mailbox))
    OR (h.scope = 'query' AND EXISTS (
            WITH recorded AS MATERIALIZED (
                SELECT 1 FROM mail_legal_hold_items i
                 WHERE i.hold_id = h.id AND i.archive_id = k.id)
            SELECT 1 FROM recorded))
 ORDER BY k.id, h.id;

-- name: tenant_held
-- The active tenant-wide hold of tenant $1, if any (the lowest id).
SELECT id FROM mail_legal_holds
 WHERE tenant_slug = $1 AND scope = 'tenant' AND removed_at IS NULL
 ORDER BY id LIMIT 1;

-- name: archived_of
-- Which of the ids $2 are archived messages of tenant $1, locked for the
-- erasure that asks (in id order: two erasures never deadlock). The lock
-- waits for an import in flight that adds a location to one of them (its
-- insert locks the row KEY SHARE), so the hold check that follows sees a
-- location in a held mailbox, and an import that comes later waits for the
-- erasure and archives the message anew. Without it a message was erased
-- with the location in a held mailbox it had just gained
-- (tests/integration/test_lifecycle_races.py).
SELECT id FROM mail_archive WHERE tenant_slug = $1 AND id = ANY($2::bigint[])
 ORDER BY id
   FOR UPDATE;

-- name: erased_of
-- Which of the ids $2 of tenant $1 were erased before.
SELECT archive_id FROM mail_erasures WHERE tenant_slug = $1 AND archive_id = ANY($2::bigint[]);

-- name: erase_archive
-- The messages and (ON DELETE CASCADE) their locations.
DELETE FROM mail_archive WHERE tenant_slug = $1 AND id = ANY($2::bigint[])
RETURNING id;

-- name: drop_pending_index_jobs
-- Index work nobody has started is dropped with the message. A claimed
-- (processing) job stays: the delete job enqueued after it is ordered
-- behind it (guarantee 3), so the delete wins. A claim racing this
-- statement holds the row locked; the re-check after the wait sees
-- 'processing' and leaves it.
DELETE FROM mail_index_jobs
 WHERE tenant_slug = $1 AND message_id = ANY($2::text[])
   AND job_type = 'index' AND status = 'pending'
RETURNING id;

-- name: record_erasures
-- $1 tenant, $2 ids, $3 audit id, $4 delete job ids (pairwise with $2).
INSERT INTO mail_erasures (tenant_slug, archive_id, audit_id, delete_job_id)
SELECT $1::text, e.archive_id, $3::bigint, e.job_id
  FROM unnest($2::bigint[], $4::bigint[]) AS e(archive_id, job_id)
ON CONFLICT (tenant_slug, archive_id) DO NOTHING;

-- name: erased_ids
-- Every erased message of tenant $1 among the ids $2 (verify-index).
SELECT archive_id FROM mail_erasures
 WHERE tenant_slug = $1 AND archive_id = ANY($2::bigint[]);

-- name: ids_page
-- Archive ids of tenant $1 above $2, ascending, at most $3 (erasing a
-- whole tenant in batches). Planned for the tenant, as archive.sql's
-- "ids_page".
SELECT id FROM mail_archive_tenant_ids($1, $2, $3);

-- name: unregister_tenant
-- Stop a tenant's import: its accounts, mailboxes, sync state and recorded
-- failures go. Returns the mailbox names removed (a run in flight stops at
-- its next message: its sync state is gone, see mail_import_message).
WITH acc AS (
    DELETE FROM mail_import_accounts WHERE tenant_slug = $1 RETURNING id
),
boxes AS (
    DELETE FROM mail_import_mailboxes WHERE tenant_slug = $1 RETURNING name
),
state AS (
    DELETE FROM mail_import_state WHERE tenant_slug = $1 RETURNING mailbox_name
),
failures AS (
    DELETE FROM mail_import_failures WHERE tenant_slug = $1
)
SELECT name FROM boxes
UNION
SELECT mailbox_name FROM state
ORDER BY 1;

-- name: unregister_mailboxes
-- Unregister the registered mailboxes named $2 of tenant $1 (and their
-- state and failures); the erased mail then stops coming back from them.
WITH boxes AS (
    DELETE FROM mail_import_mailboxes WHERE tenant_slug = $1 AND name = ANY($2::text[])
    RETURNING name
),
state AS (
    DELETE FROM mail_import_state WHERE tenant_slug = $1 AND mailbox_name = ANY($2::text[])
),
failures AS (
    DELETE FROM mail_import_failures WHERE tenant_slug = $1 AND mailbox_name = ANY($2::text[])
)
SELECT name FROM boxes ORDER BY name;

-- name: mailboxes_of
-- The mailboxes messages $2 of tenant $1 were seen in (their locations by
-- the archive_id index, then the tenant's; as archive.sql's "locations").
WITH located AS MATERIALIZED (
    SELECT tenant_slug, mailbox
      FROM mail_archive_locations
     WHERE archive_id = ANY($2::bigint[]))
SELECT DISTINCT mailbox FROM located
 WHERE tenant_slug = $1
 ORDER BY mailbox;

-- name: drop_tenant_pending_jobs
-- Pending index jobs of a tenant being erased whole, except those of mail
-- archived while the erasure ran (after its last batch: an import run
-- still in flight, an archive call): that mail stays, and is indexed.
DELETE FROM mail_index_jobs j
 WHERE j.tenant_slug = $1 AND j.job_type = 'index' AND j.status = 'pending'
   AND NOT EXISTS (SELECT 1 FROM mail_archive a
                    WHERE a.tenant_slug = $1
                      AND a.id = CASE WHEN j.message_id ~ '^[0-9]{1,18}$'
                                      THEN j.message_id::bigint END)
RETURNING id;

-- name: tenant_count
SELECT count(*) FROM mail_archive WHERE tenant_slug = $1;

-- name: message_tenant
-- The tenant of archived message $1 (an admin's DELETE /messages/{id}).
SELECT tenant_slug FROM mail_archive WHERE id = $1::bigint;

-- name: audit_complete
-- A retention pass and a tenant's erasure write their audit row when they
-- start (their erasures point at it) and complete it here when they end,
-- with what they did: the one update the audit log ever sees. $1 id, $2
-- count, $3 target (JSON text).
UPDATE mail_audit_log SET count = $2::int, target = $3::jsonb
 WHERE id = $1::bigint AND action IN ('retention_pass', 'erase_tenant');

-- name: retention_policies
SELECT tenant_slug, days, set_by, set_at FROM mail_retention_policies ORDER BY tenant_slug;

-- name: retention_set
INSERT INTO mail_retention_policies AS p (tenant_slug, days, set_by)
VALUES ($1, $2::int, $3)
ON CONFLICT (tenant_slug) DO UPDATE SET days = EXCLUDED.days, set_by = EXCLUDED.set_by,
                                        set_at = now()
RETURNING tenant_slug;

-- name: retention_clear
DELETE FROM mail_retention_policies WHERE tenant_slug = $1 RETURNING tenant_slug;

-- name: retention_lock
-- One retention pass at a time, whichever process runs it (session lock on
-- the pass's own connection; released at its end or when that connection
-- goes).
SELECT pg_try_advisory_lock(1312902723, 0) AS locked;

-- name: retention_unlock
SELECT pg_advisory_unlock(1312902723, 0) AS unlocked;

-- name: undated
-- The next $3 messages of tenant $1 above id $2, in id order, each with its
-- header section (the first 64 KiB, for the Date field) if it has no
-- received date yet (no location with an INTERNALDATE, no mail_archive_dates
-- row), else NULL. The window's ids come first, planned for the tenant as
-- "ids_page", and the caller goes on after its last id: a page filtered and
-- limited in one step was planned as a join of the tenant's whole archive,
-- sorted, per page (tests/integration/test_tenant_pages.py).
WITH page AS MATERIALIZED (SELECT w.id FROM mail_archive_tenant_ids($1, $2, $3) w)
SELECT p.id, u.head
  FROM page p
  LEFT JOIN LATERAL (
        SELECT substring(a.raw FROM 1 FOR 65536) AS head
          FROM mail_archive a
         WHERE a.id = p.id
           AND NOT EXISTS (SELECT 1 FROM mail_archive_dates d WHERE d.archive_id = a.id)
           AND NOT EXISTS (SELECT 1 FROM mail_archive_locations l
                            WHERE l.archive_id = a.id AND l.internaldate IS NOT NULL)) u ON true
 ORDER BY p.id;

-- name: dates_add
-- $1 tenant, $2 ids, $3 Date headers (NULL: none). Messages erased
-- meanwhile are left out by the join.
INSERT INTO mail_archive_dates (archive_id, tenant_slug, sent_at)
SELECT a.id, a.tenant_slug, d.sent_at
  FROM unnest($2::bigint[], $3::timestamptz[]) AS d(archive_id, sent_at)
  JOIN mail_archive a ON a.id = d.archive_id AND a.tenant_slug = $1
ON CONFLICT (archive_id) DO NOTHING;

-- name: expired
-- The next $4 messages of tenant $1 above id $3, in id order, each with
-- whether it was received before $2 (the earliest INTERNALDATE, else the
-- Date header, else the archive time). Only a message whose date is known
-- can be expired: "undated" runs first. A window of ids first, then each
-- judged, as "undated". Each message's date row is looked up by its key
-- (LATERAL ... LIMIT 1): a plain join was planned as a hash of the whole
-- mail_archive_dates table, every tenant's, per window.
WITH page AS MATERIALIZED (SELECT w.id, w.archived_at
                             FROM mail_archive_tenant_ids($1, $3, $4) w)
SELECT p.id,
       coalesce((loc.received IS NOT NULL OR d.found)
                AND coalesce(loc.received, d.sent_at, p.archived_at) < $2::timestamptz,
                false) AS expired
  FROM page p
  LEFT JOIN LATERAL (SELECT true AS found, dd.sent_at FROM mail_archive_dates dd
                      WHERE dd.archive_id = p.id LIMIT 1) d ON true
  LEFT JOIN LATERAL (SELECT min(l.internaldate) AS received
                       FROM mail_archive_locations l
                      WHERE l.archive_id = p.id) loc ON true
 ORDER BY p.id;

-- name: erased_tenants
SELECT DISTINCT tenant_slug FROM mail_erasures ORDER BY tenant_slug;
