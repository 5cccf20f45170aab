-- The IMAP importer: registered mailboxes, their sync state (the seed's
-- mail_import_state), per-message failures, and the functions that make each
-- imported message ONE transaction (archive + index job + advance + NOTIFY).
--
-- Every write of the importer is a single function call, so each message
-- costs one round trip and commits on its own (progress after every
-- message), and the NOTIFY is sent at that commit: listeners see
-- mail-imported events in commit order, which per mailbox is UID order.

-- Where to fetch mail from. Passwords are never stored in clear text: the
-- row holds a reference (env:NAME, file:/path) or a value sealed with the
-- operator's key (sealed:...), see nexarch_events/importer/secrets.py.
CREATE TABLE mail_import_mailboxes (
    id            bigint      GENERATED ALWAYS AS IDENTITY PRIMARY KEY,
    tenant_slug   text        NOT NULL,
    name          text        NOT NULL,
    host          text        NOT NULL,
    port          integer     NOT NULL,
    tls_mode      text        NOT NULL,
    ca_file       text,
    username      text        NOT NULL,
    password_ref  text        NOT NULL,
    folder        text        NOT NULL DEFAULT 'INBOX',
    use_idle      boolean     NOT NULL DEFAULT true,
    enabled       boolean     NOT NULL DEFAULT true,
    created_at    timestamptz NOT NULL DEFAULT now(),

    CONSTRAINT mail_import_mailboxes_name_per_tenant UNIQUE (tenant_slug, name),
    CONSTRAINT mail_import_mailboxes_tenant_slug
        CHECK (tenant_slug ~ '^[a-z0-9]([a-z0-9-]{0,61}[a-z0-9])?$'),
    CONSTRAINT mail_import_mailboxes_name
        CHECK (name ~ '^[A-Za-z0-9][A-Za-z0-9._@+/-]{0,199}$'),
    CONSTRAINT mail_import_mailboxes_host CHECK (host ~ '^[A-Za-z0-9.:-]{1,253}$'),
    CONSTRAINT mail_import_mailboxes_port CHECK (port BETWEEN 1 AND 65535),
    CONSTRAINT mail_import_mailboxes_tls_mode CHECK (tls_mode IN ('implicit', 'starttls', 'plain')),
    CONSTRAINT mail_import_mailboxes_username CHECK (length(username) BETWEEN 1 AND 320),
    -- A reference or a sealed value, never the password itself.
    CONSTRAINT mail_import_mailboxes_password_ref
        CHECK (password_ref ~ '^(env:[A-Za-z_][A-Za-z0-9_]*|file:/.+|sealed:v1:[A-Za-z0-9_=-]+)$'),
    CONSTRAINT mail_import_mailboxes_folder CHECK (length(folder) BETWEEN 1 AND 1000)
);

-- The seed's sync state, keyed by (tenant, mailbox name), plus what an
-- operator needs to see about the last run.
CREATE TABLE mail_import_state (
    tenant_slug          text        NOT NULL,
    mailbox_name         text        NOT NULL,
    last_uidvalidity     bigint      NOT NULL DEFAULT 0,
    last_synced_uid      bigint      NOT NULL DEFAULT 0,
    interval_seconds     integer     NOT NULL DEFAULT 300,
    server_uidnext       bigint,
    server_exists        bigint,
    imported_total       bigint      NOT NULL DEFAULT 0,
    last_run_started_at  timestamptz,
    last_run_finished_at timestamptz,
    last_success_at      timestamptz,
    last_error           text,
    last_error_at        timestamptz,
    -- What the last run found suspicious (UIDVALIDITY 0, UID 0, ...).
    warning              text,
    -- Set by "sync now" (CLI, API); the scheduler runs the mailbox at once.
    sync_requested_at    timestamptz,
    updated_at           timestamptz NOT NULL DEFAULT now(),

    PRIMARY KEY (tenant_slug, mailbox_name),
    CONSTRAINT mail_import_state_uidvalidity CHECK (last_uidvalidity BETWEEN 0 AND 4294967295),
    CONSTRAINT mail_import_state_uid CHECK (last_synced_uid BETWEEN 0 AND 4294967295),
    CONSTRAINT mail_import_state_interval CHECK (interval_seconds BETWEEN 1 AND 604800)
);

