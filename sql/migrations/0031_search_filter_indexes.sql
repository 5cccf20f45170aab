-- A search without words, filtered by sender or mailbox ("all mail from
-- anna@example.org"), read the tenant's documents newest first and tested
-- each one's sender or mailboxes until it had counted enough: a rare
-- sender read the whole tenant (20,015 entries for 10 messages of 20,000;
-- 25-30 ms at 100,000 messages, linear in the tenant's size). Found beside
-- stop 24's SQL audit; tests/integration/test_search_filter_reads.py.
--
-- Each filter gets an index of its own, and the empty query is planned per
-- call with its values (EXECUTE; nexarch_mail_search, migration 0023, gets
-- the same from plan_cache_mode): the
-- planner then reads a rare sender's or mailbox's messages through these
-- indexes and sorts them, and still walks the date index for a filter most
-- messages pass. "x @> ARRAY[v]" is the GIN-searchable form of "v = ANY(x)"
-- (the arrays hold no NULL). Every index write maintains the two indexes;
-- their entries are short (an address or two, a mailbox name or two).
CREATE INDEX mail_search_documents_senders
    ON mail_search_documents USING gin (sender_addresses);
CREATE INDEX mail_search_documents_mailboxes
    ON mail_search_documents USING gin (mailboxes);

-- The empty query of tenant p_tenant: every message that passes the
-- filters, newest first by p_sort ('received': received date; any other:
-- sent date), unknown dates last, ties by the higher id; counted up to
-- p_cap_total in the same statement (one snapshot). One row at least: a
-- page past the end gives a single row with the total and NULL archive_id.
CREATE FUNCTION nexarch_mail_search_all(p_tenant text, p_sender text,
                                        p_date_from timestamptz, p_date_to timestamptz,
                                        p_mailbox text, p_page_size int, p_page_offset int,
                                        p_cap_total int, p_received_from timestamptz,
                                        p_received_to timestamptz, p_sort text)
RETURNS TABLE (total bigint, archive_id bigint, subject text, sender_display text,
               sent_at timestamptz, received_at timestamptz, score real, body_head text,
               lexemes text)
LANGUAGE plpgsql STABLE PARALLEL SAFE AS $$
DECLARE
    -- The date the order is by; the column name comes from this list only.
    v_by text := CASE WHEN p_sort = 'received' THEN 'received_at' ELSE 'sent_at' END;
BEGIN
    -- EXECUTE plans each call with its values, so the filters that are not
    -- given drop out of the plan.
    RETURN QUERY EXECUTE format($q$
        WITH found AS MATERIALIZED (
            SELECT d.archive_id, d.%1$I AS sort_at
              FROM mail_search_documents d
             WHERE d.tenant_slug = $1
               AND ($2::text IS NULL OR d.sender_addresses @> ARRAY[$2::text])
               AND ($3::text IS NULL OR d.mailboxes @> ARRAY[$3::text])
               AND ($4::timestamptz IS NULL OR d.sent_at >= $4)
               AND ($5::timestamptz IS NULL OR d.sent_at < $5)
               AND ($6::timestamptz IS NULL OR d.received_at >= $6)
               AND ($7::timestamptz IS NULL OR d.received_at < $7)
             ORDER BY d.%1$I DESC NULLS LAST, d.archive_id DESC
             LIMIT $8
        ),
        page AS (
            SELECT f.archive_id, f.sort_at FROM found f
             ORDER BY f.sort_at DESC NULLS LAST, f.archive_id DESC
             LIMIT $9 OFFSET $10
        )
        SELECT t.total, p.archive_id, d.subject, d.sender, d.sent_at, d.received_at,
               0::real, left(d.body, 200), NULL::text
          FROM (SELECT count(*) AS total FROM found) t
          LEFT JOIN page p ON true
          LEFT JOIN mail_search_documents d
                 ON d.tenant_slug = $1 AND d.archive_id = p.archive_id
         ORDER BY p.sort_at DESC NULLS LAST, p.archive_id DESC$q$, v_by)
    USING p_tenant, p_sender, p_mailbox, p_date_from, p_date_to, p_received_from,
          p_received_to, p_cap_total, p_page_size, p_page_offset;
END $$;
