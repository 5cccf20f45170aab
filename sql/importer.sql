-- Named queries of the IMAP importer (nexarch_events/importer/). The
-- per-message writes are functions of migration 0008: one call, one
-- transaction, one round trip.

-- name: state_get_or_create
-- The seed's GetOrCreate: a new mailbox starts with the default interval.
-- $1 tenant, $2 mailbox name, $3 its registration id or NULL: a registered
-- mailbox removed meanwhile gets no state again (no row comes back). The
-- registration is locked (FOR KEY SHARE): a removal in flight is waited
-- for and then seen. Read from the statement's snapshot alone, a removal
-- committing meanwhile deleted the state row this insert then made again
-- (its conflict waited for the delete, then inserted): a removed mailbox
-- with a state row (found by CI under stress-ng).
WITH created AS (
    INSERT INTO mail_import_state (tenant_slug, mailbox_name)
    SELECT $1, $2
     WHERE $3::bigint IS NULL
        OR EXISTS (SELECT 1 FROM mail_import_mailboxes m
                    WHERE m.id = $3::bigint AND m.tenant_slug = $1 AND m.name = $2
                      FOR KEY SHARE)
    ON CONFLICT (tenant_slug, mailbox_name) DO NOTHING
    RETURNING *
)
SELECT * FROM created
UNION ALL
SELECT * FROM mail_import_state
 WHERE tenant_slug = $1 AND mailbox_name = $2 AND NOT EXISTS (SELECT 1 FROM created);

-- name: mailbox_registered
-- Whether registration $1 still exists.
SELECT EXISTS (SELECT 1 FROM mail_import_mailboxes WHERE id = $1::bigint);

-- name: state_get
SELECT * FROM mail_import_state WHERE tenant_slug = $1 AND mailbox_name = $2;

-- name: state_set_interval
-- $3 seconds. No row: no such mailbox state.
UPDATE mail_import_state
   SET interval_seconds = $3::int, updated_at = now()
 WHERE tenant_slug = $1 AND mailbox_name = $2
RETURNING interval_seconds;

-- name: begin
-- $1 tenant, $2 mailbox, $3 UIDVALIDITY (NULL: absent or 0), $4 UIDNEXT, $5 EXISTS,
-- $6 the mailbox's registration id (NULL: not registered; migration 0038).
-- Also the persisted fetch window (migration 0020).
SELECT b.*, (SELECT s.fetch_window FROM mail_import_state s
              WHERE s.tenant_slug = $1 AND s.mailbox_name = $2) AS fetch_window
  FROM mail_import_begin($1, $2, $3::bigint, $4::bigint, $5::bigint, $6::bigint) b;

-- name: import_message
-- $1 tenant, $2 mailbox, $3 UIDVALIDITY, $4 UID (NULL: not trusted),
-- $5 mode (new | recovered | unstable), $6 sha256, $7 size, $8 raw,
-- $9 INTERNALDATE or NULL, $10 the location's note or NULL (migration 0020),
-- $11 the UID this import follows when two are in flight, or NULL (0026),
-- $12 the mailbox's registration id or NULL (mode unstable checks it; 0040).
SELECT * FROM mail_import_message($1, $2, $3::bigint, $4::bigint, $5, $6, $7::int, $8,
                                  $9::timestamptz, $10::text, $11::bigint, $12::bigint);

-- name: record_failure
-- $1 tenant, $2 mailbox, $3 UIDVALIDITY, $4 UID, $5 error, $6 is a retry,
-- $7 the mailbox's registration id or NULL (a retry checks it; 0041).
SELECT mail_import_failure($1, $2, $3::bigint, $4::bigint, $5, $6::boolean,
                           $7::bigint) AS attempts;

-- name: recorded_failures
-- Recorded failures at this UIDVALIDITY ($3), retried or given up.
SELECT uid, attempts, last_error
  FROM mail_import_failures
 WHERE tenant_slug = $1 AND mailbox_name = $2 AND uidvalidity = $3::bigint
 ORDER BY uid;

-- name: failures
SELECT uidvalidity, uid, attempts, last_error, first_failed_at, last_failed_at
  FROM mail_import_failures
 WHERE tenant_slug = $1 AND mailbox_name = $2
 ORDER BY uidvalidity, uid;

