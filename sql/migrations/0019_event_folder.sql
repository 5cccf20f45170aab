-- Events name the IMAP folder (decoded) as well as the mailbox: the
-- mail-imported notifications (imported, recovered, unstable, failed,
-- resync) gain a "folder" field, null for a mailbox that is not registered
-- (mail stored through the importer's functions by other code). Adding a
-- field is backward compatible within version 1 (docs/events.md). The three
-- functions are those of 0008 and 0014 with that one field added.

-- The folder a registered mailbox reads, decoded (the registry stores the
-- decoded name: accounts.py, mailboxes.py). Bounded so that a notification
-- stays far below Postgres' 8000-byte limit.
CREATE FUNCTION mail_import_folder(p_tenant text, p_mailbox text) RETURNS text
LANGUAGE sql STABLE AS $$
    SELECT left(m.folder, 1000) FROM mail_import_mailboxes m
     WHERE m.tenant_slug = p_tenant AND m.name = p_mailbox
$$;

CREATE OR REPLACE FUNCTION mail_import_begin(
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
            'folder', mail_import_folder(p_tenant, p_mailbox),
            'old_uidvalidity', old_uidvalidity, 'uidvalidity', coalesce(p_uidvalidity, 0),
            'unstable', mode = 'unstable')::text);
    END IF;
END $$;

CREATE OR REPLACE FUNCTION mail_import_message(
    p_tenant text, p_mailbox text, p_uidvalidity bigint, p_uid bigint, p_mode text,
    p_sha256 bytea, p_size integer, p_raw bytea,
    p_internaldate timestamptz DEFAULT NULL, p_note text DEFAULT NULL,
    OUT archive_id bigint, OUT created boolean, OUT job_id bigint, OUT location_added boolean)
LANGUAGE plpgsql AS $$
BEGIN
    IF p_mode = 'new' THEN
        UPDATE mail_import_state s
           SET last_synced_uid = p_uid, updated_at = now()
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
    ELSIF p_mode <> 'unstable' THEN
        RAISE EXCEPTION 'unknown import mode %', p_mode USING ERRCODE = 'invalid_parameter_value';
    END IF;

    SELECT * INTO archive_id, created, job_id, location_added
      FROM mail_archive_store(p_tenant, p_sha256, p_size, p_raw,
                              p_mailbox, p_uidvalidity, p_uid, p_internaldate, p_note);

    -- Distinct messages this mailbox added: new to the archive, or new to
    -- this mailbox (already archived from another folder). The same message
    -- under a new UIDVALIDITY, or seen again by an unstable pass, is not.
    IF created OR (location_added AND NOT EXISTS (
            SELECT 1 FROM mail_archive_locations l
             WHERE l.archive_id = mail_import_message.archive_id
               AND l.tenant_slug = p_tenant AND l.mailbox = p_mailbox
               AND (l.uidvalidity, l.uid) <> (p_uidvalidity, p_uid))) THEN
        UPDATE mail_import_state s
           SET imported_total = s.imported_total + 1, updated_at = now()
         WHERE s.tenant_slug = p_tenant AND s.mailbox_name = p_mailbox;
    END IF;

    IF p_mode <> 'unstable' OR created OR location_added THEN
        PERFORM pg_notify('nexarch_mail_imported', json_build_object(
            'v', 1, 'event', CASE p_mode WHEN 'new' THEN 'imported' ELSE p_mode END,
            'tenant', p_tenant, 'mailbox', p_mailbox,
            'folder', mail_import_folder(p_tenant, p_mailbox),
            'uidvalidity', p_uidvalidity, 'uid', p_uid,
            'archive_id', archive_id, 'duplicate', NOT created)::text);
    END IF;
END $$;

CREATE OR REPLACE FUNCTION mail_import_failure(
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
        'folder', mail_import_folder(p_tenant, p_mailbox),
        'uidvalidity', p_uidvalidity, 'uid', p_uid, 'attempts', n,
        'error', left(p_error, 200))::text);
    RETURN n;
END $$;
