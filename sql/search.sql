-- Named queries of the Postgres search backend (index/postgres.py).
-- $configs is always a regconfig[] of the configured text-search configurations.

-- name: upsert
-- A whole batch in one statement. Replaying it is harmless (idempotent).
-- Arrays are passed as JSON text per document. $13 names each document's text-search
-- configurations ("german,english"); $14-$17 are the texts the vector is
-- built from (runs of continuous scripts split into bigrams, capped), NULL
-- where they equal the stored text.
-- $18/$19, the fence (index/postgres.py): per document the job id and lease
-- it is written for, or NULL arrays for an unfenced write. A fenced document
-- is written only if its job is still 'processing' under that lease, checked
-- under a share lock on the job row that this statement holds until it
-- commits: the sweeper's reclaim (FOR UPDATE SKIP LOCKED) and any ack wait
-- or pass, so no successor of the job can start before the write is
-- committed, and a writer that lost its lease writes nothing. Rows are
-- locked in id order (the heartbeat locks in the same order: no deadlock).
-- $20: each document's received date (NULL: unknown).
-- The write commits without waiting for its WAL flush (synchronous_commit
-- off, for this transaction only): a flush cost 4 ms a commit on the
-- shared bench machine under load (0.1 ms when its disk was idle), a fifth
-- of archival -> searchable then. Nothing is lost by it:
-- a job is done only when its ack commits, a synchronous commit whose flush
-- writes all WAL before it, this write's commit record included; a crash
-- before that leaves the job unacknowledged, and its re-run writes again.
-- Visibility is unchanged: other sessions see the write once it returns.
-- Returns the archive ids written.
WITH live AS MATERIALIZED (
    SELECT j.id, j.tenant_slug
      FROM mail_index_jobs j,
           (SELECT DISTINCT f.job_id, f.lease
              FROM unnest($18::bigint[], $19::uuid[]) AS f(job_id, lease)) f
     WHERE j.id = f.job_id
       AND j.lease = f.lease
       AND j.status = 'processing'
     ORDER BY j.id
       FOR SHARE OF j
)
INSERT INTO mail_search_documents
       (tenant_slug, archive_id, subject, sender, sender_addresses, recipients, body,
        attachment_names, attachment_text, sent_at, mailboxes, size_bytes, received_at,
        search, rank_search)
SELECT d.tenant_slug, d.archive_id, d.subject, d.sender,
       ARRAY(SELECT jsonb_array_elements_text(d.sender_addresses::jsonb)),
       d.recipients, d.body, d.attachment_names, d.attachment_text, d.sent_at,
       ARRAY(SELECT jsonb_array_elements_text(d.mailboxes::jsonb)),
       d.size_bytes, d.received_at,
       nexarch_mail_tsvector(string_to_array(d.configs, ',')::regconfig[],
                             coalesce(d.v_subject, d.subject),
                             coalesce(d.v_people, d.sender || ' ' || d.recipients),
                             coalesce(d.v_body, d.body),
                             coalesce(d.v_attachments,
                                      d.attachment_names || ' ' || d.attachment_text)),
       -- the small vector ranking reads (migration 0015): no attachments,
       -- the body's first 400 characters (stemming more of it again cost
       -- a tenth of indexing)
       nexarch_mail_tsvector(string_to_array(d.configs, ',')::regconfig[],
                             coalesce(d.v_subject, d.subject),
                             coalesce(d.v_people, d.sender || ' ' || d.recipients),
                             left(coalesce(d.v_body, d.body), 400), '')
  FROM unnest($1::text[], $2::bigint[], $3::text[], $4::text[], $5::text[], $6::text[],
              $7::text[], $8::text[], $9::text[], $10::timestamptz[], $11::text[],
              $12::bigint[], $13::text[], $14::text[], $15::text[], $16::text[],
              $17::text[], $18::bigint[], $20::timestamptz[])
       AS d(tenant_slug, archive_id, subject, sender, sender_addresses, recipients, body,
            attachment_names, attachment_text, sent_at, mailboxes, size_bytes, configs,
            v_subject, v_people, v_body, v_attachments, job_id, received_at),
       (SELECT set_config('synchronous_commit', 'off', true)) AS async_commit
 WHERE $18::bigint[] IS NULL
    OR (d.job_id, d.tenant_slug) IN (SELECT l.id, l.tenant_slug FROM live l)
