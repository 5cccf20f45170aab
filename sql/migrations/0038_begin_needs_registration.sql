-- A run of a mailbox that was removed while it signed in (mailbox remove,
-- erase --unregister-mailboxes, a tenant's erasure) created its sync state
-- again in mail_import_begin and imported the whole mailbox: erased mail
-- came back, and a mailbox added again under that name inherited the
-- orphaned watermark and skipped the new account's first messages (a race
-- audit). A registered mailbox's run now passes its id: begin refuses
-- (NXI03) once the registration is gone, and holds it until the run has
-- begun. NULL (a mailbox not registered: tests, embedders) as before.
DROP FUNCTION mail_import_begin(text, text, bigint, bigint, bigint);
CREATE FUNCTION mail_import_begin(
    p_tenant text, p_mailbox text, p_uidvalidity bigint, p_uidnext bigint, p_exists bigint,
    p_mailbox_id bigint,
    OUT mode text, OUT last_synced_uid bigint, OUT old_uidvalidity bigint)
LANGUAGE plpgsql AS $$
DECLARE
    st mail_import_state;
BEGIN
    IF p_mailbox_id IS NOT NULL THEN
        -- Held until this statement commits: a removal waits, and then
        -- drops the state this run begins.
        PERFORM 1 FROM mail_import_mailboxes m
         WHERE m.id = p_mailbox_id AND m.tenant_slug = p_tenant AND m.name = p_mailbox
           FOR KEY SHARE;
        IF NOT FOUND THEN
            RAISE EXCEPTION 'mailbox %/% is not registered any more', p_tenant, p_mailbox
                  USING ERRCODE = 'NXI03';
        END IF;
    END IF;
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