-- A message the server would not hand over properly (BODY[] NIL, an empty
-- body, a reply with UID 0). The watermark may pass it because this row
-- remembers it durably: every run retries it until it imports.
CREATE TABLE mail_import_failures (
    tenant_slug     text        NOT NULL,
    mailbox_name    text        NOT NULL,
    uidvalidity     bigint      NOT NULL,
    uid             bigint      NOT NULL,
    attempts        integer     NOT NULL DEFAULT 1,
    last_error      text        NOT NULL,
    first_failed_at timestamptz NOT NULL DEFAULT now(),
    last_failed_at  timestamptz NOT NULL DEFAULT now(),

    PRIMARY KEY (tenant_slug, mailbox_name, uidvalidity, uid),
    CONSTRAINT mail_import_failures_uid CHECK (uid BETWEEN 1 AND 4294967295)
);

-- The one archive path: the message row (once per tenant and content hash),
-- its index job (only when new), and where it was seen. Used by
-- Archive.store and by the importer's per-message function below.
CREATE FUNCTION mail_archive_store(
    p_tenant text, p_sha256 bytea, p_size integer, p_raw bytea,
    p_mailbox text, p_uidvalidity bigint, p_uid bigint,
    OUT archive_id bigint, OUT created boolean, OUT job_id bigint, OUT location_added boolean)
LANGUAGE plpgsql AS $$
BEGIN
    -- A concurrent store of the same bytes makes ON CONFLICT wait for it;
    -- if it committed, the SELECT (a new statement, a new snapshot) finds
    -- its row; if it rolled back, the next attempt inserts.
    FOR attempt IN 1..5 LOOP
        INSERT INTO mail_archive (tenant_slug, sha256, size_bytes, raw)
        VALUES (p_tenant, p_sha256, p_size, p_raw)
        ON CONFLICT (tenant_slug, sha256) DO NOTHING
        RETURNING id INTO archive_id;
        IF archive_id IS NOT NULL THEN
            created := true;
            -- The queue key is the archive id, so a later delete of this
            -- message is ordered behind its index job (guarantee 3).
            INSERT INTO mail_index_jobs (job_type, tenant_slug, message_id, payload)
            VALUES ('index', p_tenant, archive_id::text, jsonb_build_object('archive_id', archive_id))
            RETURNING id INTO job_id;
            EXIT;
        END IF;
        SELECT a.id INTO archive_id FROM mail_archive a
         WHERE a.tenant_slug = p_tenant AND a.sha256 = p_sha256;
        IF FOUND THEN
            created := false;
            EXIT;
        END IF;
    END LOOP;
    IF archive_id IS NULL THEN
        RAISE EXCEPTION 'message could not be archived: lost five races for the same hash'
              USING ERRCODE = 'serialization_failure';
    END IF;
    location_added := false;
    IF p_mailbox IS NOT NULL AND p_uid IS NOT NULL THEN
        -- Same key, other message: only a server with unstable UIDs does
        -- that (UIDVALIDITY 0); the newest sighting wins.
        INSERT INTO mail_archive_locations AS l (archive_id, tenant_slug, mailbox, uidvalidity, uid)
        VALUES (archive_id, p_tenant, p_mailbox, p_uidvalidity, p_uid)
        ON CONFLICT (tenant_slug, mailbox, uidvalidity, uid)
        DO UPDATE SET archive_id = EXCLUDED.archive_id, seen_at = now()
              WHERE l.archive_id <> EXCLUDED.archive_id
        RETURNING true INTO location_added;
        location_added := coalesce(location_added, false);
    END IF;
END $$;

