-- An import of a message that an erasure has locked (lifecycle.sql,
-- archived_of, FOR UPDATE) but not yet deleted found the row, then failed
-- its location insert with a foreign-key error (23503, "rejected") once the
-- erasure's DELETE committed: the message was left unarchived until a later
-- run (a race audit). The lookup of the existing row now takes the lock the
-- location's foreign key takes anyway (KEY SHARE), at once: it waits for
-- the erasure, and finding the row gone, the loop archives the message
-- anew. Otherwise as in 0014.
CREATE OR REPLACE FUNCTION mail_archive_store(
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
         WHERE a.tenant_slug = p_tenant AND a.sha256 = p_sha256
           FOR KEY SHARE;
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