-- name: attempt_started
-- An attempt (connect, login, sync) begins: a pending "sync now" is
-- answered by it, whatever its outcome, so it can never wake a runner twice
-- (or again after a restart).
UPDATE mail_import_state
   SET last_attempt_at = now(), sync_requested_at = NULL, updated_at = now()
 WHERE tenant_slug = $1 AND mailbox_name = $2;

-- name: failed_before_run
-- An attempt that failed before it could talk to the server (the password
-- reference cannot be resolved): recorded like a failed run. $3 error.
UPDATE mail_import_state
   SET last_attempt_at = now(), sync_requested_at = NULL,
       last_run_finished_at = now(), last_error = $3::text, last_error_at = now(),
       updated_at = now()
 WHERE tenant_slug = $1 AND mailbox_name = $2;

-- name: set_idle_status
-- $3: why IDLE is not used ("idle unavailable: ..."), NULL when it works.
UPDATE mail_import_state
   SET idle_status = $3::text, updated_at = now()
 WHERE tenant_slug = $1 AND mailbox_name = $2
   AND idle_status IS DISTINCT FROM $3::text;

-- name: set_fetch_window
-- $3 messages per FETCH (see migration 0020).
UPDATE mail_import_state
   SET fetch_window = $3::int, updated_at = now()
 WHERE tenant_slug = $1 AND mailbox_name = $2;

-- name: failure_retry
-- An operator asks for one recorded failure to be tried again: its attempt
-- count starts over (runs retry it up to the limit again). $3 UID. Returns
-- the rows changed (none: no such failure).
UPDATE mail_import_failures
   SET attempts = 0
 WHERE tenant_slug = $1 AND mailbox_name = $2 AND uid = $3::bigint
RETURNING uidvalidity, uid;

-- name: failure_clear
-- An operator gives up on one recorded failure: it is forgotten (the
-- message stays unimported; the watermark is already past it). $3 UID.
DELETE FROM mail_import_failures
 WHERE tenant_slug = $1 AND mailbox_name = $2 AND uid = $3::bigint
RETURNING uidvalidity, uid;

-- name: finish
-- End of a run. $3 error or NULL, $4 warning or NULL (a clean run clears it).
UPDATE mail_import_state
   SET last_run_finished_at = now(),
       last_success_at = CASE WHEN $3::text IS NULL THEN now() ELSE last_success_at END,
       last_error = $3::text,
       last_error_at = CASE WHEN $3::text IS NULL THEN last_error_at ELSE now() END,
       warning = $4::text,
       updated_at = now()
 WHERE tenant_slug = $1 AND mailbox_name = $2;

-- name: try_run_lock
-- Runs of one mailbox never overlap, across processes and machines: a
-- session advisory lock on the run's own connection, released by
-- the server if that process dies. Key: (importer class, hash of the name);
-- a hash collision only makes two mailboxes take turns.
SELECT pg_try_advisory_lock(1312902721, hashtext($1 || '/' || $2)) AS locked;

-- name: run_unlock
SELECT pg_advisory_unlock(1312902721, hashtext($1 || '/' || $2)) AS unlocked;

-- name: request_sync
-- "Sync now": the scheduler of any process wakes at the NOTIFY and runs
-- the mailbox at once. No row: no such mailbox.
WITH requested AS (
    UPDATE mail_import_state
       SET sync_requested_at = now(), updated_at = now()
     WHERE tenant_slug = $1 AND mailbox_name = $2
    RETURNING tenant_slug, mailbox_name
)
SELECT pg_notify('nexarch_import_requests',
                 json_build_object('v', 1, 'event', 'sync_requested',
                                   'tenant', tenant_slug, 'mailbox', mailbox_name)::text)
  FROM requested;

