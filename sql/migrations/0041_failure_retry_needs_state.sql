-- A failure recorded again by a run's retry (mode "recovered" refused by
-- the server once more) was inserted whether or not its mailbox was still
-- there: a retry under way while the mailbox was removed left a failure
-- row of a mailbox that no longer exists, inherited by a mailbox added
-- again under the name (stop 27's leftovers). A retry now needs the run's
-- registration (p_mailbox_id, as mail_import_begin in 0038; without one,
-- the state row: mail_import_still_registered, 0040) and refuses with NXI03 (importer/state.py: MailboxRemoved)
-- once it is gone, also when a mailbox of the name was added again (a
-- review audit). A first failure already needed the state row at the
-- run's UIDVALIDITY (NXI01). Only that check is new; the rest is migration
-- 0019's function.
DROP FUNCTION mail_import_failure(text, text, bigint, bigint, text, boolean);
CREATE FUNCTION mail_import_failure(
    p_tenant text, p_mailbox text, p_uidvalidity bigint, p_uid bigint,
    p_error text, p_retry boolean, p_mailbox_id bigint DEFAULT NULL)
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
    ELSE
        PERFORM mail_import_still_registered(p_tenant, p_mailbox, p_mailbox_id);
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
