-- The received date (IMAP INTERNALDATE, the earliest of a message's
-- locations) on search documents: a filter and a sort order (issue 10).
-- NULL: unknown (mail not imported from IMAP, or no INTERNALDATE); such
-- mail is outside every received-date range and listed last.

ALTER TABLE mail_search_documents ADD COLUMN received_at timestamptz;

-- Documents indexed before get their received date now (one pass over the
-- locations), not only when they are indexed again.
UPDATE mail_search_documents d
   SET received_at = l.received_at
  FROM (SELECT archive_id, tenant_slug, min(internaldate) AS received_at
          FROM mail_archive_locations
         WHERE internaldate IS NOT NULL
         GROUP BY archive_id, tenant_slug) l
 WHERE d.archive_id = l.archive_id
   AND d.tenant_slug = l.tenant_slug;

-- The empty query sorted by received date, and ranges on it.
CREATE INDEX mail_search_documents_received
    ON mail_search_documents (tenant_slug, received_at DESC NULLS LAST, archive_id DESC);

-- nexarch_mail_search of migration 0013 with the received-date range and a
-- sort order: 'relevance' (rank the first p_rank_limit matches, as before),
-- 'sent' or 'received' (newest first, unknown last, then the higher id).
-- A date order sorts every match (one row read each, like counting them):
-- the newest matches are only found that way, where relevance may stop at
-- the first p_cap_total in storage order.
DROP FUNCTION nexarch_mail_search(regconfig[], text, text, text, timestamptz, timestamptz,
                                  text, int, int, int, int);

CREATE FUNCTION nexarch_mail_search(p_configs regconfig[], p_tenant text, p_query_text text,
                                    p_sender text, p_date_from timestamptz,
                                    p_date_to timestamptz, p_mailbox text, p_page_size int,
                                    p_page_offset int, p_cap_total int, p_rank_limit int,
                                    p_received_from timestamptz, p_received_to timestamptz,
                                    p_sort text)
RETURNS TABLE (total bigint, archive_id bigint, subject text, sender_display text,
               sent_at timestamptz, received_at timestamptz, score real, body_head text,
               lexemes text)
LANGUAGE plpgsql STABLE PARALLEL SAFE
SET enable_seqscan = off
SET enable_indexscan = off
AS $$
#variable_conflict use_column
BEGIN
-- plpgsql, not sql: it keeps the plan between calls (an sql function with
-- SET clauses plans its query on every call).
RETURN QUERY
WITH q AS (
    SELECT nexarch_mail_tsquery(p_configs, p_query_text) AS query
),
matches AS (
    SELECT d.archive_id, d.sent_at, d.received_at
      FROM mail_search_documents d, q
     WHERE d.tenant_slug = p_tenant
       AND d.search @@ q.query
       AND (p_sender IS NULL OR p_sender = ANY (d.sender_addresses))
       AND (p_date_from IS NULL OR d.sent_at >= p_date_from)
       AND (p_date_to IS NULL OR d.sent_at < p_date_to)
       AND (p_received_from IS NULL OR d.received_at >= p_received_from)
       AND (p_received_to IS NULL OR d.received_at < p_received_to)
       AND (p_mailbox IS NULL OR p_mailbox = ANY (d.mailboxes))
),
candidates AS MATERIALIZED (
    SELECT m.archive_id, m.sent_at, m.received_at,
           row_number() OVER () AS found_order
      FROM (SELECT * FROM matches WHERE p_sort = 'relevance' LIMIT p_cap_total) m
    UNION ALL
    SELECT m.archive_id, m.sent_at, m.received_at,
           row_number() OVER (ORDER BY
               CASE WHEN p_sort = 'sent' THEN m.sent_at ELSE m.received_at END
                   DESC NULLS LAST, m.archive_id DESC) AS found_order
      FROM (SELECT * FROM matches WHERE p_sort <> 'relevance') m
),
kept AS (
    -- the first p_cap_total (relevance: in storage order, as before; a
    -- date order: the newest)
    SELECT c.* FROM candidates c WHERE c.found_order <= p_cap_total
),
ranked AS (
    SELECT r.archive_id, r.sent_at, r.received_at, c.found_order,
           ts_rank_cd(coalesce(r.rank_search, r.search), q.query) AS score
      FROM (SELECT k.archive_id, k.found_order FROM kept k
             ORDER BY k.found_order LIMIT p_rank_limit) c
      JOIN mail_search_documents r ON r.tenant_slug = p_tenant AND r.archive_id = c.archive_id,
           q
),
page AS (
    SELECT k.archive_id, k.sent_at, k.received_at, k.score, k.found_order
      FROM ranked k
     ORDER BY CASE WHEN p_sort = 'relevance' THEN k.score END DESC NULLS LAST,
              CASE WHEN p_sort = 'relevance' THEN k.sent_at END DESC NULLS LAST,
              CASE WHEN p_sort = 'relevance' THEN k.archive_id END DESC NULLS LAST,
              k.found_order
     LIMIT p_page_size OFFSET p_page_offset
)
SELECT t.total, p.archive_id, d.subject, d.sender, p.sent_at, p.received_at, p.score,
       left(d.body, 2000), querytree(q.query)
  FROM (SELECT count(*) AS total FROM kept) t
  CROSS JOIN q
  LEFT JOIN page p ON true
  LEFT JOIN mail_search_documents d ON d.tenant_slug = p_tenant AND d.archive_id = p.archive_id
 ORDER BY CASE WHEN p_sort = 'relevance' THEN p.score END DESC NULLS LAST,
          CASE WHEN p_sort = 'relevance' THEN p.sent_at END DESC NULLS LAST,
          CASE WHEN p_sort = 'relevance' THEN p.archive_id END DESC NULLS LAST,
          p.found_order;
END;
$$;
