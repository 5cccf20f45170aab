-- OAuth2 sign-in for registered mailboxes (Microsoft 365, Gmail): a mailbox
-- signs in either with a password reference or with an OAuth2 client whose
-- secrets are references too (env:NAME, file:/path, sealed:...), never the
-- secrets themselves. See nexarch_events/importer/oauth.py.
ALTER TABLE mail_import_mailboxes
    ALTER COLUMN password_ref DROP NOT NULL,
    ADD COLUMN auth_method       text NOT NULL DEFAULT 'password',
    ADD COLUMN oauth_token_url   text,
    ADD COLUMN oauth_client_id   text,
    ADD COLUMN oauth_secret_ref  text,
    ADD COLUMN oauth_refresh_ref text,
    ADD COLUMN oauth_scope       text,
    ADD COLUMN oauth_certificate_ref text,
    ADD CONSTRAINT mail_import_mailboxes_auth_method
        CHECK (auth_method IN ('password', 'oauth2')),
    -- Exactly the credentials of the chosen method: a password mailbox has
    -- no OAuth client, an OAuth mailbox no password, and an OAuth client has
    -- a secret or a certificate (client-credentials grant; not both) or a
    -- refresh token (refresh grant).
    ADD CONSTRAINT mail_import_mailboxes_credentials CHECK (
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
    ADD CONSTRAINT mail_import_mailboxes_oauth_secret_ref
        CHECK (oauth_secret_ref ~ '^(env:[A-Za-z_][A-Za-z0-9_]*|file:/.+|sealed:v1:[A-Za-z0-9_=-]+)$'),
    ADD CONSTRAINT mail_import_mailboxes_oauth_refresh_ref
        CHECK (oauth_refresh_ref ~ '^(env:[A-Za-z_][A-Za-z0-9_]*|file:/.+|sealed:v1:[A-Za-z0-9_=-]+)$'),
    ADD CONSTRAINT mail_import_mailboxes_oauth_certificate_ref
        CHECK (oauth_certificate_ref ~ '^(env:[A-Za-z_][A-Za-z0-9_]*|file:/.+|sealed:v1:[A-Za-z0-9_=-]+)$'),
    ADD CONSTRAINT mail_import_mailboxes_oauth_scope
        CHECK (oauth_scope IS NULL OR length(oauth_scope) <= 2000);
