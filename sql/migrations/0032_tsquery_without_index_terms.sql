-- A query that cannot be understood finds nothing, never everything.
--
-- Postgres drops stop words ("in", "the"; "und", "der" in german) and
-- characters that make no lexeme (a lone combining mark) from a query. With
-- an exclusion beside them, what was left was the exclusion alone: "in
-- -otter" became !'otter', which matched every message without "otter"
-- (search, and the erasure and legal-hold queries that use the same text).
-- The search language refuses an exclusion alone, but could not know which
-- words Postgres drops. Now a configuration whose query keeps no term the
-- index can look up (querytree() is 'T': only exclusions) contributes
-- nothing, and with none left the query is NULL: no match. Found by an
-- audit; tests in test_index_contract.py and test_postgres_index.py.
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
        IF numnode(one) > 0 AND querytree(one) <> 'T'
           AND (result IS NULL OR one::text <> result::text) THEN
            result := CASE WHEN result IS NULL THEN one ELSE result || one END;
        END IF;
    END LOOP;
    RETURN result;
END;
$$;
