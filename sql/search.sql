-- Named queries of the Postgres search backend (index/postgres.py).
-- $configs is always a regconfig[] of the configured text-search configurations.

-- name: upsert
-- A whole batch in one statement. Replaying it is harmless (idempotent).
-- Arrays are passed as JSON text per document. $13 names each document's text-search
-- configurations ("german,english"); $14-$17 are the texts the vector is
-- built from (runs of continuous scripts split into bigrams, capped), NULL
-- where they equal the stored text.
INSERT INTO mail_search_documents
       (tenant_slug, archive_id, subject, sender, sender_addresses, recipients, body,
        attachment_names, attachment_text, sent_at, mailboxes, size_bytes, search)
SELECT d.tenant_slug, d.archive_id, d.subject, d.sender,
       ARRAY(SELECT jsonb_array_elements_text(d.sender_addresses::jsonb)),
       d.recipients, d.body, d.attachment_names, d.attachment_text, d.sent_at,
       ARRAY(SELECT jsonb_array_elements_text(d.mailboxes::jsonb)),
       d.size_bytes,
       nexarch_mail_tsvector(string_to_array(d.configs, ',')::regconfig[],
                             coalesce(d.v_subject, d.subject),
                             coalesce(d.v_people, d.sender || ' ' || d.recipients),
                             coalesce(d.v_body, d.body),
                             coalesce(d.v_attachments,
                                      d.attachment_names || ' ' || d.attachment_text))
  FROM unnest($1::text[], $2::bigint[], $3::text[], $4::text[], $5::text[], $6::text[],
              $7::text[], $8::text[], $9::text[], $10::timestamptz[], $11::text[],
              $12::bigint[], $13::text[], $14::text[], $15::text[], $16::text[],
              $17::text[])
       AS d(tenant_slug, archive_id, subject, sender, sender_addresses, recipients, body,
            attachment_names, attachment_text, sent_at, mailboxes, size_bytes, configs,
            v_subject, v_people, v_body, v_attachments)
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
-- One statement, so the total and the page come from one snapshot (a
-- separate count could see a document committed after the page was read:
-- "total 1" with no hits). Every search is scoped to exactly one tenant
-- ($2). $3 is to_tsquery text written by index/postgres.py ('' = list all).
-- Ranked by ts_rank_cd (weights A > B > C > D); an empty query lists newest
-- first. The result always has one row at least: a page past the end gives a
-- single row with the total and NULL archive_id. Snippets are computed for
-- the page only.
WITH q AS (
    SELECT nexarch_mail_tsquery($1::regconfig[], $3) AS query
),
found AS MATERIALIZED (
    SELECT d.archive_id, d.sent_at,
           CASE WHEN q.query IS NULL THEN 0 ELSE ts_rank_cd(d.search, q.query) END AS score
      FROM mail_search_documents d, q
     WHERE d.tenant_slug = $2
       AND ($3 = '' OR d.search @@ q.query)
       AND ($4::text IS NULL OR $4 = ANY (d.sender_addresses))
       AND ($5::timestamptz IS NULL OR d.sent_at >= $5)
       AND ($6::timestamptz IS NULL OR d.sent_at < $6)
       AND ($7::text IS NULL OR $7 = ANY (d.mailboxes))
),
page AS (
    SELECT f.archive_id, f.sent_at, f.score
      FROM found f
     ORDER BY f.score DESC, f.sent_at DESC NULLS LAST, f.archive_id DESC
     LIMIT $8::int OFFSET $9::int
)
SELECT t.total, p.archive_id, d.subject, d.sender, p.sent_at, p.score,
       -- ts_headline re-parses its input (per language) for every hit: the
       -- first 5,000 characters keep a search in milliseconds.
       nexarch_mail_headline($1::regconfig[], left(d.body, 5000), q.query,
                             'StartSel=' || U&'\E000' || ', StopSel=' || U&'\E001'
                             || ', MaxFragments=2, MaxWords=25, MinWords=8') AS snippet
  FROM (SELECT count(*) AS total FROM found) t
  CROSS JOIN q
  LEFT JOIN page p ON true
  LEFT JOIN mail_search_documents d ON d.tenant_slug = $2 AND d.archive_id = p.archive_id
 ORDER BY p.score DESC, p.sent_at DESC NULLS LAST, p.archive_id DESC;

-- name: ids_page
SELECT archive_id FROM mail_search_documents
 WHERE tenant_slug = $1 AND archive_id > $2
 ORDER BY archive_id
 LIMIT $3::int;
