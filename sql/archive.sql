-- Named queries of the archive (nexarch_events/archive.py).

-- name: store
-- One statement, one transaction: the message row (once per tenant and
-- content hash), its index job (only when the row is new), and where it was
-- seen. $1 tenant, $2 sha256, $3 size, $4 raw, $5 mailbox or NULL,
-- $6 uidvalidity, $7 uid.
-- Returns no row if a concurrent transaction inserted the same message and
-- committed after this statement's snapshot: the caller runs it again.
WITH inserted AS (
    INSERT INTO mail_archive (tenant_slug, sha256, size_bytes, raw)
    VALUES ($1, $2, $3::int, $4)
    ON CONFLICT (tenant_slug, sha256) DO NOTHING
    RETURNING id
),
message AS (
    SELECT id, true AS created FROM inserted
    UNION ALL
    SELECT a.id, false
      FROM mail_archive a
     WHERE a.tenant_slug = $1 AND a.sha256 = $2
       AND NOT EXISTS (SELECT 1 FROM inserted)
),
job AS (
    -- The queue key is the archive id, so a later delete of this message is
    -- ordered behind its index job (guarantee 3).
    INSERT INTO mail_index_jobs (job_type, tenant_slug, message_id, payload)
    SELECT 'index', $1, m.id::text, jsonb_build_object('archive_id', m.id)
      FROM message m
     WHERE m.created
    RETURNING id
),
location AS (
    INSERT INTO mail_archive_locations (archive_id, tenant_slug, mailbox, uidvalidity, uid)
    SELECT m.id, $1, $5::text, $6::bigint, $7::bigint
      FROM message m
     WHERE $5::text IS NOT NULL
    ON CONFLICT (tenant_slug, mailbox, uidvalidity, uid) DO NOTHING
    RETURNING archive_id
)
SELECT m.id, m.created,
       (SELECT id FROM job) AS job_id,
       (SELECT count(*) FROM location) AS locations_added
  FROM message m;

-- name: load
-- Raw bytes and mailboxes of archived messages, scoped to each id's tenant.
-- $1 tenants, $2 ids (pairwise).
SELECT a.id, a.tenant_slug, a.raw, a.size_bytes,
       coalesce((SELECT array_agg(DISTINCT l.mailbox ORDER BY l.mailbox)
                   FROM mail_archive_locations l
                  WHERE l.archive_id = a.id), '{}') AS mailboxes
  FROM unnest($1::text[], $2::bigint[]) AS k(tenant_slug, id)
  JOIN mail_archive a ON a.id = k.id AND a.tenant_slug = k.tenant_slug;

-- name: delete
-- Remove a message and enqueue the removal from the index, in one
-- transaction. $1 tenant, $2 id. No row: no such message in that tenant.
WITH gone AS (
    DELETE FROM mail_archive WHERE tenant_slug = $1 AND id = $2 RETURNING id
),
job AS (
    INSERT INTO mail_index_jobs (job_type, tenant_slug, message_id)
    SELECT 'delete', $1, g.id::text FROM gone g
    RETURNING id
)
SELECT g.id, (SELECT id FROM job) AS job_id FROM gone g;

-- name: locations
SELECT mailbox, uidvalidity, uid, seen_at
  FROM mail_archive_locations
 WHERE tenant_slug = $1 AND archive_id = $2
 ORDER BY mailbox, uidvalidity, uid;

-- name: ids_page
-- Archive ids of a tenant in id order, keyset-paged. $1 tenant, $2 after, $3 limit.
SELECT id FROM mail_archive
 WHERE tenant_slug = $1 AND id > $2
 ORDER BY id
 LIMIT $3::int;

-- name: tenants
SELECT DISTINCT tenant_slug FROM mail_archive ORDER BY tenant_slug;

-- name: set_notes
-- $1 ids, $2 tenants, $3 notes as JSON arrays.
UPDATE mail_archive a
   SET index_notes = ARRAY(SELECT jsonb_array_elements_text(n.notes::jsonb))
  FROM unnest($1::bigint[], $2::text[], $3::text[]) AS n(id, tenant_slug, notes)
 WHERE a.id = n.id AND a.tenant_slug = n.tenant_slug;
