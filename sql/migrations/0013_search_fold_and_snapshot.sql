-- Search in every script (issue 12): German spellings folded alike, the
-- query built by the client from the shared search language
-- (index/base.py parse_query), and one language per message where it is known.

-- German mail writes umlauts and ß two ways (Grüße / Gruesse, Straße /
-- Strasse). Under the german configuration both forms become one: ae, oe,
-- ue are read as ä, ö, ü, as Snowball's german2 variant does; the stemmer
-- itself turns ß into ss. Applied to the document and to the query alike,
-- so a word like Quelle (read as qülle) still finds itself; and only for
-- german: an English 'blue' must stay 'blue' for the English stemmer.
-- Plain replace(): a regular expression here cost 10-40 ms per message.
CREATE FUNCTION nexarch_mail_fold(config regconfig, input text)
RETURNS text LANGUAGE sql IMMUTABLE PARALLEL SAFE AS $$
    SELECT CASE WHEN config = 'german'::regconfig
                THEN replace(replace(replace(lower(input), 'ue', 'ü'), 'ae', 'ä'), 'oe', 'ö')
                ELSE input END
$$;

-- The weighted document vector under each configuration the message is
-- stemmed in: subject (A) > people (B) > body (C) > attachments (D). The
-- caller passes the configurations per message (its detected language, or
-- all configured ones when the language is not clear) and has already split
-- runs of Chinese, Japanese, Korean and Thai into overlapping bigrams.
CREATE OR REPLACE FUNCTION nexarch_mail_tsvector(configs regconfig[], subject text,
                                                 people text, body text, attachments text)
RETURNS tsvector LANGUAGE plpgsql IMMUTABLE PARALLEL SAFE AS $$
DECLARE
    config regconfig;
    result tsvector := ''::tsvector;
BEGIN
    FOREACH config IN ARRAY configs LOOP
        result := result
            || setweight(to_tsvector(config, nexarch_mail_fold(config, subject)), 'A')
            || setweight(to_tsvector(config, nexarch_mail_fold(config, people)), 'B')
            || setweight(to_tsvector(config, nexarch_mail_fold(config, body)), 'C')
            || setweight(to_tsvector(config, nexarch_mail_fold(config, attachments)), 'D');
    END LOOP;
    RETURN result;
END;
$$;

-- The query under each configuration, OR-ed: a document matches if the whole
-- query matches under one language. The text is to_tsquery syntax written by
-- index/postgres.py from the parsed search language: every operand is a
-- quoted run of letters and digits, so user input never reaches the syntax.
-- NULL when no configuration leaves a lexeme (only stop words): no match.
CREATE OR REPLACE FUNCTION nexarch_mail_tsquery(configs regconfig[], query text)
RETURNS tsquery LANGUAGE plpgsql IMMUTABLE PARALLEL SAFE AS $$
DECLARE
    config regconfig;
    one tsquery;
    result tsquery;
BEGIN
    IF query = '' THEN
        RETURN NULL;
    END IF;
    FOREACH config IN ARRAY configs LOOP
        one := to_tsquery(config, nexarch_mail_fold(config, query));
        -- The same lexemes under two languages ('invoic' | 'invoic') would
        -- make the index read the same posting list twice.
        IF numnode(one) > 0 AND (result IS NULL OR one::text <> result::text) THEN
            result := CASE WHEN result IS NULL THEN one ELSE result || one END;
        END IF;
    END LOOP;
    RETURN result;
END;
$$;

-- Ranking reads a small vector: subject, people and the first part of the
-- body (index/postgres.py builds its text). ts_rank_cd on the full vector
-- would fetch and decompress every candidate's whole text (several KB
-- each, stored out of line). NULL on rows indexed before this migration:
-- those rank by the full vector until they are indexed again.
ALTER TABLE mail_search_documents ADD COLUMN rank_search tsvector;

-- One text search, in one statement and one snapshot (STABLE: the calling
-- statement's snapshot): the page, ranked, and the total, counted up to
-- cap_total (the caller shows "1,000+" beyond). Matching uses the GIN index
-- only: a bitmap scan answers @@ from the index without reading the vector,
-- while a sequential or ordered index scan would decompress every row's
-- vector to test it (the planner does not know that cost, so it is told).
-- Ranking is over the first p_rank_limit matches (storage order), not all.
-- No snippet: ts_headline re-parses each hit's text under every language
-- (measured: 5-10 ms a hit on a loaded machine); the caller marks the
-- query's lexemes (querytree) in the head of the body instead.
CREATE FUNCTION nexarch_mail_search(p_configs regconfig[], p_tenant text, p_query_text text,
                                    p_sender text, p_date_from timestamptz,
                                    p_date_to timestamptz, p_mailbox text, p_page_size int,
                                    p_page_offset int, p_cap_total int, p_rank_limit int)
RETURNS TABLE (total bigint, archive_id bigint, subject text, sender_display text,
               sent_at timestamptz, score real, body_head text, lexemes text)
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
candidates AS MATERIALIZED (
    SELECT d.archive_id
      FROM mail_search_documents d, q
     WHERE d.tenant_slug = p_tenant
       AND d.search @@ q.query
       AND (p_sender IS NULL OR p_sender = ANY (d.sender_addresses))
       AND (p_date_from IS NULL OR d.sent_at >= p_date_from)
       AND (p_date_to IS NULL OR d.sent_at < p_date_to)
       AND (p_mailbox IS NULL OR p_mailbox = ANY (d.mailboxes))
     LIMIT p_cap_total
),
ranked AS (
    SELECT r.archive_id, r.sent_at,
           ts_rank_cd(coalesce(r.rank_search, r.search), q.query) AS score
      FROM (SELECT c.archive_id FROM candidates c LIMIT p_rank_limit) c
      JOIN mail_search_documents r ON r.tenant_slug = p_tenant AND r.archive_id = c.archive_id,
           q
),
page AS (
    SELECT k.archive_id, k.sent_at, k.score
      FROM ranked k
     ORDER BY k.score DESC, k.sent_at DESC NULLS LAST, k.archive_id DESC
     LIMIT p_page_size OFFSET p_page_offset
)
SELECT t.total, p.archive_id, d.subject, d.sender, p.sent_at, p.score,
       left(d.body, 2000), querytree(q.query)
  FROM (SELECT count(*) AS total FROM candidates) t
  CROSS JOIN q
  LEFT JOIN page p ON true
  LEFT JOIN mail_search_documents d ON d.tenant_slug = p_tenant AND d.archive_id = p.archive_id
 ORDER BY p.score DESC, p.sent_at DESC NULLS LAST, p.archive_id DESC;
END;
$$;

-- The empty query lists newest first, undated last: an index in that order
-- (ranges on sent_at use it as well as the old one did).
CREATE INDEX mail_search_documents_newest
    ON mail_search_documents (tenant_slug, sent_at DESC NULLS LAST, archive_id DESC);
DROP INDEX mail_search_documents_sent_at;
