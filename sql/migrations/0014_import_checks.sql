-- Importer, issue 10: what a server hands over is checked before it is
-- archived, the state says why a mailbox is slow or failing, and the
-- counters mean what their names say.

-- Per location: the server's received date (INTERNALDATE) and, when a
-- message was archived although its size never matched RFC822.SIZE, that
-- fact (e.g. "size mismatch: RFC822.SIZE 1200, received 1180 bytes").
ALTER TABLE mail_archive_locations
    ADD COLUMN internaldate timestamptz,
    ADD COLUMN import_note  text;

ALTER TABLE mail_import_state
    -- Set when the runner gave up holding IDLE for this mailbox and syncs
    -- at its interval instead ("idle unavailable: ..."); NULL while IDLE works.
    ADD COLUMN idle_status      text,
    -- Messages per FETCH the importer asks for: halved after a reply was
    -- cut, grown back after clean replies (persisted: a server that cuts
    -- every session is not asked for the same 200 again).
    ADD COLUMN fetch_window     integer,
    -- When the last attempt (connect, login, sync) began, successful or not.
    ADD COLUMN last_attempt_at  timestamptz,
    ADD CONSTRAINT mail_import_state_fetch_window CHECK (fetch_window BETWEEN 1 AND 100000);

-- The one archive path again, with the location's INTERNALDATE and note.
DROP FUNCTION mail_archive_store(text, bytea, integer, bytea, text, bigint, bigint);
CREATE FUNCTION mail_archive_store(
    p_tenant text, p_sha256 bytea, p_size integer, p_raw bytea,
    p_mailbox text, p_uidvalidity bigint, p_uid bigint,
    p_internaldate timestamptz DEFAULT NULL, p_note text DEFAULT NULL,
    OUT archive_id bigint, OUT created boolean, OUT job_id bigint, OUT location_added boolean)
LANGUAGE plpgsql AS $$
BEGIN
    FOR attempt IN 1..5 LOOP
        INSERT INTO mail_archive (tenant_slug, sha256, size_bytes, raw)
        VALUES (p_tenant, p_sha256, p_size, p_raw)
        ON CONFLICT (tenant_slug, sha256) DO NOTHING
        RETURNING id INTO archive_id;
        IF archive_id IS NOT NULL THEN
            created := true;
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
        INSERT INTO mail_archive_locations AS l
               (archive_id, tenant_slug, mailbox, uidvalidity, uid, internaldate, import_note)
        VALUES (archive_id, p_tenant, p_mailbox, p_uidvalidity, p_uid, p_internaldate, p_note)
        ON CONFLICT (tenant_slug, mailbox, uidvalidity, uid)
        DO UPDATE SET archive_id = EXCLUDED.archive_id, seen_at = now(),
                      internaldate = EXCLUDED.internaldate, import_note = EXCLUDED.import_note
              WHERE l.archive_id <> EXCLUDED.archive_id
        RETURNING true INTO location_added;
        location_added := coalesce(location_added, false);
    END IF;
END $$;

-- One imported message, one transaction (see 0008). Changed: the location
-- carries INTERNALDATE and a note, and imported_total counts only messages
-- this mailbox added (a resync re-map or an unstable pass seeing known mail
-- again is not counted).
DROP FUNCTION mail_import_message(text, text, bigint, bigint, text, bytea, integer, bytea);
CREATE FUNCTION mail_import_message(
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
            'uidvalidity', p_uidvalidity, 'uid', p_uid,
            'archive_id', archive_id, 'duplicate', NOT created)::text);
    END IF;
END $$;
