-- The Postgres full-text search backend (index/postgres.py): the embedded
-- default, in the same database, nothing else to run.

CREATE TABLE mail_search_documents (
    tenant_slug       text        NOT NULL,
    archive_id        bigint      NOT NULL,
    subject           text        NOT NULL,
    sender            text        NOT NULL,
    sender_addresses  text[]      NOT NULL,
    recipients        text        NOT NULL,
    body              text        NOT NULL,
    attachment_names  text        NOT NULL,
    attachment_text   text        NOT NULL,
    sent_at           timestamptz,
    mailboxes         text[]      NOT NULL,
    size_bytes        bigint      NOT NULL,
    search            tsvector    NOT NULL,
    indexed_at        timestamptz NOT NULL DEFAULT now(),
    PRIMARY KEY (tenant_slug, archive_id)
);

CREATE INDEX mail_search_documents_search ON mail_search_documents USING gin (search);
CREATE INDEX mail_search_documents_sent_at ON mail_search_documents (tenant_slug, sent_at);

-- The weighted document vector, once per configured text-search
-- configuration: subject (A) > people (B) > body (C) > attachments (D).
-- Several configurations (default german + english) so inflected forms of
-- either language match: 'Rechnungen' -> rechnung, 'running' -> run.
CREATE FUNCTION nexarch_mail_tsvector(configs regconfig[], subject text, people text,
                                      body text, attachments text)
RETURNS tsvector LANGUAGE plpgsql IMMUTABLE PARALLEL SAFE AS $$
DECLARE
    config regconfig;
    result tsvector := ''::tsvector;
BEGIN
    FOREACH config IN ARRAY configs LOOP
        result := result
            || setweight(to_tsvector(config, subject), 'A')
            || setweight(to_tsvector(config, people), 'B')
            || setweight(to_tsvector(config, body), 'C')
            || setweight(to_tsvector(config, attachments), 'D');
    END LOOP;
    RETURN result;
END;
$$;

-- The user's query under each configuration, OR-ed: a document matches if
-- the whole query matches under one language. websearch_to_tsquery never
-- raises on syntax: hostile input is searched for as words.
CREATE FUNCTION nexarch_mail_tsquery(configs regconfig[], query text)
RETURNS tsquery LANGUAGE plpgsql IMMUTABLE PARALLEL SAFE AS $$
DECLARE
    config regconfig;
    one tsquery;
    result tsquery;
BEGIN
    FOREACH config IN ARRAY configs LOOP
        one := websearch_to_tsquery(config, query);
        IF numnode(one) > 0 THEN
            result := CASE WHEN result IS NULL THEN one ELSE result || one END;
        END IF;
    END LOOP;
    RETURN result;
END;
$$;

-- A snippet under the first configuration whose parse highlights anything.
CREATE FUNCTION nexarch_mail_headline(configs regconfig[], document text, query tsquery,
                                      options text)
RETURNS text LANGUAGE plpgsql IMMUTABLE PARALLEL SAFE AS $$
DECLARE
    config regconfig;
    headline text;
    first text;
BEGIN
    IF query IS NULL THEN
        RETURN left(document, 200);
    END IF;
    FOREACH config IN ARRAY configs LOOP
        headline := ts_headline(config, document, query, options);
        IF strpos(headline, U&'\E000') > 0 THEN
            RETURN headline;
        END IF;
        first := coalesce(first, headline);
    END LOOP;
    RETURN first;
END;
$$;