-- Start of a run: record what the server said and decide the mode.
--   first:    no UIDVALIDITY recorded yet; import everything above 0
--   delta:    same UIDVALIDITY; import above last_synced_uid
--   resync:   UIDVALIDITY changed; watermark reset, old failures dropped,
--             a "resync" event published, full pass (dedup by content hash)
--   unstable: the server sent UIDVALIDITY 0 or none; a full content-hash
--             pass that trusts no UID, the watermark left alone
CREATE FUNCTION mail_import_begin(
    p_tenant text, p_mailbox text, p_uidvalidity bigint, p_uidnext bigint, p_exists bigint,
    OUT mode text, OUT last_synced_uid bigint, OUT old_uidvalidity bigint)
LANGUAGE plpgsql AS $$
DECLARE
    st mail_import_state;
BEGIN
    INSERT INTO mail_import_state (tenant_slug, mailbox_name)
    VALUES (p_tenant, p_mailbox) ON CONFLICT DO NOTHING;
    SELECT * INTO st FROM mail_import_state
     WHERE tenant_slug = p_tenant AND mailbox_name = p_mailbox FOR UPDATE;
    old_uidvalidity := st.last_uidvalidity;
    IF p_uidvalidity IS NULL OR p_uidvalidity = 0 THEN
        mode := 'unstable';
        last_synced_uid := st.last_synced_uid;
    ELSIF st.last_uidvalidity = 0 THEN
        mode := 'first';
        last_synced_uid := 0;
    ELSIF st.last_uidvalidity = p_uidvalidity THEN
        mode := 'delta';
        last_synced_uid := st.last_synced_uid;
    ELSE
        mode := 'resync';
        last_synced_uid := 0;
        DELETE FROM mail_import_failures f
         WHERE f.tenant_slug = p_tenant AND f.mailbox_name = p_mailbox;
    END IF;
    UPDATE mail_import_state s
       SET last_uidvalidity = CASE WHEN mode IN ('first', 'resync') THEN p_uidvalidity
                                   ELSE s.last_uidvalidity END,
           last_synced_uid = CASE WHEN mode IN ('first', 'resync') THEN 0
                                  ELSE s.last_synced_uid END,
           server_uidnext = p_uidnext, server_exists = p_exists,
           last_run_started_at = now(), sync_requested_at = NULL, updated_at = now()
     WHERE s.tenant_slug = p_tenant AND s.mailbox_name = p_mailbox;
    IF mode IN ('resync', 'unstable') THEN
        PERFORM pg_notify('nexarch_mail_imported', json_build_object(
            'v', 1, 'event', 'resync', 'tenant', p_tenant, 'mailbox', p_mailbox,
            'old_uidvalidity', old_uidvalidity, 'uidvalidity', coalesce(p_uidvalidity, 0),
            'unstable', mode = 'unstable')::text);
    END IF;
END $$;

-- One imported message, one transaction: advance (p_mode 'new'), or clear a
-- recorded failure ('recovered'), or neither ('unstable'); then archive,
-- enqueue, record the location, and NOTIFY mail-imported.
CREATE FUNCTION mail_import_message(
    p_tenant text, p_mailbox text, p_uidvalidity bigint, p_uid bigint, p_mode text,
    p_sha256 bytea, p_size integer, p_raw bytea,
    OUT archive_id bigint, OUT created boolean, OUT job_id bigint, OUT location_added boolean)
