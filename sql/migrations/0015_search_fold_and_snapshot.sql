-- Search in every script (issue 12): German spellings folded alike, the
-- query built by the client from the shared search language
-- (index/base.py parse_query), and one language per message where it is known.

-- German mail writes umlauts and ß two ways (Grüße / Gruesse, Straße /
-- Strasse). Under the german configuration both forms become one: ae, oe,
-- ue (not after q: Quelle, Frequenz) are read as ä, ö, ü, as Snowball's
-- german2 variant does; the stemmer itself turns ß into ss. Applied to the
-- document and to the query alike, and only for german: an English 'blue'
-- must stay 'blue' for the English stemmer.
CREATE FUNCTION nexarch_mail_fold(config regconfig, input text)
RETURNS text LANGUAGE sql IMMUTABLE PARALLEL SAFE AS $$
    SELECT CASE WHEN config = 'german'::regconfig
                THEN replace(replace(regexp_replace(lower(input), '(?<!q)ue', 'ü', 'g'),
                                     'ae', 'ä'), 'oe', 'ö')
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
        IF numnode(one) > 0 THEN
            result := CASE WHEN result IS NULL THEN one ELSE result || one END;
        END IF;
    END LOOP;
    RETURN result;
END;
$$;