-- name: mailbox_add
-- Register a mailbox and create its sync state with the given interval.
-- $1 tenant, $2 name, $3 host, $4 port, $5 tls mode, $6 CA file, $7 user,
-- $8 password reference, $9 folder, $10 use IDLE, $11 interval seconds,
-- $12 auth method, $13-$17 OAuth token URL, client id, secret reference,
-- refresh token reference, scope, $18 certificate reference (NULL for
-- password sign-in).
WITH mailbox AS (
    INSERT INTO mail_import_mailboxes
           (tenant_slug, name, host, port, tls_mode, ca_file, username, password_ref,
            folder, use_idle, auth_method, oauth_token_url, oauth_client_id,
            oauth_secret_ref, oauth_refresh_ref, oauth_scope, oauth_certificate_ref)
    VALUES ($1, $2, $3, $4::int, $5, $6, $7, $8, $9, $10::boolean, $12, $13, $14, $15,
            $16, $17, $18)
    RETURNING id, tenant_slug, name
),
state AS (
    INSERT INTO mail_import_state (tenant_slug, mailbox_name, interval_seconds)
    SELECT tenant_slug, name, $11::int FROM mailbox
    ON CONFLICT (tenant_slug, mailbox_name)
    -- The name was not registered (the INSERT above would have failed): a
    -- state row left by a removed mailbox's run is stale. A new
    -- registration starts from nothing; the old watermark made a mailbox
    -- added again skip its account's first messages (a race audit).
    DO UPDATE SET interval_seconds = EXCLUDED.interval_seconds,
                  last_uidvalidity = 0, last_synced_uid = 0, server_uidnext = NULL,
                  server_exists = NULL, imported_total = 0, last_run_started_at = NULL,
                  last_run_finished_at = NULL, last_success_at = NULL, last_error = NULL,
                  last_error_at = NULL, warning = NULL, sync_requested_at = NULL,
                  idle_status = NULL, fetch_window = NULL, last_attempt_at = NULL,
                  updated_at = now()
    RETURNING 1
)
SELECT id, (SELECT count(*) FROM state) AS states FROM mailbox;

-- name: mailbox_list
-- Registered mailboxes with their state (and the name of the account a
-- discovered folder belongs to). $1 tenant or NULL for all.
SELECT m.*, acc.name AS account, s.last_uidvalidity, s.last_synced_uid, s.interval_seconds,
       s.server_uidnext, s.server_exists, s.imported_total,
       s.last_run_started_at, s.last_run_finished_at, s.last_success_at,
       s.last_error, s.last_error_at, s.warning, s.sync_requested_at,
       s.idle_status, s.fetch_window, s.last_attempt_at,
       (SELECT count(*) FROM mail_import_failures f
         WHERE f.tenant_slug = m.tenant_slug AND f.mailbox_name = m.name) AS failures
  FROM mail_import_mailboxes m
  LEFT JOIN mail_import_accounts acc ON acc.id = m.account_id
  LEFT JOIN mail_import_state s ON s.tenant_slug = m.tenant_slug AND s.mailbox_name = m.name
 WHERE $1::text IS NULL OR m.tenant_slug = $1::text
 ORDER BY m.tenant_slug, m.name;

-- name: mailbox_get
SELECT m.*, s.interval_seconds, s.sync_requested_at, s.last_run_finished_at
  FROM mail_import_mailboxes m
  LEFT JOIN mail_import_state s ON s.tenant_slug = m.tenant_slug AND s.mailbox_name = m.name
 WHERE m.tenant_slug = $1 AND m.name = $2;

-- name: mailbox_remove
-- The registration, its state and failures go; archived mail stays.
WITH gone AS (
    DELETE FROM mail_import_mailboxes WHERE tenant_slug = $1 AND name = $2 RETURNING id
),
state AS (
    DELETE FROM mail_import_state
     WHERE tenant_slug = $1 AND mailbox_name = $2 AND EXISTS (SELECT 1 FROM gone)
),
failures AS (
    DELETE FROM mail_import_failures
     WHERE tenant_slug = $1 AND mailbox_name = $2 AND EXISTS (SELECT 1 FROM gone)
)
SELECT id FROM gone;

-- name: lag
-- Per mailbox that is imported (registered ones only while enabled and
-- their folder is not gone; one synced without registration, by an
-- embedder, too): watermark, what the server announced, seconds since the
-- last successful run (for /metrics). A paused mailbox or a folder gone
-- from its account is not behind; its time since success grew for ever
-- (an accounts audit).
SELECT s.tenant_slug, s.mailbox_name, s.last_synced_uid, s.server_uidnext,
       extract(epoch FROM now() - s.last_success_at)::float8 AS since_success
  FROM mail_import_state s
  LEFT JOIN mail_import_mailboxes m
         ON m.tenant_slug = s.tenant_slug AND m.name = s.mailbox_name
 WHERE m.id IS NULL OR (m.enabled AND m.folder_gone_at IS NULL)
 ORDER BY s.tenant_slug, s.mailbox_name;