ON CONFLICT (tenant_slug, archive_id) DO UPDATE
   SET subject = excluded.subject, sender = excluded.sender,
       sender_addresses = excluded.sender_addresses, recipients = excluded.recipients,
       body = excluded.body, attachment_names = excluded.attachment_names,
       attachment_text = excluded.attachment_text, sent_at = excluded.sent_at,
       mailboxes = excluded.mailboxes, size_bytes = excluded.size_bytes,
       received_at = excluded.received_at,
       search = excluded.search, rank_search = excluded.rank_search, indexed_at = now()
RETURNING archive_id;

-- name: delete
-- $1 tenant, $2 archive ids; $3/$4 the fence (job ids and leases per id, or
-- NULL arrays), checked as in upsert: a writer that lost its lease deletes
-- nothing. Returns the archive ids deleted.
WITH live AS MATERIALIZED (
    SELECT j.id
      FROM mail_index_jobs j,
           (SELECT DISTINCT f.job_id, f.lease
              FROM unnest($3::bigint[], $4::uuid[]) AS f(job_id, lease)) f
     WHERE j.id = f.job_id
       AND j.lease = f.lease
       AND j.status = 'processing'
       AND j.tenant_slug = $1
     ORDER BY j.id
       FOR SHARE OF j
)
DELETE FROM mail_search_documents d
 USING unnest($2::bigint[], $3::bigint[]) AS f(archive_id, job_id)
 WHERE d.tenant_slug = $1
   AND d.archive_id = f.archive_id
   AND ($3::bigint[] IS NULL OR f.job_id IN (SELECT l.id FROM live l))
RETURNING d.archive_id;

-- name: search_text
-- A text query: nexarch_mail_search (migration 0023) ranks the first $11
-- matches and counts up to $10, in one statement and one snapshot. $3 is
-- to_tsquery text written by index/postgres.py; $12/$13 the received-date
-- range, $14 the sort order. The result has one row at least: a page past
-- the end gives a single row with the total and NULL archive_id.
SELECT total, archive_id, subject, sender_display AS sender, sent_at, received_at, score,
       body_head, lexemes
  FROM nexarch_mail_search($1::regconfig[], $2, $3, $4, $5, $6, $7, $8::int, $9::int,
                           $10::int, $11::int, $12, $13, $14);

-- name: search_all
-- The empty query: every message of the tenant ($1) that passes the
-- filters, newest first by $11 ('received': received date, else sent),
-- undated last; counted up to $8 in the same statement (one snapshot). One
-- row at least, as search_text. $9/$10: the received-date range. Planned
-- per call, so a rare sender or mailbox is read through its own index
-- (migration 0031).
SELECT total, archive_id, subject, sender_display AS sender, sent_at, received_at, score,
       body_head, lexemes
  FROM nexarch_mail_search_all($1, $2, $3, $4, $5, $6::int, $7::int, $8::int, $9, $10, $11);

-- name: ids_page
SELECT archive_id FROM mail_search_documents
 WHERE tenant_slug = $1 AND archive_id > $2
 ORDER BY archive_id
 LIMIT $3::int;

-- name: drop_tenant
-- Every document of tenant $1 (erasure of a whole tenant), except those of
-- mail archived again while the erasure ran: it stays, and searchable.
DELETE FROM mail_search_documents d
 WHERE d.tenant_slug = $1
   AND NOT EXISTS (SELECT 1 FROM mail_archive a
                    WHERE a.tenant_slug = $1 AND a.id = d.archive_id);

-- name: text_search_configs
-- Which of the configured search languages ($1) this server has
-- (index/factory.py checks them at first use).
SELECT cfgname FROM pg_ts_config WHERE cfgname = ANY($1::text[]);
