-- Named queries of the archive (nexarch_events/archive.py).

-- name: store
-- The message row (once per tenant and content hash), its index job (only
-- when the row is new), and where it was seen: one statement, one
-- transaction, through the one archive path (mail_archive_store, migration
-- 0008), which the importer uses too. $1 tenant, $2 sha256, $3 size, $4 raw,
-- $5 mailbox or NULL, $6 uidvalidity, $7 uid.
SELECT archive_id AS id, created, job_id, location_added
  FROM mail_archive_store($1, $2, $3::int, $4, $5::text, $6::bigint, $7::bigint);

-- name: load
-- Raw bytes and mailboxes of archived messages, scoped to each id's tenant.
-- $1 tenants, $2 ids (pairwise).
SELECT a.id, a.tenant_slug, a.raw, a.size_bytes,
       coalesce((SELECT array_agg(DISTINCT l.mailbox ORDER BY l.mailbox)
                   FROM mail_archive_locations l
                  WHERE l.archive_id = a.id), '{}') AS mailboxes,
       -- The earliest INTERNALDATE a server gave it (dates a message
       -- without a Date header; migration 0020).
       (SELECT min(l.internaldate) FROM mail_archive_locations l
         WHERE l.archive_id = a.id) AS received_at
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
-- The message's locations by their archive_id index, then its tenant's:
-- with both in one WHERE the planner read the tenant's whole primary-key
-- range (tests/integration/test_location_lookups.py).
WITH located AS MATERIALIZED (
    SELECT tenant_slug, mailbox, uidvalidity, uid, seen_at
      FROM mail_archive_locations
     WHERE archive_id = $2)
SELECT mailbox, uidvalidity, uid, seen_at
  FROM located
 WHERE tenant_slug = $1
 ORDER BY mailbox, uidvalidity, uid;

-- name: ids_page
-- Archive ids of a tenant in id order, keyset-paged. $1 tenant, $2 after, $3 limit.
-- Planned for the tenant at each call (migration 0029): as a prepared
-- statement, a small tenant's page walked the primary key through the other
-- tenants' rows (tests/integration/test_tenant_pages.py).
SELECT id FROM mail_archive_tenant_ids($1, $2, $3);

-- name: tenants
SELECT DISTINCT tenant_slug FROM mail_archive ORDER BY tenant_slug;

-- name: set_notes
-- $1 ids, $2 tenants, $3 notes as JSON arrays.
UPDATE mail_archive a
   SET index_notes = ARRAY(SELECT jsonb_array_elements_text(n.notes::jsonb))
  FROM unnest($1::bigint[], $2::text[], $3::text[]) AS n(id, tenant_slug, notes)
 WHERE a.id = n.id AND a.tenant_slug = n.tenant_slug;

-- name: erased_among
-- Which of the (tenant $1[i], archive id $2[i]) pairs were erased
-- (mail_erasures, migration 0021): an index write for one of them is a late
-- write that erasure raced, and is removed again (mail/indexer.py).
SELECT e.tenant_slug, e.archive_id
  FROM mail_erasures e
  JOIN unnest($1::text[], $2::bigint[]) AS w(tenant_slug, archive_id)
    ON e.tenant_slug = w.tenant_slug AND e.archive_id = w.archive_id;