LANGUAGE plpgsql AS $$
BEGIN
    IF p_mode = 'new' THEN
        -- The watermark only moves up, and only under the UIDVALIDITY this
        -- run began with: a second writer (it cannot happen under the run
        -- lock) would fail here instead of importing twice.
        UPDATE mail_import_state s
           SET last_synced_uid = p_uid, imported_total = s.imported_total + 1, updated_at = now()
         WHERE s.tenant_slug = p_tenant AND s.mailbox_name = p_mailbox
           AND s.last_uidvalidity = p_uidvalidity AND s.last_synced_uid < p_uid;
        IF NOT FOUND THEN
            RAISE EXCEPTION 'sync state of %/% is not below UID % at UIDVALIDITY %',
                            p_tenant, p_mailbox, p_uid, p_uidvalidity
                  USING ERRCODE = 'NXI01';
        END IF;
    ELSIF p_mode = 'recovered' THEN
        DELETE FROM mail_import_failures f
         WHERE f.tenant_slug = p_tenant AND f.mailbox_name = p_mailbox
           AND f.uidvalidity = p_uidvalidity AND f.uid = p_uid;
        IF NOT FOUND THEN
            RAISE EXCEPTION 'no recorded failure for %/% UID % at UIDVALIDITY %',
                            p_tenant, p_mailbox, p_uid, p_uidvalidity
                  USING ERRCODE = 'NXI01';
        END IF;
        UPDATE mail_import_state s
           SET imported_total = s.imported_total + 1, updated_at = now()
         WHERE s.tenant_slug = p_tenant AND s.mailbox_name = p_mailbox;
    ELSIF p_mode <> 'unstable' THEN
        RAISE EXCEPTION 'unknown import mode %', p_mode USING ERRCODE = 'invalid_parameter_value';
    END IF;

    SELECT * INTO archive_id, created, job_id, location_added
      FROM mail_archive_store(p_tenant, p_sha256, p_size, p_raw,
                              p_mailbox, p_uidvalidity, p_uid);

    -- In an unstable pass every message is fetched again each run: only a
    -- message that changed something is news.
    IF p_mode <> 'unstable' OR created OR location_added THEN
        PERFORM pg_notify('nexarch_mail_imported', json_build_object(
            'v', 1, 'event', CASE p_mode WHEN 'new' THEN 'imported' ELSE p_mode END,
            'tenant', p_tenant, 'mailbox', p_mailbox,
            'uidvalidity', p_uidvalidity, 'uid', p_uid,
            'archive_id', archive_id, 'duplicate', NOT created)::text);
    END IF;
END $$;

-- A message the server did not hand over: remember it (and, on first
-- sight, move the watermark past it, so later messages go on), NOTIFY.
CREATE FUNCTION mail_import_failure(
    p_tenant text, p_mailbox text, p_uidvalidity bigint, p_uid bigint,
    p_error text, p_retry boolean)
RETURNS integer
LANGUAGE plpgsql AS $$
DECLARE
    n integer;
BEGIN
    IF NOT p_retry THEN
        UPDATE mail_import_state s
           SET last_synced_uid = p_uid, updated_at = now()
         WHERE s.tenant_slug = p_tenant AND s.mailbox_name = p_mailbox
           AND s.last_uidvalidity = p_uidvalidity AND s.last_synced_uid < p_uid;
        IF NOT FOUND THEN
            RAISE EXCEPTION 'sync state of %/% is not below UID % at UIDVALIDITY %',
                            p_tenant, p_mailbox, p_uid, p_uidvalidity
                  USING ERRCODE = 'NXI01';
        END IF;
    END IF;
    INSERT INTO mail_import_failures AS f
           (tenant_slug, mailbox_name, uidvalidity, uid, last_error)
    VALUES (p_tenant, p_mailbox, p_uidvalidity, p_uid, left(p_error, 1000))
    ON CONFLICT (tenant_slug, mailbox_name, uidvalidity, uid)
    DO UPDATE SET attempts = f.attempts + 1, last_error = EXCLUDED.last_error,
                  last_failed_at = now()
    RETURNING attempts INTO n;
    PERFORM pg_notify('nexarch_mail_imported', json_build_object(
        'v', 1, 'event', 'failed', 'tenant', p_tenant, 'mailbox', p_mailbox,
        'uidvalidity', p_uidvalidity, 'uid', p_uid, 'attempts', n,
        'error', left(p_error, 200))::text);
    RETURN n;
END $$;
