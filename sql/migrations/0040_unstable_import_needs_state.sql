-- An unstable pass (UIDVALIDITY 0 or none: every message is imported by
-- content hash, with no watermark to check) went on archiving after its
-- mailbox was removed (mailbox remove, erase --unregister-mailboxes, a
-- tenant's erasure): mail erased a moment before came back (stop 27's
-- leftovers). Mode "new" already needs the state row at the UIDVALIDITY it
-- began with, and "recovered" its failure row. "unstable" now needs the
-- run's registration, as mail_import_begin does (0038): p_mailbox_id, held
-- until the import commits (a removal waits for it); NXI03
-- (importer/state.py: MailboxRemoved) once it is gone, also when a mailbox
-- of the same name was added again meanwhile (a review audit: checking for
-- a state row let the old run import into the new registration). Without
-- an id (a mailbox not registered: tests, embedders), the state row must
-- be there (mail_import_still_registered, held until the transaction
-- ends). Only that check is new; the rest is migration 0028's function.
CREATE FUNCTION mail_import_still_registered(p_tenant text, p_mailbox text,
                                             p_mailbox_id bigint)
RETURNS void
LANGUAGE plpgsql AS $$
BEGIN
    IF p_mailbox_id IS NOT NULL THEN
        PERFORM 1 FROM mail_import_mailboxes m
         WHERE m.id = p_mailbox_id AND m.tenant_slug = p_tenant AND m.name = p_mailbox
           FOR KEY SHARE;
    ELSE
        PERFORM 1 FROM mail_import_state s
         WHERE s.tenant_slug = p_tenant AND s.mailbox_name = p_mailbox
           FOR NO KEY UPDATE;
    END IF;
    IF NOT FOUND THEN
        RAISE EXCEPTION 'mailbox %/% is not registered any more', p_tenant, p_mailbox
              USING ERRCODE = 'NXI03';
    END IF;
END $$;

DROP FUNCTION mail_import_message(text, text, bigint, bigint, text, bytea, integer, bytea,
                                  timestamptz, text, bigint);
CREATE FUNCTION mail_import_message(
    p_tenant text, p_mailbox text, p_uidvalidity bigint, p_uid bigint, p_mode text,
    p_sha256 bytea, p_size integer, p_raw bytea,
    p_internaldate timestamptz DEFAULT NULL, p_note text DEFAULT NULL,
    p_after bigint DEFAULT NULL, p_mailbox_id bigint DEFAULT NULL,
    OUT archive_id bigint, OUT created boolean, OUT job_id bigint, OUT location_added boolean)
LANGUAGE plpgsql AS $$
DECLARE
    turn bigint := hashtext(p_tenant || '/' || p_mailbox)::bigint << 32;
    watermark bigint;
    counted boolean;
BEGIN
    IF p_mode NOT IN ('new', 'recovered', 'unstable') THEN
        RAISE EXCEPTION 'unknown import mode %', p_mode USING ERRCODE = 'invalid_parameter_value';
    END IF;
    IF p_after IS NOT NULL THEN
        IF p_mode <> 'new' OR p_uid IS NULL OR NOT (0 <= p_after AND p_after < p_uid)
                OR p_uid > 4294967295 THEN
            RAISE EXCEPTION 'an import in flight needs mode new and 0 <= after (%) < UID (%) <= 2^32-1',
                            p_after, p_uid USING ERRCODE = 'invalid_parameter_value';
        END IF;
        PERFORM pg_advisory_xact_lock(turn | p_uid);
    END IF;

    IF p_mode = 'unstable' THEN
        PERFORM mail_import_still_registered(p_tenant, p_mailbox, p_mailbox_id);
    END IF;

    IF p_mode = 'recovered' THEN
        DELETE FROM mail_import_failures f
         WHERE f.tenant_slug = p_tenant AND f.mailbox_name = p_mailbox
           AND f.uidvalidity = p_uidvalidity AND f.uid = p_uid;
        IF NOT FOUND THEN
            RAISE EXCEPTION 'no recorded failure for %/% UID % at UIDVALIDITY %',
                            p_tenant, p_mailbox, p_uid, p_uidvalidity
                  USING ERRCODE = 'NXI01';
        END IF;
    END IF;

    SELECT * INTO archive_id, created, job_id, location_added
      FROM mail_archive_store(p_tenant, p_sha256, p_size, p_raw,
                              p_mailbox, p_uidvalidity, p_uid, p_internaldate, p_note);

    IF p_mode = 'new' THEN
        IF p_after IS NOT NULL THEN
            PERFORM pg_advisory_xact_lock_shared(turn | p_after);
        END IF;
        SELECT s.last_synced_uid INTO watermark
          FROM mail_import_state s
         WHERE s.tenant_slug = p_tenant AND s.mailbox_name = p_mailbox
           AND s.last_uidvalidity = p_uidvalidity
           FOR UPDATE;
        IF watermark IS NULL OR watermark >= p_uid THEN
            RAISE EXCEPTION 'sync state of %/% is not below UID % at UIDVALIDITY %',
                            p_tenant, p_mailbox, p_uid, p_uidvalidity
                  USING ERRCODE = 'NXI01';
        END IF;
        IF p_after IS NOT NULL AND watermark <> p_after THEN
            RAISE EXCEPTION 'UID % of %/% is not next: the watermark is %, not %',
                            p_uid, p_tenant, p_mailbox, watermark, p_after
                  USING ERRCODE = 'NXI02';
        END IF;
    END IF;

    -- Distinct messages this mailbox added: new to the archive, or new to
    -- this mailbox (already archived from another folder). The same message
    -- under a new UIDVALIDITY, or seen again by an unstable pass, is not.
    -- The message's locations are read first, through their archive_id
    -- index, and only then matched to this mailbox: given the mailbox in
    -- the same WHERE, the planner chose the primary key's (tenant, mailbox)
    -- range and read the mailbox's every location per import.
    counted := created OR (location_added AND NOT EXISTS (
            WITH this_message AS MATERIALIZED (
                SELECT l.tenant_slug, l.mailbox, l.uidvalidity, l.uid
                  FROM mail_archive_locations l
                 WHERE l.archive_id = mail_import_message.archive_id)
            SELECT 1 FROM this_message m
             WHERE m.tenant_slug = p_tenant AND m.mailbox = p_mailbox
               AND (m.uidvalidity, m.uid) <> (p_uidvalidity, p_uid)));
    -- One UPDATE of the state row per message (each is a new row version,
    -- with the table's CHECK constraints read and evaluated again).
    IF p_mode = 'new' THEN
        UPDATE mail_import_state s
           SET last_synced_uid = p_uid, imported_total = s.imported_total + counted::int,
               updated_at = now()
         WHERE s.tenant_slug = p_tenant AND s.mailbox_name = p_mailbox;
    ELSIF counted THEN
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
