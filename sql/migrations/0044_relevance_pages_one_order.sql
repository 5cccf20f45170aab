-- Relevance paging past the ranked matches: the set ranked was the first
-- max(rank_limit, offset + limit) matches, so it grew with the page, and a
-- page past rank_limit was cut from another order than the pages before it:
-- 400 matches in pages of 20 listed 20 of them twice and 100 never (a search
-- audit). Now every page is a slice of one order: the first p_rank_limit
-- matches (storage order) best first, then the rest in storage order,
-- unranked (score 0); the caller passes the same p_rank_limit for every page
-- of a relevance search. The date sorts are unchanged (0023).
CREATE OR REPLACE FUNCTION nexarch_mail_search(p_configs regconfig[], p_tenant text,
                                               p_query_text text, p_sender text,
                                               p_date_from timestamptz, p_date_to timestamptz,
                                               p_mailbox text, p_page_size int,
                                               p_page_offset int, p_cap_total int,
                                               p_rank_limit int,
                                               p_received_from timestamptz,
                                               p_received_to timestamptz, p_sort text)
RETURNS TABLE (total bigint, archive_id bigint, subject text, sender_display text,
               sent_at timestamptz, received_at timestamptz, score real, body_head text,
               lexemes text)
LANGUAGE plpgsql STABLE PARALLEL SAFE
SET enable_seqscan = off
SET enable_indexscan = off
SET plan_cache_mode = force_custom_plan
AS $$
#variable_conflict use_column
DECLARE
    -- NULL when no configuration leaves a lexeme: @@ NULL matches nothing.
    v_query tsquery := nexarch_mail_tsquery(p_configs, p_query_text);
BEGIN
IF p_sort = 'relevance' THEN
    RETURN QUERY
    WITH found AS MATERIALIZED (
        SELECT d.archive_id, d.sent_at, d.received_at,
               coalesce(d.rank_search, d.search) AS rank_vector
          FROM mail_search_documents d
         WHERE d.tenant_slug = p_tenant
           AND d.search @@ v_query
           AND (p_sender IS NULL OR p_sender = ANY (d.sender_addresses))
           AND (p_date_from IS NULL OR d.sent_at >= p_date_from)
           AND (p_date_to IS NULL OR d.sent_at < p_date_to)
           AND (p_received_from IS NULL OR d.received_at >= p_received_from)
           AND (p_received_to IS NULL OR d.received_at < p_received_to)
           AND (p_mailbox IS NULL OR p_mailbox = ANY (d.mailboxes))
         LIMIT p_cap_total
    ),
    numbered AS (
        SELECT f.*, row_number() OVER () AS n FROM found f
    ),
    page AS (
        -- One order for every page: the first p_rank_limit found (storage
        -- order) best first, then the rest in storage order, unranked.
        SELECT r.archive_id, r.sent_at, r.received_at, r.score, r.n
          FROM (SELECT m.archive_id, m.sent_at, m.received_at, m.n,
                       m.n > p_rank_limit AS unranked,
                       CASE WHEN m.n <= p_rank_limit
                            THEN ts_rank_cd(m.rank_vector, v_query) ELSE 0 END AS score
                  FROM numbered m) r
         ORDER BY r.unranked, CASE WHEN r.unranked THEN r.n END, r.score DESC,
                  r.sent_at DESC NULLS LAST, r.archive_id DESC
         LIMIT p_page_size OFFSET p_page_offset
    )
    SELECT t.total, p.archive_id, d.subject, d.sender, p.sent_at, p.received_at, p.score,
           left(d.body, 2000), querytree(v_query)
      FROM (SELECT count(*) AS total FROM found) t
      LEFT JOIN page p ON true
      LEFT JOIN mail_search_documents d
             ON d.tenant_slug = p_tenant AND d.archive_id = p.archive_id
     ORDER BY p.n > p_rank_limit, CASE WHEN p.n > p_rank_limit THEN p.n END,
              p.score DESC, p.sent_at DESC NULLS LAST, p.archive_id DESC;
    RETURN;
END IF;
-- 'sent' or 'received': every match sorted by that date (migration 0020).
RETURN QUERY
WITH matches AS (
    SELECT d.archive_id, d.sent_at, d.received_at
      FROM mail_search_documents d
     WHERE d.tenant_slug = p_tenant
       AND d.search @@ v_query
       AND (p_sender IS NULL OR p_sender = ANY (d.sender_addresses))
       AND (p_date_from IS NULL OR d.sent_at >= p_date_from)
       AND (p_date_to IS NULL OR d.sent_at < p_date_to)
       AND (p_received_from IS NULL OR d.received_at >= p_received_from)
       AND (p_received_to IS NULL OR d.received_at < p_received_to)
       AND (p_mailbox IS NULL OR p_mailbox = ANY (d.mailboxes))
),
kept AS MATERIALIZED (
    -- the newest p_cap_total
    SELECT c.* FROM (
        SELECT m.archive_id, m.sent_at, m.received_at,
               row_number() OVER (ORDER BY
                   CASE WHEN p_sort = 'sent' THEN m.sent_at ELSE m.received_at END
                       DESC NULLS LAST, m.archive_id DESC) AS found_order
          FROM matches m) c
     WHERE c.found_order <= p_cap_total
),
ranked AS (
    SELECT r.archive_id, r.sent_at, r.received_at, c.found_order,
           ts_rank_cd(coalesce(r.rank_search, r.search), v_query) AS score
      FROM (SELECT k.archive_id, k.found_order FROM kept k
             ORDER BY k.found_order LIMIT p_rank_limit) c
      JOIN mail_search_documents r ON r.tenant_slug = p_tenant AND r.archive_id = c.archive_id
),
page AS (
    SELECT k.archive_id, k.sent_at, k.received_at, k.score, k.found_order
      FROM ranked k
     ORDER BY k.found_order
     LIMIT p_page_size OFFSET p_page_offset
)
SELECT t.total, p.archive_id, d.subject, d.sender, p.sent_at, p.received_at, p.score,
       left(d.body, 2000), querytree(v_query)
  FROM (SELECT count(*) AS total FROM kept) t
  LEFT JOIN page p ON true
  LEFT JOIN mail_search_documents d ON d.tenant_slug = p_tenant AND d.archive_id = p.archive_id
 ORDER BY p.found_order;
END;
$$;
