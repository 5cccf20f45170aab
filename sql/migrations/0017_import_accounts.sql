-- Whole accounts: registered once, their folders discovered with LIST and
-- archived each as a mailbox of its own (own UIDVALIDITY/UID state), see
-- nexarch_events/importer/accounts.py. A discovered folder's mailbox row
-- carries a copy of the account's connection settings and secret
-- references (references, never secrets), refreshed at every discovery, so
-- the scheduler and a run treat it like any registered mailbox.
CREATE TABLE mail_import_accounts (
    id                bigint      GENERATED ALWAYS AS IDENTITY PRIMARY KEY,
    tenant_slug       text        NOT NULL,
    name              text        NOT NULL,
    host              text        NOT NULL,
    port              integer     NOT NULL,
    tls_mode          text        NOT NULL,
    ca_file           text,
    username          text        NOT NULL,
    auth_method       text        NOT NULL DEFAULT 'password',
    password_ref      text,
    oauth_token_url   text,
    oauth_client_id   text,
    oauth_secret_ref  text,
    oauth_refresh_ref text,
    oauth_scope       text,
    oauth_certificate_ref text,
    use_idle          boolean     NOT NULL DEFAULT true,
    interval_seconds  integer     NOT NULL DEFAULT 300,
    -- NULL: the default exclusions (Trash, Junk, Drafts; see folders.py).
    exclude_patterns  text[],
    include_patterns  text[]      NOT NULL DEFAULT '{}',
    -- Where a folder is flagged \All (Gmail's "All Mail"), archive it alone.
    all_mail_only     boolean     NOT NULL DEFAULT true,
    enabled           boolean     NOT NULL DEFAULT true,
    last_discovery_at timestamptz,
    last_discovery_error text,
    created_at        timestamptz NOT NULL DEFAULT now(),

    CONSTRAINT mail_import_accounts_name_per_tenant UNIQUE (tenant_slug, name),
    CONSTRAINT mail_import_accounts_tenant_slug
        CHECK (tenant_slug ~ '^[a-z0-9]([a-z0-9-]{0,61}[a-z0-9])?$'),
    -- Short enough that "<account>/<folder>" stays a valid mailbox name.
    CONSTRAINT mail_import_accounts_name CHECK (name ~ '^[A-Za-z0-9][A-Za-z0-9._@+-]{0,63}$'),
    CONSTRAINT mail_import_accounts_host CHECK (host ~ '^[A-Za-z0-9.:-]{1,253}$'),
    CONSTRAINT mail_import_accounts_port CHECK (port BETWEEN 1 AND 65535),
    CONSTRAINT mail_import_accounts_tls_mode
        CHECK (tls_mode IN ('implicit', 'starttls', 'plain')),
    CONSTRAINT mail_import_accounts_username CHECK (length(username) BETWEEN 1 AND 320),
    CONSTRAINT mail_import_accounts_interval CHECK (interval_seconds BETWEEN 10 AND 604800),
    CONSTRAINT mail_import_accounts_credentials CHECK (
        (auth_method = 'password' AND password_ref IS NOT NULL
             AND oauth_token_url IS NULL AND oauth_client_id IS NULL
             AND oauth_secret_ref IS NULL AND oauth_refresh_ref IS NULL
             AND oauth_certificate_ref IS NULL)
        OR
        (auth_method = 'oauth2' AND password_ref IS NULL
             AND oauth_token_url ~ '^https?://[^[:space:]]+$' AND length(oauth_token_url) <= 2000
             AND length(oauth_client_id) BETWEEN 1 AND 512
             AND (oauth_secret_ref IS NOT NULL OR oauth_refresh_ref IS NOT NULL
                  OR oauth_certificate_ref IS NOT NULL)
             AND (oauth_secret_ref IS NULL OR oauth_certificate_ref IS NULL))),
    CONSTRAINT mail_import_accounts_secret_refs CHECK (
        (password_ref IS NULL
         OR password_ref ~ '^(env:[A-Za-z_][A-Za-z0-9_]*|file:/.+|sealed:v1:[A-Za-z0-9_=-]+)$')
        AND (oauth_secret_ref IS NULL
         OR oauth_secret_ref ~ '^(env:[A-Za-z_][A-Za-z0-9_]*|file:/.+|sealed:v1:[A-Za-z0-9_=-]+)$')
        AND (oauth_refresh_ref IS NULL
         OR oauth_refresh_ref ~ '^(env:[A-Za-z_][A-Za-z0-9_]*|file:/.+|sealed:v1:[A-Za-z0-9_=-]+)$')
        AND (oauth_certificate_ref IS NULL
         OR oauth_certificate_ref ~ '^(env:[A-Za-z_][A-Za-z0-9_]*|file:/.+|sealed:v1:[A-Za-z0-9_=-]+)$'))
);

-- A folder's mailbox belongs to its account (removed with it). A folder the
-- last discovery did not find (deleted, renamed) keeps its state but is not
-- synced; it comes back if the folder does.
ALTER TABLE mail_import_mailboxes
    ADD COLUMN account_id bigint REFERENCES mail_import_accounts (id) ON DELETE CASCADE,
    ADD COLUMN folder_gone_at timestamptz;
CREATE INDEX mail_import_mailboxes_account ON mail_import_mailboxes (account_id)
    WHERE account_id IS NOT NULL;
