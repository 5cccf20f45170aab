-- Named queries of the Postgres search backend (index/postgres.py).
-- $configs is always a regconfig[] of the configured text-search configurations.

-- name: upsert
-- A whole batch in one statement. Replaying it is harmless (idempotent).
-- Arrays are passed as JSON text per document.
INSERT INTO mail_search_documents
       (tenant_slug, archive_id, subject, sender, sender_addresses, recipients, body,
        attachment_names, attachment_text, sent_at, mailboxes, size_bytes, search)
SELECT d.tenant_slug, d.archive_id, d.subject, d.sender,
       ARRAY(SELECT jsonb_array_elements_text(d.sender_addresses::jsonb)),
       d.recipients, d.body, d.attachment_names, d.attachment_text, d.sent_at,
       ARRAY(SELECT jsonb_array_elements_text(d.mailboxes::jsonb)),
       d.size_bytes,
       nexarch_mail_tsvector($1::regconfig[], d.subject, d.sender || ' ' || d.recipients,
                             d.body, d.attachment_names || ' ' || d.attachment_text)
  FROM unnest($2::text[], $3::bigint[], $4::text[], $5::text[], $6::text[], $7::text[],
              $8::text[], $9::text[], $10::text[], $11::timestamptz[], $12::text[],
              $13::bigint[])
       AS d(tenant_slug, archive_id, subject, sender, sender_addresses, recipients, body,
            attachment_names, attachment_text, sent_at, mailboxes, size_bytes)
ON CONFLICT (tenant_slug, archive_id) DO UPDATE
   SET subject = excluded.subject, sender = excluded.sender,
       sender_addresses = excluded.sender_addresses, recipients = excluded.recipients,
       body = excluded.body, attachment_names = excluded.attachment_names,
       attachment_text = excluded.attachment_text, sent_at = excluded.sent_at,
       mailboxes = excluded.mailboxes, size_bytes = excluded.size_bytes,
       search = excluded.search, indexed_at = now();

-- name: delete
DELETE FROM mail_search_documents
 WHERE tenant_slug = $1 AND archive_id = ANY($2::bigint[]);

-- name: search
-- Every search is scoped to exactly one tenant ($2). Ranked by ts_rank_cd
-- (weights A > B > C > D); an empty query lists newest first. Snippets are
-- computed for the page only, after LIMIT.
WITH q AS (
    SELECT nexarch_mail_tsquery($1::regconfig[], $3) AS query
),
matches AS (
    SELECT d.archive_id, d.subject, d.sender, d.sent_at, d.body,
           CASE WHEN q.query IS NULL THEN 0 ELSE ts_rank_cd(d.search, q.query) END AS score,
           count(*) OVER () AS total
      FROM mail_search_documents d, q
     WHERE d.tenant_slug = $2
       AND ($3 = '' OR d.search @@ q.query)
       AND ($4::text IS NULL OR $4 = ANY (d.sender_addresses))
       AND ($5::timestamptz IS NULL OR d.sent_at >= $5)
       AND ($6::timestamptz IS NULL OR d.sent_at < $6)
       AND ($7::text IS NULL OR $7 = ANY (d.mailboxes))
     ORDER BY score DESC, d.sent_at DESC NULLS LAST, d.archive_id DESC
     LIMIT $8::int OFFSET $9::int
)
SELECT m.archive_id, m.subject, m.sender, m.sent_at, m.score, m.total,
       -- ts_headline re-parses its input (per language) for every hit: the
       -- first 5,000 characters keep a search in milliseconds.
       nexarch_mail_headline($1::regconfig[], left(m.body, 5000), q.query,
                             'StartSel=' || U&'\E000' || ', StopSel=' || U&'\E001'
                             || ', MaxFragments=2, MaxWords=25, MinWords=8') AS snippet
  FROM matches m, q
 ORDER BY m.score DESC, m.sent_at DESC NULLS LAST, m.archive_id DESC;

-- name: count
-- The total when the requested page is past the last match (no rows to carry it).
SELECT count(*)
  FROM mail_search_documents d
 WHERE d.tenant_slug = $2
   AND ($3 = '' OR d.search @@ nexarch_mail_tsquery($1::regconfig[], $3))
   AND ($4::text IS NULL OR $4 = ANY (d.sender_addresses))
   AND ($5::timestamptz IS NULL OR d.sent_at >= $5)
   AND ($6::timestamptz IS NULL OR d.sent_at < $6)
   AND ($7::text IS NULL OR $7 = ANY (d.mailboxes));

-- name: ids_page
SELECT archive_id FROM mail_search_documents
 WHERE tenant_slug = $1 AND archive_id > $2
 ORDER BY archive_id
 LIMIT $3::int;