-- name: mailbox_get_by_id
-- A registered mailbox by id, within tenant $2 (NULL: any tenant). No row:
-- no such mailbox there (the HTTP API answers 404 either way).
SELECT m.*
  FROM mail_import_mailboxes m
 WHERE m.id = $1::bigint
   AND ($2::text IS NULL OR m.tenant_slug = $2::text);

-- name: archived_after
-- Archived messages of tenant $1 (NULL: all) with an id above $2, at most
-- $3, each with the first place it was seen (none if stored without one):
-- the replay of an event stream that resumes after archive id $2. The
-- folder is the registered mailbox's (decoded), as live events carry it.
-- One branch runs: all tenants by the primary key, or one tenant's ids as
-- planned for it (migration 0029; "tenant IS NULL OR tenant = $1" in one
-- WHERE walked the primary key through the other tenants' rows).
SELECT a.id AS archive_id, a.tenant_slug, a.archived_at,
       l.mailbox, l.uidvalidity, l.uid,
       (SELECT m.folder FROM mail_import_mailboxes m
         WHERE m.tenant_slug = a.tenant_slug AND m.name = l.mailbox) AS folder
  FROM ((SELECT id, tenant_slug, archived_at FROM mail_archive
          WHERE $1::text IS NULL AND id > $2::bigint
          ORDER BY id
          LIMIT $3::int)
        UNION ALL
        (SELECT t.id, $1::text, t.archived_at
           FROM mail_archive_tenant_ids($1::text, $2::bigint, $3::int) t
          WHERE $1::text IS NOT NULL)) a
  LEFT JOIN LATERAL (
        SELECT loc.mailbox, loc.uidvalidity, loc.uid
          FROM mail_archive_locations loc
         WHERE loc.archive_id = a.id
         ORDER BY loc.seen_at, loc.mailbox, loc.uidvalidity, loc.uid
         LIMIT 1) l ON true
 ORDER BY a.id;

-- name: archive_max_id
-- The newest archive id of tenant $1 (NULL: all); 0 if none.
-- Only the branch the CASE takes runs; the tenant's is planned for it
-- (migration 0029): an OR in one WHERE, or a generic plan, walked the
-- primary key down through the other tenants' newer rows
-- (tests/integration/test_tenant_pages.py).
SELECT coalesce(CASE WHEN $1::text IS NULL THEN (SELECT max(id) FROM mail_archive)
                     ELSE mail_archive_tenant_newest($1::text)
                END, 0) AS id;

-- name: archive_mailboxes
-- The mailboxes each of these messages ($2) of tenant $1 was seen in. The
-- messages' locations by their archive_id index, then the tenant's (as in
-- archive.sql's "locations").
WITH located AS MATERIALIZED (
    SELECT archive_id, tenant_slug, mailbox
      FROM mail_archive_locations
     WHERE archive_id = ANY($2::bigint[]))
SELECT archive_id, array_agg(DISTINCT mailbox ORDER BY mailbox) AS mailboxes
  FROM located
 WHERE tenant_slug = $1
 GROUP BY archive_id;

-- name: mailbox_set_enabled
-- $3 enabled. A disabled mailbox keeps its state; running schedulers stop
-- (or start) its runner at their next re-read. No row: no such mailbox.
UPDATE mail_import_mailboxes SET enabled = $3::boolean
 WHERE tenant_slug = $1 AND name = $2
RETURNING id;

-- name: account_add
-- $1 tenant, $2 name, $3 host, $4 port, $5 tls, $6 CA file, $7 user, $8 auth
-- method, $9 password ref, $10-$14 OAuth token URL, client id, secret ref,
-- refresh ref, scope, $15 use IDLE, $16 interval, $17 exclude patterns (NULL:
-- defaults), $18 include patterns, $19 all-mail-only, $20 certificate ref.
INSERT INTO mail_import_accounts
       (tenant_slug, name, host, port, tls_mode, ca_file, username, auth_method, password_ref,
        oauth_token_url, oauth_client_id, oauth_secret_ref, oauth_refresh_ref, oauth_scope,
        use_idle, interval_seconds, exclude_patterns, include_patterns, all_mail_only,
        oauth_certificate_ref)
VALUES ($1, $2, $3, $4::int, $5, $6, $7, $8, $9, $10, $11, $12, $13, $14, $15::boolean,
        $16::int, $17::text[], $18::text[], $19::boolean, $20)
RETURNING id;

-- name: account_get
SELECT * FROM mail_import_accounts WHERE tenant_slug = $1 AND name = $2;

-- name: account_list
-- Accounts (of tenant $1, or all) with how many folders are archived and gone.
SELECT a.*,
       count(m.id) FILTER (WHERE m.folder_gone_at IS NULL) AS folders,
       count(m.id) FILTER (WHERE m.folder_gone_at IS NOT NULL) AS folders_gone
  FROM mail_import_accounts a
  LEFT JOIN mail_import_mailboxes m ON m.account_id = a.id
 WHERE $1::text IS NULL OR a.tenant_slug = $1::text
 GROUP BY a.id
 ORDER BY a.tenant_slug, a.name;

-- name: account_folders
-- One discovery's outcome, in one statement: a mailbox per folder found
-- ($2 folder names, $3 their mailbox names, $4 the names as LIST gave them,
-- which EXAMINE is given), created or refreshed from the
-- account's settings; folders not found are marked gone. A mailbox of the
-- same name that the operator registered by hand is never taken over (it is
-- left out of the result). Rows: every folder mailbox of the account now,
-- with whether it was created by this call.
WITH acc AS (
    SELECT * FROM mail_import_accounts WHERE id = $1::bigint
),
found AS (
    INSERT INTO mail_import_mailboxes AS m
           (tenant_slug, name, host, port, tls_mode, ca_file, username, password_ref,
            folder, use_idle, auth_method, oauth_token_url, oauth_client_id,
            oauth_secret_ref, oauth_refresh_ref, oauth_scope, oauth_certificate_ref,
            account_id, folder_wire)
    SELECT acc.tenant_slug, f.mailbox, acc.host, acc.port, acc.tls_mode, acc.ca_file,
           acc.username, acc.password_ref, f.folder, acc.use_idle, acc.auth_method,
           acc.oauth_token_url, acc.oauth_client_id, acc.oauth_secret_ref,
           acc.oauth_refresh_ref, acc.oauth_scope, acc.oauth_certificate_ref, acc.id, f.wire
      FROM acc, unnest($2::text[], $3::text[], $4::text[]) AS f(folder, mailbox, wire)
    ON CONFLICT (tenant_slug, name) DO UPDATE
       SET host = EXCLUDED.host, port = EXCLUDED.port, tls_mode = EXCLUDED.tls_mode,
           ca_file = EXCLUDED.ca_file, username = EXCLUDED.username,
           password_ref = EXCLUDED.password_ref, folder = EXCLUDED.folder,
           folder_wire = EXCLUDED.folder_wire,
           use_idle = EXCLUDED.use_idle, auth_method = EXCLUDED.auth_method,
           oauth_token_url = EXCLUDED.oauth_token_url,
           oauth_client_id = EXCLUDED.oauth_client_id,
           oauth_secret_ref = EXCLUDED.oauth_secret_ref,
           oauth_refresh_ref = EXCLUDED.oauth_refresh_ref,
           oauth_scope = EXCLUDED.oauth_scope,
           oauth_certificate_ref = EXCLUDED.oauth_certificate_ref, folder_gone_at = NULL
     WHERE m.account_id = EXCLUDED.account_id
    RETURNING m.name, m.folder, (xmax = 0) AS created
),
state AS (
    INSERT INTO mail_import_state (tenant_slug, mailbox_name, interval_seconds)
    SELECT acc.tenant_slug, found.name, acc.interval_seconds FROM acc, found
    ON CONFLICT (tenant_slug, mailbox_name) DO NOTHING
),
gone AS (
    UPDATE mail_import_mailboxes
       SET folder_gone_at = now()
     WHERE account_id = $1::bigint AND folder_gone_at IS NULL
       AND NOT (name = ANY ($3::text[]))
    RETURNING name, folder
),
done AS (
    UPDATE mail_import_accounts
       SET last_discovery_at = now(), last_discovery_error = NULL
     WHERE id = $1::bigint
)
SELECT name, folder, created, false AS gone FROM found
UNION ALL
SELECT name, folder, false, true FROM gone
ORDER BY name;

-- name: account_discovery_failed
UPDATE mail_import_accounts
   SET last_discovery_at = now(), last_discovery_error = $2
 WHERE id = $1::bigint;

-- name: account_remove
-- The account, its folders' mailboxes, their state and failures; archived
-- mail stays.
WITH acc AS (
    DELETE FROM mail_import_accounts WHERE tenant_slug = $1 AND name = $2
    RETURNING id, tenant_slug
),
boxes AS (
    DELETE FROM mail_import_mailboxes m USING acc
     WHERE m.account_id = acc.id
    RETURNING m.tenant_slug, m.name
),
state AS (
    DELETE FROM mail_import_state s USING boxes
     WHERE s.tenant_slug = boxes.tenant_slug AND s.mailbox_name = boxes.name
),
failures AS (
    DELETE FROM mail_import_failures f USING boxes
     WHERE f.tenant_slug = boxes.tenant_slug AND f.mailbox_name = boxes.name
)
SELECT id FROM acc;

-- name: account_get_by_id
-- An account by id, within tenant $2 (NULL: any tenant). No row: no such
-- account there (the HTTP API answers 404 either way).
SELECT * FROM mail_import_accounts
 WHERE id = $1::bigint AND ($2::text IS NULL OR tenant_slug = $2::text);

-- name: account_request_sync
-- "Sync now" for a whole account: every folder it archives (not the gone
-- ones, which no scheduler runs) is requested as one mailbox's "sync now"
-- is, one notification per folder, so running schedulers need nothing new;
-- and one "discovery_requested", so that a running discovery lists the
-- account's folders now (a folder made since the last discovery is found).
-- $1 account id, $2 tenant or NULL for any. No row: no such account there.
WITH acc AS (
    SELECT id, tenant_slug, name FROM mail_import_accounts
     WHERE id = $1::bigint AND ($2::text IS NULL OR tenant_slug = $2::text)
),
requested AS (
    UPDATE mail_import_state s
       SET sync_requested_at = now(), updated_at = now()
      FROM mail_import_mailboxes m, acc
     WHERE m.account_id = acc.id AND m.folder_gone_at IS NULL
       AND s.tenant_slug = m.tenant_slug AND s.mailbox_name = m.name
    RETURNING s.tenant_slug, s.mailbox_name
),
notified AS (
    -- Referenced below, so it runs: one pg_notify per requested folder.
    SELECT count(pg_notify('nexarch_import_requests',
                           json_build_object('v', 1, 'event', 'sync_requested',
                                             'tenant', tenant_slug,
                                             'mailbox', mailbox_name)::text)) AS sent
      FROM requested
)
SELECT acc.id, acc.tenant_slug, acc.name,
       coalesce((SELECT array_agg(mailbox_name ORDER BY mailbox_name) FROM requested),
                '{}') AS mailboxes,
       (SELECT sent FROM notified) AS sent,
       pg_notify('nexarch_import_requests',
                 json_build_object('v', 1, 'event', 'discovery_requested',
                                   'tenant', acc.tenant_slug, 'account', acc.name)::text)
           AS discovery
  FROM acc;

-- name: oauth_refresh_load
-- The newest refresh token of an OAuth2 client (sealed), by the digest $1 of
-- the client and its registered refresh token (importer/oauth.py).
SELECT token_sealed FROM mail_import_oauth_refresh WHERE client_key = $1;

-- name: oauth_refresh_save
-- $1 the digest, $2 the rotated refresh token, sealed.
INSERT INTO mail_import_oauth_refresh AS r (client_key, token_sealed)
VALUES ($1, $2)
ON CONFLICT (client_key) DO UPDATE
   SET token_sealed = EXCLUDED.token_sealed, rotated_at = now();

-- name: allocated_ids
-- The highest archive id and job id this database has drawn (0: none yet),
-- across tenants: an event stream's Last-Event-ID above either is from
-- another deployment or from before a restore (api/events.py). The
-- sequences, not max(id): erasure and retention delete the newest rows, and
-- a valid cursor may name one. Across tenants tells nothing new: a tenant's
-- own ids, drawn from the same sequences, already show how far they went.
SELECT coalesce(pg_sequence_last_value(
           pg_get_serial_sequence('mail_archive', 'id')::regclass), 0) AS archive_id,
       coalesce(pg_sequence_last_value(
           pg_get_serial_sequence('mail_index_jobs', 'id')::regclass), 0) AS job_id;
